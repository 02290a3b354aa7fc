//! `mrc` (miss-ratio curves, as `moe-offload mrc --json` computes them) and `read_results` (a
//! sweep's `results.json`, read and checked by the sweep crate).

use std::path::PathBuf;
use std::sync::Arc;

use cachesim::mrc::CurveConfig;
use cachesim::{Keep, Policy};
use pyo3::prelude::*;
use trace_io::TraceFile;

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
/// each cap `min_cap..=max_cap`. `misses_per_token_at(cap)` of the result sums the layers.
///
/// - `policy`: lru, and belady, near_pick, near_pick_ema and inv_router (k-way) in one pass
///   over every cap; fifo, lfu, perfect_lfu and lfru by one replay per cap.
/// - `caps`: `(lo, hi)` inclusive, default `(k_used, E)`; `keep`, `k_used`, `warmup`,
///   `semantics` as in `replay`. Work above about a minute is refused without `yes=True`.
#[pyfunction]
#[pyo3(signature = (trace, *, policy="lru", caps=None, keep=None, k_used=None, warmup=64, semantics="k-way", yes=false))]
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
) -> PyResult<Bound<'py, PyAny>> {
    let policy: Policy = policy.parse().map_err(|e| Error::Usage(format!("policy: {e}")))?;
    let semantics = semantics.parse().map_err(|e| Error::Usage(format!("semantics: {e}")))?;
    if let Some((a, b)) = caps.filter(|(a, b)| a > b) {
        return Err(Error::Usage(format!("caps: empty range {a}..{b}")).into());
    }
    trace.require_tokens()?;
    let keep = crate::replay::map_source(keep, "keep")?;
    let file: Arc<TraceFile> = trace.file.clone();
    let v = crate::run::detached(py, move || {
        let v = file.view_for(trace_io::Reads::EVERYTHING)?;
        let s = v.shape();
        let keep = match &keep {
            Some(src) => {
                let (map, name) = (api::inputs::read_keep(src, false)?, src.name());
                api::inputs::check_map_fits(&map, v.meta(), &name)?;
                Keep::from_layers(&s, &map.layers).map_err(|e| Error::from(e).context(format!("keep map {name}")))?
            }
            None => Keep::full(&s),
        };
        let k = k_used.unwrap_or(s.top_k);
        let (lo, hi) = caps.unwrap_or((k, s.num_experts));
        let work = cachesim::mrc::curve_work(&s, policy, semantics, k, lo, hi);
        api::work::bound_curves(work.steps, yes, "narrow ‹caps›")?;
        let base = CurveConfig { k_used, warmup, semantics, ..CurveConfig::default() };
        let c = sweep::plan::miss_curve(&v, &keep, policy, &base, caps)?;
        let v = serde_json::to_value(&c).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
        Ok(api::kind::tagged(api::kind::MRC, v))
    })?;
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
