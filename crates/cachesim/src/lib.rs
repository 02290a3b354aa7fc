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
mod engine;
mod error;
mod keep;
pub mod mrc;
pub mod reference;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use trace_io::{Shape, TraceView};

pub use config::{ParseNameError, Policy, ReplayConfig, Semantics};
pub use error::{CacheSimError, Result};
pub use keep::Keep;

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
///   decay outside (0, 1], `belady` or `near_pick` on a trace of 2^32 tokens or more.
/// - [`CacheSimError::KUsedAboveCandidates`]: `k_used` > m.
/// - [`CacheSimError::CapBelowKUsed`]: `cap` < `k_used`.
/// - [`CacheSimError::LayerCapBelowKUsed`]: a per-layer cap < `k_used`.
/// - [`CacheSimError::WarmupCoversTrace`]: warmup >= the trace's tokens (nothing would count).
/// - [`CacheSimError::BeladyWithLambda`]: `belady` with λ > 0.
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
    if cfg.policy == Policy::Belady && cfg.lambda > 0.0 {
        return Err(CacheSimError::BeladyWithLambda { lambda: cfg.lambda });
    }
    if matches!(cfg.policy, Policy::Belady | Policy::NearPick) && u32::try_from(shape.tokens).is_err() {
        return invalid("policy", cfg.policy.to_string(), "token indices are recorded as u32: at most 2^32 - 1 tokens");
    }
    if cfg.lambda > 0.0 && !has_scores {
        return Err(CacheSimError::NeedsScores { what: "cache-aware routing (lambda > 0)" });
    }
    if cfg.policy == Policy::InvRouter && !has_scores {
        return Err(CacheSimError::NeedsScores { what: "policy inv_router" });
    }
    if cfg.lambda > 0.0 && shape.candidates == k_used {
        return Err(CacheSimError::NoRoomForRouting { k_used, candidates: shape.candidates });
    }
    Ok(())
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
/// L and E.
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig) -> Result<ReplayCounts> {
    let mut counts = replay_many(trace, &[(keep, cfg)], &|_| {})?;
    Ok(counts.pop().expect("one count per configuration"))
}

/// Replays several configurations of one trace, layer by layer, sharing the work they have in
/// common:
/// - `near_pick_ema` and `inv_router` configurations (k-way mode) whose scores evolve alike
///   (the same decay and sequence resets; for `near_pick_ema` also the same N and the same kept
///   experts in the layer) share one computation of every expert's score per token, however
///   their cap, λ, j, k_used or warmup differ: each reads its cached experts' scores from it in
///   its victim selection instead of decaying and crediting every kept expert itself.
/// - When two or more other `inv_router` configurations remain, the softmax of every row (whose
///   `exp` calls are most of that policy's cost) is computed once per layer for all of them.
/// - The other configurations replay one keep set after another; when two or more prune the
///   layer with the same set, F (the kept candidates of every row, SEMANTICS.md §5 step 1) is
///   built once for the layer and read by all of them.
/// - The work is cut into tasks as [`replay_many_traces`] says.
///
/// The counts are those of [`replay`] for each configuration, in the order of `runs`, whatever
/// the thread count.
///
/// Runs as [`replay_many_traces`]: tasks of one layer and one set of configurations that share
/// work, on the rayon pool, layer by layer (a layer's ids and scores stay in cache); the
/// configurations that share scores advance together, one block of tokens at a time. Memory
/// per task in flight: for a group sharing scores, a block of rows of 8 · E bytes each
/// (512 KiB, and at least 17 rows); for the `inv_router` configurations that share the softmax,
/// a table of T · m `f64` (e.g. 64 MiB for 131,072 tokens of 64 candidates); and one F table
/// of 4 · T · m bytes (32 MiB there) per worker thread, rebuilt in place from task to task and
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
/// work (a group sharing scores; the configurations of one keep set; or, when two or more
/// `inv_router` configurations are outside the groups, all the configurations outside them,
/// which share the softmax and F), and the rayon pool takes them from one queue: the longest
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
    replay_many_in_blocks(traces, runs, progress, |shape| (TRACK_BLOCK_BYTES / (8 * shape.num_experts.max(1))).max(16))
}

/// The bytes of one block of rows of shared scores (see [`replay_many`]).
const TRACK_BLOCK_BYTES: usize = 512 << 10;

/// What makes the scores of two `near_pick_ema` or `inv_router` configurations evolve alike on a
/// layer.
#[derive(PartialEq)]
struct TrackKey<'a> {
    decay: u64,
    reset: bool,
    /// near_pick_ema: N and the layer's keep mask; `None` for `inv_router`, which credits every
    /// candidate (so this also tells the two policies apart).
    ema: Option<(usize, &'a [bool])>,
}

