//! `moe-offload keep`: keep maps, K experts per layer or a global budget, from statistics
//! (SEMANTICS.md §3).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use saliency::{Budget, BudgetScale, KeepConfig, KeepMap, Metric, MetricConfig, Placement, Stats};

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("size").required(true).args(["k", "budget"])))]
pub struct KeepArgs {
    /// Statistics JSON written by `moe-offload stats`.
    pub stats: PathBuf,
    /// Saliency metric: frequency, gate_sum, ean_sum, ean_mean, reap, l2_sum, shrink, hybrid.
    #[arg(long, required_unless_present = "placement", conflicts_with = "placement")]
    pub metric: Option<Metric>,
    /// Instead of a metric, a pin map placed by one of kTransformers' GPU expert placements:
    /// uniform, front (front-loading), random or frequency, with N = --budget experts over all
    /// layers (for `replay --pin`; a layer may get none).
    #[arg(long, requires = "budget", conflicts_with_all = ["k", "floor", "budget_scale", "hybrid_base", "allow_short_layers"])]
    pub placement: Option<Placement>,
    /// Seed of --placement random (default 42, kTransformers' own).
    #[arg(long, requires = "placement")]
    pub seed: Option<u32>,
    /// Experts kept per layer; several comma-separated values (`--k 32,48`) write one map each.
    #[arg(long, value_delimiter = ',', conflicts_with = "budget", value_parser = crate::args::at_least_one)]
    pub k: Vec<usize>,
    /// Global budget: experts kept over all layers, a different K per layer (each layer keeps at
    /// least --floor, the rest go to the best experts of the whole model). Several comma-separated
    /// values write one map each.
    #[arg(long, value_delimiter = ',')]
    pub budget: Vec<u64>,
    /// Least experts kept per layer under --budget (default: the model's top-k, so every token can
    /// still use k experts).
    #[arg(long, requires = "budget")]
    pub floor: Option<u32>,
    /// How --budget compares experts of different layers: `share` (score / the layer's total, the
    /// default), `percentile` (rank within the layer) or `raw` (the score itself).
    #[arg(long, requires = "budget")]
    pub budget_scale: Option<BudgetScale>,
    /// τ of the `shrink` metric.
    #[arg(long, default_value_t = 64.0)]
    pub tau: f64,
    /// Base metrics of `hybrid`, comma-separated (default: l2_sum,reap when the statistics have
    /// reap_sum, else frequency,gate_sum).
    #[arg(long, value_delimiter = ',')]
    pub hybrid_base: Vec<Metric>,
    /// Allow layers with fewer than K (or --floor) experts that were ever routed (recorded in the
    /// map).
    #[arg(long)]
    pub allow_short_layers: bool,
    /// Output keep-map JSON for one map; for several (or when it is an existing directory, or
    /// ends with `/`) a directory that receives one `<label>.json` per map, e.g.
    /// `frequency@32.json`, `frequency@budget1536.json`. `-`: one map to standard output (the
    /// status line then goes to stderr).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the maps written as JSON (kind `moe-offload-keep-maps`: path, label, experts kept
    /// per layer) instead of one line each.
    #[arg(long)]
    pub json: bool,
}

/// Runs `keep`.
pub fn keep(a: &KeepArgs) -> Result<()> {
    let to_stdout = super::is_stdout(&a.output);
    if to_stdout && a.k.len() + a.budget.len() > 1 {
        bail!(
            "-o -: one keep map goes to standard output, several are written to files: give -o DIR/, or one --k or --budget"
        );
    }
    if to_stdout && a.json {
        bail!(
            "-o -: the keep map goes to standard output as it is, and --json lists maps written to files: drop --json"
        );
    }
    super::refuse_overwrite(&a.output, [a.stats.as_path()])?;
    let stats = Stats::read_json(&a.stats)?;
    super::no_repeats("budget", &a.budget)?;
    let metric = match (a.metric, a.placement) {
        (Some(m), _) => m,
        (None, Some(p)) => {
            let maps =
                a.budget.iter().map(|&n| KeepMap::place(&stats, p, n, a.seed)).collect::<saliency::Result<Vec<_>>>()?;
            return write_maps(a, maps);
        }
        (None, None) => bail!("give --metric or --placement"),
    };
    let cfg = KeepConfig {
        metric: MetricConfig { tau: a.tau, hybrid_base: (!a.hybrid_base.is_empty()).then(|| a.hybrid_base.clone()) },
        allow_short_layers: a.allow_short_layers,
    };
    if !a.hybrid_base.is_empty() && metric != Metric::Hybrid {
        bail!("--hybrid-base applies to --metric hybrid only: drop --hybrid-base or use --metric hybrid");
    }
    super::no_repeats("k", &a.k)?;
    if a.budget.is_empty() && (a.floor.is_some() || a.budget_scale.is_some()) {
        bail!("--floor and --budget-scale apply to --budget maps only: drop them, or use --budget instead of --k");
    }
    let maps = if a.budget.is_empty() {
        KeepMap::build_many(&stats, metric, &a.k, &cfg).map_err(keep_hint)?
    } else {
        let mut maps = Vec::with_capacity(a.budget.len());
        for &total in &a.budget {
            let mut b = Budget::new(&stats, metric, total);
            if let Some(f) = a.floor {
                b.floor = f;
            }
            if let Some(s) = a.budget_scale {
                b.scale = s;
            }
            maps.push(KeepMap::build_budget(&stats, metric, &b, &cfg).map_err(keep_hint)?);
        }
        maps
    };
    write_maps(a, maps)
}

