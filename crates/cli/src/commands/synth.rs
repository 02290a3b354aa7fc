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
    /// (layer, expert) pairs never routed, spread evenly over the layers (the highest ids of a
    /// layer) [default: the preset's: 4 for dsv2-lite and dsv2-lite-flat, 0 for qwen15-moe]. Each
    /// layer must keep at least --candidates routable experts: 0 for a small E (down to E = 1).
    #[arg(long, value_name = "N")]
    pub dead_experts: Option<usize>,
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
    /// Write a trace above the size limit (about 8 GB).
    #[arg(long)]
    pub yes: bool,
    /// Output trace.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Bytes of trace `synth` writes without `--yes` (the benchmark traces are below 1 GB; a slip in
/// --layers or --tokens would otherwise fill the disk for hours).
pub const MAX_BYTES: u64 = 8_000_000_000;

/// The preset's configuration with the fields of the `--model` JSON object (if any) replaced, and
/// `dead_experts` replaced by `--dead-experts` when given.
fn routing(preset: SynthPreset, model: Option<&str>, dead_experts: Option<usize>) -> Result<SynthConfig> {
    let mut base = preset.config();
    if let Some(d) = dead_experts {
        base.dead_experts = d;
    }
    let Some(json) = model else { return Ok(base) };
    let over: serde_json::Value = serde_json::from_str(json).map_err(|e| anyhow!("--model: {e}"))?;
    let serde_json::Value::Object(over) = over else { bail!("--model: expected a JSON object, got {over}") };
    // Shape, seeds and norms come from the flags; a --model key for them would be ignored.
    const FLAGS: [&str; 9] =
        ["layers", "experts", "top_k", "candidates", "tokens", "sequences", "seed", "model_seed", "norms"];
    if let Some(key) = over.keys().find(|k| FLAGS.contains(&k.as_str())) {
        bail!("--model: `{key}` is set by its flag (--{}), not by --model", key.replace('_', "-"));
    }
    if dead_experts.is_some() && over.contains_key("dead_experts") {
        bail!("--model: `dead_experts` is also given as --dead-experts: give it once");
    }
    let mut merged = serde_json::to_value(&base)?;
    merged.as_object_mut().expect("SynthConfig serializes to an object").extend(over);
    serde_json::from_value(merged).map_err(|e| anyhow!("--model: {e}"))
}

/// Runs `synth`.
pub fn run(a: &SynthArgs) -> Result<()> {
    super::refuse_trace_output(&a.output)?;
    let base = routing(a.preset, a.model.as_deref(), a.dead_experts)?;
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
    dead_experts_fit(&cfg, a.dead_experts.is_none() && cfg.dead_experts == a.preset.config().dead_experts)?;
    cfg.validate()?;
    let bytes = synth_bytes(&cfg);
    if bytes > MAX_BYTES && !a.yes {
        bail!(
            "the trace would be about {:.1} GB, above the limit of {} GB without --yes: check --layers, --tokens and \
             --candidates, or pass --yes to write it",
            bytes as f64 / 1e9,
            MAX_BYTES / 1_000_000_000
        );
    }
    let threads = if a.threads == 0 { rayon::current_num_threads() } else { a.threads };
    let start = Instant::now();
    let done = AtomicUsize::new(0);
    status!(
        "synth: {} layers x {} tokens x {} candidates (about {:.1} MB) on {threads} threads",
        cfg.layers,
        cfg.tokens,
        cfg.candidates,
        bytes as f64 / 1e6
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

/// Refuses dead experts that leave a layer fewer routable experts than candidates, naming the
/// flags (the library's check names only the configuration keys). `default`: the count is the
/// preset's, not given.
fn dead_experts_fit(c: &SynthConfig, default: bool) -> Result<()> {
    if c.layers == 0 || c.dead_experts == 0 || c.candidates > c.experts {
        return Ok(()); // the library's own checks say what is wrong
    }
    let per_layer = c.dead_experts.div_ceil(c.layers);
    let live = c.experts.saturating_sub(per_layer);
    if c.candidates > live {
        let whose = if default { " (the preset's default)" } else { "" };
        bail!(
            "--dead-experts {}{whose} over {} leaves up to {per_layer} never-routed of the {} experts of a layer, {live} \
             routable, fewer than --candidates {}: pass --dead-experts 0 (or fewer), or more --experts",
            c.dead_experts,
            super::layers(c.layers),
            c.experts,
            c.candidates
        );
    }
    Ok(())
}

/// The size of the tensors a synthetic trace holds, in bytes (the header aside).
fn synth_bytes(c: &SynthConfig) -> u64 {
    let rows = (c.layers as u64).saturating_mul(c.tokens as u64);
    let per_row = c.candidates as u64 * (2 + 4) + c.top_k as u64 * (4 + if c.norms { 4 } else { 0 });
    rows.saturating_mul(per_row)
}
