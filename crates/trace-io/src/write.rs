//! The atomic trace writer.

use std::io::{BufWriter, Write};
use std::path::Path;

use crate::{Result, TraceError, TraceView};

/// Writes `trace` to `path` as a moe-offload trace file (safetensors container).
///
/// Layout: the 8-byte little-endian header length, the JSON header padded with spaces to a multiple
/// of 8 bytes, then the tensors in the order `seq_offsets`, `step_offsets` (u64), `scores`,
/// `gates`, `out_norms` (f32), `ids` (u16): descending alignment, so every tensor is naturally
/// aligned when the file is mapped. The bytes depend only on the trace, so equal traces give
/// byte-identical files.
///
/// The file is written to a temporary file in the same directory and renamed over `path` at the
/// end: no partial file is left behind on error, and readers that have the old file mapped keep a
/// consistent view.
///
/// # Errors
/// [`TraceError::File`] naming `path` around the I/O error.
pub fn write_trace(path: impl AsRef<Path>, trace: &TraceView<'_>) -> Result<()> {
    let path = path.as_ref();
    write_inner(path, trace).map_err(|e| e.in_file(path))
}

fn write_inner(path: &Path, trace: &TraceView<'_>) -> Result<()> {
    let shape = trace.shape();
    let parts = trace.parts();
    let lt_m = vec![shape.layers, shape.tokens, shape.candidates];
    let lt_k = vec![shape.layers, shape.tokens, shape.top_k];
    let mut tensors: Vec<(&str, &str, Vec<usize>, &[u8])> = Vec::new();
    if let Some(s) = parts.seq_offsets {
        tensors.push(("seq_offsets", "U64", vec![s.len()], bytemuck::cast_slice(s)));
    }
    if let Some(s) = parts.step_offsets {
        tensors.push(("step_offsets", "U64", vec![s.len()], bytemuck::cast_slice(s)));
    }
    if let Some(s) = parts.scores {
        tensors.push(("scores", "F32", lt_m.clone(), bytemuck::cast_slice(s)));
    }
    if let Some(s) = parts.gates {
        tensors.push(("gates", "F32", lt_k.clone(), bytemuck::cast_slice(s)));
    }
    if let Some(s) = parts.out_norms {
        tensors.push(("out_norms", "F32", lt_k, bytemuck::cast_slice(s)));
    }
    tensors.push(("ids", "U16", lt_m, bytemuck::cast_slice(parts.ids)));

    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(trace.meta().to_map()).map_err(io_err)?);
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in &tensors {
        header.insert(
            (*name).into(),
            serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + bytes.len()] }),
        );
        offset += bytes.len();
    }
    let mut header = serde_json::to_vec(&header).map_err(io_err)?;
    while header.len() % 8 != 0 {
        header.push(b' ');
    }

    write_atomic(path, |w| {
        w.write_all(&(header.len() as u64).to_le_bytes())?;
        w.write_all(&header)?;
        for (_, _, _, bytes) in &tensors {
            w.write_all(bytes)?;
        }
        Ok(())
    })?;
    Ok(())
}

/// Writes a file atomically: `fill` writes the contents into a buffered temporary file in the
/// same directory as `path`, which is then renamed over `path`. On any error the temporary file
/// is removed and `path` is untouched, so no partial output is ever left behind. The file gets
/// the usual permissions (0644 before the umask on Unix), not the temporary file's 0600.
///
/// # Errors
/// The I/O error of creating, writing, syncing or renaming (not wrapped with the path).
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let tmp = tempfile::NamedTempFile::new_in(dir)?;
    {
        let mut w = BufWriter::with_capacity(1 << 20, tmp.as_file());
        fill(&mut w)?;
        w.flush()?;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file().set_permissions(std::fs::Permissions::from_mode(0o644))?;
    }
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn io_err(e: serde_json::Error) -> TraceError {
    TraceError::Io(std::io::Error::other(e))
}
