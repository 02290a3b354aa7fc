//! `replay`: one configuration on one trace, as `moe-offload replay --json` runs and reports it
//! (SEMANTICS.md §5, deployments §9-§11, prefetch and the timeline §12-§13, the shuffled order).
//!
//! The steps and the JSON document follow `crates/cli/src/commands/replay.rs`,
//! `replay_deploy.rs` and `replay_prefetch.rs` field for field; the package's tests compare the
//! two outputs on the same inputs.

use std::path::PathBuf;
use std::sync::Arc;

use cachesim::deploy::{DeployCounts, Deployment, Schedule, Tier2};
use cachesim::hybrid::{Exec, Overlap};
use cachesim::shuffle::Shuffled;
use cachesim::{
    CacheSimError, CoactTable, Keep, Policy, Prefetch, PrefetchOptions, PrefetchReplay, ReplayConfig, Semantics,
    TimelineDevice,
};
use pyo3::prelude::*;
use serde_json::{Value, json};
use sweep::{DeployCost, DeviceProfile};
use trace_io::{TraceFile, TraceMeta, TraceView};

use crate::errors::{Error, Result};
use crate::saliency_py::KeepMap;
use crate::trace::Trace;
use crate::usage;

/// Adds `replay` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    Ok(())
}

/// A keep or pin map given as a `KeepMap` or as the path of a keep-map JSON file.
pub(crate) enum MapArg {
    Map(Arc<saliency::KeepMap>),
    Path(PathBuf),
}

impl MapArg {
    pub(crate) fn extract(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<MapArg>> {
        let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
        if let Ok(m) = obj.cast::<KeepMap>() {
            return Ok(Some(MapArg::Map(m.get().inner.clone())));
        }
        match obj.extract::<PathBuf>() {
            Ok(p) => Ok(Some(MapArg::Path(p))),
            Err(_) => {
                Err(Error::Usage(format!("{what}: expected a KeepMap or the path of a keep-map JSON file")).into())
            }
        }
    }

    /// The map and the name the CLI's messages give it (the path, or the map's label).
    pub(crate) fn load(&self) -> Result<(Arc<saliency::KeepMap>, String)> {
        match self {
            MapArg::Map(m) => Ok((m.clone(), m.label())),
            MapArg::Path(p) => Ok((Arc::new(read_keep_or_plan(p)?), p.display().to_string())),
        }
    }
}

/// A keep-map file, or the chosen keep map of a plan written by `moe-offload plan` or
/// `moe_offload.plan` (`chosen.keep_map`), as `replay --keep` reads it.
fn read_keep_or_plan(p: &std::path::Path) -> Result<saliency::KeepMap> {
    let bytes = trace_io::read_regular(p).map_err(|e| Error::Saliency(format!("reading {}: {e}", p.display())))?;
    if let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        && let Some(chosen) = v.get("chosen")
    {
        let map: saliency::KeepMap = serde_json::from_value(chosen["keep_map"].clone()).map_err(|e| {
            Error::Saliency(format!("{}: the plan's chosen.keep_map is not a keep map: {e}", p.display()))
        })?;
        map.validate().map_err(|e| Error::from(e).context(format!("{}: chosen.keep_map", p.display())))?;
        return Ok(map);
    }
    Ok(saliency::KeepMap::read_json(p)?)
}

/// Everything `replay` was given, owned (the work runs on another thread).
struct Args {
    file: Arc<TraceFile>,
    trace_name: String,
    policy: Policy,
    cap: Option<usize>,
    layer_caps: Option<Vec<usize>>,
    keep: Option<MapArg>,
    k_used: Option<usize>,
    warmup: usize,
    lam: f64,
    j: usize,
    decay: f64,
    near_pick_n: usize,
    semantics: Semantics,
    reset_at_sequence: bool,
    pin: Option<MapArg>,
    tier2: Option<String>,
    served: bool,
    batch: Option<usize>,
    link_gbps: Option<f64>,
    compute_ms_per_step: Option<f64>,
    prefetch: Option<Prefetch>,
    calib: Option<(Arc<TraceFile>, String)>,
    timeline: bool,
    profile: Option<String>,
    bandwidth: Option<f64>,
    shuffle: Option<u64>,
    exec: Exec,
    overlap: Option<Overlap>,
    host_gbps: Option<f64>,
    host_ms_per_row: Option<f64>,
    host_sync_ms: Option<f64>,
    profile_file: Option<PathBuf>,
}

impl Args {
    fn prefetch_active(&self) -> bool {
        self.prefetch.is_some()
            || self.timeline
            || self.shuffle.is_some()
            || self.calib.is_some()
            || self.profile.is_some()
            || self.bandwidth.is_some()
    }

