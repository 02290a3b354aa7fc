//! The atomic trace writer.

use std::path::Path;

use crate::atomic::{TempFile, write_atomic};
use crate::{Result, TraceError, TraceMeta, TraceView};

/// Writes `trace` to `path` as a moe-offload trace file (safetensors container).
///
/// Layout: the 8-byte little-endian header length, the JSON header padded with spaces to a multiple
/// of 8 bytes, then the tensors in the order `seq_offsets`, `step_offsets` (u64), `scores`,
/// `gates`, `out_norms` (f32), `ids`, `lookahead_ids` (u16): descending alignment, so every tensor is naturally
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
    if let Some(la) = parts.lookahead_ids {
        tensors.push((
            "lookahead_ids",
            "U16",
            vec![shape.layers, shape.tokens, la.width],
            bytemuck::cast_slice(la.ids),
        ));
    }

    let specs: Vec<(&str, &str, Vec<usize>, usize)> =
        tensors.iter().map(|(n, d, s, b)| (*n, *d, s.clone(), b.len())).collect();
    let header = header_bytes(trace.meta(), &specs)?;

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

/// The padded JSON header of a file holding `tensors` (name, dtype, shape, byte length) in that
/// order, contiguous from offset 0 of the data section.
fn header_bytes(meta: &TraceMeta, tensors: &[(&str, &str, Vec<usize>, usize)]) -> Result<Vec<u8>> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(meta.to_map()).map_err(io_err)?);
    let mut offset = 0usize;
    for (name, dtype, shape, len) in tensors {
        header.insert(
            (*name).into(),
            serde_json::json!({ "dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len] }),
        );
        offset += len;
    }
    let mut header = serde_json::to_vec(&header).map_err(io_err)?;
    while header.len() % 8 != 0 {
        header.push(b' ');
    }
    Ok(header)
}

fn io_err(e: serde_json::Error) -> TraceError {
    TraceError::Io(std::io::Error::other(e))
}

/// What a trace written layer by layer ([`write_trace_streamed`]) holds: everything but the
/// per-layer rows, which the producer supplies.
#[derive(Debug, Clone, Copy)]
pub struct StreamedTrace<'a> {
    /// The metadata; `layer_ids.len()` is L and `top_k` is k.
    pub meta: &'a TraceMeta,
    /// T: tokens per layer.
    pub tokens: usize,
    /// m: candidates per row.
    pub candidates: usize,
    /// Whether the `scores` tensor (`[L, T, m]`, f32) is written.
    pub scores: bool,
    /// Whether the `gates` tensor (`[L, T, k]`, f32) is written.
    pub gates: bool,
    /// Whether the `out_norms` tensor (`[L, T, k]`, f32) is written.
    pub out_norms: bool,
    /// `seq_offsets` (`[S]`), written as given.
    pub seq_offsets: Option<&'a [u64]>,
    /// `step_offsets` (`[N]`), written as given.
    pub step_offsets: Option<&'a [u64]>,
}

/// Rows of consecutive tokens of one layer, handed by a producer to [`write_trace_streamed`]:
/// n rows, `ids` and `scores` of n·m elements, `gates` and `out_norms` of n·k, row-major.
#[derive(Debug, Clone, Copy)]
pub struct RowBlock<'a> {
    /// Candidate ids, `[n, m]`.
    pub ids: &'a [u16],
    /// Scores, `[n, m]`; present exactly when [`StreamedTrace::scores`] is set.
    pub scores: Option<&'a [f32]>,
    /// Gates, `[n, k]`; present exactly when [`StreamedTrace::gates`] is set.
    pub gates: Option<&'a [f32]>,
    /// Output norms, `[n, k]`; present exactly when [`StreamedTrace::out_norms`] is set.
    pub out_norms: Option<&'a [f32]>,
}

