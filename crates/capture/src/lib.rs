//! Routing capture from a GGUF model run by llama.cpp itself.
//!
//! [`capture`] loads the model with the llama.cpp that `llama-cpp-sys-2` bundles, feeds it each
//! sequence (prefill in batches, then greedy decode steps), and records from the context's eval
//! callback, for every MoE layer and token: the ids the runtime used (`ffn_moe_topk`), the
//! router's logits (`ffn_moe_logits`, from which the top-m candidates and their scores come) and
//! the gate weights the model applied (the last `ffn_moe_weights*` stage). See [`tensor`] for the
//! tensors and their layouts and [`record`] for how rows are made.
//!
//! llama.cpp compiles in minutes, so it is behind the crate's `llama` feature (GPU backends:
//! `cuda`, `metal`, `vulkan`). Without it, [`capture`] returns [`CaptureError::NotBuilt`]; the
//! recorder and the input readers are the same code either way and are tested without llama.cpp.

pub mod disk;
mod error;
pub mod input;
#[cfg(feature = "llama")]
mod kernels;
#[cfg(feature = "llama")]
mod llama;
pub mod measure;
pub mod record;
pub mod tensor;

use std::path::PathBuf;

pub use error::{CaptureError, Result};
pub use record::{Recorded, Recorder, RecorderConfig};

/// Whether this build can capture (the `llama` feature).
pub const AVAILABLE: bool = cfg!(feature = "llama");

/// The version of the llama.cpp bindings (and the llama.cpp they bundle) this build uses.
pub const LLAMA_CPP_SYS_VERSION: &str = "llama-cpp-sys-2 0.1.161";

/// What to feed the model.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Input {
    /// UTF-8 text files, each tokenized by the model's own tokenizer (with its BOS where the model
    /// adds one) and cut into chunks.
    Text(Vec<PathBuf>),
    /// Token ids already made, one sequence per line ([`input::read_token_file`]), sequences of
    /// the given files in order.
    Tokens(Vec<PathBuf>),
}

/// A capture's settings; [`CaptureConfig::new`] gives the defaults.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CaptureConfig {
    /// The GGUF model.
    pub model: PathBuf,
    /// Text or token ids.
    pub input: Input,
    /// Context size in tokens (`n_ctx`): each sequence, prefill and decode, fits in it; longer
    /// inputs are cut into chunks of `ctx − generate` tokens, each a fresh context.
    pub ctx: usize,
    /// Tokens per `llama_decode` of a prefill (`n_batch` = `n_ubatch`).
    pub batch: usize,
    /// Greedy decode tokens after each sequence's prefill (stops early at end of generation).
    pub generate: usize,
    /// CPU threads (`n_threads` and `n_threads_batch`); `None`: the machine's available parallelism.
    pub threads: Option<usize>,
    /// m, candidates per row when logits are recorded; `None`: every expert (m = E).
    pub candidates: Option<usize>,
    /// Layers offloaded to a GPU backend (`n_gpu_layers`); 0 on a CPU build.
    pub gpu_layers: i32,
    /// Stop after this many input tokens (prefill), `None`: all.
    pub max_tokens: Option<usize>,
    /// Which run llama.cpp's timings come from.
    pub timing: Timing,
}

/// Which run the timings of a capture come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Timing {
    /// The capture itself: the eval callback splits the graph at every recorded tensor, so the
    /// times are those of an instrumented run.
    EvalCallback,
    /// A second run of the same sequences without the callback (prefill with the last token's
    /// logits, decode feeding the same generated tokens): the times of a plain llama.cpp run, for
    /// comparison with predictions (`scripts/validate.sh`).
    PlainRun,
}

impl CaptureConfig {
    /// The defaults: a 4096-token context, batches of 512, no decode, every expert a candidate,
    /// no GPU layers.
    pub fn new(model: PathBuf, input: Input) -> CaptureConfig {
        CaptureConfig {
            model,
            input,
            ctx: 4096,
            batch: 512,
            generate: 0,
            threads: None,
            candidates: None,
            gpu_layers: 0,
            max_tokens: None,
            timing: Timing::EvalCallback,
        }
    }