/// Writes the maps built (one file, a directory of `<label>.json`, or standard output) and
/// reports them.
fn write_maps(a: &KeepArgs, mut maps: Vec<KeepMap>) -> Result<()> {
    let to_stdout = super::is_stdout(&a.output);
    // Every map is built before any file is written: a failing K leaves no partial output.
    let mut out = super::human(&a.output);
    // A path written as a directory (`maps/`) is one too, existing or not.
    let dir_like = a.output.as_os_str().to_string_lossy().ends_with(std::path::is_separator);
    let into_dir = !to_stdout && (maps.len() > 1 || a.output.is_dir() || dir_like);
    // Several maps are one output set: the directory gets all of them or none.
    let set = if into_dir {
        let set = trace_io::OutputSet::begin(&a.output)
            .with_context(|| format!("cannot write the output directory {}", a.output.display()))?;
        for map in &maps {
            map.write_json(set.staging().join(format!("{}.json", map.label())))?;
        }
        Some(set)
    } else {
        None
    };
    if let Some(set) = set {
        set.commit().with_context(|| format!("writing {}", a.output.display()))?;
    }
    let mut written = Vec::with_capacity(maps.len());
    for map in &mut maps {
        let path = if into_dir { a.output.join(format!("{}.json", map.label())) } else { a.output.clone() };
        if !into_dir {
            super::write_output(&path, &map.to_json_bytes()?)?;
        }
        let sizes: Vec<usize> = map.layers.iter().map(Vec::len).collect();
        let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
        if a.json {
            written.push(serde_json::json!({
                "path": path.display().to_string(), "label": map.label(), "metric": map.metric,
                "layer_ids": map.layer_ids, "kept_per_layer": sizes, "total_kept": map.total_kept(),
                "short_layers": map.short_layers,
            }));
            continue;
        }
        write!(out, "wrote {}: {} ({}", super::shown(&path), map.label(), super::layers(map.layers.len()))?;
        if map.budget.is_some() || map.placement.is_some() {
            write!(out, ", {} experts, per-layer K {lo}..={hi}", map.total_kept())?;
        }
        if !map.short_layers.is_empty() {
            write!(out, ", short layers {:?}", map.short_layers)?;
        }
        writeln!(out, ")")?;
    }
    if a.json {
        return super::json::print(&serde_json::json!({ "kind": super::json::KEEP_MAPS, "maps": written }));
    }
    Ok(())
}

/// Adds the fix to a keep-map error that does not state one.
fn keep_hint(e: saliency::SaliencyError) -> anyhow::Error {
    use saliency::SaliencyError as E;
    let hint = match &e {
        E::KTooLarge { num_experts, .. } => format!("use --k {num_experts} or less"),
        E::MissingStatistic { .. } => "use a metric these statistics support (frequency or gate_sum need no output \
            norms), or record output norms (python/capture_routing.py does)"
            .to_string(),
        E::ShortLayer { .. } => "pass --allow-short-layers, or use a smaller --k".to_string(),
        E::PartialStatistic { .. } => {
            "rank with statistics whose reap_sum is complete (--non-finite-reap drop keeps frequency)".to_string()
        }
        _ => return e.into(),
    };
    anyhow::anyhow!("{e}: {hint}")
}
