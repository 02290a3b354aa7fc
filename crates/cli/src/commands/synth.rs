//! `moe-offload synth`: a synthetic trace.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use trace_io::synth::SynthConfig;
use trace_io::write_trace;

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
    /// Sequences.
    #[arg(long, default_value_t = 16)]
    pub sequences: usize,
    /// Token-stream seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Model seed (popularity); share it between a calibration and a held-out trace.
    #[arg(long, default_value_t = 0)]
    pub model_seed: u64,
    /// Do not record output norms.
    #[arg(long)]
    pub no_norms: bool,
    /// Output trace.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `synth`.
pub fn run(a: &SynthArgs) -> Result<()> {
    let cfg = SynthConfig {
        layers: a.layers,
        experts: a.experts,
        top_k: a.top_k,
        candidates: a.candidates,
        tokens: a.tokens,
        sequences: a.sequences,
        seed: a.seed,
        model_seed: a.model_seed,
        norms: !a.no_norms,
        ..Default::default()
    };
    let t = trace_io::synth::generate(&cfg)?;
    write_trace(&a.output, &t.view())?;
    println!("wrote {}", a.output.display());
    Ok(())
}
