//! Argument definitions and dispatch; one module per subcommand.

mod capture;
mod export;
mod import;
mod inspect;
mod json;
mod keep;
mod mrc;
mod plan;
mod profile;
mod replay;
mod report;
mod retention;
mod stats;
mod sweep;
mod synth;

use std::io::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use clap::{CommandFactory, Parser, Subcommand};

/// The tool's version with the git commit it was built from (`build.rs`; "unknown" outside a
/// git checkout), e.g. `0.1.0 (commit 1a2b3c4d5e6f)`. Shown by `--version` and recorded in the
/// provenance of every output that has one.
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("MOE_OFFLOAD_GIT_COMMIT"), ")");

/// [`VERSION`] as an owned string, for provenance fields.
fn version() -> String {
    VERSION.to_string()
}

/// Whether an output path means standard output (`-o -`).
fn is_stdout(output: &Path) -> bool {
    output.as_os_str() == "-"
}

/// Writes `bytes` to `output`: to standard output for `-`, else atomically (temporary file and
/// rename, so a failure leaves no partial file).
fn write_output(output: &Path, bytes: &[u8]) -> Result<()> {
    refuse_directory(output)?;
    if is_stdout(output) {
        let mut out = std::io::stdout().lock();
        out.write_all(bytes)?;
        return Ok(out.flush()?);
    }
    trace_io::write_atomic(output, |w| w.write_all(bytes)).with_context(|| format!("writing {}", output.display()))
}

/// Where a command's human-readable text goes: standard output, or standard error when the data
/// itself goes to standard output (`-o -`).
fn human(output: &Path) -> Box<dyn std::io::Write> {
    if is_stdout(output) { Box::new(std::io::stderr()) } else { Box::new(std::io::stdout()) }
}

