//! One cache shared by every layer (SEMANTICS.md §15.1): the OS page cache under `mmap`,
//! MoE-Infinity's expert cache, a GPU expert pool with one slot budget for all layers.
//!
//! Instead of a cache per layer (§5), one cache of C slots, each holding one (layer, expert)
//! pair. A token (or a step of §11, [`SharedCache::schedule`]) visits the traced layers in
//! increasing layer id; at each (t, l) §5 steps 1–3 run as for layer l and step 4 (§11 step 3)
//! goes through the one cache, whose victim is the cached pair of lowest priority outside
//! (t, l)'s chosen set (ties: lowest layer, then lowest expert). Pins (§9) stay per layer,
//! outside the shared cache.
//!
//! Map:
//! - [`SharedCache`]: the shared capacity and the pins; [`validate`] refuses what this path does
//!   not replay; [`replay`] gives [`SharedCounts`] (the §5/§9 counts per layer, and the slots
//!   each layer holds).
//! - `prio`: the priorities of §15.1, made comparable across layers, one type per policy.
//! - The loop itself is `crate::engine::shared_cache` (one pass over (token, layer), generic
//!   over the priority: no allocation, no `Result`, no dynamic dispatch inside).
//! - The plain replayer every count is checked against: [`crate::reference::shared::replay`].
//!
//! ## Readings of SEMANTICS.md §15.1 where the text leaves room
//! - The pick clock of lru, fifo, lfu and perfect_lfu, and the insertion time that breaks lfru's
//!   ties, count the picks that reach the shared cache over every layer in visiting order
//!   (t, then layer index); a pinned hit does not advance it (§15.2's last paragraph).
//! - `belady`: the next use of a pair is the position p = t · L + i of the next (t, l) whose
//!   chosen set (the λ = 0 selection, F[0..n]) holds it; never again sorts first. With resets at
//!   sequence starts it never looks past the current sequence.
//! - The slots a layer holds "over counted tokens" are sampled after each counted token (step)
//!   has visited every layer, a step weighing as many tokens as its rows; the mean is their sum
//!   / tokens (rows) counted.
//! - Served and re-batched (§11 with §15.1): per step, each layer in order runs §11 steps 1–3;
//!   step 3's set U of (step, layer) is protected, and when every cached pair is in it the
//!   victim is the lowest of U's pairs already processed, else the lowest of all. Belady's next
//!   use is the next position s · L + i whose set holds the pair; λ > 0 sees the cache as it
//!   stands at the start of the (step, layer); credits once per (step, layer), every row's own.
//! - `cap` = C = 0 is allowed with or without pins (§9's cap 0): every unpinned pick misses and
//!   nothing stays; otherwise C >= k_used. C may exceed E (and L · E: nothing is then evicted).
//! - `reset_at_sequence` empties the shared cache and forgets every layer's policy state at each
//!   recorded sequence start, as §5's readings say for per-layer caches.
//! - Not replayed here: per-layer caps (`layer_caps`: the shared cache replaces them), hybrid
//!   execution (§14), and, with served or re-batched steps, sequential semantics and resets (as
//!   the deployed path); a second tier (§10) and prefetch (§12) are errors by §15.1. The command
//!   layer refuses those combinations before coming here.

pub(crate) mod prio;

use serde::{Deserialize, Serialize};
use trace_io::{Shape, TraceView};

use crate::deploy::{DeployCounts, Schedule};
use crate::{CacheSimError, Keep, ReplayConfig, ReplayCounts, Result};

/// What a shared-cache replay adds to a [`ReplayConfig`] (SEMANTICS.md §15.1). The config's
/// `cap` is not read (the shared cache has `cap` slots in all), and its `layer_caps` must be
/// `None`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SharedCache {
    /// C: slots of the one cache, each a (layer, expert) pair. 0, or >= `k_used`.
    pub cap: usize,
    /// §9: experts pinned per layer, outside the shared cache (a subset of the keep set).
    pub pins: Option<Keep>,
    /// §11: the unit of time (per token, the recorded engine steps, or re-batching); in steps,
    /// §11 step 3 runs per (step, layer) in layer order with the one cache.
    pub schedule: Schedule,
}

/// The counts of a shared-cache replay: §5's per layer (`deploy.counts.layer_misses`), §9's
/// pinned hits and pins, and the slots each layer holds.
///
/// Invariants: `layer_slots_end` sums to at most `cap`; each entry of `layer_slot_tokens` is at
/// most `cap · deploy.counts.tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedCounts {
    /// The counts of §5 and §9 (one row per step, one tier).
    pub deploy: DeployCounts,
    /// C, the shared cache's slots.
    pub cap: usize,
    /// Slots each layer index holds when the replay ends, `[L]`.
    pub layer_slots_end: Vec<usize>,
    /// Σ over counted tokens of the slots each layer index holds after the token, `[L]`
    /// (slot · tokens; [`SharedCounts::layer_slots_mean`] divides by the tokens counted).
    pub layer_slot_tokens: Vec<u64>,
}

