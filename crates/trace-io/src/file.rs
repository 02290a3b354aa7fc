//! Opening trace files: the one memory-mapping constructor, header parsing, typed slices.

use std::fs::File;
use std::ops::Range;
use std::path::{Path, PathBuf};

use safetensors::tensor::TensorInfo;
use safetensors::{Dtype, SafeTensorError, SafeTensors};

use crate::check::{Reads, check_content, check_offsets};
use crate::view::{Shape, TraceParts, TraceView};
use crate::{Result, TraceError, TraceMeta};

enum Backing {
    /// A mapped file; the guard (dropped first) turns a SIGBUS inside the mapping into a message.
    Mapped {
        #[cfg(unix)]
        _guard: Option<crate::sigbus::Guard>,
        map: memmap2::Mmap,
    },
    /// Heap copy in u64 words so every tensor keeps its natural alignment.
    Heap { words: Vec<u64>, len: usize },
}

impl Backing {
    fn bytes(&self) -> &[u8] {
        match self {
            Backing::Mapped { map, .. } => map,
            Backing::Heap { words, len } => &bytemuck::cast_slice::<u64, u8>(words)[..*len],
        }
    }
}

/// Byte ranges of each tensor inside the backing buffer.
#[derive(Debug, Clone, Default)]
struct Layout {
    ids: Range<usize>,
    scores: Option<Range<usize>>,
    gates: Option<Range<usize>>,
    out_norms: Option<Range<usize>>,
    seq_offsets: Option<Range<usize>>,
    step_offsets: Option<Range<usize>>,
    /// `lookahead_ids` and its width m'.
    lookahead_ids: Option<(Range<usize>, usize)>,
}

/// An opened trace file (or in-memory trace bytes), validated for what its users read.
///
/// Opening parses the safetensors header, checks every tensor's dtype, shape and alignment
/// against the metadata and the sequence and step offsets (SEMANTICS.md §1). [`TraceFile::open`]
/// then validates every value of every row; [`TraceFile::open_lazy`] leaves the content to
/// [`TraceFile::view_for`], which validates what a command reads before it reads it, each part
/// once per process however many callers ask. Views hand out zero-copy slices without further
/// checks and record what was validated ([`TraceView::reads`]).
pub struct TraceFile {
    backing: Backing,
    meta: TraceMeta,
    shape: Shape,
    layout: Layout,
    path: Option<PathBuf>,
    /// The content validated so far (clamped to the trace). The lock is held while validating,
    /// so two callers asking for the same part validate it once.
    checked: std::sync::Mutex<Reads>,
}

impl std::fmt::Debug for TraceFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceFile").field("path", &self.path).field("shape", &self.shape).finish_non_exhaustive()
    }
}

impl TraceFile {
    /// Memory-maps and validates the trace at `path`.
    ///
    /// Only a regular file is opened: a FIFO, a device, a socket or a directory is refused before
    /// opening (a FIFO would block forever). The file's size is checked against the byte ranges
    /// its header gives each tensor before it is mapped.
    ///
    /// The contract of the mapping: the file must not be truncated or rewritten in place while the
    /// returned value lives. moe-offload's own writers never do that (they write a temporary file
    /// and rename it over the target, which leaves an existing mapping intact). When another
    /// program truncates the file while it is mapped, the next read of a lost page ends the process
    /// with status 1 and a message naming the file ("changed or truncated while in use") instead of
    /// a silent SIGBUS (Unix).
    ///
    /// # Errors
    /// [`TraceError::File`] naming `path`, around an I/O error, a file that is not a regular file,
    /// a malformed container, a tensor whose bytes lie outside the file ([`TraceError::Extent`]),
    /// a tensor of the wrong dtype, shape or alignment, missing or invalid metadata, or a content
    /// violation.
    pub fn open(path: impl AsRef<Path>) -> Result<TraceFile> {
        let file = Self::open_lazy(path.as_ref())?;
        file.view_for(Reads::EVERYTHING)?;
        Ok(file)
    }

