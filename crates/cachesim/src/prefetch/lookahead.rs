//! `lookahead`: the first B ids of the trace's `lookahead_ids[l][t]` (SEMANTICS.md §12): layer
//! l's router applied to the input of the previous recorded layer, recorded at capture.

use super::predict::Predict;
use super::predictor::{Choice, LayerAt, PredictorFacts, PredictorKind};

/// lookahead: the first `budget` ids of the layer's lookahead row of each token.
pub(crate) struct Lookahead<'a> {
    /// The layer's lookahead ids, `[T, width]`.
    pub(crate) ids: &'a [u16],
    /// m', ids per token.
    pub(crate) width: usize,
    pub(crate) budget: usize,
}

impl<'a> PredictorKind<'a> for Lookahead<'a> {
    const FACTS: PredictorFacts =
        PredictorFacts { name: "lookahead", needs_calibration: false, needs_lookahead: true, reads_layer_below: false };
    fn choose(at: LayerAt<'a>) -> Choice<'a> {
        let la = at.trace.lookahead().expect("validate_prefetch() requires lookahead_ids");
        let tokens = at.trace.shape().tokens;
        let ids = &la.ids[at.l * tokens * la.width..(at.l + 1) * tokens * la.width];
        Choice::Lookahead(Lookahead { ids, width: la.width, budget: at.budget })
    }
}

impl Predict for Lookahead<'_> {
    #[inline(always)]
    fn propose(&mut self, t: usize, _oracle: &[u16], out: &mut Vec<u16>) {
        let w = self.width;
        out.extend_from_slice(&self.ids[t * w..t * w + self.budget.min(w)]);
    }
}