impl<'a> TrackKey<'a> {
    /// The key of `cfg` on a layer where it keeps `mask`, if its scores can be shared.
    fn of(cfg: &ReplayConfig, mask: &'a [bool]) -> Option<TrackKey<'a>> {
        let ema = match cfg.policy {
            Policy::NearPickEma => Some((cfg.near_pick_n, mask)),
            Policy::InvRouter => None,
            _ => return None,
        };
        (cfg.semantics == Semantics::KWay).then_some(TrackKey {
            decay: cfg.decay.to_bits(),
            reset: cfg.reset_at_sequence,
            ema,
        })
    }
}

/// Configurations of one layer replayed together in one task of [`replay_many_traces`].
enum Unit<'a> {
    /// Replayed one after another, one keep set after another: those that prune the layer with
    /// the same set (two or more) read one F table; `inv_router` ones (two or more) read one
    /// softmax table.
    Plain(Vec<usize>),
    /// Scores that evolve alike: one shared computation, the members advanced a block at a time.
    Tracked(TrackKey<'a>, Vec<usize>),
}

impl Unit<'_> {
    fn members(&self) -> &[usize] {
        match self {
            Unit::Plain(m) | Unit::Tracked(_, m) => m,
        }
    }
}

/// Splits layer `l`'s configurations into units: groups of two or more that share scores, then
/// the rest by keep set, or, when two or more `inv_router` configurations are among the rest
/// (they share the softmax), the rest as one unit.
fn layer_units<'a>(runs: &[(&'a Keep, &ReplayConfig)], l: usize) -> Vec<Unit<'a>> {
    let mut groups: Vec<(TrackKey<'a>, Vec<usize>)> = Vec::new();
    for (i, (keep, cfg)) in runs.iter().enumerate() {
        if let Some(key) = TrackKey::of(cfg, keep.layer_mask(l)) {
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, members)) => members.push(i),
                None => groups.push((key, vec![i])),
            }
        }
    }
    groups.retain(|(_, members)| members.len() >= 2);
    let mut done = vec![false; runs.len()];
    for &i in groups.iter().flat_map(|(_, members)| members) {
        done[i] = true;
    }
    let mut units: Vec<Unit<'a>> = groups.into_iter().map(|(key, members)| Unit::Tracked(key, members)).collect();
    let untracked: Vec<usize> = (0..runs.len()).filter(|&i| !done[i]).collect();
    if untracked.iter().filter(|&&i| runs[i].1.policy == Policy::InvRouter).count() >= 2 {
        // They share the softmax, and F with the others of their keep set: one unit.
        units.push(Unit::Plain(untracked));
        return units;
    }
    units.extend(
        by_keep_set(runs, l, &untracked)
            .into_iter()
            .map(|set| Unit::Plain(set.iter().map(|&p| untracked[p]).collect())),
    );
    units
}

/// `members` (indices into `runs`) split by their keep set of layer `l`, in order of first
/// appearance: positions in `members`.
fn by_keep_set(runs: &[(&Keep, &ReplayConfig)], l: usize, members: &[usize]) -> Vec<Vec<usize>> {
    let mut sets: Vec<(&[bool], Vec<usize>)> = Vec::new();
    for (p, &i) in members.iter().enumerate() {
        let mask = runs[i].0.layer_mask(l);
        match sets.iter_mut().find(|(m, _)| *m == mask) {
            Some((_, set)) => set.push(p),
            None => sets.push((mask, vec![p])),
        }
    }
    sets.into_iter().map(|(_, set)| set).collect()
}

/// An estimate of a unit's cost on a layer of a trace of `shape`, only to order the tasks
/// (costliest first): per member, its picks (tokens × k_used) times the instructions per pick of
/// its policy measured with callgrind on the seed-scale trace (docs/performance.md, "Sixth
/// round"), shared scores included.
fn unit_cost(runs: &[(&Keep, &ReplayConfig)], unit: &Unit<'_>, shape: &Shape) -> u64 {
    let tracked = matches!(unit, Unit::Tracked(..));
    unit.members()
        .iter()
        .map(|&i| {
            let cfg = runs[i].1;
            let base = match cfg.policy {
                Policy::Lru | Policy::Fifo => 100,
                Policy::Lfu => 160,
                Policy::Belady => 140,
                Policy::NearPick => 290,
                Policy::NearPickEma if tracked => 310,
                Policy::NearPickEma => 350,
                Policy::InvRouter if tracked => 420,
                Policy::InvRouter => 810,
            };
            let per_pick = base + if cfg.lambda > 0.0 { 70 } else { 0 };
            per_pick * (shape.tokens * cfg.k_used.unwrap_or(shape.top_k)) as u64
        })
        .sum()
}

