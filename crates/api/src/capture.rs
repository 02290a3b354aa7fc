//! `capture`: routing recorded from a GGUF model run by llama.cpp itself (`capture` crate), written
//! as a trace. The capture runs in full before anything is written; the trace is then written
//! atomically, so an error or an interrupt leaves no partial file.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::error::Result;
use crate::usage;

/// What `capture` takes: the capture's settings and where the trace goes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CaptureRequest {
    /// The model, the input and the run's settings.
    pub config: capture::CaptureConfig,
    /// The trace to write.
    pub output: PathBuf,
}

/// What a capture did.
#[derive(Debug, Clone)]
pub struct CaptureReport {
    /// The trace written.
    pub output: PathBuf,
    /// `general.architecture` of the model.
    pub arch: String,
    /// The trace's shape.
    pub shape: trace_io::Shape,
    /// The model's block index of each MoE layer.
    pub layer_ids: Vec<u32>,
    /// Sequences after chunking.
    pub sequences: usize,
    /// What the recorder saw.
    pub recorded: capture::Recorded,
    /// llama.cpp's timings.
    pub timings: capture::Timings,
    /// Lines for the user.
    pub notes: Vec<String>,
}

/// Whether this build can capture (built with the `capture` feature).
pub const AVAILABLE: bool = capture::AVAILABLE;

impl CaptureRequest {
    /// Runs the capture (`progress` hears of it) and writes the trace.
    ///
    /// # Errors
    /// [`crate::Error::Usage`] for settings out of range or an output that is a directory;
    /// [`crate::Error::Capture`] for the model, its graph or the run (this build without llama.cpp
    /// among them); [`crate::Error::Trace`] when the trace cannot be written.
    pub fn run(&self, progress: &mut dyn FnMut(capture::Progress)) -> Result<CaptureReport> {
        if self.output.is_dir() {
            usage!("‹output› {} is a directory: name the trace file", self.output.display());
        }
        let c = capture::capture(&self.config, progress)?;
        trace_io::write_trace(&self.output, &c.trace.view())?;
        let v = c.trace.view();
        Ok(CaptureReport {
            output: self.output.clone(),
            arch: c.arch,
            shape: v.shape(),
            layer_ids: v.meta().layer_ids.clone(),
            sequences: c.sequences,
            recorded: c.recorded,
            timings: c.timings,
            notes: c.notes,
        })
    }
}

impl CaptureReport {
    /// The `moe-offload-capture` document.
    pub fn document(&self) -> Value {
        let r = &self.recorded;
        let t = &self.timings;
        let per = |ms: f64, n: u64| if n == 0 { None } else { Some(ms / n as f64) };
        json!({
            "kind": crate::kind::CAPTURE,
            "output": self.output,
            "arch": self.arch,
            "shape": self.shape,
            "layer_ids": self.layer_ids,
            "sequences": self.sequences,
            "prefill_tokens": r.prefill_tokens,
            "decode_tokens": r.decode_tokens,
            "scores": r.scores,
            "candidates": r.candidates,
            "disordered_rows": r.disordered_rows,
            "selection_bias": r.selection_bias,
            "timings": {
                "load_ms": t.load_ms,
                "prompt_ms": t.prompt_ms,
                "prompt_tokens": t.prompt_tokens,
                "prompt_ms_per_token": per(t.prompt_ms, t.prompt_tokens),
                "decode_ms": t.decode_ms,
                "decode_tokens": t.decode_tokens,
                "decode_ms_per_token": per(t.decode_ms, t.decode_tokens),
                "prompt_read_mb": t.prompt_read_mb,
                "decode_read_mb": t.decode_read_mb,
                "prompt_sys_ms": t.prompt_sys_ms,
                "decode_sys_ms": t.decode_sys_ms,
                "llama_perf_prompt_ms": t.llama_perf_prompt_ms,
                "llama_perf_decode_ms": t.llama_perf_decode_ms,
                "threads": t.threads,
                "batch": t.batch,
                "run": t.timing,
            },
            "notes": self.notes,
        })
    }
}
