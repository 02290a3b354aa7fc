//! Miss-ratio curves: the misses of every cache size, per layer.
//!
//! [`lru_curve`] computes the LRU curve of every cap from `k_used` to E in **one pass** over the
//! trace, for both residency semantics; [`belady_curve`] and [`credit_curve`] do the same for
//! belady, near_pick, near_pick_ema and inv_router at λ = 0 under k-way residency (the priority
//! stack of `stack.rs`: their priorities do not depend on the cap); [`replay_curve`] computes any
//! policy's curve by one replay per cap (run in parallel), and is the cross-check of the one-pass
//! curves ([`has_one_pass`] says which exist). fifo and lfu have no one-pass curve: they are not
//! stack algorithms here (their order depends on insertion, so a larger cache can miss more:
//! `tests/mrc.rs` holds a trace where each does).
//!
//! # Why one pass is exact for LRU under k-way residency
//! Keep a recency stack per layer (most recent first) and update it once per token: the token's
//! chosen experts S move to the top, in pick order (the last pick on top). Claim: before every
//! token, an LRU cache of capacity C (`C >= k_used >= |S|`) holds exactly the top C experts of
//! the stack. It holds at the start (both empty). Suppose it holds before a token. Each miss evicts
//! the least recently used cached expert not in S (SEMANTICS.md §5 step 4), so the |S \ top C|
//! misses remove the least recent experts of `top C \ S`, leaving S and the `C - |S|` most recent
//! experts outside S; S's accesses get the newest times in pick order. That is the top C of the
//! updated stack. Hence a pick hits at cap C exactly when its depth in the stack **before the
//! token** (the number of distinct experts used more recently) is below C, and misses at cap C are
//! the picks of depth >= C plus first uses plus forced misses: the inclusion property, with one
//! histogram of depths serving every C. Under sequential semantics the cache is plain LRU over the
//! pick sequence, and the classic per-pick stack distance (Mattson et al., 1970) applies.
//!
//! Depths come from a Fenwick tree over pick times: the depth of `e` is the number of live
//! last-access times after `e`'s, so a pick costs O(log picks).

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use trace_io::TraceView;

use crate::{CacheSimError, Keep, OnePass, Policy, ReplayConfig, Result, Semantics};

mod belady;
mod credits;
mod stack;
mod work;

use stack::{LayerRows, StackKeys, stack_depths};
pub use work::{CurveWork, curve_work, has_pinned_curve};

/// One layer's curve: `misses[c - min_cap]` is the layer's misses at cap `c`, for `c` in
/// `min_cap..=max_cap`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerCurve {
    /// The layer's id in the model.
    pub layer_id: u32,
    /// Misses (forced ones included) at each cap from `min_cap`.
    pub misses: Vec<u64>,
}

/// Per-layer miss curves of one policy over a range of caps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MissCurve {
    /// The policy.
    pub policy: Policy,
    /// Residency semantics.
    pub semantics: Semantics,
    /// Experts used per token.
    pub k_used: usize,
    /// Smallest cap of the curve.
    pub min_cap: usize,
    /// Largest cap of the curve.
    pub max_cap: usize,
    /// Tokens counted (after warmup), as in [`crate::ReplayCounts::tokens`].
    pub tokens: u64,
    /// Picks counted per layer (`tokens · k_used`).
    pub picks_per_layer: u64,
    /// Per layer, in trace order.
    pub layers: Vec<LayerCurve>,
}

impl MissCurve {
    /// Misses of layer index `l` at cap `cap`. Panics when `cap` is outside `min_cap..=max_cap`.
    pub fn layer_misses(&self, l: usize, cap: usize) -> u64 {
        self.layers[l].misses[cap - self.min_cap]
    }

    /// Misses summed over layers at a uniform cap.
    pub fn total_misses(&self, cap: usize) -> u64 {
        (0..self.layers.len()).map(|l| self.layer_misses(l, cap)).sum()
    }

    /// Misses per token at a uniform cap (0 when no token is counted).
    pub fn misses_per_token(&self, cap: usize) -> f64 {
        if self.tokens == 0 { 0.0 } else { self.total_misses(cap) as f64 / self.tokens as f64 }
    }

