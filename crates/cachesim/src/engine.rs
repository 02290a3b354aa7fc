//! The fast replay core: one layer at a time, generic over the eviction policy (monomorphized),
//! all state allocated before the token loop, no `Result`, no dynamic dispatch inside it.
//!
//! Cache: a dense slot array plus a position index per expert (O(1) lookup, insert, remove).
//! `lru` and `fifo` keep an intrusive doubly-linked list in priority order, so a victim is found
//! by walking from the oldest end past at most `k_used - 1` protected experts. `lfu` and
//! `belady`, whose priorities change only on accesses, keep an indexed binary heap: eagerly
//! updated for `belady` (the victim search visits only protected nodes and their children),
//! lazily for `lfu`, whose keys only grow while cached (a stale root triggers one refresh and
//! rebuild). `near_pick` (up to N keys change per token), `near_pick_ema` and `inv_router` (every
//! score decays every token) scan the `cap` cached experts on a miss. Decays are eager (the same
//! arithmetic, in the same order, as the reference), so both replayers compare identical f64
//! values.

use trace_io::Shape;

use crate::{LayerCounts, Policy, ReplayConfig, Semantics};

/// Configuration resolved against a trace, shared by all layers.
pub(crate) struct Params<'a> {
    pub policy: Policy,
    pub tokens: usize,
    pub m: usize,
    pub num_experts: usize,
    pub k_used: usize,
    pub cap: usize,
    pub lambda: f64,
    pub j: usize,
    pub warmup: usize,
    pub decay: f64,
    pub near_n: usize,
    pub sequential: bool,
    /// Tokens at which caches and policy state are reset (empty when resets are off).
    pub resets: &'a [u64],
}

impl<'a> Params<'a> {
    pub fn new(shape: &Shape, cfg: &ReplayConfig, seq_offsets: Option<&'a [u64]>) -> Params<'a> {
        Params {
            policy: cfg.policy,
            tokens: shape.tokens,
            m: shape.candidates,
            num_experts: shape.num_experts,
            k_used: cfg.k_used_or(shape.top_k),
            cap: cfg.cap,
            lambda: cfg.lambda,
            j: cfg.j,
            warmup: cfg.warmup,
            decay: cfg.decay,
            near_n: cfg.near_pick_n,
            sequential: cfg.semantics == Semantics::Sequential,
            resets: if cfg.reset_at_sequence { seq_offsets.unwrap_or(&[]) } else { &[] },
        }
    }
}

/// One layer's slices: ids and scores `[T, m]`, keep mask `[E]`.
pub(crate) struct LayerInput<'a> {
    pub ids: &'a [u16],
    pub scores: Option<&'a [f32]>,
    pub keep: &'a [bool],
}

/// Replays one layer with the configured policy.
pub(crate) fn replay_layer(p: &Params<'_>, inp: &LayerInput<'_>) -> LayerCounts {
    let e = p.num_experts;
    match p.policy {
        Policy::Lru => run(p, inp, Lru(List::new(e))),
        Policy::Fifo => run(p, inp, Fifo(List::new(e))),
        Policy::Lfu => run(p, inp, Lfu { heap: KeyHeap::new(e, p.cap), count: vec![0; e], last: vec![0; e] }),
        Policy::Belady => run(p, inp, Belady::new(p, inp)),
        Policy::NearPick => run(p, inp, NearPick { key: vec![[0, 0]; e], n: p.near_n }),
        Policy::NearPickEma => {
            run(p, inp, NearPickEma { s: vec![0.0; e], last: vec![0; e], n: p.near_n, decay: p.decay })
        }
        Policy::InvRouter => {
            let pol = InvRouter { s: vec![0.0; e], last: vec![0; e], decay: p.decay, exps: vec![0.0; p.m] };
            run(p, inp, pol)
        }
    }
}

const ABSENT: u32 = u32::MAX;

/// The cached experts of one layer: dense slots plus a position index.
struct Cache {
    slots: Vec<u16>,
    pos: Vec<u32>,
}

impl Cache {
    fn new(num_experts: usize, cap: usize) -> Cache {
        Cache { slots: Vec::with_capacity(cap.min(num_experts)), pos: vec![ABSENT; num_experts] }
    }

