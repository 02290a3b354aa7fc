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
    /// llama.cpp flags from a plan, one argument per line: `-ot` for the layers it places whole.
    #[command(
        after_help = "Example:\n  moe-offload export llama-cpp plan.json -o flags.txt\n  mapfile -t flags < flags.txt; llama-server -m model.gguf -ngl 99 \"${flags[@]}\"\n  xargs -d '\\n' -a flags.txt llama-server -m model.gguf -ngl 99"
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
    /// Plan JSON written by `moe-offload plan` (a cache plan, or a hybrid plan of `--exec host`).
    pub plan: PathBuf,
    /// llama.cpp buffer type of the fast memory, for a cache plan's `-ot` [default: CUDA0].
    #[arg(long)]
    pub device: Option<String>,
    /// The model's blocks with routed experts (`1-26`, `0,8,12-18`); a hybrid plan's own by
    /// default. Without it they are the plan's layers, and a plan that lacks a block below its
    /// last layer gets no flags.
    #[arg(long)]
    pub moe_layers: Option<crate::args::Blocks>,
    /// Also write `--moe-hot-count` and the plan's hot counts first: a flag of unmerged llama.cpp
    /// patches only, which stock llama.cpp refuses. Cache plans.
    #[arg(long)]
    pub unmerged_hot_count: bool,
    /// Output text file, one argument per line (`-` for stdout).
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
            let p = api::llama::AnyPlan::of(&v).flags().with_context(|| format!("{}", a.plan.display()))?;
            let moe_layers = a.moe_layers.as_ref().map(|b| b.0.as_slice());
            let (f, hot) = api::llama::flags(&p, a.device.as_deref(), moe_layers, a.unmerged_hot_count)
                .map_err(|e| anyhow::anyhow!(super::plan::spell_moe_layers(&e.render(&crate::args::Flags))))
                .with_context(|| format!("{}", a.plan.display()))?;
            let hot = hot.map(|h| format!("--moe-hot-count\n{h}\n")).unwrap_or_default();
            super::write_output(&a.output, (hot + &f.lines()).as_bytes())?;
            let moe = sweep::plan::llama::ranges(&f.moe_blocks);
            let cpu = sweep::plan::llama::ranges(&f.cpu_blocks);
            let what = match &p {
                api::llama::AnyPlan::Cache(c) => format!(
                    "{} whole in {}, the experts of MoE blocks {} on the CPU (--cpu-moe){}",
                    super::layers(c.whole_layers().len()),
                    a.device.as_deref().unwrap_or("CUDA0"),
                    if cpu.is_empty() { "-".into() } else { cpu },
                    if a.unmerged_hot_count {
                        "; --moe-hot-count first: unmerged llama.cpp patches only, stock llama.cpp refuses it"
                    } else {
                        ""
                    }
                ),
                api::llama::AnyPlan::Hybrid { .. } => match f.n_cpu_moe {
                    _ if f.cpu_blocks.is_empty() => "every MoE block on the GPU: no arguments".into(),
                    Some(n) => format!("the experts of blocks {cpu} on the CPU (the same as --n-cpu-moe {n})"),
                    None => format!("the experts of blocks {cpu} on the CPU (no --n-cpu-moe places exactly these)"),
                },
            };
            super::status(format_args!(
                "wrote {} (llama.cpp flags, one argument per line, MoE blocks {moe}): {what}",
                super::shown(&a.output),
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
