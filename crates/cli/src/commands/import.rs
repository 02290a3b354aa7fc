//! `moe-offload import`: real routing logs to a trace, and per-expert count files to statistics.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Result;
use clap::{Args, Subcommand};
use saliency::{CountsOptions, Stats};
use trace_io::import::Imported;
use trace_io::import::esft::{EsftOptions, import_esft_with_report};
use trace_io::import::llama_dump::{LlamaDumpOptions, import_llama_bin, import_llama_csv};
use trace_io::import::mixtral_jsonl::{MixtralJsonlOptions, import_mixtral_jsonl};
use trace_io::import::numpy::{Layout, NumpyOptions, import_numpy};
use trace_io::import::routed_experts::{RoutedExpertsOptions, import_routed_experts};
use trace_io::import::sglang_dump::{SglangDumpOptions, import_sglang_dump};
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog, parse_row_range};
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
    /// engine-step offsets; the engine's dummy (warm-up) rows are detected wherever they are and
    /// dropped, and a second engine run in the log becomes a second sequence.
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
        /// Keep the dummy (warm-up) rows instead of dropping them (they are still reported).
        #[arg(long)]
        keep_warmup: bool,
        /// Drop route rows A..B (0-based route rows of each file, meta lines not counted, B
        /// excluded) whatever the heuristics say; repeat or comma-separate for several ranges.
        #[arg(long, value_name = "A..B", value_delimiter = ',', value_parser = parse_row_range)]
        skip_rows: Vec<std::ops::Range<usize>>,
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
    /// Integer routing arrays in a .npy or .npz file, [layers, tokens, k] or [tokens, layers, k]
    /// (ids only: no scores); metadata from the npz's `meta` JSON string or the flags.
    #[command(
        after_help = "Example:\n  moe-offload import numpy ../shared/data/real/qwen3-30b-a3b-llamacpp/general.npz --chunk 512 --phase prefill -o general.safetensors"
    )]
    Numpy {
        /// The .npy or .npz file.
        input: PathBuf,
        /// The array of expert ids in an .npz (default: the only 3-D integer array, else
        /// `experts` or `topk_ids`).
        #[arg(long)]
        array: Option<String>,
        /// Axis order: ltk = [layers, tokens, k], tlk = [tokens, layers, k] (default: the meta's
        /// `layout`, else the axis matching the layer count).
        #[arg(long)]
        layout: Option<Layout>,
        /// Routed experts per layer (default: the meta's `num_experts`).
        #[arg(long)]
        num_experts: Option<u32>,
        /// The model's layer ids, comma-separated (default: the meta's `layer_ids`, else 0..L).
        #[arg(long, value_delimiter = ',')]
        layers: Vec<u32>,
        /// Sequences of N tokens (the last may be shorter), for a file without an offsets array.
        #[arg(long, value_name = "N")]
        chunk: Option<usize>,
        /// Phase of the tokens: prefill, decode, mixed, unknown (default: the meta's `phase`).
        #[arg(long)]
        phase: Option<trace_io::Phase>,
        /// Model name for the metadata (default: the meta's `model`).
        #[arg(long)]
        model: Option<String>,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// A llama.cpp fork's routing dump as CSV, rows `pos,layer,id0,...` (header optional;
    /// negative positions are prompt tokens): ids only; sequences where a prompt restarts.
    #[command(
        after_help = "Example:\n  moe-offload import llama-csv routing.csv --num-experts 128 -o routing.safetensors"
    )]
    LlamaCsv(LlamaDumpArgs),
    /// A llama.cpp fork's binary routing dump: records `int32 layer, n_tokens, k` then the ids, one
    /// per MoE layer per ubatch: ids only; ubatches as engine steps.
    #[command(
        after_help = "Example:\n  moe-offload import llama-bin routing.bin --num-experts 128 -o routing.safetensors"
    )]
    LlamaBin(LlamaDumpArgs),
    /// SGLang's per_token expert-distribution dump (a torch .pt file, one record per forward pass):
    /// ids only; physical slots mapped to logical experts; passes as engine steps.
    #[command(
        after_help = "Example:\n  moe-offload import sglang-dump /tmp/expert_distribution_recorder_1733600000.0_0.pt -o sglang.safetensors\nRecord with: python -m sglang.launch_server ... --expert-distribution-recorder-mode per_token, then POST /start_expert_distribution_record, send the requests, POST /dump_expert_distribution_record (docs/capture.md)."
    )]
    SglangDump {
        /// The dump (`expert_distribution_recorder_<time>_<rank>.pt`), one rank's.
        input: PathBuf,
        /// Logical routed experts per layer (default: from the dump's physical-to-logical map).
        #[arg(long)]
        num_experts: Option<u32>,
        /// Model name for the metadata.
        #[arg(long)]
        model: Option<String>,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
        /// Print JSON (kind `moe-offload-import`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The routed experts SGLang or vLLM return with responses (`return_routed_experts`): a JSON
    /// list of responses, or JSON Lines; one sequence per response (choice); ids only.
    #[command(
        after_help = "Examples:\n  moe-offload import routed-experts responses.jsonl --num-experts 128 -o routed.safetensors\n  moe-offload import routed-experts sglang.json --num-experts 128 --top-k 8 -o routed.safetensors\nSGLang's raw payload has no shape: give --top-k or --num-layers (docs/capture.md)."
    )]
    RoutedExperts {
        /// The responses: a JSON list (or one response), or JSON Lines.
        input: PathBuf,
        /// Routed experts per layer (no response records it).
        #[arg(long)]
        num_experts: u32,
        /// Layers of the arrays (the model's num_hidden_layers), for SGLang's raw payloads.
        #[arg(long)]
        num_layers: Option<usize>,
        /// k of the arrays (num_experts_per_tok), for SGLang's raw payloads.
        #[arg(long)]
        top_k: Option<usize>,
        /// Model name for the metadata (default: the responses' `model`).
        #[arg(long)]
        model: Option<String>,
        /// Output trace.
        #[arg(short, long)]
        output: PathBuf,
        /// Print JSON (kind `moe-offload-import`) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Per-expert count files (JSON, CSV, .npy) or llama.cpp's expert_stats.json: statistics for
    /// `keep --metric frequency` and `retention` (docs/importers.md lists the layouts).
    #[command(
        after_help = "Examples:\n  moe-offload import counts counts.json --top-k 6 -o stats.json\n  moe-offload import counts counts.npy --top-k 6 --layer-ids 1,2,3,4 -o stats.json\n  moe-offload import counts expert_stats.json -o stats.json\nFrom torch .pt or pickle files: python/convert_counts.py."
    )]
    Counts {
        /// The count file: `.json`, `.csv`/`.tsv`, `.npy` (else detected from the content).
        input: PathBuf,
        /// The model's experts per token; needed unless the file records `top_k` (the tokens of a
        /// layer are its counts' sum / k).
        #[arg(long)]
        top_k: Option<u32>,
        /// The model's layer ids, comma-separated, for a file whose layers are indices 0..L.
        #[arg(long, value_delimiter = ',')]
        layer_ids: Vec<u32>,
        /// The model's routed experts per layer, when the file shows fewer (a CSV whose last
        /// experts never appear) or, for expert_stats.json, more (the profiler's --n-experts).
        #[arg(long)]
        num_experts: Option<u32>,
        /// Output statistics JSON.
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// Runs `import counts`.
fn counts(input: &Path, opts: &CountsOptions, output: &Path) -> Result<()> {
    super::refuse_stdout(output, "statistics are written to a file: give -o stats.json")?;
    super::refuse_directory(output)?;
    super::refuse_overwrite(output, [input])?;
    let stats = Stats::from_counts_file(input, opts)?;
    stats.write_json(output)?;
    writeln!(
        std::io::stdout().lock(),
        "wrote {}: {} x {} experts, top-{}, statistics: {} (from {})",
        output.display(),
        super::layers(stats.layers.len()),
        stats.meta.num_experts,
        stats.meta.top_k,
        stats.present_statistics().join(", "),
        stats.meta.source
    )?;
    // Every token of a run passes every MoE layer: counts of one run give one token count.
    let tokens: std::collections::BTreeSet<u64> = stats.layers.iter().map(|l| l.tokens).collect();
    if tokens.len() > 1 {
        let per_layer: Vec<String> = stats
            .meta
            .layer_ids
            .iter()
            .zip(&stats.layers)
            .take(8)
            .map(|(id, l)| format!("layer {id}: {}", l.tokens))
            .collect();
        crate::progress::status!(
            "warning: the layers hold different token counts (counts / top-{}: {}{}); every token passes every MoE \
             layer, so counts of one run give one count: check that the file is of one run and of top-{} routing",
            stats.meta.top_k,
            per_layer.join(", "),
            if stats.layers.len() > 8 { ", ..." } else { "" },
            stats.meta.top_k
        );
    }
    Ok(())
}

/// The arguments of both llama.cpp-fork dump formats (`import llama-csv`, `import llama-bin`).
#[derive(Debug, Args)]
pub struct LlamaDumpArgs {
    /// The dump file.
    input: PathBuf,
    /// Routed experts per layer (the dump does not record it).
    #[arg(long)]
    num_experts: u32,
    /// Model name for the metadata.
    #[arg(long)]
    model: Option<String>,
    /// Output trace.
    #[arg(short, long)]
    output: PathBuf,
}

impl LlamaDumpArgs {
    /// The dump imported by `import` (one of trace-io's llama.cpp-fork dump importers), with the output it goes to (refused first when it would
    /// overwrite the input or is no trace file).
    fn import(
        self,
        import: impl FnOnce(&Path, &LlamaDumpOptions) -> trace_io::Result<Imported>,
    ) -> Result<(Imported, PathBuf)> {
        super::refuse_trace_output(&self.output)?;
        super::refuse_overwrite(&self.output, [self.input.as_path()])?;
        let LlamaDumpArgs { input, num_experts, model, output } = self;
        Ok((import(&input, &LlamaDumpOptions { num_experts, model })?, output))
    }
}

/// Runs `import`.
pub fn run(cmd: ImportCmd) -> Result<()> {
    announce(&cmd);
    let reading = crate::progress::working("import: reading the routing logs");
    let mut json = false;
    let (imported, output) = match cmd {
        ImportCmd::Counts { input, top_k, layer_ids, num_experts, output } => {
            let opts = CountsOptions { top_k, layer_ids: (!layer_ids.is_empty()).then_some(layer_ids), num_experts };
            return counts(&input, &opts, &output);
        }
        ImportCmd::Esft { dir, domains, num_experts, top_k, output } => {
            super::refuse_trace_output(&output)?;
            super::no_repeats("domains", &domains)?;
            let opts = EsftOptions { domains, num_experts, top_k, ..Default::default() };
            (import_esft_with_report(&dir, &opts)?, output)
        }
        ImportCmd::VllmRoutelog { inputs, num_experts, keep_warmup, skip_rows, model, output } => {
            super::refuse_trace_output(&output)?;
            super::refuse_overwrite(&output, inputs.iter().map(PathBuf::as_path))?;
            let opts = VllmRoutelogOptions { num_experts, keep_warmup, model, skip_rows };
            (import_vllm_routelog(&inputs, &opts)?, output)
        }
        ImportCmd::MixtralJsonl { input, num_experts, model, output } => {
            super::refuse_trace_output(&output)?;
            super::refuse_overwrite(&output, [input.as_path()])?;
            let mut opts = MixtralJsonlOptions { num_experts, ..Default::default() };
            if let Some(m) = model {
                opts.model = m;
            }
            (import_mixtral_jsonl(&input, &opts)?, output)
        }
        ImportCmd::LlamaCsv(a) => a.import(|p, o| import_llama_csv(p, o))?,
        ImportCmd::LlamaBin(a) => a.import(|p, o| import_llama_bin(p, o))?,
        ImportCmd::SglangDump { input, num_experts, model, output, json: j } => {
            super::refuse_trace_output(&output)?;
            super::refuse_overwrite(&output, [input.as_path()])?;
            json = j;
            (import_sglang_dump(&input, &SglangDumpOptions { num_experts, model })?, output)
        }
        ImportCmd::RoutedExperts { input, num_experts, num_layers, top_k, model, output, json: j } => {
            super::refuse_trace_output(&output)?;
            super::refuse_overwrite(&output, [input.as_path()])?;
            json = j;
            let opts = RoutedExpertsOptions { num_experts: Some(num_experts), num_layers, top_k, model };
            (import_routed_experts(&input, &opts)?, output)
        }
        ImportCmd::Numpy { input, array, layout, num_experts, layers, chunk, phase, model, output } => {
            super::refuse_trace_output(&output)?;
            super::refuse_overwrite(&output, [input.as_path()])?;
            let layer_ids = (!layers.is_empty()).then_some(layers);
            let opts = NumpyOptions { array, layout, num_experts, layer_ids, chunk, phase, model };
            (import_numpy(&input, &opts)?, output)
        }
    };
    reading.finish();
    let Imported { trace, report } = imported;
    write_trace(&output, &trace.view())?;
    let s = trace.view().shape();
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", serde_json::to_string_pretty(&api::import::document(&output, &trace.view(), &report))?)?;
        return Ok(());
    }
    writeln!(out, "{report}")?;
    writeln!(
        out,
        "wrote {}: {} x {} tokens, {} experts, top-{}",
        output.display(),
        super::layers(s.layers),
        s.tokens,
        s.num_experts,
        s.top_k
    )?;
    Ok(())
}