/// Writes a trace layer by layer without ever holding it in memory: the file that
/// [`write_trace`] would write for the same contents, byte for byte.
///
/// The file is layer-major, so each layer's part of each tensor sits at a known offset. `layer` is
/// called once per layer index `l` (from up to `threads` threads at once; 0 = the machine's
/// available parallelism) with a sink; it must pass the layer's T rows, in token order, as one or
/// more [`RowBlock`]s. Each block is written at its offsets with positioned writes into a
/// temporary file in `path`'s directory, renamed over `path` once every layer is complete: no
/// partial file is left behind on error, and the bytes do not depend on `threads`. Peak memory is
/// what the producers hold (one block per thread) plus the header.
///
/// The rows are not validated here; open the file with [`crate::TraceFile::open`] for that.
///
/// # Errors
/// [`TraceError::File`] naming `path` around: the first error a producer returns;
/// [`TraceError::Config`] when a block's lengths disagree with m, k or the tensors present, or a
/// layer does not supply exactly T rows; the I/O error of creating, writing or renaming.
pub fn write_trace_streamed<F>(
    path: impl AsRef<Path>,
    trace: &StreamedTrace<'_>,
    threads: usize,
    layer: F,
) -> Result<()>
where
    F: Fn(usize, &mut dyn FnMut(RowBlock<'_>) -> Result<()>) -> Result<()> + Sync,
{
    let path = path.as_ref();
    streamed_inner(path, trace, threads, &layer).map_err(|e| e.in_file(path))
}

/// A layer producer: `(layer index, sink of row blocks)`.
type LayerFn<'f> = dyn Fn(usize, &mut dyn FnMut(RowBlock<'_>) -> Result<()>) -> Result<()> + Sync + 'f;

/// Byte offsets (from the start of the file) of each layer-major tensor, or `None` when absent.
struct Bases {
    scores: Option<u64>,
    gates: Option<u64>,
    out_norms: Option<u64>,
    ids: u64,
}

fn streamed_inner(path: &Path, t: &StreamedTrace<'_>, threads: usize, layer: &LayerFn<'_>) -> Result<()> {
    let cfg = |reason: String| TraceError::Config { key: "rows", reason };
    let (l_n, tokens, m) = (t.meta.layer_ids.len(), t.tokens, t.candidates);
    let k = t.meta.top_k as usize;
    let overflow = || cfg(format!("[{l_n}, {tokens}, {m}] elements overflow"));
    let lt_m = l_n.checked_mul(tokens).and_then(|x| x.checked_mul(m)).ok_or_else(overflow)?;
    let lt_k = l_n.checked_mul(tokens).and_then(|x| x.checked_mul(k)).ok_or_else(overflow)?;
    let mut specs: Vec<(&str, &str, Vec<usize>, usize)> = Vec::new();
    if let Some(s) = t.seq_offsets {
        specs.push(("seq_offsets", "U64", vec![s.len()], s.len() * 8));
    }
    if let Some(s) = t.step_offsets {
        specs.push(("step_offsets", "U64", vec![s.len()], s.len() * 8));
    }
    let (shape_m, shape_k) = (vec![l_n, tokens, m], vec![l_n, tokens, k]);
    let f32_bytes = |n: usize| n.checked_mul(4).ok_or_else(overflow);
    for (name, on, shape, n) in [
        ("scores", t.scores, &shape_m, lt_m),
        ("gates", t.gates, &shape_k, lt_k),
        ("out_norms", t.out_norms, &shape_k, lt_k),
    ] {
        if on {
            specs.push((name, "F32", shape.clone(), f32_bytes(n)?));
        }
    }
    specs.push(("ids", "U16", shape_m.clone(), lt_m.checked_mul(2).ok_or_else(overflow)?));
    let header = header_bytes(t.meta, &specs)?;
    let data_start = 8 + header.len() as u64;
    let mut offset = data_start;
    let mut base = |name: &str| {
        let mut found = None;
        let mut at = data_start;
        for (n, _, _, len) in &specs {
            if *n == name {
                found = Some(at);
            }
            at += *len as u64;
        }
        offset = at;
        found
    };
    let bases = Bases {
        scores: base("scores"),
        gates: base("gates"),
        out_norms: base("out_norms"),
        ids: base("ids").unwrap_or(data_start),
    };
    let total = offset;

    let tmp = TempFile::beside(path)?;
    let file = tmp.file();
    file.set_len(total)?;
    let mut head = Vec::with_capacity(8 + header.len() + 8 * (specs.len()));
    head.extend_from_slice(&(header.len() as u64).to_le_bytes());
    head.extend_from_slice(&header);
    for s in [t.seq_offsets, t.step_offsets].into_iter().flatten() {
        head.extend_from_slice(bytemuck::cast_slice(s));
    }
    write_at(file, &head, 0)?;

    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
    .clamp(1, l_n.max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failed = std::sync::atomic::AtomicBool::new(false);
    let errors: std::sync::Mutex<Vec<(usize, TraceError)>> = std::sync::Mutex::new(Vec::new());
    let work = || {
        use std::sync::atomic::Ordering::Relaxed;
        loop {
            let l = next.fetch_add(1, Relaxed);
            if l >= l_n || failed.load(Relaxed) {
                return;
            }
            if let Err(e) = write_layer(file, t, &bases, l, layer) {
                failed.store(true, Relaxed);
                errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((l, e));
                return;
            }
        }
    };
    if threads == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(work);
            }
        });
    }
    let mut errors = errors.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
    errors.sort_by_key(|(l, _)| *l);
    if let Some((_, e)) = errors.into_iter().next() {
        return Err(e);
    }
    tmp.persist(path)?;
    Ok(())
}

