//! `prev_token`: the experts chosen at (t − 1, l) in this replay (SEMANTICS.md §12).

use super::predict::Predict;
use super::predictor::{Choice, LayerAt, PredictorFacts, PredictorKind};

/// prev_token: the first `budget` experts chosen at the previous token, in processing order;
/// nothing at t = 0 (sequence starts are not special).
pub(crate) struct PrevToken {
    /// The experts chosen at the previous token, `[<= k_used]`.
    last: Vec<u16>,
    budget: usize,
}

impl PrevToken {
    pub(crate) fn new(k_used: usize, budget: usize) -> PrevToken {
        PrevToken { last: Vec::with_capacity(k_used), budget }
    }
}

impl PredictorKind<'_> for PrevToken {
    const FACTS: PredictorFacts = PredictorFacts {
        name: "prev_token",
        needs_calibration: false,
        needs_lookahead: false,
        reads_layer_below: false,
    };
    fn choose(at: LayerAt<'_>) -> Choice<'_> {
        Choice::PrevToken(PrevToken::new(at.k_used, at.budget))
    }
}

impl Predict for PrevToken {
    #[inline(always)]
    fn propose(&mut self, _t: usize, _oracle: &[u16], out: &mut Vec<u16>) {
        out.extend_from_slice(&self.last[..self.budget.min(self.last.len())]);
    }
    #[inline(always)]
    fn observe(&mut self, chosen: &[u16]) {
        self.last.clear();
        self.last.extend_from_slice(chosen);
    }
}
