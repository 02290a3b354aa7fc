//! `moe-offload`: the command-line tool. The only crate of the workspace that prints.
//!
//! Subcommands: `import`, `synth`, `inspect`, `stats`, `keep`, `retention`, `replay`, `sweep`. Run
//! `moe-offload --help` for the list and `moe-offload <command> --help` for each, with examples.

#![expect(clippy::print_stdout, clippy::print_stderr, reason = "the CLI is the one crate that prints")]

mod commands;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = commands::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed pipe (`moe-offload ... | head`) is not an error.
            if err.chain().any(|e| {
                e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
            }) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
