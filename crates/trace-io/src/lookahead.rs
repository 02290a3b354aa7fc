//! The optional `lookahead_ids` tensor: per (layer l, token t), the expert ids layer l's router
//! gives the hidden state that entered the previous recorded layer, as written by
//! `python/capture_routing.py --lookahead` (the signal of pre-gating prefetchers, SEMANTICS.md §12).

use crate::error::ValueProblem;
use crate::{Result, TraceError};

/// Borrowed `lookahead_ids`, u16 `[L, T, width]`, layer-major like `ids`: element `(l, t, i)` is
/// at `(l * T + t) * width + i`. Each row holds `width` distinct ids `< E`, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookahead<'a> {
    /// The ids, `[L, T, width]` flattened.
    pub ids: &'a [u16],
    /// m': ids per (layer, token), at least 1.
    pub width: usize,
}

/// Checks `la` against a trace of `layer_ids.len()` layers, `tokens` tokens and `num_experts`
/// experts: the length is `L * T * width` with `width >= 1`, and every row's ids are `< E` and
/// distinct.
///
/// # Errors
/// [`TraceError::Shape`] naming `lookahead_ids` for a wrong length or a zero width;
/// [`TraceError::Value`] for the first id out of range or repeated within its row, naming the
/// layer (id and index), token and slot.
pub(crate) fn check(la: Lookahead<'_>, layer_ids: &[u32], tokens: usize, num_experts: usize) -> Result<()> {
    let layers = layer_ids.len();
    let want = layers.checked_mul(tokens).and_then(|n| n.checked_mul(la.width));
    if la.width == 0 || want != Some(la.ids.len()) {
        return Err(TraceError::Shape {
            tensor: "lookahead_ids",
            expected: format!("[L, T, m'] = [{layers}, {tokens}, {}] with m' >= 1", la.width),
            actual: vec![la.ids.len()],
        });
    }
    let mut seen = vec![usize::MAX; num_experts];
    for (r, row) in la.ids.chunks_exact(la.width).enumerate() {
        for (slot, &id) in row.iter().enumerate() {
            let e = usize::from(id);
            let problem = if e >= num_experts {
                ValueProblem::IdOutOfRange { id, num_experts: num_experts as u32 }
            } else if seen[e] == r {
                ValueProblem::RepeatedId { id }
            } else {
                seen[e] = r;
                continue;
            };
            let layer = r / tokens.max(1);
            return Err(TraceError::Value {
                tensor: "lookahead_ids",
                layer,
                layer_id: layer_ids[layer],
                token: r % tokens.max(1),
                slot,
                problem,
            });
        }
    }
    Ok(())
}
