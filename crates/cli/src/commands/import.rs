//! `moe-offload import`: real routing logs to a trace.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;
use trace_io::import::esft::{EsftOptions, import_esft};
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
}

/// Runs `import`.
pub fn run(cmd: ImportCmd) -> Result<()> {
    match cmd {
        ImportCmd::Esft { dir, domains, num_experts, top_k, output } => {
            let opts = EsftOptions { domains, num_experts, top_k, ..Default::default() };
            let t = import_esft(&dir, &opts)?;
            write_trace(&output, &t.view())?;
            let s = t.view().shape();
            println!(
                "wrote {}: {} layers x {} tokens, {} experts, top-{}; {} probabilities floored at {}",
                output.display(),
                s.layers,
                s.tokens,
                s.num_experts,
                s.top_k,
                t.meta().extra.get("floored_probs").map_or("0", String::as_str),
                trace_io::import::esft::PROB_FLOOR
            );
            Ok(())
        }
    }
}
