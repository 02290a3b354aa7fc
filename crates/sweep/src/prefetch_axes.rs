//! The prefetch axes of a grid block (SEMANTICS.md §12, §13): `prefetch` (`PRED:B`) and
//! `shuffle` (seeds of the token-shuffled locality control), their part of a configuration's
//! key, and the replay of those configurations with the timeline of every profile.

use std::cmp::Ordering;

use cachesim::shuffle::Shuffled;
use cachesim::{CoactTable, Keep, Prefetch, PrefetchCounts, PrefetchOptions, Timeline, TimelineDevice};
use trace_io::TraceView;

use crate::DeviceProfile;

/// The prefetch part of a configuration key; `None` everywhere is the plain replay of §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PrefetchKey {
    /// §12: predictor and budget, written `PRED:B` (`coact:4`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "spelled")]
    pub prefetch: Option<Prefetch>,
    /// §12's locality control: the seed of the token permutation the trace is replayed in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<u64>,
}

/// `Option<Prefetch>` as its `PRED:B` spelling.
mod spelled {
    use cachesim::Prefetch;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(p: &Option<Prefetch>, s: S) -> Result<S::Ok, S::Error> {
        match p {
            Some(p) => s.serialize_str(&p.to_string()),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Prefetch>, D::Error> {
        Option::<String>::deserialize(d)?.map(|s| s.parse().map_err(serde::de::Error::custom)).transpose()
    }
}

impl PrefetchKey {
    /// The key's suffix: `/pf:PRED:B` and `/shuffle:SEED`, each when set.
    pub fn suffix(&self) -> String {
        let mut s = String::new();
        if let Some(p) = self.prefetch {
            s += &format!("/pf:{p}");
        }
        if let Some(seed) = self.shuffle {
            s += &format!("/shuffle:{seed}");
        }
        s
    }

    /// The prefetch options of this key (the table for `coact`).
    pub fn options<'a>(&self, coact: Option<&'a CoactTable>) -> PrefetchOptions<'a> {
        PrefetchOptions { prefetch: self.prefetch, coact, timeline: None }
    }
}

impl Ord for PrefetchKey {
    fn cmp(&self, o: &Self) -> Ordering {
        let pf = |k: &PrefetchKey| k.prefetch.map(|p| (p.predictor.as_str(), p.budget));
        pf(self).cmp(&pf(o)).then_with(|| self.shuffle.cmp(&o.shuffle))
    }
}

impl PartialOrd for PrefetchKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The timeline figures of a row for one profile and bandwidth (SEMANTICS.md §13).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TimelineCost {
    /// Profile name.
    pub profile: String,
    /// I/O bandwidth, GB/s.
    pub bandwidth_gbps: f64,
    /// Tokens per second on the timeline.
    pub tok_s: f64,
    /// Seconds per token spent waiting on loads.
    pub stall_s_per_token: f64,
}

/// The prefetch figures of a row (SEMANTICS.md §12): the rows of configurations with a
/// predictor only.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PrefetchFigures {
    /// Experts loaded by prefetch (from token W on).
    pub prefetch_loads: u64,
    /// Prefetch loads whose first access afterwards was a demand hit before their eviction.
    pub useful: u64,
    /// prefetch_loads − useful.
    pub wasted: u64,
    /// useful / prefetch_loads; `None` (JSON `null`) without loads (0/0), as `replay --json`
    /// writes it.
    pub precision: Option<f64>,
    /// useful / (useful + misses − forced_misses); `None` (JSON `null`) when that is 0/0.
    pub coverage: Option<f64>,
    /// Experts moved per counted token: misses − forced_misses + prefetch_loads, per token.
    pub loads_per_token: f64,
    /// The timeline per profile and bandwidth, in the order of the row's `cost`.
    pub timeline: Vec<TimelineCost>,
}

/// A `prefetch` axis value: `"PRED:B"`, or `"none"` for no prefetch.
///
/// # Errors
/// Why the value is not one (an unknown predictor, a budget that is not a whole number).
pub(crate) fn parse_prefetch(s: &str) -> Result<Option<Prefetch>, String> {
    if s == "none" {
        return Ok(None);
    }
    s.parse().map(Some).map_err(|e| format!("{e}"))
}