    fn only_profile(&self) -> bool {
        self.profile.is_some()
            && self.prefetch.is_none()
            && !self.timeline
            && self.shuffle.is_none()
            && self.calib.is_none()
            && self.bandwidth.is_none()
    }

    fn served(&self) -> bool {
        self.served || self.batch.is_some()
    }
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| Error::Usage(format!("{what}: {e}")))
}

/// Replays one configuration on `trace` and returns the fields of `moe-offload replay --json`
/// with the same flags (SEMANTICS.md §5; the result's `tokens`, `picks`, `hits`, `misses`,
/// `forced_misses`, `substituted`, `pruned_slots`, `hit_rate`, `misses_per_token` and
/// `layer_misses` (one per layer), plus what the deployment or prefetch adds, costs in MB, GB/s, ms, tok/s).
///
/// - `policy`: lru, fifo, lfu, belady, near_pick, near_pick_ema, inv_router, perfect_lfu, lfru.
/// - `cap`: cache capacity per layer, in experts (>= k_used); `layer_caps`: one per layer.
/// - `keep`: a `KeepMap` or a keep-map path (default: every expert kept).
/// - `k_used` (default the trace's top-k), `warmup` (tokens not counted, default 64),
///   `lam` (λ of cache-aware routing), `j`, `decay`, `near_pick_n`, `semantics`
///   (`k-way` or `sequential`), `reset_at_sequence`.
/// - Deployments: `pin` (a map of experts held resident), `tier2` (`"lru:32"`), `served`,
///   `batch` (B sequences at once), `link_gbps`, `compute_ms_per_step`.
/// - Prefetch: `prefetch` (`"coact:4"`), `calib` (a `Trace`, for coact), `timeline`,
///   `profile`, `bandwidth` (GB/s), `shuffle` (a seed).
///
/// Runs with the GIL released; Ctrl-C interrupts it.
#[pyfunction]
#[pyo3(signature = (
    trace, *, policy, cap=None, layer_caps=None, keep=None, k_used=None, warmup=64, lam=0.0, j=0,
    decay=0.99, near_pick_n=48, semantics="k-way", reset_at_sequence=false, pin=None, tier2=None,
    served=false, batch=None, link_gbps=None, compute_ms_per_step=None, prefetch=None, calib=None,
    timeline=false, profile=None, bandwidth=None, shuffle=None, exec="transfer", overlap=None, host_gbps=None,
    host_ms_per_row=None, host_sync_ms=None, profile_file=None
))]
#[expect(clippy::too_many_arguments, reason = "one keyword argument per CLI flag: the Python signature is the API")]
pub fn replay<'py>(
    py: Python<'py>,
    trace: &Trace,
    policy: &str,
    cap: Option<usize>,
    layer_caps: Option<Vec<usize>>,
    keep: Option<&Bound<'py, PyAny>>,
    k_used: Option<usize>,
    warmup: usize,
    lam: f64,
    j: usize,
    decay: f64,
    near_pick_n: usize,
    semantics: &str,
    reset_at_sequence: bool,
    pin: Option<&Bound<'py, PyAny>>,
    tier2: Option<String>,
    served: bool,
    batch: Option<usize>,
    link_gbps: Option<f64>,
    compute_ms_per_step: Option<f64>,
    prefetch: Option<&str>,
    calib: Option<&Trace>,
    timeline: bool,
    profile: Option<String>,
    bandwidth: Option<f64>,
    shuffle: Option<u64>,
    exec: &str,
    overlap: Option<&str>,
    host_gbps: Option<f64>,
    host_ms_per_row: Option<f64>,
    host_sync_ms: Option<f64>,
    profile_file: Option<PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    if cap.is_none() && layer_caps.is_none() {
        return Err(Error::Usage("replay needs cap (experts per layer) or layer_caps (one per layer)".into()).into());
    }
    if served && batch.is_some() {
        return Err(
            Error::Usage("served and batch exclude each other: served replays the recorded steps".into()).into()
        );
    }
    if let Some(c) = compute_ms_per_step.filter(|c| !(c.is_finite() && *c >= 0.0)) {
        return Err(Error::Usage(format!("compute_ms_per_step {c}: must be a finite number >= 0")).into());
    }
    if let Some(b) = bandwidth.filter(|b| !(b.is_finite() && *b > 0.0)) {
        return Err(Error::Usage(format!("bandwidth {b}: must be a positive bandwidth in GB/s")).into());
    }
    let a = Args {
        file: trace.file.clone(),
        trace_name: trace.display(),
        policy: parse("policy", policy)?,
        cap,
        layer_caps,
        keep: MapArg::extract(keep, "keep")?,
        k_used,
        warmup,
        lam,
        j,
        decay,
        near_pick_n,
        semantics: parse("semantics", semantics)?,
        reset_at_sequence,
        pin: MapArg::extract(pin, "pin")?,
        tier2,
        served,
        batch,
        link_gbps,
        compute_ms_per_step,
        prefetch: prefetch.map(|p| parse("prefetch", p)).transpose()?,
        calib: calib.map(|c| (c.file.clone(), c.display())),
        timeline,
        profile,
        bandwidth,
        shuffle,
        exec: parse("exec", exec)?,
        overlap: overlap.map(|o| parse("overlap", o)).transpose()?,
        host_gbps,
        host_ms_per_row,
        host_sync_ms,
        profile_file,
    };
    for (name, v, positive) in [
        ("host_gbps", host_gbps, true),
        ("host_ms_per_row", host_ms_per_row, false),
        ("host_sync_ms", host_sync_ms, false),
    ] {
        if let Some(x) = v.filter(|x| !(x.is_finite() && if positive { *x > 0.0 } else { *x >= 0.0 })) {
            return Err(Error::Usage(format!(
                "{name} {x}: must be a finite number {}",
                if positive { "> 0" } else { ">= 0" }
            ))
            .into());
        }
    }
    if !a.exec.is_hybrid() {
        let stray = [
            (a.overlap.is_some(), "overlap"),
            (host_gbps.is_some(), "host_gbps"),
            (host_ms_per_row.is_some(), "host_ms_per_row"),
            (host_sync_ms.is_some(), "host_sync_ms"),
        ];
        if let Some((_, name)) = stray.into_iter().find(|s| s.0) {
            return Err(Error::Usage(format!(
                "{name} prices hybrid execution (SEMANTICS.md §14): add exec=\"host\" (or \"host:R\"), or drop {name}"
            ))
            .into());
        }
    }
    if a.profile.is_some() && a.profile_file.is_some() {
        return Err(Error::Usage("profile and profile_file exclude each other: give one".into()).into());
    }
    trace.require_tokens()?;
    let v = crate::run::detached(py, move || run(&a))?;
    crate::run::to_result(py, &v)
}

