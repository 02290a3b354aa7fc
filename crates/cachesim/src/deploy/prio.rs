//! Priorities of the deployed replay (SEMANTICS.md §5 "Priorities", with the step as the unit of
//! time of §11 step 4), one type per policy, each a per-expert array of E entries.
//!
//! A key is a `u128` (lowest evicted, ties: lowest id): the first component in the high 64 bits,
//! the tie-breaker (time of last access) in the low 64. Decayed scores S >= 0 order as their
//! f64 bits.

use super::heap::KeyHeap;
use crate::policy::softmax_row;

/// Which accesses give an expert a key above every other key, so that a level can keep its
/// cached experts in a list in key order instead of scanning them for a victim.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Keys change otherwise too (next uses, credits): the level keeps its cached experts in a
    /// [`KeyHeap`], which the policy tells of every key change outside [`Prio::access`].
    Scan,
    /// Every access (lru: the key is the time of last access, and the clock only grows).
    EveryAccess,
    /// An insertion only (fifo: the key is the time of insertion).
    Insertion,
    /// lfu's (accesses since insertion, time of last access): count nodes ([`super::freq`]).
    Frequency,
}

/// What a tier's cache asks of a policy.
pub(crate) trait Prio {
    /// Whether the policy takes credits after a step ([`Prio::credit_row`]).
    const CREDITS: bool = false;
    /// Which accesses raise a key above all others ([`Order`]); nothing else may change a key,
    /// but under [`Order::Scan`], where every change outside an access goes to the level's heap.
    const ORDER: Order = Order::Scan;
    /// Whether [`Prio::access`] may change the key (belady's does not); an access never lowers
    /// a key (it sets the time of last access to the clock, which only grows).
    const ACCESS_KEYED: bool = true;
    /// The priority of cached expert `e`.
    fn key(&self, e: usize) -> u128;
    /// The rank of `e` for a [`KeyHeap`]: in the order of (`key(e)`, e), with e in the low 16
    /// bits. This default holds for keys below 2^112 (every key but the lazy decays': belady's
    /// is below 2^64, near_pick's step is below 2^48).
    #[inline(always)]
    fn rank(&self, e: usize) -> u128 {
        debug_assert!(self.key(e) < 1 << 112, "a key below 2^112");
        (self.key(e) << 16) | e as u128
    }
    /// How many entries of F [`Prio::credit_row`] reads (its first ones).
    fn f_needed(&self) -> usize {
        usize::MAX
    }
    /// Expert `e` was accessed at clock `now`; `inserted`: it was just inserted.
    fn access(&mut self, e: usize, now: u64, inserted: bool);
    /// Step `s` starts (belady: its set's next uses); changed keys go to `heap`.
    fn begin_step(&mut self, _s: usize, _heap: &mut KeyHeap) {}
    /// Before the credits of a step (the lazy decays multiply M once).
    fn begin_credits(&mut self) {}
    /// The credits of one row of step `s`: `f` its kept candidates (F, the first
    /// [`Prio::f_needed`] of them), `row` its candidates,
    /// `scores` their router scores; changed keys go to `heap`.
    fn credit_row(&mut self, _s: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>, _heap: &mut KeyHeap) {}
    /// After the credits of a step (the lazy decays rescale when M > 1e100, and rekey `heap`).
    fn end_credits(&mut self, _heap: &mut KeyHeap) {}
}

/// lru: time of last access.
pub(crate) struct Lru {
    last: Vec<u64>,
}

impl Lru {
    pub fn new(num_experts: usize) -> Lru {
        Lru { last: vec![0; num_experts] }
    }
}