/// Right-aligns every column of `t` whose cells are all numbers (`12`, `0.4375`, `-3.1`, `+0.02`,
/// `12.5%`, or empty), so that digits line up as in any numeric table.
fn align_numbers(t: &mut comfy_table::Table) {
    let numeric = |c: &str| {
        let c = c.trim().trim_end_matches('%');
        c.is_empty() || c == "-" || c.trim_start_matches('+').parse::<f64>().is_ok()
    };
    let columns = t.column_count();
    for i in 0..columns {
        let all = t.row_iter().all(|r| r.cell_iter().nth(i).is_none_or(|c| numeric(&c.content())));
        if let Some(col) = t.column_mut(i).filter(|_| all) {
            col.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
}

/// An output path as status lines name it: `stdout` for `-`.
fn shown(output: &Path) -> String {
    if is_stdout(output) { "stdout".into() } else { output.display().to_string() }
}

/// A status line: to standard error, so that standard output carries only data (`-o -`, `--json`).
fn status(line: std::fmt::Arguments<'_>) {
    // Not `eprintln!`: it panics when standard error is closed.
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `n` layers in words: "1 layer", "26 layers".
fn layers(n: usize) -> String {
    if n == 1 { "1 layer".into() } else { format!("{n} layers") }
}

/// Refuses a comma-separated flag that names a value twice (it would do the same work twice).
fn no_repeats<T: PartialEq + std::fmt::Display>(flag: &str, values: &[T]) -> Result<()> {
    if let Some((i, v)) = values.iter().enumerate().find(|(i, v)| values[..*i].contains(v)) {
        bail!("--{flag}: {v} is given twice (value {} of {})", i + 1, values.len());
    }
    Ok(())
}

/// Refuses `-o -` (standard output) for a command whose output cannot go there: a trace (every
/// command memory-maps it), or several files; `instead` says what to do.
fn refuse_stdout(output: &Path, instead: &str) -> Result<()> {
    if is_stdout(output) {
        bail!("-o -: this command's output cannot go to standard output ({instead})");
    }
    Ok(())
}

/// Refuses an output path that is one of the command's inputs: the atomic write would replace
/// the input with the output (a trace with its statistics, say).
fn refuse_overwrite<'a>(output: &Path, inputs: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    let Ok(out) = output.canonicalize() else { return Ok(()) };
    for input in inputs {
        if input.canonicalize().is_ok_and(|i| i == out) {
            bail!(
                "-o {} is an input of this command; writing it would replace that input: choose another output",
                output.display()
            );
        }
    }
    Ok(())
}

/// Refuses an `-o` a trace cannot be written to, before the work: standard output (every
/// command memory-maps a trace) or an existing directory. `import` and `synth` call it.
fn refuse_trace_output(output: &Path) -> Result<()> {
    refuse_stdout(output, "a trace is memory-mapped by every command that reads it: give -o t.safetensors")?;
    refuse_directory(output)
}

/// Refuses an `-o` that names an existing directory for a command that writes one file (a rename
/// onto a directory fails only after the work, with the system's "Is a directory").
fn refuse_directory(output: &Path) -> Result<()> {
    if !is_stdout(output) && output.is_dir() {
        bail!(
            "-o {} is a directory; this command writes one file: give a file name (for example {})",
            output.display(),
            output.join("NAME").display()
        );
    }
    Ok(())
}

/// Warns on standard error when the in-sample and the out-of-sample trace are the same bytes
/// (`digests`: their digests when the caller has them; else files of equal size are hashed): the
/// out-of-sample figures are then in-sample ones and every shift is 0.
fn warn_same_trace(ins: &Path, oos: &Path, digests: Option<(&str, &str)>) {
    let same = match digests {
        Some((a, b)) => a == b,
        None => {
            let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
            size(ins).is_some_and(|s| Some(s) == size(oos))
                && matches!(
                    (trace_io::trace_digest(ins), trace_io::trace_digest(oos)),
                    (Ok(a), Ok(b)) if a == b
                )
        }
    };
    if same {
        crate::progress::status!(
            "warning: the in-sample trace {} and the out-of-sample trace {} hold the same bytes: every \
             out-of-sample figure is an in-sample one (shift 0); hold out a trace the choices are not made on",
            ins.display(),
            oos.display()
        );
    }
}

/// Refuses a trace without tokens: every figure of it would be 0/0.
fn require_tokens(shape: trace_io::Shape, path: &Path) -> Result<()> {
    if shape.tokens == 0 {
        bail!(
            "{} has no tokens ({} x 0 tokens): no figure can be computed from it; import or record a trace with tokens",
            path.display(),
            layers(shape.layers)
        );
    }
    Ok(())
}

/// Plan expert pruning and caching for offloaded Mixture-of-Experts inference from routing traces.
#[derive(Debug, Parser)]
#[command(name = "moe-offload", version = VERSION, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Convert recorded routing into a moe-offload trace (or per-expert counts into statistics).
    #[command(
        subcommand,
        after_help = "Examples:\n  moe-offload import esft ../shared/data/real/esft-dsv2lite --domains translation -o translation.safetensors\n  moe-offload import vllm-routelog ../shared/data/real/vllm-routelog-qwen15moe/moe_layer*.jsonl --num-experts 60 -o qwen.safetensors\n  moe-offload import mixtral-jsonl ../shared/data/real/mixtral-decode/gsm8k_2_routing.jsonl -o mixtral.safetensors\n  moe-offload import llama-csv routing.csv --num-experts 128 -o routing.safetensors\n  moe-offload import llama-bin routing.bin --num-experts 128 -o routing.safetensors\n  moe-offload import counts counts.json --top-k 6 -o stats.json\nFrom a Hugging Face model: python/capture_routing.py (docs/capture.md)."
    )]
    Import(import::ImportCmd),
    /// Record routing from a GGUF model run by llama.cpp itself (needs a build with the capture feature).
    #[command(
        after_help = "Examples:\n  moe-offload capture model.gguf --text corpus.txt --ctx 512 -o trace.safetensors\n  moe-offload capture model.gguf --tokens ids.txt --generate 64 --candidates 16 -o decode.safetensors\nBuild: cargo build --release -p cli --features capture (CUDA: capture-cuda; Metal: capture-metal); docs/capture.md."
    )]
    Capture(capture::CaptureArgs),
    /// Generate a synthetic trace (for fixtures and benchmarks).
    #[command(
        after_help = "Examples:\n  moe-offload synth --layers 4 --experts 32 --top-k 4 --candidates 8 --tokens 4096 --seed 1 -o calib.safetensors\n  moe-offload synth --preset qwen15-moe --layers 5 --experts 60 --top-k 4 --candidates 4 --tokens 4357 --sequences 25 -o qwen-like.safetensors"
    )]
    Synth(synth::SynthArgs),
    /// Print a trace's shape, metadata and per-layer expert usage.
    #[command(after_help = "Example:\n  moe-offload inspect translation.safetensors")]
    Inspect(inspect::InspectArgs),
    /// Compute per-(layer, expert) saliency statistics of a trace or a REAP aggregate file (SEMANTICS.md §2).
    #[command(
        after_help = "Examples:\n  moe-offload stats calib.safetensors -o stats.json\n  moe-offload stats --reap-agg core_agg.json --list-corpora\n  moe-offload stats --reap-agg core_agg.json --corpus bible -o bible.json"
    )]
    Stats(stats::StatsArgs),
    /// Build keep maps (K experts per layer, or a global budget) from statistics (SEMANTICS.md §3).
    #[command(
        after_help = "Examples:\n  moe-offload keep stats.json --metric frequency --k 32 -o keep.json\n  moe-offload keep stats.json --metric hybrid --hybrid-base l2_sum,reap --k 128,160 -o maps/\n  moe-offload keep stats.json --metric frequency --budget 1248,1536 --floor 6 -o maps/"
    )]
    Keep(keep::KeepArgs),
    /// Out-of-sample retention of keep maps on a held-out trace or statistics (SEMANTICS.md §4).
    #[command(
        after_help = "Examples:\n  moe-offload retention maps/*.json full --heldout heldout.safetensors\n  moe-offload retention maps/reap@128.json --heldout quran-stats.json --json"
    )]
    Retention(retention::RetentionArgs),
    /// Replay a trace through an expert cache and count hits and misses (SEMANTICS.md §5).
    #[command(
        after_help = "Example:\n  moe-offload replay heldout.safetensors --policy lru --cap 16 --keep keep.json --json"
    )]
    Replay(replay::ReplayArgs),
    /// Run a whole grid of configurations on an in-sample and an out-of-sample trace.
    #[command(
        after_help = "Examples:\n  moe-offload sweep                       # the embedded default grid\n  moe-offload sweep data/grids/default.json -o out/\n  moe-offload sweep data/grids/esft-translation.json --in-sample calib.safetensors --out-of-sample translation.safetensors -o esft-sweep/"
    )]
    Sweep(sweep::SweepArgs),
    /// Write one self-contained HTML page of plots and tables from a sweep directory.
    #[command(
        after_help = "Examples:\n  moe-offload sweep -o out/ && moe-offload report out/ -o report.html\n  moe-offload retention maps/*.json --heldout heldout.safetensors --json > out/retention.json && moe-offload report out/"
    )]
    Report(report::ReportArgs),
    /// Export for other tools: vLLM-Ascend expert lists, gguf_prune.py statistics, llama.cpp flags, keep sets.
    #[command(
        subcommand,
        after_help = "Examples:\n  moe-offload export vllm-ascend stats.json --metric reap -o experts.jsonl\n  moe-offload export gguf-prune stats.json -o expert_stats.json\n  moe-offload export llama-cpp plan.json -o llama-flags.txt\n  moe-offload export keep-set keep.json -o keep-set.json"
    )]
    Export(export::ExportCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout.
    #[command(
        after_help = "Examples:\n  moe-offload completions bash > ~/.local/share/bash-completion/completions/moe-offload\n  moe-offload completions zsh > ~/.zfunc/_moe-offload"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Misses of every cache size per layer: one pass over every cap where the policy has a one-pass curve (lru by default).
    #[command(
        after_help = "Examples:\n  moe-offload mrc translation.safetensors -o mrc.json            # lru, caps k_used..E\n  moe-offload mrc translation.safetensors --policy lfu --caps 8..32 --keep keep.json -o mrc-lfu.json"
    )]
    Mrc(mrc::MrcArgs),
    /// Per-layer cache sizes (and keep map) with the fewest misses for a memory budget.
    #[command(
        after_help = "Example:\n  moe-offload plan --in-sample calib.safetensors --out-of-sample translation.safetensors \\\n      --variants full,frequency@48 --budget-gb 8 --profile dsv2-lite-bf16 --max-slot-replacement 0.2 -o plan.json"
    )]
    Plan(plan::PlanArgs),
    /// Print a device profile's fields with their units (a preset or a profile file).
    #[command(
        subcommand,
        after_help = "Examples:\n  moe-offload profile show dsv2-lite-bf16\n  moe-offload profile show --file data/profiles/laptop-16gb-ddr5.json --json"
    )]
    Profile(profile::ProfileCmd),
}

