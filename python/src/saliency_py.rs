//! `stats`, `keep`, `retention` (SEMANTICS.md §2-§4) and the `Stats` and `KeepMap` classes, as
//! `moe-offload stats`, `keep` and `retention` compute them.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use saliency::{Budget, BudgetScale, KeepConfig, Metric, MetricConfig};
use trace_io::Reads;

use crate::errors::{Error, Result};
use crate::trace::Trace;
use crate::usage;

/// Adds the functions and classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Stats>()?;
    m.add_class::<KeepMap>()?;
    m.add_function(wrap_pyfunction!(stats, m)?)?;
    m.add_function(wrap_pyfunction!(read_stats, m)?)?;
    m.add_function(wrap_pyfunction!(keep, m)?)?;
    m.add_function(wrap_pyfunction!(read_keep, m)?)?;
    m.add_function(wrap_pyfunction!(full_keep, m)?)?;
    m.add_function(wrap_pyfunction!(retention, m)?)?;
    Ok(())
}

/// A document with `"kind": kind` as its first field, as the tool writes its JSON files.
fn tagged(kind: &str, value: &impl serde::Serialize) -> Result<serde_json::Value> {
    let v = serde_json::to_value(value).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), kind.into());
    if let serde_json::Value::Object(fields) = v {
        out.extend(fields.into_iter().filter(|(k, _)| k != "kind"));
    }
    Ok(serde_json::Value::Object(out))
}

/// Per-(layer, expert) saliency statistics (SEMANTICS.md §2): what `moe-offload stats` writes.
///
/// `to_dict()` is the statistics file's JSON (kind `moe-offload-stats`); `write(path)` writes
/// that file atomically.
#[pyclass(module = "moe_offload._core", frozen)]
pub struct Stats {
    pub(crate) inner: Arc<saliency::Stats>,
}

#[pymethods]
impl Stats {
    /// E: routed experts per layer.
    #[getter]
    fn num_experts(&self) -> u32 {
        self.inner.meta.num_experts
    }

    /// k: the model's experts per token.
    #[getter]
    fn top_k(&self) -> u32 {
        self.inner.meta.top_k
    }

    /// The model's id of each layer.
    #[getter]
    fn layer_ids(&self) -> Vec<u32> {
        self.inner.meta.layer_ids.clone()
    }

    /// Where the statistics came from (the trace path as given).
    #[getter]
    fn source(&self) -> String {
        self.inner.meta.source.clone()
    }

    /// `count[l][e]`: slots of layer index l routed to expert e (over the first k slots of each
    /// row), a list of L lists of E counts.
    #[getter]
    fn count(&self) -> Vec<Vec<u64>> {
        self.inner.layers.iter().map(|l| l.count.clone()).collect()
    }

    /// The names of the statistics present (`count`, `gate_sum`, `ean_sum`, `reap_sum`, ...).
    #[getter]
    fn present(&self) -> Vec<String> {
        self.inner.present_statistics().into_iter().map(|s| s.to_string()).collect()
    }

    /// The statistics file's JSON document as a dict (kind `moe-offload-stats` first).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::run::to_py(py, &tagged(saliency::STATS_KIND, &*self.inner)?)
    }

    /// Writes the statistics JSON file to `path` (atomically: temporary file, then rename).
    fn write(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let s = self.inner.clone();
        crate::run::detached(py, move || Ok(s.write_json(&path)?))
    }

    fn __repr__(&self) -> String {
        let m = &self.inner.meta;
        format!(
            "Stats(source={:?}, layers={}, num_experts={}, top_k={})",
            m.source,
            m.layer_ids.len(),
            m.num_experts,
            m.top_k
        )
    }
}

/// Statistics of `trace` (SEMANTICS.md §2), as `moe-offload stats TRACE -o FILE` computes them:
/// the first k ids of each row, the gates and the norms are validated, and the file's digest is
/// recorded as the provenance (`source` is the path the trace was opened with).
#[pyfunction]
pub fn stats(py: Python<'_>, trace: &Trace) -> PyResult<Stats> {
    trace.require_tokens()?;
    let (file, path) = (trace.file.clone(), trace.path.clone());
    let s = crate::run::detached(py, move || {
        let (view, digest) =
            rayon::join(|| file.view_for(Reads::stats(file.shape().top_k)), || trace_io::trace_digest(&path));
        Ok(saliency::Stats::from_trace(&view?, path.display().to_string(), digest?))
    })?;
    Ok(Stats { inner: Arc::new(s) })
}

/// Reads a statistics JSON file written by `moe-offload stats` (or `Stats.write`).
#[pyfunction]
pub fn read_stats(py: Python<'_>, path: PathBuf) -> PyResult<Stats> {
    let s = crate::run::detached(py, move || Ok(saliency::Stats::read_json(&path)?))?;
    Ok(Stats { inner: Arc::new(s) })
}

