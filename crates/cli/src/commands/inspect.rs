//! `moe-offload inspect`: shape, metadata, sequence and step sizes, and per-layer expert usage.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use trace_io::TraceFile;
use trace_io::summary::{SHUFFLE_SEED, SizeSummary, span_sizes, validate_with_usage};

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
    let unreadable = || {
        format!(
            "{} is not a readable moe-offload trace (convert routing logs with `moe-offload import`, or write one as \
             docs/trace-format.md shows)",
            a.trace.display()
        )
    };
    // Every value validated, as `TraceFile::open` does (the same first violation), with the usage
    // figures of every layer computed in the pass that checks the ids (read once, on every core;
    // the figures are the same whatever the thread count).
    let f = TraceFile::open_lazy(&a.trace).with_context(unreadable)?;
    let (v, layers) = validate_with_usage(&f, SHUFFLE_SEED).with_context(unreadable)?;
    super::require_tokens(v.shape(), &a.trace)?;
    let s = v.shape();
    let m = v.meta();
    let seq_sizes = v.seq_offsets().map(|o| span_sizes(o, s.tokens));
    let step_sizes = v.step_offsets().map(|o| span_sizes(o, s.tokens));
    let seqs = seq_sizes.as_deref().and_then(SizeSummary::of);
    let steps = step_sizes.as_deref().and_then(SizeSummary::of);
    let mean =
        |f: fn(&trace_io::summary::LayerUsage) -> f64| layers.iter().map(f).sum::<f64>() / layers.len().max(1) as f64;
    let (reuse, control) = (mean(|u| u.next_token_reuse), mean(|u| u.shuffled_reuse));
    if a.json {
        let report = serde_json::json!({
            "kind": super::json::INSPECT,
            "path": a.trace.display().to_string(),
            "bytes": f.byte_len(),
            "shape": s,
            "meta": m,
            "tensors": {
                "scores": v.parts().scores.is_some(), "gates": v.parts().gates.is_some(),
                "out_norms": v.parts().out_norms.is_some(),
                "seq_offsets": v.seq_offsets().map(<[u64]>::len), "step_offsets": v.step_offsets().map(<[u64]>::len),
                "lookahead_ids": v.lookahead().map(|la| la.width),
            },
            "sequences": seqs,
            "steps": steps,
            "step_sizes": step_sizes,
            "shuffle_seed": SHUFFLE_SEED,
            "mean_next_token_reuse": reuse,
            "mean_shuffled_reuse": control,
            "layers": layers,
        });
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}: {} ({} bytes)", a.trace.display(), m.model, f.byte_len())?;
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
    if let Some(la) = v.lookahead() {
        writeln!(
            out,
            "lookahead_ids: {} ids per layer and token (each layer's router on the previous layer's input)",
            la.width
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
    for u in &layers {
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