    /// Checks the numeric settings.
    ///
    /// # Errors
    /// [`CaptureError::Config`] naming the setting: `ctx` must exceed `generate`, `batch` and
    /// `threads` must be positive, `candidates` at least 1.
    pub fn check(&self) -> Result<()> {
        let bad = |m: String| Err(CaptureError::Config(m));
        if self.ctx <= self.generate {
            return bad(format!("‹ctx› {} leaves no room for a prompt before ‹generate› {}", self.ctx, self.generate));
        }
        if self.ctx > 1 << 24 || self.batch == 0 || self.batch > 1 << 24 {
            return bad(format!("‹ctx› {} and ‹batch› {} must be in 1..=16777216", self.ctx, self.batch));
        }
        if self.threads == Some(0) || self.threads.is_some_and(|t| t > 1024) {
            return bad("‹threads› must be in 1..=1024".into());
        }
        if self.candidates == Some(0) {
            return bad("‹candidates› must be at least 1".into());
        }
        if self.max_tokens == Some(0) {
            return bad("‹max_tokens› must be at least 1".into());
        }
        Ok(())
    }
}

/// llama.cpp's own timings (`llama_perf_context`) of the run [`CaptureConfig::timing`] names.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Timings {
    /// Model load, ms.
    pub load_ms: f64,
    /// Prompt (prefill) time over all sequences, ms: the wall time of the prompt's `llama_decode`
    /// calls, each followed by `llama_synchronize` (llama.cpp's own counter, [`Self::llama_perf_prompt_ms`],
    /// equals it on a plain run but reads about 0 with the eval callback attached).
    pub prompt_ms: f64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Decode time, ms: the wall time of the decode tokens' `llama_decode` calls, synchronized.
    pub decode_ms: f64,
    /// llama.cpp's prompt time (`llama_perf_context`'s `t_p_eval_ms`), ms.
    pub llama_perf_prompt_ms: f64,
    /// llama.cpp's decode time (`t_eval_ms`), ms.
    pub llama_perf_decode_ms: f64,
    /// Decode tokens.
    pub decode_tokens: u64,
    /// Bytes the process fetched from storage during the timed prompt decodes, MB (10^6 bytes;
    /// `/proc/self/io` `read_bytes`, readahead included): the page-cache misses of a model read
    /// through `mmap`. `None` where the kernel does not count I/O per task.
    pub prompt_read_mb: Option<f64>,
    /// The same during the timed decode tokens, MB.
    pub decode_read_mb: Option<f64>,
    /// The process's system CPU time during the timed prompt decodes, ms (`getrusage`: page
    /// faults and page-cache reclaim of a model read through `mmap`, every thread summed).
    pub prompt_sys_ms: f64,
    /// The same during the timed decode tokens, ms.
    pub decode_sys_ms: f64,
    /// Threads used.
    pub threads: usize,
    /// Batch size used.
    pub batch: usize,
    /// Which run these are from.
    pub timing: Timing,
}

/// A finished capture: the trace (not yet written) and what was seen.
pub struct Captured {
    /// The routing trace.
    pub trace: trace_io::TraceData,
    /// What the recorder saw.
    pub recorded: Recorded,
    /// llama.cpp's timings.
    pub timings: Timings,
    /// `general.architecture` of the model.
    pub arch: String,
    /// Input sequences after chunking.
    pub sequences: usize,
    /// Lines for the user: what was read and what was left out.
    pub notes: Vec<String>,
}

/// Progress of a capture, for a progress bar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// The model is loaded; `tokens` input tokens in `sequences` sequences will be prefilled, each
    /// followed by up to `generate` decode tokens.
    Start {
        /// Sequences.
        sequences: usize,
        /// Prefill tokens in all.
        tokens: usize,
        /// Decode tokens per sequence (at most).
        generate: usize,
    },
    /// Tokens recorded so far (prefill and decode).
    Tokens(usize),
    /// The recording is done; the plain run for the timings starts.
    TimingRun,
}

/// Runs the capture `cfg` describes; `progress` hears of it as it goes.
///
/// # Errors
/// [`CaptureError::NotBuilt`] without the `llama` feature; [`CaptureError::Config`] or
/// [`CaptureError::Input`] for the settings and inputs; [`CaptureError::Model`] when llama.cpp
/// cannot load the model; [`CaptureError::NotMoe`] when its graph has no MoE tensors;
/// [`CaptureError::Decode`], [`CaptureError::Tensor`] or [`CaptureError::Row`] during the run.
pub fn capture(cfg: &CaptureConfig, progress: &mut dyn FnMut(Progress)) -> Result<Captured> {
    cfg.check()?;
    #[cfg(feature = "llama")]
    {
        llama::run(cfg, progress)
    }
    #[cfg(not(feature = "llama"))]
    {
        let _ = progress;
        Err(CaptureError::NotBuilt)
    }
}
