//! `replay`: one configuration on one trace, as `moe-offload replay --json` runs and reports it
//! (SEMANTICS.md §5, deployments §9-§11, prefetch and the timeline §12-§13, the shuffled order,
//! hybrid execution §14). The keyword arguments become an `api::replay::ReplayRequest`, which
//! holds every rule and builds the document; nothing is decided here.

use api::inputs::{CapsSource, MapSource, TraceSource};
use api::replay::ReplayRequest;
use pyo3::prelude::*;

use crate::errors::{Error, Result};
use crate::saliency_py::KeepMap;
use crate::trace::Trace;

/// Adds `replay` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(replay, m)?)?;
    Ok(())
}

/// A keep or pin map given as a `KeepMap` or as the path of a keep-map (or plan) JSON file.
pub(crate) fn map_source(obj: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<MapSource>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if let Ok(m) = obj.cast::<KeepMap>() {
        return Ok(Some(MapSource::Map((*m.get().inner).clone())));
    }
    match obj.extract::<std::path::PathBuf>() {
        Ok(p) => Ok(Some(MapSource::Path(p))),
        Err(_) => Err(Error::Usage(format!("{what}: expected a KeepMap or the path of a keep-map JSON file")).into()),
    }
}

/// Per-layer caps given as a list, or as the path of a JSON file (a list, or a plan whose
/// settings the replay must then share).
fn caps_source(obj: Option<&Bound<'_, PyAny>>) -> PyResult<Option<CapsSource>> {
    let Some(obj) = obj.filter(|o| !o.is_none()) else { return Ok(None) };
    if let Ok(caps) = obj.extract::<Vec<usize>>() {
        return Ok(Some(CapsSource::List(caps)));
    }
    match obj.extract::<std::path::PathBuf>() {
        Ok(p) => Ok(Some(CapsSource::File(p))),
        Err(_) => Err(Error::Usage("layer_caps: expected a list of caps or the path of a JSON file".into()).into()),
    }
}

/// An open trace as the command layer takes it.
pub(crate) fn trace_source(t: &Trace) -> TraceSource {
    TraceSource::Open { file: t.file.clone(), name: t.display() }
}

fn parse<T: std::str::FromStr>(name: &str, s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    Ok(api::parse(name, s)?)
}

/// Replays one configuration on `trace` and returns the fields of `moe-offload replay --json`
/// with the same flags (SEMANTICS.md §5; the result's `tokens`, `picks`, `hits`, `misses`,
/// `forced_misses`, `substituted`, `pruned_slots`, `hit_rate`, `misses_per_token` and
/// `layer_misses` (one per layer), plus what the deployment or prefetch adds, costs in MB, GB/s, ms, tok/s).
///
/// - `policy`: lru, fifo, lfu, belady, near_pick, near_pick_ema, inv_router, perfect_lfu, lfru.
/// - `cap`: cache capacity per layer, in experts (>= k_used); `layer_caps`: one per layer, or a
///   JSON file of them (a list, or a plan: its caps, replayed under the plan's settings);
///   `shared_cap`: one cache of that many (layer, expert) slots for every layer instead
///   (SEMANTICS.md §15.1; adds `shared_cap`, `layer_slots_end` and `layer_slots_mean`).
/// - `keep`: a `KeepMap` or a keep-map path (default: every expert kept).
/// - `k_used` (default the trace's top-k), `warmup` (tokens not counted, default 64),
///   `lam` (λ of cache-aware routing), `j`, `decay`, `near_pick_n`, `semantics`
///   (`k-way` or `sequential`), `reset_at_sequence`.
/// - Deployments: `pin` (a map of experts held resident, or a plan made with pin counts),
///   `tier2` (`"lru:32"`), `served`, `batch` (B sequences at once), `link_gbps`,
///   `compute_ms_per_step` (with `served`, `batch` or `exec="host"`).
/// - Prefetch: `prefetch` (`"coact:4"`), `calib` (a `Trace`, for coact), `timeline`,
///   `profile`, `bandwidth` (GB/s), `shuffle` (a seed).
/// - Hybrid execution: `exec` (`"transfer"`, `"host"`, `"host:R"`), `overlap`, `host_gbps`,
///   `host_ms_per_row`, `host_sync_ms`, `profile_file`.
///
/// Runs with the GIL released; Ctrl-C interrupts it.
#[pyfunction]
#[pyo3(signature = (
    trace, *, policy, cap=None, shared_cap=None, layer_caps=None, keep=None, k_used=None, warmup=64, lam=0.0, j=0,
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
    shared_cap: Option<usize>,
    layer_caps: Option<&Bound<'py, PyAny>>,
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
    profile_file: Option<std::path::PathBuf>,
) -> PyResult<Bound<'py, PyAny>> {
    let request = ReplayRequest {
        shared_cap,
        layer_caps: caps_source(layer_caps)?,
        keep: map_source(keep, "keep")?,
        k_used,
        warmup,
        lambda: lam,
        j,
        decay,
        near_pick_n,
        semantics: parse("semantics", semantics)?,
        reset_at_sequence,
        pin: map_source(pin, "pin")?,
        tier2: tier2.as_deref().map(|s| parse("tier2", s)).transpose()?,
        served,
        batch,
        link_gbps,
        compute_ms_per_step,
        prefetch: prefetch.map(|p| parse("prefetch", p)).transpose()?,
        calib: calib.map(trace_source),
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
        ..ReplayRequest::new(trace_source(trace), parse("policy", policy)?, cap)
    };
    let v = crate::run::detached(py, move || {
        let report = request.resolve()?.run()?;
        Ok(report.document())
    })?;
    crate::run::to_result(py, &v)
}