/// The experts kept per layer (SEMANTICS.md §3): what `moe-offload keep` writes.
///
/// `layers[l]` lists the kept expert ids of layer index l (ascending). `to_dict()` is the
/// keep-map file's JSON (kind `moe-offload-keep-map`); `write(path)` writes it.
#[pyclass(module = "moe_offload._core", frozen)]
pub struct KeepMap {
    pub(crate) inner: Arc<saliency::KeepMap>,
}

#[pymethods]
impl KeepMap {
    /// The label in keys and tables: `full`, `frequency@32`, `reap@budget1536`.
    #[getter]
    fn label(&self) -> String {
        self.inner.label()
    }

    /// The metric name (`full` for the unpruned map).
    #[getter]
    fn metric(&self) -> String {
        self.inner.metric.clone()
    }

    /// K, experts kept per layer (the largest per-layer K of a budget map).
    #[getter]
    fn k(&self) -> u32 {
        self.inner.k
    }

    /// E: routed experts per layer.
    #[getter]
    fn num_experts(&self) -> u32 {
        self.inner.num_experts
    }

    /// The model's id of each layer.
    #[getter]
    fn layer_ids(&self) -> Vec<u32> {
        self.inner.layer_ids.clone()
    }

    /// Kept expert ids per layer index, ascending.
    #[getter]
    fn layers(&self) -> Vec<Vec<u16>> {
        self.inner.layers.clone()
    }

    /// Ids of layers that had fewer usable experts than K (with `allow_short_layers`).
    #[getter]
    fn short_layers(&self) -> Vec<u32> {
        self.inner.short_layers.clone()
    }

    /// Experts kept over all layers.
    #[getter]
    fn total_kept(&self) -> u64 {
        self.inner.total_kept() as u64
    }

    /// The keep-map file's JSON document as a dict (kind `moe-offload-keep-map` first).
    fn to_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        crate::run::to_py(py, &tagged(saliency::KEEP_MAP_KIND, &*self.inner)?)
    }

    /// Writes the keep-map JSON file to `path` (atomically).
    fn write(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        let m = self.inner.clone();
        crate::run::detached(py, move || Ok(m.write_json(&path)?))
    }

    fn __repr__(&self) -> String {
        format!(
            "KeepMap({:?}, layers={}, total_kept={})",
            self.inner.label(),
            self.inner.layers.len(),
            self.total_kept()
        )
    }
}

/// Reads a keep-map JSON file written by `moe-offload keep` (or `KeepMap.write`).
#[pyfunction]
pub fn read_keep(py: Python<'_>, path: PathBuf) -> PyResult<KeepMap> {
    let m = crate::run::detached(py, move || Ok(saliency::KeepMap::read_json(&path)?))?;
    Ok(KeepMap { inner: Arc::new(m) })
}

/// The unpruned map of a trace or statistics: every expert of every layer kept (label `full`).
#[pyfunction]
pub fn full_keep(source: &Bound<'_, PyAny>) -> PyResult<KeepMap> {
    let (e, ids) = if let Ok(t) = source.cast::<Trace>() {
        let t = t.get();
        (t.file.meta().num_experts, t.file.meta().layer_ids.clone())
    } else if let Ok(s) = source.cast::<Stats>() {
        let s = s.get();
        (s.inner.meta.num_experts, s.inner.meta.layer_ids.clone())
    } else {
        return Err(Error::Usage("full_keep takes a Trace or Stats".into()).into());
    };
    Ok(KeepMap { inner: Arc::new(saliency::KeepMap::full(e, ids)) })
}

/// The CLI's hint for a keep-map error that states no fix.
fn keep_hint(e: saliency::SaliencyError) -> Error {
    use saliency::SaliencyError as E;
    let hint = match &e {
        E::KTooLarge { num_experts, .. } => format!("use k={num_experts} or less"),
        E::MissingStatistic { .. } => "use a metric these statistics support (frequency or gate_sum need no output \
            norms), or record output norms (python/capture_routing.py does)"
            .to_string(),
        E::ShortLayer { .. } => "pass allow_short_layers=True, or use a smaller k".to_string(),
        E::PartialStatistic { .. } => {
            "rank with statistics whose reap_sum is complete (--non-finite-reap drop keeps frequency)".to_string()
        }
        _ => return e.into(),
    };
    Error::from(e).hint(hint)
}

fn parse<T: std::str::FromStr>(what: &str, s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| Error::Usage(format!("{what}: {e}")))
}