/// The prefetch axes of one block, expanded: every (prefetch, shuffle) combination (`None` for
/// the plain one). `deployed`: whether the block has a deployment axis, which prefetch does not
/// combine with.
pub(crate) fn expand_axes(
    prefetch: &[Option<String>],
    shuffle: &[Option<u64>],
    deployed: bool,
    block: usize,
) -> crate::Result<Vec<Option<PrefetchKey>>> {
    let err = |key: String, reason: String| crate::SweepError::Grid { key, reason };
    let mut out = Vec::new();
    for p in prefetch {
        let spec = p.as_deref().unwrap_or("none");
        let pf = parse_prefetch(spec).map_err(|r| err(format!("blocks[{block}].prefetch: {spec}"), r))?;
        if deployed && pf.is_some() {
            return Err(err(
                format!("blocks[{block}].prefetch: {spec}"),
                "prefetch does not combine with `pin`, `tier2` or `batch` in one block: give it a block of its own"
                    .into(),
            ));
        }
        for &shuffle in shuffle {
            if deployed && shuffle.is_some() {
                return Err(err(
                    format!("blocks[{block}].shuffle: {}", shuffle.unwrap_or_default()),
                    "the shuffled control does not combine with `pin`, `tier2` or `batch` in one block: give it a \
                     block of its own"
                        .into(),
                ));
            }
            let key = PrefetchKey { prefetch: pf, shuffle };
            out.push((key != PrefetchKey::default()).then_some(key));
        }
    }
    Ok(out)
}

/// The timeline devices of `profiles`, one per profile and bandwidth in the order of a row's
/// `cost`.
pub(crate) fn devices(profiles: &[DeviceProfile]) -> Vec<TimelineDevice> {
    profiles
        .iter()
        .flat_map(|p| {
            p.bandwidth_gbps.iter().map(|&bw| TimelineDevice {
                expert_mb: p.expert_mb,
                compute_ms: p.compute_ms,
                bandwidth_gbps: bw,
            })
        })
        .collect()
}

/// Whether any key predicts with `coact` (the table is then learned).
pub(crate) fn needs_coact<'k>(keys: impl IntoIterator<Item = &'k crate::ConfigKey>) -> bool {
    keys.into_iter().any(|k| k.prefetch.and_then(|p| p.prefetch).is_some_and(|p| p.predictor.facts().needs_calibration))
}

/// A replay of one prefetch configuration: counts, and the timelines when it has a predictor.
pub(crate) struct Replayed {
    pub(crate) counts: PrefetchCounts,
    pub(crate) timelines: Vec<Timeline>,
}

/// Replays one configuration with a prefetch key (validated) on `view`, or on its shuffled copy
/// `shuffled` when the key has a seed; with a predictor, on the timeline of every device.
pub(crate) fn replay(
    view: &TraceView<'_>,
    shuffled: Option<&Shuffled>,
    keep: &Keep,
    cfg: &cachesim::ReplayConfig,
    key: &PrefetchKey,
    coact: Option<&CoactTable>,
    devices: &[TimelineDevice],
) -> Replayed {
    let sh;
    let v = match shuffled {
        Some(s) => {
            sh = s.view();
            &sh
        }
        None => view,
    };
    let devices = if key.prefetch.is_some() { devices } else { &[] };
    let (counts, timelines) =
        cachesim::replay_prefetch_on(v, keep, cfg, &key.options(coact), devices).expect("validated by prepare");
    Replayed { counts, timelines }
}

/// The cost entries and prefetch figures of a row with a predictor: per profile and bandwidth,
/// the megabytes moved per token (demand and prefetch loads, SEMANTICS.md §12) and the
/// timeline's tok/s (§13; without prefetch it is §6's figure).
pub(crate) fn figures(
    profiles: &[DeviceProfile],
    c: &PrefetchCounts,
    timelines: &[Timeline],
) -> (Vec<crate::Cost>, PrefetchFigures) {
    let points: Vec<(&DeviceProfile, f64)> =
        profiles.iter().flat_map(|p| p.bandwidth_gbps.iter().map(move |&bw| (p, bw))).collect();
    let cost = points
        .iter()
        .zip(timelines)
        .map(|(&(p, bw), t)| crate::Cost {
            profile: p.name.clone(),
            bandwidth_gbps: bw,
            ssd_mb_per_token: c.mb_per_token(p.expert_mb),
            tok_s: t.tok_s,
        })
        .collect();
    let timeline = points
        .iter()
        .zip(timelines)
        .map(|(&(p, bw), t)| TimelineCost {
            profile: p.name.clone(),
            bandwidth_gbps: bw,
            tok_s: t.tok_s,
            stall_s_per_token: t.stall_s_per_token,
        })
        .collect();
    let figures = PrefetchFigures {
        prefetch_loads: c.prefetch_loads,
        useful: c.useful,
        wasted: c.wasted,
        precision: c.precision_defined(),
        coverage: c.coverage_defined(),
        loads_per_token: c.loads_per_token(),
        timeline,
    };
    (cost, figures)
}
