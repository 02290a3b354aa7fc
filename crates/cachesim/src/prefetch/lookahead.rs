//! `lookahead`: the first B ids of the trace's `lookahead_ids[l][t]` (SEMANTICS.md §12): layer
//! l's router applied to the input of the previous recorded layer, recorded at capture.

use super::predict::Predict;

/// lookahead: the first `budget` ids of the layer's lookahead row of each token.
pub(crate) struct Lookahead<'a> {
    /// The layer's lookahead ids, `[T, width]`.
    pub(crate) ids: &'a [u16],
    /// m', ids per token.
    pub(crate) width: usize,
    pub(crate) budget: usize,
}

impl Predict for Lookahead<'_> {
    #[inline(always)]
    fn propose(&mut self, t: usize, _oracle: &[u16], out: &mut Vec<u16>) {
        let w = self.width;
        out.extend_from_slice(&self.ids[t * w..t * w + self.budget.min(w)]);
    }
}
