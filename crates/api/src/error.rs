//! The one error type of the command layer, whose messages name options neutrally.
//!
//! A message that names an option writes it as `‹name›` (the option alone: `‹k_used›`) or
//! `‹name=value›` (the option given a value: `‹prefetch=coact:B›`); each front end spells the
//! markers in its own words through [`Spell`] (the CLI `--k-used`, `--prefetch coact:B`; Python
//! `k_used`, `prefetch="coact:B"`). Neutral names are the snake_case names of the request's fields.

use std::fmt;

/// How a front end spells an option named in a message.
pub trait Spell {
    /// The option alone (`k_used` → `--k-used`).
    fn option(&self, name: &str) -> String;
    /// The option given `value` (`prefetch`, `coact:B` → `--prefetch coact:B`).
    fn with_value(&self, name: &str, value: &str) -> String;
}

/// The neutral spelling: `name` and `name=value` (what `Display` shows).
#[derive(Debug, Clone, Copy, Default)]
pub struct Neutral;

impl Spell for Neutral {
    fn option(&self, name: &str) -> String {
        name.to_string()
    }

    fn with_value(&self, name: &str, value: &str) -> String {
        format!("{name}={value}")
    }
}

/// A message with option markers (`‹name›`, `‹name=value›`; see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Msg(String);

impl Msg {
    /// The message spelled by `s`: every `‹...›` marker replaced by the front end's words.
    pub fn render(&self, s: &dyn Spell) -> String {
        let mut out = String::with_capacity(self.0.len());
        let mut rest = self.0.as_str();
        while let Some(open) = rest.find('‹') {
            out.push_str(&rest[..open]);
            let after = &rest[open + '‹'.len_utf8()..];
            let Some(close) = after.find('›') else {
                out.push_str(&rest[open..]);
                return out;
            };
            let marker = &after[..close];
            match marker.split_once('=') {
                Some((name, value)) => out.push_str(&s.with_value(name, value)),
                None => out.push_str(&s.option(marker)),
            }
            rest = &after[close + '›'.len_utf8()..];
        }
        out.push_str(rest);
        out
    }
}

impl From<String> for Msg {
    fn from(s: String) -> Msg {
        Msg(s)
    }
}

impl From<&str> for Msg {
    fn from(s: &str) -> Msg {
        Msg(s.to_string())
    }
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.render(&Neutral))
    }
}

/// The library an error comes from, or the request itself: what a front end maps to its error
/// classes (Python's `TraceError`, `UsageError`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A trace that cannot be read or breaks the format (`trace-io`).
    Trace,
    /// Statistics, keep maps, retention (`saliency`).
    Saliency,
    /// A replay configuration (`cachesim`).
    Replay,
    /// Grids, profiles, plans, sweep outputs (`sweep`).
    Sweep,
    /// A capture from llama.cpp: the model, its graph, the run (`capture`).
    Capture,
    /// Options that do not fit together, or a value out of range.
    Usage,
    /// A file the command reads besides the libraries' own (a plan, a list of caps).
    Io,
}

