//! `replay` with prefetch (SEMANTICS.md §12), the timeline (§13) or the shuffled-order control:
//! the calibration table, the replays with and without prefetch, and what they add to the
//! document.

use cachesim::shuffle::Shuffled;
use cachesim::{
    CacheSimError, CoactTable, Keep, Prefetch, PrefetchOptions, PrefetchReplay, ReplayConfig, TimelineDevice,
};
use serde_json::{Value, json};
use sweep::DeviceProfile;
use trace_io::TraceFile;

use super::ReplayRequest;
use crate::error::{Context, Error, Result};
use crate::usage;

/// The timeline bandwidth when neither the request nor the profile gives one, GB/s.
const DEFAULT_BANDWIDTH_GBPS: f64 = 3.9;

/// The prefetch part of a resolved replay.
#[derive(Debug)]
pub(super) struct Resolved {
    prefetch: Option<Prefetch>,
    table: Option<CoactTable>,
    calib_name: String,
    timeline: bool,
    bandwidth: Option<f64>,
    shuffle: Option<u64>,
}

/// Checks the predictor against its calibration trace and learns coact's table from it.
pub(super) fn resolve(r: &ReplayRequest) -> Result<Resolved> {
    let coact_wanted = r.prefetch.is_some_and(|p| p.predictor.facts().needs_calibration);
    if r.calib.is_some() && !coact_wanted {
        usage!("‹calib› is read only by the coact predictor: add ‹prefetch=coact:B›, or drop ‹calib›");
    }
    if coact_wanted && r.calib.is_none() {
        usage!("‹prefetch=coact:B› learns its co-activation table from a calibration trace: add ‹calib=TRACE›");
    }
    let (table, calib_name) = match &r.calib {
        Some(src) => {
            let (c, name) = src.open().with_context(|| format!("‹calib› {}", src.name()))?;
            // coact learns from the first k ids of every calibration row: validate those.
            let view = c.view_for(trace_io::Reads::ids(c.shape().top_k)).with_context(|| format!("‹calib› {name}"))?;
            (Some(CoactTable::learn(&view)?), name)
        }
        None => (None, String::new()),
    };
    Ok(Resolved {
        prefetch: r.prefetch,
        table,
        calib_name,
        timeline: r.timeline,
        bandwidth: r.bandwidth,
        shuffle: r.shuffle,
    })
}

/// What a replay with prefetch, the timeline or the shuffled order gives.
#[derive(Debug, Clone)]
pub struct PrefetchReport {
    /// The predictor, if any.
    pub prefetch: Option<Prefetch>,
    /// The replay as asked (with prefetch when given).
    pub main: PrefetchReplay,
    /// The same replay without prefetch.
    pub plain: PrefetchReplay,
    /// The shuffled-order control: its seed and replay.
    pub shuffled: Option<(u64, PrefetchReplay)>,
    /// The profile pricing bytes and the timeline.
    pub profile: DeviceProfile,
    /// The timeline's bandwidth, GB/s.
    pub bandwidth_gbps: f64,
}

/// Replays with and without prefetch (and the shuffled copy).
pub(super) fn run(
    p: &Resolved,
    file: &TraceFile,
    trace_name: &str,
    keep: &Keep,
    cfg: &ReplayConfig,
    profile: &DeviceProfile,
) -> Result<PrefetchReport> {
    let v = file.view_for(cachesim::replay_reads(&file.shape(), keep, cfg))?;
    let bw = p.bandwidth.or(profile.bandwidth_gbps.first().copied()).unwrap_or(DEFAULT_BANDWIDTH_GBPS);
    let device = TimelineDevice { expert_mb: profile.expert_mb, compute_ms: profile.compute_ms, bandwidth_gbps: bw };
    let timeline = p.timeline.then_some(device);
    let opts = PrefetchOptions { prefetch: p.prefetch, coact: p.table.as_ref(), timeline };
    let explain = |e: CacheSimError| -> Error {
        match e {
            CacheSimError::NoLookahead => Error::from(e).context(trace_name.to_string()),
            CacheSimError::CalibrationMismatch { .. } => Error::from(e).context(format!("‹calib› {}", p.calib_name)),
            CacheSimError::BudgetAboveCap { .. } | CacheSimError::PrefetchWithOffline { .. } => {
                Error::from(e).context("‹prefetch›")
            }
            e => e.into(),
        }
    };
    let plain_opts = PrefetchOptions { prefetch: None, coact: None, timeline };
    let plain = cachesim::replay_prefetch(&v, keep, cfg, &plain_opts).map_err(explain)?;
    let main = match p.prefetch {
        Some(_) => cachesim::replay_prefetch(&v, keep, cfg, &opts).map_err(explain)?,
        None => plain.clone(),
    };
    let shuffled = match p.shuffle {
        Some(seed) => {
            let sh = Shuffled::new(&v, seed);
            Some((seed, cachesim::replay_prefetch(&sh.view(), keep, cfg, &opts).map_err(explain)?))
        }
        None => None,
    };
    Ok(PrefetchReport { prefetch: p.prefetch, main, plain, shuffled, profile: profile.clone(), bandwidth_gbps: bw })
}

