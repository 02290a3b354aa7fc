//! JSON file helpers shared by statistics and keep maps: typed read, atomic pretty write.

use std::io::{BufWriter, Write};
use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Result, SaliencyError};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn json_err(path: &Path) -> impl FnOnce(serde_json::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Json {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(io_err(path))
}

pub(crate) fn read<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = read_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(json_err(path))
}

/// Writes pretty JSON to a temporary file in the target's directory, then renames it over `path`:
/// readers never see a partial file.
pub(crate) fn write_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(parent).map_err(io_err(path))?;
    {
        let mut w = BufWriter::new(tmp.as_file_mut());
        serde_json::to_writer_pretty(&mut w, value).map_err(json_err(path))?;
        w.write_all(b"\n").map_err(io_err(path))?;
        w.flush().map_err(io_err(path))?;
    }
    tmp.as_file().sync_all().map_err(io_err(path))?;
    tmp.persist(path).map_err(|e| SaliencyError::Io {
        path: path.to_path_buf(),
        source: e.error,
    })?;
    Ok(())
}
