//! `mrc` (miss-ratio curves, as `moe-offload mrc --json` computes them) and `read_results` (a
//! sweep's `results.json`, read and checked by the sweep crate).

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::errors::{Error, Result};
use crate::trace::Trace;

/// Adds `mrc` and `_read_results` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(mrc, m)?)?;
    m.add_function(wrap_pyfunction!(read_results_json, m)?)?;
    Ok(())
}

/// The miss-ratio curve of `policy` on `trace` (SEMANTICS.md §5 replayed at every cap), as
/// `moe-offload mrc TRACE --json` computes it: `min_cap`, `max_cap`, `tokens` (counted),
/// `picks_per_layer`, and `layers`, one `{layer_id, misses}` per layer with the misses at
/// each cap `min_cap..=max_cap` (and `layer_pins` with `pin`). `misses_per_token_at(cap)` of the
/// result sums the layers.
///
/// - `policy`: lru, and belady, near_pick, near_pick_ema and inv_router (k-way) in one pass
///   over every cap; the others by one replay per cap.
/// - `caps`: `(lo, hi)` inclusive, default `(k_used, E)`; `keep`, `k_used`, `warmup`,
///   `semantics` as in `replay`; `pin`: a pin map (lru: the curve of the unpinned stream).
///   Work above about a minute is refused without `yes=True`.
#[pyfunction]
#[pyo3(signature = (
    trace, *, policy="lru", caps=None, keep=None, k_used=None, warmup=64, semantics="k-way", yes=false, pin=None
))]
#[expect(clippy::too_many_arguments, reason = "one keyword argument per CLI flag: the Python signature is the API")]
pub fn mrc<'py>(
    py: Python<'py>,
    trace: &Trace,
    policy: &str,
    caps: Option<(usize, usize)>,
    keep: Option<&Bound<'py, PyAny>>,
    k_used: Option<usize>,
    warmup: usize,
    semantics: &str,
    yes: bool,
    pin: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let request = api::mrc::MrcRequest {
        keep: crate::replay::map_source(keep, "keep")?,
        caps,
        k_used,
        warmup,
        semantics: api::parse("semantics", semantics).map_err(Error::from)?,
        yes,
        pin: crate::replay::map_source(pin, "pin")?,
        ..api::mrc::MrcRequest::new(
            crate::replay::trace_source(trace),
            api::parse("policy", policy).map_err(Error::from)?,
        )
    };
    let v = crate::run::detached(py, move || Ok(request.run(&mut |_| {})?.document()))?;
    crate::run::to_result(py, &v)
}

/// `results.json` of a sweep (a file, or a sweep output directory holding one), read and checked
/// by the sweep crate, as a dict (kind `moe-offload-sweep-results`, `provenance`, `rows`).
#[pyfunction]
#[pyo3(name = "_read_results_json")]
pub fn read_results_json(py: Python<'_>, path: PathBuf) -> PyResult<Bound<'_, PyAny>> {
    let v = crate::run::detached(py, move || read_results(&path))?;
    crate::run::to_py(py, &v)
}

fn read_results(path: &std::path::Path) -> Result<serde_json::Value> {
    let file = if path.is_dir() { path.join("results.json") } else { path.to_path_buf() };
    let out = sweep::SweepOutput::read(&file)?;
    let v = serde_json::to_value(&out).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
    Ok(api::kind::tagged(api::kind::SWEEP_RESULTS, v))
}
