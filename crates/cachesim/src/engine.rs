//! The fast replay core: one layer at a time, generic over the eviction policy (monomorphized),
//! all state allocated before the token loop, no `Result`, no dynamic dispatch inside it.
//!
//! Token loop: with a full keep set F is the row itself (no copy); with a pruned one F is built
//! along the row without a branch on the keep mask, or read from an [`FTable`] built once for
//! the configurations that share the keep set. At λ = 0 the chosen experts are F's prefix
//! and the counts of step 3 need no per-slot work; at λ > 0 F is read only up to the cut past
//! which no candidate can be chosen (its score plus the bonus below z(F[n−1])), and one pass
//! over it merges the boosted and the plain candidates and stops once n are chosen. The
//! per-token helpers run out of line (inlined into the token loop, their pointers were spilled
//! and reloaded for every candidate).
//!
//! Cache: a position index per expert (O(1) lookup, insert, remove). For the policies that scan
//! the cached experts, every expert sits in one array, cached ones first and pruned ones last,
//! with the policy's first key beside it (its only copy), so scans read contiguous keys that
//! vector compares filter 16 or 32 at a time.
//! In k-way mode the victims of a token can be chosen all at once before its accesses (`BATCH`):
//! the keys of unchosen experts do not change within a token and chosen ones are protected, so
//! the token's q misses evict exactly the q lowest unprotected keys. Sequential mode selects one
//! victim per miss. Priority structures, per policy:
//! - `lru`, `fifo`: an intrusive doubly-linked list in priority order; a victim is found by
//!   walking from the oldest end past at most `k_used - 1` protected experts. A hit and a miss
//!   take one branch-free path (`Evictor::step`): the hit branch was mispredicted about every
//!   other pick.
//! - `lfu`: [`Groups`], a list of groups of equal access count in increasing order, each an
//!   intrusive list ordered by last access; O(1) per pick.
//! - `near_pick`, `belady`: the first key is a token index (the last near pick; the next use),
//!   so the cached experts are also counted per value ([`ValueCounts`]), updated without
//!   branches; a walk over the values in use finds the bound of the q victims and one vector
//!   pass over the cached keys collects them ([`pick_counted`]).
//! - `near_pick_ema`, `inv_router` (every score decays every token): a token's victims come from
//!   a copy of the cached scores, one round per victim over chunk minimums ([`Selector`]).
//!   Decays are eager (the same arithmetic, in the same order, as the reference) over the
//!   contiguous scores of the kept experts, so both replayers compare identical f64 values: a
//!   lazy multiplier would round differently and could flip near-ties, which the counts must
//!   not.
//!
//! Those scores do not depend on the cache, so configurations of the same layer that differ only
//! in cap, λ, j, k_used or warmup can share them ([`TrackedScores`], used by
//! `cachesim::replay_many`): the track computes every expert's score once per token, a block of
//! tokens at a time, and each configuration ([`TrackedRun`]: the same token loop, resumed block
//! after block, with its state moved in and out) gathers its cached experts' scores from the
//! track's rows into its [`Selector`] instead of decaying and crediting
//! every kept expert itself.

use trace_io::Shape;
use wide::{f64x8, u32x8};

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

/// One layer's slices: ids and scores `[T, m]`, keep mask `[E]`, and optionally the softmax of
/// every row ([`softmax_layer`], `[T, m]`) for `inv_router`.
pub(crate) struct LayerInput<'a> {
    pub ids: &'a [u16],
    pub scores: Option<&'a [f32]>,
    pub keep: &'a [bool],
    pub probs: Option<&'a [f64]>,
    /// F of every row for the pruned keep set `keep` ([`FTable`]), if built.
    pub f_table: Option<&'a FTable>,
}

/// F of every row of one layer under one pruned keep set (SEMANTICS.md §5 step 1: the row's
/// kept candidates, in order, with their row positions), built once and read by every
/// configuration that prunes the layer with that set, instead of each building F along every
/// row. Memory: 4 bytes per recorded candidate plus 4 per token (`[T, m]` ids and positions,
/// `[T]` lengths), e.g. 32 MiB for 131,072 tokens of 64 candidates.
///
/// A table is rebuilt in place ([`FTable::rebuild`]) so that its buffers serve one layer after
/// another: allocating and freeing 32 MiB per layer and keep set cost the sweep millions of page
/// faults (its system time fell from 9.3 s to 0.6 s, docs/performance.md "Seventh round").
#[derive(Default)]
pub(crate) struct FTable {
    m: usize,
    ids: Vec<u16>,
    /// Row positions (< m <= 65,536).
    pos: Vec<u16>,
    len: Vec<u32>,
}

impl FTable {
    /// F of every row of `ids` (`[T, m]`) under `keep` (`[E]`), in this table's buffers (grown
    /// when too small, never shrunk). Entries past a row's length are left as they were: they
    /// are never read.
    pub fn rebuild(&mut self, ids: &[u16], keep: &[bool], m: usize) -> &FTable {
        let tokens = ids.len() / m.max(1);
        self.m = m;
        for buf in [&mut self.ids, &mut self.pos] {
            if buf.len() < tokens * m {
                buf.resize(tokens * m, 0);
            }
        }
        self.len.resize(tokens, 0);
        for (t, row) in ids.chunks_exact(m).enumerate() {
            let (mut f_len, mut scanned) = (0, 0);
            let (f_ids, f_pos) = (&mut self.ids[t * m..(t + 1) * m], &mut self.pos[t * m..(t + 1) * m]);
            extend_f(row, keep, f_ids, f_pos, &mut f_len, &mut scanned, m, m);
            self.len[t] = f_len as u32;
        }
        self
    }

    /// F of row `t`: its expert ids and their row positions, `[|F|]` each.
    #[inline(always)]
    fn row(&self, t: usize) -> (&[u16], &[u16]) {
        let (start, len) = (t * self.m, self.len[t] as usize);
        (&self.ids[start..start + len], &self.pos[start..start + len])
    }
}

/// Replays one layer with the configured policy.
pub(crate) fn replay_layer(p: &Params<'_>, inp: &LayerInput<'_>) -> LayerCounts {
    let e = p.num_experts;
    match p.policy {
        Policy::Lru => run(p, inp, Lru(List::new(e))),
        Policy::Fifo => run(p, inp, Fifo(List::new(e))),
        Policy::Lfu => run(p, inp, Lfu { g: Groups::new(e, p.cap) }),
        Policy::Belady => run(p, inp, Belady::new(p, inp)),
        Policy::NearPick => run(p, inp, NearPick::new(p)),
        Policy::NearPickEma => run(p, inp, Decayed::new(p, EmaCredit { n: p.near_n })),
        Policy::InvRouter => {
            let credit = RouterCredit { exps: vec![0.0; p.m], memo: ExpMemo::new(), probs: inp.probs };
            run(p, inp, Decayed::new(p, credit))
        }
    }
}

const ABSENT: u32 = u32::MAX;

/// The cached experts of one layer. For the policies that scan the cache (`slots` true): every
/// expert in one array, the cached ones first (`order[..len]`), with the policy's first priority
/// key of each expert alongside (`keys`, in the same order), so that a scan reads two contiguous
/// arrays the compiler vectorizes and an insertion or eviction is one swap that carries the key
/// along. For the others (`K = ()`): membership and the count only.
struct Cache<K> {
    /// With slots: every expert, cached ones first, and the experts the keep set prunes (never
    /// cached) last, from `kept` on; `[E]`.
    order: Vec<u16>,
    /// With slots: `keys[i]` is the first key of `order[i]`; `[E]`.
    keys: Vec<K>,
    /// With slots: the entry of each expert in `order`; without: 0 when cached, `ABSENT` when
    /// not. Either way `pos[e] < len` exactly when `e` is cached.
    pos: Vec<u32>,
    len: usize,
    /// How many experts the keep set keeps.
    kept: usize,
    keep_slots: bool,
}

impl<K: Copy + Default> Cache<K> {
    /// An empty cache over the experts of `keep` (`[E]`, true: kept).
    fn new(keep: &[bool], keep_slots: bool) -> Cache<K> {
        let num_experts = keep.len();
        let kept = keep.iter().filter(|&&k| k).count();
        if keep_slots {
            let order: Vec<u16> = (0..num_experts)
                .filter(|&e| keep[e])
                .chain((0..num_experts).filter(|&e| !keep[e]))
                .map(|e| e as u16)
                .collect();
            let mut pos = vec![0; num_experts];
            for (i, &e) in order.iter().enumerate() {
                pos[usize::from(e)] = i as u32;
            }
            Cache { order, keys: vec![K::default(); num_experts], pos, len: 0, kept, keep_slots }
        } else {
            Cache { order: Vec::new(), keys: Vec::new(), pos: vec![ABSENT; num_experts], len: 0, kept, keep_slots }
        }
    }