    /// Memory-maps the trace at `path` and checks its container, shapes and offsets, not its
    /// content: [`TraceFile::view_for`] validates what a command reads (SEMANTICS.md §1), and
    /// [`TraceFile::view`] gives a view of what was validated so far. The mapping's contract is
    /// [`TraceFile::open`]'s.
    ///
    /// # Errors
    /// As [`TraceFile::open`], except content violations.
    pub fn open_lazy(path: impl AsRef<Path>) -> Result<TraceFile> {
        let path = path.as_ref();
        let inner = || -> Result<TraceFile> {
            let file = open_regular(path)?;
            check_file_extent(&file)?;
            // SAFETY: the mapping is read-only and private to this value. Its soundness relies on
            // the file not being modified or truncated while mapped, which is the documented
            // contract of this constructor; moe-offload's writers replace files by rename only. A
            // truncation by another program faults (SIGBUS), which `sigbus` turns into a message
            // and `_exit(1)` before any byte of the lost pages is used.
            #[expect(unsafe_code, reason = "the single memory-mapping constructor of the project")]
            let map = unsafe { memmap2::Mmap::map(&file)? };
            #[cfg(unix)]
            let backing = Backing::Mapped { _guard: crate::sigbus::register(&map, path), map };
            #[cfg(not(unix))]
            let backing = Backing::Mapped { map };
            Self::from_backing(backing, Some(path.to_path_buf()))
        };
        inner().map_err(|e| e.in_file(path))
    }

    /// Copies `bytes` (a whole trace file, for example from `include_bytes!`) into an aligned heap
    /// buffer and validates it as [`TraceFile::open`] does.
    ///
    /// # Errors
    /// As [`TraceFile::open`], without the file wrapper.
    pub fn from_bytes(bytes: &[u8]) -> Result<TraceFile> {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        let file = Self::from_backing(Backing::Heap { words, len: bytes.len() }, None)?;
        file.view_for(Reads::EVERYTHING)?;
        Ok(file)
    }

    fn from_backing(backing: Backing, path: Option<PathBuf>) -> Result<TraceFile> {
        let (meta, shape, layout) = parse(backing.bytes())?;
        let file = TraceFile { backing, meta, shape, layout, path, checked: std::sync::Mutex::new(Reads::NOTHING) };
        let parts = file.parts();
        for (tensor, offs) in [("seq_offsets", parts.seq_offsets), ("step_offsets", parts.step_offsets)] {
            if let Some(offs) = offs {
                check_offsets(tensor, offs, shape.tokens)?;
            }
        }
        // The optional lookahead ids are small (m' per row) and checked whole, on open.
        if let Some(la) = parts.lookahead_ids {
            crate::lookahead::check(la, &file.meta.layer_ids, shape.tokens, shape.num_experts)?;
        }
        let checked = Reads::NOTHING.clamp(&shape, &parts);
        *file.checked.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = checked;
        Ok(file)
    }

    /// The path it was opened from, if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The metadata.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// The dimensions.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Size in bytes of the whole file.
    pub fn byte_len(&self) -> usize {
        self.backing.bytes().len()
    }

