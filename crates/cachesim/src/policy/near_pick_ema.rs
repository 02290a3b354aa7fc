//! `near_pick_ema`: s ← d·s + 1(rank < N in F), a [`Decayed`] policy.

use super::decayed::{Credit, Decayed};
use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::heap::KeyHeap;
use crate::deploy::prio::{Lazy, Prio, StepParams, StepSets};
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
    type Steps = NearPickEmaSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> NearPickEmaSteps {
        NearPickEmaSteps::new(p.num_experts, p.decay, p.near_n)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> NearPickEma {
        Decayed::new(params, EmaCredit { n: params.near_n })
    }
}

/// near_pick_ema: (s, time of last access), s ← d·s + [rank < N in F] per row, once per step.
pub(crate) struct NearPickEmaSteps {
    near_n: usize,
    lazy: Lazy,
}

impl NearPickEmaSteps {
    pub(crate) fn new(num_experts: usize, decay: f64, near_n: usize) -> NearPickEmaSteps {
        NearPickEmaSteps { near_n, lazy: Lazy::new(num_experts, decay) }
    }
}

impl Prio for NearPickEmaSteps {
    const CREDITS: bool = true;
    fn f_needed(&self) -> usize {
        self.near_n
    }
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        self.lazy.key(e)
    }
    #[inline(always)]
    fn rank(&self, e: usize) -> u128 {
        self.lazy.rank(e)
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.lazy.touch(e, now);
    }
    fn begin_credits(&mut self) {
        self.lazy.begin();
    }
    fn credit_row(&mut self, _s: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, heap: &mut KeyHeap) {
        for &e in &f[..f.len().min(self.near_n)] {
            self.lazy.credit(usize::from(e), 1.0, heap);
        }
    }
    fn end_credits(&mut self, heap: &mut KeyHeap) {
        self.lazy.end(heap);
    }
}