    #[inline(always)]
    fn contains(&self, e: usize) -> bool {
        self.pos[e] != ABSENT
    }

    #[inline(always)]
    fn insert(&mut self, e: usize) {
        self.pos[e] = self.slots.len() as u32;
        self.slots.push(e as u16);
    }

    #[inline(always)]
    fn remove(&mut self, e: usize) {
        let i = self.pos[e] as usize;
        self.slots.swap_remove(i);
        if let Some(&moved) = self.slots.get(i) {
            self.pos[usize::from(moved)] = i as u32;
        }
        self.pos[e] = ABSENT;
    }

    fn clear(&mut self) {
        for &e in &self.slots {
            self.pos[usize::from(e)] = ABSENT;
        }
        self.slots.clear();
    }
}

/// What the token loop needs from a policy. `prot[e] == stamp` marks experts chosen for the
/// current token (never written in sequential mode, so nothing is protected there).
trait Evictor {
    /// How many leading candidates of F the credits read (F is built at least this long).
    fn f_needed(&self) -> usize {
        0
    }
    /// Forgets all state (the cache was emptied at a sequence start).
    fn reset(&mut self);
    /// Expert `e`, the `i`-th chosen of token `t`, was accessed at pick time `now`.
    fn access(&mut self, e: usize, now: u64, t: usize, i: usize, inserted: bool);
    /// Expert `e` was evicted.
    fn evicted(&mut self, _e: usize) {}
    /// The cached, unprotected expert of lowest priority (ties: lowest id). The cache is full.
    fn victim(&mut self, cache: &Cache, prot: &[u64], stamp: u64) -> usize;
    /// Credits after token `t`: `f` is a prefix (at least `f_needed` long, or all) of F.
    fn end_token(&mut self, _t: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
}

/// The unprotected cached expert of lowest (s, last access) for the decayed-score policies.
/// Scores are finite and >= +0.0, so their bit patterns order like the values; last-access
/// times are unique, so keys never tie.
#[inline(always)]
fn scan_scored(cache: &Cache, prot: &[u64], stamp: u64, s: &[f64], last: &[u64]) -> usize {
    let mut best_e = usize::MAX;
    let mut best_k = u128::MAX;
    for &e in &cache.slots {
        let e = usize::from(e);
        let k = pack(s[e].to_bits(), last[e]);
        if prot[e] != stamp && k < best_k {
            best_k = k;
            best_e = e;
        }
    }
    debug_assert!(best_e != usize::MAX, "a full cache always holds an unprotected expert");
    best_e
}

/// Intrusive doubly-linked list over expert ids with a sentinel at index E; front = oldest.
struct List {
    prev: Vec<u32>,
    next: Vec<u32>,
    sentinel: usize,
}

impl List {
    fn new(num_experts: usize) -> List {
        let s = num_experts as u32;
        List { prev: vec![s; num_experts + 1], next: vec![s; num_experts + 1], sentinel: num_experts }
    }

    #[inline(always)]
    fn push_back(&mut self, e: usize) {
        let s = self.sentinel;
        let tail = self.prev[s] as usize;
        self.next[tail] = e as u32;
        self.prev[e] = tail as u32;
        self.next[e] = s as u32;
        self.prev[s] = e as u32;
    }

    #[inline(always)]
    fn unlink(&mut self, e: usize) {
        let (p, n) = (self.prev[e] as usize, self.next[e] as usize);
        self.next[p] = n as u32;
        self.prev[n] = p as u32;
    }

    /// The oldest unprotected entry. Entries in the list are distinct experts, so unique
    /// insertion/access times: no ties to break.
    #[inline(always)]
    fn first_unprotected(&self, prot: &[u64], stamp: u64) -> usize {
        let mut x = self.next[self.sentinel] as usize;
        while x != self.sentinel && prot[x] == stamp {
            x = self.next[x] as usize;
        }
        debug_assert!(x != self.sentinel, "a full cache always holds an unprotected expert");
        x
    }

