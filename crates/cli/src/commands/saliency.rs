//! `moe-offload stats` and `moe-offload keep`: statistics and keep maps.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use saliency::{KeepConfig, KeepMap, Metric, MetricConfig, Stats};
use trace_io::TraceFile;

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Output statistics JSON.
    #[arg(short, long)]
    pub output: PathBuf,
}

#[derive(Debug, Args)]
pub struct KeepArgs {
    /// Statistics JSON written by `moe-offload stats`.
    pub stats: PathBuf,
    /// Saliency metric: frequency, gate_sum, ean_sum, ean_mean, reap, l2_sum, shrink, hybrid.
    #[arg(long)]
    pub metric: Metric,
    /// Experts kept per layer.
    #[arg(long)]
    pub k: usize,
    /// τ of the `shrink` metric.
    #[arg(long, default_value_t = 64.0)]
    pub tau: f64,
    /// Allow layers with fewer than K experts that were ever routed (recorded in the map).
    #[arg(long)]
    pub allow_short_layers: bool,
    /// Output keep-map JSON.
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `stats`.
pub fn stats(a: &StatsArgs) -> Result<()> {
    let f = TraceFile::open(&a.trace)?;
    let sha = trace_io::sha256_file(&a.trace)?;
    let stats = Stats::from_trace(&f.view(), a.trace.display().to_string(), sha);
    stats.write_json(&a.output)?;
    let have: Vec<&str> = [
        ("count", true),
        ("gate_sum", stats.layers[0].gate_sum.is_some()),
        ("ean_sum", stats.layers[0].ean_sum.is_some()),
        ("reap_sum", stats.layers[0].reap_sum.is_some()),
        ("reap_sumsq", stats.layers[0].reap_sumsq.is_some()),
    ]
    .into_iter()
    .filter_map(|(n, h)| h.then_some(n))
    .collect();
    println!("wrote {}: {} layers, statistics: {}", a.output.display(), stats.layers.len(), have.join(", "));
    Ok(())
}

/// Runs `keep`.
pub fn keep(a: &KeepArgs) -> Result<()> {
    let stats = Stats::read_json(&a.stats)?;
    let cfg = KeepConfig {
        metric: MetricConfig { tau: a.tau, ..Default::default() },
        allow_short_layers: a.allow_short_layers,
    };
    let map = KeepMap::build(&stats, a.metric, a.k, &cfg)?;
    map.write_json(&a.output)?;
    println!("wrote {}: {} ({} layers)", a.output.display(), map.label(), map.layers.len());
    Ok(())
}
