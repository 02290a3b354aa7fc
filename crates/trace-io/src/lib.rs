//! trace-io: the moe-offload routing-trace format.
//!
//! A trace is one run of an MoE model over a token stream: for every traced MoE layer and every
//! token, the router's top-m candidate expert ids in descending score, and optionally the scores,
//! the gates applied to the k used experts and those experts' output norms (SEMANTICS.md §1).
//! It is stored as a [safetensors](https://github.com/huggingface/safetensors) container,
//! layer-major (`[L, T, m]`) so that one layer's stream is contiguous for the replay loop.
//! `docs/trace-format.md` specifies the file.
//!
//! Main types:
//! - [`TraceFile`]: a memory-mapped (or in-memory) trace: shapes and offsets checked when opened,
//!   the content validated for what a command reads ([`Reads`]) before it reads it, once.
//! - [`TraceView`]: validated zero-copy slices of a trace, handed to every consumer, with what of
//!   it was validated.
//! - [`TraceData`]: an owned trace, built by importers and generators, written by [`write_trace`].
//! - [`Lookahead`]: the optional `lookahead_ids` tensor (pre-gating ids recorded by the capture script).
//! - [`TraceMeta`]: the metadata (model, `num_experts`, `top_k`, `layer_ids`, score kind, phase).
//! - [`TraceError`]: the one error type, naming file, tensor, layer, token and value.
//!
//! Importers for real-world logs live in [`import`] (ESFT text files, vLLM route logs, Mixtral
//! JSON Lines); [`synth`] generates synthetic traces for fixtures and benchmarks; [`summary`]
//! computes the descriptive figures `moe-offload inspect` shows.

#[cfg(target_endian = "big")]
compile_error!("trace-io assumes a little-endian target (safetensors stores little-endian data)");

mod atomic;
mod check;
mod error;
mod extent;
mod file;
mod hash;
pub mod import;
mod lookahead;
mod meta;
mod repeated;
#[cfg(unix)]
mod sigbus;
pub mod summary;
pub mod synth;
mod view;
mod write;

pub use atomic::{
    OutputSet, TEMP_PREFIX, remove_stale_temporaries, remove_temporaries, write_atomic, write_atomic_files,
};
pub use check::Reads;
pub use error::{Result, TraceError, ValueProblem};
pub use file::{TraceFile, compression};
pub use hash::{Digest, HASH_ALGO, bytes_digest, hash_file, split_digest, trace_digest, verify_digest};
pub use lookahead::Lookahead;
pub use meta::{FORMAT_NAME, FORMAT_VERSION, Phase, ScoreKind, TraceMeta};
pub use repeated::repeated_top_key;
pub use view::{OwnedParts, Shape, TraceData, TraceParts, TraceView};
pub use write::write_trace;

/// Opens an input file (JSON, CSV, a text log) for reading if it is a regular file (after
/// following symbolic links). A FIFO, device, socket or directory is refused before it is opened:
/// reading a FIFO would block until a writer comes. Every reader of the tool's inputs goes through
/// this (or [`read_regular`]), as traces do.
///
/// # Errors
/// An [`std::io::Error`] of kind `InvalidInput` saying what the path is ("a FIFO (named pipe), not
/// a regular file: ...") for a file that is not regular; the error of opening it otherwise. The
/// caller adds the path.
pub fn open_regular_file(path: impl AsRef<std::path::Path>) -> std::io::Result<std::fs::File> {
    file::open_regular_io(path.as_ref(), "give a file on disk")
}

/// The bytes of an input file, read whole after [`open_regular_file`].
///
/// # Errors
/// As [`open_regular_file`], and the error of reading it.
pub fn read_regular(path: impl AsRef<std::path::Path>) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut f = open_regular_file(path)?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The UTF-8 byte-order mark (U+FEFF), which Windows editors and PowerShell's `Out-File` write at
/// the start of a text file.
pub const UTF8_BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// `bytes` without a leading UTF-8 byte-order mark ([`UTF8_BOM`]); unchanged otherwise. JSON
/// (RFC 8259 §8.1) and CSV readers may ignore it; the tool's text readers all do.
pub fn strip_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(&UTF8_BOM[..]).unwrap_or(bytes)
}

/// The bytes of a text input file (JSON, CSV, a grid), read whole as [`read_regular`] does, with
/// a leading UTF-8 byte-order mark removed ([`strip_bom`]).
///
/// # Errors
/// As [`read_regular`].
pub fn read_text(path: impl AsRef<std::path::Path>) -> std::io::Result<Vec<u8>> {
    let mut bytes = read_regular(path)?;
    if bytes.starts_with(&UTF8_BOM) {
        bytes.drain(..UTF8_BOM.len());
    }
    Ok(bytes)
}

/// The text of an input file (UTF-8), read whole by [`read_text`] (a leading byte-order mark
/// removed).
///
/// # Errors
/// As [`read_regular`], and `InvalidData` for text that is not UTF-8.
pub fn read_regular_to_string(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    String::from_utf8(read_text(path)?).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Hex SHA-256 of a byte string (used for provenance of inputs and statistics).
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex SHA-256 of a file's bytes, streamed. Only a regular file is read (a FIFO would block).
///
/// # Errors
/// [`TraceError::File`] around the I/O error.
pub fn sha256_file(path: impl AsRef<std::path::Path>) -> Result<String> {
    use sha2::Digest;
    let path = path.as_ref();
    let inner = || -> Result<String> {
        let mut f = file::open_regular(path)?;
        let mut h = sha2::Sha256::new();
        std::io::copy(&mut f, &mut h)?;
        Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
    };
    inner().map_err(|e| e.in_file(path))
}
