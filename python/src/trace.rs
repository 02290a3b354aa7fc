//! `open_trace` and the `Trace` class: a memory-mapped trace and zero-copy numpy views of it.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use trace_io::{Reads, TraceFile};

use crate::errors::{Error, Result};

/// Adds `open_trace`, `Trace` and `_Mapped` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Trace>()?;
    m.add_class::<Mapped>()?;
    m.add_function(wrap_pyfunction!(open_trace, m)?)?;
    m.add_function(wrap_pyfunction!(import_esft, m)?)?;
    m.add_function(wrap_pyfunction!(inspect, m)?)?;
    Ok(())
}

/// What `moe-offload inspect TRACE --json` reports: `path`, `bytes`, `shape`, `meta`, `tensors`,
/// sequence and step sizes (`sequences`, `steps`: count, min, median, mean, max), the mean
/// next-token expert reuse and its shuffled-order control, and per layer (`layers`) the experts
/// used, the routing entropy in bits, the top-10% share and the reuse figures. Validates every
/// value first, as `inspect` does.
#[pyfunction]
pub fn inspect<'py>(py: Python<'py>, trace: &Trace) -> PyResult<Bound<'py, PyAny>> {
    let request = api::inspect::InspectRequest { trace: crate::replay::trace_source(trace) };
    let report = crate::run::detached(py, move || Ok(request.run()?.document()))?;
    crate::run::to_result(py, &report)
}

/// Imports the ESFT expert-score layout (DeepSeek-V2-Lite: one text file per domain and layer)
/// as `moe-offload import esft DIR --domains ... -o OUTPUT` does, writes the trace to `output`
/// and opens it. `domains` are concatenated in order (default: intent, law, summary,
/// translation); docs/importers.md says how probabilities become scores.
#[pyfunction]
#[pyo3(signature = (dir, output, *, domains=None, num_experts=64, top_k=6))]
pub fn import_esft(
    py: Python<'_>,
    dir: PathBuf,
    output: PathBuf,
    domains: Option<Vec<String>>,
    num_experts: u32,
    top_k: u32,
) -> PyResult<Trace> {
    use trace_io::import::esft::{EsftOptions, import_esft_with_report};
    let out = output.clone();
    crate::run::detached(py, move || {
        let mut opts = EsftOptions { num_experts, top_k, ..Default::default() };
        if let Some(d) = domains {
            opts.domains = d;
        }
        let imported = import_esft_with_report(&dir, &opts)?;
        trace_io::write_trace(&out, &imported.trace.view())?;
        Ok(())
    })?;
    open_trace(py, output)
}

/// A routing trace, memory-mapped (SEMANTICS.md §1; docs/trace-format.md).
///
/// Opened as the command line opens it: the container, every tensor's dtype, shape and
/// alignment, the metadata and the sequence and step offsets are checked when opened; the
/// content (ids < E and distinct, scores finite and non-increasing, gates finite and >= 0) is
/// validated for what a call reads before it reads it, once per trace. The arrays of
/// `ids`, `scores` and `gates` are read-only views of the mapped file: they keep the mapping
/// alive after the `Trace` is gone. The file must not be modified in place while mapped
/// (moe-offload's writers replace files by rename only).
#[pyclass(module = "moe_offload._core", frozen)]
pub struct Trace {
    pub(crate) file: Arc<TraceFile>,
    /// The path as given (the `source` of statistics, as the CLI records it).
    pub(crate) path: PathBuf,
}

/// Opens the trace at `path` (a `.safetensors` file) as the command line does.
///
/// Raises `TraceError` naming the file for a file that is missing, not a regular file, not a
/// safetensors container, or whose tensors or metadata break the trace format.
#[pyfunction]
pub fn open_trace(py: Python<'_>, path: PathBuf) -> PyResult<Trace> {
    let p = path.clone();
    let file = crate::run::detached(py, move || Ok(TraceFile::open_lazy(&p)?))?;
    Ok(Trace { file: Arc::new(file), path })
}

/// The kinds of tensor a view can show.
#[derive(Clone, Copy)]
enum Tensor {
    Ids,
    Scores,
    Gates,
    OutNorms,
}

