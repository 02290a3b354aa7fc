//! Prefetch (SEMANTICS.md §12): before the demand accesses of (token t, layer l), a predictor
//! proposes up to B experts (the budget) and the ones not resident are loaded; then the token
//! replays as in §5. Counts the prefetch loads, the useful ones (first accessed by a demand hit
//! before eviction) and the wasted ones, and records for the timeline of §13
//! (`crate::timeline`) what each (t, l) loads.
//!
//! Map: `predictor` (the predictor table: [`Predictor`], its facts, the per-layer choice and
//! the dispatch, from one line per predictor), `predict` (the narrow trait of a predictor), one
//! file per predictor (`prev_token`, `coact`, `lookahead`, `oracle`: its facts, how it is built
//! for a layer, its proposals), `hook` (the loop's prefetch hook, generic over the policy and the
//! predictor, both chosen outside it), this file (configuration, validation, the driver).
//! A replay without prefetch and without timeline is `crate::replay`, untouched.
//!
//! Readings of §12 where the text leaves room:
//! - A proposal naming an expert the keep set prunes is dropped (a pruned expert does not exist
//!   in the pruned model); it still used its place in the budget (`lookahead` and `coact` read
//!   their list as §12 defines it, then drop pruned ids; `prev_token` and `oracle` never name
//!   one).
//! - A prefetch insert is an access at its own tick of the pick clock (lru, fifo, lfu, the
//!   last-access tie-breakers), before the token's demand picks.
//! - `coact` learns from the first k ids of every calibration row (k = the calibration trace's
//!   top-k: the experts the model used, §1), whatever the replay's `k_used`.
//! - `prev_token` proposes the previous token's chosen experts in processing order (the first
//!   B of them when B < k_used).

pub mod coact;
pub(crate) mod hook;
pub(crate) mod lookahead;
pub(crate) mod oracle;
pub(crate) mod predict;
mod predictor;
pub(crate) mod prev_token;

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use trace_io::TraceView;

pub use coact::CoactTable;
use coact::PrevChosen;
use hook::{Outputs, PfLayerCounts};
use predictor::{Choice, LayerAt, Visit};
pub use predictor::{Predictor, PredictorFacts};

use crate::config::ParseNameError;
use crate::policy::with_policy;
use crate::timeline::{LayerEvent, Timeline, TimelineDevice};
use crate::{CacheSimError, Keep, LayerCounts, ReplayConfig, ReplayCounts, Result};

/// A predictor with its per-token budget B (`PRED:B` on the command line, e.g. `coact:4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Prefetch {
    /// The predictor.
    pub predictor: Predictor,
    /// B: proposals per (token, layer), at most the cache capacity.
    pub budget: usize,
}

impl fmt::Display for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.predictor, self.budget)
    }
}

/// Error of parsing a [`Prefetch`] from `PRED:B`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParsePrefetchError {
    /// A predictor name without `:B`.
    #[error("{given:?} has no budget: expected PRED:B, e.g. {given}:4 (B proposals per token)")]
    NoBudget {
        /// The predictor given.
        given: String,
    },
    /// The part before `:` (or the whole text) is not a predictor name.
    #[error("{0}")]
    Predictor(ParseNameError),
    /// B is not a whole number.
    #[error(
        "budget {given:?} of {spec:?} is not a whole number >= 0: expected PRED:B, B proposals per token (e.g. coact:4)"
    )]
    Budget {
        /// The text after the `:`.
        given: String,
        /// The whole text.
        spec: String,
    },
}

impl FromStr for Prefetch {
    type Err = ParsePrefetchError;
    /// `PRED:B`, e.g. `prev_token:6`.
    fn from_str(s: &str) -> std::result::Result<Prefetch, ParsePrefetchError> {
        let Some((p, b)) = s.split_once(':') else {
            let predictor: Predictor = s.parse().map_err(ParsePrefetchError::Predictor)?;
            return Err(ParsePrefetchError::NoBudget { given: predictor.to_string() });
        };
        let predictor = p.parse().map_err(ParsePrefetchError::Predictor)?;
        let budget =
            b.trim().parse().map_err(|_| ParsePrefetchError::Budget { given: b.to_string(), spec: s.to_string() })?;
        Ok(Prefetch { predictor, budget })
    }
}

