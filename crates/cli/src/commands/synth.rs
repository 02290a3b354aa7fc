//! `moe-offload synth`: a synthetic trace, streamed to disk.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use std::io::Write;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use trace_io::synth::{SynthConfig, SynthPreset};

use crate::progress::{Progress, status};

#[derive(Debug, Args)]
pub struct SynthArgs {
    /// MoE layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Routed experts per layer.
    #[arg(long, default_value_t = 32)]
    pub experts: usize,
    /// Experts used per token.
    #[arg(long, default_value_t = 4)]
    pub top_k: usize,
    /// Candidates recorded per row.
    #[arg(long, default_value_t = 8)]
    pub candidates: usize,
    /// Tokens.
    #[arg(long, default_value_t = 4096)]
    pub tokens: usize,
    /// Sequences (equal lengths).
    #[arg(long, default_value_t = 16)]
    pub sequences: usize,
    /// Token-stream seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model seed (popularity, norm scales); share it between a calibration and a held-out trace.
    #[arg(long, default_value_t = 0)]
    pub model_seed: u64,
    /// Record expert output norms (`out_norms`, needed by REAP).
    #[arg(long)]
    pub norms: bool,
    /// Routing parameters fitted to a real trace (docs/synth.md): dsv2-lite (DeepSeek-V2-Lite, ESFT
    /// translation; the defaults), dsv2-lite-flat (ESFT intent, law, summary) or qwen15-moe
    /// (Qwen1.5-MoE-A2.7B-Chat served by vLLM).
    #[arg(long, value_name = "NAME", default_value_t = SynthPreset::Dsv2Lite)]
    pub preset: SynthPreset,
    /// Routing-model parameters as JSON, over the preset's (see docs/synth.md), e.g.
    /// '{"reuse": 0.3, "skew": 1.1}'. Shape, seeds and norms come from the flags above.
    #[arg(long, value_name = "JSON")]
    pub model: Option<String>,
    /// Worker threads, one layer each (0 = RAYON_NUM_THREADS or all cores); the output does not
    /// depend on it.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Output trace.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// The preset's configuration with the fields of the `--model` JSON object (if any) replaced.
fn routing(preset: SynthPreset, model: Option<&str>) -> Result<SynthConfig> {
    let base = preset.config();
    let Some(json) = model else { return Ok(base) };
    let over: serde_json::Value = serde_json::from_str(json).map_err(|e| anyhow!("--model: {e}"))?;
    let serde_json::Value::Object(over) = over else { bail!("--model: expected a JSON object, got {over}") };
    // Shape, seeds and norms come from the flags; a --model key for them would be ignored.
    const FLAGS: [&str; 9] =
        ["layers", "experts", "top_k", "candidates", "tokens", "sequences", "seed", "model_seed", "norms"];
    if let Some(key) = over.keys().find(|k| FLAGS.contains(&k.as_str())) {
        bail!("--model: `{key}` is set by its flag (--{}), not by --model", key.replace('_', "-"));
    }
    let mut merged = serde_json::to_value(&base)?;
    merged.as_object_mut().expect("SynthConfig serializes to an object").extend(over);
    serde_json::from_value(merged).map_err(|e| anyhow!("--model: {e}"))
}

/// Runs `synth`.
pub fn run(a: &SynthArgs) -> Result<()> {
    let base = routing(a.preset, a.model.as_deref())?;
    let cfg = SynthConfig {
        layers: a.layers,
        experts: a.experts,
        top_k: a.top_k,
        candidates: a.candidates,
        tokens: a.tokens,
        sequences: a.sequences,
        seed: a.seed,
        model_seed: a.model_seed,
        norms: a.norms,
        ..base
    };
    let threads = if a.threads == 0 { rayon::current_num_threads() } else { a.threads };
    let start = Instant::now();
    let done = AtomicUsize::new(0);
    status!(
        "synth: {} layers x {} tokens x {} candidates (about {:.1} MB) on {threads} threads",
        cfg.layers,
        cfg.tokens,
        cfg.candidates,
        synth_bytes(&cfg) as f64 / 1e6
    );
    let bar = Progress::new("synth", cfg.layers as u64, "layers");
    let progress = |_layer: usize| {
        done.fetch_add(1, Ordering::Relaxed);
        bar.inc(1);
    };
    trace_io::synth::write(&a.output, &cfg, threads, &progress)?;
    bar.finish();
    let bytes = std::fs::metadata(&a.output).map(|m| m.len()).unwrap_or(0);
    writeln!(
        std::io::stdout().lock(),
        "wrote {}: {} layers x {} tokens, {} experts, top-{} of {}, {:.1} MB in {:.1} s",
        a.output.display(),
        cfg.layers,
        cfg.tokens,
        cfg.experts,
        cfg.top_k,
        cfg.candidates,
        bytes as f64 / 1e6,
        start.elapsed().as_secs_f64()
    )?;
    Ok(())
}

/// The size of the tensors a synthetic trace holds, in bytes (the header aside).
fn synth_bytes(c: &SynthConfig) -> u64 {
    let rows = (c.layers as u64).saturating_mul(c.tokens as u64);
    let per_row = c.candidates as u64 * (2 + 4) + c.top_k as u64 * (4 + if c.norms { 4 } else { 0 });
    rows.saturating_mul(per_row)
}