impl Tensor {
    fn name(self) -> &'static str {
        match self {
            Tensor::Ids => "ids",
            Tensor::Scores => "scores",
            Tensor::Gates => "gates",
            Tensor::OutNorms => "out_norms",
        }
    }

    fn reads(self) -> Reads {
        match self {
            Tensor::Ids => Reads::ids(usize::MAX),
            Tensor::Scores => Reads { scores: true, ..Reads::NOTHING },
            Tensor::Gates => Reads { gates: true, ..Reads::NOTHING },
            Tensor::OutNorms => Reads { out_norms: true, ..Reads::NOTHING },
        }
    }
}

impl Trace {
    /// The path as a display string.
    pub(crate) fn display(&self) -> String {
        self.path.display().to_string()
    }

    /// Refuses a trace without tokens, as the CLI's commands do.
    pub(crate) fn require_tokens(&self) -> Result<()> {
        let s = self.file.shape();
        if s.tokens == 0 {
            let layers = if s.layers == 1 { "1 layer".to_string() } else { format!("{} layers", s.layers) };
            return Err(Error::Usage(format!(
                "{} has no tokens ({layers} x 0 tokens): no figure can be computed from it; import or record a trace \
                 with tokens",
                self.display()
            )));
        }
        Ok(())
    }

    /// A read-only numpy array over one layer of `tensor`, validated first.
    fn array<'py>(&self, py: Python<'py>, tensor: Tensor, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        let s = self.file.shape();
        if layer >= s.layers {
            return Err(Error::Usage(format!(
                "{}: layer index {layer} is out of range: the trace has {} layers (indices 0..{}; layer ids {:?})",
                self.display(),
                s.layers,
                s.layers,
                self.file.meta().layer_ids
            ))
            .into());
        }
        // Validated once per trace (later calls find it done); the view then covers the tensor.
        let file = self.file.clone();
        crate::run::detached(py, move || {
            file.view_for(tensor.reads())?;
            Ok(())
        })?;
        let view = self.file.view();
        let (ptr, width, typestr) = match tensor {
            Tensor::Ids => (view.layer_ids(layer).as_ptr() as usize, s.candidates, "<u2"),
            t => {
                let data = match t {
                    Tensor::Scores => view.layer_scores(layer),
                    Tensor::Gates => view.layer_gates(layer),
                    _ => view.layer_out_norms(layer),
                };
                let Some(data) = data else {
                    return Err(Error::Trace(format!(
                        "{}: tensor `{}` is missing (the trace records none; see docs/trace-format.md)",
                        self.display(),
                        t.name()
                    ))
                    .into());
                };
                let width = if matches!(t, Tensor::Scores) { s.candidates } else { s.top_k };
                (data.as_ptr() as usize, width, "<f4")
            }
        };
        let holder = Mapped { _file: self.file.clone(), ptr, shape: (s.tokens, width), typestr };
        py.import("numpy")?.call_method1("asarray", (holder,))
    }
}

#[pymethods]
impl Trace {
    /// The path the trace was opened from.
    #[getter]
    fn path(&self) -> String {
        self.display()
    }

    /// L: traced MoE layers.
    #[getter]
    fn num_layers(&self) -> usize {
        self.file.shape().layers
    }

    /// E: routed experts per layer.
    #[getter]
    fn num_experts(&self) -> usize {
        self.file.shape().num_experts
    }

    /// k: experts the model used per token (the first k candidates).
    #[getter]
    fn top_k(&self) -> usize {
        self.file.shape().top_k
    }

    /// m: router candidates recorded per (layer, token), m >= k.
    #[getter]
    fn candidates(&self) -> usize {
        self.file.shape().candidates
    }

    /// T: tokens, in trace order.
    #[getter]
    fn tokens(&self) -> usize {
        self.file.shape().tokens
    }

    /// The model's id of each traced layer (index l of `ids(l)` is layer `layer_ids[l]`).
    #[getter]
    fn layer_ids(&self) -> Vec<u32> {
        self.file.meta().layer_ids.clone()
    }

    /// Size of the file in bytes.
    #[getter]
    fn byte_len(&self) -> usize {
        self.file.byte_len()
    }