    /// The zero-copy view of what was validated so far: everything after [`TraceFile::open`] or
    /// [`TraceFile::from_bytes`]; after [`TraceFile::open_lazy`], what [`TraceFile::view_for`]
    /// validated (a consumer refuses a view that does not cover what it reads).
    pub fn view(&self) -> TraceView<'_> {
        let checked = *self.checked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        TraceView::new_prevalidated(&self.meta, self.shape, self.parts(), checked)
    }

    /// Validates the content `need` asks for that was not validated before (SEMANTICS.md §1:
    /// ids `< E` and distinct up to the rank read, scores finite and non-increasing, gates and
    /// norms finite and >= 0), in parallel on the rayon pool, and returns the view of everything
    /// validated so far.
    ///
    /// # Errors
    /// [`TraceError::Value`] for the first violation in what `need` covers (the one a plain
    /// scan in storage order finds: ids, then scores, gates, norms), inside
    /// [`TraceError::File`] naming the path for an opened file; nothing is recorded then.
    pub fn view_for(&self, need: Reads) -> Result<TraceView<'_>> {
        let parts = self.parts();
        let need = need.clamp(&self.shape, &parts);
        let mut checked = self.checked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if !checked.covers(need) {
            check_content(&self.shape, &self.meta.layer_ids, &parts, need, *checked).map_err(|e| match &self.path {
                Some(path) => e.in_file(path),
                None => e,
            })?;
            *checked = checked.union(need);
        }
        Ok(TraceView::new_prevalidated(&self.meta, self.shape, parts, *checked))
    }

    /// [`TraceFile::view_for`] of everything, with every id checked by `ids_pass` (given the
    /// shape, the layer ids and the whole `ids` tensor) instead of the plain check: a pass that
    /// checks the ids (as `check::check_ids_copy` does) and computes something from them while
    /// they are in cache (the usage summary). `ids_pass` runs even when the ids were validated
    /// before; the other tensors are checked after it, in the plain order.
    ///
    /// # Errors
    /// The error of `ids_pass`, else as [`TraceFile::view_for`]; inside [`TraceError::File`]
    /// naming the path for an opened file.
    pub(crate) fn view_all_with<T>(
        &self,
        ids_pass: impl FnOnce(&Shape, &[u32], &[u16]) -> Result<T>,
    ) -> Result<(TraceView<'_>, T)> {
        let parts = self.parts();
        let need = Reads::EVERYTHING.clamp(&self.shape, &parts);
        let in_file = |e: TraceError| match &self.path {
            Some(path) => e.in_file(path),
            None => e,
        };
        let mut checked = self.checked.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let out = ids_pass(&self.shape, &self.meta.layer_ids, parts.ids).map_err(in_file)?;
        *checked = checked.union(Reads::ids(need.ids));
        if !checked.covers(need) {
            check_content(&self.shape, &self.meta.layer_ids, &parts, need, *checked).map_err(in_file)?;
            *checked = checked.union(need);
        }
        Ok((TraceView::new_prevalidated(&self.meta, self.shape, parts, *checked), out))
    }

    fn parts(&self) -> TraceParts<'_> {
        let bytes = self.backing.bytes();
        // The casts below cannot fail: `parse` checked every range's alignment and length.
        let u16s = |r: &Range<usize>| bytemuck::cast_slice::<u8, u16>(&bytes[r.clone()]);
        let f32s = |r: &Option<Range<usize>>| r.as_ref().map(|r| bytemuck::cast_slice::<u8, f32>(&bytes[r.clone()]));
        let u64s = |r: &Option<Range<usize>>| r.as_ref().map(|r| bytemuck::cast_slice::<u8, u64>(&bytes[r.clone()]));
        TraceParts {
            ids: u16s(&self.layout.ids),
            scores: f32s(&self.layout.scores),
            gates: f32s(&self.layout.gates),
            out_norms: f32s(&self.layout.out_norms),
            seq_offsets: u64s(&self.layout.seq_offsets),
            step_offsets: u64s(&self.layout.step_offsets),
            lookahead_ids: self
                .layout
                .lookahead_ids
                .as_ref()
                .map(|(r, width)| crate::Lookahead { ids: u16s(r), width: *width }),
        }
    }
}

/// Opens `path` for reading if it is a regular file (after following symbolic links), refusing
/// FIFOs, devices, sockets and directories before opening: opening a FIFO blocks until a writer
/// comes. The file is opened non-blocking on Unix and checked again, so a path swapped in between
/// is refused too.
pub(crate) fn open_regular(path: &Path) -> Result<File> {
    Ok(open_regular_io(path, "a trace must be a file on disk (it is memory-mapped)")?)
}

/// [`open_regular`] with an I/O error whose text is the kind of file found, "not a regular file",
/// then `why` (what the input must be).
pub(crate) fn open_regular_io(path: &Path, why: &str) -> std::io::Result<File> {
    open_regular_inner(path, why, false)
}