/// Runs the parsed command.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Import(cmd) => import::run(cmd),
        Command::Capture(a) => capture::run(&a),
        Command::Synth(a) => synth::run(&a),
        Command::Inspect(a) => inspect::run(&a),
        Command::Stats(a) => stats::stats(&a),
        Command::Keep(a) => keep::keep(&a),
        Command::Retention(a) => retention::retention_cmd(&a),
        Command::Replay(a) => replay::run(&a),
        Command::Sweep(a) => sweep::run(&a),
        Command::Mrc(a) => mrc::mrc(&a),
        Command::Plan(a) => plan::plan(&a),
        Command::Profile(c) => profile::run(&c),
        Command::Report(a) => report::run(&a),
        Command::Export(c) => export::run(&c),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics on a write error, and a closed pipe
            // (`moe-offload completions bash | head`) is not an error (main.rs).
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "moe-offload", &mut script);
            std::io::Write::write_all(&mut std::io::stdout().lock(), &script)?;
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn number_columns_are_right_aligned() {
        let mut t = comfy_table::Table::new();
        t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
        t.set_header(["name", "misses"]);
        t.add_row(["lru", "12.5"]);
        t.add_row(["belady", "3"]);
        super::align_numbers(&mut t);
        let text = t.to_string();
        // the name column stays left-aligned, the number column is right-aligned
        assert!(text.contains("| lru    |   12.5 |"), "{text}");
        assert!(text.contains("| belady |      3 |"), "{text}");
    }

    #[test]
    fn layer_counts_in_words() {
        assert_eq!(super::layers(1), "1 layer");
        assert_eq!(super::layers(0), "0 layers");
        assert_eq!(super::layers(26), "26 layers");
    }
}