    fn clear(&mut self) {
        let s = self.sentinel;
        self.prev[s] = s as u32;
        self.next[s] = s as u32;
    }
}

struct Lru(List);

impl Evictor for Lru {
    fn reset(&mut self) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool) {
        if !inserted {
            self.0.unlink(e);
        }
        self.0.push_back(e);
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.0.unlink(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        self.0.first_unprotected(prot, stamp)
    }
}

struct Fifo(List);

impl Evictor for Fifo {
    fn reset(&mut self) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool) {
        if inserted {
            self.0.push_back(e);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.0.unlink(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        self.0.first_unprotected(prot, stamp)
    }
}

/// An indexed binary min-heap over the cached experts with a `u128` key per expert (keys are
/// unique: they end in a pick time or an expert id). Fixed-size arrays, no allocation after
/// construction. Used by the policies whose priorities change only on events (access, credit).
struct KeyHeap {
    heap: Vec<u16>,
    hpos: Vec<u32>,
    key: Vec<u128>,
    /// DFS stack of `min_unprotected`, capacity = the heap's.
    stack: Vec<u32>,
    /// Protected experts set aside by `min_unprotected_lazy`, capacity = the heap's.
    aside: Vec<u16>,
}

impl KeyHeap {
    fn new(num_experts: usize, cap: usize) -> KeyHeap {
        let cap = cap.min(num_experts);
        KeyHeap {
            heap: Vec::with_capacity(cap),
            hpos: vec![ABSENT; num_experts],
            key: vec![0; num_experts],
            stack: Vec::with_capacity(cap),
            aside: Vec::with_capacity(cap),
        }
    }

    fn clear(&mut self) {
        for &e in &self.heap {
            self.hpos[usize::from(e)] = ABSENT;
        }
        self.heap.clear();
    }

    #[inline(always)]
    fn contains(&self, e: usize) -> bool {
        self.hpos[e] != ABSENT
    }

    #[inline(always)]
    fn k(&self, i: usize) -> u128 {
        self.key[usize::from(self.heap[i])]
    }

    #[inline(always)]
    fn place(&mut self, i: usize, e: u16) {
        self.heap[i] = e;
        self.hpos[usize::from(e)] = i as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        let e = self.heap[i];
        let k = self.key[usize::from(e)];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.k(parent) <= k {
                break;
            }
            let pe = self.heap[parent];
            self.place(i, pe);
            i = parent;
        }
        self.place(i, e);
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        let e = self.heap[i];
        let k = self.key[usize::from(e)];
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let c = if r < n && self.k(r) < self.k(l) { r } else { l };
            if self.k(c) >= k {
                break;
            }
            let ce = self.heap[c];
            self.place(i, ce);
            i = c;
        }
        self.place(i, e);
    }

    /// Inserts `e` or updates its key.
    #[inline(always)]
    fn set(&mut self, e: usize, key: u128) {
        self.key[e] = key;
        if self.contains(e) {
            let i = self.hpos[e] as usize;
            self.sift_up(i);
            let i = self.hpos[e] as usize;
            self.sift_down(i);
        } else {
            self.heap.push(e as u16);
            let i = self.heap.len() - 1;
            self.hpos[e] = i as u32;
            self.sift_up(i);
        }
    }

    #[inline(always)]
    fn remove(&mut self, e: usize) {
        let i = self.hpos[e] as usize;
        self.hpos[e] = ABSENT;
        let Some(last) = self.heap.pop() else { return };
        if i < self.heap.len() {
            self.place(i, last);
            self.sift_up(i);
            let j = self.hpos[usize::from(last)] as usize;
            self.sift_down(j);
        }
    }

    /// The expert of lowest key that is not protected. A protected node's subtree may hold the
    /// answer, an unprotected node's subtree cannot beat it: the search visits the protected
    /// nodes (at most k_used - 1) and their children.
    fn min_unprotected(&mut self, prot: &[u64], stamp: u64) -> usize {
        let mut best = usize::MAX;
        let mut best_k = u128::MAX;
        self.stack.clear();
        if !self.heap.is_empty() {
            self.stack.push(0);
        }
        while let Some(i) = self.stack.pop() {
            let i = i as usize;
            let e = usize::from(self.heap[i]);
            if prot[e] == stamp {
                for c in [2 * i + 1, 2 * i + 2] {
                    if c < self.heap.len() {
                        self.stack.push(c as u32);
                    }
                }
            } else if self.key[e] < best_k {
                best_k = self.key[e];
                best = e;
            }
        }
        debug_assert!(best != usize::MAX, "a full cache always holds an unprotected expert");
        best
    }
}