/// `moe-offload replay`'s `run`, returning the `--json` document.
fn run(a: &Args) -> Result<Value> {
    let f = &*a.file;
    let shape = f.shape();
    let keep = match &a.keep {
        Some(k) => {
            let (map, name) = k.load().map_err(|e| {
                e.context(format!(
                    "keep {} is not a keep map",
                    match k {
                        MapArg::Path(p) => p.display().to_string(),
                        MapArg::Map(m) => m.label(),
                    }
                ))
            })?;
            check_map_fits(&map, f.meta(), &name)?;
            Keep::from_layers(&shape, &map.layers).map_err(|e| Error::from(e).context(format!("keep map {name}")))?
        }
        None => Keep::full(&shape),
    };
    let cap = a.cap.or_else(|| a.layer_caps.as_ref().and_then(|c| c.iter().copied().min())).unwrap_or(0);
    let cfg = ReplayConfig {
        k_used: a.k_used,
        warmup: a.warmup,
        lambda: a.lam,
        j: a.j,
        decay: a.decay,
        near_pick_n: a.near_pick_n,
        semantics: a.semantics,
        reset_at_sequence: a.reset_at_sequence,
        layer_caps: a.layer_caps.clone(),
        ..ReplayConfig::new(a.policy, cap)
    };
    let dep = deployment(a, f.meta(), &shape)?;
    if a.exec.is_hybrid() {
        return run_hybrid(a, &keep, &cfg, &dep);
    }
    let plain = dep.is_plain(&cfg);
    let prefetch_on = if plain { a.prefetch_active() } else { a.prefetch_active() && !a.only_profile() };
    if prefetch_on {
        if !plain {
            usage!(
                "prefetch, the timeline and the shuffled order (SEMANTICS.md §12-§13) are replayed per token with one \
                 tier and no pins: drop pin, tier2, served, batch and cap=0, or the prefetch arguments"
            );
        }
        let v = f.view_for(cachesim::replay_reads(&shape, &keep, &cfg))?;
        return run_prefetch(a, &v, &keep, &cfg);
    }
    // Hybrid execution has its own entry (above): this request transfers.
    let request = cachesim::Replay { keep: &keep, config: &cfg, deployment: &dep, exec: Default::default() };
    let v = f.view_for(request.reads(&shape))?;
    let dc = request.run(&v).map(|r| r.deploy_counts()).map_err(|e| match e {
        CacheSimError::KUsedAboveCandidates { candidates, .. } => {
            Error::from(e).hint(format!("use k_used={candidates} or less"))
        }
        CacheSimError::OfflineWithLambda { .. } => {
            Error::from(e).hint("drop lam, or use an online policy such as lru with lam")
        }
        e => e.into(),
    })?;
    let c = &dc.counts;
    let mut j = json!({
        "kind": "moe-offload-replay",
        "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
        "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
        "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
    });
    if let (Some(j), Value::Object(extra)) = (j.as_object_mut(), json_extras(a, &v, &dep, &dc)?) {
        j.extend(extra);
    }
    Ok(j)
}