    #[inline(always)]
    fn contains(&self, e: usize) -> bool {
        (self.pos[e] as usize) < self.len
    }

    /// Swaps entries `i` and `j` of `order` (with their keys).
    #[inline(always)]
    fn swap(&mut self, i: usize, j: usize) {
        self.order.swap(i, j);
        self.keys.swap(i, j);
        self.pos[usize::from(self.order[i])] = i as u32;
        self.pos[usize::from(self.order[j])] = j as u32;
    }

    /// Inserts expert `e` if `miss` (`e` is then not cached; its key comes along) and changes
    /// nothing otherwise, without a branch on `miss`.
    #[inline(always)]
    fn admit(&mut self, e: usize, miss: bool) {
        if self.keep_slots {
            let p = self.pos[e] as usize;
            // A swap of p with itself changes nothing.
            self.swap(p, pick_if(miss, self.len, p));
        } else {
            self.pos[e] = 0;
        }
        self.len += usize::from(miss);
    }

    /// Removes cached expert `e`; its key stays with it.
    #[inline(always)]
    fn remove(&mut self, e: usize) {
        self.len -= 1;
        if self.keep_slots {
            self.swap(self.pos[e] as usize, self.len);
        } else {
            self.pos[e] = ABSENT;
        }
    }

    /// The keys of the cached experts, in the order of `order[..len]`.
    #[inline(always)]
    fn live_keys(&self) -> &[K] {
        &self.keys[..self.len]
    }

    /// The key of expert `e` (cached or not).
    #[inline(always)]
    fn key(&self, e: usize) -> K {
        self.keys[self.pos[e] as usize]
    }

    /// The key of expert `e` (cached or not), to change.
    #[inline(always)]
    fn key_mut(&mut self, e: usize) -> &mut K {
        &mut self.keys[self.pos[e] as usize]
    }

    /// Empties the cache (keys stay with their experts).
    fn clear(&mut self) {
        if !self.keep_slots {
            self.pos.fill(ABSENT);
        }
        self.len = 0;
    }
}

/// One pick of step 4: expert `e`, the `i`-th chosen of token `t`, at pick time `now`.
#[derive(Clone, Copy)]
struct Pick {
    e: usize,
    now: u64,
    t: usize,
    i: usize,
}

/// What the token loop needs from a policy. `prot[e] == stamp` marks experts chosen for the
/// current token (never written in sequential mode, so nothing is protected there).
trait Evictor {
    /// The first priority key the cache keeps with each expert (`()` when the policy does not
    /// scan the cache).
    type Key: Copy + Default;
    /// k-way mode selects all of a token's victims at once with [`Evictor::victims`].
    const BATCH: bool = false;
    /// The policy keeps its first key in `Cache::keys` and scans the cached experts.
    const SLOTS: bool = false;
    /// How many leading candidates of F the credits read (F is built at least this long).
    fn f_needed(&self) -> usize {
        0
    }
    /// Forgets all state: the cache (still holding its experts) is about to be emptied at a
    /// sequence start.
    fn reset(&mut self, cache: &mut Cache<Self::Key>);
    /// Expert `e`, the `i`-th chosen of token `t`, was accessed at pick time `now`; `inserted`:
    /// it was just inserted.
    fn access(&mut self, e: usize, now: u64, t: usize, i: usize, inserted: bool, cache: &mut Cache<Self::Key>);
    /// Expert `e` was evicted (its key is still in `cache`).
    fn evicted(&mut self, _e: usize, _cache: &Cache<Self::Key>) {}
    /// Whether [`Evictor::step`] admits an expert without a branch on the hit (a self-swap on
    /// a hit): fewer mispredicted branches for the decayed policies, whose accesses are one
    /// store; more instructions and no fewer mispredictions for the others (callgrind).
    const ADMIT_WITHOUT_BRANCH: bool = false;
    /// Step 4 for one chosen expert: a hit, or a miss that evicts [`Evictor::victim`] when the
    /// cache holds `cap` and then inserts; returns whether it hit. lru and fifo override it with
    /// one path for both outcomes (a hit is as hard to predict as the hit rate is close to 1/2,
    /// and a mispredicted branch costs about as much as their whole update).
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, prot: &[u64], stamp: u64, cache: &mut Cache<Self::Key>) -> bool {
        let Pick { e, now, t, i } = pick;
        let hit = cache.contains(e);
        if hit && !Self::ADMIT_WITHOUT_BRANCH {
            self.access(e, now, t, i, false, cache);
            return true;
        }
        // Never true in k-way mode for the policies that evict a token's victims beforehand.
        if !hit & (cache.len >= cap) {
            let v = self.victim(cache, prot, stamp);
            cache.remove(v);
            self.evicted(v, cache);
        }
        cache.admit(e, !hit);
        self.access(e, now, t, i, !hit, cache);
        hit
    }
    /// The cached, unprotected expert of lowest priority (ties: lowest id). The cache is full.
    fn victim(&mut self, cache: &Cache<Self::Key>, prot: &[u64], stamp: u64) -> usize;
    /// With `BATCH`: the `q` cached, unprotected experts of lowest priority, into `out`, each
    /// as a key whose low 16 bits are the expert id; `chosen` are the token's chosen experts
    /// (the protected ones are those of them that are cached); `track`, for a policy whose
    /// scores a [`TrackedScores`] computes, every expert's score before the token (`[E]`).
    #[expect(clippy::too_many_arguments, reason = "the token loop's state, passed apart")]
    fn victims(
        &mut self,
        _cache: &Cache<Self::Key>,
        _prot: &[u64],
        _stamp: u64,
        _q: usize,
        _chosen: &[u16],
        _track: Option<&[f64]>,
        _out: &mut Vec<u128>,
    ) {
    }
    /// Credits after token `t`: `f` is a prefix (at least `f_needed` long, or all) of F.
    fn end_token(
        &mut self,
        _t: usize,
        _f: &[u16],
        _row: &[u16],
        _scores: Option<&[f32]>,
        _cache: &mut Cache<Self::Key>,
    ) {
    }
}

/// Slots per chunk of [`Selector`]: two vectors of eight.
const CHUNK: usize = 16;

/// A chunk as two vectors.
#[inline(always)]
fn halves(c: &[f64; CHUNK]) -> (f64x8, f64x8) {
    (
        f64x8::from(std::array::from_fn::<f64, 8, _>(|i| c[i])),
        f64x8::from(std::array::from_fn::<f64, 8, _>(|i| c[i + 8])),
    )
}

/// The smaller of `a` and `b` (`b` when equal), written so that it compiles to `minsd`.
#[inline(always)]
fn min_of(a: f64, b: f64) -> f64 {
    if a < b { a } else { b }
}

/// The smallest lane.
#[inline(always)]
fn lane_min(v: f64x8) -> f64 {
    let a = v.to_array();
    let m = [min_of(a[0], a[4]), min_of(a[1], a[5]), min_of(a[2], a[6]), min_of(a[3], a[7])];
    min_of(min_of(m[0], m[2]), min_of(m[1], m[3]))
}

/// The minimum of a chunk (scores are never NaN, so `fast_min`, a plain `minpd`, is exact).
#[inline(always)]
fn chunk_min(c: &[f64; CHUNK]) -> f64 {
    let (a, b) = halves(c);
    lane_min(a.fast_min(b))
}

/// Bit i: `c[i] == v`.
#[inline(always)]
fn mask_eq(c: &[f64; CHUNK], v: f64) -> u32 {
    let (a, b) = halves(c);
    let v = f64x8::splat(v);
    a.simd_eq(v).to_bitmask() | (b.simd_eq(v).to_bitmask() << 8)
}

/// Victim selection of [`Decayed`]: the `q` unprotected cached experts of lowest
/// `(score, last access, id)`, found in `q` rounds over a scratch copy of the cached scores
/// (slot order; protected ones and the padding to whole chunks set to +∞) and the minimum of each
/// chunk of 16: a round takes the lowest chunk minimum, finds its chunk by comparing the
/// minimums with it and its slot by comparing the chunk, sets the slot to +∞ and recomputes that
/// chunk's minimum. Equal scores (a tie, in one chunk or several) go to the lowest
/// `(last access, id)` on a slower path. Only the tie test depends on
/// how the scores compare; the threshold scan this replaces took about 19 mispredicted branches
/// per token (callgrind) in its offers. Chunks and minimums are stored whole (vector stores),
/// so that the next round's vector loads are forwarded from them.
struct Selector {
    /// `[cached rounded up to CHUNK, + 1]`: the last entry takes the writes for protected experts
    /// that are not cached.
    vals: Vec<f64>,
    /// The minimum of each chunk of `vals`, eight chunks per vector, padded with +∞.
    mins: Vec<f64x8>,
}