impl KeyHeap {
    /// `min_unprotected` for policies whose keys only grow while an expert is cached (lfu): the
    /// stored keys are lower bounds, refreshed only when they reach the root.
    /// A fresh root is the true minimum (its key is <= every stored key <= every actual key).
    /// Protected roots are set aside and pushed back afterwards.
    fn min_unprotected_lazy(&mut self, prot: &[u64], stamp: u64, actual: impl Fn(usize) -> u128) -> usize {
        self.aside.clear();
        let victim = loop {
            let Some(&root) = self.heap.first() else { break usize::MAX };
            let e = usize::from(root);
            let a = actual(e);
            if a != self.key[e] {
                // A stale root: refresh every key and rebuild (O(cap), like one scan); the
                // other misses of the token then find fresh roots in O(log cap).
                debug_assert!(a > self.key[e], "keys only grow while cached");
                for i in 0..self.heap.len() {
                    let x = usize::from(self.heap[i]);
                    self.key[x] = actual(x);
                }
                for i in (0..self.heap.len() / 2).rev() {
                    self.sift_down(i);
                }
            } else if prot[e] == stamp {
                self.remove(e);
                self.aside.push(root);
            } else {
                break e;
            }
        };
        for i in 0..self.aside.len() {
            let e = usize::from(self.aside[i]);
            self.set(e, self.key[e]);
        }
        debug_assert!(victim != usize::MAX, "a full cache always holds an unprotected expert");
        victim
    }
}

