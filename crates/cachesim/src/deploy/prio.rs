//! What the deployed replay asks of a policy's priorities (SEMANTICS.md §5 "Priorities", with
//! the step as the unit of time of §11 step 4): the [`Prio`] trait, and the parts several
//! policies share (the step sets of belady, the lazy decay). Each policy's own priorities are in
//! its file in `crate::policy` (`PolicyKind::Steps`), each a per-expert array of E entries.
//!
//! A key is a `u128` (lowest evicted, ties: lowest id): the first component in the high 64 bits,
//! the tie-breaker (time of last access) in the low 64. Decayed scores S >= 0 order as their
//! f64 bits.

use super::heap::KeyHeap;

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
    /// The order moves with the level's clock (lfru's ratios, which an access of another
    /// expert can reorder): no structure keeps it, and every victim is a scan of the cached
    /// experts compared with [`Prio::before`].
    Clocked,
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
    /// Whether cached expert `a` is evicted before cached expert `b` (`a != b`): by default the
    /// lower (key, id); lfru ([`Order::Clocked`]) compares its ratios at the clock as it stands.
    #[inline(always)]
    fn before(&self, a: usize, b: usize) -> bool {
        (self.key(a), a) < (self.key(b), b)
    }
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

/// Sets of experts per step, flattened: `ids[starts[s]..starts[s + 1]]` is step s's set.
pub(crate) struct StepSets {
    pub ids: Vec<u16>,
    pub starts: Vec<usize>,
}

/// What a policy's deployed priorities are built from (`PolicyKind::build_steps`): E, the decay
/// d and N of the credit policies, and m (the candidates per row).
pub(crate) struct StepParams {
    pub num_experts: usize,
    pub decay: f64,
    pub near_n: usize,
    pub m: usize,
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
    pub(crate) fn new(num_experts: usize, decay: f64) -> Lazy {
        Lazy { multiplier: 1.0, inverse_decay: 1.0 / decay, score: vec![0.0; num_experts], last: vec![0; num_experts] }
    }
    #[inline(always)]
    pub(crate) fn key(&self, e: usize) -> u128 {
        (u128::from(self.score[e].to_bits()) << 64) | u128::from(self.last[e])
    }
    /// [`Prio::rank`] with the time of last access in bits 16..64: a time is a level's access
    /// count, below 2^48 since every access reads its own candidate id (2 bytes) of a trace in
    /// the address space (under 2^48 bytes).
    #[inline(always)]
    pub(crate) fn rank(&self, e: usize) -> u128 {
        debug_assert!(self.last[e] < 1 << 48, "an access clock below 2^48");
        (u128::from(self.score[e].to_bits()) << 64) | u128::from(self.last[e] << 16) | e as u128
    }
    /// Expert `e` was accessed at clock `now` (the tie-breaker).
    #[inline(always)]
    pub(crate) fn touch(&mut self, e: usize, now: u64) {
        self.last[e] = now;
    }
    /// A step's credits begin: M ← M / d.
    pub(crate) fn begin(&mut self) {
        self.multiplier *= self.inverse_decay;
    }
    /// Adds `x · M` to `e`'s score (x >= 0: the score, and so its bits, do not fall) and tells
    /// `heap`.
    #[inline(always)]
    pub(crate) fn credit(&mut self, e: usize, x: f64, heap: &mut KeyHeap) {
        self.score[e] += x * self.multiplier;
        heap.raise(e, || self.rank(e));
    }
    /// The rescale divides every score by M: that keeps their order but may round distinct
    /// scores to one (then the tie-breaker decides), so `heap` takes every key anew.
    pub(crate) fn end(&mut self, heap: &mut KeyHeap) {
        if self.multiplier > 1e100 {
            for s in self.score.iter_mut() {
                *s /= self.multiplier;
            }
            self.multiplier = 1.0;
            heap.rekey(|e| self.rank(e));
        }
    }
}

/// The credits of a decayed policy in the deployed loop (near_pick_ema, inv_router): what it adds
/// to the lazy scores per row of a step.
pub(crate) trait StepCredit {
    /// How many entries of F [`StepCredit::credit_row`] reads (its first ones).
    fn f_needed(&self) -> usize;
    /// Credits one row (`f` its kept candidates, `row` its candidates, `scores` their router
    /// scores) into `lazy`, telling `heap` of every raised key.
    fn credit_row(&mut self, f: &[u16], row: &[u16], scores: Option<&[f32]>, lazy: &mut Lazy, heap: &mut KeyHeap);
}

/// A decayed policy's deployed priority: (S, time of last access), with the lazy decay of §5
/// ([`Lazy`], once per step) and the policy's credits `C`.
pub(crate) struct DecayedSteps<C> {
    lazy: Lazy,
    credit: C,
}

impl<C> DecayedSteps<C> {
    pub(crate) fn new(num_experts: usize, decay: f64, credit: C) -> DecayedSteps<C> {
        DecayedSteps { lazy: Lazy::new(num_experts, decay), credit }
    }
}

impl<C: StepCredit> Prio for DecayedSteps<C> {
    const CREDITS: bool = true;
    fn f_needed(&self) -> usize {
        self.credit.f_needed()
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
        self.lazy.touch(e, now);
    }
    fn begin_credits(&mut self) {
        self.lazy.begin();
    }
    fn credit_row(&mut self, _s: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, heap: &mut KeyHeap) {
        self.credit.credit_row(f, row, scores, &mut self.lazy, heap);
    }
    fn end_credits(&mut self, heap: &mut KeyHeap) {
        self.lazy.end(heap);
    }
}
