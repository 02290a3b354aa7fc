//! `moe-offload`: the command-line tool. The only crate of the workspace that prints.
//!
//! Subcommands: `import`, `synth`, `inspect`, `stats`, `keep`, `retention`, `replay`, `mrc`,
//! `plan`, `sweep` (and `sweep merge`), `report`, `export`, `completions`. Run `moe-offload --help` for the list
//! and `moe-offload <command> --help` for each, with examples.

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
            eprintln!("error: {}", render(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error chain joined with `: `, skipping a cause whose text the message before it already
/// contains (the library errors print their source inside their own message).
fn render(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
    }
    out
}
