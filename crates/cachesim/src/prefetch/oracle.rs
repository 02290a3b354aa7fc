//! `oracle`: F[0..n] of (t, l), the experts chosen at λ = 0 (SEMANTICS.md §12), the bound of
//! any predictor.

use super::predict::Predict;
use super::predictor::{Choice, LayerAt, PredictorFacts, PredictorKind};

/// oracle: the first `budget` of F[0..n] at the current token.
pub(crate) struct Oracle {
    pub(crate) budget: usize,
}

impl PredictorKind<'_> for Oracle {
    const FACTS: PredictorFacts =
        PredictorFacts { name: "oracle", needs_calibration: false, needs_lookahead: false, reads_layer_below: false };
    fn choose(at: LayerAt<'_>) -> Choice<'_> {
        Choice::Oracle(Oracle { budget: at.budget })
    }
}

impl Predict for Oracle {
    #[inline(always)]
    fn propose(&mut self, _t: usize, oracle: &[u16], out: &mut Vec<u16>) {
        out.extend_from_slice(&oracle[..self.budget.min(oracle.len())]);
    }
}