/// Replays one unit on layer `l` of `trace`: the counts of its members, in its order. `f_table`
/// is the worker's F table, rebuilt here when the unit needs one.
fn replay_unit(
    trace: &TraceView<'_>,
    l: usize,
    runs: &[(&Keep, &ReplayConfig)],
    unit: &Unit<'_>,
    progress: &(dyn Fn(usize) + Sync),
    block: usize,
    f_table: &mut engine::FTable,
) -> Vec<LayerCounts> {
    let shape = trace.shape();
    let scores = trace.layer_scores(l);
    let params = |i: usize| {
        let cfg = runs[i].1;
        let mut params = engine::Params::new(&shape, cfg, trace.seq_offsets());
        params.cap = cfg.cap_of(l);
        params
    };
    let input = |i: usize| engine::LayerInput {
        ids: trace.layer_ids(l),
        scores,
        keep: runs[i].0.layer_mask(l),
        probs: None,
        f_table: None,
    };
    match unit {
        Unit::Plain(members) => {
            let share_softmax = members.iter().filter(|&&i| runs[i].1.policy == Policy::InvRouter).count() >= 2;
            let probs = scores.filter(|_| share_softmax).map(|z| engine::softmax_layer(z, shape.candidates));
            let mut counts = vec![LayerCounts::default(); members.len()];
            // One keep set after another, one F table alive at a time.
            for same in by_keep_set(runs, l, members) {
                let mask = runs[members[same[0]]].0.layer_mask(l);
                let table = (same.len() >= 2 && !mask.iter().all(|&kept| kept))
                    .then(|| f_table.rebuild(trace.layer_ids(l), mask, shape.candidates));
                for b in same {
                    let i = members[b];
                    let inp = engine::LayerInput {
                        probs: probs.as_deref().filter(|_| runs[i].1.policy == Policy::InvRouter),
                        f_table: table,
                        ..input(i)
                    };
                    counts[b] = engine::replay_layer(&params(i), &inp);
                    progress(shape.tokens);
                }
            }
            counts
        }
        Unit::Tracked(key, members) => {
            let credit = match key.ema {
                Some((n, mask)) => engine::TrackCredit::Ema { n, keep: mask },
                None => engine::TrackCredit::Router,
            };
            let mut track = engine::TrackedScores::new(&params(members[0]), &input(members[0]), credit, block);
            let mut replays: Vec<engine::TrackedRun<'_>> =
                members.iter().map(|&i| engine::TrackedRun::new(params(i), input(i))).collect();
            for start in (0..shape.tokens).step_by(block) {
                let rows = track.fill(start..(start + block).min(shape.tokens));
                replays = replays.into_iter().map(|r| r.advance(rows)).collect();
                progress(members.len() * rows.len());
            }
            replays.iter().map(|r| r.counts()).collect()
        }
    }
}

