//! JSON file helpers shared by statistics and keep maps: typed read, atomic pretty write.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Result, SaliencyError};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Io { path: path.to_path_buf(), source }
}

pub(crate) fn json_err(path: &Path) -> impl FnOnce(serde_json::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Json { path: path.to_path_buf(), source }
}

pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(io_err(path))
}

pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = read_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(json_err(path))
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
