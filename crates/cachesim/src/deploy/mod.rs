//! Deployments as runtimes run them (SEMANTICS.md §9–§11): a pinned hot set per layer, a second
//! memory tier under the cache, and served replay in engine steps (recorded, or re-batched from
//! a trace's sequences).
//!
//! This is not a loop of its own: tier 1 is a `Steps` part of the one step loop
//! (`crate::engine::run_rows`), chosen once per layer, outside the loop, and monomorphized per
//! tier-1 policy (each policy's `Prio` form); the plain replay of §5 (`crate::replay`) keeps its
//! instruction count. Tier 2 runs after tier 1, over its recorded misses, monomorphized per
//! tier-2 policy. Every buffer is allocated before the loops; no `Result`, no dynamic dispatch.
//!
//! Map:
//! - `Deployment`, `Schedule`, [`Tier2`]: what to replay beyond a `ReplayConfig`.
//! - `validate`: refuses every configuration this path does not support, with the reason.
//! - `replay`: the counts (`DeployCounts`), layers in parallel.
//! - `steps`: the engine steps (per token, recorded `step_offsets`, or re-batched).
//! - `level`: one tier's cache and the step rule of §11 step 3 (which is §5 step 4 when a
//!   step's set fits in the cache).
//! - `freq`: lfu's key order as count nodes, so that a level finds its victim without a scan.
//! - `heap`: an indexed heap on the keys of the policies whose keys change outside accesses
//!   (belady, near_pick, near_pick_ema, inv_router), told of every change by the policy.
//! - `prio`: the priorities of §5 and §11 step 4, one type per policy.
//! - `layer`: tier 1 of one layer as the step loop's residency (`Tiers`: plan order, pins, the
//!   step's set through the cache, credits per step, the tier-2 record) and tier 2's driver.
//!
//! ## Readings of SEMANTICS.md §9–§11 where the text leaves room
//! - Per-token replay is served replay with one row per step (§11 says the counts are §5's):
//!   this path runs it that way, and a test checks it against the plain replayer.
//! - Tier 2 under served replay: a step's tier-2 requests (its tier-1 misses that are not forced,
//!   distinct, in miss order) may outnumber C2; they are processed with the rule of §11 step 3
//!   (which is §5's k-way rule whenever they fit).
//! - Cache-aware routing counts pinned experts and tier-1 cached experts as resident, not
//!   tier-2 ones (tier 2 is not fast memory).
//! - A re-batched trace is a new served trace: "token index" for the warmup is a row's position
//!   in the new order, so a step counts when its first position is >= W.
//! - Forced misses are counted in `misses` (as in §5) but request nothing from tier 2 and are
//!   not storage reads.
//! - Not supported here (refused by `validate`): sequential semantics and resets at sequence
//!   starts with any deployment feature; served replay together with re-batching.

mod freq;
pub(crate) mod heap;
mod layer;
mod level;
pub(crate) mod prio;
mod steps;

pub(crate) use layer::replay_layer_with;
pub(crate) use steps::StepPlan;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use trace_io::{Shape, TraceView};

pub use steps::rebatch_order;

use crate::{CacheSimError, Keep, Policy, ReplayConfig, ReplayCounts, Result, Semantics};

/// The second memory tier of SEMANTICS.md §10: policy and capacity (experts per layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tier2 {
    /// lru, fifo, lfu or belady (the credit policies need candidates tier 2 does not see).
    pub policy: Policy,
    /// C2, experts per layer; must be >= `k_used`.
    pub cap: usize,
}

/// Error of parsing a [`Tier2`] from `POLICY:CAP`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseTier2Error {
    /// No `:` between policy and capacity.
    #[error("expected POLICY:CAP, e.g. lru:32")]
    Form,
    /// The policy is not a policy name (the message names those tier 2 takes).
    #[error("unknown policy {:?}; tier 2 takes {}", .0.given, Tier2::allowed_policies())]
    Policy(crate::ParseNameError),
    /// The capacity is not a whole number.
    #[error("{given:?} is not a whole number of experts")]
    Cap {
        /// The text after the `:`.
        given: String,
        /// Why it is not a number.
        #[source]
        source: std::num::ParseIntError,
    },
}

