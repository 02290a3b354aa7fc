//! The exception classes: one base, one class per error kind of the libraries, and the
//! conversion of each library error into its class with the library's message (which names the
//! file, tensor, layer or key).

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _core,
    MoeOffloadError,
    PyException,
    "Base class of every error moe_offload raises; the message is the command line's."
);
create_exception!(
    _core,
    TraceError,
    MoeOffloadError,
    "A trace that cannot be read or breaks the format (file, tensor, layer and token named)."
);
create_exception!(
    _core,
    SaliencyError,
    MoeOffloadError,
    "Statistics, keep maps or retention: a bad file, a missing statistic, a K too large."
);
create_exception!(
    _core,
    ReplayError,
    MoeOffloadError,
    "A replay configuration the trace cannot be replayed with (cap, k_used, policy, prefetch)."
);
create_exception!(
    _core,
    SweepError,
    MoeOffloadError,
    "A grid, a sweep output directory or its results.json that cannot be read or run."
);
create_exception!(
    _core,
    UsageError,
    MoeOffloadError,
    "Arguments that do not fit together, or a value out of range (as the CLI refuses a flag)."
);
create_exception!(
    _core,
    InternalError,
    MoeOffloadError,
    "A bug in moe_offload (a panic in the native code): please report it with the message."
);

/// Adds the exception classes to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("MoeOffloadError", py.get_type::<MoeOffloadError>())?;
    m.add("TraceError", py.get_type::<TraceError>())?;
    m.add("SaliencyError", py.get_type::<SaliencyError>())?;
    m.add("ReplayError", py.get_type::<ReplayError>())?;
    m.add("SweepError", py.get_type::<SweepError>())?;
    m.add("UsageError", py.get_type::<UsageError>())?;
    m.add("InternalError", py.get_type::<InternalError>())?;
    Ok(())
}

/// An error of one of the libraries, or of the argument handling here, before it becomes a
/// Python exception (built without the GIL, converted once the GIL is held again).
#[derive(Debug)]
pub enum Error {
    /// trace-io.
    Trace(String),
    /// saliency.
    Saliency(String),
    /// cachesim.
    Replay(String),
    /// sweep.
    Sweep(String),
    /// Arguments.
    Usage(String),
    /// A panic.
    Internal(String),
}

impl Error {
    /// The same kind of error with `prefix: ` before the message (the CLI's context).
    pub fn context(self, prefix: impl std::fmt::Display) -> Error {
        let p = |m: String| format!("{prefix}: {m}");
        match self {
            Error::Trace(m) => Error::Trace(p(m)),
            Error::Saliency(m) => Error::Saliency(p(m)),
            Error::Replay(m) => Error::Replay(p(m)),
            Error::Sweep(m) => Error::Sweep(p(m)),
            Error::Usage(m) => Error::Usage(p(m)),
            Error::Internal(m) => Error::Internal(p(m)),
        }
    }

    /// The same kind of error with `: suffix` after the message (the CLI's hint).
    pub fn hint(self, suffix: impl std::fmt::Display) -> Error {
        let p = |m: String| format!("{m}: {suffix}");
        match self {
            Error::Trace(m) => Error::Trace(p(m)),
            Error::Saliency(m) => Error::Saliency(p(m)),
            Error::Replay(m) => Error::Replay(p(m)),
            Error::Sweep(m) => Error::Sweep(p(m)),
            Error::Usage(m) => Error::Usage(p(m)),
            Error::Internal(m) => Error::Internal(p(m)),
        }
    }
}

/// `Err(Error::Usage(..))` with a formatted message.
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => { return Err($crate::errors::Error::Usage(format!($($t)*)).into()) };
}

impl From<trace_io::TraceError> for Error {
    fn from(e: trace_io::TraceError) -> Error {
        Error::Trace(e.to_string())
    }
}

impl From<saliency::SaliencyError> for Error {
    fn from(e: saliency::SaliencyError) -> Error {
        Error::Saliency(e.to_string())
    }
}

impl From<cachesim::CacheSimError> for Error {
    fn from(e: cachesim::CacheSimError) -> Error {
        Error::Replay(e.to_string())
    }
}

impl From<sweep::SweepError> for Error {
    fn from(e: sweep::SweepError) -> Error {
        Error::Sweep(e.to_string())
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        match e {
            Error::Trace(m) => TraceError::new_err(m),
            Error::Saliency(m) => SaliencyError::new_err(m),
            Error::Replay(m) => ReplayError::new_err(m),
            Error::Sweep(m) => SweepError::new_err(m),
            Error::Usage(m) => UsageError::new_err(m),
            Error::Internal(m) => InternalError::new_err(m),
        }
    }
}

/// The result type of the code that runs without the GIL.
pub type Result<T> = std::result::Result<T, Error>;

/// How Python spells an option that a message of the command layer names (`api::Spell`): the
/// keyword argument (`k_used`; `lam` for λ, a Python keyword), and `name=value` with a string
/// value quoted (`prefetch="coact:B"`, `k_used=8`).
pub struct Keywords;

impl api::Spell for Keywords {
    fn option(&self, name: &str) -> String {
        match name {
            "lambda" => "lam".to_string(),
            n => n.to_string(),
        }
    }

    fn with_value(&self, name: &str, value: &str) -> String {
        let literal = value.parse::<f64>().is_ok() || matches!(value, "True" | "False" | "None");
        if literal { format!("{}={value}", self.option(name)) } else { format!("{}={value:?}", self.option(name)) }
    }
}

impl From<api::Error> for Error {
    fn from(e: api::Error) -> Error {
        let m = e.render(&Keywords);
        match e.kind() {
            api::ErrorKind::Trace => Error::Trace(m),
            api::ErrorKind::Saliency => Error::Saliency(m),
            api::ErrorKind::Replay => Error::Replay(m),
            api::ErrorKind::Sweep => Error::Sweep(m),
            api::ErrorKind::Usage | api::ErrorKind::Io | api::ErrorKind::Capture => Error::Usage(m),
        }
    }
}
