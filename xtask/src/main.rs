//! `cargo xtask`: project automation for moe-offload.
//!
//! - `cargo xtask gen-data`: regenerates the embedded default traces in `data/`.
//! - `cargo xtask gen-bench-traces`: writes the seed-scale synthetic pair to `target/bench-traces/`.
//! - `cargo xtask fetch-real-data [--dir DIR]`: downloads the public real routing the docs use
//!   (pinned commits, SHA-256 checked) into a directory outside the repository.
//! - `cargo xtask audit`: the audit of SEMANTICS.md §8 on the embedded default (and on the real
//!   data when `MOE_OFFLOAD_REAL_DATA` is set), asserted against insta snapshots; `--dir DIR`
//!   audits a directory of outputs, replaying them from the inputs they name.

#![expect(clippy::print_stdout, reason = "xtask reports to the terminal")]

mod audit;
mod fetch_real_data;
mod gen_bench;
mod gen_data;
#[cfg(test)]
mod tidy;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Regenerate `data/default-calib.safetensors` and `data/default-heldout.safetensors`.
    GenData {
        /// Only check that the committed files equal a fresh generation.
        #[arg(long)]
        check: bool,
    },
    /// Write the seed-scale synthetic pair (48 x 512, top-10 of 64; 131,072 and 8,192 tokens).
    GenBenchTraces {
        /// Output directory (default: target/bench-traces).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Download the public real routing the docs use (pinned commits, SHA-256 verified) into a
    /// directory outside the repository, and print the commands that reproduce the docs' tables.
    FetchRealData {
        /// Output directory (default: ../moe-offload-real-data, beside the checkout).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Run the audit checks and compare the report with the committed snapshot; with `--dir`,
    /// audit a directory of moe-offload outputs instead.
    Audit {
        /// A directory of statistics, keep maps and sweep results written by moe-offload.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// With `--dir`: also write the report as JSON here (kind `moe-offload-audit`).
        #[arg(long, requires = "dir")]
        json: Option<PathBuf>,
        /// With `--dir`: look here first (by file name) for the traces and files the outputs name
        /// (default: beside the directory, and where they record them).
        #[arg(long, requires = "dir")]
        trace_dir: Option<PathBuf>,
        /// With `--dir`: replay N rows of each sweep, chosen with `--seed`, instead of all.
        #[arg(long, requires = "dir")]
        sample: Option<usize>,
        /// The seed of `--sample`.
        #[arg(long, requires = "sample", default_value_t = 0)]
        seed: u64,
        /// With `--dir`: do not replay (no traces needed); the report says nothing was replayed.
        #[arg(long, requires = "dir", conflicts_with_all = ["sample", "trace_dir"])]
        no_replay: bool,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::GenData { check } => gen_data::run(check),
        Cmd::FetchRealData { dir } => fetch_real_data::run(dir.as_deref()),
        Cmd::GenBenchTraces { out } => gen_bench::run(out.as_deref()),
        Cmd::Audit { dir: Some(dir), json, trace_dir, sample, seed, no_replay } => {
            anyhow::ensure!(sample != Some(0), "--sample 0 replays nothing: give at least 1, or --no-replay");
            let opts = audit::dir::Options { trace_dir, sample, seed, no_replay };
            let report = audit::dir::audit_dir(&dir, &opts)?;
            println!("{}", audit::markdown(&report));
            if let Some(path) = json {
                // Tagged like every JSON output of the tool (docs/sweep.md, the `kind` table).
                #[derive(serde::Serialize)]
                struct Tagged<'a> {
                    kind: &'static str,
                    #[serde(flatten)]
                    report: &'a audit::Report,
                }
                let tagged = Tagged { kind: "moe-offload-audit", report: &report };
                trace_io::write_atomic(&path, |w| {
                    serde_json::to_writer_pretty(w, &tagged).map_err(std::io::Error::other)
                })?;
            }
            if !audit::dir::passed(&report) {
                std::process::exit(1);
            }
            Ok(())
        }
        Cmd::Audit { dir: None, .. } => {
            let mut reports = vec![("default", audit::default_report()?)];
            if let Some(real) = real_data::dir_if_set() {
                reports.push(("esft", audit::esft_report(&real)?));
            } else {
                note(&format!(
                    "skipping the real-data audit: {} not set (it names ../shared/data/real)",
                    real_data::ENV
                ));
            }
            for (name, report) in &reports {
                println!("{}", audit::markdown(report));
                audit::assert_snapshot(name, report);
            }
            anyhow::ensure!(
                reports.iter().all(|(_, r)| audit::dir::passed(r)),
                "audit failed: see the FAIL lines above"
            );
            Ok(())
        }
    }
}

/// A note on stderr, beside the report on stdout.
#[expect(clippy::print_stderr, reason = "a note, not part of the report")]
fn note(line: &str) {
    eprintln!("{line}");
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}
