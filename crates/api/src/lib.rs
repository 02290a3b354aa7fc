//! moe-offload's command layer: for each command both front ends offer, the request (owned,
//! serde), its `resolve` (every rule about which options go together, the readers of keep maps,
//! plans, pins and profiles), its `run` (a typed report) and the JSON document of the report,
//! tagged by one table of kinds ([`kind`]). The CLI (`crates/cli`) turns flags into a request and
//! prints the report; the Python package (`python/`) turns keyword arguments into the same
//! request and returns the document. Neither holds a rule of its own.
//!
//! Errors ([`Error`]) name options neutrally (`‹k_used›`); each front end spells them in its
//! own words through [`Spell`] (`--k-used`, `k_used`).
//!
//! - [`capture`]: routing recorded from a GGUF model in llama.cpp, written as a trace.
//! - [`import`]: the document of `import ... --json` (the trace written and the importer's report).
//! - [`inspect`]: a trace's shape, metadata and per-layer usage.
//! - [`measure`]: `profile measure`, this machine's §14 figures from llama.cpp's kernels.
//! - [`mrc`]: miss-ratio curves.
//! - [`replay`]: one configuration on one trace.
//! - [`inputs`]: traces, keep maps, plans, pins, per-layer caps.
//! - [`llama`]: the llama.cpp flags of a cache plan or a hybrid plan.
//! - [`profile`]: the device profile of a command and its overrides.
//! - [`kind`]: the `kind` tag of every document.
//! - [`work`]: work limits (curve steps without `yes`) and the work of a curve.

pub mod capture;
pub mod error;
pub mod import;
pub mod inputs;
pub mod inspect;
pub mod kind;
pub mod llama;
pub mod measure;
pub mod mrc;
pub mod profile;
pub mod replay;
pub mod work;

pub use error::{Context, Error, ErrorKind, Msg, Neutral, Result, Spell};

/// Serde through `Display` and `FromStr`, for the request fields whose types have no serde of
/// their own (`Exec`).
pub(crate) mod display_from_str {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<T: Display, S: Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Parses an option's value with its type's one parser (`FromStr`), naming the option.
///
/// # Errors
/// [`Error::Usage`]: `‹name›: the parser's message`.
pub fn parse<T: std::str::FromStr>(name: &str, s: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    s.parse().map_err(|e: T::Err| Error::usage(format!("‹{name}› {s:?}: {e}")))
}