/// [`replay_many_traces`] with shared scores computed `block(shape)` tokens at a time.
fn replay_many_in_blocks(
    traces: &[TraceView<'_>],
    runs: &[(&Keep, &ReplayConfig)],
    progress: &(dyn Fn(usize) + Sync),
    block: impl Fn(&Shape) -> usize + Sync,
) -> Result<Vec<Vec<ReplayCounts>>> {
    for trace in traces {
        let shape = trace.shape();
        for (keep, cfg) in runs {
            validate(&shape, trace.parts().scores.is_some(), cfg)?;
            keep.check_shape(&shape)?;
        }
    }
    // Every (trace, layer, unit), then a queue of them: the longest trace first, layer by layer
    // (a layer's ids and scores stay in cache while its units run), the costliest unit of a layer
    // first; the short trace's tasks come last and fill the end. Each task's counts depend only
    // on its inputs, so the order and the thread count change nothing but the time.
    let mut tasks: Vec<(usize, usize, Unit<'_>, u64)> = Vec::new();
    for (t, trace) in traces.iter().enumerate() {
        let shape = trace.shape();
        for l in 0..shape.layers {
            for unit in layer_units(runs, l) {
                let cost = unit_cost(runs, &unit, &shape);
                tasks.push((t, l, unit, cost));
            }
        }
    }
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| {
        let (t, l, _, cost) = &tasks[i];
        (std::cmp::Reverse(traces[*t].shape().tokens), *t, *l, std::cmp::Reverse(*cost))
    });
    // `par_bridge` hands the items out in order as threads become free; each worker keeps one F
    // table whose buffers serve all its tasks.
    let done: Vec<(usize, Vec<LayerCounts>)> = order
        .into_iter()
        .par_bridge()
        .map_init(engine::FTable::default, |f_table, i| {
            let (t, l, unit, _) = &tasks[i];
            let shape = traces[*t].shape();
            (i, replay_unit(&traces[*t], *l, runs, unit, progress, block(&shape), f_table))
        })
        .collect();
    let mut per_trace: Vec<Vec<Vec<LayerCounts>>> =
        traces.iter().map(|trace| vec![vec![LayerCounts::default(); trace.shape().layers]; runs.len()]).collect();
    for (i, counts) in done {
        let (t, l, unit, _) = &tasks[i];
        for (&run, c) in unit.members().iter().zip(counts) {
            per_trace[*t][run][*l] = c;
        }
    }
    Ok(traces
        .iter()
        .zip(per_trace)
        .map(|(trace, per_run)| {
            let shape = trace.shape();
            runs.iter()
                .zip(per_run)
                .map(|((_, cfg), layers)| ReplayCounts::from_layers(&shape, cfg.warmup, &layers))
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Configurations that share scores, advanced 7 tokens at a time (blocks end mid-sequence and
    /// at sequence starts), give the counts of `replay` and of the reference replayer: groups
    /// of near_pick_ema per keep map and of inv_router across keep maps, with caps, λ, j, k_used
    /// and warmups that differ, next to the ones that cannot share (sequential mode, another
    /// decay, a group of one). Two traces of different lengths go through one task queue.
    #[test]
    fn shared_scores_in_blocks_equal_replay() {
        let synth = trace_io::synth::SynthConfig {
            layers: 2,
            experts: 16,
            top_k: 3,
            candidates: 7,
            tokens: 300,
            sequences: 4,
            ..Default::default()
        };
        let trace = trace_io::synth::generate(&synth).expect("a valid synthetic trace");
        let short = trace_io::synth::generate(&trace_io::synth::SynthConfig { tokens: 180, seed: 9, ..synth })
            .expect("a valid synthetic trace");
        let view = trace.view();
        let shape = view.shape();
        let full = Keep::full(&shape);
        let pruned = Keep::from_layers(&shape, &[(0..16).step_by(2).chain([1, 3]).collect(), (4..16).collect()])
            .expect("a valid keep set");
        let mut cfgs = Vec::new();
        for policy in [Policy::NearPickEma, Policy::InvRouter] {
            for (cap, lambda, j, k_used, warmup, reset) in [
                (4, 0.0, 0, None, 0, false),
                (4, 0.12, 2, None, 5, false),
                (6, 0.5, 1, Some(2), 0, false),
                (5, 0.0, 0, None, 3, true),
                (3, 0.3, 2, None, 0, true),
            ] {
                cfgs.push(ReplayConfig {
                    lambda,
                    j,
                    k_used,
                    warmup,
                    reset_at_sequence: reset,
                    near_pick_n: 4,
                    ..ReplayConfig::new(policy, cap)
                });
            }
            // Outside the groups (and, pruned, reading one F table): at λ > 0 too.
            cfgs.push(ReplayConfig {
                semantics: Semantics::Sequential,
                lambda: 0.2,
                j: 1,
                ..ReplayConfig::new(policy, 4)
            });
            cfgs.push(ReplayConfig { decay: 0.9, ..ReplayConfig::new(policy, 4) });
        }
        let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().flat_map(|c| [(&full, c), (&pruned, c)]).collect();
        let steps = std::sync::atomic::AtomicUsize::new(0);
        let views = [view, short.view()];
        let many = replay_many_in_blocks(
            &views,
            &runs,
            &|tokens| {
                steps.fetch_add(tokens, std::sync::atomic::Ordering::Relaxed);
            },
            |_| 7,
        )
        .expect("valid configs");
        assert_eq!(steps.into_inner(), runs.len() * shape.layers * (300 + 180));
        assert_eq!(many.len(), 2);
        for (view, many) in views.iter().zip(&many) {
            for ((keep, cfg), got) in runs.iter().zip(many) {
                assert!(got.misses > 0 && got.hits > 0, "{cfg:?}");
                assert_eq!(got, &replay(view, keep, cfg).expect("valid config"), "{cfg:?}");
                assert_eq!(got, &reference::replay(view, keep, cfg).expect("valid config"), "{cfg:?}");
            }
        }
    }
}
