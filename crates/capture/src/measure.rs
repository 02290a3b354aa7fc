//! `profile measure`: this machine's figures for SEMANTICS §14, measured with llama.cpp's own CPU
//! kernels (ggml's `mul_mat_id`, `mul_mat` and `flash_attn_ext`) on the tensor types and shapes of
//! a GGUF model.
//!
//! - Host expert runs: one routed expert (its gate, up and down matrices, of the model's type and
//!   shape) applied to n = 1, 2, 4, ..., 64 rows with `mul_mat_id`, the op llama.cpp's MoE block runs. Each repeat uses another copy of the expert, as
//!   many copies as the model has experts (at most 2 GB of them), so that the weights come from
//!   memory as in a decode step, not from the CPU's caches. Then one row choosing j = 1, 2, 4, 8
//!   experts in one op, as a decode token does: its time is a fixed part (three ops dispatched,
//!   their thread barriers) plus j times a per-expert part. `host_gbps` = the expert's bytes over
//!   the per-expert part; `host_sync_ms` = the fixed part, which §14 charges once per layer with host
//!   runs (its "synchronisation cost of a layer"; on a CPU-only run, the dispatch of the layer's
//!   expert ops); `host_ms_per_row` = (the 64-row time − the fixed part) / 64, so that §14's
//!   sync + max(bytes / host_gbps, n · host_ms_per_row) equals the measured 1-row and 64-row times.
//! - Dense compute per token (`compute_ms`): one graph holding a matrix-vector product with every
//!   2-D weight of the model that is not a routed expert (attention, router, shared experts, dense
//!   FFN blocks, the output head), each of its own type and shape: the weight traffic of one decode
//!   token outside the routed experts. Attention over the KV cache, norms and the sampler are left out.
//!
//! - Dense compute of a step of n rows (n = 16, 64, 128, 512): the same graph on n rows at once,
//!   plus each attention layer's flash attention of the n rows over n positions (f16 K and V, as
//!   llama.cpp's CPU backend keeps them): a measured `compute_ms_per_step` for a prefill batch of n
//!   tokens that starts a sequence (SEMANTICS §11). For one row the attention is over one position.
//!
//! - With a disk ([`MeasureConfig::disk`]): cold reads of one expert from a file there, direct,
//!   buffered and through `mmap` ([`crate::disk`]); the `mmap` rate is the profile's SSD bandwidth.
//!
//! Every figure is the median of the repeats, with its minimum and maximum.

use std::path::PathBuf;

use crate::Result;

/// What to measure.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MeasureConfig {
    /// The GGUF model whose tensor types and shapes are measured.
    pub model: PathBuf,
    /// CPU threads (`None`: every core).
    pub threads: Option<usize>,
    /// Repeats of each timing (the median is reported).
    pub repeats: usize,
    /// Copies of the expert cycled through (`None`: as many as the model has experts, at most
    /// 2 GB of them; a few copies that fit in the CPU's caches time a warm expert instead).
    pub expert_copies: Option<usize>,
    /// Also time cold reads of one expert from a file on this disk ([`crate::disk`]).
    #[serde(default)]
    pub disk: Option<crate::disk::DiskConfig>,
}

/// A timing: median, minimum and maximum over the repeats, ms.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Spread {
    /// Median, ms.
    pub median_ms: f64,
    /// Fastest repeat, ms.
    pub min_ms: f64,
    /// Slowest repeat, ms.
    pub max_ms: f64,
}

impl Spread {
    /// The median, minimum and maximum of `v` (ms; not empty: panics on an empty list).
    pub fn of(mut v: Vec<f64>) -> Spread {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median_ms: median, min_ms: v[0], max_ms: v[n - 1] }
    }
}

/// What was measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Measured {
    /// The model file.
    pub model: PathBuf,
    /// `general.architecture`.
    pub arch: String,
    /// ggml type name of the routed experts (`q4_K`, `f16`, ...).
    pub expert_type: String,
    /// Bytes of one routed expert (gate, up and down) as stored, MB (10^6 bytes).
    pub expert_mb: f64,
    /// Routed experts in the model (all layers).
    pub experts_total: usize,
    /// Copies of the expert cycled through while timing.
    pub expert_copies: usize,
    /// Per row count n: the time of one expert on n rows.
    pub expert_rows: Vec<(usize, Spread)>,
    /// The dense weights' matrix-vector products of one token (`dense_rows`' first entry).
    pub dense: Spread,
    /// The dense weights' products with n rows at once (a prefill batch of n tokens), per n of
    /// [`DENSE_ROWS`]: a measured `compute_ms_per_step` for steps of n rows (SEMANTICS §11).
    pub dense_rows: Vec<(usize, Spread)>,
    /// Bytes of those dense weights, MB.
    pub dense_mb: f64,
    /// Threads used.
    pub threads: usize,
    /// Per j of [`EXPERTS_PER_OP`]: one row choosing j experts in one `mul_mat_id` graph.
    pub experts_per_op: Vec<(usize, Spread)>,
    /// `expert_mb` over the time of one more expert in the op: `(t(8) − t(1)) / 7`, GB/s.
    pub host_gbps: f64,
    /// `(t(64 rows) − host_sync_ms) / 64`, ms.
    pub host_ms_per_row: f64,
    /// The op's fixed part: `t(1) − (t(8) − t(1)) / 7`, ms (at least 0); a layer pays it once.
    pub host_sync_ms: f64,
    /// The disk's figures, when a disk was given ([`MeasureConfig::disk`]).
    pub disk: Option<crate::disk::DiskMeasured>,
}

/// Rows of the expert timings.
pub const ROWS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
/// Experts chosen by one row, in the timings of one op.
pub const EXPERTS_PER_OP: [usize; 4] = [1, 2, 4, 8];
/// Rows of the dense timings.
pub const DENSE_ROWS: [usize; 5] = [1, 16, 64, 128, 512];

/// Measures the machine on `cfg.model`'s tensors; `progress` hears of each step.
///
/// # Errors
/// [`crate::CaptureError::NotBuilt`] without the `llama` feature; [`crate::CaptureError::Model`] for a
/// file that is not a GGUF, or one without routed-expert tensors (`blk.N.ffn_{gate,up,down}_exps.weight`);
/// [`crate::CaptureError::Config`] for 0 repeats, or when ggml cannot allocate or make weights of the
/// model's type.
pub fn measure(cfg: &MeasureConfig, progress: &mut dyn FnMut(&str)) -> Result<Measured> {
    if cfg.repeats == 0 {
        return Err(crate::CaptureError::Config("‹repeats› must be at least 1".into()));
    }
    #[cfg(feature = "llama")]
    {
        let mut m = crate::kernels::measure(cfg, progress)?;
        if let Some(d) = &cfg.disk {
            m.disk = Some(crate::disk::measure(d, (m.expert_mb * 1e6).round() as usize, progress)?);
        }
        Ok(m)
    }
    #[cfg(not(feature = "llama"))]
    {
        let _ = progress;
        Err(crate::CaptureError::NotBuilt)
    }
}

#[cfg(test)]
mod tests {
    use super::Spread;

    #[test]
    fn the_spread_is_median_min_and_max() {
        let s = Spread::of(vec![3.0, 1.0, 2.0]);
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (2.0, 1.0, 3.0));
        let s = Spread::of(vec![4.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median_ms, s.min_ms, s.max_ms), (3.0, 1.0, 10.0));
    }
}
