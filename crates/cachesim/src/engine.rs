//! The fast replay core: one layer at a time, generic over the eviction policy (monomorphized),
//! all state allocated before the token loop, no `Result`, no dynamic dispatch inside it.
//!
//! Token loop: with a full keep set F is the row itself (no copy); at λ = 0 the chosen experts
//! are F's prefix and the counts of step 3 need no per-slot work; at λ > 0 one pass over F
//! merges the boosted and the plain candidates and stops once n are chosen.
//!
//! Cache: a position index per expert (O(1) lookup, insert, remove), plus a dense slot array
//! for the policies that scan the cached experts.
//! Priority structures, per policy:
//! - `lru`, `fifo`: an intrusive doubly-linked list in priority order; a victim is found by
//!   walking from the oldest end past at most `k_used - 1` protected experts.
//! - `lfu`, `near_pick`: [`Groups`], a list of groups of equal first key (access count, resp.
//!   last near-pick token) in increasing order, each an intrusive list ordered by last access.
//!   Every update is O(1) (`near_pick`'s insertion searches its group from both ends), except
//!   that the group `near_pick` creates at the end of a token is filled in F order and sorted by
//!   last access only if a victim search reaches it.
//! - `belady`: an indexed binary heap with `u64` keys, updated on every access.
//! - `near_pick_ema`, `inv_router` (every score decays every token): in k-way mode one scan of
//!   the cached experts per token selects all the victims the token needs (the keys of unchosen
//!   experts do not change within a token and chosen ones are protected, so the q misses evict
//!   exactly the q lowest unprotected keys); in sequential mode one scan per miss. Decays are
//!   eager (the same arithmetic, in the same order, as the reference) over a contiguous array,
//!   so both replayers compare identical f64 values: a lazy multiplier would round differently
//!   and could flip near-ties, which the counts must not.

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
    let groups = || Groups::new(e, p.cap);
    match p.policy {
        Policy::Lru => run(p, inp, Lru(List::new(e))),
        Policy::Fifo => run(p, inp, Fifo(List::new(e))),
        Policy::Lfu => run(p, inp, Lfu { g: groups() }),
        Policy::Belady => run(p, inp, Belady::new(p, inp)),
        Policy::NearPick => run(p, inp, NearPick { g: groups(), near: vec![0; e], last: vec![0; e], n: p.near_n }),
        Policy::NearPickEma => {
            run(p, inp, NearPickEma { s: vec![0.0; e], last: vec![0; e], n: p.near_n, decay: p.decay })
        }
        Policy::InvRouter => {
            let pol = InvRouter {
                s: vec![0.0; e],
                last: vec![0; e],
                decay: p.decay,
                exps: vec![0.0; p.m],
                memo: ExpMemo::new(),
            };
            run(p, inp, pol)
        }
    }
}

const ABSENT: u32 = u32::MAX;

/// The cached experts of one layer: a position index per expert plus, for the policies that
/// scan the cache (`slots` true), the dense slot array; the others only need membership and
/// the count.
struct Cache {
    slots: Vec<u16>,
    pos: Vec<u32>,
    len: usize,
    keep_slots: bool,
}

impl Cache {
    fn new(num_experts: usize, cap: usize, keep_slots: bool) -> Cache {
        let slots = Vec::with_capacity(if keep_slots { cap.min(num_experts) } else { 0 });
        Cache { slots, pos: vec![ABSENT; num_experts], len: 0, keep_slots }
    }

    #[inline(always)]
    fn contains(&self, e: usize) -> bool {
        self.pos[e] != ABSENT
    }

    #[inline(always)]
    fn insert(&mut self, e: usize) {
        if self.keep_slots {
            self.pos[e] = self.slots.len() as u32;
            self.slots.push(e as u16);
        } else {
            self.pos[e] = 0;
        }
        self.len += 1;
    }

