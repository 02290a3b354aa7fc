//! The one error type of trace-io.

use std::path::PathBuf;

/// Everything that can go wrong reading, validating, importing or writing a trace.
///
/// Variants carry the context a user needs to find the problem: the tensor, the layer (its id in the
/// model and its index in the trace), the token and the offending value. Errors raised while a file
/// is being read are wrapped in [`TraceError::File`] so the message names the file too.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// An error inside the named file.
    #[error("{path}: {source}")]
    File {
        /// The file being read or written.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: Box<TraceError>,
    },
    /// An operating-system I/O error.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// The safetensors container itself is malformed (truncated, header longer than the file,
    /// overlapping or non-contiguous tensors, invalid header JSON).
    #[error("not a valid safetensors container: {0}")]
    Container(String),
    /// The JSON header names a tensor, or `__metadata__` a key, twice: safetensors would keep the
    /// last one without a word.
    #[error("the header has {} twice (only one of them could be read)", match within {
        Some(within) => format!("`{within}` key `{key}`"),
        None if key == "__metadata__" => format!("`{key}`"),
        None => format!("tensor `{key}`"),
    })]
    RepeatedKey {
        /// The top-level key whose object holds the repeat (`__metadata__`), `None` for a tensor
        /// entry (or `__metadata__` itself) written twice.
        within: Option<String>,
        /// The repeated key: a tensor name, or a metadata key.
        key: String,
    },
    /// A tensor's bytes, where the header places them, do not end where the file ends: data past
    /// the end of the file (a truncated file), or bytes after the last tensor.
    #[error(
        "tensor `{tensor}`: the header puts its data at file bytes {}..{} (data_offsets {}..{}), {problem}",
        expected.start, expected.end, data_offsets.start, data_offsets.end
    )]
    Extent {
        /// Tensor name, as the header spells it.
        tensor: String,
        /// Where its bytes must be, in bytes from the start of the file.
        expected: std::ops::Range<u64>,
        /// The same range as the header gives it (from the start of the data section).
        data_offsets: std::ops::Range<u64>,
        /// What the file actually holds there, with the byte ranges.
        problem: String,
    },
    /// A required tensor is absent.
    #[error("tensor `{tensor}` is missing")]
    MissingTensor {
        /// Tensor name.
        tensor: &'static str,
    },
    /// A tensor has the wrong element type.
    #[error("tensor `{tensor}` has dtype {actual}, expected {expected}")]
    Dtype {
        /// Tensor name.
        tensor: &'static str,
        /// The dtype the format requires.
        expected: &'static str,
        /// The dtype found in the header.
        actual: String,
    },
    /// A tensor's shape disagrees with the format or with another tensor.
    #[error("tensor `{tensor}` has shape {actual:?}, expected {expected}")]
    Shape {
        /// Tensor name.
        tensor: &'static str,
        /// What was expected, in words (for example `[L, T, 6] with L = 26`).
        expected: String,
        /// The shape found.
        actual: Vec<usize>,
    },
    /// A tensor's bytes do not start on a multiple of its element size.
    #[error("tensor `{tensor}` is misaligned: {reason}")]
    Misaligned {
        /// Tensor name.
        tensor: &'static str,
        /// bytemuck's explanation.
        reason: String,
    },
    /// A required metadata key is absent.
    #[error("metadata key `{key}` is missing")]
    MissingMetadata {
        /// The key.
        key: &'static str,
    },
    /// A metadata value cannot be parsed or is inconsistent.
    #[error("metadata key `{key}` = {value:?} is invalid: {reason}")]
    BadMetadata {
        /// The key.
        key: &'static str,
        /// The raw value.
        value: String,
        /// Why it is rejected.
        reason: String,
    },
    /// The file's format version is not one this build reads.
    #[error("format version {found} is not supported (this build reads version {supported})")]
    UnsupportedVersion {
        /// Version found in the file.
        found: String,
        /// Version this build reads and writes.
        supported: u32,
    },
    /// A value in a row breaks a content rule of the format (SEMANTICS.md §1).
    #[error("tensor `{tensor}`, layer {layer_id} (index {layer}), token {token}, slot {slot}: {problem}")]
    Value {
        /// Tensor name.
        tensor: &'static str,
        /// Layer index in the trace (0-based).
        layer: usize,
        /// Layer id in the model (from the `layer_ids` metadata).
        layer_id: u32,
        /// Token index (0-based, in trace order).
        token: usize,
        /// Slot within the row (0-based).
        slot: usize,
        /// What is wrong, with the value.
        problem: ValueProblem,
    },
    /// `seq_offsets` or `step_offsets` are not a valid list of boundaries.
    #[error("tensor `{tensor}`, entry {index} = {value}: {reason}")]
    Offsets {
        /// Tensor name.
        tensor: &'static str,
        /// Entry index.
        index: usize,
        /// The offending value.
        value: u64,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// A computation was handed a view validated for less than it reads (a programming error of
    /// the caller: open with [`crate::TraceFile::view_for`] and what the computation reads).
    #[error("the trace view was validated for {validated}, but this computation reads {needed}")]
    NotValidated {
        /// What the computation reads.
        needed: String,
        /// What the view's content was validated for.
        validated: String,
    },
    /// An importer met input it cannot read.
    #[error("{format} import, {location}: {message}")]
    Import {
        /// The importer (`esft`, ...).
        format: &'static str,
        /// Where: a file, optionally with a line number.
        location: String,
        /// What is wrong.
        message: String,
    },
    /// A generator or builder was given an impossible configuration.
    #[error("invalid configuration `{key}`: {reason}")]
    Config {
        /// The parameter.
        key: &'static str,
        /// Why it is rejected.
        reason: String,
    },
}

/// The kind of content violation found by validation (see [`TraceError::Value`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueProblem {
    /// An expert id is not below `num_experts`.
    #[error("expert id {id} >= num_experts {num_experts}")]
    IdOutOfRange {
        /// The id.
        id: u16,
        /// The number of routed experts per layer.
        num_experts: u32,
    },
    /// The same expert id appears twice in one row.
    #[error("expert id {id} repeated in the row")]
    RepeatedId {
        /// The id.
        id: u16,
    },
    /// A value that must be finite is NaN or infinite.
    #[error("value {value} is not finite")]
    NotFinite {
        /// The value.
        value: f32,
    },
    /// A score is larger than the one before it in the row (rows are in descending router score).
    #[error("score {value} is larger than the previous score {previous} (rows must be in descending score)")]
    Increasing {
        /// The previous slot's score.
        previous: f32,
        /// This slot's score.
        value: f32,
    },
    /// A gate or norm is negative.
    #[error("value {value} is negative")]
    Negative {
        /// The value.
        value: f32,
    },
}

impl TraceError {
    /// Wraps `self` with the file it came from.
    pub fn in_file(self, path: impl Into<PathBuf>) -> TraceError {
        TraceError::File { path: path.into(), source: Box::new(self) }
    }
}

/// Shorthand for `Result<T, TraceError>`.
pub type Result<T, E = TraceError> = std::result::Result<T, E>;
