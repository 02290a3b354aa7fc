//! cachesim: replays recorded Mixture-of-Experts routing traces through per-layer expert caches
//! and counts the misses, i.e. the expert loads from SSD an offloading runtime would make
//! (SEMANTICS.md §5).
//!
//! Each traced layer has its own cache of `cap` experts; per token the router's candidates are
//! filtered by a keep set (pruning), optionally re-ranked toward cached experts (cache-aware
//! routing, λ > 0), and the chosen experts are looked up, missed experts inserted and, when the
//! cache is full, the lowest-priority expert not chosen for the same token evicted.
//!
//! Main types:
//! - [`ReplayConfig`] with [`Policy`] and [`Semantics`]: what to replay.
//! - [`Keep`]: per-layer masks of kept experts, built from plain id lists.
//! - [`ReplayCounts`]: the counts of one configuration (tokens, picks, hits, misses, ...).
//! - [`validate`] refuses bad configurations before any work; [`replay`] is the fast, parallel
//!   replayer ([`replay_many`]: several configurations of one trace, sharing per-layer work);
//!   [`reference::replay`] a plain, single-threaded one written for clarity, used to check the
//!   fast one (SEMANTICS.md §8.4). All give identical counts.
//! - Beyond §5, in modules: [`deploy`] (pins, a second tier, served and re-batched steps, cap 0:
//!   §9–§11), [`prefetch`] and [`timeline`] (§12–§13), [`hybrid`] (non-resident experts computed
//!   on the CPU, §14), [`shared_cache`] (one cache for every layer, §15.1), [`mrc`] (every cap of
//!   a curve in one pass). [`Replay`] is one request
//!   (keep set, configuration, deployment, execution) that picks its loop.
//! - One engine: every policy is one file holding its facts ([`PolicyFacts`]), its token-loop
//!   state and its deployed priority, named once in the policy table; the plain, lockstep,
//!   prefetch and hybrid replays run the one token loop of §5 built with a hook chosen outside
//!   the loop (`()` for plain replay, which compiles to the §5 loop alone); the deployed step
//!   loop of §11 serves pins, tiers, served steps and hybrid execution (docs/ARCHITECTURE.md).
//! - [`CacheSimError`]: the one error type.
//!
//! ```
//! use cachesim::{Keep, Policy, ReplayConfig};
//! use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};
//!
//! // One layer, 3 experts, k = 1, one candidate per row: requests 0 1 2 0.
//! let meta = TraceMeta {
//!     model: "toy".into(),
//!     num_experts: 3,
//!     top_k: 1,
//!     layer_ids: vec![0],
//!     score_kind: ScoreKind::None,
//!     phase: Phase::Unknown,
//!     source: "doc".into(),
//!     extra: Default::default(),
//! };
//! let parts = OwnedParts { ids: vec![0, 1, 2, 0], ..Default::default() };
//! let trace = TraceData::new(meta, 4, 1, parts)?;
//! let view = trace.view();
//! let cfg = ReplayConfig { warmup: 0, ..ReplayConfig::new(Policy::Lru, 2) };
//! let counts = cachesim::replay(&view, &Keep::full(&view.shape()), &cfg)?;
//! // 2 evicts 0 (least recently used), so 0 misses again: 4 misses in 4 picks.
//! assert_eq!((counts.picks, counts.misses), (4, 4));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Architecture invariants: cachesim never does I/O and never prints; it reads traces only through
//! [`trace_io::TraceView`]; it does not depend on the saliency crate (keep sets come as id lists).
//!
//! ## Readings of SEMANTICS.md §5 where the text leaves room
//! - Credits of `near_pick` and `near_pick_ema` use F, the *kept* candidates, and ranks within F
//!   (an expert that is not kept can never be cached, so its credit would never matter).
//!   `inv_router`'s softmax is over all m recorded candidates, kept or not, as the text says.
//! - Policy state evolves from token 0: the warmup only stops counting, not caching or crediting.
//! - The LRU clock counts chosen picks only (forced misses have no expert and touch no state).
//! - `belady` in sequential mode: an expert still to be processed later in the same token has
//!   next use = the current token, so it is the last to be evicted (ties: lowest id).
//! - `reset_at_sequence` empties the caches and forgets all policy state (frequencies, credits,
//!   scores) at each recorded sequence start; `belady`'s next use then never looks past the end of
//!   the current sequence. Warmup and the token count still run over the whole trace.
//! - `near_pick`: an expert that never stood in F at rank < N has the lowest credit (below token 0).