/// Refuses a keep map made for another model shape (the CLI's `check_map_fits`).
fn check_map_fits(map: &saliency::KeepMap, m: &TraceMeta, name: &str) -> Result<()> {
    if map.num_experts != m.num_experts || map.layer_ids != m.layer_ids {
        usage!(
            "keep map {name} is for E = {} and layers {:?}; the trace has E = {} and layers {:?}: build the map from \
             statistics of a trace of the same model (`moe_offload.stats` then `moe_offload.keep`)",
            map.num_experts,
            map.layer_ids,
            m.num_experts,
            m.layer_ids
        );
    }
    Ok(())
}

/// `POLICY:CAP`, by the one parser of `cachesim` (`Tier2::from_str`).
fn parse_tier2(s: &str) -> Result<Tier2> {
    s.parse().map_err(|e| Error::Usage(format!("tier2 {s:?}: {e}")))
}

/// The deployment the arguments ask for (the CLI's `replay_deploy::deployment`).
fn deployment(a: &Args, meta: &TraceMeta, shape: &trace_io::Shape) -> Result<Deployment> {
    if a.link_gbps.is_some() && a.tier2.is_none() && !a.exec.is_hybrid() {
        usage!(
            "link_gbps is the bandwidth from tier 2 to tier 1, or from host to GPU with exec host: it applies only \
             with tier2 or exec host"
        );
    }
    if a.compute_ms_per_step.is_some() && !a.served() {
        usage!("compute_ms_per_step is the compute of an engine step: it applies only with served or batch");
    }
    if let Some(g) = a.link_gbps.filter(|g| !(g.is_finite() && *g > 0.0)) {
        usage!("link_gbps {g}: must be a positive bandwidth in GB/s");
    }
    let pins = match &a.pin {
        Some(p) => {
            let (map, name) = p.load().map_err(|e| {
                e.context(format!(
                    "pin {} is not a keep map",
                    match p {
                        MapArg::Path(p) => p.display().to_string(),
                        MapArg::Map(m) => m.label(),
                    }
                ))
            })?;
            check_map_fits(&map, meta, &name)?;
            Some(Keep::from_layers(shape, &map.layers).map_err(|e| Error::from(e).context(format!("pin map {name}")))?)
        }
        None => None,
    };
    let schedule = match (a.served, a.batch) {
        (true, _) => Schedule::Served,
        (false, Some(b)) => Schedule::Rebatch(b),
        (false, None) => Schedule::PerToken,
    };
    Ok(Deployment { pins, tier2: a.tier2.as_deref().map(parse_tier2).transpose()?, schedule })
}

/// The cost profile: `profile`, else the trace model's preset, else the reference; with the link
/// and step arguments (the CLI's `replay_deploy::profile`).
fn deploy_profile(a: &Args, v: &TraceView<'_>) -> Result<DeviceProfile> {
    let mut p = base_profile(a, v)?;
    p.link_gbps = a.link_gbps.or(p.link_gbps);
    p.compute_ms_per_step = a.compute_ms_per_step.or(p.compute_ms_per_step);
    Ok(p)
}

