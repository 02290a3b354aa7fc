//! Synthetic routing traces for fixtures, benchmarks and scale tests (never a substitute for real
//! routing). `docs/synth.md` describes the model, its fit to real traces and the commands.
//!
//! # The routing model
//!
//! Each layer is an independent process over the tokens. Per layer, the model (drawn from
//! `model_seed`) fixes a popularity `w_e ∝ rank_e^(-s_l)` over a random permutation of the live
//! experts, with a per-layer skew `s_l = skew · exp(skew_spread · N(0, 1))`. At every sequence start
//! the topic redraws `q_e = w_e · exp(drift · N(0, 1))`, and the locality memory is cleared.
//!
//! A row is filled slot by slot: the k used experts first, then the `m - k` further candidates. Each
//! slot takes, with probability `reuse`, an expert the previous token used (weighted by `q`); else,
//! with probability `window_reuse`, an expert used in the last `window` tokens but not by the
//! previous one (weighted by how often it was used there); else a fresh draw from `q`. Window and fresh draws exclude the
//! previous token's experts, so the next-token reuse of the used slots is `reuse` in expectation
//! (up to sequence starts), whatever the popularity. No expert appears twice in a row. The used
//! experts, and separately the further candidates, are ranked by `ln q_e + Gumbel noise`.
//!
//! Scores are logits: the top one is `spacing · Gumbel`, and the gap between ranks `i - 1` and `i`
//! is `spacing · Exp(1) / i` (the spacings of the top order statistics of Gumbel logits), except the
//! gap between rank k - 1 (the last used expert) and rank k (the first unused candidate), which is
//! `Gamma(gap_shape)` with mean `gap · spacing / k`. Gates are the softmax of the k used scores.
//! Output norms (on request) are `base_e · exp(0.25 · N(0, 1))` with `base_e` log-normal; the
//! `outlier_share` outlier experts get `base_e · outlier_scale · Pareto(outlier_tail)` instead, a
//! heavy tail. `dead_experts` (layer, expert) pairs, spread evenly over the layers (the highest ids
//! of a layer), are never routed.
//!
//! # Presets
//!
//! The routing defaults are fitted to one real trace (DeepSeek-V2-Lite on ESFT translation);
//! [`SynthPreset`] names them and the parameters fitted to other real traces (the flatter ESFT
//! domains, Qwen1.5-MoE served by vLLM). The fits, their tolerances and the grid searches are in `docs/synth.md`.
//!
//! # Determinism and memory
//!
//! Layer l is generated from its own ChaCha8 streams seeded by `(model_seed, l)` (popularity, norm
//! scales) and `(seed, l)` (tokens), so the output depends only on the configuration, never on
//! threads. Across platforms it also depends on `f64::exp`, `ln` and `powf`, which Rust takes from
//! the system's libm: another libm (macOS, Windows, musl) can change last bits, so the committed
//! fixtures are checked (`gen-data --check`) on the CI's Linux/glibc. [`write()`] streams the trace to disk block by block ([`BLOCK_ROWS`] rows), one
//! layer per thread, through [`write_trace_streamed`]; its memory does not grow with T or L.

mod config;
mod presets;
mod sampler;
#[cfg(test)]
mod tests;

use std::path::Path;

pub use crate::write::{RowBlock, StreamedTrace, write_trace_streamed};
use crate::{OwnedParts, Result, TraceData};
pub use config::SynthConfig;
pub use presets::SynthPreset;
use sampler::{Block, LayerGen};

/// Rows generated and written per block by [`write()`] (per thread: `BLOCK_ROWS · m` ids and scores).
pub const BLOCK_ROWS: usize = 8192;

/// Generates a trace from `cfg` in memory (fixtures and tests; [`write()`] streams large ones).
///
/// # Errors
/// [`TraceError::Config`](crate::TraceError::Config) from [`SynthConfig::validate`].
pub fn generate(cfg: &SynthConfig) -> Result<TraceData> {
    cfg.validate()?;
    let (l_n, t_n, m, k) = (cfg.layers, cfg.tokens, cfg.candidates, cfg.top_k);
    let mut ids = Vec::with_capacity(l_n * t_n * m);
    let mut scores = Vec::with_capacity(l_n * t_n * m);
    let mut gates = Vec::with_capacity(l_n * t_n * k);
    let mut norms = Vec::with_capacity(if cfg.norms { l_n * t_n * k } else { 0 });
    let mut block = Block::default();
    for l in 0..l_n {
        let mut g = LayerGen::new(cfg, l);
        while g.t < t_n {
            g.fill(BLOCK_ROWS.min(t_n - g.t), &mut block);
            ids.extend_from_slice(&block.ids);
            scores.extend_from_slice(&block.scores);
            gates.extend_from_slice(&block.gates);
            norms.extend_from_slice(&block.norms);
        }
    }
    let parts = OwnedParts {
        ids,
        scores: Some(scores),
        gates: Some(gates),
        out_norms: cfg.norms.then_some(norms),
        seq_offsets: Some(cfg.seq_offsets()),
        step_offsets: None,
    };
    TraceData::new(cfg.meta(), t_n, m, parts)
}

/// Generates the trace of `cfg` straight to `path`, block by block, layers on up to `threads`
/// threads (0 = available parallelism); byte-identical to [`generate`] then
/// [`crate::write_trace`], whatever `threads`. Memory: about `threads · BLOCK_ROWS · (6m + 8k)`
/// bytes plus O(E) per thread. `progress` is called with each layer index when the layer is written
/// (in completion order).
///
/// # Errors
/// [`TraceError::Config`](crate::TraceError::Config) from [`SynthConfig::validate`];
/// [`TraceError::File`](crate::TraceError::File) naming `path` around an I/O error (no partial
/// file is left behind).
pub fn write(
    path: impl AsRef<Path>,
    cfg: &SynthConfig,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<()> {
    cfg.validate()?;
    let meta = cfg.meta();
    let seq = cfg.seq_offsets();
    let layout = StreamedTrace {
        meta: &meta,
        tokens: cfg.tokens,
        candidates: cfg.candidates,
        scores: true,
        gates: true,
        out_norms: cfg.norms,
        seq_offsets: Some(&seq),
        step_offsets: None,
    };
    write_trace_streamed(path, &layout, threads, |l, sink| {
        let mut g = LayerGen::new(cfg, l);
        let mut block = Block::default();
        while g.t < cfg.tokens {
            g.fill(BLOCK_ROWS.min(cfg.tokens - g.t), &mut block);
            sink(RowBlock {
                ids: &block.ids,
                scores: Some(&block.scores),
                gates: Some(&block.gates),
                out_norms: cfg.norms.then_some(&block.norms[..]),
            })?;
        }
        progress(l);
        Ok(())
    })
}
