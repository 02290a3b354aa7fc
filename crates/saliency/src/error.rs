//! The one error type of the saliency crate.

use std::path::{Path, PathBuf};

/// Everything that can go wrong computing statistics, metrics, keep maps and retention, or reading
/// and writing their JSON files. Variants carry the context needed to find the problem (metric,
/// statistic, layer id, file path).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SaliencyError {
    /// A metric needs a statistic the statistics do not hold (SEMANTICS.md §2: an error, not a guess).
    #[error(
        "metric `{metric}` needs the statistic `{statistic}`, which these statistics do not hold{}",
        missing_hint(statistic)
    )]
    MissingStatistic {
        /// The metric asked for (or the computation, e.g. `retention`).
        metric: String,
        /// The absent statistic (`gate_sum`, `ean_sum`, `reap_sum`, `reap_sumsq`, or a trace tensor).
        statistic: &'static str,
    },
    /// A metric needs a statistic some of whose (layer, expert) entries are unknown (for example
    /// `reap_sum` of a REAP aggregate corpus loaded with [`crate::NonFiniteReap::MaskExperts`]):
    /// ranking experts with unknown scores would be a guess.
    #[error(
        "metric `{metric}` needs the statistic `{statistic}`, which is unknown for {missing} (layer, expert) entries of these statistics (first: layer {layer_id} expert {expert}); they can serve as held-out statistics, not for ranking"
    )]
    PartialStatistic {
        /// The metric asked for.
        metric: String,
        /// The partial statistic.
        statistic: &'static str,
        /// How many (layer, expert) entries are unknown.
        missing: usize,
        /// The model's id of the first layer with an unknown entry.
        layer_id: u32,
        /// The first unknown expert of that layer.
        expert: u16,
    },
    /// A layer has fewer usable (c > 0) experts than the budget K and short layers are not allowed
    /// (SEMANTICS.md §3).
    #[error(
        "layer {layer_id} has only {available} experts with calibration hits, fewer than K = {k} (allow short layers to build the map anyway)"
    )]
    ShortLayer {
        /// The model's id of the layer.
        layer_id: u32,
        /// Experts with c > 0 in that layer.
        available: usize,
        /// The requested budget.
        k: usize,
    },
    /// The budget K exceeds the number of experts per layer.
    #[error("K = {k} is larger than the {num_experts} experts per layer")]
    KTooLarge {
        /// The requested budget.
        k: usize,
        /// E.
        num_experts: usize,
    },
    /// Two inputs that must agree in shape or provenance do not.
    #[error("{what} mismatch: expected {expected}, found {actual}")]
    Mismatch {
        /// What was compared (names the layer when relevant).
        what: String,
        /// The value required.
        expected: String,
        /// The value found.
        actual: String,
    },
    /// An operating-system I/O error on a file.
    #[error("{path}: {source}")]
    Io {
        /// The file read or written.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A file is not valid JSON or does not have the expected structure.
    #[error("{path}: {source}")]
    Json {
        /// The file read or written.
        path: PathBuf,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A file of another kind where statistics or a keep map were expected: a trace
    /// (safetensors) or other binary file, another of the tool's JSON files, a REAP aggregate.
    #[error("{path}: {found}, not {expected}")]
    NotJson {
        /// The file read.
        path: PathBuf,
        /// What the file looks like (`a safetensors file (a trace?)`, `a keep map (from ...)`).
        found: &'static str,
        /// What was expected there, with the command that writes it.
        expected: &'static str,
    },
    /// A metric name that is not one of [`crate::Metric::ALL`].
    #[error("unknown metric `{name}`; expected one of: {}", crate::Metric::names().join(", "))]
    UnknownMetric {
        /// The name given.
        name: String,
    },
    /// Bad configuration or bad file content (duplicate id in a keep map, negative statistic, ...).
    #[error("invalid {key}: {reason}")]
    Invalid {
        /// What is invalid (names the file key, layer and expert when relevant).
        key: String,
        /// Why.
        reason: String,
    },
    /// A count file whose counts no top-k routing gives: an expert counted more often than its
    /// layer has tokens (a token chooses k distinct experts, so each expert at most once).
    #[error(
        "{path}: layer {layer_id} expert {expert}: count {count} is more than the layer's {tokens} tokens ({tokens_from}): top-k routing chooses an expert at most once per token; check --top-k, or whether the file counts something else"
    )]
    CountAboveTokens {
        /// The count file.
        path: PathBuf,
        /// The layer's id (the model's id when `--layer-ids` was given).
        layer_id: u32,
        /// The expert counted too often.
        expert: u32,
        /// Its count.
        count: u64,
        /// The layer's tokens.
        tokens: u64,
        /// Where the tokens come from (`sum of counts 10 / top-k 2`, `its total_tokens`).
        tokens_from: String,
    },
    /// A file that parsed but failed validation ([`crate::KeepMap::read_json`],
    /// [`crate::Stats::read_json`]): the validation error, with the file it came from.
    #[error("{path}: {source}")]
    InFile {
        /// The file read.
        path: PathBuf,
        /// The validation error.
        source: Box<SaliencyError>,
    },
}

impl SaliencyError {
    /// The error with the file it came from, as [`SaliencyError::InFile`].
    pub(crate) fn in_file(self, path: &Path) -> SaliencyError {
        SaliencyError::InFile { path: path.to_path_buf(), source: Box::new(self) }
    }
}

fn missing_hint(statistic: &str) -> &'static str {
    match statistic {
        "reap_sumsq" => {
            " (REAP aggregate files such as core_agg.json hold no sum of squares, so no standard error can be derived from them)"
        }
        "reap_sum" | "ean_sum" => {
            " (it needs expert output norms, which this source did not record or recorded as non-finite)"
        }
        "gate_sum" => " (the source recorded no gate weights)",
        _ => "",
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, SaliencyError>;

pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> SaliencyError {
    SaliencyError::Invalid { key: key.into(), reason: reason.into() }
}

pub(crate) fn mismatch(what: impl Into<String>, expected: impl ToString, actual: impl ToString) -> SaliencyError {
    SaliencyError::Mismatch { what: what.into(), expected: expected.to_string(), actual: actual.to_string() }
}
