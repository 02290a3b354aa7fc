//! `fifo`: priority = time of insertion.

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Order, Prio, StepParams, StepSets};
use crate::engine::simd::pick_if;
use crate::engine::structures::List;
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

pub(crate) struct Fifo(List);

impl Evictor for Fifo {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        let e = pick.e;
        if inserted {
            self.0.push_back(e);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, _cache: &Cache<()>) {
        self.0.unlink(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache<()>, protected: Protected<'_>) -> usize {
        self.0.victim(protected)
    }
    /// Hit and miss on one path: the victim (on a miss into a full cache) or the spare leaves
    /// the list, and `e` is appended on a miss; on a hit the append writes back the links it
    /// found and links the spare to itself.
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, protected: Protected<'_>, cache: &mut Cache<()>) -> bool {
        let e = pick.e;
        self.0.step(e, cap, protected, cache, |l, hit, evict, v| {
            l.unlink(pick_if(evict, v, l.spare));
            let s = l.sentinel;
            let tail = l.links[s].prev as usize;
            let new = pick_if(hit, l.spare, e);
            l.links[tail].next = pick_if(hit, s, e) as u32;
            l.links[new].prev = pick_if(hit, l.spare, tail) as u32;
            l.links[new].next = pick_if(hit, l.spare, s) as u32;
            l.links[s].prev = pick_if(hit, tail, e) as u32;
        })
    }
}

impl PolicyKind<'_> for Fifo {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "fifo",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::None,
        cost_per_pick: 100,
    };
    type Steps = FifoSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> FifoSteps {
        FifoSteps::new(p.num_experts)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> Fifo {
        Fifo(List::new(params.num_experts))
    }
}

/// fifo: time of insertion.
pub(crate) struct FifoSteps {
    inserted: Vec<u64>,
}

impl FifoSteps {
    pub(crate) fn new(num_experts: usize) -> FifoSteps {
        FifoSteps { inserted: vec![0; num_experts] }
    }
}

impl Prio for FifoSteps {
    const ORDER: Order = Order::Insertion;
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        u128::from(self.inserted[e])
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, inserted: bool) {
        if inserted {
            self.inserted[e] = now;
        }
    }
}