/// The counts of a prefetch replay (SEMANTICS.md §12): those of §5 (`misses` are the demand
/// misses) plus the prefetch loads made at counted tokens and how many of them were useful.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrefetchCounts {
    /// The counts of §5.
    #[serde(flatten)]
    pub replay: ReplayCounts,
    /// Experts loaded by prefetch (proposals that were not resident), from token W on.
    pub prefetch_loads: u64,
    /// Of those, the ones whose first access after the prefetch was a demand hit before their
    /// eviction.
    pub useful: u64,
    /// prefetch_loads − useful (evicted or left unused at the end).
    pub wasted: u64,
}

impl PrefetchCounts {
    /// useful / prefetch_loads, 0 when nothing was prefetched.
    pub fn precision(&self) -> f64 {
        self.precision_defined().unwrap_or(0.0)
    }

    /// useful / prefetch_loads, `None` when nothing was prefetched (0/0).
    pub fn precision_defined(&self) -> Option<f64> {
        (self.prefetch_loads > 0).then(|| ratio(self.useful, self.prefetch_loads))
    }

    /// useful / (useful + misses − forced_misses): the share of the loads a token would wait
    /// for that prefetch made in time; 0 when there are none.
    pub fn coverage(&self) -> f64 {
        self.coverage_defined().unwrap_or(0.0)
    }

    /// [`PrefetchCounts::coverage`], `None` when no load was waited for or saved (0/0).
    pub fn coverage_defined(&self) -> Option<f64> {
        let loads = self.useful + self.replay.misses - self.replay.forced_misses;
        (loads > 0).then(|| ratio(self.useful, loads))
    }

    /// Experts moved (misses − forced_misses + prefetch_loads) per counted token.
    pub fn loads_per_token(&self) -> f64 {
        ratio(self.replay.misses - self.replay.forced_misses + self.prefetch_loads, self.replay.tokens)
    }

    /// Megabytes moved per counted token: [`PrefetchCounts::loads_per_token`] · `expert_mb`.
    pub fn mb_per_token(&self, expert_mb: f64) -> f64 {
        self.loads_per_token() * expert_mb
    }