/// Lane numbers, to build one-lane masks.
const LANES: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];

impl Selector {
    /// A selector for up to `slots` cached experts, its buffers allocated once.
    fn new(slots: usize) -> Selector {
        let chunks = slots.div_ceil(CHUNK);
        Selector { vals: Vec::with_capacity(chunks * CHUNK + 1), mins: Vec::with_capacity(chunks.div_ceil(8)) }
    }

    /// Starts a selection: `vals` is cleared; the caller pushes the cached experts' scores in
    /// slot order, then calls [`Selector::select`].
    #[inline(always)]
    fn start(&mut self) -> &mut Vec<f64> {
        self.vals.clear();
        &mut self.vals
    }

    /// The `q` lowest `(score, last, id)` among the scores pushed since [`Selector::start`]
    /// (`order[i]` is slot i's expert, `pos` the slot of each expert), leaving out the cached
    /// experts among `protect`, into `out` in increasing order, each as the key
    /// `score.to_bits() << 64 | last << 16 | id`. Scores are finite and >= 0; at least `q`
    /// cached experts are not protected.
    #[inline(never)]
    fn select(&mut self, order: &[u16], pos: &[u32], protect: &[u16], last: &[u64], q: usize, out: &mut Vec<u128>) {
        let len = self.vals.len();
        let chunks = len.div_ceil(CHUNK);
        let dump = chunks * CHUNK;
        self.vals.resize(dump + 1, f64::INFINITY);
        for &e in protect {
            let p = pos[usize::from(e)] as usize;
            self.vals[pick_if(p < len, p, dump)] = f64::INFINITY;
        }
        let (vals, _) = self.vals.as_chunks_mut::<CHUNK>();
        self.mins.clear();
        for group in vals.chunks(8) {
            let mut m = [f64::INFINITY; 8];
            for (m, c) in m.iter_mut().zip(group) {
                *m = chunk_min(c);
            }
            self.mins.push(f64x8::from(m));
        }
        let lanes = f64x8::from(LANES);
        out.clear();
        for _ in 0..q {
            let low = self.mins.iter().fold(f64x8::splat(f64::INFINITY), |m, &g| m.fast_min(g));
            let v = lane_min(low);
            debug_assert!(v < f64::INFINITY, "fewer than q unprotected cached experts");
            let sv = f64x8::splat(v);
            // The first chunk whose minimum is v, and how many are.
            let (mut first, mut holders) = (usize::MAX, 0);
            for (i, &g) in self.mins.iter().enumerate() {
                let m = g.simd_eq(sv).to_bitmask();
                holders += m.count_ones();
                first = pick_if(first == usize::MAX && m != 0, i * 8 + m.trailing_zeros() as usize, first);
            }
            let (a, b) = halves(&vals[first]);
            let (ea, eb) = (a.simd_eq(sv), b.simd_eq(sv));
            let mask = ea.to_bitmask() | (eb.to_bitmask() << 8);
            let unique = holders == 1 && mask.is_power_of_two();
            let slot = if unique {
                first * CHUNK + mask.trailing_zeros() as usize
            } else {
                lowest_tie(vals, &self.mins, v, order, last)
            };
            let e = usize::from(order[slot]);
            out.push(pack(v.to_bits(), (last[e] << 16) | e as u64));
            let c = slot / CHUNK;
            let (a, b) = if unique {
                // The one lane equal to v becomes +∞.
                let inf = f64x8::splat(f64::INFINITY);
                (ea.bitselect(inf, a), eb.bitselect(inf, b))
            } else {
                vals[c][slot % CHUNK] = f64::INFINITY;
                halves(&vals[c])
            };
            let (lo, hi) = vals[c].split_at_mut(CHUNK / 2);
            lo.copy_from_slice(&a.to_array());
            hi.copy_from_slice(&b.to_array());
            let g = &mut self.mins[c / 8];
            *g = lanes.simd_eq(f64x8::splat((c % 8) as f64)).bitselect(f64x8::splat(lane_min(a.fast_min(b))), *g);
        }
    }
}

/// The slot of lowest `(last, id)` among those whose score is `v` (several: a tie).
#[cold]
#[inline(never)]
fn lowest_tie(vals: &[[f64; CHUNK]], mins: &[f64x8], v: f64, order: &[u16], last: &[u64]) -> usize {
    let mut best = (u64::MAX, 0);
    for (c, chunk) in vals.iter().enumerate() {
        if mins[c / 8].to_array()[c % 8] != v {
            continue;
        }
        let mut mask = mask_eq(chunk, v);
        while mask != 0 {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let slot = c * CHUNK + b;
            let e = usize::from(order[slot]);
            let key = (last[e] << 16) | e as u64;
            if key < best.0 {
                best = (key, slot);
            }
        }
    }
    debug_assert!(best.0 != u64::MAX, "a tie has at least one slot");
    best.1
}

/// Intrusive doubly-linked list over expert ids with a sentinel at index E; front = oldest.
/// Index E + 1 is a spare entry, linked to itself whenever it is not in the list: unlinking it
/// changes nothing, so the branch-free steps of lru and fifo unlink it (and fifo appends it)
/// when they have nothing else to change.
struct List {
    prev: Vec<u32>,
    next: Vec<u32>,
    sentinel: usize,
    spare: usize,
}

impl List {
    fn new(num_experts: usize) -> List {
        let (s, spare) = (num_experts as u32, num_experts as u32 + 1);
        let mut prev = vec![s; num_experts + 2];
        let mut next = vec![s; num_experts + 2];
        (prev[num_experts + 1], next[num_experts + 1]) = (spare, spare);
        List { prev, next, sentinel: num_experts, spare: num_experts + 1 }
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

    /// The oldest unprotected entry, or the sentinel if there is none. Entries in the list are
    /// distinct experts, so unique insertion/access times: no ties to break.
    #[inline(always)]
    fn first_unprotected(&self, prot: &[u64], stamp: u64) -> usize {
        let mut x = self.next[self.sentinel] as usize;
        while x != self.sentinel && prot[x] == stamp {
            x = self.next[x] as usize;
        }
        x
    }

    fn clear(&mut self) {
        let s = self.sentinel;
        self.prev[s] = s as u32;
        self.next[s] = s as u32;
    }

    /// The victim of a full cache: its oldest unprotected entry.
    #[inline(always)]
    fn victim(&self, prot: &[u64], stamp: u64) -> usize {
        let v = self.first_unprotected(prot, stamp);
        debug_assert!(v != self.sentinel, "a full cache always holds an unprotected expert");
        v
    }

    /// The branch-free step 4 of lru and fifo for expert `e`: `relink(list, hit, evict, v)`
    /// updates the list, with `v` the oldest unprotected entry (a real expert whenever `evict`:
    /// a full cache holds an unprotected one); then the victim leaves the cache (on an
    /// eviction) and `e` is in it. Returns whether `e` hit.
    #[inline(always)]
    fn step(
        &mut self,
        e: usize,
        cap: usize,
        prot: &[u64],
        stamp: u64,
        cache: &mut Cache<()>,
        relink: impl FnOnce(&mut List, bool, bool, usize),
    ) -> bool {
        let hit = cache.contains(e);
        let full = cache.len >= cap;
        let evict = !hit & full;
        let v = self.first_unprotected(prot, stamp);
        relink(self, hit, evict, v);
        cache.pos[pick_if(evict, v, e)] = ABSENT;
        cache.pos[e] = 0;
        cache.len += usize::from(!hit & !full);
        hit
    }
}

/// `a` if `c`, else `b`, without a branch (`c` is a hit or an eviction: unpredictable).
#[inline(always)]
fn pick_if(c: bool, a: usize, b: usize) -> usize {
    std::hint::select_unpredictable(c, a, b)
}

struct Lru(List);

impl Evictor for Lru {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool, _cache: &mut Cache<()>) {
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
    fn victim(&mut self, _cache: &Cache<()>, prot: &[u64], stamp: u64) -> usize {
        self.0.victim(prot, stamp)
    }
    /// Hit and miss on one path: the entry that leaves its place in the list is `e` on a hit
    /// (it moves to the back), the victim on a miss into a full cache, and the spare on a miss
    /// into a cache with room; then `e` goes to the back.
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, prot: &[u64], stamp: u64, cache: &mut Cache<()>) -> bool {
        let e = pick.e;
        self.0.step(e, cap, prot, stamp, cache, |l, hit, evict, v| {
            l.unlink(pick_if(hit, e, pick_if(evict, v, l.spare)));
            l.push_back(e);
        })
    }
}

