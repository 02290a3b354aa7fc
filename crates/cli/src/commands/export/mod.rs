//! `moe-offload export ...`: keep maps, saliency orders and plans in the formats other tools read
//! (`docs/report.md`, section "Exports"; the formats in [`formats`]).

mod formats;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::args::Spelled;
use saliency::{Metric, MetricConfig, Stats};

/// `moe-offload export ...`.
#[derive(Debug, Subcommand)]
pub enum ExportCmd {
    /// vLLM-Ascend's `expert_list_file`: JSON Lines, every expert of a layer most salient first.
    #[command(
        after_help = "Example:\n  moe-offload export vllm-ascend stats.json --metric reap -o experts.jsonl\n  vllm serve Qwen/Qwen3-30B-A3B --additional-config '{\"expert_list_file\":\"experts.jsonl\",\"expert_prune_ratio\":0.5}'"
    )]
    VllmAscend(VllmArgs),
    /// The `expert_stats.json` read by llama.cpp's `gguf_prune.py --stats`.
    #[command(
        after_help = "Example:\n  moe-offload export gguf-prune stats.json -o expert_stats.json\n  python tools/moe-pruning/gguf_prune.py --input model.gguf --stats expert_stats.json --output pruned.gguf --keep_n 32"
    )]
    GgufPrune(StatsOut),
    /// llama.cpp flags from a plan: `--moe-hot-count N0,N1,...` and `-ot` for the layers kept whole.
    #[command(
        after_help = "Example:\n  moe-offload export llama-cpp plan.json -o llama-flags.txt\n  llama-server -m model.gguf $(cat llama-flags.txt) --cpu-moe"
    )]
    LlamaCpp(LlamaArgs),
    /// A keep map as a generic keep-set JSON: `k`, `layers` with each layer's `keep` list.
    #[command(after_help = "Example:\n  moe-offload export keep-set keep.json -o keep-set.json")]
    KeepSet(KeepOut),
}

/// Arguments of `export vllm-ascend`.
#[derive(Debug, Args)]
pub struct VllmArgs {
    /// Statistics JSON written by `moe-offload stats`.
    pub stats: PathBuf,
    /// Saliency metric that orders the experts.
    #[arg(long)]
    pub metric: Metric,
    /// τ of the `shrink` metric.
    #[arg(long, default_value_t = 64.0)]
    pub tau: f64,
    /// Base metrics of `hybrid`, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub hybrid_base: Vec<Metric>,
    /// Output JSON Lines file (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Arguments of an export read from statistics.
#[derive(Debug, Args)]
pub struct StatsOut {
    /// Statistics JSON written by `moe-offload stats`.
    pub stats: PathBuf,
    /// Output file (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Arguments of `export llama-cpp`.
#[derive(Debug, Args)]
pub struct LlamaArgs {
    /// Plan JSON written by `moe-offload plan`.
    pub plan: PathBuf,
    /// llama.cpp buffer type of the fast memory, for `-ot`.
    #[arg(long, default_value = "CUDA0")]
    pub device: String,
    /// Output text file, the flags one per line (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Arguments of `export keep-set`.
#[derive(Debug, Args)]
pub struct KeepOut {
    /// Keep-map JSON written by `moe-offload keep`, or a plan of `moe-offload plan` (its
    /// `chosen.keep_map`, as `replay --keep` reads it).
    pub keep: PathBuf,
    /// Output file (`-` for stdout).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// Runs `export`.
pub fn run(cmd: &ExportCmd) -> Result<()> {
    match cmd {
        ExportCmd::VllmAscend(a) => {
            super::refuse_overwrite(&a.output, [a.stats.as_path()])?;
            let stats = Stats::read_json(&a.stats)?;
            let cfg =
                MetricConfig { tau: a.tau, hybrid_base: (!a.hybrid_base.is_empty()).then(|| a.hybrid_base.clone()) };
            let order = formats::saliency_order(&stats, a.metric, &cfg)?;
            super::write_output(&a.output, &formats::vllm_ascend(&stats.meta.layer_ids, &order))?;
            super::status(format_args!(
                "wrote {} (vLLM-Ascend expert_list_file): {}, {} experts each, ordered by {}; keep K with expert_prune_ratio = 1 - K/{}",
                super::shown(&a.output),
                super::layers(order.len()),
                stats.meta.num_experts,
                a.metric.as_str(),
                stats.meta.num_experts
            ));
        }
        ExportCmd::GgufPrune(a) => {
            super::refuse_overwrite(&a.output, [a.stats.as_path()])?;
            let stats = Stats::read_json(&a.stats)?;
            super::write_output(&a.output, &formats::gguf_prune_stats(&stats)?)?;
            let reap = stats.layers.iter().all(|l| l.reap_sum.is_some());
            super::status(format_args!(
                "wrote {} (gguf_prune.py expert_stats.json): {}, {}",
                super::shown(&a.output),
                super::layers(stats.layers.len()),
                if reap { "ranked by reap" } else { "no reap (no output norms): ranked by importance_score" }
            ));
        }
        ExportCmd::LlamaCpp(a) => {
            super::refuse_overwrite(&a.output, [a.plan.as_path()])?;
            let text = std::fs::read_to_string(&a.plan).with_context(|| format!("reading {}", a.plan.display()))?;
            let v: serde_json::Value =
                serde_json::from_str(&text).with_context(|| format!("{}: not JSON", a.plan.display()))?;
            let p = formats::LlamaPlan::of(&v).with_context(|| format!("{}", a.plan.display()))?;
            let flags = formats::llama_cpp_flags(&p, &a.device);
            super::write_output(&a.output, flags.as_bytes())?;
            let whole = p.whole_layers().len();
            super::status(format_args!(
                "wrote {} (llama.cpp flags): --moe-hot-count for {}, {whole} kept whole in {}; {}",
                super::shown(&a.output),
                super::layers(p.layer_ids.len()),
                a.device,
                if p.pinned {
                    "hot counts = the plan's pinned experts per layer (its caches are an LRU cache llama.cpp does not keep)"
                } else {
                    "the plan has no pins: hot counts = its cache size per layer, held by llama.cpp as a static hot \
                     set (plan with --pin-counts for the figures of a hot set)"
                }
            ));
        }
        ExportCmd::KeepSet(a) => {
            super::refuse_overwrite(&a.output, [a.keep.as_path()])?;
            // A keep map, or a plan's chosen keep map, as `replay --keep` reads it.
            let map = api::inputs::read_keep(&api::inputs::MapSource::Path(a.keep.clone()), false).flags()?;
            super::write_output(&a.output, &formats::keep_set(&map, &super::version())?)?;
            super::status(format_args!(
                "wrote {} (keep set): {}, K {} of {} experts",
                super::shown(&a.output),
                super::layers(map.layers.len()),
                map.k,
                map.num_experts
            ));
        }
    }
    Ok(())
}