    /// Prefetch loads per demand miss saved against `plain_misses` (the same replay without
    /// prefetch): what a saved miss costs in moved experts (1 = every prefetch saved one);
    /// `None` when no miss was saved. Times `expert_mb`, the megabytes per miss saved.
    pub fn loads_per_miss_saved(&self, plain_misses: u64) -> Option<f64> {
        let saved = plain_misses.checked_sub(self.replay.misses).filter(|&s| s > 0)?;
        Some(self.prefetch_loads as f64 / saved as f64)
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The result of [`replay_prefetch`]: counts, and the timeline when asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefetchReplay {
    /// The counts.
    pub counts: PrefetchCounts,
    /// The timeline figures (SEMANTICS.md §13), when a device was given.
    pub timeline: Option<Timeline>,
}

/// What to add to a replay: prefetch (with the calibration table `coact` needs) and the
/// timeline.
#[derive(Debug, Clone, Copy, Default)]
pub struct PrefetchOptions<'a> {
    /// Predictor and budget; `None` replays without prefetch (the counts of [`crate::replay`]).
    pub prefetch: Option<Prefetch>,
    /// The co-activation table, for [`Predictor::Coact`].
    pub coact: Option<&'a CoactTable>,
    /// Play the replay on the timeline of SEMANTICS.md §13 with this device.
    pub timeline: Option<TimelineDevice>,
}

/// Checks prefetch options against a trace before any work (after [`crate::validate`]).
///
/// # Errors
/// - [`CacheSimError::PrefetchWithOffline`]: an offline policy (belady) with prefetch.
/// - [`CacheSimError::BudgetAboveCap`]: B larger than a layer's cap.
/// - [`CacheSimError::NoLookahead`]: `lookahead` on a trace without `lookahead_ids`.
/// - [`CacheSimError::CoactNeedsCalibration`], [`CacheSimError::CalibrationMismatch`]: `coact`
///   without a table, or with one of another model shape.
/// - [`CacheSimError::InvalidParameter`]: a device number out of its domain, or B >= 2^16.
pub fn validate_prefetch(trace: &TraceView<'_>, cfg: &ReplayConfig, opts: &PrefetchOptions<'_>) -> Result<()> {
    let shape = trace.shape();
    if let Some(dev) = &opts.timeline {
        dev.validate()?;
    }
    let Some(pf) = opts.prefetch else { return Ok(()) };
    if !cfg.policy.facts().allows_prefetch() {
        return Err(CacheSimError::PrefetchWithOffline { policy: cfg.policy });
    }
    if u16::try_from(pf.budget).is_err() {
        let value = pf.budget.to_string();
        return Err(CacheSimError::InvalidParameter { name: "budget", value, reason: "must be below 65,536" });
    }
    if let Some((layer, cap)) = (0..shape.layers).map(|l| (l, cfg.cap_of(l))).find(|&(_, cap)| pf.budget > cap) {
        return Err(CacheSimError::BudgetAboveCap { budget: pf.budget, cap, layer });
    }
    let facts = pf.predictor.facts();
    if facts.needs_lookahead && trace.lookahead().is_none() {
        return Err(CacheSimError::NoLookahead);
    }
    match opts.coact {
        None if facts.needs_calibration => Err(CacheSimError::CoactNeedsCalibration),
        Some(table) if facts.needs_calibration => table.check_fits(&trace.meta().layer_ids, shape.num_experts),
        _ => Ok(()),
    }
}

/// Replays `trace` with prefetch and/or on the timeline (SEMANTICS.md §12, §13). Without
/// prefetch the counts are those of [`crate::replay`]. Layers replay in parallel on the rayon
/// pool, except `coact` at λ > 0, where layer l's proposals depend on layer l − 1's replay
/// (layers then replay in order); the result does not depend on the thread count.
///
/// Memory: that of [`crate::replay`] per layer in flight, plus with the timeline 16 bytes per
/// (token, layer) of events and 16 of prefetch batch starts, plus for `coact` at λ > 0 the
/// chosen experts of one layer (2 · T · (k_used + 1) bytes, two layers alive).
///
/// # Errors
/// As [`crate::replay`] (including [`CacheSimError::NotValidated`] for a view not validated for
/// [`crate::replay_reads`]) and [`validate_prefetch`].
pub fn replay_prefetch(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    opts: &PrefetchOptions<'_>,
) -> Result<PrefetchReplay> {
    let (counts, mut timelines) = replay_prefetch_on(trace, keep, cfg, opts, &[])?;
    Ok(PrefetchReplay { counts, timeline: timelines.pop() })
}

/// [`replay_prefetch`] played on the timeline of every device of `devices` (and of
/// `opts.timeline`, which comes last when set): the counts once, and one [`Timeline`] per
/// device in that order. What a sweep needs for its profiles and bandwidths: the replay's
/// events are recorded once and played per device.
///
/// # Errors
/// As [`replay_prefetch`]; [`CacheSimError::InvalidParameter`] for a device number out of its
/// domain.
pub fn replay_prefetch_on(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    opts: &PrefetchOptions<'_>,
    devices: &[TimelineDevice],
) -> Result<(PrefetchCounts, Vec<Timeline>)> {
    let shape = trace.shape();
    crate::validate(&shape, trace.parts().scores.is_some(), cfg)?;
    keep.check_shape(&shape)?;
    validate_prefetch(trace, cfg, opts)?;
    for dev in devices {
        dev.validate()?;
    }
    let devices: Vec<TimelineDevice> = devices.iter().copied().chain(opts.timeline).collect();
    // Prefetch reads nothing of the ids the replay does not (oracle: F[0..n]; coact at λ = 0: the
    // layer below's F[0..n]); lookahead_ids are validated whole when the trace is opened.
    crate::require(trace, crate::replay_reads(&shape, keep, cfg))?;
    let record = !devices.is_empty();
    let chain = opts.prefetch.is_some_and(|p| p.predictor.facts().reads_layer_below) && cfg.lambda > 0.0;
    let layers: Vec<(PfLayerCounts, Vec<LayerEvent>)> = if chain {
        let k_used = cfg.k_used_or(shape.top_k);
        let mut prev: Option<(Vec<u16>, Vec<u16>)> = None;
        let mut done = Vec::with_capacity(shape.layers);
        for l in 0..shape.layers {
            let mut mine = (vec![0u16; shape.tokens * k_used], vec![0u16; shape.tokens]);
            let source = prev.as_ref().map(|(ids, lens)| PrevChosen::Table { ids, lens, k_used });
            done.push(replay_layer(trace, keep, cfg, opts, l, source, record, Some((&mut mine.0, &mut mine.1))));
            prev = Some(mine);
        }
        done
    } else {
        (0..shape.layers)
            .into_par_iter()
            .map(|l| {
                let source = (l > 0).then(|| PrevChosen::Trace {
                    ids: trace.layer_ids(l - 1),
                    m: shape.candidates,
                    keep: keep.layer_mask(l - 1),
                    k_used: cfg.k_used_or(shape.top_k),
                });
                replay_layer(trace, keep, cfg, opts, l, source, record, None)
            })
            .collect()
    };
    let base: Vec<LayerCounts> = layers.iter().map(|(c, _)| c.base).collect();
    let replay = ReplayCounts::from_layers(&shape, cfg.warmup, &base);
    let prefetch_loads = layers.iter().map(|(c, _)| c.prefetch_loads).sum();
    let useful = layers.iter().map(|(c, _)| c.useful).sum();
    let counts = PrefetchCounts { replay, prefetch_loads, useful, wasted: prefetch_loads - useful };
    let events: Vec<Vec<LayerEvent>> = layers.into_iter().map(|(_, e)| e).collect();
    let timelines = devices.iter().map(|dev| crate::timeline::play(&events, cfg.warmup, dev)).collect();
    Ok((counts, timelines))
}

/// Replays layer `l`: its counts and, when `record`, its events `[T]`. `source`: where coact
/// finds the previous layer's chosen experts (`None` at layer 0); `chosen`: where to record
/// this layer's.
#[expect(clippy::too_many_arguments, reason = "the driver's per-layer call, in one place")]
fn replay_layer<'a>(
    trace: &TraceView<'a>,
    keep: &'a Keep,
    cfg: &ReplayConfig,
    opts: &PrefetchOptions<'a>,
    l: usize,
    source: Option<PrevChosen<'a>>,
    record: bool,
    chosen: Option<(&mut [u16], &mut [u16])>,
) -> (PfLayerCounts, Vec<LayerEvent>) {
    let (params, input) = crate::engine::layer_alone(trace, keep, cfg, l);
    let shape = trace.shape();
    let mut events = if record { vec![LayerEvent::default(); shape.tokens] } else { Vec::new() };
    let out = Outputs { events: record.then_some(&mut events[..]), chosen };
    let (budget, choice) = match opts.prefetch {
        None => (0, Choice::None),
        Some(pf) => {
            let (budget, k_used) = (pf.budget, params.k_used);
            (
                budget,
                pf.predictor.choose(LayerAt { trace: *trace, l, budget, k_used, coact: opts.coact, below: source }),
            )
        }
    };
    let counts = with_policy(&params, &input, Visit { params: &params, input: &input, budget, choice, out });
    (counts, events)
}
