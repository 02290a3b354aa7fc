//! `cargo xtask`: project automation for moe-offload.
//!
//! - `cargo xtask gen-data`: regenerates the embedded default traces in `data/`.
//! - `cargo xtask audit`: the audit of SEMANTICS.md §8 on the embedded default (and on the real
//!   data when `MOE_OFFLOAD_REAL_DATA` is set), asserted against insta snapshots.

#![expect(clippy::print_stdout, reason = "xtask reports to the terminal")]

mod audit;
mod gen_data;

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
    /// Run the audit checks and compare the report with the committed snapshot.
    Audit,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Cmd::GenData { check } => gen_data::run(check),
        Cmd::Audit => {
            let report = audit::default_report()?;
            println!("{}", audit::markdown(&report));
            audit::assert_snapshot("default", &report);
            anyhow::ensure!(report_passed(&report), "audit failed: see the FAIL lines above");
            Ok(())
        }
    }
}

fn report_passed(r: &audit::Report) -> bool {
    r.checks.iter().all(|c| c.status != audit::Status::Fail)
}

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask is inside the workspace").to_path_buf()
}
