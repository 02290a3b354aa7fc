//! `moe-offload`: the command-line tool. The only crate of the workspace that prints.
//!
//! Subcommands: `import`, `capture`, `synth`, `inspect`, `stats`, `keep`, `retention`, `replay`, `mrc`,
//! `plan`, `profile`, `sweep` (and `sweep merge`), `report`, `export`, `completions`. Run `moe-offload --help` for the list
//! and `moe-offload <command> --help` for each, with examples.
//!
//! Output goes through `writeln!` on locked stdout and stderr handles, never `println!` or
//! `eprintln!` (they panic on a closed pipe, `moe-offload ... | head`): a closed stdout ends the
//! command quietly with status 0, a closed stderr is ignored (`progress::status_line`). `--json`
//! prints one JSON document on stdout (status lines on stderr); every JSON document starts with
//! its `kind` tag (the one table `api::kind`).

mod args;
mod commands;
mod progress;

use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = args::parse();
    on_interrupt_remove_temporaries();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed pipe (`moe-offload ... | head`) is not an error.
            if err.chain().any(is_broken_pipe) {
                return ExitCode::SUCCESS;
            }
            progress::status!("error: {}", render(&err));
            ExitCode::FAILURE
        }
    }
}

/// Whether an error of the chain is a closed pipe: an I/O error, or JSON written into a closed
/// pipe (`serde_json::Error` does not give its I/O error as its `source`).
fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let pipe = std::io::ErrorKind::BrokenPipe;
    e.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == pipe)
        || e.downcast_ref::<serde_json::Error>().is_some_and(|j| j.io_error_kind() == Some(pipe))
}

/// On Ctrl-C (SIGINT), SIGTERM or SIGHUP: removes the temporary files and staging directories of
/// the outputs being written, says so, and exits with 128 + the signal number (Unix).
fn on_interrupt_remove_temporaries() {
    #[cfg(unix)]
    {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else { return };
        std::thread::spawn(move || {
            if let Some(sig) = signals.forever().next() {
                let n = trace_io::remove_temporaries();
                progress::status!("\ninterrupted: nothing written (temporary outputs removed: {n})");
                std::process::exit(128 + sig);
            }
        });
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
