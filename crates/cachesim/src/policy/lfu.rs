//! `lfu`: priority = (accesses since insertion, time of last access).

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Order, Prio, StepParams, StepSets};
use crate::engine::structures::Groups;
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// lfu: groups keyed by accesses since insertion, ordered by last access within a group. A hit
/// moves the expert to the end of the next group (created when missing), an insertion to the
/// end of group 1: O(1) per pick.
pub(crate) struct Lfu {
    pub(crate) g: Groups,
}

impl Evictor for Lfu {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.g.clear();
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        let e = pick.e;
        let g = &mut self.g;
        if inserted {
            let first = g.first_group();
            let to = if first != g.sentinel && g.groups[first as usize].key == 1 {
                first
            } else {
                g.new_group_after(g.sentinel, 1)
            };
            g.push_back(to, e);
        } else {
            let from = g.items[e].group;
            let count = g.groups[from as usize].key + 1;
            let next = g.groups[from as usize].next;
            let to = if next != g.sentinel && g.groups[next as usize].key == count {
                next
            } else {
                g.new_group_after(from, count)
            };
            g.move_to(e, to);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, _cache: &Cache<()>) {
        self.g.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache<()>, protected: Protected<'_>) -> usize {
        self.g.first_unprotected(protected)
    }
}

impl PolicyKind<'_> for Lfu {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "lfu",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::None,
        cost_per_pick: 160,
    };
    type Steps = LfuSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> LfuSteps {
        LfuSteps::new(p.num_experts)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> Lfu {
        Lfu { g: Groups::new(params.num_experts, params.cap) }
    }
}

/// lfu: (accesses since insertion — per step, one per step in which the expert is in the
/// step's set — , time of last access).
pub(crate) struct LfuSteps {
    count: Vec<u64>,
    last: Vec<u64>,
}

impl LfuSteps {
    pub(crate) fn new(num_experts: usize) -> LfuSteps {
        LfuSteps { count: vec![0; num_experts], last: vec![0; num_experts] }
    }
}

impl Prio for LfuSteps {
    const ORDER: Order = Order::Frequency;
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        (u128::from(self.count[e]) << 64) | u128::from(self.last[e])
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, inserted: bool) {
        self.count[e] = if inserted { 1 } else { self.count[e] + 1 };
        self.last[e] = now;
    }
}