    #[inline(always)]
    fn remove(&mut self, e: usize) {
        if self.keep_slots {
            let i = self.pos[e] as usize;
            self.slots.swap_remove(i);
            if let Some(&moved) = self.slots.get(i) {
                self.pos[usize::from(moved)] = i as u32;
            }
        }
        self.pos[e] = ABSENT;
        self.len -= 1;
    }

    fn clear(&mut self) {
        if self.keep_slots {
            for &e in &self.slots {
                self.pos[usize::from(e)] = ABSENT;
            }
            self.slots.clear();
        } else {
            self.pos.fill(ABSENT);
        }
        self.len = 0;
    }
}

/// What the token loop needs from a policy. `prot[e] == stamp` marks experts chosen for the
/// current token (never written in sequential mode, so nothing is protected there).
trait Evictor {
    /// k-way mode selects all of a token's victims at once with [`Evictor::victims`].
    const BATCH: bool = false;
    /// The policy reads `Cache::slots` (scans the cached experts).
    const SLOTS: bool = false;
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
    /// With `BATCH`: the `q` cached, unprotected experts of lowest priority, into `out`.
    fn victims(&mut self, _cache: &Cache, _prot: &[u64], _stamp: u64, _q: usize, _out: &mut Vec<u128>) {}
    /// Credits after token `t`: `f` is a prefix (at least `f_needed` long, or all) of F.
    fn end_token(&mut self, _t: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
}

/// The `q` unprotected cached experts of lowest `(hi(e), lo(e))` into `out` (capacity >= q),
/// each as the key `hi << 64 | lo << 16 | e`. `lo` is a last-access time, unique and below
/// 2^48 (a pick count: tokens · m < 2^47 for any trace that fits in an address space), so keys
/// are unique. `hi` is read for every cached expert, `lo` only when `hi` does not already
/// exclude it.
#[inline(always)]
fn scan_lowest(
    cache: &Cache,
    prot: &[u64],
    stamp: u64,
    q: usize,
    out: &mut Vec<u128>,
    hi: impl Fn(usize) -> u64,
    lo: impl Fn(usize) -> u64,
) {
    out.clear();
    let mut thr = u128::MAX;
    let mut thr_hi = u64::MAX;
    // Newest slots first: recently inserted experts tend to have the lowest scores, so the
    // threshold drops early and few later keys pass it.
    for &e in cache.slots.iter().rev() {
        let e = usize::from(e);
        let h = hi(e);
        if h > thr_hi {
            continue;
        }
        let key = pack(h, (lo(e) << 16) | e as u64);
        if key < thr && prot[e] != stamp {
            // Insertion into the sorted buffer (q <= k_used: short): shift the larger keys up.
            if out.len() < q {
                out.push(key);
            }
            let mut i = out.len() - 1;
            while i > 0 && out[i - 1] > key {
                out[i] = out[i - 1];
                i -= 1;
            }
            out[i] = key;
            if out.len() == q {
                thr = out[q - 1];
                thr_hi = (thr >> 64) as u64;
            }
        }
    }
    debug_assert!(out.len() == q, "a full cache holds enough unprotected experts");
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

const NIL: u32 = u32::MAX;

/// Per cached expert: neighbours in its group's list and its group (`NIL`: not cached).
#[derive(Clone, Copy)]
struct Item {
    prev: u32,
    next: u32,
    group: u32,
}

/// A group node: key, first and last expert, neighbours in the group list, sortedness.
#[derive(Clone, Copy)]
struct Group {
    key: u64,
    head: u32,
    tail: u32,
    prev: u32,
    next: u32,
    sorted: bool,
}

/// Cached experts ordered by (group key, last access): a doubly-linked list of groups in
/// increasing key order (sentinel `sentinel`), each holding an intrusive doubly-linked list of
/// its experts, oldest access first. Group nodes come from a fixed pool (at most one per cached
/// expert, plus one transiently), so nothing allocates after construction.
///
/// A group may be marked unsorted (filled out of access order); [`Groups::first_unprotected`]
/// sorts it by last access when it reaches it. Appending the most recently accessed expert
/// keeps a sorted group sorted.
struct Groups {
    items: Vec<Item>,
    groups: Vec<Group>,
    free: Vec<u32>,
    sentinel: u32,
    /// Sort buffer, capacity = the pool's.
    buf: Vec<(u64, u32)>,
}

impl Groups {
    fn new(num_experts: usize, cap: usize) -> Groups {
        let pool = cap.min(num_experts) + 2;
        let s = pool as u32;
        let mut g = Groups {
            items: vec![Item { prev: NIL, next: NIL, group: NIL }; num_experts],
            groups: vec![Group { key: 0, head: NIL, tail: NIL, prev: s, next: s, sorted: true }; pool + 1],
            free: Vec::with_capacity(pool),
            sentinel: s,
            buf: Vec::with_capacity(pool),
        };
        g.clear();
        g
    }

    fn clear(&mut self) {
        let s = self.sentinel as usize;
        let mut g = self.groups[s].next;
        while g != self.sentinel {
            let mut x = self.groups[g as usize].head;
            while x != NIL {
                self.items[x as usize].group = NIL;
                x = self.items[x as usize].next;
            }
            g = self.groups[g as usize].next;
        }
        self.groups[s].next = self.sentinel;
        self.groups[s].prev = self.sentinel;
        self.free.clear();
        self.free.extend((0..self.sentinel).rev());
    }

    #[inline(always)]
    fn contains(&self, e: usize) -> bool {
        self.items[e].group != NIL
    }

    #[inline(always)]
    fn first_group(&self) -> u32 {
        self.groups[self.sentinel as usize].next
    }

    #[inline(always)]
    fn last_group(&self) -> u32 {
        self.groups[self.sentinel as usize].prev
    }

    /// A new, empty group with `key`, linked after group `after` (the sentinel: at the front).
    #[inline(always)]
    fn new_group_after(&mut self, after: u32, key: u64, sorted: bool) -> u32 {
        let g = self.free.pop().expect("the pool holds a group per cached expert plus one");
        let n = self.groups[after as usize].next;
        self.groups[g as usize] = Group { key, head: NIL, tail: NIL, prev: after, next: n, sorted };
        self.groups[after as usize].next = g;
        self.groups[n as usize].prev = g;
        g
    }

    /// Appends expert `e` (not in any group) at the end of group `g`.
    #[inline(always)]
    fn push_back(&mut self, g: u32, e: usize) {
        let tail = self.groups[g as usize].tail;
        self.items[e] = Item { prev: tail, next: NIL, group: g };
        if tail == NIL {
            self.groups[g as usize].head = e as u32;
        } else {
            self.items[tail as usize].next = e as u32;
        }
        self.groups[g as usize].tail = e as u32;
    }

    /// Unlinks expert `e` from its group, leaving the group in place even when empty.
    #[inline(always)]
    fn unlink(&mut self, e: usize) -> u32 {
        let Item { prev, next, group } = self.items[e];
        if prev == NIL {
            self.groups[group as usize].head = next;
        } else {
            self.items[prev as usize].next = next;
        }
        if next == NIL {
            self.groups[group as usize].tail = prev;
        } else {
            self.items[next as usize].prev = prev;
        }
        self.items[e].group = NIL;
        group
    }

    /// Frees group `g` when it is empty.
    #[inline(always)]
    fn drop_if_empty(&mut self, g: u32) {
        let Group { head, prev, next, .. } = self.groups[g as usize];
        if head == NIL {
            self.groups[prev as usize].next = next;
            self.groups[next as usize].prev = prev;
            self.free.push(g);
        }
    }

    /// Removes cached expert `e`.
    #[inline(always)]
    fn remove(&mut self, e: usize) {
        let g = self.unlink(e);
        self.drop_if_empty(g);
    }

    /// Moves cached expert `e` to the end of group `to` (not its current group).
    #[inline(always)]
    fn move_to(&mut self, e: usize, to: u32) {
        let g = self.unlink(e);
        self.drop_if_empty(g);
        self.push_back(to, e);
    }

    /// Moves cached expert `e` to the end of its own group (it was just accessed).
    #[inline(always)]
    fn touch(&mut self, e: usize) {
        if self.items[e].next != NIL {
            let g = self.unlink(e);
            self.push_back(g, e);
        }
    }

    /// The group with `key`, created in order when missing. Searches from both ends at once.
    #[inline(always)]
    fn group_with_key(&mut self, key: u64) -> u32 {
        let s = self.sentinel;
        let (mut a, mut b) = (self.first_group(), self.last_group());
        loop {
            // Groups before `a` have keys < key, groups after `b` keys > key.
            let ga = self.groups[a as usize];
            if a == s || ga.key >= key {
                if a != s && ga.key == key {
                    return a;
                }
                return self.new_group_after(ga.prev, key, true);
            }
            let gb = self.groups[b as usize];
            if gb.key <= key {
                if gb.key == key {
                    return b;
                }
                return self.new_group_after(b, key, true);
            }
            a = ga.next;
            b = gb.prev;
        }
    }

    /// Sorts group `g` by `last`.
    fn sort_group(&mut self, g: u32, last: &[u64]) {
        self.buf.clear();
        let mut x = self.groups[g as usize].head;
        while x != NIL {
            self.buf.push((last[x as usize], x));
            x = self.items[x as usize].next;
        }
        self.buf.sort_unstable();
        let mut prev = NIL;
        for &(_, x) in &self.buf {
            let it = &mut self.items[x as usize];
            it.prev = prev;
            it.next = NIL;
            if prev != NIL {
                self.items[prev as usize].next = x;
            }
            prev = x;
        }
        let grp = &mut self.groups[g as usize];
        grp.head = self.buf.first().map_or(NIL, |&(_, x)| x);
        grp.tail = prev;
        grp.sorted = true;
    }

    /// The first unprotected expert in (key, last access) order. Some cached expert is
    /// unprotected.
    #[inline(always)]
    fn first_unprotected(&mut self, prot: &[u64], stamp: u64, last: &[u64]) -> usize {
        let mut g = self.first_group();
        while g != self.sentinel {
            if !self.groups[g as usize].sorted {
                self.sort_group(g, last);
            }
            let mut x = self.groups[g as usize].head;
            while x != NIL {
                if prot[x as usize] != stamp {
                    return x as usize;
                }
                x = self.items[x as usize].next;
            }
            g = self.groups[g as usize].next;
        }
        debug_assert!(false, "a full cache always holds an unprotected expert");
        usize::MAX
    }
}

/// An indexed binary min-heap of `u64` keys whose low 16 bits are the expert id (so keys are
/// unique and the heap needs no indirection to compare). Fixed-size arrays, no allocation after
/// construction.
struct KeyHeap {
    heap: Vec<u64>,
    hpos: Vec<u32>,
    /// DFS stack of `min_unprotected`, capacity = the heap's.
    stack: Vec<u32>,
}

const ID_MASK: u64 = (1 << ID_BITS) - 1;

impl KeyHeap {
    fn new(num_experts: usize, cap: usize) -> KeyHeap {
        let cap = cap.min(num_experts);
        KeyHeap { heap: Vec::with_capacity(cap), hpos: vec![ABSENT; num_experts], stack: Vec::with_capacity(cap) }
    }

    fn clear(&mut self) {
        for &k in &self.heap {
            self.hpos[(k & ID_MASK) as usize] = ABSENT;
        }
        self.heap.clear();
    }

    #[inline(always)]
    fn place(heap: &mut [u64], hpos: &mut [u32], i: usize, k: u64) {
        heap[i] = k;
        hpos[(k & ID_MASK) as usize] = i as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        let (heap, hpos) = (&mut self.heap[..], &mut self.hpos[..]);
        let k = heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            let pk = heap[parent];
            if pk <= k {
                break;
            }
            Self::place(heap, hpos, i, pk);
            i = parent;
        }
        Self::place(heap, hpos, i, k);
    }

    fn sift_down(&mut self, mut i: usize) {
        let (heap, hpos) = (&mut self.heap[..], &mut self.hpos[..]);
        let n = heap.len();
        let k = heap[i];
        loop {
            let l = 2 * i + 1;
            if l >= n {
                break;
            }
            let r = l + 1;
            let (c, ck) = if r < n && heap[r] < heap[l] { (r, heap[r]) } else { (l, heap[l]) };
            if ck >= k {
                break;
            }
            Self::place(heap, hpos, i, ck);
            i = c;
        }
        Self::place(heap, hpos, i, k);
    }

    /// Inserts expert `key & ID_MASK` or updates its key.
    #[inline(always)]
    fn set(&mut self, key: u64) {
        let e = (key & ID_MASK) as usize;
        let i = self.hpos[e];
        if i != ABSENT {
            let i = i as usize;
            let old = self.heap[i];
            self.heap[i] = key;
            if key < old {
                self.sift_up(i);
            } else {
                self.sift_down(i);
            }
        } else {
            self.heap.push(key);
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
            self.heap[i] = last;
            self.hpos[(last & ID_MASK) as usize] = i as u32;
            self.sift_up(i);
            let j = self.hpos[(last & ID_MASK) as usize] as usize;
            self.sift_down(j);
        }
    }

    /// The expert of lowest key that is not protected. A protected node's subtree may hold the
    /// answer, an unprotected node's subtree cannot beat it: the search visits the protected
    /// nodes (at most k_used - 1) and their children.
    #[inline(always)]
    fn min_unprotected(&mut self, prot: &[u64], stamp: u64) -> usize {
        let root = (self.heap[0] & ID_MASK) as usize;
        if prot[root] != stamp {
            return root;
        }
        let mut best = u64::MAX;
        self.stack.clear();
        self.stack.push(0);
        while let Some(i) = self.stack.pop() {
            let i = i as usize;
            let k = self.heap[i];
            if prot[(k & ID_MASK) as usize] == stamp {
                for c in [2 * i + 1, 2 * i + 2] {
                    if c < self.heap.len() {
                        self.stack.push(c as u32);
                    }
                }
            } else if k < best {
                best = k;
            }
        }
        debug_assert!(best != u64::MAX, "a full cache always holds an unprotected expert");
        (best & ID_MASK) as usize
    }
}

#[inline(always)]
fn pack(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

/// lfu: groups keyed by accesses since insertion, ordered by last access within a group. A hit
/// moves the expert to the end of the next group (created when missing), an insertion to the
/// end of group 1: O(1) per pick.
struct Lfu {
    g: Groups,
}

impl Evictor for Lfu {
    fn reset(&mut self) {
        self.g.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool) {
        let g = &mut self.g;
        if inserted {
            let first = g.first_group();
            let to = if first != g.sentinel && g.groups[first as usize].key == 1 {
                first
            } else {
                g.new_group_after(g.sentinel, 1, true)
            };
            g.push_back(to, e);
        } else {
            let from = g.items[e].group;
            let count = g.groups[from as usize].key + 1;
            let next = g.groups[from as usize].next;
            let to = if next != g.sentinel && g.groups[next as usize].key == count {
                next
            } else {
                g.new_group_after(from, count, true)
            };
            g.move_to(e, to);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.g.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        // lfu groups are never unsorted: every append is the latest access.
        self.g.first_unprotected(prot, stamp, &[])
    }
}

/// Sentinel "never chosen again".
const NEVER: usize = usize::MAX;

/// Bits of a belady key below the next-use part: the expert id (ids are u16).
const ID_BITS: u32 = 16;

/// belady: key ((2^48 − 1 − next use) << 16 | expert id), 0 in the high part for never-again:
/// never-again first, then farthest, ties to the lowest id. A next use is a token index, below
/// 2^47 for any trace that fits in an address space (its ids alone take 2·m bytes per token).
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
        debug_assert!((p.tokens as u64) < (1 << 47), "next-use keys hold 48 bits");
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
        let hi = if next == NEVER { 0 } else { ((1u64 << 48) - 1) - next as u64 };
        self.heap.set((hi << ID_BITS) | e as u64);
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

/// near_pick: groups keyed by near = 1 + the last token at which the expert stood in F at rank
/// < N (0 = never), ordered by last access within a group. After token t every cached expert
/// of F's first N moves to the new last group t + 1, in F order; that group is sorted by last
/// access only if a victim search reaches it (most of its experts have left it by then).
struct NearPick {
    g: Groups,
    near: Vec<u64>,
    last: Vec<u64>,
    n: usize,
}

impl Evictor for NearPick {
    fn f_needed(&self) -> usize {
        self.n
    }
    fn reset(&mut self) {
        self.g.clear();
        self.near.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, inserted: bool) {
        self.last[e] = now;
        if inserted {
            let to = self.g.group_with_key(self.near[e]);
            self.g.push_back(to, e);
        } else {
            self.g.touch(e);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize) {
        self.g.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache, prot: &[u64], stamp: u64) -> usize {
        self.g.first_unprotected(prot, stamp, &self.last)
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        let key = t as u64 + 1;
        let mut to = NIL;
        for &e in f.iter().take(self.n) {
            let e = usize::from(e);
            self.near[e] = key;
            if self.g.contains(e) {
                if to == NIL {
                    let last = self.g.last_group();
                    to = self.g.new_group_after(last, key, false);
                }
                self.g.move_to(e, to);
            }
        }
    }
}

/// s <- d*s for every expert, in chunks the compiler vectorizes (each product rounded alone:
/// the same values as the reference's scalar loop).
#[inline(always)]
fn decay_all(s: &mut [f64], d: f64) {
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        for x in c {
            *x *= d;
        }
    }
    for x in chunks.into_remainder() {
        *x *= d;
    }
}

struct NearPickEma {
    s: Vec<f64>,
    last: Vec<u64>,
    n: usize,
    decay: f64,
}

impl Evictor for NearPickEma {
    const BATCH: bool = true;
    const SLOTS: bool = true;
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
    fn victims(&mut self, cache: &Cache, prot: &[u64], stamp: u64, q: usize, out: &mut Vec<u128>) {
        let (s, last) = (&self.s, &self.last);
        scan_lowest(cache, prot, stamp, q, out, |e| s[e].to_bits(), |e| last[e]);
    }
    #[inline(always)]
    fn end_token(&mut self, _t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        // s <- d*s + x, eagerly: d*s for every expert, then + 1 where x = 1 (adding 0 elsewhere
        // is exact, so this equals the reference's d*s + x bit for bit).
        decay_all(&mut self.s, self.decay);
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
    memo: ExpMemo,
}

/// A direct-mapped memo of `f64::exp`: exact (the same function on the same argument), and a
/// saving when router scores are quantized (bf16 logits, rounded probabilities), so that the
/// same differences z − max recur. A miss costs one hash and one store on top of the `exp`.
struct ExpMemo {
    /// Argument bits per entry; a NaN pattern (never an argument: scores are finite) when empty.
    keys: Vec<u64>,
    vals: Vec<f64>,
}

const MEMO_BITS: u32 = 10;

impl ExpMemo {
    fn new() -> ExpMemo {
        ExpMemo { keys: vec![u64::MAX; 1 << MEMO_BITS], vals: vec![0.0; 1 << MEMO_BITS] }
    }

    #[inline(always)]
    fn exp(&mut self, x: f64) -> f64 {
        let bits = x.to_bits();
        let i = ((bits ^ (bits >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO_BITS)) as usize;
        if self.keys[i] == bits {
            return self.vals[i];
        }
        let v = x.exp();
        self.keys[i] = bits;
        self.vals[i] = v;
        v
    }
}

impl Evictor for InvRouter {
    const BATCH: bool = true;
    const SLOTS: bool = true;
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
    fn victims(&mut self, cache: &Cache, prot: &[u64], stamp: u64, q: usize, out: &mut Vec<u128>) {
        let (s, last) = (&self.s, &self.last);
        scan_lowest(cache, prot, stamp, q, out, |e| s[e].to_bits(), |e| last[e]);
    }
    #[inline(always)]
    fn end_token(&mut self, _t: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        decay_all(&mut self.s, self.decay);
        // validate() guarantees scores for inv_router; without them there is nothing to credit.
        let Some(z) = scores else { return };
        // Scores are non-increasing along a row, so z[0] is the maximum.
        let max = f64::from(z[0]);
        let mut sum = 0.0;
        for (x, &zi) in self.exps.iter_mut().zip(z) {
            *x = self.memo.exp(f64::from(zi) - max);
            sum += *x;
        }
        for x in &mut self.exps {
            *x /= sum;
        }
        for (&e, &x) in row.iter().zip(&self.exps) {
            self.s[usize::from(e)] += x;
        }
    }
}

/// The token loop of one layer (SEMANTICS.md §5 steps 1-5).
#[inline(never)]
fn run<P: Evictor>(p: &Params<'_>, inp: &LayerInput<'_>, mut pol: P) -> LayerCounts {
    let (m, k, cap) = (p.m, p.k_used, p.cap);
    let mut cache = Cache::new(p.num_experts, cap, P::SLOTS);
    // prot[e] == t + 1: e is chosen for token t (k-way protection); never written in sequential.
    let mut prot = vec![0u64; p.num_experts];
    // With a full keep set F is the row itself; otherwise F (expert, position in the row) is
    // built up to f_limit long.
    let keep_all = inp.keep.iter().all(|&kept| kept);
    let mut f_ids: Vec<u16> = Vec::with_capacity(m);
    let mut f_pos: Vec<u32> = Vec::with_capacity(m);
    // λ > 0: chosen (expert, position in the row) in processing order, and the merge's queue.
    let mut chosen_buf: Vec<(u16, u32)> = Vec::with_capacity(k);
    let mut chosen_ids: Vec<u16> = Vec::with_capacity(k);
    let mut pending: Vec<u32> = Vec::with_capacity(m);
    let mut victims: Vec<u128> = Vec::with_capacity(k);
    let cache_aware = p.lambda > 0.0;
    let batch = P::BATCH && !p.sequential;
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

        // Step 1: F and n; pruned slots (of the row's first k_used ids, the ones not kept).
        let (f, n, pruned): (&[u16], usize, usize) = if keep_all {
            (&row[..f_limit], k, 0)
        } else {
            f_ids.clear();
            f_pos.clear();
            for (i, &e) in row.iter().enumerate() {
                if inp.keep[usize::from(e)] {
                    f_ids.push(e);
                    f_pos.push(i as u32);
                    if f_ids.len() == f_limit {
                        break;
                    }
                }
            }
            let pruned = row[..k].iter().filter(|&&e| !inp.keep[usize::from(e)]).count();
            (&f_ids, k.min(f_ids.len()), pruned)
        };

        // Step 2: selection; substituted = chosen experts outside the row's first k_used.
        let (chosen, substituted): (&[u16], usize) = match row_scores {
            Some(z) if cache_aware => {
                chosen_buf.clear();
                if keep_all {
                    select_cache_aware(f, |r| r, z, n, p, &cache, &mut pending, &mut chosen_buf);
                } else {
                    select_cache_aware(f, |r| f_pos[r] as usize, z, n, p, &cache, &mut pending, &mut chosen_buf);
                }
                chosen_ids.clear();
                chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
            }
            // F's first n: the kept ids among the row's first k_used (k_used − pruned of them)
            // come first, the rest lie beyond.
            _ => (&f[..n], n - (k - pruned)),
        };

        // Step 3: counts from token W on.
        let counted = t >= p.warmup;
        if counted {
            let forced = (k - n) as u64;
            c.picks += k as u64;
            c.misses += forced;
            c.forced_misses += forced;
            c.substituted += substituted as u64;
            c.pruned_slots += pruned as u64;
        }

        // Step 4: residency.
        let stamp = t as u64 + 1;
        if !p.sequential {
            for &e in chosen {
                prot[usize::from(e)] = stamp;
            }
        }
        if batch {
            // The token's misses evict the q lowest unprotected keys, which the token's own
            // accesses do not change (only chosen, protected experts are touched).
            let missing = chosen.iter().filter(|&&e| !cache.contains(usize::from(e))).count();
            let q = (cache.len + missing).saturating_sub(cap);
            if q > 0 {
                pol.victims(&cache, &prot, stamp, q, &mut victims);
                for &key in &victims {
                    let v = (key & 0xFFFF) as usize;
                    cache.remove(v);
                    pol.evicted(v);
                }
            }
        }
        for (i, &e) in chosen.iter().enumerate() {
            let e = usize::from(e);
            now += 1;
            if cache.contains(e) {
                c.hits += u64::from(counted);
                pol.access(e, now, t, i, false);
            } else {
                c.misses += u64::from(counted);
                if cache.len >= cap {
                    let v = pol.victim(&cache, &prot, stamp);
                    cache.remove(v);
                    pol.evicted(v);
                }
                cache.insert(e);
                pol.access(e, now, t, i, true);
            }
        }

        // Step 5: credits.
        pol.end_token(t, f, row, row_scores);
    }
    c
}

/// Step 2 for λ > 0: the first n of F by (score desc, rank asc), where candidates of rank < j
/// or already cached get z + λ·δ. F's scores are non-increasing, so one pass in rank order
/// suffices: a plain candidate waits in `pending` until a boosted one scores strictly above it
/// (a later plain candidate never scores above a boosted one, λ·δ >= 0), and the pass stops as
/// soon as n are chosen. `pos(r)` is the row position of F's rank r.
#[expect(clippy::too_many_arguments, reason = "an inlined helper of the token loop")]
#[inline(always)]
fn select_cache_aware(
    f: &[u16],
    pos: impl Fn(usize) -> usize,
    z_row: &[f32],
    n: usize,
    p: &Params<'_>,
    cache: &Cache,
    pending: &mut Vec<u32>,
    chosen: &mut Vec<(u16, u32)>,
) {
    if n == 0 {
        return;
    }
    let z = |r: usize| f64::from(z_row[pos(r)]);
    let delta = if n <= 1 { 0.0 } else { z(0) - z(n - 1) };
    let bonus = p.lambda * delta;
    pending.clear();
    let mut head = 0;
    for (r, &e) in f.iter().enumerate() {
        if r < p.j || cache.contains(usize::from(e)) {
            let s = z(r) + bonus;
            while head < pending.len() && chosen.len() < n {
                let b = pending[head] as usize;
                if z(b) < s {
                    break;
                }
                chosen.push((f[b], pos(b) as u32));
                head += 1;
            }
            if chosen.len() == n {
                return;
            }
            chosen.push((e, pos(r) as u32));
            if chosen.len() == n {
                return;
            }
        } else {
            pending.push(r as u32);
        }
    }
    while chosen.len() < n && head < pending.len() {
        let b = pending[head] as usize;
        chosen.push((f[b], pos(b) as u32));
        head += 1;
    }
}
