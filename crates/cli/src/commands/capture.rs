//! `moe-offload capture`: routing recorded from a GGUF model run by llama.cpp (`api::capture`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use api::capture::CaptureRequest;
use capture::{CaptureConfig, Input, Progress, Timing};
use clap::Args;

use crate::args::Spelled;

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["text", "tokens"])))]
pub struct CaptureArgs {
    /// The GGUF model.
    pub model: PathBuf,
    /// UTF-8 text, tokenized by the model's tokenizer (repeatable: one file after the other).
    #[arg(long, value_name = "FILE")]
    pub text: Vec<PathBuf>,
    /// Token ids: one sequence per line, ids separated by spaces or commas (repeatable).
    #[arg(long, value_name = "FILE")]
    pub tokens: Vec<PathBuf>,
    /// Context size (tokens): longer inputs are cut into chunks of CTX − GENERATE tokens, each a
    /// fresh context.
    #[arg(long, default_value_t = 4096)]
    pub ctx: usize,
    /// Tokens per llama_decode of a prefill (n_batch = n_ubatch).
    #[arg(long, default_value_t = 512)]
    pub batch: usize,
    /// Greedy decode tokens after each sequence's prefill (the decode routing a decode cache sees).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub generate: usize,
    /// CPU threads (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Router candidates per row, from the logits (default: every expert).
    #[arg(long, value_name = "M")]
    pub candidates: Option<usize>,
    /// Layers llama.cpp offloads to a GPU (n_gpu_layers; needs a GPU build).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub gpu_layers: i32,
    /// Stop after this many input tokens.
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<usize>,
    /// Time a second, plain run of the same sequences (no eval callback) for llama.cpp's timings
    /// in the trace, as predictions are checked against (docs/validation.md).
    #[arg(long)]
    pub timing_run: bool,
    /// The trace to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print JSON (kind `moe-offload-capture`) instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `capture`.
pub fn run(a: &CaptureArgs) -> Result<()> {
    let input = if a.text.is_empty() { Input::Tokens(a.tokens.clone()) } else { Input::Text(a.text.clone()) };
    let config = CaptureConfig {
        ctx: a.ctx,
        batch: a.batch,
        generate: a.generate,
        threads: a.threads,
        candidates: a.candidates,
        gpu_layers: a.gpu_layers,
        max_tokens: a.max_tokens,
        timing: if a.timing_run { Timing::PlainRun } else { Timing::EvalCallback },
        ..CaptureConfig::new(a.model.clone(), input)
    };
    let request = CaptureRequest { config, output: a.output.clone() };
    let mut bar: Option<(crate::progress::Progress, usize)> = None;
    let mut on_progress = |p: Progress| match p {
        Progress::Start { sequences, tokens, generate } => {
            crate::progress::status!(
                "capturing {tokens} prompt tokens in {sequences} sequences{}",
                if generate > 0 { format!(", then up to {generate} decode tokens each") } else { String::new() }
            );
            let total = tokens + sequences * generate;
            bar = Some((crate::progress::Progress::new("capture", total as u64, "tokens"), 0));
        }
        Progress::TimingRun => crate::progress::status!("recorded; timing a plain run of the same tokens"),
        Progress::Tokens(n) => {
            if let Some((b, done)) = &mut bar {
                b.inc(n.saturating_sub(*done) as u64);
                *done = n;
            }
        }
    };
    let r = request.run(&mut on_progress).flags();
    if let Some((b, _)) = bar {
        b.finish();
    }
    let r = r?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r.document())?)?;
        return Ok(());
    }
    let (s, rec, t) = (&r.shape, &r.recorded, &r.timings);
    writeln!(
        out,
        "{}: {} x {} tokens ({} prefill, {} decode) in {} sequences, E = {}, top-{}, m = {}; scores: {}",
        r.output.display(),
        super::layers(s.layers),
        s.tokens,
        rec.prefill_tokens,
        rec.decode_tokens,
        r.sequences,
        s.num_experts,
        s.top_k,
        s.candidates,
        if rec.scores { "router logits" } else { "none" }
    )?;
    let per = |ms: f64, n: u64| if n == 0 { "-".to_string() } else { format!("{:.3} ms/token", ms / n as f64) };
    writeln!(
        out,
        "llama.cpp ({}, {} threads, batch {}): prompt {}, decode {} ({})",
        r.arch,
        t.threads,
        t.batch,
        per(t.prompt_ms, t.prompt_tokens),
        per(t.decode_ms, t.decode_tokens),
        match t.timing {
            Timing::EvalCallback => "timed with the eval callback",
            Timing::PlainRun => "timed in a plain run of the same tokens",
        }
    )?;
    for n in &r.notes {
        writeln!(out, "note: {n}")?;
    }
    Ok(())
}
