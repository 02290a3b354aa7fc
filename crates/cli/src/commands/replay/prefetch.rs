//! `moe-offload replay` with prefetch (SEMANTICS.md §12), the timeline (§13) or the
//! shuffled-order control: the flags, and the table of what they add.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Result;
use cachesim::Prefetch;
use clap::Args;
use serde_json::Value;

/// The flags `replay` takes for prefetch, the timeline and the shuffled control.
#[derive(Debug, Args)]
pub struct PrefetchArgs {
    /// Prefetch before each token's demand accesses: PRED:B with PRED one of prev_token, coact,
    /// lookahead, oracle and B the proposals per token and layer (<= cap), e.g. coact:4.
    #[arg(long, value_name = "PRED:B")]
    pub prefetch: Option<Prefetch>,
    /// Calibration trace of the coact predictor (same model layers and experts as the trace).
    #[arg(long, value_name = "TRACE")]
    pub calib: Option<PathBuf>,
    /// Also play the replay on the timeline of one compute stream and one I/O channel (adds
    /// tok_s and stall_s_per_token, with and without prefetch).
    #[arg(long)]
    pub timeline: bool,
    /// Device profile (reference, dsv2-lite-bf16, qwen15-moe-bf16, mixtral-8x7b-q4); default:
    /// the trace's model's, else reference. Prices the bytes moved and the timeline.
    #[arg(long)]
    pub profile: Option<String>,
    /// I/O bandwidth of the timeline, in GB/s (default: the profile's first, 3.9).
    #[arg(long, value_name = "GBPS", value_parser = crate::args::positive)]
    pub bandwidth: Option<f64>,
    /// Also replay a token-shuffled copy of the trace (the permutation of SEED, the same in
    /// every layer) with the same settings: the misses without temporal locality.
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
}

/// The report as tables: the counts, then one row per figure the flags add.
pub fn write_table(out: &mut impl Write, r: &Value) -> Result<()> {
    let mut t = comfy_table::Table::new();
    t.set_header(["tokens", "picks", "hits", "misses", "forced", "hit rate", "misses/token"]);
    t.add_row([
        r["tokens"].to_string(),
        r["picks"].to_string(),
        r["hits"].to_string(),
        r["misses"].to_string(),
        r["forced_misses"].to_string(),
        format!("{:.4}", r["hit_rate"].as_f64().unwrap_or(0.0)),
        format!("{:.4}", r["misses_per_token"].as_f64().unwrap_or(0.0)),
    ]);
    writeln!(out, "{t}")?;
    let mut t = comfy_table::Table::new();
    t.set_header(["figure", "value"]);
    let num = |v: &Value| match v.as_f64() {
        Some(f) if v.is_f64() => format!("{f:.4}"),
        _ => v.to_string(),
    };
    for key in [
        "prefetch",
        "prefetch_loads",
        "useful",
        "wasted",
        "precision",
        "coverage",
        "loads_per_token",
        "mb_per_token",
        "plain_misses",
        "loads_per_miss_saved",
        "mb_per_miss_saved",
        "bandwidth_gbps",
        "tok_s",
        "stall_s_per_token",
        "tok_s_no_prefetch",
        "stall_s_per_token_no_prefetch",
        "additive_tok_s",
        "shuffle_seed",
    ] {
        if let Some(v) = r.get(key) {
            t.add_row([key.to_string(), num(v)]);
        }
    }
    if let Some(s) = r.get("shuffled") {
        for (k, v) in s.as_object().into_iter().flatten() {
            t.add_row([format!("shuffled {k}"), num(v)]);
        }
    }
    writeln!(out, "profile {} ({} MB per expert)\n{t}", r["profile"].as_str().unwrap_or(""), r["expert_mb"])?;
    Ok(())
}