    /// The trace's metadata as the file stores it (string keys and values: `model`,
    /// `num_experts`, `top_k`, `layer_ids`, `score_kind`, `phase`, ...).
    #[getter]
    fn metadata<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.file.meta().to_map() {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Which optional tensors the trace holds: a subset of `scores`, `gates`, `out_norms`,
    /// `seq_offsets`, `step_offsets`, `lookahead_ids`.
    #[getter]
    fn tensors(&self) -> Vec<&'static str> {
        let p = self.file.view().parts();
        let mut out = vec!["ids"];
        for (present, name) in [
            (p.scores.is_some(), "scores"),
            (p.gates.is_some(), "gates"),
            (p.out_norms.is_some(), "out_norms"),
            (p.seq_offsets.is_some(), "seq_offsets"),
            (p.step_offsets.is_some(), "step_offsets"),
            (p.lookahead_ids.is_some(), "lookahead_ids"),
        ] {
            if present {
                out.push(name);
            }
        }
        out
    }

    /// First token of each sequence (`seq_offsets`), or None when the trace records none.
    #[getter]
    fn seq_offsets(&self) -> Option<Vec<u64>> {
        self.file.view().seq_offsets().map(<[u64]>::to_vec)
    }

    /// First token of each engine step (`step_offsets`), or None when the trace records none.
    #[getter]
    fn step_offsets(&self) -> Option<Vec<u64>> {
        self.file.view().step_offsets().map(<[u64]>::to_vec)
    }

    /// Candidate expert ids of layer index `layer`, in descending router score: a read-only
    /// numpy array of uint16, shape `[T, m]`, a view of the mapped file (no copy). Every id of
    /// the trace is validated on the first call (ids < E, distinct within a row).
    fn ids<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, Tensor::Ids, layer)
    }

    /// Router scores (logits or log-probabilities, `metadata["score_kind"]`) of layer index
    /// `layer`: a read-only numpy array of float32, shape `[T, m]`, a view of the mapped file.
    /// Raises `TraceError` when the trace records no scores.
    fn scores<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, Tensor::Scores, layer)
    }

    /// Gate weights applied to the k used experts of layer index `layer`: a read-only numpy
    /// array of float32, shape `[T, k]`, a view of the mapped file. Raises `TraceError` when
    /// the trace records no gates.
    fn gates<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, Tensor::Gates, layer)
    }

    /// L2 norms of the used experts' outputs of layer index `layer`: a read-only numpy array of
    /// float32, shape `[T, k]`, a view of the mapped file. Raises `TraceError` when the trace
    /// records no norms.
    fn out_norms<'py>(&self, py: Python<'py>, layer: usize) -> PyResult<Bound<'py, PyAny>> {
        self.array(py, Tensor::OutNorms, layer)
    }

    /// Validates every value of every tensor (what `moe-offload inspect` checks); raises
    /// `TraceError` naming the file, tensor, layer and token of the first violation.
    fn validate(&self, py: Python<'_>) -> PyResult<()> {
        let file = self.file.clone();
        crate::run::detached(py, move || {
            file.view_for(Reads::EVERYTHING)?;
            Ok(())
        })
    }

    fn __repr__(&self) -> String {
        let s = self.file.shape();
        format!(
            "Trace({:?}, model={:?}, num_layers={}, tokens={}, candidates={}, top_k={}, num_experts={})",
            self.display(),
            self.file.meta().model,
            s.layers,
            s.tokens,
            s.candidates,
            s.top_k,
            s.num_experts
        )
    }
}

/// The owner of a numpy view of a mapped trace: its `__array_interface__` points into the
/// mapping, which it keeps alive (numpy keeps it as the array's `base`).
#[pyclass(module = "moe_offload._core", name = "_Mapped", frozen)]
pub struct Mapped {
    _file: Arc<TraceFile>,
    ptr: usize,
    shape: (usize, usize),
    typestr: &'static str,
}

#[pymethods]
impl Mapped {
    /// numpy's array interface (version 3): read-only data at the mapped address.
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("version", 3)?;
        d.set_item("shape", PyTuple::new(py, [self.shape.0, self.shape.1])?)?;
        d.set_item("typestr", self.typestr)?;
        d.set_item("data", (self.ptr, true))?;
        Ok(d)
    }
}
