//! `lfu_fifo`, test only (the `experimental-policy` feature): priority = (accesses since
//! insertion, time of insertion), lfu with fifo's tie-breaker.
//!
//! It exists to show what adding a policy takes: this file, one line in the table of
//! [`super::policies!`], and its arms in the reference replayers (`crate::reference`). The tests
//! built with the feature (`tests/experimental_policy.rs` here and in the sweep, and the whole
//! differential matrix, which runs every policy of [`super::Policy::ALL`]) then replay it on the
//! plain, prefetch, deployed and hybrid paths and in grids. It is written for clarity, not speed
//! (a victim is a scan of all E experts), and never built into the binary.

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::prio::{Prio, StepParams, StepSets};
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// Per expert `[E]`: accesses since insertion and the pick time of insertion.
pub(crate) struct LfuFifo {
    count: Vec<u64>,
    inserted: Vec<u64>,
}

impl Evictor for LfuFifo {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {}
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        let e = pick.e;
        self.count[e] = if inserted { 1 } else { self.count[e] + 1 };
        if inserted {
            self.inserted[e] = pick.now;
        }
    }
    /// The lowest (count, insertion time) among the cached, unprotected experts; ties (none:
    /// insertion times of cached experts are distinct) to the lowest id.
    fn victim(&mut self, cache: &Cache<()>, protected: Protected<'_>) -> usize {
        let mut best: Option<(u64, u64, usize)> = None;
        for e in 0..self.count.len() {
            if cache.contains(e) && !protected.has(e) {
                let key = (self.count[e], self.inserted[e], e);
                if best.is_none_or(|b| key < b) {
                    best = Some(key);
                }
            }
        }
        let (_, _, v) = best.expect("a full cache always holds an unprotected expert");
        v
    }
}

impl PolicyKind<'_> for LfuFifo {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "lfu_fifo",
        offline: false,
        credits: Credits::None,
        token_indices: false,
        shares: Shares::Nothing,
        curve: OnePass::None,
        cost_per_pick: 300,
    };
    type Steps = LfuFifoSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> LfuFifoSteps {
        LfuFifoSteps { count: vec![0; p.num_experts], inserted: vec![0; p.num_experts] }
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> LfuFifo {
        LfuFifo { count: vec![0; params.num_experts], inserted: vec![0; params.num_experts] }
    }
}

/// lfu_fifo in the deployed step loop: (accesses since insertion, one per step in which the
/// expert is in the step's set; time of insertion), scanned through the level's heap.
pub(crate) struct LfuFifoSteps {
    count: Vec<u64>,
    inserted: Vec<u64>,
}

impl Prio for LfuFifoSteps {
    fn key(&self, e: usize) -> u128 {
        (u128::from(self.count[e]) << 64) | u128::from(self.inserted[e])
    }
    fn access(&mut self, e: usize, now: u64, inserted: bool) {
        self.count[e] = if inserted { 1 } else { self.count[e] + 1 };
        if inserted {
            self.inserted[e] = now;
        }
    }
}
