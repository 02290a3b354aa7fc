//! `inspect`: a trace's shape, metadata, sequence and step sizes, and per-layer expert usage
//! (`trace_io::summary`), every value validated first.

use serde_json::{Value, json};
use trace_io::summary::{LayerUsage, SHUFFLE_SEED, SizeSummary, span_sizes, validate_with_usage};
use trace_io::{Shape, TraceMeta};

use crate::error::{Context, Result};
use crate::inputs::{self, TraceSource};

/// What `inspect` takes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct InspectRequest {
    /// The trace.
    pub trace: TraceSource,
}

/// What `inspect` reports.
#[derive(Debug, Clone)]
pub struct InspectReport {
    /// The trace's name (its path).
    pub path: String,
    /// The file's size, bytes.
    pub bytes: usize,
    /// L, T, E, top-k, m.
    pub shape: Shape,
    /// The metadata.
    pub meta: TraceMeta,
    /// Which optional tensors the trace holds (`scores`, `gates`, `out_norms`: bools;
    /// `seq_offsets`, `step_offsets`: entries; `lookahead_ids`: width).
    pub tensors: Value,
    /// Tokens per sequence, when the trace records sequences.
    pub sequences: Option<SizeSummary>,
    /// Tokens per engine step, when the trace records steps.
    pub steps: Option<SizeSummary>,
    /// Every step's size.
    pub step_sizes: Option<Vec<u64>>,
    /// Next-token expert reuse, mean over layers.
    pub mean_next_token_reuse: f64,
    /// The same in the shuffled order of [`SHUFFLE_SEED`] (the locality control).
    pub mean_shuffled_reuse: f64,
    /// Per layer: experts used, entropy, top-10% share, reuse and its control.
    pub layers: Vec<LayerUsage>,
}

impl InspectRequest {
    /// Validates every value of the trace and computes its usage figures in the same pass
    /// (read once, on every core; the figures do not depend on the thread count).
    ///
    /// # Errors
    /// The trace cannot be read or breaks the format (the first violation, named); it has no
    /// tokens.
    pub fn run(&self) -> Result<InspectReport> {
        let name = self.trace.name();
        let unreadable = || {
            format!(
                "{name} is not a readable moe-offload trace (convert routing logs with the import command, or write \
                 one as docs/trace-format.md shows)"
            )
        };
        let (f, _) = self.trace.open().with_context(unreadable)?;
        let (v, layers) = validate_with_usage(&f, SHUFFLE_SEED).with_context(unreadable)?;
        let s = v.shape();
        inputs::require_tokens(&s, &name)?;
        let seq_sizes = v.seq_offsets().map(|o| span_sizes(o, s.tokens));
        let step_sizes = v.step_offsets().map(|o| span_sizes(o, s.tokens));
        let mean = |f: fn(&LayerUsage) -> f64| layers.iter().map(f).sum::<f64>() / layers.len().max(1) as f64;
        let tensors = json!({
            "scores": v.parts().scores.is_some(), "gates": v.parts().gates.is_some(),
            "out_norms": v.parts().out_norms.is_some(),
            "seq_offsets": v.seq_offsets().map(<[u64]>::len), "step_offsets": v.step_offsets().map(<[u64]>::len),
            "lookahead_ids": v.lookahead().map(|la| la.width),
        });
        Ok(InspectReport {
            path: name,
            bytes: f.byte_len(),
            shape: s,
            meta: v.meta().clone(),
            tensors,
            sequences: seq_sizes.as_deref().and_then(SizeSummary::of),
            steps: step_sizes.as_deref().and_then(SizeSummary::of),
            step_sizes,
            mean_next_token_reuse: mean(|u| u.next_token_reuse),
            mean_shuffled_reuse: mean(|u| u.shuffled_reuse),
            layers,
        })
    }
}

impl InspectReport {
    /// The `moe-offload-inspect` document.
    pub fn document(&self) -> Value {
        json!({
            "kind": crate::kind::INSPECT,
            "path": self.path,
            "bytes": self.bytes,
            "shape": self.shape,
            "meta": self.meta,
            "tensors": self.tensors,
            "sequences": self.sequences,
            "steps": self.steps,
            "step_sizes": self.step_sizes,
            "shuffle_seed": SHUFFLE_SEED,
            "mean_next_token_reuse": self.mean_next_token_reuse,
            "mean_shuffled_reuse": self.mean_shuffled_reuse,
            "layers": self.layers,
        })
    }
}