/// A keep map built from `stats` (SEMANTICS.md §3), as `moe-offload keep STATS --metric M --k K`
/// (or `--budget B`) builds it.
///
/// - `metric`: frequency, gate_sum, ean_sum, ean_mean, reap, l2_sum, shrink, hybrid.
/// - `k`: experts kept per layer; or `budget`: experts kept over all layers (each layer at least
///   `floor`, default the model's k; `budget_scale`: share, percentile or raw). Exactly one of
///   `k` and `budget`.
/// - `tau`: τ of `shrink`; `hybrid_base`: base metrics of `hybrid`.
/// - `allow_short_layers`: keep fewer than K in a layer with fewer routed experts.
#[pyfunction]
#[pyo3(signature = (stats, metric, k=None, *, budget=None, floor=None, budget_scale=None, tau=64.0, hybrid_base=None, allow_short_layers=false))]
#[expect(clippy::too_many_arguments, reason = "one keyword argument per CLI flag: the Python signature is the API")]
pub fn keep(
    py: Python<'_>,
    stats: &Stats,
    metric: &str,
    k: Option<usize>,
    budget: Option<u64>,
    floor: Option<u32>,
    budget_scale: Option<&str>,
    tau: f64,
    hybrid_base: Option<Vec<String>>,
    allow_short_layers: bool,
) -> PyResult<KeepMap> {
    let metric: Metric = parse("metric", metric)?;
    let hybrid_base = hybrid_base
        .map(|b| b.iter().map(|m| parse::<Metric>("hybrid_base", m)).collect::<Result<Vec<_>>>())
        .transpose()?;
    if hybrid_base.is_some() && metric != Metric::Hybrid {
        usage!("hybrid_base applies to metric hybrid only: drop hybrid_base or use metric=\"hybrid\"");
    }
    let scale: Option<BudgetScale> = budget_scale.map(|s| parse("budget_scale", s)).transpose()?;
    if budget.is_none() && (floor.is_some() || scale.is_some()) {
        usage!("floor and budget_scale apply to budget maps only: drop them, or give budget instead of k");
    }
    let cfg = KeepConfig { metric: MetricConfig { tau, hybrid_base }, allow_short_layers };
    let s = stats.inner.clone();
    let map = crate::run::detached(py, move || match (k, budget) {
        (Some(k), None) => Ok(saliency::KeepMap::build_many(&s, metric, &[k], &cfg).map_err(keep_hint)?.remove(0)),
        (None, Some(total)) => {
            let mut b = Budget::new(&s, metric, total);
            if let Some(f) = floor {
                b.floor = f;
            }
            if let Some(sc) = scale {
                b.scale = sc;
            }
            Ok(saliency::KeepMap::build_budget(&s, metric, &b, &cfg).map_err(keep_hint)?)
        }
        _ => usage!("give exactly one of k (experts per layer) and budget (experts over all layers)"),
    })?;
    Ok(KeepMap { inner: Arc::new(map) })
}

/// Out-of-sample retention of `keep` on held-out data (SEMANTICS.md §4), as
/// `moe-offload retention KEEP --heldout H --json` computes it: `heldout` is a `Trace` (gives
/// `prob_retention` too; validated whole, as the CLI does) or a `Stats`. Returns one entry of the
/// CLI's `maps` list: `label`, `per_layer`, `mean`, `min`, `max_slot_replacement`, `heldout`.
#[pyfunction]
pub fn retention<'py>(py: Python<'py>, keep: &KeepMap, heldout: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let map = keep.inner.clone();
    let v = if let Ok(t) = heldout.cast::<Trace>() {
        let t = t.get();
        t.require_tokens()?;
        let (file, name) = (t.file.clone(), t.display());
        crate::run::detached(py, move || {
            let view = file
                .view_for(Reads::EVERYTHING)
                .map_err(|e| Error::from(e).context(format!("held-out trace {name}")))?;
            let stats = saliency::Stats::from_trace(&view, name.clone(), String::new());
            let r = saliency::retention(&map, &stats, Some(&view))
                .map_err(|e| Error::from(e).context(format!("retention of {} on {name}", map.label())))?;
            with_heldout(&r, &name)
        })?
    } else if let Ok(s) = heldout.cast::<Stats>() {
        let s = s.get().inner.clone();
        crate::run::detached(py, move || {
            let name = s.meta.source.clone();
            let r = saliency::retention(&map, &s, None)
                .map_err(|e| Error::from(e).context(format!("retention of {} on {name}", map.label())))?;
            with_heldout(&r, &name)
        })?
    } else {
        return Err(Error::Usage("retention: heldout must be a Trace or Stats".into()).into());
    };
    crate::run::to_py(py, &v)
}

fn with_heldout(r: &saliency::Retention, name: &str) -> Result<serde_json::Value> {
    let mut v = serde_json::to_value(r).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
    if let Some(o) = v.as_object_mut() {
        o.insert("heldout".into(), name.into());
    }
    Ok(v)
}
