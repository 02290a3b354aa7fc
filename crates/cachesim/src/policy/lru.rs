//! `lru`: priority = time of last access.

use super::{PolicyFacts, PolicyKind, Shares};
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
        needs_scores: false,
        allows_lambda: true,
        token_indices: false,
        shares: Shares::Nothing,
        cost_per_pick: 100,
    };
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> Lru {
        Lru(List::new(params.num_experts))
    }
}
