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

/// The token loop's form: the same state as the tiers' ([`LfuFifoSteps`], accesses at the pick
/// clock), its victim a scan for the lowest key.
pub(crate) struct LfuFifo(LfuFifoSteps);

impl Evictor for LfuFifo {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {}
    fn access(&mut self, pick: Pick, inserted: bool, _cache: &mut Cache<()>) {
        self.0.access(pick.e, pick.now, inserted);
    }
    /// The lowest (count, insertion time) among the cached, unprotected experts; ties (none:
    /// insertion times of cached experts are distinct) to the lowest id.
    fn victim(&mut self, cache: &Cache<()>, protected: Protected<'_>) -> usize {
        let candidates = (0..self.0.count.len()).filter(|&e| cache.contains(e) && !protected.has(e));
        let (_, v) =
            candidates.map(|e| (self.0.key(e), e)).min().expect("a full cache always holds an unprotected expert");
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
        LfuFifoSteps::new(p.num_experts)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> LfuFifo {
        LfuFifo(LfuFifoSteps::new(params.num_experts))
    }
}

/// lfu_fifo's priority, per expert `[E]`: accesses since insertion and the time of insertion
/// (in the deployed step loop one access per step in which the expert is in the step's set, at
/// the level's access clock; scanned through the level's heap).
pub(crate) struct LfuFifoSteps {
    count: Vec<u64>,
    inserted: Vec<u64>,
}

impl LfuFifoSteps {
    fn new(num_experts: usize) -> LfuFifoSteps {
        LfuFifoSteps { count: vec![0; num_experts], inserted: vec![0; num_experts] }
    }
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