mod config;
pub mod deploy;
mod engine;
mod error;
pub mod exp;
pub mod hybrid;
mod keep;
pub mod mrc;
mod policy;
pub mod prefetch;
mod reads;
pub mod reference;
mod request;
mod schedule;
pub mod shared_cache;
pub mod shuffle;
pub mod timeline;

use serde::{Deserialize, Serialize};
use trace_io::{Shape, TraceView};

pub use config::{ParseNameError, ReplayConfig, Semantics};
pub use error::{CacheSimError, Result};
pub use keep::Keep;
pub use policy::{Credits, OnePass, Policy, PolicyFacts, Shares};
pub use prefetch::{
    CoactTable, ParsePrefetchError, Predictor, PredictorFacts, Prefetch, PrefetchCounts, PrefetchOptions,
    PrefetchReplay, replay_prefetch, replay_prefetch_on, validate_prefetch,
};
pub use reads::{replay_reads, runs_reads};
pub use request::{Replay, ReplayPath, Replayed};
pub use schedule::Sharing;
pub use timeline::{Timeline, TimelineDevice};

/// The counts of one replay (SEMANTICS.md §5 "Results").
///
/// Counting starts at token W (the warmup); everything before only warms the caches.
/// `picks`, `hits`, `misses`, `forced_misses`, `substituted` and `pruned_slots` are summed over
/// layers; `layer_misses[l]` is the misses of layer index `l`.
/// Invariants: `hits + misses == picks == tokens · L · k_used`, `forced_misses <= misses`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayCounts {
    /// Tokens counted: max(T − W, 0). The same for every layer, so NOT multiplied by L.
    pub tokens: u64,
    /// Expert slots looked up: `k_used` per counted token and layer.
    pub picks: u64,
    /// Picks whose expert was already cached.
    pub hits: u64,
    /// Picks that load an expert (cache misses plus forced misses).
    pub misses: u64,
    /// Slots with no kept candidate left to fill them (k_used − n per token and layer), included
    /// in `misses`.
    pub forced_misses: u64,
    /// Chosen experts that are not among the row's unconstrained first k_used ids (pruning or
    /// cache-aware routing picked another expert).
    pub substituted: u64,
    /// Of the row's first k_used ids, the ones the keep set removed.
    pub pruned_slots: u64,
    /// Misses per layer index, `[L]`.
    pub layer_misses: Vec<u64>,
}

impl ReplayCounts {
    /// hits / picks, 0 when nothing was picked.
    pub fn hit_rate(&self) -> f64 {
        if self.picks == 0 { 0.0 } else { self.hits as f64 / self.picks as f64 }
    }

    /// misses / tokens counted (all layers together: expert loads per token), 0 when no token
    /// was counted.
    pub fn misses_per_token(&self) -> f64 {
        if self.tokens == 0 { 0.0 } else { self.misses as f64 / self.tokens as f64 }
    }
}

/// Counts of one layer, summed into [`ReplayCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LayerCounts {
    pub picks: u64,
    pub hits: u64,
    pub misses: u64,
    pub forced_misses: u64,
    pub substituted: u64,
    pub pruned_slots: u64,
}

impl LayerCounts {
    /// Step 3 of SEMANTICS.md §5 for one counted row: its k slots are picks, the k − n that F
    /// cannot fill are forced misses, with the row's substituted and pruned slots. Both loops
    /// (the token loop and the deployed step loop) count with it.
    #[inline(always)]
    pub(crate) fn add_selection(&mut self, k: usize, n: usize, pruned: usize, substituted: usize) {
        let forced = (k - n) as u64;
        self.picks += k as u64;
        self.misses += forced;
        self.forced_misses += forced;
        self.substituted += substituted as u64;
        self.pruned_slots += pruned as u64;
    }
}

impl ReplayCounts {
    pub(crate) fn from_layers(shape: &Shape, warmup: usize, layers: &[LayerCounts]) -> ReplayCounts {
        let mut c = ReplayCounts {
            tokens: shape.tokens.saturating_sub(warmup) as u64,
            layer_misses: layers.iter().map(|l| l.misses).collect(),
            ..ReplayCounts::default()
        };
        for l in layers {
            c.picks += l.picks;
            c.hits += l.hits;
            c.misses += l.misses;
            c.forced_misses += l.forced_misses;
            c.substituted += l.substituted;
            c.pruned_slots += l.pruned_slots;
        }
        c
    }
}