impl Prio for Lru {
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

/// fifo: time of insertion.
pub(crate) struct Fifo {
    inserted: Vec<u64>,
}

impl Fifo {
    pub fn new(num_experts: usize) -> Fifo {
        Fifo { inserted: vec![0; num_experts] }
    }
}

impl Prio for Fifo {
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

/// lfu: (accesses since insertion — per step, one per step in which the expert is in the
/// step's set — , time of last access).
pub(crate) struct Lfu {
    count: Vec<u64>,
    last: Vec<u64>,
}

impl Lfu {
    pub fn new(num_experts: usize) -> Lfu {
        Lfu { count: vec![0; num_experts], last: vec![0; num_experts] }
    }
}

impl Prio for Lfu {
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

/// Sets of experts per step, flattened: `ids[starts[s]..starts[s + 1]]` is step s's set.
pub(crate) struct StepSets {
    pub ids: Vec<u16>,
    pub starts: Vec<usize>,
}

/// belady: the next step whose set holds the expert, negated (never: evicted first). The next
/// uses of a step's set are set when the step starts, for the whole step (§11 step 4).
pub(crate) struct Belady {
    sets: StepSets,
    /// Per entry of `sets.ids`: the next step after its own whose set holds the expert
    /// (`u64::MAX`: never).
    next_after: Vec<u64>,
    next: Vec<u64>,
}

impl Belady {
    pub fn new(num_experts: usize, sets: StepSets) -> Belady {
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
        Belady { sets, next_after, next: vec![u64::MAX; num_experts] }
    }
}

impl Prio for Belady {
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

/// near_pick: (last step at which the expert stood in F at rank < N, time of last access); never:
/// lowest.
pub(crate) struct NearPick {
    near_n: usize,
    /// Step + 1, 0 = never.
    near: Vec<u64>,
    last: Vec<u64>,
}

impl NearPick {
    pub fn new(num_experts: usize, near_n: usize) -> NearPick {
        NearPick { near_n, near: vec![0; num_experts], last: vec![0; num_experts] }
    }
}

impl Prio for NearPick {
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

/// The lazy decay of §5: multiplier M, stored scores S, 1/d computed once; M is multiplied once
/// per step.
pub(crate) struct Lazy {
    multiplier: f64,
    inverse_decay: f64,
    score: Vec<f64>,
    last: Vec<u64>,
}

impl Lazy {
    fn new(num_experts: usize, decay: f64) -> Lazy {
        Lazy { multiplier: 1.0, inverse_decay: 1.0 / decay, score: vec![0.0; num_experts], last: vec![0; num_experts] }
    }
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        (u128::from(self.score[e].to_bits()) << 64) | u128::from(self.last[e])
    }
    /// [`Prio::rank`] with the time of last access in bits 16..64: a time is a level's access
    /// count, below 2^48 since every access reads its own candidate id (2 bytes) of a trace in
    /// the address space (under 2^48 bytes).
    #[inline(always)]
    fn rank(&self, e: usize) -> u128 {
        debug_assert!(self.last[e] < 1 << 48, "an access clock below 2^48");
        (u128::from(self.score[e].to_bits()) << 64) | u128::from(self.last[e] << 16) | e as u128
    }
    fn begin(&mut self) {
        self.multiplier *= self.inverse_decay;
    }
    /// Adds `x · M` to `e`'s score (x >= 0: the score, and so its bits, do not fall) and tells
    /// `heap`.
    #[inline(always)]
    fn credit(&mut self, e: usize, x: f64, heap: &mut KeyHeap) {
        self.score[e] += x * self.multiplier;
        heap.raise(e, || self.rank(e));
    }
    /// The rescale divides every score by M: that keeps their order but may round distinct
    /// scores to one (then the tie-breaker decides), so `heap` takes every key anew.
    fn end(&mut self, heap: &mut KeyHeap) {
        if self.multiplier > 1e100 {
            for s in self.score.iter_mut() {
                *s /= self.multiplier;
            }
            self.multiplier = 1.0;
            heap.rekey(|e| self.rank(e));
        }
    }
}

/// near_pick_ema: (s, time of last access), s ← d·s + [rank < N in F] per row, once per step.
pub(crate) struct NearPickEma {
    near_n: usize,
    lazy: Lazy,
}

impl NearPickEma {
    pub fn new(num_experts: usize, decay: f64, near_n: usize) -> NearPickEma {
        NearPickEma { near_n, lazy: Lazy::new(num_experts, decay) }
    }
}

impl Prio for NearPickEma {
    const CREDITS: bool = true;
    fn f_needed(&self) -> usize {
        self.near_n
    }
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        self.lazy.key(e)
    }
    #[inline(always)]
    fn rank(&self, e: usize) -> u128 {
        self.lazy.rank(e)
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.lazy.last[e] = now;
    }
    fn begin_credits(&mut self) {
        self.lazy.begin();
    }
    fn credit_row(&mut self, _s: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>, heap: &mut KeyHeap) {
        for &e in &f[..f.len().min(self.near_n)] {
            self.lazy.credit(usize::from(e), 1.0, heap);
        }
    }
    fn end_credits(&mut self, heap: &mut KeyHeap) {
        self.lazy.end(heap);
    }
}

/// inv_router: (s, time of last access), s ← d·s + p per row (p the softmax of the row's scores
/// over all m candidates), once per step.
pub(crate) struct InvRouter {
    lazy: Lazy,
    probs: Vec<f64>,
}

impl InvRouter {
    pub fn new(num_experts: usize, decay: f64, m: usize) -> InvRouter {
        InvRouter { lazy: Lazy::new(num_experts, decay), probs: vec![0.0; m] }
    }
}

impl Prio for InvRouter {
    const CREDITS: bool = true;
    fn f_needed(&self) -> usize {
        0
    }
    #[inline(always)]
    fn key(&self, e: usize) -> u128 {
        self.lazy.key(e)
    }
    #[inline(always)]
    fn rank(&self, e: usize) -> u128 {
        self.lazy.rank(e)
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _inserted: bool) {
        self.lazy.last[e] = now;
    }
    fn begin_credits(&mut self) {
        self.lazy.begin();
    }
    fn credit_row(&mut self, _s: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>, heap: &mut KeyHeap) {
        // validate() guarantees scores for inv_router.
        let Some(z) = scores else { return };
        softmax_row(z, &mut self.probs);
        for (&e, &p) in row.iter().zip(&self.probs) {
            self.lazy.credit(usize::from(e), p, heap);
        }
    }
    fn end_credits(&mut self, heap: &mut KeyHeap) {
        self.lazy.end(heap);
    }
}