    /// The same curve over the caps `lo..=hi` only.
    ///
    /// # Errors
    /// [`CacheSimError::InvalidParameter`] when `lo..=hi` is empty or not inside
    /// `min_cap..=max_cap`.
    pub fn sliced(mut self, lo: usize, hi: usize) -> Result<MissCurve> {
        if lo > hi || lo < self.min_cap || hi > self.max_cap {
            return Err(CacheSimError::InvalidParameter {
                name: "caps",
                value: format!("{lo}..={hi}"),
                reason: "must lie inside the curve's caps k_used..=E",
            });
        }
        for l in &mut self.layers {
            l.misses = l.misses[lo - self.min_cap..=hi - self.min_cap].to_vec();
        }
        (self.min_cap, self.max_cap) = (lo, hi);
        Ok(self)
    }
}

/// Whether `policy` has a one-pass curve under `semantics`: lru under both ([`lru_curve`]);
/// belady ([`belady_curve`]), near_pick, near_pick_ema and inv_router ([`credit_curve`]) under
/// k-way residency.
///
/// Read from the policy's facts ([`crate::PolicyFacts::curve`]).
pub fn has_one_pass(policy: Policy, semantics: Semantics) -> bool {
    match policy.facts().curve {
        OnePass::Lru { .. } => true,
        OnePass::Stack { .. } => semantics == Semantics::KWay,
        OnePass::None => false,
    }
}

/// The one-pass curve of `policy` ([`has_one_pass`]) of every cap from `k_used` to E, or `None`
/// for a policy without one.
///
/// # Errors
/// As [`lru_curve`], [`belady_curve`] and [`credit_curve`].
pub fn one_pass_curve(
    trace: &TraceView<'_>,
    keep: &Keep,
    policy: Policy,
    cfg: &CurveConfig,
) -> Option<Result<MissCurve>> {
    match policy.facts().curve {
        _ if !has_one_pass(policy, cfg.semantics) => None,
        OnePass::Lru { .. } => Some(lru_curve(trace, keep, cfg)),
        OnePass::Stack { .. } => Stacked::of(policy).map(|stacked| stack_curve(trace, keep, stacked, cfg)),
        OnePass::None => None,
    }
}

/// Settings of a curve: the [`ReplayConfig`] fields that matter to a replay at λ = 0 but the cap.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CurveConfig {
    /// Experts used per token; `None` = the trace's top-k.
    pub k_used: Option<usize>,
    /// Tokens replayed but not counted.
    pub warmup: usize,
    /// Residency semantics.
    pub semantics: Semantics,
    /// Empty the caches at each sequence start.
    pub reset_at_sequence: bool,
    /// Decay d of near_pick_ema and inv_router, in (0, 1] (default 0.99).
    #[serde(default = "default_decay")]
    pub decay: f64,
    /// N of near_pick and near_pick_ema (default 48).
    #[serde(default = "default_near_pick_n")]
    pub near_pick_n: usize,
}

fn default_decay() -> f64 {
    ReplayConfig::new(Policy::Lru, 0).decay
}

fn default_near_pick_n() -> usize {
    ReplayConfig::new(Policy::Lru, 0).near_pick_n
}

impl CurveConfig {
    /// The [`ReplayConfig`] of `policy` at cap `cap` with these settings (λ = 0).
    pub fn replay_config(&self, policy: Policy, cap: usize) -> ReplayConfig {
        ReplayConfig {
            k_used: self.k_used,
            warmup: self.warmup,
            semantics: self.semantics,
            reset_at_sequence: self.reset_at_sequence,
            decay: self.decay,
            near_pick_n: self.near_pick_n,
            ..ReplayConfig::new(policy, cap)
        }
    }
}

impl Default for CurveConfig {
    fn default() -> Self {
        CurveConfig {
            k_used: None,
            warmup: 64,
            semantics: Semantics::KWay,
            reset_at_sequence: false,
            decay: default_decay(),
            near_pick_n: default_near_pick_n(),
        }
    }
}

/// A Fenwick (binary indexed) tree of counts over pick times `1..=n`.
struct Fenwick(Vec<i32>);

