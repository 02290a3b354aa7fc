//! `belady`: priority = the next token at which the expert is chosen again, negated.

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::heap::KeyHeap;
use crate::deploy::prio::{Prio, StepParams, StepSets};
use crate::engine::structures::{ValueCounts, pick_counted};
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// belady: priority = the next token at which the expert is chosen again (within the sequence
/// when resets are on), never-again first, then farthest, ties to the lowest id. The cached
/// experts are counted per next use ([`ValueCounts`], `[T + 1]`, value T = never); a token's
/// victims come from a walk down from the farthest next use and [`pick_counted`]. Protected
/// experts need no exclusion: they are chosen at this token, the nearest next use there is,
/// and the walk stops before it (at least `q` unprotected experts lie beyond).
pub(crate) struct Belady {
    /// Next use of the `i`-th chosen expert of token `t`: `next_of[t * k_used + i]`, T = never.
    pub(crate) next_of: Vec<u32>,
    pub(crate) k_used: usize,
    pub(crate) counts: ValueCounts,
    pub(crate) buf: Vec<u128>,
    pub(crate) below: Vec<u16>,
    pub(crate) at: Vec<u64>,
}

impl Belady {
    /// Backward pass over the λ = 0 selections (F[0..n]) of the layer.
    pub(crate) fn new(params: &Params<'_>, input: &LayerInput<'_>) -> Belady {
        let (m, k) = (params.m, params.k_used);
        // validate() refuses belady on 2^32 tokens or more.
        let never = params.tokens as u32;
        let mut next_of = vec![never; params.tokens * k];
        let mut upcoming = vec![never; params.num_experts];
        let mut ri = params.resets.len();
        for t in (0..params.tokens).rev() {
            let row = &input.ids[t * m..(t + 1) * m];
            let chosen = row.iter().map(|&e| usize::from(e)).filter(|&e| input.keep[e]).take(k);
            for (i, e) in chosen.enumerate() {
                next_of[t * k + i] = upcoming[e];
                upcoming[e] = t as u32;
            }
            if ri > 0 && params.resets[ri - 1] == t as u64 {
                upcoming.fill(never);
                ri -= 1;
            }
        }
        let slots = params.cap.min(params.num_experts);
        Belady {
            next_of,
            k_used: k,
            counts: ValueCounts::new(params.tokens + 1),
            buf: Vec::with_capacity(slots),
            below: vec![0; slots + 1],
            at: vec![0; slots + 1],
        }
    }

    /// The `q` unprotected cached experts of farthest next use (ties: lowest id) into `out`.
    #[inline(always)]
    pub(crate) fn farthest(&mut self, cache: &Cache<u32>, protected: Protected<'_>, q: usize, out: &mut Vec<u128>) {
        let bound = self.counts.bound::<true>(q) as u32;
        pick_counted::<true>(
            cache,
            protected.marks,
            protected.stamp,
            q,
            bound,
            &mut self.below,
            &mut self.at,
            out,
            |e| e as u64,
        );
    }
}

impl Evictor for Belady {
    type Key = u32;
    const BATCH: bool = true;
    const SLOTS: bool = true;
    #[inline(always)]
    fn reset(&mut self, cache: &mut Cache<u32>) {
        self.counts.clear(cache.live_keys().iter().map(|&v| v as usize));
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, cache: &mut Cache<u32>) {
        let Pick { e, t, i, .. } = pick;
        let key = cache.key_mut(e);
        self.counts.sub(*key as usize, u32::from(!inserted));
        *key = self.next_of[t * self.k_used + i];
        self.counts.add(*key as usize, 1);
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, cache: &Cache<u32>) {
        self.counts.sub(cache.key(e) as usize, 1);
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<u32>, protected: Protected<'_>) -> usize {
        let mut out = std::mem::take(&mut self.buf);
        self.farthest(cache, protected, 1, &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(
        &mut self,
        cache: &Cache<u32>,
        protected: Protected<'_>,
        q: usize,
        _chosen: &[u16],
        out: &mut Vec<u128>,
    ) {
        self.farthest(cache, protected, q, out);
    }
}

impl PolicyKind<'_> for Belady {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "belady",
        offline: true,
        credits: Credits::None,
        token_indices: true,
        shares: Shares::Nothing,
        curve: OnePass::Stack { pays_from: 2 },
        cost_per_pick: 140,
    };
    type Steps = BeladySteps;
    fn build_steps(p: &StepParams, sets: impl FnOnce() -> StepSets) -> BeladySteps {
        BeladySteps::new(p.num_experts, sets())
    }
    fn build(params: &Params<'_>, input: &LayerInput<'_>) -> Belady {
        Belady::new(params, input)
    }
}

/// belady: the next step whose set holds the expert, negated (never: evicted first). The next
/// uses of a step's set are set when the step starts, for the whole step (§11 step 4).
pub(crate) struct BeladySteps {
    sets: StepSets,
    /// Per entry of `sets.ids`: the next step after its own whose set holds the expert
    /// (`u64::MAX`: never).
    next_after: Vec<u64>,
    next: Vec<u64>,
}

impl BeladySteps {
    pub(crate) fn new(num_experts: usize, sets: StepSets) -> BeladySteps {
        let mut next_after = vec![u64::MAX; sets.ids.len()];
        let mut upcoming = vec![u64::MAX; num_experts];
        for s in (0..sets.starts.len() - 1).rev() {
            let range = sets.starts[s]..sets.starts[s + 1];
            for i in range.clone() {
                next_after[i] = upcoming[usize::from(sets.ids[i])];
            }
            for i in range {
                upcoming[usize::from(sets.ids[i])] = s as u64;
            }
        }
        BeladySteps { sets, next_after, next: vec![u64::MAX; num_experts] }
    }
}

impl Prio for BeladySteps {
    const ACCESS_KEYED: bool = false;
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        u128::from(u64::MAX - self.next[e])
    }
    #[inline(always)]
    fn access(&mut self, _e: usize, _now: u64, _inserted: bool) {}
    fn begin_step(&mut self, s: usize, heap: &mut KeyHeap) {
        for i in self.sets.starts[s]..self.sets.starts[s + 1] {
            let e = usize::from(self.sets.ids[i]);
            self.next[e] = self.next_after[i];
            heap.update(e, || self.rank(e));
        }
    }
}
