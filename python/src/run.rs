//! Running a long call with the GIL released, interruptible by Ctrl-C.
//!
//! The work runs on a thread of its own (which uses the global rayon pool, as the CLI does)
//! while the calling thread waits without the GIL, waking every 50 ms to let Python run its
//! signal handlers: a Ctrl-C raises `KeyboardInterrupt` in the caller at once. The abandoned
//! work finishes in the background and its result is dropped (the libraries write files only
//! through atomic renames, so nothing half-written is left).

use std::sync::mpsc;
use std::time::Duration;

use pyo3::prelude::*;

use crate::errors::{Error, Result};

/// Runs `f` off the interpreter's thread with the GIL released; see the module docs.
///
/// # Errors
/// The error of `f`; `KeyboardInterrupt` (or another signal handler's exception) when a signal
/// arrives first; [`Error::Internal`] when `f` panics.
pub fn detached<T: Send + 'static>(py: Python<'_>, f: impl FnOnce() -> Result<T> + Send + 'static) -> PyResult<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("moe-offload".into())
        .spawn(move || {
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "a panic without a message".into());
                Err(Error::Internal(format!("internal error (please report it): {msg}")))
            });
            // The receiver is gone when the caller was interrupted: the result is dropped.
            let _ = tx.send(out);
        })
        .map_err(|e| Error::Internal(format!("cannot start a worker thread: {e}")))?;
    let mut rx = rx;
    loop {
        let (got, back) = py.detach(move || (rx.recv_timeout(Duration::from_millis(50)), rx));
        rx = back;
        match got {
            Ok(out) => return Ok(out?),
            Err(mpsc::RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(Error::Internal("internal error: the worker thread ended without a result".into()).into());
            }
        }
    }
}

/// A `serde_json::Value` as a Python object (dicts keep the JSON's key order), through the
/// standard `json` module: the same parse a reader of the CLI's `--json` output does.
///
/// # Errors
/// Only if `json.loads` fails, which it cannot for a value serde_json wrote.
pub fn to_py<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let text = serde_json::to_string(v).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
    py.import("json")?.call_method1("loads", (text,))
}

/// A Python object (dicts, lists, numbers, strings, None) as a `serde_json::Value`, through the
/// standard `json` module.
///
/// # Errors
/// [`Error::Usage`] naming `what` for an object `json.dumps` refuses.
pub fn from_py(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<serde_json::Value> {
    let text: String = py
        .import("json")?
        .call_method1("dumps", (obj,))
        .and_then(|s| s.extract())
        .map_err(|e| Error::Usage(format!("{what}: not JSON-like data ({e})")))?;
    Ok(serde_json::from_str(&text).map_err(|e| Error::Usage(format!("{what}: {e}")))?)
}

/// A `serde_json::Value` (an object) as a `moe_offload.Result`: a dict of the same fields in the
/// same order, readable as attributes too.
///
/// # Errors
/// Only if the Python half of the package cannot be imported.
pub fn to_result<'py>(py: Python<'py>, v: &serde_json::Value) -> PyResult<Bound<'py, PyAny>> {
    let d = to_py(py, v)?;
    py.import("moe_offload._result")?.getattr("Result")?.call1((d,))
}
