//! The capture crate's one error type.

use std::path::PathBuf;

/// Why a capture failed. Every variant names the file, tensor, layer or sequence it is about; no
/// trace is written when any of them is returned.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    /// This build has no llama.cpp (the crate's `llama` feature is off).
    #[error(
        "this build of moe-offload has no llama.cpp: build it with the capture feature \
         (`cargo build --release -p cli --features capture`; docs/capture.md)"
    )]
    NotBuilt,
    /// An input file of token ids or text could not be read or parsed.
    #[error("{path}: line {line}: {reason}")]
    Input {
        /// The input file.
        path: PathBuf,
        /// 1-based line number (0 for the file as a whole).
        line: usize,
        /// What is wrong there.
        reason: String,
    },
    /// llama.cpp could not load the model, or the model cannot be captured.
    #[error("{path}: {reason}")]
    Model {
        /// The GGUF file.
        path: PathBuf,
        /// What llama.cpp said, or what is missing.
        reason: String,
    },
    /// The model's graph lacks the tensors a capture reads: a dense model, or an architecture whose
    /// MoE block does not go through llama.cpp's `build_moe_ffn`.
    #[error(
        "{path}: the graph of architecture `{arch}` has no {missing} tensor (a dense model, or an MoE block \
         llama.cpp builds without `build_moe_ffn`): nothing to record"
    )]
    NotMoe {
        /// The GGUF file.
        path: PathBuf,
        /// `general.architecture` of the model.
        arch: String,
        /// The tensor names that never reached the eval callback, e.g. `ffn_moe_topk-<layer>`.
        missing: String,
    },
    /// A recorded tensor does not have the type or shape its name promises.
    #[error("tensor `{tensor}`: {reason}")]
    Tensor {
        /// The graph tensor's name, e.g. `ffn_moe_topk-12`.
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A recorded row breaks a trace rule (an id out of range, an id twice, a gate below 0).
    #[error("layer {layer}, token {token}: {reason}")]
    Row {
        /// The model's block index of the MoE layer.
        layer: u32,
        /// Token index in the trace.
        token: usize,
        /// The violation.
        reason: String,
    },
    /// `llama_decode` failed.
    #[error("sequence {sequence}: llama_decode returned {code}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Decode {
        /// 0-based sequence index.
        sequence: usize,
        /// llama.cpp's return code.
        code: i32,
        /// The last error llama.cpp logged, if any.
        detail: String,
    },
    /// The capture was interrupted before it finished.
    #[error("interrupted: nothing written")]
    Interrupted,
    /// A request option is out of range or conflicts with another.
    #[error("{0}")]
    Config(String),
    /// Writing the trace failed.
    #[error(transparent)]
    Trace(#[from] trace_io::TraceError),
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, CaptureError>;
