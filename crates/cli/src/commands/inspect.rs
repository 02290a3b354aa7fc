//! `moe-offload inspect`: shape, metadata, sequence and step sizes, and per-layer expert usage.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use api::inputs::TraceSource;
use api::inspect::InspectRequest;
use clap::Args;
use trace_io::summary::SHUFFLE_SEED;

use crate::args::Spelled;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Print JSON (kind `moe-offload-inspect`) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `inspect`.
pub fn run(a: &InspectArgs) -> Result<()> {
    let r = InspectRequest { trace: TraceSource::Path(a.trace.clone()) }.run().flags()?;
    if a.json {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&r.document())?)?;
        return Ok(());
    }
    let (s, m, f) = (&r.shape, &r.meta, &r);
    let (seqs, steps, step_sizes, layers) = (&r.sequences, &r.steps, &r.step_sizes, &r.layers);
    let (reuse, control) = (r.mean_next_token_reuse, r.mean_shuffled_reuse);
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}: {} ({} bytes)", a.trace.display(), m.model, f.bytes)?;
    writeln!(
        out,
        "{} x {} tokens, E = {}, top-{} of {} candidates; scores: {}, phase: {}",
        super::layers(s.layers),
        s.tokens,
        s.num_experts,
        s.top_k,
        s.candidates,
        m.score_kind,
        m.phase
    )?;
    writeln!(out, "source: {}", m.source)?;
    if let Some(width) = r.tensors["lookahead_ids"].as_u64() {
        writeln!(
            out,
            "lookahead_ids: {width} ids per layer and token (each layer's router on the previous layer's input)"
        )?;
    }
    for (k, val) in &m.extra {
        writeln!(out, "{k}: {val}")?;
    }
    if let Some(q) = &seqs {
        writeln!(
            out,
            "{} sequences; tokens per sequence: min {}, median {}, mean {:.1}, max {}",
            q.count, q.min, q.median, q.mean, q.max
        )?;
    }
    if let (Some(q), Some(sizes)) = (&steps, &step_sizes) {
        writeln!(
            out,
            "{} engine steps; tokens per step: min {}, median {}, mean {:.1}, max {}",
            q.count, q.min, q.median, q.mean, q.max
        )?;
        let shown: Vec<String> = sizes.iter().take(24).map(u64::to_string).collect();
        let more = if sizes.len() > 24 { format!(" ... ({} more)", sizes.len() - 24) } else { String::new() };
        writeln!(out, "step sizes: {}{more}", shown.join(" "))?;
    }
    writeln!(
        out,
        "next-token expert reuse (mean over layers): {reuse:.3}, shuffled-order control {control:.3} (seed {SHUFFLE_SEED:#x})"
    )?;
    let mut t = comfy_table::Table::new();
    t.set_header(["layer", "experts used", "entropy (bits)", "top-10% share", "next-token reuse", "shuffled control"]);
    for u in layers {
        t.add_row([
            u.layer_id.to_string(),
            u.experts_used.to_string(),
            format!("{:.3}", u.entropy_bits),
            format!("{:.3}", u.top10pct_share),
            format!("{:.3}", u.next_token_reuse),
            format!("{:.3}", u.shuffled_reuse),
        ]);
    }
    super::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    Ok(())
}