/// Checks a configuration against a trace's shape before any work (SEMANTICS.md §5, §8.6).
///
/// # Errors
/// - [`CacheSimError::InvalidParameter`]: `k_used` = 0, `cap` = 0, λ negative or not finite,
///   decay outside (0, 1] or whose inverse overflows, `belady` or `near_pick` on a trace of 2^32 tokens or more.
/// - [`CacheSimError::KUsedAboveCandidates`]: `k_used` > m.
/// - [`CacheSimError::CapBelowKUsed`]: `cap` < `k_used`.
/// - [`CacheSimError::LayerCapBelowKUsed`]: a per-layer cap < `k_used`.
/// - [`CacheSimError::WarmupCoversTrace`]: warmup >= the trace's tokens (nothing would count).
/// - [`CacheSimError::OfflineWithLambda`]: an offline policy (`belady`) with λ > 0.
/// - [`CacheSimError::NeedsScores`]: λ > 0 or `inv_router` on a trace without scores.
/// - [`CacheSimError::NoRoomForRouting`]: λ > 0 and m == `k_used`.
pub fn validate(shape: &Shape, has_scores: bool, cfg: &ReplayConfig) -> Result<()> {
    let k_used = cfg.k_used_or(shape.top_k);
    let invalid = |name, value: String, reason| Err(CacheSimError::InvalidParameter { name, value, reason });
    if k_used == 0 {
        return invalid("k_used", "0".into(), "must be at least 1");
    }
    // Before the caps' values: a list of the wrong length is the first thing to say.
    if let Some(caps) = cfg.layer_caps.as_ref().filter(|c| c.len() != shape.layers) {
        let value = format!("{} values for {} layers", caps.len(), shape.layers);
        return invalid("layer_caps", value, "need one cap per trace layer");
    }
    if cfg.cap == 0 {
        return invalid("cap", "0".into(), "must be at least 1");
    }
    if !cfg.lambda.is_finite() || cfg.lambda < 0.0 {
        return invalid("lambda", cfg.lambda.to_string(), "must be finite and >= 0");
    }
    if !(cfg.decay > 0.0 && cfg.decay <= 1.0) {
        return invalid("decay", cfg.decay.to_string(), "must be in (0, 1]");
    }
    if !(1.0 / cfg.decay).is_finite() {
        // The lazy decay multiplies by 1/d (SEMANTICS.md §5).
        return invalid("decay", cfg.decay.to_string(), "1/decay must be finite (decay >= 5.6e-309)");
    }
    if k_used > shape.candidates {
        return Err(CacheSimError::KUsedAboveCandidates { k_used, candidates: shape.candidates });
    }
    // Before the base cap: with per-layer caps the base cap is often their minimum, and the
    // layer is what to name.
    if let Some((layer, &cap)) = cfg.layer_caps.iter().flatten().enumerate().find(|&(_, &c)| c < k_used) {
        return Err(CacheSimError::LayerCapBelowKUsed { layer, cap, k_used });
    }
    if cfg.cap < k_used {
        return Err(CacheSimError::CapBelowKUsed { cap: cfg.cap, k_used });
    }
    if cfg.warmup >= shape.tokens {
        return Err(CacheSimError::WarmupCoversTrace { warmup: cfg.warmup, tokens: shape.tokens });
    }
    let facts = cfg.policy.facts();
    if !facts.allows_lambda() && cfg.lambda > 0.0 {
        return Err(CacheSimError::OfflineWithLambda { policy: cfg.policy, lambda: cfg.lambda });
    }
    if facts.token_indices && u32::try_from(shape.tokens).is_err() {
        return invalid("policy", cfg.policy.to_string(), "token indices are recorded as u32: at most 2^32 - 1 tokens");
    }
    if cfg.lambda > 0.0 && !has_scores {
        return Err(CacheSimError::NeedsScores { what: "cache-aware routing (lambda > 0)".into() });
    }
    if facts.needs_scores() && !has_scores {
        return Err(CacheSimError::NeedsScores { what: format!("policy {}", cfg.policy) });
    }
    if cfg.lambda > 0.0 && shape.candidates == k_used {
        return Err(CacheSimError::NoRoomForRouting { k_used, candidates: shape.candidates });
    }
    Ok(())
}

/// Refuses a view not validated for `need` (what a replay reads, [`replay_reads`]).
pub(crate) fn require(trace: &TraceView<'_>, need: trace_io::Reads) -> Result<()> {
    trace.require(need).map_err(|e| match e {
        trace_io::TraceError::NotValidated { needed, validated } => CacheSimError::NotValidated { needed, validated },
        other => CacheSimError::NotValidated { needed: need.to_string(), validated: other.to_string() },
    })
}