impl Tier2 {
    /// The policies that may serve as tier 2, from their facts (`PolicyFacts::may_be_tier2`),
    /// as prose: `lru, fifo, lfu, belady, perfect_lfu or lfru`.
    pub fn allowed_policies() -> String {
        let names: Vec<&str> = Policy::ALL.iter().filter(|p| p.facts().may_be_tier2()).map(|p| p.as_str()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }
}

impl std::str::FromStr for Tier2 {
    type Err = ParseTier2Error;
    /// `POLICY:CAP`, e.g. `lru:32`; whether the policy may serve as tier 2 and whether CAP >=
    /// `k_used` are checked by [`validate`], not here.
    fn from_str(s: &str) -> std::result::Result<Tier2, ParseTier2Error> {
        let (p, c) = s.split_once(':').ok_or(ParseTier2Error::Form)?;
        let policy = p.parse().map_err(ParseTier2Error::Policy)?;
        let cap = c.parse().map_err(|source| ParseTier2Error::Cap { given: c.to_string(), source })?;
        Ok(Tier2 { policy, cap })
    }
}

/// The unit of time of a replay (SEMANTICS.md §11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Schedule {
    /// One token per step, in trace order (SEMANTICS.md §5).
    #[default]
    PerToken,
    /// The engine steps the trace records in `step_offsets`.
    Served,
    /// Re-batching: B slots take the trace's sequences (`seq_offsets`) as §11 says.
    Rebatch(usize),
}

/// What a replay adds to a [`ReplayConfig`] (SEMANTICS.md §9–§11). `Deployment::default()` is
/// the plain replay of §5.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Deployment {
    /// §9: experts pinned per layer (a keep-map-shaped set; it must be a subset of the keep set).
    pub pins: Option<Keep>,
    /// §10: a second tier under the cache.
    pub tier2: Option<Tier2>,
    /// §11: the unit of time.
    pub schedule: Schedule,
}

impl Deployment {
    /// Whether this is the plain replay of §5 with a cap >= 1 (no pins, one tier, per token):
    /// then [`crate::replay`] gives the same counts, faster.
    pub fn is_plain(&self, cfg: &ReplayConfig) -> bool {
        self.pins.is_none()
            && self.tier2.is_none()
            && self.schedule == Schedule::PerToken
            && cfg.cap > 0
            && cfg.layer_caps.as_ref().is_none_or(|c| c.iter().all(|&c| c > 0))
    }
}

/// The counts of a deployed replay: the §5 counts plus those of §9–§11.
///
/// In served replay `counts.tokens` is the rows counted and hits and misses count per (step,
/// expert), so `hits + misses` may be below `picks`; `counts.misses` keeps its §5 meaning
/// (tier-1 misses, forced ones included).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployCounts {
    /// The counts of §5 (§11: per row for picks, forced misses, substituted, pruned slots; per
    /// (step, expert) for hits and misses).
    pub counts: ReplayCounts,
    /// Hits on pinned experts (included in `counts.hits`), §9.
    pub pinned_hits: u64,
    /// Tier-1 misses served by tier 2, §10 (0 without tier 2).
    pub t2_hits: u64,
    /// Reads from storage: tier-2 misses with tier 2, else the tier-1 misses that are not forced.
    pub storage_reads: u64,
    /// Engine steps counted (§11; = tokens counted per token).
    pub steps: u64,
    /// Rows counted (= `counts.tokens`).
    pub rows: u64,
    /// Pinned experts per layer index, `[L]` (memory per layer = pins + cap, §9).
    pub layer_pins: Vec<usize>,
}

impl DeployCounts {
    /// The deployed counts of a plain replay (§5): one row per step, nothing pinned, one tier
    /// (storage reads = misses that are not forced).
    pub fn from_plain(counts: ReplayCounts) -> DeployCounts {
        DeployCounts {
            pinned_hits: 0,
            t2_hits: 0,
            storage_reads: counts.misses - counts.forced_misses,
            steps: counts.tokens,
            rows: counts.tokens,
            layer_pins: vec![0; counts.layer_misses.len()],
            counts,
        }
    }

    /// hits / (hits + misses): the share of expert lookups served from fast memory, a lookup being
    /// a (row, slot) per token (§5, where hits + misses = picks, so this is `hit_rate`) and a
    /// (step, expert) plus each forced slot in served replay (§11, where hits count per (step,
    /// expert) and picks per row, so §5's `hit_rate` = hits / picks falls with the rows per step
    /// although fewer loads are made). 0 when nothing was looked up.
    pub fn lookup_hit_rate(&self) -> f64 {
        let lookups = self.counts.hits + self.counts.misses;
        if lookups == 0 { 0.0 } else { self.counts.hits as f64 / lookups as f64 }
    }

