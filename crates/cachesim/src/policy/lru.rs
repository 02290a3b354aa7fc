//! `lru`: priority = time of last access.

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Order, Prio, StepParams, StepSets};
use crate::engine::simd::pick_if;
use crate::engine::structures::List;
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

pub(crate) struct Lru(List);

impl Evictor for Lru {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        let e = pick.e;
        if !inserted {
            self.0.unlink(e);
        }
        self.0.push_back(e);
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, _cache: &Cache<()>) {
        self.0.unlink(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache<()>, protected: Protected<'_>) -> usize {
        self.0.victim(protected)
    }
    /// Hit and miss on one path: the entry that leaves its place in the list is `e` on a hit
    /// (it moves to the back), the victim on a miss into a full cache, and the spare on a miss
    /// into a cache with room; then `e` goes to the back.
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, protected: Protected<'_>, cache: &mut Cache<()>) -> bool {
        let e = pick.e;
        self.0.step(e, cap, protected, cache, |l, hit, evict, v| {
            l.unlink(pick_if(hit, e, pick_if(evict, v, l.spare)));
            l.push_back(e);
        })
    }
}

impl PolicyKind<'_> for Lru {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "lru",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::Lru { pays_from: 6 },
        cost_per_pick: 100,
    };
    type Steps = LruSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> LruSteps {
        LruSteps::new(p.num_experts)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> Lru {
        Lru(List::new(params.num_experts))
    }
}

/// lru: time of last access.
pub(crate) struct LruSteps {
    last: Vec<u64>,
}

impl LruSteps {
    pub(crate) fn new(num_experts: usize) -> LruSteps {
        LruSteps { last: vec![0; num_experts] }
    }
}

impl Prio for LruSteps {
    const ORDER: Order = Order::EveryAccess;
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        u128::from(self.last[e])
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.last[e] = now;
    }
}