/// [`open_regular_io`] for an input that may be a zip archive (an `.npz`): zip data is not
/// refused; the other compressed formats still are.
pub(crate) fn open_regular_archive(path: &Path, why: &str) -> std::io::Result<File> {
    open_regular_inner(path, why, true)
}

fn open_regular_inner(path: &Path, why: &str, zip_ok: bool) -> std::io::Result<File> {
    let refuse = |t: std::fs::FileType| -> std::io::Result<File> {
        Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{}, not a regular file: {why}", kind_of(t))))
    };
    let before = std::fs::metadata(path)?.file_type();
    if !before.is_file() {
        return refuse(before);
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let after = file.metadata()?.file_type();
    if !after.is_file() {
        return refuse(after);
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileExt;
        let mut head = [0u8; 10];
        let n = file.read_at(&mut head, 0)?;
        if let Some((format, tool)) = compression(&head[..n])
            && !(zip_ok && format == "zip")
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "{format}-compressed data: decompress it first (`{tool} FILE`); moe-offload reads uncompressed files"
                ),
            ));
        }
    }
    Ok(file)
}

/// The compression format whose magic number `head` (a file's first bytes) starts with, and the
/// command that undoes it: gzip (RFC 1952: 1f 8b), zstd (RFC 8878: 28 b5 2f fd), xz (fd '7zXZ'
/// 00), bzip2 ('BZh', a block size '1'..'9', then the block magic 31 41 59 26 53 59) and zip
/// ('PK' 03 04). `None` for anything else: no text or trace input of ours starts so.
pub fn compression(head: &[u8]) -> Option<(&'static str, &'static str)> {
    if head.starts_with(&[0x1f, 0x8b]) {
        Some(("gzip", "gunzip -k"))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Some(("zstd", "zstd -d"))
    } else if head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        Some(("xz", "unxz -k"))
    } else if head.len() >= 10
        && head.starts_with(b"BZh")
        && (b'1'..=b'9').contains(&head[3])
        && head[4..10] == [0x31, 0x41, 0x59, 0x26, 0x53, 0x59]
    {
        Some(("bzip2", "bunzip2 -k"))
    } else if head.starts_with(b"PK\x03\x04") {
        Some(("zip", "unzip"))
    } else {
        None
    }
}

