//! Printing JSON documents. Every document starts with its `kind` tag, from the one table of
//! kinds in the command layer (`api::kind`), re-exported here for the commands.

use std::io::Write as _;

use anyhow::Result;
pub use api::kind::*;
use serde_json::Value;

/// Prints `value` as pretty JSON and a newline on standard output: the one document of `--json`.
///
/// # Errors
/// A failed write (a closed pipe ends the command quietly, `main`).
pub fn print(value: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(out.flush()?)
}
