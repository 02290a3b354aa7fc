//! `moe-offload inspect`: shape, metadata and per-layer expert usage of a trace.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use trace_io::{TraceFile, TraceView};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Runs `inspect`.
pub fn run(a: &InspectArgs) -> Result<()> {
    let f = TraceFile::open(&a.trace)?;
    let v = f.view();
    let s = v.shape();
    let m = v.meta();
    let layers: Vec<serde_json::Value> = (0..s.layers).map(|l| layer_usage(&v, l)).collect();
    let seqs = v.seq_offsets().map(|o| o.len());
    let report = serde_json::json!({
        "path": a.trace.display().to_string(),
        "bytes": f.byte_len(),
        "shape": s,
        "meta": m,
        "tensors": {
            "scores": v.parts().scores.is_some(), "gates": v.parts().gates.is_some(),
            "out_norms": v.parts().out_norms.is_some(), "seq_offsets": seqs, "step_offsets": v.step_offsets().map(|o| o.len()),
        },
        "tokens_per_sequence": seqs.map(|n| s.tokens as f64 / n as f64),
        "layers": layers,
    });
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
        return Ok(());
    }
    writeln!(out, "{}: {} ({} bytes)", a.trace.display(), m.model, f.byte_len())?;
    writeln!(
        out,
        "{} layers x {} tokens, E = {}, top-{} of {} candidates; scores: {}, phase: {}",
        s.layers, s.tokens, s.num_experts, s.top_k, s.candidates, m.score_kind, m.phase
    )?;
    writeln!(out, "source: {}", m.source)?;
    for (k, val) in &m.extra {
        writeln!(out, "{k}: {val}")?;
    }
    if let Some(n) = seqs {
        writeln!(out, "{n} sequences, {:.1} tokens per sequence", s.tokens as f64 / n as f64)?;
    }
    let mut t = comfy_table::Table::new();
    t.set_header([
        "layer",
        "experts used",
        "entropy (bits)",
        "top-10% share",
        "next-token reuse",
        "distant-token reuse",
    ]);
    for l in &report["layers"].as_array().expect("layers is an array").clone() {
        t.add_row([
            l["layer_id"].to_string(),
            l["experts_used"].to_string(),
            format!("{:.3}", l["entropy_bits"].as_f64().unwrap_or(0.0)),
            format!("{:.3}", l["top10pct_share"].as_f64().unwrap_or(0.0)),
            format!("{:.3}", l["next_token_reuse"].as_f64().unwrap_or(0.0)),
            format!("{:.3}", l["distant_token_reuse"].as_f64().unwrap_or(0.0)),
        ]);
    }
    writeln!(out, "{t}")?;
    Ok(())
}

/// Per-layer usage: entropy of the used-expert distribution, share of the most used 10% of experts,
/// and the next-token reuse rate (fraction of used slots whose expert was also used at the previous
/// token) against a control that pairs each token with the token half the trace away.
fn layer_usage(v: &TraceView<'_>, l: usize) -> serde_json::Value {
    let s = v.shape();
    let (m, k) = (s.candidates, s.top_k);
    let ids = v.layer_ids(l);
    let mut count = vec![0u64; s.num_experts];
    for row in ids.chunks_exact(m) {
        for &e in &row[..k] {
            count[e as usize] += 1;
        }
    }
    let total: u64 = count.iter().sum();
    let entropy: f64 = count
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum();
    let mut sorted = count.clone();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let top = s.num_experts.div_ceil(10);
    let share = sorted[..top].iter().sum::<u64>() as f64 / total.max(1) as f64;
    let reuse = |offset: usize| {
        let mut hits = 0u64;
        for t in 0..s.tokens {
            let u = (t + offset) % s.tokens;
            let a = &ids[t * m..t * m + k];
            let b = &ids[u * m..u * m + k];
            hits += b.iter().filter(|e| a.contains(e)).count() as u64;
        }
        hits as f64 / (s.tokens * k) as f64
    };
    serde_json::json!({
        "layer_id": v.meta().layer_ids[l],
        "experts_used": count.iter().filter(|&&c| c > 0).count(),
        "entropy_bits": entropy,
        "top10pct_share": share,
        "next_token_reuse": reuse(1),
        "distant_token_reuse": reuse(s.tokens / 2),
    })
}
