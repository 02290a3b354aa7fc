//! `perfect_lfu` (SEMANTICS.md §15.2): priority = (accesses since the start of the trace, time
//! of last access). Unlike `lfu`, whose count starts again at 1 when an evicted expert returns,
//! an expert's count survives eviction; a cache reset at a sequence start resets every count.
//!
//! The count is of picks (§15.2: "an access is a pick, hit or miss"): a prefetch load (§12) is
//! an access at its time (the tie-breaker) but not a pick, so it does not count; the demand pick
//! that follows it does. (Then a prefetch that only moves a load ahead leaves the counts as
//! they would be without it.)

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Prio, StepParams, StepSets};
use crate::engine::structures::Groups;
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// perfect_lfu: every expert's count `[E]` (cached or not), and the cached experts in lfu's
/// groups ([`Groups`]: keyed by count, ordered by last access within a group). A hit moves the
/// expert to the end of the next group, as in lfu; an insertion puts it at the end of the group
/// of its count, found by a walk from the lowest group (a returning expert's count is most
/// often below those of the experts the cache kept).
pub(crate) struct PerfectLfu {
    count: Vec<u64>,
    g: Groups,
}

impl Evictor for PerfectLfu {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.g.clear();
        self.count.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        let e = pick.e;
        let count = self.count[e] + u64::from(pick.demand);
        self.count[e] = count;
        let g = &mut self.g;
        if inserted {
            let (mut after, mut x) = (g.sentinel, g.first_group());
            while x != g.sentinel && g.groups[x as usize].key < count {
                after = x;
                x = g.groups[x as usize].next;
            }
            let to =
                if x != g.sentinel && g.groups[x as usize].key == count { x } else { g.new_group_after(after, count) };
            g.push_back(to, e);
        } else {
            let from = g.items[e].group;
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

impl PolicyKind<'_> for PerfectLfu {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "perfect_lfu",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::None,
        cost_per_pick: 170,
    };
    type Steps = PerfectLfuSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> PerfectLfuSteps {
        PerfectLfuSteps { count: vec![0; p.num_experts], last: vec![0; p.num_experts] }
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> PerfectLfu {
        PerfectLfu { count: vec![0; params.num_experts], g: Groups::new(params.num_experts, params.cap) }
    }
}

/// perfect_lfu in the deployed step loop: (accesses since the start — one per step in which the
/// expert is in the step's set, kept through evictions — , time of last access), through the
/// level's heap (a key changes only at an access, and only upwards).
pub(crate) struct PerfectLfuSteps {
    count: Vec<u64>,
    last: Vec<u64>,
}

impl Prio for PerfectLfuSteps {
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        (u128::from(self.count[e]) << 64) | u128::from(self.last[e])
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.count[e] += 1;
        self.last[e] = now;
    }
}
