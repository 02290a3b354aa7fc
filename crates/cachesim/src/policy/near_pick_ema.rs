//! `near_pick_ema`: s ← d·s + 1(rank < N in F), a [`Decayed`] policy.

use super::decayed::{Credit, Decayed};
use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::heap::KeyHeap;
use crate::deploy::prio::{DecayedSteps, Lazy, StepCredit, StepParams, StepSets};
use crate::engine::{Cache, LayerInput, Params};

/// near_pick_ema's credits: x = 1 for the experts at rank < N of F (1 · M = M exactly).
pub(crate) struct EmaCredit {
    /// N.
    pub(crate) n: usize,
}

impl Credit for EmaCredit {
    fn f_needed(&self) -> usize {
        self.n
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, _t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, m: f64) {
        add_each(&f[..f.len().min(self.n)], m, &mut cache.keys, &cache.pos);
    }
}

/// `keys[pos[e]] += value` for each expert of `ids`. Over slices, so that their pointers stay in
/// registers.
#[inline(never)]
fn add_each(ids: &[u16], value: f64, keys: &mut [f64], pos: &[u32]) {
    for &e in ids {
        keys[pos[usize::from(e)] as usize] += value;
    }
}

/// near_pick_ema's evictor.
pub(crate) type NearPickEma = Decayed<EmaCredit>;

impl PolicyKind<'_> for NearPickEma {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "near_pick_ema",
        offline: false,
        credits: Credits::NearPickRanks,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::Stack { pays_from: 3 },
        cost_per_pick: 200,
    };
    type Steps = DecayedSteps<EmaStepCredit>;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> Self::Steps {
        DecayedSteps::new(p.num_experts, p.decay, EmaStepCredit { near_n: p.near_n })
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> NearPickEma {
        Decayed::new(params, EmaCredit { n: params.near_n })
    }
}

/// near_pick_ema's deployed credits: s ← d·s + [rank < N in F] per row, once per step.
pub(crate) struct EmaStepCredit {
    near_n: usize,
}

impl StepCredit for EmaStepCredit {
    fn f_needed(&self) -> usize {
        self.near_n
    }
    fn credit_row(&mut self, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, lazy: &mut Lazy, heap: &mut KeyHeap) {
        for &e in &f[..f.len().min(self.near_n)] {
            lazy.credit(usize::from(e), 1.0, heap);
        }
    }
}
