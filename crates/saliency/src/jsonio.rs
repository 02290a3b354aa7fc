//! JSON file helpers shared by statistics and keep maps: typed read, atomic pretty write.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Result, SaliencyError};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Io { path: path.to_path_buf(), source }
}

pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(io_err(path))
}

/// Reads a JSON file of `expected` content (named in the error when the file is binary).
pub(crate) fn read<T: DeserializeOwned>(path: &Path, expected: &'static str) -> Result<T> {
    let bytes = read_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(|source| match binary_kind(&bytes) {
        Some(found) => SaliencyError::NotJson { path: path.to_path_buf(), found, expected },
        None => SaliencyError::Json { path: path.to_path_buf(), source },
    })
}

/// What a file that failed to parse as JSON looks like when it is binary: a safetensors file
/// (an 8-byte little-endian header length, then a JSON header opening with `{`), or any file
/// with a NUL byte near its start. `None` for text (the JSON error says more then).
fn binary_kind(bytes: &[u8]) -> Option<&'static str> {
    if let Some((len, rest)) = bytes.split_first_chunk::<8>() {
        let n = u64::from_le_bytes(*len);
        if n > 0 && n <= rest.len() as u64 && rest.first() == Some(&b'{') {
            return Some("a safetensors file (a trace?)");
        }
    }
    bytes.iter().take(4096).any(|&b| b == 0).then_some("a binary file")
}

/// Writes pretty JSON through [`trace_io::write_atomic`] (temporary file in the target's
/// directory, then rename): readers never see a partial file.
pub(crate) fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    trace_io::write_atomic(path, |w| {
        serde_json::to_writer_pretty(&mut *w, value).map_err(std::io::Error::other)?;
        w.write_all(b"\n")
    })
    .map_err(io_err(path))
}