impl SharedCounts {
    /// Mean slots held per layer index over counted tokens, `[L]` (0 when none counted).
    pub fn layer_slots_mean(&self) -> Vec<f64> {
        let tokens = self.deploy.counts.tokens;
        self.layer_slot_tokens.iter().map(|&s| if tokens == 0 { 0.0 } else { s as f64 / tokens as f64 }).collect()
    }

    /// Assembles the counts from per-layer counts (`[L]`) and the occupancy.
    pub(crate) fn assemble(
        shape: &Shape,
        cfg: &ReplayConfig,
        shared: &SharedCache,
        layers: &[crate::LayerCounts],
        pinned_hits: u64,
        layer_slots_end: Vec<usize>,
        layer_slot_tokens: Vec<u64>,
    ) -> SharedCounts {
        let counts = ReplayCounts::from_layers(shape, cfg.warmup, layers);
        let layer_pins = (0..shape.layers).map(|l| shared.pins.as_ref().map_or(0, |p| p.kept_count(l))).collect();
        let deploy = DeployCounts { pinned_hits, layer_pins, ..DeployCounts::from_plain(counts) };
        SharedCounts { deploy, cap: shared.cap, layer_slots_end, layer_slot_tokens }
    }
}

/// Checks a shared-cache replay before any work (SEMANTICS.md §5, §9, §15.1).
///
/// # Errors
/// - As [`crate::validate`] for the configuration (with `cap` read as C, or as `k_used` when
///   C = 0).
/// - [`CacheSimError::CapBelowKUsed`]: 0 < C < `k_used`.
/// - [`CacheSimError::SharedUnsupported`]: `layer_caps` given; a policy without a shared
///   priority (the test-only `lfu_fifo`); more than 2^32 (layer, expert) pairs; served or
///   re-batched steps with sequential semantics or resets, or on a trace without the offsets
///   they need. [`CacheSimError::InvalidParameter`]: re-batching with B = 0.
/// - [`CacheSimError::KeepMismatch`]: the keep set or the pins do not have the trace's shape;
///   [`CacheSimError::PinNotKept`]: a pin the keep set drops.
/// - [`CacheSimError::NotValidated`]: the view was not validated for whole rows (and scores where
///   read).
pub fn validate(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, shared: &SharedCache) -> Result<()> {
    let shape = trace.shape();
    let k_used = cfg.k_used_or(shape.top_k);
    if cfg.layer_caps.is_some() {
        return Err(unsupported("layer_caps", "one shared cache replaces the per-layer caches (SEMANTICS.md §15.1)"));
    }
    let lifted = ReplayConfig { cap: shared.cap.max(k_used).max(1), ..cfg.clone() };
    crate::validate(&shape, trace.parts().scores.is_some(), &lifted)?;
    if shared.cap != 0 && shared.cap < k_used {
        return Err(CacheSimError::CapBelowKUsed { cap: shared.cap, k_used });
    }
    if !prio::supported(cfg.policy) {
        return Err(unsupported("this policy", "it has no priority comparable across layers"));
    }
    if u32::try_from(shape.layers.saturating_mul(shape.num_experts)).is_err() {
        return Err(unsupported("this trace", "a shared cache indexes at most 2^32 (layer, expert) pairs"));
    }
    keep.check_shape(&shape)?;
    if let Some(pins) = &shared.pins {
        crate::deploy::check_pins(&shape, keep, pins)?;
    }
    match shared.schedule {
        Schedule::PerToken => {}
        _ if cfg.semantics == crate::Semantics::Sequential => {
            return Err(unsupported("semantics sequential", "served and re-batched replay are k-way only"));
        }
        _ if cfg.reset_at_sequence => {
            return Err(unsupported("reset_at_sequence", "served and re-batched replay do not reset the cache"));
        }
        _ => {}
    }
    crate::deploy::check_schedule(trace, shared.schedule, unsupported)?;
    crate::require(trace, crate::deploy::deploy_reads(&shape, keep, cfg))
}

fn unsupported(what: &'static str, reason: &'static str) -> CacheSimError {
    CacheSimError::SharedUnsupported { what, reason }
}

/// Replays `trace` through one cache shared by every layer (SEMANTICS.md §15.1), per token or in
/// the engine steps of `shared.schedule` (§11), on one thread
/// (the layers of a token interact, so they cannot run apart).
///
/// Memory: a few arrays of L · E entries (positions, stamps, the policy's keys), the cache's C
/// slots, a step's set (rows · k_used), and for `belady` the next use of every entry of every
/// step's set (at most 8 bytes × T · L · k_used).
///
/// # Errors
/// As [`validate`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, shared: &SharedCache) -> Result<SharedCounts> {
    validate(trace, keep, cfg, shared)?;
    Ok(prio::with_prio(trace, keep, cfg, shared))
}