/// `profile_file`, else `profile`, else the trace model's preset, else the reference (the CLI's
/// `replay_hybrid::base_profile`).
fn base_profile(a: &Args, v: &TraceView<'_>) -> Result<DeviceProfile> {
    if let Some(path) = &a.profile_file {
        return DeviceProfile::read(path)
            .map_err(|e| Error::from(e).context(format!("profile_file {}", path.display())));
    }
    let inferred = a.profile.is_none().then(|| sweep::preset_for_model(&v.meta().model)).flatten();
    let name = a.profile.as_deref().or(inferred).unwrap_or("reference");
    DeviceProfile::preset(name)
        .ok_or_else(|| Error::Usage(format!("unknown profile {name:?}; see docs/grid-format.md")))
}

/// Hybrid execution (SEMANTICS.md §14), as `replay --exec host` runs it: the deployed counts,
/// the deployment fields and the hybrid ones (`sweep::hybrid_fields`).
fn run_hybrid(a: &Args, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment) -> Result<Value> {
    let exec = a.exec;
    if dep.tier2.is_some() {
        usage!(
            "tier2 with exec {exec}: a non-resident expert is computed on the CPU from host memory, so there is no \
             second tier to load it from (SEMANTICS.md §14); drop tier2, or use exec=\"transfer\""
        );
    }
    if a.prefetch_active() && !a.only_profile() {
        usage!(
            "exec {exec} with prefetch, the timeline or the shuffled order: a prefetched expert is loaded to the GPU, \
             which hybrid execution does not price (SEMANTICS.md §14)"
        );
    }
    let f = &*a.file;
    let shape = f.shape();
    let v = f.view_for(cachesim::deploy::deploy_reads(&shape, keep, cfg))?;
    let (hc, events) = cachesim::hybrid::replay_hybrid(&v, keep, cfg, dep, exec)?;
    let mut p = base_profile(a, &v)?;
    p.host_gbps = a.host_gbps.or(p.host_gbps);
    p.host_ms_per_row = a.host_ms_per_row.or(p.host_ms_per_row);
    p.host_sync_ms = a.host_sync_ms.or(p.host_sync_ms);
    p.link_gbps = a.link_gbps.or(p.link_gbps);
    p.compute_ms_per_step = a.compute_ms_per_step.or(p.compute_ms_per_step);
    p.overlap = a.overlap.or(p.overlap);
    let dev = p.hybrid(None).map_err(|e| Error::from(e).hint("give host_gbps, or a profile_file with host_gbps"))?;
    let cost = events.cost(&dev).map_err(|e| match e {
        CacheSimError::InvalidParameter { name: "link_gbps", .. } => {
            Error::from(e).hint("give link_gbps (host-to-GPU GB/s)")
        }
        e => e.into(),
    })?;
    let c = &hc.deploy.counts;
    let mut j = json!({
        "kind": "moe-offload-replay",
        "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
        "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
        "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
    });
    if let (Some(j), Value::Object(extra)) = (j.as_object_mut(), json_extras(a, &v, dep, &hc.deploy)?) {
        j.extend(extra);
    }
    if let (Some(j), Value::Object(h)) = (j.as_object_mut(), sweep::hybrid_fields(exec, &hc, &p.name, &dev, &cost)) {
        j.extend(h);
    }
    Ok(j)
}

/// The fields `--json` adds to the §5 ones (the CLI's `replay_deploy::json_extras`).
fn json_extras(a: &Args, v: &TraceView<'_>, dep: &Deployment, c: &DeployCounts) -> Result<Value> {
    let p = deploy_profile(a, v)?;
    let costs: Vec<DeployCost> =
        p.bandwidth_gbps.iter().map(|&bw| DeployCost::of(&p, c, dep.tier2.is_some(), a.served(), bw)).collect();
    let schedule = match dep.schedule {
        Schedule::PerToken => "per_token".to_string(),
        Schedule::Served => "served".to_string(),
        Schedule::Rebatch(b) => format!("batch:{b}"),
    };
    Ok(json!({
        "pinned_hits": c.pinned_hits, "t2_hits": c.t2_hits, "storage_reads": c.storage_reads,
        "steps": c.steps, "rows": c.rows, "loads_per_step": c.loads_per_step(),
        "lookup_hit_rate": c.lookup_hit_rate(),
        "layer_pins": c.layer_pins, "schedule": schedule,
        "tier2": dep.tier2.map(|t| format!("{}:{}", t.policy, t.cap)),
        "cost": { "profile": p.name, "expert_mb": p.expert_mb, "compute_ms": p.compute_ms,
                  "link_gbps": p.link_gbps, "compute_ms_per_step": p.compute_ms_per_step, "at": costs },
    }))
}