struct Fifo(List);

impl Evictor for Fifo {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.0.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool, _cache: &mut Cache<()>) {
        if inserted {
            self.0.push_back(e);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, _cache: &Cache<()>) {
        self.0.unlink(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache<()>, prot: &[u64], stamp: u64) -> usize {
        self.0.victim(prot, stamp)
    }
    /// Hit and miss on one path: the victim (on a miss into a full cache) or the spare leaves
    /// the list, and `e` is appended on a miss; on a hit the append writes back the links it
    /// found and links the spare to itself.
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, prot: &[u64], stamp: u64, cache: &mut Cache<()>) -> bool {
        let e = pick.e;
        self.0.step(e, cap, prot, stamp, cache, |l, hit, evict, v| {
            l.unlink(pick_if(evict, v, l.spare));
            let s = l.sentinel;
            let tail = l.prev[s] as usize;
            let new = pick_if(hit, l.spare, e);
            l.next[tail] = pick_if(hit, s, e) as u32;
            l.prev[new] = pick_if(hit, l.spare, tail) as u32;
            l.next[new] = pick_if(hit, l.spare, s) as u32;
            l.prev[s] = pick_if(hit, tail, e) as u32;
        })
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

/// A group node: key, first and last expert, neighbours in the group list.
#[derive(Clone, Copy)]
struct Group {
    key: u64,
    head: u32,
    tail: u32,
    prev: u32,
    next: u32,
}

/// Cached experts ordered by (group key, last access): a doubly-linked list of groups in
/// increasing key order (sentinel `sentinel`), each holding an intrusive doubly-linked list of
/// its experts, oldest access first (appending the latest access keeps it ordered). Group
/// nodes come from a fixed pool (at most one per cached expert, plus one transiently), so
/// nothing allocates after construction.
struct Groups {
    items: Vec<Item>,
    groups: Vec<Group>,
    free: Vec<u32>,
    sentinel: u32,
}

impl Groups {
    fn new(num_experts: usize, cap: usize) -> Groups {
        let pool = cap.min(num_experts) + 2;
        let s = pool as u32;
        let mut g = Groups {
            items: vec![Item { prev: NIL, next: NIL, group: NIL }; num_experts],
            groups: vec![Group { key: 0, head: NIL, tail: NIL, prev: s, next: s }; pool + 1],
            free: Vec::with_capacity(pool),
            sentinel: s,
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
    fn first_group(&self) -> u32 {
        self.groups[self.sentinel as usize].next
    }

    /// A new, empty group with `key`, linked after group `after` (the sentinel: at the front).
    #[inline(always)]
    fn new_group_after(&mut self, after: u32, key: u64) -> u32 {
        let g = self.free.pop().expect("the pool holds a group per cached expert plus one");
        let n = self.groups[after as usize].next;
        self.groups[g as usize] = Group { key, head: NIL, tail: NIL, prev: after, next: n };
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

    /// The first unprotected expert in (key, last access) order. Some cached expert is
    /// unprotected.
    #[inline(always)]
    fn first_unprotected(&self, prot: &[u64], stamp: u64) -> usize {
        let mut g = self.first_group();
        while g != self.sentinel {
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
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {
        self.g.clear();
    }
    #[inline(always)]
    fn access(&mut self, e: usize, _now: u64, _t: usize, _i: usize, inserted: bool, _cache: &mut Cache<()>) {
        let g = &mut self.g;
        if inserted {
            let first = g.first_group();
            let to = if first != g.sentinel && g.groups[first as usize].key == 1 {
                first
            } else {
                g.new_group_after(g.sentinel, 1)
            };
            g.push_back(to, e);
        } else {
            let from = g.items[e].group;
            let count = g.groups[from as usize].key + 1;
            let next = g.groups[from as usize].next;
            let to = if next != g.sentinel && g.groups[next as usize].key == count {
                next
            } else {
                g.new_group_after(from, count)
            };
            g.move_to(e, to);
        }
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, _cache: &Cache<()>) {
        self.g.remove(e);
    }
    #[inline(always)]
    fn victim(&mut self, _cache: &Cache<()>, prot: &[u64], stamp: u64) -> usize {
        self.g.first_unprotected(prot, stamp)
    }
}

/// Cached experts counted per integer key value (a near token, a next-use token) in `0..values`,
/// with a two-level bitmap of the values in use. Updates do not branch: a bit stays set when its
/// count drops to 0, and the walks clear the ones they pass.
struct ValueCounts {
    count: Vec<u32>,
    /// Bit v: count[v] may be > 0 (every positive count has its bit set).
    bits: Vec<u64>,
    /// Bit w: bits[w] may be != 0.
    summary: Vec<u64>,
}

impl ValueCounts {
    fn new(values: usize) -> ValueCounts {
        let words = values.div_ceil(64);
        ValueCounts { count: vec![0; values], bits: vec![0; words], summary: vec![0; words.div_ceil(64)] }
    }

    #[inline(always)]
    fn add(&mut self, v: usize, c: u32) {
        self.count[v] += c;
        let w = v >> 6;
        self.bits[w] |= u64::from(c != 0) << (v & 63);
        self.summary[w >> 6] |= u64::from(c != 0) << (w & 63);
    }

    #[inline(always)]
    fn sub(&mut self, v: usize, c: u32) {
        self.count[v] -= c;
    }

    /// Empties every count, given the values of all counted experts.
    fn clear(&mut self, values: impl Iterator<Item = usize>) {
        for v in values {
            self.count[v] = 0;
            self.bits[v >> 6] = 0;
            self.summary[v >> 12] = 0;
        }
    }

    /// The count of value v, clearing v's stale bits when it is 0.
    #[inline(always)]
    fn visit(&mut self, v: usize) -> usize {
        let c = self.count[v] as usize;
        if c == 0 {
            let w = v >> 6;
            self.bits[w] &= !(1 << (v & 63));
            if self.bits[w] == 0 {
                self.summary[w >> 6] &= !(1 << (w & 63));
            }
        }
        c
    }

    /// With `FROM_HIGH` false: the smallest v with at least `need` counted at or below it; with
    /// `FROM_HIGH` true: the largest v with at least `need` counted at or above it. When fewer
    /// are counted, the last value in use the walk reached.
    #[inline(always)]
    fn bound<const FROM_HIGH: bool>(&mut self, need: usize) -> usize {
        let (mut seen, mut last) = (0, 0);
        let words = self.summary.len();
        for i in 0..words {
            let sw = if FROM_HIGH { words - 1 - i } else { i };
            let mut sword = self.summary[sw];
            while sword != 0 {
                let w = sw * 64 + take_bit::<FROM_HIGH>(&mut sword);
                let mut word = self.bits[w];
                while word != 0 {
                    let v = w * 64 + take_bit::<FROM_HIGH>(&mut word);
                    let c = self.visit(v);
                    if c > 0 {
                        seen += c;
                        last = v;
                        if seen >= need {
                            return v;
                        }
                    }
                }
            }
        }
        last
    }
}

/// Clears and returns the position of the lowest set bit of `word` (the highest with
/// `HIGHEST`); `word` is not 0.
#[inline(always)]
fn take_bit<const HIGHEST: bool>(word: &mut u64) -> usize {
    let b = if HIGHEST { 63 - word.leading_zeros() as usize } else { word.trailing_zeros() as usize };
    *word &= !(1 << b);
    b
}

/// Bit i: `keys[i]` is at or past `bound` (`>=` with `FROM_HIGH`, else `<=`), eight keys per
/// vector compare.
#[inline(always)]
fn mask_past<const FROM_HIGH: bool>(keys: &[u32; 32], bound: u32) -> u32 {
    let b = u32x8::splat(bound);
    let mut m = 0;
    for (i, c) in keys.as_chunks::<8>().0.iter().enumerate() {
        let k = u32x8::from(*c);
        // Past the bound: not strictly on the near side of it.
        let near_side = if FROM_HIGH { b.simd_gt(k) } else { k.simd_gt(b) };
        m |= (!near_side.to_bitmask() & 0xFF) << (8 * i);
    }
    m
}

/// Victim selection of the policies whose first key is an integer value counted in
/// [`ValueCounts`] and kept in `Cache::keys`: with a bound from a walk that covers the `q`
/// victims, the unprotected experts strictly past the bound (below it, or above it with
/// `FROM_HIGH`) are all victims (fewer than `q`), and the rest are the lowest `tie(e)` keys
/// (unique, the id in the low 16 bits) of those at the bound, taken by repeated minimum. One
/// pass over the cached keys, 32 at a time (four compares of eight with the bound); only the experts
/// at or past it (about as many as there are victims) are looked at further. `below`,
/// `at_buf`: buffers of length > cached count.
#[expect(clippy::too_many_arguments, reason = "a helper of two policies")]
#[inline(never)]
fn pick_counted<const FROM_HIGH: bool>(
    cache: &Cache<u32>,
    prot: &[u64],
    stamp: u64,
    q: usize,
    bound: u32,
    below: &mut [u16],
    at_buf: &mut [u64],
    out: &mut Vec<u128>,
    tie: impl Fn(usize) -> u64,
) {
    let (mut nb, mut na) = (0, 0);
    let keys = cache.live_keys();
    let mut take = |i: usize| {
        let e = cache.order[i];
        let eu = usize::from(e);
        if prot[eu] != stamp {
            let at = keys[i] == bound;
            below[nb] = e;
            nb += usize::from(!at);
            at_buf[na] = tie(eu);
            na += usize::from(at);
        }
    };
    let (chunks, tail) = keys.as_chunks::<32>();
    for (c, chunk) in chunks.iter().enumerate() {
        let mut mask = mask_past::<FROM_HIGH>(chunk, bound);
        while mask != 0 {
            take(c * 32 + mask.trailing_zeros() as usize);
            mask &= mask - 1;
        }
    }
    let base = chunks.len() * 32;
    for (i, &k) in tail.iter().enumerate() {
        if if FROM_HIGH { k >= bound } else { k <= bound } {
            take(base + i);
        }
    }
    debug_assert!(nb < q && nb + na >= q, "the counts cover q unprotected experts");
    out.clear();
    out.extend(below[..nb].iter().map(|&e| u128::from(e)));
    for _ in nb..q {
        let (mut best, mut bi) = (u64::MAX, 0);
        for (i, &x) in at_buf[..na].iter().enumerate() {
            // As likely as not: a conditional move, not a branch.
            let lower = x < best;
            best = std::hint::select_unpredictable(lower, x, best);
            bi = std::hint::select_unpredictable(lower, i, bi);
        }
        out.push(u128::from(best));
        na -= 1;
        at_buf[bi] = at_buf[na];
    }
}

/// belady: priority = the next token at which the expert is chosen again (within the sequence
/// when resets are on), never-again first, then farthest, ties to the lowest id. The cached
/// experts are counted per next use ([`ValueCounts`], `[T + 1]`, value T = never); a token's
/// victims come from a walk down from the farthest next use and [`pick_counted`]. Protected
/// experts need no exclusion: they are chosen at this token, the nearest next use there is,
/// and the walk stops before it (at least `q` unprotected experts lie beyond).
struct Belady {
    /// Next use of the `i`-th chosen expert of token `t`: `next_of[t * k_used + i]`, T = never.
    next_of: Vec<u32>,
    k_used: usize,
    counts: ValueCounts,
    buf: Vec<u128>,
    below: Vec<u16>,
    at: Vec<u64>,
}

impl Belady {
    /// Backward pass over the λ = 0 selections (F[0..n]) of the layer.
    fn new(p: &Params<'_>, inp: &LayerInput<'_>) -> Belady {
        let (m, k) = (p.m, p.k_used);
        // validate() refuses belady on 2^32 tokens or more.
        let never = p.tokens as u32;
        let mut next_of = vec![never; p.tokens * k];
        let mut upcoming = vec![never; p.num_experts];
        let mut ri = p.resets.len();
        for t in (0..p.tokens).rev() {
            let row = &inp.ids[t * m..(t + 1) * m];
            let chosen = row.iter().map(|&e| usize::from(e)).filter(|&e| inp.keep[e]).take(k);
            for (i, e) in chosen.enumerate() {
                next_of[t * k + i] = upcoming[e];
                upcoming[e] = t as u32;
            }
            if ri > 0 && p.resets[ri - 1] == t as u64 {
                upcoming.fill(never);
                ri -= 1;
            }
        }
        let slots = p.cap.min(p.num_experts);
        Belady {
            next_of,
            k_used: k,
            counts: ValueCounts::new(p.tokens + 1),
            buf: Vec::with_capacity(slots),
            below: vec![0; slots + 1],
            at: vec![0; slots + 1],
        }
    }

    /// The `q` unprotected cached experts of farthest next use (ties: lowest id) into `out`.
    #[inline(always)]
    fn farthest(&mut self, cache: &Cache<u32>, prot: &[u64], stamp: u64, q: usize, out: &mut Vec<u128>) {
        let bound = self.counts.bound::<true>(q) as u32;
        pick_counted::<true>(cache, prot, stamp, q, bound, &mut self.below, &mut self.at, out, |e| e as u64);
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
    fn access(&mut self, e: usize, _now: u64, t: usize, i: usize, inserted: bool, cache: &mut Cache<u32>) {
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
    fn victim(&mut self, cache: &Cache<u32>, prot: &[u64], stamp: u64) -> usize {
        let mut out = std::mem::take(&mut self.buf);
        self.farthest(cache, prot, stamp, 1, &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(
        &mut self,
        cache: &Cache<u32>,
        prot: &[u64],
        stamp: u64,
        q: usize,
        _chosen: &[u16],
        _track: Option<&[f64]>,
        out: &mut Vec<u128>,
    ) {
        self.farthest(cache, prot, stamp, q, out);
    }
}

/// near_pick: priority (near, last access), near = 1 + the last token at which the expert stood
/// in F at rank < N (0 = never; kept as the expert's key in the cache), and last, per expert.
/// Instead of keeping the cached experts in order, it counts them per near value
/// ([`ValueCounts`], `[T + 1]`): after token t every cached expert of F's first N moves from
/// its count to count t + 1, without branches ([`move_near`]). The victims of a token: walk the
/// near values from the oldest until the counts (without the protected experts) cover `q`, then
/// [`pick_counted`] (ties at the bound by last access).
struct NearPick {
    last: Vec<u64>,
    counts: ValueCounts,
    n: usize,
    buf: Vec<u128>,
    /// Buffers of [`pick_counted`], `[cached + 1]`.
    below: Vec<u16>,
    at: Vec<u64>,
}

impl NearPick {
    fn new(p: &Params<'_>) -> NearPick {
        let slots = p.cap.min(p.num_experts);
        NearPick {
            last: vec![0; p.num_experts],
            counts: ValueCounts::new(p.tokens + 1),
            n: p.near_n,
            buf: Vec::with_capacity(slots),
            below: vec![0; slots + 1],
            at: vec![0; slots + 1],
        }
    }

    /// The `q` unprotected cached experts of lowest (near, last, id) into `out`; the counts
    /// must leave the protected ones out.
    #[inline(always)]
    fn lowest(&mut self, cache: &Cache<u32>, prot: &[u64], stamp: u64, q: usize, out: &mut Vec<u128>) {
        let bound = self.counts.bound::<false>(q) as u32;
        let last = &self.last;
        pick_counted::<false>(cache, prot, stamp, q, bound, &mut self.below, &mut self.at, out, |e| {
            (last[e] << 16) | e as u64
        });
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
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, inserted: bool, cache: &mut Cache<u32>) {
        self.last[e] = now;
        self.counts.add(cache.key(e) as usize, u32::from(inserted));
    }
    #[inline(always)]
    fn evicted(&mut self, e: usize, cache: &Cache<u32>) {
        self.counts.sub(cache.key(e) as usize, 1);
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<u32>, prot: &[u64], stamp: u64) -> usize {
        let mut out = std::mem::take(&mut self.buf);
        self.lowest(cache, prot, stamp, 1, &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(
        &mut self,
        cache: &Cache<u32>,
        prot: &[u64],
        stamp: u64,
        q: usize,
        chosen: &[u16],
        _track: Option<&[f64]>,
        out: &mut Vec<u128>,
    ) {
        // Protected experts are not eligible: leave them out of the counts while walking.
        for &e in chosen {
            let e = usize::from(e);
            self.counts.sub(cache.key(e) as usize, u32::from(cache.contains(e)));
        }
        self.lowest(cache, prot, stamp, q, out);
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
fn move_near(f: &[u16], key: u32, count: &mut [u32], keys: &mut [u32], pos: &[u32], len: usize) -> u32 {
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

/// `keys[pos[ids[i]]] += xs[i]` for each credited expert, in order: the scores of [`Decayed`]. A
/// pruned expert (inv_router credits every candidate of the row) collects credits without decay
/// in an entry nobody reads: it is never cached.
#[inline(never)]
fn add_credits(ids: &[u16], xs: &[f64], keys: &mut [f64], pos: &[u32]) {
    for (&e, &x) in ids.iter().zip(xs) {
        keys[pos[usize::from(e)] as usize] += x;
    }
}

/// `keys[pos[e]] += 1` for each expert of `ids`: the credits of near_pick_ema.
#[inline(never)]
fn add_ones(ids: &[u16], keys: &mut [f64], pos: &[u32]) {
    for &e in ids {
        keys[pos[usize::from(e)] as usize] += 1.0;
    }
}

/// s <- d*s for every expert, in chunks the compiler vectorizes (each product rounded alone:
/// the same values as the reference's scalar loop).
#[inline(never)]
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

/// near_pick_ema and inv_router: priority (s, last access) with s ← d·s + x once per token for
/// every expert; they differ only in the credit x (`C`). Decays are eager (see the module doc);
/// victims come from a [`Selector`] over the cached experts' scores.
struct Decayed<C> {
    last: Vec<u64>,
    decay: f64,
    buf: Vec<u128>,
    sel: Selector,
    credit: C,
}

impl<C> Decayed<C> {
    fn new(p: &Params<'_>, credit: C) -> Decayed<C> {
        let e = p.num_experts;
        let sel = Selector::new(p.cap.min(e));
        Decayed { last: vec![0; e], decay: p.decay, buf: Vec::with_capacity(1), sel, credit }
    }
}

/// The credit x of a [`Decayed`] policy, added to the scores after the decay of token `t`.
trait Credit {
    /// The scores come from a [`TrackedScores`] shared with other configurations: the policy
    /// neither decays nor credits; its victim selection reads the track's rows.
    const TRACKED: bool = false;
    /// How many leading candidates of F the credit reads.
    fn f_needed(&self) -> usize;
    /// Adds the credits of token `t` to the scores (`cache`'s keys).
    fn credit(&mut self, cache: &mut Cache<f64>, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>);
}

/// near_pick_ema: x = 1 for the experts at rank < N of F, 0 elsewhere (adding 0 is exact, so
/// adding 1 where x = 1 equals the reference's d·s + x bit for bit).
struct EmaCredit {
    n: usize,
}

impl Credit for EmaCredit {
    fn f_needed(&self) -> usize {
        self.n
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, _t: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        add_ones(&f[..f.len().min(self.n)], &mut cache.keys, &cache.pos);
    }
}

impl<C: Credit> Evictor for Decayed<C> {
    type Key = f64;
    const ADMIT_WITHOUT_BRANCH: bool = true;
    const BATCH: bool = true;
    const SLOTS: bool = true;
    fn f_needed(&self) -> usize {
        self.credit.f_needed()
    }
    fn reset(&mut self, cache: &mut Cache<f64>) {
        cache.keys.fill(0.0);
    }
    #[inline(always)]
    fn access(&mut self, e: usize, now: u64, _t: usize, _i: usize, _inserted: bool, _cache: &mut Cache<f64>) {
        self.last[e] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<f64>, prot: &[u64], stamp: u64) -> usize {
        // Only sequential mode asks for one victim per miss, and it protects nothing.
        debug_assert!(!C::TRACKED, "a tracked policy runs in k-way mode");
        let mut out = std::mem::take(&mut self.buf);
        self.victims(cache, prot, stamp, 1, &[], None, &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(
        &mut self,
        cache: &Cache<f64>,
        _prot: &[u64],
        _stamp: u64,
        q: usize,
        chosen: &[u16],
        track: Option<&[f64]>,
        out: &mut Vec<u128>,
    ) {
        debug_assert!(!C::TRACKED || track.is_some(), "a tracked policy reads the track's rows");
        // The protected experts are the cached ones among `chosen`.
        let order = &cache.order[..cache.len];
        let vals = self.sel.start();
        match track {
            Some(scores) if C::TRACKED => vals.extend(order.iter().map(|&e| scores[usize::from(e)])),
            _ => vals.extend_from_slice(cache.live_keys()),
        }
        self.sel.select(order, &cache.pos, chosen, &self.last, q, out);
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, cache: &mut Cache<f64>) {
        // Tracked scores are read from the track's rows.
        if !C::TRACKED {
            // Only kept experts can be cached: the scores of the others are never read.
            let kept = cache.kept;
            decay_all(&mut cache.keys[..kept], self.decay);
            self.credit.credit(cache, t, f, row, scores);
        }
    }
}

/// The credit of a [`Decayed`] policy whose scores a [`TrackedScores`] computes.
struct Tracked;

impl Credit for Tracked {
    const TRACKED: bool = true;
    fn f_needed(&self) -> usize {
        0
    }
    fn credit(&mut self, _cache: &mut Cache<f64>, _t: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
}

/// inv_router: x = the softmax of the row's scores over all m candidates (0 for experts not
/// among them).
struct RouterCredit<'a> {
    /// The softmax of the current row, `[m]`.
    exps: Vec<f64>,
    memo: ExpMemo,
    /// The layer's softmax rows computed beforehand ([`softmax_layer`], `[T, m]`), if given.
    probs: Option<&'a [f64]>,
}

/// The softmax of one row of router scores over all m candidates, into `out` (`[m]`): exp(z −
/// max) / sum, in f64, in this order (the reference computes the same). Scores are
/// non-increasing along a row, so z[0] is the maximum.
#[inline(never)]
fn softmax_row(z: &[f32], memo: &mut ExpMemo, out: &mut [f64]) {
    let max = f64::from(z[0]);
    let mut sum = 0.0;
    if memo.on {
        let mut hits = 0;
        for (x, &zi) in out.iter_mut().zip(z) {
            let (v, hit) = memo.exp(f64::from(zi) - max);
            *x = v;
            hits += usize::from(hit);
            sum += v;
        }
        memo.probe(z.len(), hits);
    } else {
        for (x, &zi) in out.iter_mut().zip(z) {
            *x = (f64::from(zi) - max).exp();
            sum += *x;
        }
    }
    for x in out.iter_mut() {
        *x /= sum;
    }
}

/// The softmax of every row of one layer's scores (`[T, m]`), row after row: the credits of
/// `inv_router`, the same bits [`softmax_row`] gives inside the replay, so one table can serve
/// every `inv_router` configuration of a sweep.
pub(crate) fn softmax_layer(scores: &[f32], m: usize) -> Vec<f64> {
    let mut probs = vec![0.0; scores.len()];
    let mut memo = ExpMemo::new();
    for (z, out) in scores.chunks_exact(m).zip(probs.chunks_exact_mut(m)) {
        softmax_row(z, &mut memo, out);
    }
    probs
}

/// A direct-mapped memo of `f64::exp`: exact (the same function on the same argument), and a
/// saving when router scores are quantized (bf16 logits, rounded probabilities), so that the
/// same differences z − max recur. A miss costs one hash and one store on top of the `exp`, so
/// the memo watches its first [`MEMO_PROBE`] lookups and turns itself off when fewer than half
/// of them hit (continuous scores).
struct ExpMemo {
    /// Argument bits per entry; a NaN pattern (never an argument: scores are finite) when empty.
    keys: Vec<u64>,
    vals: Vec<f64>,
    on: bool,
    lookups: u32,
    hits: u32,
}

const MEMO_BITS: u32 = 10;

/// Lookups after which [`ExpMemo`] decides whether it pays.
const MEMO_PROBE: u32 = 1 << 16;

impl ExpMemo {
    fn new() -> ExpMemo {
        ExpMemo { keys: vec![u64::MAX; 1 << MEMO_BITS], vals: vec![0.0; 1 << MEMO_BITS], on: true, lookups: 0, hits: 0 }
    }

    /// exp(x) and whether the memo held it.
    #[inline(always)]
    fn exp(&mut self, x: f64) -> (f64, bool) {
        let bits = x.to_bits();
        let i = ((bits ^ (bits >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO_BITS)) as usize;
        if self.keys[i] == bits {
            return (self.vals[i], true);
        }
        let v = x.exp();
        self.keys[i] = bits;
        self.vals[i] = v;
        (v, false)
    }

    /// Accounts one row's lookups while probing; turns the memo off when it does not pay.
    #[inline(always)]
    fn probe(&mut self, lookups: usize, hits: usize) {
        if self.lookups < MEMO_PROBE {
            self.lookups = self.lookups.saturating_add(lookups as u32);
            self.hits = self.hits.saturating_add(hits as u32);
            if self.lookups >= MEMO_PROBE {
                self.on = self.hits >= self.lookups / 2;
            }
        }
    }
}

impl Credit for RouterCredit<'_> {
    fn f_needed(&self) -> usize {
        0
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, t: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        let m = row.len();
        let p: &[f64] = match (self.probs, scores) {
            (Some(probs), _) => &probs[t * m..(t + 1) * m],
            (None, Some(z)) => {
                softmax_row(z, &mut self.memo, &mut self.exps);
                &self.exps
            }
            // validate() guarantees scores for inv_router; without them there is nothing to credit.
            (None, None) => return,
        };
        add_credits(row, p, &mut cache.keys, &cache.pos);
    }
}

/// The scores of `near_pick_ema` or `inv_router` for every expert of one layer, token after
/// token. They do not depend on the cache (the credits come from F or from the row, never from
/// what is cached), so the configurations that differ only in cap, λ, j, k_used or warmup
/// share them: the track decays and credits once per token, in blocks of rows, and each
/// configuration ([`TrackedRun`]) reads its cached experts' scores from the rows in its victim
/// selection ([`Selector`]). The values are
/// those of [`Decayed`], bit for bit: the same operations in the same order (decays of the
/// experts a configuration prunes, and their credits, are never read).
pub(crate) struct TrackedScores<'a> {
    credit: TrackCredit<'a>,
    ids: &'a [u16],
    scores_z: Option<&'a [f32]>,
    m: usize,
    num_experts: usize,
    decay: f64,
    resets: &'a [u64],
    ri: usize,
    /// Row 0: the scores before the block's first token; row i + 1: after its token i. `[block
    /// + 1, E]`.
    rows: Vec<f64>,
    /// Tokens in the last block filled.
    filled: usize,
    /// inv_router: the softmax of the current row, `[m]`, and the `exp` memo.
    exps: Vec<f64>,
    memo: ExpMemo,
}

/// What [`TrackedScores`] credits after each token.
pub(crate) enum TrackCredit<'a> {
    /// near_pick_ema: 1 to each of the first `n` kept candidates (`keep`, `[E]`).
    Ema { n: usize, keep: &'a [bool] },
    /// inv_router: the softmax of the row's scores to each candidate.
    Router,
}

impl<'a> TrackedScores<'a> {
    /// A track over the layer of `p` and `inp` (its ids, its scores for `inv_router`), `block`
    /// tokens at a time.
    pub fn new(p: &Params<'a>, inp: &LayerInput<'a>, credit: TrackCredit<'a>, block: usize) -> TrackedScores<'a> {
        TrackedScores {
            credit,
            ids: inp.ids,
            scores_z: inp.scores,
            m: p.m,
            num_experts: p.num_experts,
            decay: p.decay,
            resets: p.resets,
            ri: 0,
            rows: vec![0.0; (block + 1) * p.num_experts],
            filled: 0,
            exps: vec![0.0; p.m],
            memo: ExpMemo::new(),
        }
    }

    /// Computes the rows of `tokens`: the block after the previous call's (the first from token
    /// 0), at most `block` tokens.
    pub fn fill(&mut self, tokens: std::ops::Range<usize>) -> TrackRows<'_> {
        let (m, width) = (self.m, self.num_experts);
        // The scores after the previous block are the ones before this one.
        self.rows.copy_within(self.filled * width..(self.filled + 1) * width, 0);
        let first = tokens.start;
        self.filled = tokens.len();
        for t in tokens {
            let i = t - first;
            let (done, rest) = self.rows.split_at_mut((i + 1) * width);
            let (prev, cur) = (&done[i * width..], &mut rest[..width]);
            if self.ri < self.resets.len() && self.resets[self.ri] == t as u64 {
                // Scores restart from 0 (whose decay is 0).
                cur.fill(0.0);
                self.ri += 1;
            } else {
                decay_into(prev, cur, self.decay);
            }
            let row = &self.ids[t * m..(t + 1) * m];
            match self.credit {
                TrackCredit::Ema { n, keep } => {
                    for &e in row.iter().filter(|&&e| keep[usize::from(e)]).take(n) {
                        cur[usize::from(e)] += 1.0;
                    }
                }
                TrackCredit::Router => {
                    if let Some(z) = self.scores_z {
                        softmax_row(&z[t * m..(t + 1) * m], &mut self.memo, &mut self.exps);
                        for (&e, &x) in row.iter().zip(&self.exps) {
                            cur[usize::from(e)] += x;
                        }
                    }
                }
            }
        }
        TrackRows { rows: &self.rows[..(self.filled + 1) * width], first, width }
    }
}

/// `dst[i] = src[i] * d`, in chunks the compiler vectorizes (each product rounded alone, as in
/// [`decay_all`]).
#[inline(never)]
fn decay_into(src: &[f64], dst: &mut [f64], d: f64) {
    let mut chunks = dst.chunks_exact_mut(8);
    let mut src_chunks = src.chunks_exact(8);
    for (o, i) in (&mut chunks).zip(&mut src_chunks) {
        for j in 0..8 {
            o[j] = i[j] * d;
        }
    }
    for (o, &i) in chunks.into_remainder().iter_mut().zip(src_chunks.remainder()) {
        *o = i * d;
    }
}

/// One configuration of `near_pick_ema` or `inv_router` replayed in steps, its scores from a
/// [`TrackedScores`] shared with others. k-way mode only: its victims are chosen together per
/// token ([`Evictor::victims`], which reads the track's rows); sequential mode chooses one per
/// miss ([`Evictor::victim`]), which scans `Cache::keys`, never written for a tracked policy.
pub(crate) struct TrackedRun<'a> {
    p: Params<'a>,
    inp: LayerInput<'a>,
    st: State<Decayed<Tracked>>,
}

impl<'a> TrackedRun<'a> {
    pub fn new(p: Params<'a>, inp: LayerInput<'a>) -> TrackedRun<'a> {
        debug_assert!(!p.sequential, "scores are shared in k-way mode only");
        let st = State::new(&p, &inp, Decayed::new(&p, Tracked));
        TrackedRun { p, inp, st }
    }

    /// Replays `rows`' tokens (the next ones).
    pub fn advance(self, rows: TrackRows<'_>) -> TrackedRun<'a> {
        let tokens = rows.first..rows.first + rows.len();
        let st = run_tokens(&self.p, &self.inp, self.st, tokens, Some(rows));
        TrackedRun { st, ..self }
    }

    pub fn counts(&self) -> LayerCounts {
        self.st.c
    }
}

/// The whole token loop of one layer with policy `pol`.
fn run<P: Evictor>(p: &Params<'_>, inp: &LayerInput<'_>, pol: P) -> LayerCounts {
    run_tokens(p, inp, State::new(p, inp, pol), 0..p.tokens, None).c
}

/// Everything one layer's replay carries from token to token: the policy, the cache, the
/// buffers of the token loop (allocated once) and the counts so far.
struct State<P: Evictor> {
    pol: P,
    cache: Cache<P::Key>,
    /// `prot[e] == t + 1`: e is chosen for token t (k-way protection); never written in
    /// sequential mode. `[E]`.
    prot: Vec<u64>,
    /// With a full keep set F is the row itself; otherwise F (expert, position in the row) is
    /// built along the row in `f_ids`, `f_pos` (`[m]`), only as far as steps 2 and 5 read it.
    keep_all: bool,
    f_ids: Vec<u16>,
    f_pos: Vec<u16>,
    /// λ > 0: chosen (expert, position in the row) in processing order, and the merge's queue.
    chosen_buf: Vec<(u16, u32)>,
    chosen_ids: Vec<u16>,
    pending: Vec<u32>,
    /// A token's victims (at most one per miss: `<= k_used`).
    victims: Vec<u128>,
    c: LayerCounts,
    /// The pick clock.
    now: u64,
    /// The next entry of `Params::resets`.
    ri: usize,
}

impl<P: Evictor> State<P> {
    fn new(p: &Params<'_>, inp: &LayerInput<'_>, pol: P) -> State<P> {
        let (m, k) = (p.m, p.k_used);
        State {
            pol,
            cache: Cache::new(inp.keep, P::SLOTS),
            prot: vec![0; p.num_experts],
            keep_all: inp.keep.iter().all(|&kept| kept),
            f_ids: vec![0; m],
            f_pos: vec![0; m],
            chosen_buf: Vec::with_capacity(k),
            chosen_ids: Vec::with_capacity(k),
            pending: Vec::with_capacity(m),
            victims: Vec::with_capacity(k),
            c: LayerCounts::default(),
            now: 0,
            ri: 0,
        }
    }
}

/// Rows of a [`TrackedScores`]: the scores of every expert before token `first` and after each
/// token of a block `first..first + len`, `[len + 1, E]`.
#[derive(Clone, Copy)]
pub(crate) struct TrackRows<'a> {
    rows: &'a [f64],
    first: usize,
    width: usize,
}

impl<'a> TrackRows<'a> {
    /// How many tokens the rows cover.
    pub fn len(self) -> usize {
        (self.rows.len() / self.width.max(1)).saturating_sub(1)
    }

    /// The scores before token `t` (one of the block's), `[E]`.
    #[inline(always)]
    fn before(self, t: usize) -> &'a [f64] {
        let i = t - self.first;
        &self.rows[i * self.width..(i + 1) * self.width]
    }
}

/// The token loop of one layer (SEMANTICS.md §5 steps 1-5) over `tokens`, from `st` (moved in
/// and out: inside, its parts are locals the compiler keeps apart). `track` holds the rows of
/// those tokens for a policy whose scores are shared.
#[inline(never)]
fn run_tokens<P: Evictor>(
    p: &Params<'_>,
    inp: &LayerInput<'_>,
    st: State<P>,
    tokens: std::ops::Range<usize>,
    track: Option<TrackRows<'_>>,
) -> State<P> {
    let (m, k, cap) = (p.m, p.k_used, p.cap);
    let State {
        mut pol,
        mut cache,
        mut prot,
        keep_all,
        mut f_ids,
        mut f_pos,
        mut chosen_buf,
        mut chosen_ids,
        mut pending,
        mut victims,
        mut c,
        mut now,
        mut ri,
    } = st;
    let cache_aware = p.lambda > 0.0;
    let batch = P::BATCH && !p.sequential;
    // The part of F that the λ = 0 selection and the credits read.
    let f_base = k.max(pol.f_needed()).min(m);

    for t in tokens {
        if ri < p.resets.len() && p.resets[ri] == t as u64 {
            pol.reset(&mut cache);
            cache.clear();
            ri += 1;
        }
        let row = &inp.ids[t * m..(t + 1) * m];
        let row_scores = inp.scores.map(|s| &s[t * m..(t + 1) * m]);

        // Step 1: F (its first f_base entries) and n; pruned slots (of the row's first k_used
        // ids, the ones not kept). `scanned`: row positions examined so far.
        // With an F table, F is its row, whole.
        let (mut f_len, mut scanned) = (f_base, f_base);
        let mut pruned = 0;
        let table_f = inp.f_table.map(|ft| ft.row(t));
        if !keep_all {
            if let Some((ids, _)) = table_f {
                f_len = ids.len();
            } else {
                (f_len, scanned) = (0, 0);
                extend_f(row, inp.keep, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, f_base, m);
            }
            pruned = row[..k].iter().filter(|&&e| !inp.keep[usize::from(e)]).count();
        }
        let n = k.min(f_len);

        // Step 2: selection; substituted = chosen experts outside the row's first k_used.
        let (chosen, substituted): (&[u16], usize) = match row_scores {
            Some(z) if cache_aware && n > 0 => {
                let pos = |r: usize| if keep_all { r } else { usize::from(table_f.map_or(&f_pos[..], |t| t.1)[r]) };
                // Only row positions before `end` can be chosen: a candidate at rank >= n whose
                // score plus the bonus stays below z(F[n-1]) is beaten by all of F[0..n] (and
                // scores are non-increasing along the row, so all later ones are too).
                let z_last = f64::from(z[pos(n - 1)]);
                let bonus = if n <= 1 { 0.0 } else { p.lambda * (f64::from(z[pos(0)]) - z_last) };
                let mut end = pos(n - 1) + 1;
                while end < m && f64::from(z[end]) + bonus >= z_last {
                    end += 1;
                }
                let sel_len = if keep_all {
                    f_len = f_len.max(end);
                    end
                } else if let Some((_, table_pos)) = table_f {
                    table_pos.partition_point(|&i| usize::from(i) < end)
                } else {
                    extend_f(row, inp.keep, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, m, end);
                    f_pos[..f_len].partition_point(|&i| usize::from(i) < end)
                };
                chosen_buf.clear();
                if keep_all {
                    select_cache_aware(&row[..sel_len], |r| r, z, n, bonus, p.j, &cache, &mut pending, &mut chosen_buf);
                } else {
                    let (fi, fp): (&[u16], &[u16]) = table_f.unwrap_or((&f_ids, &f_pos));
                    select_cache_aware(
                        &fi[..sel_len],
                        |r| usize::from(fp[r]),
                        z,
                        n,
                        bonus,
                        p.j,
                        &cache,
                        &mut pending,
                        &mut chosen_buf,
                    );
                }
                chosen_ids.clear();
                chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
            }
            // F's first n: the kept ids among the row's first k_used (k_used − pruned of them)
            // come first, the rest lie beyond.
            _ => {
                let f = if keep_all { &row[..n] } else { &table_f.map_or(&f_ids[..], |t| t.0)[..n] };
                (f, n - (k - pruned))
            }
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
                pol.victims(&cache, &prot, stamp, q, chosen, track.map(|tr| tr.before(t)), &mut victims);
                for &key in &victims {
                    let v = (key & 0xFFFF) as usize;
                    cache.remove(v);
                    pol.evicted(v, &cache);
                }
            }
        }
        let mut hits = 0;
        for (i, &e) in chosen.iter().enumerate() {
            now += 1;
            hits += u64::from(pol.step(Pick { e: usize::from(e), now, t, i }, cap, &prot, stamp, &mut cache));
        }
        if counted {
            c.hits += hits;
            c.misses += chosen.len() as u64 - hits;
        }

        // Step 5: credits.
        // With a table, f_len is its row's length.
        let f = if keep_all { &row[..f_len] } else { &table_f.map_or(&f_ids[..], |t| t.0)[..f_len] };
        pol.end_token(t, f, row, row_scores, &mut cache);
    }
    State { pol, cache, prot, keep_all, f_ids, f_pos, chosen_buf, chosen_ids, pending, victims, c, now, ri }
}

/// Step 1 for a pruned keep set: appends the kept candidates of `row[*scanned..end]` to F
/// (`f_ids`, `f_pos`: expert and row position, length >= m) until F holds `want`. Every
/// candidate is written and the length advances only when it is kept (no branch on the keep
/// mask, which is as unpredictable as the map is mixed).
#[expect(clippy::too_many_arguments, reason = "a helper of the token loop")]
// Not inlined: inside the token loop its pointers and counters are spilled to the stack; on its
// own they stay in registers (a call per token costs less than a reload per candidate).
#[inline(never)]
fn extend_f(
    row: &[u16],
    keep: &[bool],
    f_ids: &mut [u16],
    f_pos: &mut [u16],
    f_len: &mut usize,
    scanned: &mut usize,
    want: usize,
    end: usize,
) {
    // Locals, and F's buffers cut to the row's length (F never outgrows the row scanned).
    let (mut len, mut i) = (*f_len, *scanned);
    let m = row.len();
    let (f_ids, f_pos) = (&mut f_ids[..m], &mut f_pos[..m]);
    let end = end.min(m);
    while len < want && i < end {
        let e = row[i];
        f_ids[len] = e;
        // Row positions are below m <= 65,536.
        f_pos[len] = i as u16;
        len += usize::from(keep[usize::from(e)]);
        i += 1;
    }
    (*f_len, *scanned) = (len, i);
}

/// Step 2 for λ > 0: the first n of F by (score desc, rank asc), where candidates of rank < j
/// or already cached get z + λ·δ. F's scores are non-increasing, so one pass in rank order
/// suffices: a plain candidate waits in `pending` until a boosted one scores strictly above it
/// (a later plain candidate never scores above a boosted one, λ·δ >= 0), and the pass stops as
/// soon as n are chosen. `pos(r)` is the row position of F's rank r; `f` may stop early (at
/// the cut of the token loop); `bonus` = λ·δ with δ = z(F[0]) − z(F[n−1]) (0 if n <= 1).
#[expect(clippy::too_many_arguments, reason = "a helper of the token loop")]
#[inline(never)]
fn select_cache_aware<K: Copy + Default>(
    f: &[u16],
    pos: impl Fn(usize) -> usize,
    z_row: &[f32],
    n: usize,
    bonus: f64,
    j: usize,
    cache: &Cache<K>,
    pending: &mut Vec<u32>,
    chosen: &mut Vec<(u16, u32)>,
) {
    if n == 0 {
        return;
    }
    let z = |r: usize| f64::from(z_row[pos(r)]);
    pending.clear();
    let mut head = 0;
    for (r, &e) in f.iter().enumerate() {
        if r < j || cache.contains(usize::from(e)) {
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