impl PrefetchReport {
    /// The fields of the document: those of a plain replay (of this replay: with prefetch its
    /// `misses` are the demand misses) and the ones prefetch, the timeline and the shuffled
    /// order add.
    pub(super) fn fields(&self) -> Value {
        let (main, plain, profile, bw) = (&self.main, &self.plain, &self.profile, self.bandwidth_gbps);
        let mut j = super::report::count_fields(&main.counts.replay);
        let mut o = serde_json::Map::new();
        o.insert("profile".into(), json!(profile.name));
        o.insert("expert_mb".into(), json!(profile.expert_mb));
        if let Some(pf) = self.prefetch {
            let p = &main.counts;
            let plain_misses = plain.counts.replay.misses;
            let saved = p.loads_per_miss_saved(plain_misses);
            o.extend([
                ("prefetch".into(), json!(pf.to_string())),
                ("prefetch_loads".into(), json!(p.prefetch_loads)),
                ("useful".into(), json!(p.useful)),
                ("wasted".into(), json!(p.wasted)),
                ("precision".into(), json!(p.precision_defined())),
                ("coverage".into(), json!(p.coverage_defined())),
                ("loads_per_token".into(), json!(p.loads_per_token())),
                ("mb_per_token".into(), json!(p.mb_per_token(profile.expert_mb))),
                ("plain_misses".into(), json!(plain_misses)),
                ("loads_per_miss_saved".into(), json!(saved)),
                ("mb_per_miss_saved".into(), json!(saved.map(|s| s * profile.expert_mb))),
            ]);
        }
        if let (Some(t), Some(t0)) = (main.timeline, plain.timeline) {
            o.extend([
                ("bandwidth_gbps".into(), json!(bw)),
                ("tok_s".into(), json!(t.tok_s)),
                ("stall_s_per_token".into(), json!(t.stall_s_per_token)),
                ("tok_s_no_prefetch".into(), json!(t0.tok_s)),
                ("stall_s_per_token_no_prefetch".into(), json!(t0.stall_s_per_token)),
                ("additive_tok_s".into(), json!(profile.tok_s(plain.counts.replay.misses_per_token(), bw))),
            ]);
        }
        if let Some((seed, s)) = &self.shuffled {
            let sc = &s.counts;
            let mut sh = serde_json::Map::new();
            sh.insert("misses".into(), json!(sc.replay.misses));
            sh.insert("misses_per_token".into(), json!(sc.replay.misses_per_token()));
            sh.insert("hit_rate".into(), json!(sc.replay.hit_rate()));
            if self.prefetch.is_some() {
                sh.insert("prefetch_loads".into(), json!(sc.prefetch_loads));
                sh.insert("useful".into(), json!(sc.useful));
                sh.insert("precision".into(), json!(sc.precision_defined()));
                sh.insert("coverage".into(), json!(sc.coverage_defined()));
            }
            if let Some(t) = s.timeline {
                sh.insert("tok_s".into(), json!(t.tok_s));
            }
            o.insert("shuffle_seed".into(), json!(seed));
            o.insert("shuffled".into(), Value::Object(sh));
        }
        if let Value::Object(fields) = &mut j {
            fields.extend(o);
        }
        j
    }
}
