//! `moe_offload._core`: the native half of the `moe_offload` Python package.
//!
//! Every function here calls the same library functions as the `moe-offload` command line, in
//! the same order, and assembles the same JSON documents as its `--json` output, so a figure
//! read in Python equals the one the CLI prints (the package's tests compare them). The Python
//! half (`python/moe_offload/`) wraps the JSON into result objects and tables.
//!
//! - [`trace`]: `open_trace`, the `Trace` class and its zero-copy numpy views.
//! - [`saliency_py`]: `stats`, `keep`, `retention`, and the `Stats` and `KeepMap` classes.
//! - [`replay`]: `replay` (plain, deployed, with prefetch or the timeline).
//! - [`curves`]: `mrc` and `read_results`.
//! - [`plan_py`]: `plan` (per-layer caches for a memory budget).
//! - [`sweep_py`]: `sweep` (a grid over two traces).
//! - [`errors`]: the exception classes and the conversion of every library error.
//! - [`run`]: running a long call off the interpreter's thread, with the GIL released and
//!   Ctrl-C honoured.

use pyo3::prelude::*;

pub mod curves;
pub mod errors;
pub mod plan_py;
pub mod replay;
pub mod run;
pub mod saliency_py;
pub mod sweep_py;
pub mod trace;

/// The extension module.
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    errors::register(m)?;
    trace::register(m)?;
    saliency_py::register(m)?;
    replay::register(m)?;
    curves::register(m)?;
    sweep_py::register(m)?;
    plan_py::register(m)?;
    Ok(())
}