impl Fenwick {
    fn add(&mut self, mut i: usize, v: i32) {
        while i < self.0.len() {
            self.0[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum over `1..=i`.
    fn prefix(&self, mut i: usize) -> i64 {
        let mut s = 0i64;
        while i > 0 {
            s += i64::from(self.0[i]);
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// The LRU curve of every cap from `k_used` to E, per layer, in one pass (layers in parallel).
///
/// Equals a [`crate::replay`] with policy `lru`, λ = 0 and the same settings at every cap (tested
/// on synthetic and real traces).
///
/// # Errors
/// As [`crate::validate`] for `lru` at cap `k_used` ([`CacheSimError::KUsedAboveCandidates`],
/// an invalid `k_used`), and [`CacheSimError::KeepMismatch`].
pub fn lru_curve(trace: &TraceView<'_>, keep: &Keep, cfg: &CurveConfig) -> Result<MissCurve> {
    lru_curve_pinned(trace, keep, None, cfg)
}

/// [`lru_curve`] with a pin map (SEMANTICS.md §9): the curve of the unpinned stream, pinned picks
/// being hits that touch no cache. Memory per layer at cap C is |pins| + C. Equals
/// [`crate::deploy::replay`] with the pins, policy `lru`, λ = 0 at every cap from `k_used` to E
/// (tested).
///
/// # Errors
/// As [`lru_curve`], plus those of [`crate::deploy::validate`] for the pins
/// ([`CacheSimError::PinNotKept`], [`CacheSimError::KeepMismatch`]); the pinned curve is k-way
/// only ([`CacheSimError::DeployUnsupported`] otherwise).
pub fn lru_curve_pinned(
    trace: &TraceView<'_>,
    keep: &Keep,
    pins: Option<&Keep>,
    cfg: &CurveConfig,
) -> Result<MissCurve> {
    let shape = trace.shape();
    if let Some(pins) = pins {
        let base = ReplayConfig {
            k_used: cfg.k_used,
            warmup: cfg.warmup,
            semantics: cfg.semantics,
            reset_at_sequence: cfg.reset_at_sequence,
            ..ReplayConfig::new(Policy::Lru, 0)
        };
        let dep = crate::deploy::Deployment { pins: Some(pins.clone()), ..Default::default() };
        crate::deploy::validate(trace, keep, &base, &dep)?;
    }
    let (k_used, seq) = check_curve(trace, keep, Policy::Lru, cfg)?;
    Ok(curve_of(trace, Policy::Lru, k_used, cfg, |l| {
        let pinned = pins.map(|p| p.layer_mask(l));
        lru_depths(trace.layer_ids(l), keep.layer_mask(l), pinned, shape.candidates, k_used, cfg, seq)
    }))
}

/// The belady curve of every cap from `k_used` to E, per layer, in one pass (layers in parallel):
/// the priority stack of `belady.rs` (Mattson et al., 1970, for a k-way set per token).
///
/// Equals a [`crate::replay`] with policy `belady`, λ = 0 and the same settings at every cap
/// (tested on synthetic traces with pruned keep maps, warmups and resets, and on the real ones).
///
/// # Errors
/// As [`crate::validate`] for `belady` at cap `k_used` (an invalid `k_used`, 2^32 tokens or
/// more), [`CacheSimError::KeepMismatch`], and [`CacheSimError::InvalidParameter`] for
/// sequential semantics (no one-pass curve: [`replay_curve`] computes it).
pub fn belady_curve(trace: &TraceView<'_>, keep: &Keep, cfg: &CurveConfig) -> Result<MissCurve> {
    stack_curve(trace, keep, Stacked::Belady, cfg)
}

/// The curve of near_pick, near_pick_ema or inv_router of every cap from `k_used` to E, per layer,
/// in one pass (layers in parallel): the priority stack of `stack.rs` with the policy's credits
/// (`credits.rs`), `cfg.decay` and `cfg.near_pick_n`.
///
/// Equals a [`crate::replay`] with `policy`, λ = 0 and the same settings at every cap (tested on
/// synthetic traces with pruned keep maps, warmups, resets and rescales of the lazy scores, and
/// on the real ones).
///
/// # Errors
/// As [`crate::validate`] for `policy` at cap `k_used` (an invalid `k_used`, decay or N, no
/// scores for inv_router), [`CacheSimError::KeepMismatch`], and
/// [`CacheSimError::InvalidParameter`] for sequential semantics or a policy without such a curve
/// ([`has_one_pass`]).
pub fn credit_curve(trace: &TraceView<'_>, keep: &Keep, policy: Policy, cfg: &CurveConfig) -> Result<MissCurve> {
    match Stacked::of(policy) {
        Some(stacked) if stacked != Stacked::Belady => stack_curve(trace, keep, stacked, cfg),
        _ => Err(CacheSimError::InvalidParameter {
            name: "policy",
            value: policy.to_string(),
            reason: "credit_curve is for near_pick, near_pick_ema and inv_router",
        }),
    }
}

/// The policies of the priority stack (`stack.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stacked {
    Belady,
    NearPick,
    NearPickEma,
    InvRouter,
}

impl Stacked {
    /// `policy`'s stack keys, `None` for a policy whose facts do not say
    /// [`OnePass::Stack`] (lru has its own one-pass curve; fifo and lfu have none). Every policy
    /// whose facts say `Stack` has keys here (`stack::tests::every_stack_policy_has_keys`).
    pub(crate) fn of(policy: Policy) -> Option<Stacked> {
        match policy {
            Policy::Belady => Some(Stacked::Belady),
            Policy::NearPick => Some(Stacked::NearPick),
            Policy::NearPickEma => Some(Stacked::NearPickEma),
            Policy::InvRouter => Some(Stacked::InvRouter),
            _ => None,
        }
    }
    pub(crate) fn policy(self) -> Policy {
        match self {
            Stacked::Belady => Policy::Belady,
            Stacked::NearPick => Policy::NearPick,
            Stacked::NearPickEma => Policy::NearPickEma,
            Stacked::InvRouter => Policy::InvRouter,
        }
    }
}

/// The one-pass curve of a priority-stack policy (belady or a credit policy) under k-way
/// residency.
fn stack_curve(trace: &TraceView<'_>, keep: &Keep, stacked: Stacked, cfg: &CurveConfig) -> Result<MissCurve> {
    let shape = trace.shape();
    let policy = stacked.policy();
    if cfg.semantics != Semantics::KWay {
        return Err(CacheSimError::InvalidParameter {
            name: "semantics",
            value: "sequential".into(),
            reason: "the one-pass curves of the priority stack are for k-way residency; replay_curve computes the sequential one",
        });
    }
    let (k_used, seq) = check_curve(trace, keep, policy, cfg)?;
    let base = cfg.replay_config(policy, k_used.max(1));
    Ok(curve_of(trace, policy, k_used, cfg, |l| {
        let rows = LayerRows {
            ids: trace.layer_ids(l),
            scores: trace.layer_scores(l),
            probs: None,
            keep: keep.layer_mask(l),
            m: shape.candidates,
            k_used,
            warmup: cfg.warmup,
            seq,
        };
        stack_histogram(&rows, stacked, &base, shape.num_experts)
    }))
}

/// The depth histogram of `stacked`'s priority stack over `rows`, cut at `max_depth`; `cfg` gives
/// the decay and N.
fn stack_histogram(rows: &LayerRows<'_>, stacked: Stacked, cfg: &ReplayConfig, max_depth: usize) -> DepthHistogram {
    fn run<K: StackKeys>(rows: &LayerRows<'_>, max_depth: usize, mut keys: K) -> DepthHistogram {
        stack_depths(rows, max_depth, &mut keys)
    }
    let LayerRows { keep, m, k_used, .. } = *rows;
    match stacked {
        Stacked::Belady => run(rows, max_depth, belady::BeladyKeys::new(rows.ids, keep, m, k_used, rows.seq)),
        Stacked::NearPick => run(rows, max_depth, credits::NearPickKeys::new(keep, k_used, cfg.near_pick_n)),
        Stacked::NearPickEma => {
            let credit = credits::DecayedCredit::NearPick { near_n: cfg.near_pick_n };
            run(rows, max_depth, credits::DecayedKeys::new(keep, k_used, m, cfg.decay, credit))
        }
        Stacked::InvRouter => {
            run(rows, max_depth, credits::DecayedKeys::new(keep, k_used, m, cfg.decay, credits::DecayedCredit::Router))
        }
    }
}

/// What a one-pass curve of `policy` checks before its pass: the configuration as
/// [`crate::validate`] sees it at cap `k_used`, the keep map's shape, and every candidate id (the
/// pass reads F along whole rows). Returns `k_used` and the tokens at which the caches reset.
fn check_curve<'t>(
    trace: &TraceView<'t>,
    keep: &Keep,
    policy: Policy,
    cfg: &CurveConfig,
) -> Result<(usize, &'t [u64])> {
    let shape = trace.shape();
    let k_used = cfg.k_used.unwrap_or(shape.top_k);
    let base = ReplayConfig { k_used: Some(k_used), ..cfg.replay_config(policy, k_used.max(1)) };
    crate::validate(&shape, trace.parts().scores.is_some(), &base)?;
    keep.check_shape(&shape)?;
    crate::require(trace, trace_io::Reads::ids(usize::MAX))?;
    Ok((k_used, trace.seq_offsets().filter(|_| cfg.reset_at_sequence).unwrap_or(&[])))
}

/// The curve of caps `k_used..=E` from each layer's depth histogram (`depths(l)`, layers in
/// parallel): misses(C) = first uses + forced misses + the picks of depth >= C.
fn curve_of(
    trace: &TraceView<'_>,
    policy: Policy,
    k_used: usize,
    cfg: &CurveConfig,
    depths: impl Fn(usize) -> DepthHistogram + Sync,
) -> MissCurve {
    let shape = trace.shape();
    let e_n = shape.num_experts;
    let layers: Vec<LayerCurve> = (0..shape.layers)
        .into_par_iter()
        .map(|l| {
            let hist = depths(l);
            let mut misses = vec![0u64; e_n + 1 - k_used];
            let mut tail: u64 = hist.depth[e_n.min(hist.depth.len())..].iter().sum();
            for c in (k_used..=e_n).rev() {
                misses[c - k_used] = hist.cold + hist.forced + tail;
                if c > 0 && c - 1 < hist.depth.len() {
                    tail += hist.depth[c - 1];
                }
            }
            LayerCurve { layer_id: trace.meta().layer_ids[l], misses }
        })
        .collect();
    let tokens = shape.tokens.saturating_sub(cfg.warmup) as u64;
    MissCurve {
        policy,
        semantics: cfg.semantics,
        k_used,
        min_cap: k_used,
        max_cap: e_n,
        tokens,
        picks_per_layer: tokens * k_used as u64,
        layers,
    }
}

pub(crate) struct DepthHistogram {
    /// `depth[d]`: counted picks whose stack depth was `d`.
    depth: Vec<u64>,
    /// Counted first uses (cold misses at every cap).
    cold: u64,
    /// Counted forced misses (slots left empty by pruning).
    forced: u64,
    /// Counted chosen experts outside the row's first k_used ids (§5 step 3, at λ = 0).
    substituted: u64,
    /// Counted slots of the row's first k_used ids whose expert is not kept (§5 step 3).
    pruned_slots: u64,
}

impl DepthHistogram {
    /// Nothing counted, for `experts` experts.
    fn new(experts: usize) -> DepthHistogram {
        DepthHistogram { depth: vec![0; experts], cold: 0, forced: 0, substituted: 0, pruned_slots: 0 }
    }

    /// Counts a row's forced misses, substituted picks and pruned slots: `f` is its chosen set
    /// (F's first k_used) at λ = 0.
    fn count_row(&mut self, row: &[u16], f: &[u16], keep: &[bool], k_used: usize) {
        let first = &row[..k_used.min(row.len())];
        self.forced += (k_used - f.len()) as u64;
        self.substituted += f.iter().filter(|e| !first.contains(e)).count() as u64;
        self.pruned_slots += first.iter().filter(|&&e| !keep[usize::from(e)]).count() as u64;
    }
}

fn lru_depths(
    ids: &[u16],
    keep: &[bool],
    pinned: Option<&[bool]>,
    m: usize,
    k_used: usize,
    cfg: &CurveConfig,
    seq: &[u64],
) -> DepthHistogram {
    let tokens = ids.len() / m.max(1);
    let e_n = keep.len();
    let mut hist = DepthHistogram::new(e_n);
    let mut tree = Fenwick(vec![0; tokens * k_used + 1]);
    let mut last = vec![0usize; e_n]; // last-access time, 0 = never (since the last reset)
    let mut live: i64 = 0;
    let mut clock = 0usize;
    let mut chosen: Vec<u16> = Vec::with_capacity(k_used);
    let mut depths: Vec<Option<usize>> = Vec::with_capacity(k_used);
    let mut next_seq = 0;
    for (t, row) in ids.chunks_exact(m).enumerate() {
        if next_seq < seq.len() && seq[next_seq] == t as u64 {
            next_seq += 1;
            for l in last.iter_mut().take(e_n) {
                if *l != 0 {
                    tree.add(*l, -1);
                    *l = 0;
                }
            }
            live = 0;
        }
        chosen.clear();
        chosen.extend(row.iter().copied().filter(|&e| keep[usize::from(e)]).take(k_used));
        let counted = t >= cfg.warmup;
        // Forced misses are the slots F leaves empty; pinned picks then hit outside the stack.
        if counted {
            hist.count_row(row, &chosen, keep, k_used);
        }
        if let Some(pinned) = pinned {
            chosen.retain(|&e| !pinned[usize::from(e)]);
        }
        let depth_of = |tree: &Fenwick, last: &[usize], live: i64, e: u16| {
            let le = last[usize::from(e)];
            (le != 0).then(|| (live - tree.prefix(le)) as usize)
        };
        let mut touch = |tree: &mut Fenwick, last: &mut [usize], live: &mut i64, e: u16| {
            let slot = &mut last[usize::from(e)];
            if *slot != 0 {
                tree.add(*slot, -1);
            } else {
                *live += 1;
            }
            clock += 1;
            tree.add(clock, 1);
            *slot = clock;
        };
        depths.clear();
        match cfg.semantics {
            Semantics::KWay => {
                depths.extend(chosen.iter().map(|&e| depth_of(&tree, &last, live, e)));
                for &e in &chosen {
                    touch(&mut tree, &mut last, &mut live, e);
                }
            }
            Semantics::Sequential => {
                for &e in &chosen {
                    depths.push(depth_of(&tree, &last, live, e));
                    touch(&mut tree, &mut last, &mut live, e);
                }
            }
        }
        if counted {
            for d in &depths {
                match d {
                    Some(d) => hist.depth[*d] += 1,
                    None => hist.cold += 1,
                }
            }
        }
    }
    hist
}

/// Whether configuration `cfg` can be replayed with others that differ from it only in cap by
/// one pass of its curve ([`layer_counts_at_caps`]): a policy with a one-pass curve
/// ([`has_one_pass`]) at λ = 0.
pub(crate) fn replays_by_curve(cfg: &ReplayConfig) -> bool {
    cfg.lambda == 0.0 && has_one_pass(cfg.policy, cfg.semantics)
}

/// The fewest caps of one curve for which its one pass is faster than one replay per cap. The
/// stack walks down to the largest cap for most tokens and compares at every level, where a
/// replay's cost hardly depends on the cap: measured on the README's ESFT grid (caps 8, 16, 32,
/// one thread), a pass cost about 1.6 replays for belady, 2.1 for near_pick, 2.4 for
/// near_pick_ema and inv_router, and the Fenwick LRU pass about 5 of lru's cheap replays
/// (the "Fifteenth round" of docs/performance.md in git history, `git show 29c2d74:docs/performance.md`).
/// Read from the policy's facts ([`crate::OnePass`]); `usize::MAX` for a policy without a pass.
pub(crate) fn curve_pays_from(policy: Policy) -> usize {
    match policy.facts().curve {
        OnePass::Lru { pays_from } | OnePass::Stack { pays_from } => pays_from,
        OnePass::None => usize::MAX,
    }
}

/// Whether `a` and `b` ([`replays_by_curve`]) give the counts of one curve at their caps: the
/// same policy and settings but the cap (j does nothing at λ = 0).
pub(crate) fn same_curve(a: &ReplayConfig, b: &ReplayConfig) -> bool {
    a.policy == b.policy
        && a.k_used == b.k_used
        && a.warmup == b.warmup
        && a.semantics == b.semantics
        && a.reset_at_sequence == b.reset_at_sequence
        && a.decay.to_bits() == b.decay.to_bits()
        && a.near_pick_n == b.near_pick_n
}

/// The counts of layer `l` of `trace` under `keep_mask` for the configuration `cfg`
/// ([`replays_by_curve`], validated) at each cap of `caps` (each >= k_used), from one pass of its
/// curve cut at the largest cap: equal to one replay per cap (`schedule.rs` tests it). `probs`:
/// the layer's softmax table ([`crate::engine::softmax_layer`]) when the caller has one.
pub(crate) fn layer_counts_at_caps(
    trace: &TraceView<'_>,
    l: usize,
    keep_mask: &[bool],
    probs: Option<&[f64]>,
    cfg: &ReplayConfig,
    caps: &[usize],
) -> Vec<crate::LayerCounts> {
    let shape = trace.shape();
    let k_used = cfg.k_used_or(shape.top_k);
    let seq = trace.seq_offsets().filter(|_| cfg.reset_at_sequence).unwrap_or(&[]);
    let max_cap = caps.iter().copied().max().unwrap_or(k_used);
    let hist = match Stacked::of(cfg.policy) {
        Some(stacked) => {
            let rows = LayerRows {
                ids: trace.layer_ids(l),
                scores: trace.layer_scores(l),
                probs,
                keep: keep_mask,
                m: shape.candidates,
                k_used,
                warmup: cfg.warmup,
                seq,
            };
            stack_histogram(&rows, stacked, cfg, max_cap)
        }
        None => {
            let curve_cfg = CurveConfig {
                k_used: Some(k_used),
                warmup: cfg.warmup,
                semantics: cfg.semantics,
                reset_at_sequence: cfg.reset_at_sequence,
                decay: cfg.decay,
                near_pick_n: cfg.near_pick_n,
            };
            lru_depths(trace.layer_ids(l), keep_mask, None, shape.candidates, k_used, &curve_cfg, seq)
        }
    };
    let picks = shape.tokens.saturating_sub(cfg.warmup) as u64 * k_used as u64;
    caps.iter()
        .map(|&cap| {
            let deeper: u64 = hist.depth.iter().skip(cap).sum();
            let misses = hist.cold + hist.forced + deeper;
            crate::LayerCounts {
                picks,
                hits: picks - misses,
                misses,
                forced_misses: hist.forced,
                substituted: hist.substituted,
                pruned_slots: hist.pruned_slots,
            }
        })
        .collect()
}

/// Any policy's curve at the given caps, by one [`crate::replay`] per cap (caps in parallel).
/// `base` gives every setting but the cap.
///
/// # Errors
/// As [`crate::replay`] for the first refused cap, and [`CacheSimError::InvalidParameter`] for
/// an empty or unsorted cap list.
pub fn replay_curve(trace: &TraceView<'_>, keep: &Keep, base: &ReplayConfig, caps: &[usize]) -> Result<MissCurve> {
    let shape = trace.shape();
    let contiguous = caps.windows(2).all(|w| w[1] == w[0] + 1);
    let (Some(&min_cap), Some(&max_cap)) = (caps.first(), caps.last()) else {
        return Err(CacheSimError::InvalidParameter {
            name: "caps",
            value: "[]".into(),
            reason: "need at least one cap",
        });
    };
    if !contiguous {
        return Err(CacheSimError::InvalidParameter {
            name: "caps",
            value: format!("{caps:?}"),
            reason: "must be consecutive (a..=b)",
        });
    }
    for &cap in caps {
        crate::validate(&shape, trace.parts().scores.is_some(), &ReplayConfig { cap, ..base.clone() })?;
    }
    let runs: Vec<crate::ReplayCounts> = caps
        .par_iter()
        .map(|&cap| crate::replay(trace, keep, &ReplayConfig { cap, ..base.clone() }))
        .collect::<Result<_>>()?;
    let layers = (0..shape.layers)
        .map(|l| LayerCurve {
            layer_id: trace.meta().layer_ids[l],
            misses: runs.iter().map(|r| r.layer_misses[l]).collect(),
        })
        .collect();
    let k_used = base.k_used_or(shape.top_k);
    let tokens = runs[0].tokens;
    Ok(MissCurve {
        policy: base.policy,
        semantics: base.semantics,
        k_used,
        min_cap,
        max_cap,
        tokens,
        picks_per_layer: tokens * k_used as u64,
        layers,
    })
}
