//! `near_pick`: priority = (last token at which the expert stood in F at rank < N, last access).

use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::heap::KeyHeap;
use crate::deploy::prio::{Prio, StepParams, StepSets};
use crate::engine::structures::{ValueCounts, pick_counted};
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};

/// near_pick: priority (near, last access), near = 1 + the last token at which the expert stood
/// in F at rank < N (0 = never; kept as the expert's key in the cache), and last, per expert.
/// Instead of keeping the cached experts in order, it counts them per near value
/// ([`ValueCounts`], `[T + 1]`): after token t every cached expert of F's first N moves from
/// its count to count t + 1, without branches ([`move_near`]). The victims of a token: walk the
/// near values from the oldest until the counts (without the protected experts) cover `q`, then
/// [`pick_counted`] (ties at the bound by last access).
pub(crate) struct NearPick {
    pub(crate) last: Vec<u64>,
    pub(crate) counts: ValueCounts,
    pub(crate) n: usize,
    pub(crate) buf: Vec<u128>,
    /// Buffers of [`pick_counted`], `[cached + 1]`.
    pub(crate) below: Vec<u16>,
    pub(crate) at: Vec<u64>,
}

impl NearPick {
    pub(crate) fn new(params: &Params<'_>) -> NearPick {
        let slots = params.cap.min(params.num_experts);
        NearPick {
            last: vec![0; params.num_experts],
            counts: ValueCounts::new(params.tokens + 1),
            n: params.near_n,
            buf: Vec::with_capacity(slots),
            below: vec![0; slots + 1],
            at: vec![0; slots + 1],
        }
    }

    /// The `q` unprotected cached experts of lowest (near, last, id) into `out`; the counts
    /// must leave the protected ones out.
    #[inline(always)]
    pub(crate) fn lowest(&mut self, cache: &Cache<u32>, protected: Protected<'_>, q: usize, out: &mut Vec<u128>) {
        let bound = self.counts.bound::<false>(q) as u32;
        let last = &self.last;
        pick_counted::<false>(
            cache,
            protected.marks,
            protected.stamp,
            q,
            bound,
            &mut self.below,
            &mut self.at,
            out,
            |e| (last[e] << 16) | e as u64,
        );
    }
}

impl Evictor for NearPick {
    type Key = u32;
    const BATCH: bool = true;
    const SLOTS: bool = true;
    #[inline(always)]
    fn f_needed(&self) -> usize {
        self.n
    }
    fn reset(&mut self, cache: &mut Cache<u32>) {
        self.counts.clear(cache.live_keys().iter().map(|&v| v as usize));
        cache.keys.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, inserted: bool, cache: &mut Cache<u32>) {
        let Pick { e, now, .. } = pick;
        self.last[e] = now;
        // `inserted` is a constant on each of the token loop's paths (the hit path returns
        // before the insertion): on the hit path this drops the add of 0 and its bounds checks.
        if inserted {
            self.counts.add(cache.key(e) as usize, 1);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, cache: &Cache<u32>) {
        self.counts.sub(cache.key(e) as usize, 1);
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<u32>, protected: Protected<'_>) -> usize {
        let mut out = std::mem::take(&mut self.buf);
        self.lowest(cache, protected, 1, &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(&mut self, cache: &Cache<u32>, protected: Protected<'_>, q: usize, chosen: &[u16], out: &mut Vec<u128>) {
        // Protected experts are not eligible: leave them out of the counts while walking.
        for &e in chosen {
            let e = usize::from(e);
            self.counts.sub(cache.key(e) as usize, u32::from(cache.contains(e)));
        }
        self.lowest(cache, protected, q, out);
        for &e in chosen {
            let e = usize::from(e);
            self.counts.add(cache.key(e) as usize, u32::from(cache.contains(e)));
        }
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, cache: &mut Cache<u32>) {
        // validate() refuses near_pick on 2^32 tokens or more: t + 1 fits in u32.
        let key = t as u32 + 1;
        let f = &f[..f.len().min(self.n)];
        let moved = move_near(f, key, &mut self.counts.count, &mut cache.keys, &cache.pos, cache.len);
        self.counts.add(key as usize, moved);
    }
}

/// near_pick's end of token: every expert of `f` gets near value `key` (its key in the cache,
/// `keys[pos[e]]`); the cached ones (`pos[e] < len`) move from their count to `key`'s, and how
/// many did is returned (to be added). Over slices, so that their pointers stay
/// in registers.
#[inline(never)]
pub(crate) fn move_near(f: &[u16], key: u32, count: &mut [u32], keys: &mut [u32], pos: &[u32], len: usize) -> u32 {
    let mut moved = 0;
    for &e in f {
        let e = usize::from(e);
        let p = pos[e] as usize;
        let c = u32::from(p < len);
        count[keys[p] as usize] -= c;
        moved += c;
        keys[p] = key;
    }
    moved
}

impl PolicyKind<'_> for NearPick {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "near_pick",
        offline: false,
        credits: Credits::NearPickRanks,
        token_indices: true,
        shares: Shares::Nothing,
        curve: OnePass::Stack { pays_from: 3 },
        cost_per_pick: 290,
    };
    type Steps = NearPickSteps;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> NearPickSteps {
        NearPickSteps::new(p.num_experts, p.near_n)
    }
    fn build(params: &Params<'_>, _input: &LayerInput<'_>) -> NearPick {
        NearPick::new(params)
    }
}

/// near_pick: (last step at which the expert stood in F at rank < N, time of last access); never:
/// lowest.
pub(crate) struct NearPickSteps {
    near_n: usize,
    /// Step + 1, 0 = never.
    near: Vec<u64>,
    last: Vec<u64>,
}

impl NearPickSteps {
    pub(crate) fn new(num_experts: usize, near_n: usize) -> NearPickSteps {
        NearPickSteps { near_n, near: vec![0; num_experts], last: vec![0; num_experts] }
    }
}

impl Prio for NearPickSteps {
    const CREDITS: bool = true;
    fn f_needed(&self) -> usize {
        self.near_n
    }
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        (u128::from(self.near[e]) << 64) | u128::from(self.last[e])
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.last[e] = now;
    }
    fn credit_row(&mut self, s: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, heap: &mut KeyHeap) {
        // The step only grows: so do the keys.
        for &e in &f[..f.len().min(self.near_n)] {
            let e = usize::from(e);
            self.near[e] = s as u64 + 1;
            heap.raise(e, || self.rank(e));
        }
    }
}