#[inline(always)]
fn pack(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

/// lfu: key (accesses since insertion, last access time), kept lazily in the heap (both parts
/// only grow while the expert is cached).
struct Lfu {
    heap: KeyHeap,
    count: Vec<u64>,
    last: Vec<u64>,
}

impl Evictor for Lfu {
    fn reset(&mut self) {
        self.heap.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, inserted: bool) {
        self.count[e] = if inserted { 1 } else { self.count[e] + 1 };
        self.last[e] = now;
        if inserted {
            self.heap.set(e, pack(1, now));
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.heap.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        let (count, last) = (&self.count, &self.last);
        self.heap.min_unprotected_lazy(prot, stamp, |e| pack(count[e], last[e]))
    }
}

/// Sentinel "never chosen again".
const NEVER: usize = usize::MAX;

/// belady: key (u64::MAX − next use, expert id): never-again first, then farthest, ties to the
/// lowest id.
struct Belady {
    /// Next token (within the sequence when resets are on) at which the `i`-th chosen expert of
    /// token `t` is chosen again: `next_of[t * k_used + i]`.
    next_of: Vec<usize>,
    k_used: usize,
    heap: KeyHeap,
}

impl Belady {
    /// Backward pass over the λ = 0 selections (F[0..n]) of the layer.
    fn new(p: &Params<'_>, inp: &LayerInput<'_>) -> Belady {
        let (m, k) = (p.m, p.k_used);
        let mut next_of = vec![NEVER; p.tokens * k];
        let mut upcoming = vec![NEVER; p.num_experts];
        let mut ri = p.resets.len();
        for t in (0..p.tokens).rev() {
            let row = &inp.ids[t * m..(t + 1) * m];
            let chosen = row.iter().map(|&e| usize::from(e)).filter(|&e| inp.keep[e]).take(k);
            for (i, e) in chosen.enumerate() {
                next_of[t * k + i] = upcoming[e];
                upcoming[e] = t;
            }
            if ri > 0 && p.resets[ri - 1] == t as u64 {
                upcoming.fill(NEVER);
                ri -= 1;
            }
        }
        Belady { next_of, k_used: k, heap: KeyHeap::new(p.num_experts, p.cap) }
    }
}

impl Evictor for Belady {
    fn reset(&mut self) {
        self.heap.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, t: usize, i: usize, _inserted: bool) {
        let next = self.next_of[t * self.k_used + i];
        self.heap.set(e, pack(u64::MAX - next as u64, e as u64));
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.heap.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        self.heap.min_unprotected(prot, stamp)
    }
}

/// near_pick: key (1 + last token in F at rank < N, or 0 = never; last access time). Up to N
/// keys change every token, so a scan of the cached experts on a miss beats keeping a heap.
struct NearPick {
    /// `[near, last]` per expert, interleaved so a scan reads one cache line per expert.
    key: Vec<[u64; 2]>,
    n: usize,
}

impl Evictor for NearPick {
    fn f_needed(&self) -> usize {
        self.n
    }
    fn reset(&mut self) {
        for k in &mut self.key {
            k[0] = 0;
        }
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, _inserted: bool) {
        self.key[e][1] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        let mut best_e = usize::MAX;
        let mut best_k = u128::MAX;
        for &e in &cache.slots {
            let e = usize::from(e);
            let [near, last] = self.key[e];
            let k = pack(near, last);
            if prot[e] != stamp && k < best_k {
                best_k = k;
                best_e = e;
            }
        }
        debug_assert!(best_e != usize::MAX, "a full cache always holds an unprotected expert");
        best_e
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        for &e in f.iter().take(self.n) {
            self.key[usize::from(e)][0] = t as u64 + 1;
        }
    }
}

struct NearPickEma {
    s: Vec<f64>,
    last: Vec<u64>,
    n: usize,
    decay: f64,
}

impl Evictor for NearPickEma {
    fn f_needed(&self) -> usize {
        self.n
    }
    fn reset(&mut self) {
        self.s.fill(0.0);
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, _inserted: bool) {
        self.last[e] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        scan_scored(cache, prot, stamp, &self.s, &self.last)
    }
    #[inline(always)]
    fn end_token(&mut self, _t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        // s <- d*s + x, eagerly: d*s for every expert, then + 1 where x = 1 (adding 0 elsewhere
        // is exact, so this equals the reference's d*s + x bit for bit).
        let d = self.decay;
        for s in &mut self.s {
            *s *= d;
        }
        for &e in f.iter().take(self.n) {
            self.s[usize::from(e)] += 1.0;
        }
    }
}

struct InvRouter {
    s: Vec<f64>,
    last: Vec<u64>,
    decay: f64,
    /// exp(z - max) per candidate of the current row, `[m]`.
    exps: Vec<f64>,
}

impl Evictor for InvRouter {
    fn reset(&mut self) {
        self.s.fill(0.0);
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, _inserted: bool) {
        self.last[e] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        scan_scored(cache, prot, stamp, &self.s, &self.last)
    }
    #[inline(always)]
    fn end_token(&mut self, _t: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        let d = self.decay;
        for s in &mut self.s {
            *s *= d;
        }
        // validate() guarantees scores for inv_router; without them there is nothing to credit.
        let Some(z) = scores else { return };
        // Scores are non-increasing along a row, so z[0] is the maximum.
        let max = f64::from(z[0]);
        let mut sum = 0.0;
        for (x, &zi) in self.exps.iter_mut().zip(z) {
            *x = (f64::from(zi) - max).exp();
            sum += *x;
        }
        for (&e, &x) in row.iter().zip(&self.exps) {
            self.s[usize::from(e)] += x / sum;
        }
    }
}

/// The token loop of one layer (SEMANTICS.md §5 steps 1-5).
#[inline(never)]
fn run<P: Evictor>(p: &Params<'_>, inp: &LayerInput<'_>, mut pol: P) -> LayerCounts {
    let (m, k, cap) = (p.m, p.k_used, p.cap);
    let mut cache = Cache::new(p.num_experts, cap);
    // prot[e] == t + 1: e is chosen for token t (k-way protection); never written in sequential.
    let mut prot = vec![0u64; p.num_experts];
    // F: kept candidates in order (expert, position in the row), built up to f_limit long.
    let mut f_ids: Vec<u16> = Vec::with_capacity(m);
    let mut f_pos: Vec<u32> = Vec::with_capacity(m);
    // chosen: (expert, position in the row), in processing order.
    let mut chosen: Vec<(u16, u32)> = Vec::with_capacity(k);
    let cache_aware = p.lambda > 0.0;
    let f_limit = if cache_aware { m } else { k.max(pol.f_needed()).min(m) };
    let mut c = LayerCounts::default();
    let mut now = 0u64;
    let mut ri = 0;

    for t in 0..p.tokens {
        if ri < p.resets.len() && p.resets[ri] == t as u64 {
            cache.clear();
            pol.reset();
            ri += 1;
        }
        let row = &inp.ids[t * m..(t + 1) * m];
        let row_scores = inp.scores.map(|s| &s[t * m..(t + 1) * m]);

        // Step 1: F and n.
        f_ids.clear();
        f_pos.clear();
        if f_limit > 0 {
            for (i, &e) in row.iter().enumerate() {
                if inp.keep[usize::from(e)] {
                    f_ids.push(e);
                    f_pos.push(i as u32);
                    if f_ids.len() == f_limit {
                        break;
                    }
                }
            }
        }
        let n = k.min(f_ids.len());

        // Step 2: selection.
        chosen.clear();
        match row_scores {
            Some(z) if cache_aware => select_cache_aware(&f_ids, &f_pos, z, n, p, &cache, &mut chosen),
            _ => chosen.extend(f_ids[..n].iter().zip(&f_pos[..n]).map(|(&e, &i)| (e, i))),
        }

        // Step 3: counts from token W on.
        let counted = t >= p.warmup;
        if counted {
            let forced = (k - n) as u64;
            c.picks += k as u64;
            c.misses += forced;
            c.forced_misses += forced;
            c.substituted += chosen.iter().filter(|&&(_, i)| i as usize >= k).count() as u64;
            c.pruned_slots += row[..k].iter().filter(|&&e| !inp.keep[usize::from(e)]).count() as u64;
        }

        // Step 4: residency.
        let stamp = t as u64 + 1;
        if !p.sequential {
            for &(e, _) in &chosen {
                prot[usize::from(e)] = stamp;
            }
        }
        for (i, &(e, _)) in chosen.iter().enumerate() {
            let e = usize::from(e);
            now += 1;
            if cache.contains(e) {
                c.hits += u64::from(counted);
                pol.access(e, now, t, i, false);
            } else {
                c.misses += u64::from(counted);
                if cache.slots.len() >= cap {
                    let v = pol.victim(&cache, &prot, stamp);
                    cache.remove(v);
                    pol.evicted(v);
                }
                cache.insert(e);
                pol.access(e, now, t, i, true);
            }
        }

        // Step 5: credits.
        pol.end_token(t, &f_ids, row, row_scores);
    }
    c
}

/// Step 2 for λ > 0: the first n of F by (score desc, rank asc), where candidates of rank < j
/// or already cached get z + λ·δ. Both the boosted and the plain candidates keep F's
/// (non-increasing) score order, so the selection is a merge of two sorted runs.
#[inline(always)]
fn select_cache_aware(
    f_ids: &[u16],
    f_pos: &[u32],
    z_row: &[f32],
    n: usize,
    p: &Params<'_>,
    cache: &Cache,
    chosen: &mut Vec<(u16, u32)>,
) {
    if n == 0 {
        return;
    }
    let z = |r: usize| f64::from(z_row[f_pos[r] as usize]);
    let delta = if n <= 1 { 0.0 } else { z(0) - z(n - 1) };
    let bonus = p.lambda * delta;
    let boosted = |r: usize| r < p.j || cache.contains(usize::from(f_ids[r]));
    let len = f_ids.len();
    let next_boosted = |mut r: usize| {
        while r < len && !boosted(r) {
            r += 1;
        }
        r
    };
    let next_plain = |mut r: usize| {
        while r < len && boosted(r) {
            r += 1;
        }
        r
    };
    let (mut a, mut b) = (next_boosted(0), next_plain(0));
    while chosen.len() < n {
        let take_a = if a >= len {
            false
        } else if b >= len {
            true
        } else {
            let (za, zb) = (z(a) + bonus, z(b));
            za > zb || (za == zb && a < b)
        };
        if take_a {
            chosen.push((f_ids[a], f_pos[a]));
            a = next_boosted(a + 1);
        } else {
            chosen.push((f_ids[b], f_pos[b]));
            b = next_plain(b + 1);
        }
    }
}