/// Says what the import reads (files and their size) before it starts.
fn announce(cmd: &ImportCmd) {
    let size = |paths: &[PathBuf]| paths.iter().filter_map(|p| std::fs::metadata(p).ok()).map(|m| m.len()).sum::<u64>();
    match cmd {
        ImportCmd::Counts { input, .. } => crate::progress::status!(
            "import counts: {}, {:.1} MB",
            input.display(),
            size(std::slice::from_ref(input)) as f64 / 1e6
        ),
        ImportCmd::Esft { dir, domains, .. } => {
            crate::progress::status!("import esft: domains {} of {}", domains.join(", "), dir.display());
        }
        ImportCmd::VllmRoutelog { inputs, .. } => crate::progress::status!(
            "import vllm-routelog: {} files, {:.1} MB",
            inputs.len(),
            size(inputs) as f64 / 1e6
        ),
        ImportCmd::Numpy { input, .. } => crate::progress::status!(
            "import numpy: {}, {:.1} MB",
            input.display(),
            size(std::slice::from_ref(input)) as f64 / 1e6
        ),
        ImportCmd::LlamaCsv(a) | ImportCmd::LlamaBin(a) => crate::progress::status!(
            "import {}: {}, {:.1} MB",
            if matches!(cmd, ImportCmd::LlamaCsv(_)) { "llama-csv" } else { "llama-bin" },
            a.input.display(),
            size(std::slice::from_ref(&a.input)) as f64 / 1e6
        ),
        ImportCmd::SglangDump { input, .. } | ImportCmd::RoutedExperts { input, .. } => crate::progress::status!(
            "import {}: {}, {:.1} MB",
            if matches!(cmd, ImportCmd::SglangDump { .. }) { "sglang-dump" } else { "routed-experts" },
            input.display(),
            size(std::slice::from_ref(input)) as f64 / 1e6
        ),
        ImportCmd::MixtralJsonl { input, .. } => crate::progress::status!(
            "import mixtral-jsonl: {}, {:.1} MB",
            input.display(),
            size(std::slice::from_ref(input)) as f64 / 1e6
        ),
    }
}
