//! `moe-offload import`: real routing logs to a trace.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use trace_io::import::Imported;
use trace_io::import::esft::{EsftOptions, import_esft_with_report};
use trace_io::import::mixtral_jsonl::{MixtralJsonlOptions, import_mixtral_jsonl};
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};
use trace_io::write_trace;

#[derive(Debug, Subcommand)]
pub enum ImportCmd {
    /// The ESFT expert-score layout (DeepSeek-V2-Lite): one text file per domain and layer.
    #[command(
        after_help = "Example:\n  moe-offload import esft ../shared/data/real/esft-dsv2lite --domains translation -o translation.safetensors"
    )]
    Esft {
        /// The `esft-dsv2lite` directory (or its `results/expert_scores`).
        dir: PathBuf,
        /// Domains to concatenate, in order.
        #[arg(long, value_delimiter = ',', default_value = "intent,law,summary,translation")]
        domains: Vec<String>,
        /// Routed experts per layer.
        #[arg(long, default_value_t = 64)]
        num_experts: u32,
        /// Experts per token.
        #[arg(long, default_value_t = 6)]
        top_k: u32,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// vLLM route logs (JSON Lines, one file per layer, meta line first): one multi-layer trace with
    /// engine-step offsets; the engine's warm-up batches are detected and dropped.
    #[command(
        after_help = "Example:\n  moe-offload import vllm-routelog ../shared/data/real/vllm-routelog-qwen15moe/moe_layer*.jsonl --num-experts 60 -o qwen.safetensors"
    )]
    VllmRoutelog {
        /// Route-log files of one run, one per layer, any order (layers are sorted by id).
        #[arg(required = true)]
        inputs: Vec<PathBuf>,
        /// Routed experts per layer; required when the meta lines lack `num_experts`
        /// (Qwen1.5-MoE-A2.7B: 60).
        #[arg(long)]
        num_experts: Option<u32>,
        /// Keep the warm-up (profiling) batches instead of dropping them.
        #[arg(long)]
        keep_warmup: bool,
        /// Model name for the metadata (default: the meta line's `model_id`).
        #[arg(long)]
        model: Option<String>,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Mixtral routing JSON Lines, one record per (problem, layer, token); keeps the tokens present
    /// in every layer.
    #[command(
        after_help = "Example:\n  moe-offload import mixtral-jsonl ../shared/data/real/mixtral-decode/gsm8k_2_routing.jsonl -o mixtral.safetensors"
    )]
    MixtralJsonl {
        /// The routing file.
        input: PathBuf,
        /// Routed experts per layer.
        #[arg(long, default_value_t = 8)]
        num_experts: u32,
        /// Model name for the metadata.
        #[arg(long)]
        model: Option<String>,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// Runs `import`.
pub fn run(cmd: ImportCmd) -> Result<()> {
    let (imported, output) = match cmd {
        ImportCmd::Esft { dir, domains, num_experts, top_k, output } => {
            super::no_repeats("domains", &domains)?;
            let opts = EsftOptions { domains, num_experts, top_k, ..Default::default() };
            (import_esft_with_report(&dir, &opts)?, output)
        }
        ImportCmd::VllmRoutelog { inputs, num_experts, keep_warmup, model, output } => {
            super::refuse_overwrite(&output, inputs.iter().map(PathBuf::as_path))?;
            let opts = VllmRoutelogOptions { num_experts, keep_warmup, model };
            (import_vllm_routelog(&inputs, &opts)?, output)
        }
        ImportCmd::MixtralJsonl { input, num_experts, model, output } => {
            super::refuse_overwrite(&output, [input.as_path()])?;
            let mut opts = MixtralJsonlOptions { num_experts, ..Default::default() };
            if let Some(m) = model {
                opts.model = m;
            }
            (import_mixtral_jsonl(&input, &opts)?, output)
        }
    };
    let Imported { trace, report } = imported;
    write_trace(&output, &trace.view())?;
    let s = trace.view().shape();
    println!("{report}");
    println!(
        "wrote {}: {} x {} tokens, {} experts, top-{}",
        output.display(),
        super::layers(s.layers),
        s.tokens,
        s.num_experts,
        s.top_k
    );
    Ok(())
}