/// Runs the producer of layer `l` and writes its blocks at their offsets.
fn write_layer(
    file: &std::fs::File,
    t: &StreamedTrace<'_>,
    bases: &Bases,
    l: usize,
    layer: &LayerFn<'_>,
) -> Result<()> {
    let (tokens, m, k) = (t.tokens, t.candidates, t.meta.top_k as usize);
    let mut row = 0usize; // rows of this layer written so far
    let mut sink = |b: RowBlock<'_>| -> Result<()> {
        let bad = |reason: String| TraceError::Config { key: "rows", reason };
        if m == 0 || !b.ids.len().is_multiple_of(m) {
            return Err(bad(format!("layer {l}: a block of {} ids is not a whole number of rows of {m}", b.ids.len())));
        }
        let n = b.ids.len() / m;
        if row + n > tokens {
            return Err(bad(format!("layer {l}: more than {tokens} rows supplied")));
        }
        let at_m = (l * tokens + row) as u64 * m as u64;
        let at_k = (l * tokens + row) as u64 * k as u64;
        for (name, data, on, base, width, at) in [
            ("scores", b.scores, t.scores, bases.scores, m, at_m),
            ("gates", b.gates, t.gates, bases.gates, k, at_k),
            ("out_norms", b.out_norms, t.out_norms, bases.out_norms, k, at_k),
        ] {
            match (data, on, base) {
                (Some(d), true, Some(base)) if d.len() == n * width => {
                    write_at(file, bytemuck::cast_slice(d), base + at * 4)?;
                }
                (None, false, _) => {}
                (d, _, _) => {
                    return Err(bad(format!(
                        "layer {l}: `{name}` block of {:?} elements for {n} rows (expected {})",
                        d.map(<[f32]>::len),
                        if on { format!("{}", n * width) } else { "none".into() }
                    )));
                }
            }
        }
        write_at(file, bytemuck::cast_slice(b.ids), bases.ids + at_m * 2)?;
        row += n;
        Ok(())
    };
    layer(l, &mut sink)?;
    if row != tokens {
        return Err(TraceError::Config {
            key: "rows",
            reason: format!("layer {l}: {row} rows supplied, expected {tokens}"),
        });
    }
    Ok(())
}

/// Writes all of `bytes` at byte `offset` of `file` without moving a shared cursor.
#[cfg(unix)]
fn write_at(file: &std::fs::File, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

/// Writes all of `bytes` at byte `offset` of `file` (positioned writes, Windows).
#[cfg(windows)]
fn write_at(file: &std::fs::File, mut bytes: &[u8], mut offset: u64) -> std::io::Result<()> {
    use std::os::windows::fs::FileExt;
    while !bytes.is_empty() {
        let n = file.seek_write(bytes, offset)?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        bytes = &bytes[n..];
        offset += n as u64;
    }
    Ok(())
}