/// An error of a command: a library's, or the request's own, with the context the command adds.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// From `trace-io`.
    #[error(transparent)]
    Trace(#[from] trace_io::TraceError),
    /// From `saliency`.
    #[error(transparent)]
    Saliency(#[from] saliency::SaliencyError),
    /// From `cachesim`.
    #[error(transparent)]
    Replay(#[from] cachesim::CacheSimError),
    /// From `sweep`.
    #[error(transparent)]
    Sweep(#[from] sweep::SweepError),
    /// From `capture` (llama.cpp).
    #[error(transparent)]
    Capture(capture::CaptureError),
    /// Options that do not fit together or a value out of range, named neutrally.
    #[error("{0}")]
    Usage(Msg),
    /// A file that cannot be read.
    #[error("reading {}: {source}", path.display())]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// `context: source` (the input or option the error is about, before it).
    #[error("{context}: {source}")]
    Context {
        /// What the error is about (a file, an option).
        context: Msg,
        /// The error.
        source: Box<Error>,
    },
    /// `source: hint` (what to do, after it).
    #[error("{source}: {hint}")]
    Hint {
        /// The error.
        source: Box<Error>,
        /// What to do.
        hint: Msg,
    },
}

/// A capture's settings out of range are usage errors (their messages carry option markers), its
/// trace errors trace errors; the rest stay capture errors.
impl From<capture::CaptureError> for Error {
    fn from(e: capture::CaptureError) -> Error {
        match e {
            capture::CaptureError::Config(m) => Error::Usage(m.into()),
            capture::CaptureError::Trace(t) => Error::Trace(t),
            e => Error::Capture(e),
        }
    }
}

/// The result type of the command layer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A usage error (options that do not fit together) with option markers.
    pub fn usage(msg: impl Into<Msg>) -> Error {
        Error::Usage(msg.into())
    }

    /// A file that cannot be read.
    pub fn io(path: &std::path::Path, source: std::io::Error) -> Error {
        Error::Io { path: path.to_path_buf(), source }
    }

    /// `context: self`.
    #[must_use]
    pub fn context(self, context: impl Into<Msg>) -> Error {
        Error::Context { context: context.into(), source: Box::new(self) }
    }

    /// `self: hint`.
    #[must_use]
    pub fn hint(self, hint: impl Into<Msg>) -> Error {
        Error::Hint { source: Box::new(self), hint: hint.into() }
    }

    /// The kind of the error at the root of the context.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Trace(_) => ErrorKind::Trace,
            Error::Saliency(_) => ErrorKind::Saliency,
            Error::Replay(_) => ErrorKind::Replay,
            Error::Sweep(_) => ErrorKind::Sweep,
            Error::Capture(_) => ErrorKind::Capture,
            Error::Usage(_) => ErrorKind::Usage,
            Error::Io { .. } => ErrorKind::Io,
            Error::Context { source, .. } | Error::Hint { source, .. } => source.kind(),
        }
    }

    /// The message with every option spelled by `s`.
    pub fn render(&self, s: &dyn Spell) -> String {
        match self {
            Error::Usage(m) => m.render(s),
            Error::Context { context, source } => format!("{}: {}", context.render(s), source.render(s)),
            Error::Hint { source, hint } => format!("{}: {}", source.render(s), hint.render(s)),
            e => e.to_string(),
        }
    }
}

/// `return Err(Error::Usage(..))` with a formatted message (option markers allowed).
#[macro_export]
macro_rules! usage {
    ($($t:tt)*) => { return Err($crate::Error::usage(format!($($t)*))) };
}

/// Extension of library results: context and hints on the way into [`Error`].
pub trait Context<T> {
    /// `context: error`.
    ///
    /// # Errors
    /// The error, with the context before it.
    fn context(self, context: impl Into<Msg>) -> Result<T>;
    /// As [`Context::context`], the context computed only on error.
    ///
    /// # Errors
    /// The error, with the context before it.
    fn with_context<M: Into<Msg>>(self, context: impl FnOnce() -> M) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Into<Msg>) -> Result<T> {
        self.map_err(|e| e.into().context(context))
    }

    fn with_context<M: Into<Msg>>(self, context: impl FnOnce() -> M) -> Result<T> {
        self.map_err(|e| e.into().context(context()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Cli;
    impl Spell for Cli {
        fn option(&self, name: &str) -> String {
            format!("--{}", name.replace('_', "-"))
        }
        fn with_value(&self, name: &str, value: &str) -> String {
            format!("{} {value}", self.option(name))
        }
    }

    #[test]
    fn markers_are_spelled_by_the_front_end() {
        let m = Msg::from("‹calib› is read only by coact: add ‹prefetch=coact:B›, or drop ‹calib›");
        assert_eq!(m.render(&Cli), "--calib is read only by coact: add --prefetch coact:B, or drop --calib");
        assert_eq!(m.to_string(), "calib is read only by coact: add prefetch=coact:B, or drop calib");
        // An unclosed marker is kept as it is.
        assert_eq!(Msg::from("a ‹b").render(&Cli), "a ‹b");
    }

    #[test]
    fn the_kind_is_the_root_s() {
        let e = Error::usage("‹k_used› 0").context("x").hint("y");
        assert_eq!(e.kind(), ErrorKind::Usage);
        assert_eq!(e.render(&Cli), "x: --k-used 0: y");
    }
}