/// Replay with prefetch, the timeline or the shuffled order (the CLI's `replay_prefetch::run`).
fn run_prefetch(a: &Args, v: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig) -> Result<Value> {
    let coact_wanted = a.prefetch.is_some_and(|p| p.predictor.facts().needs_calibration);
    if a.calib.is_some() && !coact_wanted {
        usage!("calib is read only by the coact predictor: add prefetch=\"coact:B\", or drop calib");
    }
    if coact_wanted && a.calib.is_none() {
        usage!("prefetch coact:B learns its co-activation table from a calibration trace: add calib=TRACE");
    }
    let table = match &a.calib {
        Some((c, name)) => {
            let view = c
                .view_for(trace_io::Reads::ids(c.shape().top_k))
                .map_err(|e| Error::from(e).context(format!("calib {name}")))?;
            Some(CoactTable::learn(&view)?)
        }
        None => None,
    };
    let profile = base_profile(a, v)?;
    let bw = a.bandwidth.or(profile.bandwidth_gbps.first().copied()).unwrap_or(3.9);
    let device = TimelineDevice { expert_mb: profile.expert_mb, compute_ms: profile.compute_ms, bandwidth_gbps: bw };
    let timeline = a.timeline.then_some(device);
    let opts = PrefetchOptions { prefetch: a.prefetch, coact: table.as_ref(), timeline };
    let calib_name = a.calib.as_ref().map(|c| c.1.clone()).unwrap_or_default();
    let explain = |e: CacheSimError| -> Error {
        match e {
            CacheSimError::NoLookahead => Error::from(e).context(&a.trace_name),
            CacheSimError::CalibrationMismatch { .. } => Error::from(e).context(format!("calib {calib_name}")),
            CacheSimError::BudgetAboveCap { .. } | CacheSimError::PrefetchWithOffline { .. } => {
                Error::from(e).context("prefetch")
            }
            e => e.into(),
        }
    };
    let plain_opts = PrefetchOptions { prefetch: None, coact: None, timeline };
    let plain = cachesim::replay_prefetch(v, keep, cfg, &plain_opts).map_err(explain)?;
    let main = match a.prefetch {
        Some(_) => cachesim::replay_prefetch(v, keep, cfg, &opts).map_err(explain)?,
        None => plain.clone(),
    };
    let shuffled = match a.shuffle {
        Some(seed) => {
            let sh = Shuffled::new(v, seed);
            Some((seed, cachesim::replay_prefetch(&sh.view(), keep, cfg, &opts).map_err(explain)?))
        }
        None => None,
    };
    let mut r = prefetch_report(a, &main, &plain, shuffled.as_ref(), &profile, bw);
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), "moe-offload-replay".into());
    if let Some(o) = r.as_object_mut() {
        out.extend(std::mem::take(o));
    }
    Ok(Value::Object(out))
}

/// The CLI's `replay_prefetch::report`.
fn prefetch_report(
    a: &Args,
    main: &PrefetchReplay,
    plain: &PrefetchReplay,
    shuffled: Option<&(u64, PrefetchReplay)>,
    profile: &DeviceProfile,
    bw: f64,
) -> Value {
    let c = &main.counts.replay;
    let mut j = json!({
        "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
        "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
        "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
        "profile": profile.name, "expert_mb": profile.expert_mb,
    });
    let Some(o) = j.as_object_mut() else { return j };
    if let Some(pf) = a.prefetch {
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
    if let Some((seed, s)) = shuffled {
        let sc = &s.counts;
        let mut sh = json!({
            "misses": sc.replay.misses, "misses_per_token": sc.replay.misses_per_token(),
            "hit_rate": sc.replay.hit_rate(),
        });
        if a.prefetch.is_some()
            && let Some(so) = sh.as_object_mut()
        {
            so.insert("prefetch_loads".into(), json!(sc.prefetch_loads));
            so.insert("useful".into(), json!(sc.useful));
            so.insert("precision".into(), json!(sc.precision_defined()));
            so.insert("coverage".into(), json!(sc.coverage_defined()));
        }
        if let Some(t) = s.timeline {
            sh["tok_s"] = json!(t.tok_s);
        }
        o.insert("shuffle_seed".into(), json!(seed));
        o.insert("shuffled".into(), sh);
    }
    j
}