/// What a file that is not a regular file is, in words.
fn kind_of(t: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() || t.is_block_device() {
            return "a device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() { "a directory" } else { "a special file" }
}

/// Checks the file's length against its header before it is mapped: the header-length prefix,
/// then every tensor's byte range ([`crate::extent`]).
fn check_file_extent(file: &File) -> Result<()> {
    use std::io::Read;
    let len = file.metadata()?.len();
    let mut reader = file;
    let mut prefix = [0u8; 8];
    let n = if len >= 8 {
        reader.read_exact(&mut prefix)?;
        crate::extent::header_len(&prefix)
    } else {
        None
    };
    crate::extent::check_prefix(len, n)?;
    let n = n.expect("checked by check_prefix");
    if n > 100_000_000 {
        return Ok(()); // safetensors refuses it with its own message
    }
    let mut header = vec![0u8; n as usize];
    reader.read_exact(&mut header)?;
    crate::extent::check_tensors(len, &header)
}

/// Parses the container: metadata, dtypes, shapes and alignment (not row content).
fn parse(bytes: &[u8]) -> Result<(TraceMeta, Shape, Layout)> {
    crate::extent::check_bytes(bytes)?;
    let st = SafeTensors::deserialize(bytes).map_err(|e| {
        // safetensors does not say which tensor's byte range disagrees with its shape: find it.
        if matches!(
            e,
            SafeTensorError::TensorInvalidInfo | SafeTensorError::ValidationOverflow | SafeTensorError::MisalignedSlice
        ) && let Some(named) = tensor_size_error(bytes)
        {
            return named;
        }
        // A text file that opens like JSON: most often statistics or a keep map given as a trace.
        let json = bytes.iter().find(|b| !b.is_ascii_whitespace()).is_some_and(|&b| b == b'{' || b == b'[');
        let hint = if json { " (the file is JSON text: statistics or a keep map, not a trace?)" } else { "" };
        TraceError::Container(format!("{e}{hint}"))
    })?;
    let (header_len, md) = SafeTensors::read_metadata(bytes).map_err(|e| TraceError::Container(e.to_string()))?;
    let data_start = 8 + header_len;
    let empty = Default::default();
    let meta = TraceMeta::from_map(md.metadata().as_ref().unwrap_or(&empty))?;
    // Sorted: safetensors keeps the names in a hash map, and the message must not depend on its order.
    let mut names = st.names();
    names.sort_unstable();
    for name in names {
        if !TENSORS.contains(&name) {
            return Err(TraceError::Container(format!("unexpected tensor `{name}`")));
        }
    }
    let info = |name: &'static str| md.info(name);
    let ids_info = info("ids").ok_or(TraceError::MissingTensor { tensor: "ids" })?;
    check_dtype("ids", ids_info.dtype, Dtype::U16, "U16")?;
    let layers = meta.layer_ids.len();
    let &[l, tokens, candidates] = ids_info.shape.as_slice() else {
        return Err(TraceError::Shape { tensor: "ids", expected: "[L, T, m]".into(), actual: ids_info.shape.clone() });
    };
    if l != layers {
        return Err(TraceError::Shape {
            tensor: "ids",
            expected: format!("[L, T, m] with L = {layers} (the length of layer_ids)"),
            actual: ids_info.shape.clone(),
        });
    }
    let shape =
        Shape { layers, tokens, candidates, top_k: meta.top_k as usize, num_experts: meta.num_experts as usize };
    if shape.top_k > candidates {
        return Err(TraceError::BadMetadata {
            key: "top_k",
            value: meta.top_k.to_string(),
            reason: format!("larger than the {candidates} candidates per row of `ids`"),
        });
    }
    let range = |name: &'static str, dtype: Dtype, dname: &'static str, want: Option<&[usize]>, align: usize| {
        let Some(ti) = info(name) else { return Ok(None) };
        check_dtype(name, ti.dtype, dtype, dname)?;
        if let Some(want) = want {
            if ti.shape != want {
                return Err(TraceError::Shape {
                    tensor: name,
                    expected: format!("{want:?}"),
                    actual: ti.shape.clone(),
                });
            }
        } else if ti.shape.len() != 1 {
            return Err(TraceError::Shape { tensor: name, expected: "a 1-D list".into(), actual: ti.shape.clone() });
        }
        let (s, e) = ti.data_offsets;
        let r = data_start + s..data_start + e;
        let base = bytes.as_ptr() as usize + r.start;
        if !base.is_multiple_of(align) {
            return Err(TraceError::Misaligned {
                tensor: name,
                reason: format!("byte offset {} is not a multiple of {align}", r.start),
            });
        }
        Ok(Some(r))
    };
    let lt_m = [layers, tokens, candidates];
    let lt_k = [layers, tokens, shape.top_k];
    let layout = Layout {
        ids: range("ids", Dtype::U16, "U16", Some(&lt_m), 2)?.expect("ids exists"),
        scores: range("scores", Dtype::F32, "F32", Some(&lt_m), 4)?,
        gates: range("gates", Dtype::F32, "F32", Some(&lt_k), 4)?,
        out_norms: range("out_norms", Dtype::F32, "F32", Some(&lt_k), 4)?,
        seq_offsets: range("seq_offsets", Dtype::U64, "U64", None, 8)?,
        step_offsets: range("step_offsets", Dtype::U64, "U64", None, 8)?,
        lookahead_ids: match info("lookahead_ids").map(|ti| ti.shape.as_slice()) {
            None => None,
            Some(&[l, t, width]) if l == layers && t == tokens && width >= 1 => {
                range("lookahead_ids", Dtype::U16, "U16", Some(&[l, t, width]), 2)?.map(|r| (r, width))
            }
            Some(other) => {
                return Err(TraceError::Shape {
                    tensor: "lookahead_ids",
                    expected: format!("[L, T, m'] with L = {layers}, T = {tokens} (as `ids`) and m' >= 1"),
                    actual: other.to_vec(),
                });
            }
        },
    };
    // Cross-check scores presence against the metadata.
    if layout.scores.is_none() && meta.score_kind != crate::ScoreKind::None {
        return Err(TraceError::MissingTensor { tensor: "scores" });
    }
    Ok((meta, shape, layout))
}

/// The tensor names the format defines.
const TENSORS: [&str; 7] = ["ids", "scores", "gates", "out_norms", "seq_offsets", "step_offsets", "lookahead_ids"];

/// After safetensors refused the header because a tensor's shape and dtype do not fill its
/// `data_offsets` (or its element count overflows), finds the first such tensor in data order, as
/// safetensors checks them, and names it: [`TraceError::Shape`] for a tensor of the format, a
/// [`TraceError::Container`] naming any other. `None` when the header cannot be read here either.
fn tensor_size_error(bytes: &[u8]) -> Option<TraceError> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = bytes.get(8..8usize.checked_add(n)?)?;
    let map: std::collections::HashMap<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    let mut infos: Vec<(String, TensorInfo)> = map
        .into_iter()
        .filter(|(name, _)| name != "__metadata__")
        .map(|(name, v)| Some((name, serde_json::from_value(v).ok()?)))
        .collect::<Option<_>>()?;
    // Ties broken by name: the header is a hash map, and the message must not depend on its order.
    infos.sort_by(|(a, x), (b, y)| x.data_offsets.cmp(&y.data_offsets).then_with(|| a.cmp(b)));
    infos.into_iter().find_map(|(name, info)| {
        let (start, end) = info.data_offsets;
        let held = end.checked_sub(start)?;
        let elements = info.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        let bits = elements.and_then(|n| n.checked_mul(info.dtype.bitsize()));
        if bits.is_some_and(|b| b.is_multiple_of(8) && b / 8 == held) {
            return None;
        }
        let size = info.dtype.bitsize() / 8;
        let dtype = info.dtype;
        let expected = match elements {
            None => format!("an element count that fits in memory (data_offsets {start}..{end} hold {held} bytes)"),
            Some(n) if size > 0 && held.is_multiple_of(size) => {
                format!(
                    "{} elements of {dtype} to fill data_offsets {start}..{end} ({held} bytes), not {n}",
                    held / size
                )
            }
            Some(n) => format!("{n} elements of {dtype}, but data_offsets {start}..{end} hold {held} bytes"),
        };
        Some(match TENSORS.iter().find(|t| **t == name) {
            Some(tensor) => TraceError::Shape { tensor, expected, actual: info.shape },
            None => TraceError::Container(format!("tensor `{name}` has shape {:?}, expected {expected}", info.shape)),
        })
    })
}

fn check_dtype(tensor: &'static str, actual: Dtype, want: Dtype, expected: &'static str) -> Result<()> {
    if actual != want {
        return Err(TraceError::Dtype { tensor, expected, actual: actual.to_string() });
    }
    Ok(())
}

#[cfg(test)]
mod compression_tests {
    use super::compression;

    #[test]
    fn magic_numbers() {
        let check = |head: &[u8], expect: Option<&str>| assert_eq!(compression(head).map(|c| c.0), expect, "{head:?}");
        check(&[0x1f, 0x8b, 8], Some("gzip"));
        check(&[0x28, 0xb5, 0x2f, 0xfd], Some("zstd"));
        check(&[0xfd, b'7', b'z', b'X', b'Z', 0], Some("xz"));
        check(b"BZh91AY&SY", Some("bzip2"));
        check(b"PK\x03\x04", Some("zip"));
        // Text and traces of ours are not compressed: JSON, CSV, a header that starts "BZh".
        check(b"{\"kind\"", None);
        check(b"BZh,layer,expert", None);
        check(b"layer,expert,count", None);
        check(&[0x10, 0, 0, 0, 0, 0, 0, 0, b'{'], None);
        check(&[0x1f], None);
        check(&[], None);
    }
}