    /// misses / steps counted: expert loads per engine step, 0 when no step counted.
    pub fn loads_per_step(&self) -> f64 {
        if self.steps == 0 { 0.0 } else { self.counts.misses as f64 / self.steps as f64 }
    }
}

/// Counts of one layer beyond [`crate::LayerCounts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LayerExtra {
    pub pinned_hits: u64,
    pub t2_hits: u64,
    pub storage_reads: u64,
}

fn unsupported(what: &'static str, reason: &'static str) -> CacheSimError {
    CacheSimError::DeployUnsupported { what, reason }
}

/// Checks a configuration and deployment against a trace before any work.
///
/// `cap = 0` (and per-layer caps of 0) is allowed here (§9: no cache); any other cap must be >=
/// `k_used`. Everything else is checked as [`crate::validate`] does.
///
/// # Errors
/// Those of [`crate::validate`], plus:
/// - [`CacheSimError::NotValidated`]: the view was not validated for [`deploy_reads`].
/// - [`CacheSimError::KeepMismatch`] for a keep set or pin map without the trace's L and E.
/// - [`CacheSimError::PinNotKept`]: a pinned expert the keep set drops.
/// - [`CacheSimError::Tier2Policy`]: a tier-2 policy that may not serve there (its facts,
///   `PolicyFacts::may_be_tier2`: a policy with credits).
/// - [`CacheSimError::InvalidParameter`]: a tier-2 cap below `k_used`; re-batching with B = 0.
/// - [`CacheSimError::DeployUnsupported`]: served replay without `step_offsets`; re-batching
///   without `seq_offsets`; sequential semantics or resets at sequence starts with a deployment.
pub fn validate(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment) -> Result<()> {
    let shape = trace.shape();
    let k_used = cfg.k_used_or(shape.top_k);
    // §5's checks with the zero caps lifted to k_used (cap 0 is legal here).
    let lifted = ReplayConfig {
        cap: if cfg.cap == 0 { k_used.max(1) } else { cfg.cap },
        layer_caps: cfg
            .layer_caps
            .as_ref()
            .map(|c| c.iter().map(|&c| if c == 0 { k_used.max(1) } else { c }).collect()),
        ..cfg.clone()
    };
    crate::validate(&shape, trace.parts().scores.is_some(), &lifted)?;
    keep.check_shape(&shape)?;
    crate::require(trace, deploy_reads(&shape, keep, cfg))?;
    if cfg.semantics == Semantics::Sequential {
        return Err(unsupported("semantics sequential", "deployed replay (pins, tier 2, served, cap 0) is k-way only"));
    }
    if cfg.reset_at_sequence {
        return Err(unsupported("reset_at_sequence", "deployed replay does not reset caches at sequence starts"));
    }
    if let Some(pins) = &dep.pins {
        check_pins(&shape, keep, pins)?;
    }
    if let Some(t2) = dep.tier2 {
        if !t2.policy.facts().may_be_tier2() {
            return Err(CacheSimError::Tier2Policy { policy: t2.policy, allowed: Tier2::allowed_policies() });
        }
        if t2.cap < k_used {
            return Err(CacheSimError::InvalidParameter {
                name: "tier2 cap",
                value: t2.cap.to_string(),
                reason: "must be >= k_used (SEMANTICS.md §10)",
            });
        }
    }
    check_schedule(trace, dep.schedule, unsupported)
}

/// §9: pins of the trace's shape, each a kept expert.
///
/// # Errors
/// [`CacheSimError::KeepMismatch`] for another shape; [`CacheSimError::PinNotKept`] naming the
/// first pin `keep` drops.
pub(crate) fn check_pins(shape: &Shape, keep: &Keep, pins: &Keep) -> Result<()> {
    pins.check_shape(shape)?;
    for l in 0..shape.layers {
        if let Some(e) = (0..shape.num_experts).find(|&e| pins.is_kept(l, e) && !keep.is_kept(l, e)) {
            return Err(CacheSimError::PinNotKept { layer: l, expert: e });
        }
    }
    Ok(())
}

