//! `lfru` (SEMANTICS.md §15.3): priority = freq / (clock − last + 1), lowest evicted, compared
//! exactly as rationals (cross-multiplied in `u128`), ties to the earlier insertion. freq counts
//! the accesses since insertion (lfu's count); the clock and `last` count the accesses of the
//! layer that reach the cache (the pick clock of the token loop, a level's access clock in the
//! deployed loop); the victim of an insertion is chosen with the clock as it stands before it.
//!
//! The order of two experts moves with the clock, so no structure keeps the cached experts in
//! it; the victim search is bounded instead. Within one freq the oldest last access has the
//! lowest ratio, so only the first unprotected expert of each of lfu's groups is a candidate;
//! and every cached expert's ratio is at least freq / (clock − oldest last + 1), so the walk up
//! the groups stops at the first freq whose bound exceeds the best ratio found.

use super::lfu::Lfu;
use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Order, Prio, StepParams, StepSets};
use crate::engine::structures::{Groups, List, NIL};
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// Whether freq `fa` last accessed `da − 1` ticks ago ranks below freq `fb` last accessed
/// `db − 1` ticks ago (`fa / da < fb / db`), or ties with it (`Equal`): exact, in `u128`.
#[inline(always)]
fn compare(fa: u64, da: u64, fb: u64, db: u64) -> std::cmp::Ordering {
    (u128::from(fa) * u128::from(db)).cmp(&(u128::from(fb) * u128::from(da)))
}

/// lfru in the token loop: lfu's groups (freq = accesses since insertion, ordered by last access
/// within a group), the cached experts by last access (lru's list, whose front bounds every
/// denominator), and per expert the pick times of its last access and insertion.
pub(crate) struct Lfru {
    freq: Lfu,
    by_last: List,
    last: Vec<u64>,
    inserted: Vec<u64>,
    /// The clock as it stands: the pick time of the last access.
    clock: u64,
}

impl Evictor for Lfru {
    type Key = ();
    fn reset(&mut self, cache: &mut Cache<()>) {
        self.freq.reset(cache);
        self.by_last.clear();
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, cache: &mut Cache<()>) {
        let Pick { e, now, .. } = pick;
        self.freq.access(pick, inserted, cache);
        if inserted {
            self.inserted[e] = now;
        } else {
            self.by_last.unlink(e);
        }
        self.by_last.push_back(e);
        self.last[e] = now;
        self.clock = now;
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, cache: &Cache<()>) {
        self.freq.evicted(e, cache);
        self.by_last.unlink(e);
    }
    fn victim(&mut self, _cache: &Cache<()>, protected: Protected<'_>) -> usize {
        let (g, clock, last) = (&self.freq.g, self.clock, &self.last);
        let oldest = self.by_last.links[self.by_last.sentinel].next as usize;
        let widest = clock - last[oldest] + 1;
        // (expert, freq, clock − last + 1) of the lowest ratio so far.
        let mut best: Option<(usize, u64, u64)> = None;
        let mut group = g.first_group();
        while group != g.sentinel {
            let node = &g.groups[group as usize];
            let f = node.key;
            if let Some((_, bf, bd)) = best
                && compare(f, widest, bf, bd).is_gt()
            {
                break;
            }
            let mut x = node.head;
            while x != NIL && protected.has(x as usize) {
                x = g.items[x as usize].next;
            }
            if x != NIL {
                let x = x as usize;
                let d = clock - last[x] + 1;
                let lower = best.is_none_or(|(b, bf, bd)| {
                    compare(f, d, bf, bd).then(self.inserted[x].cmp(&self.inserted[b])).is_lt()
                });
                if lower {
                    best = Some((x, f, d));
                }
            }
            group = node.next;
        }
        best.expect("a full cache always holds an unprotected expert").0
    }
}

impl PolicyKind<'_> for Lfru {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "lfru",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::None,
        cost_per_pick: 250,
    };
    type Steps = LfruSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> LfruSteps {
        let e = p.num_experts;
        LfruSteps { freq: vec![0; e], last: vec![0; e], inserted: vec![0; e], clock: 0 }
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> Lfru {
        let e = params.num_experts;
        Lfru {
            freq: Lfu { g: Groups::new(e, params.cap) },
            by_last: List::new(e),
            last: vec![0; e],
            inserted: vec![0; e],
            clock: 0,
        }
    }
}

/// lfru in the deployed step loop: freq, last access and insertion per expert at the level's
/// access clock (one tick per access that reaches the cache, in the step's order), and the
/// clock as it stands. Its order moves with the clock ([`Order::Clocked`]): the level compares
/// cached experts with [`Prio::before`] at each victim.
pub(crate) struct LfruSteps {
    freq: Vec<u64>,
    last: Vec<u64>,
    inserted: Vec<u64>,
    clock: u64,
}

impl Prio for LfruSteps {
    const ORDER: Order = Order::Clocked;
    /// Not an order: lfru's ratios are compared with [`Prio::before`], which is all a level
    /// under [`Order::Clocked`] asks.
    fn key(&self, _e: usize) -> u128 {
        unreachable!("a level compares lfru's experts with Prio::before")
    }
    #[inline(always)]
    fn before(&self, a: usize, b: usize) -> bool {
        let d = |e: usize| self.clock - self.last[e] + 1;
        compare(self.freq[a], d(a), self.freq[b], d(b)).then(self.inserted[a].cmp(&self.inserted[b])).is_lt()
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, inserted: bool) {
        if inserted {
            self.freq[e] = 1;
            self.inserted[e] = now;
        } else {
            self.freq[e] += 1;
        }
        self.last[e] = now;
        self.clock = now;
    }
}