/// Replays `trace` through the caches of `cfg` with the keep set `keep` (SEMANTICS.md §5).
///
/// Validates first ([`validate`], and the keep set's shape), then runs the layers in parallel on
/// the rayon pool; the result does not depend on the thread count.
///
/// Memory per layer being replayed: a few arrays of E entries, plus for `near_pick` and `belady`
/// a count per token index (4 bytes × T, e.g. 512 KiB for 131,072 tokens) and for `belady` the
/// next use of every pick (4 bytes × T × k_used).
///
/// # Errors
/// As [`validate`], plus [`CacheSimError::KeepMismatch`] when `keep` does not have the trace's
/// L and E, and [`CacheSimError::NotValidated`] when the view was not validated for what the
/// replay reads ([`replay_reads`]).
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig) -> Result<ReplayCounts> {
    let mut counts = replay_many(trace, &[(keep, cfg)], &|_| {})?;
    Ok(counts.pop().expect("one count per configuration"))
}

/// Replays several configurations of one trace, layer by layer, sharing the work they have in
/// common (values that depend only on the trace, SEMANTICS.md §5):
/// - When two or more `inv_router` configurations are among them, the softmax of every row is
///   computed once per layer for all of them.
/// - Configurations replay one keep set after another; when two or more prune the layer with
///   the same set, F (the kept candidates of every row, SEMANTICS.md §5 step 1) is built once
///   for the layer and read by all of them.
/// - The configurations of one keep set on a layer run in one pass over its rows, a block of
///   tokens at a time for all of them ([`Sharing::Lockstep`]).
/// - The work is cut into tasks as [`replay_many_traces`] says.
///
/// The counts are those of [`replay`] for each configuration, in the order of `runs`, whatever
/// the thread count.
///
/// Memory per task in flight: for the `inv_router` configurations that share the softmax, a
/// table of T · m `f64` (e.g. 64 MiB for 131,072 tokens of 64 candidates); and one F table of
/// 4 · T · m bytes (32 MiB there) per worker thread, rebuilt in place from task to task and
/// freed when the call returns.
/// `progress(tokens)` is called from worker threads with the number of tokens replayed; the
/// calls add up to the trace's token count per (layer, configuration).
///
/// # Errors
/// As [`replay`], for the first configuration that fails; nothing is replayed then.
pub fn replay_many(
    trace: &TraceView<'_>,
    runs: &[(&Keep, &ReplayConfig)],
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<ReplayCounts>> {
    let mut counts = replay_many_traces(std::slice::from_ref(trace), runs, progress)?;
    Ok(counts.pop().expect("one trace"))
}

/// [`replay_many`] on several traces at once (a sweep's in-sample and out-of-sample traces):
/// `result[t][i]` is the counts of `runs[i]` on `traces[t]`, each equal to [`replay`]'s.
///
/// The work is cut into tasks of one trace, one layer and one set of configurations that share
/// work (the configurations of one keep set; or, when two or more `inv_router` configurations
/// are among them, all of them, which share the softmax and F), and the rayon pool takes them from one queue: the longest
/// trace first (ties in the order of `traces`), layer by layer, within a layer the costliest set
/// first (by an estimate: picks × instructions per pick of their policies), so that the short
/// tasks fill the end and no core idles while another finishes a long layer.
/// Memory: that of [`replay_many`] per task in flight.
///
/// # Errors
/// As [`replay`], for the first configuration (in the order of `traces`, then `runs`) that fails;
/// nothing is replayed then.
pub fn replay_many_traces(
    traces: &[TraceView<'_>],
    runs: &[(&Keep, &ReplayConfig)],
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Vec<ReplayCounts>>> {
    replay_many_traces_with(traces, runs, Sharing::default(), progress)
}

/// [`replay_many_traces`] with the configurations that share a keep set on a layer run as
/// `sharing` says: in one pass over the rows ([`Sharing::Lockstep`], the default) or one after
/// another ([`Sharing::PerConfig`]); the counts are the same.
///
/// # Errors
/// As [`replay_many_traces`].
pub fn replay_many_traces_with(
    traces: &[TraceView<'_>],
    runs: &[(&Keep, &ReplayConfig)],
    sharing: Sharing,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Vec<ReplayCounts>>> {
    schedule::replay_many_traces(traces, runs, sharing, progress)
}