/// §11: the offsets a schedule reads are in the trace, and re-batching has B >= 1; a missing
/// offset is refused through `unsupported` (the deployed or the shared replay's error).
///
/// # Errors
/// [`CacheSimError::InvalidParameter`] for B = 0; `unsupported`'s error for missing offsets.
pub(crate) fn check_schedule(
    trace: &TraceView<'_>,
    schedule: Schedule,
    unsupported: fn(&'static str, &'static str) -> CacheSimError,
) -> Result<()> {
    match schedule {
        Schedule::PerToken => {}
        Schedule::Served if trace.step_offsets().is_none() => {
            return Err(unsupported("served replay", "the trace records no step_offsets (engine steps)"));
        }
        Schedule::Served => {}
        Schedule::Rebatch(0) => {
            return Err(CacheSimError::InvalidParameter {
                name: "batch",
                value: "0".into(),
                reason: "must be at least 1",
            });
        }
        Schedule::Rebatch(_) if trace.seq_offsets().is_none() => {
            return Err(unsupported("re-batching", "the trace records no seq_offsets (sequence starts)"));
        }
        Schedule::Rebatch(_) => {}
    }
    Ok(())
}

/// What a deployed replay reads of a trace (SEMANTICS.md §1): every candidate id of every row
/// (F is built whole), plus what [`crate::replay_reads`] asks for (scores for λ > 0 and
/// `inv_router`). A view must be validated for it ([`trace_io::TraceFile::view_for`]).
pub fn deploy_reads(shape: &Shape, keep: &Keep, cfg: &ReplayConfig) -> trace_io::Reads {
    crate::replay_reads(shape, keep, cfg).union(trace_io::Reads::ids(usize::MAX))
}

/// Replays `trace` with the deployment `dep` (SEMANTICS.md §9–§11), layers in parallel; the
/// result does not depend on the thread count. Always runs the deployed path, also for a plain
/// deployment (whose counts then equal [`crate::replay`]'s).
///
/// Memory per layer in flight: a few arrays of E entries, the step's sets (`rows · k_used`), the
/// tier-2 request stream (at most `T · k_used` experts) and, for belady, the next use of every
/// entry of the step sets.
///
/// # Errors
/// As [`validate`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment) -> Result<DeployCounts> {
    validate(trace, keep, cfg, dep)?;
    let shape = trace.shape();
    let plan = steps::StepPlan::new(trace, dep.schedule);
    let per_layer: Vec<(crate::LayerCounts, LayerExtra)> =
        (0..shape.layers).into_par_iter().map(|l| layer::replay_layer(trace, keep, cfg, dep, &plan, l)).collect();
    Ok(assemble(&shape, cfg, dep, &plan, &per_layer))
}

/// The step plan of `schedule` on `trace` (validated).
pub(crate) fn plan(trace: &TraceView<'_>, schedule: Schedule) -> StepPlan {
    StepPlan::new(trace, schedule)
}

/// `[steps]`: the rows of each step of `plan` that is counted (its first row position >= W),
/// `None` for the others.
pub(crate) fn step_rows(plan: &StepPlan, warmup: usize) -> Vec<Option<u32>> {
    (0..plan.steps())
        .map(|s| (plan.starts[s] >= warmup).then(|| (plan.starts[s + 1] - plan.starts[s]) as u32))
        .collect()
}

pub(crate) fn assemble(
    shape: &Shape,
    cfg: &ReplayConfig,
    dep: &Deployment,
    plan: &steps::StepPlan,
    per_layer: &[(crate::LayerCounts, LayerExtra)],
) -> DeployCounts {
    let layers: Vec<crate::LayerCounts> = per_layer.iter().map(|p| p.0).collect();
    let mut counts = ReplayCounts::from_layers(shape, cfg.warmup, &layers);
    let (steps, rows) = plan.counted(cfg.warmup);
    counts.tokens = rows;
    let mut out = DeployCounts {
        counts,
        steps,
        rows,
        layer_pins: (0..shape.layers).map(|l| dep.pins.as_ref().map_or(0, |p| p.kept_count(l))).collect(),
        ..DeployCounts::default()
    };
    for (_, x) in per_layer {
        out.pinned_hits += x.pinned_hits;
        out.t2_hits += x.t2_hits;
        out.storage_reads += x.storage_reads;
    }
    out
}
