//! Importer for integer routing arrays saved by numpy: `.npy`, or `.npz` (`savez`,
//! `savez_compressed`).
//!
//! Input: a 3-D integer array of expert ids, `[layers, tokens, k]` (layout `ltk`) or
//! `[tokens, layers, k]` (`tlk`, what SGLang's and vLLM's returned routed experts are), any
//! integer dtype (`i1`..`i8`, `u1`..`u8`), either byte order, C order (Fortran order is refused).
//! In an `.npz`:
//! - the array: the one named by [`NumpyOptions::array`], else the only 3-D integer array, else
//!   the one named `experts` or `topk_ids`;
//! - `meta` (optional): a 0-d string array (`np.array(json.dumps({...}))`) holding a JSON object;
//!   keys read: `model`, `num_experts` (or `n_experts`), `top_k` / `k`, `n_moe_layers` (or
//!   `num_layers`, `n_layers`), `layer_ids`, `layout`, `phase`, `source`;
//! - `seq_offsets` or `offsets` (optional): a 1-D integer array of sequence starts (a trailing
//!   entry equal to the token count, as in `cumsum` boundaries, is accepted and dropped).
//!
//! The layout comes from `--layout`, else the meta's `layout`, else from the layer count (the
//! meta's `n_moe_layers` or `layer_ids`, or `--layers`) matching exactly one of the first two
//! axes. `-1` is padding: a row of k padding slots is a padding row, and a token whose rows are
//! padding in every layer is dropped and reported; a row with some padding slots (fewer than k
//! ids) or a token padded in some layers only is refused. The array records only the ids used:
//! `m = k`, no scores (`score_kind = none`), no gates; ids keep the order the runtime gave them.
//!
//! Layers in which every expert is used exactly equally often are warned about: what a flat copy
//! of a strided top-k view (llama.cpp's `ffn_moe_topk`, the first k rows of an argsort) gives.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::str::FromStr;

use npyz::{DType, Endianness, NpyFile, NpyHeader, Order, TypeChar};

use super::{DropReason, Dropped, ImportReport, Imported};
use crate::{OwnedParts, Phase, Reads, Result, ScoreKind, TraceData, TraceError, TraceMeta};

mod elements;
mod meta;

use elements::*;
use meta::*;

const FORMAT: &str = "numpy";

/// The axis order of a routing array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// `[layers, tokens, k]` (the trace's own order).
    Ltk,
    /// `[tokens, layers, k]`.
    Tlk,
}

impl Layout {
    /// `ltk` or `tlk`.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Ltk => "ltk",
            Layout::Tlk => "tlk",
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Layout {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "ltk" => Ok(Layout::Ltk),
            "tlk" => Ok(Layout::Tlk),
            _ => Err(format!("{s:?}: expected ltk ([layers, tokens, k]) or tlk ([tokens, layers, k])")),
        }
    }
}

/// Options of [`import_numpy`]; every one may be left out when the file says it.
#[derive(Debug, Clone, Default)]
pub struct NumpyOptions {
    /// The array of ids in an `.npz` (default: detected, see the module doc).
    pub array: Option<String>,
    /// The axis order (default: the meta's `layout`, else detected from the layer count).
    pub layout: Option<Layout>,
    /// E, routed experts per layer (default: the meta's `num_experts`).
    pub num_experts: Option<u32>,
    /// The model's id of each layer (default: the meta's `layer_ids`, else 0..L).
    pub layer_ids: Option<Vec<u32>>,
    /// Sequences of this many tokens (the last may be shorter), instead of an offsets array.
    pub chunk: Option<usize>,
    /// The phase (default: the meta's `phase`, else unknown).
    pub phase: Option<Phase>,
    /// Model name (default: the meta's `model`, else `unknown`).
    pub model: Option<String>,
}

/// The integer element type of the id array.
#[derive(Debug, Clone, Copy)]
struct IntType {
    size: usize,
    signed: bool,
    big: bool,
}

/// What the `.npy` or `.npz` holds, headers only.
enum Source {
    Npy(BufReader<std::fs::File>),
    Npz(zip::ZipArchive<BufReader<std::fs::File>>),
}

/// Imports the routing array in the `.npy` or `.npz` file at `path`.
///
/// # Errors
/// [`TraceError::Import`] naming the file (and the array, element and byte offset where one is
/// at fault) for a file that is neither `.npy` nor `.npz`, a truncated or corrupt file, no or
/// several candidate arrays, an array that is not 3-D, not of integers or in Fortran order, no
/// tokens, an id `>= num_experts` or below -1, an id repeated in a row, a row with fewer than k
/// ids, a token padded in some layers only, metadata that contradicts the array or the options,
/// an unknown layout or expert count, bad sequence offsets; [`TraceError::File`] around an I/O
/// error opening the file.
pub fn import_numpy(path: impl AsRef<Path>, opts: &NumpyOptions) -> Result<Imported> {
    let path = path.as_ref();
    let err = |msg: String| import_err(path, msg);
    let file =
        crate::file::open_regular_archive(path, "give a file on disk").map_err(|e| TraceError::Io(e).in_file(path))?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let head = reader.fill_buf().map_err(|e| err(format!("cannot read: {e}")))?;
    let npy_start = data_start(head);
    let mut source = if head.starts_with(b"\x93NUMPY") {
        Source::Npy(reader)
    } else if head.starts_with(b"PK") {
        Source::Npz(zip::ZipArchive::new(reader).map_err(|e| err(format!("not a readable .npz (zip) archive: {e}")))?)
    } else {
        return Err(err(format!(
            "neither a .npy file (magic \\x93NUMPY) nor an .npz archive (a zip file){}",
            if head.is_empty() { ": the file is empty" } else { "" }
        )));
    };
    // The arrays (name, header) of the file; a .npy holds one, named after the file.
    let file_stem = path.file_stem().map_or_else(|| "array".to_string(), |s| s.to_string_lossy().into_owned());
    let (name, header, meta, offsets) = match &mut source {
        Source::Npy(r) => {
            if opts.array.is_some() {
                return Err(err("--array names an array of an .npz; a .npy file holds one array".into()));
            }
            let h = NpyHeader::from_reader(&mut *r).map_err(|e| err(format!("not a readable .npy header: {e}")))?;
            (file_stem, h, None, None)
        }
        Source::Npz(zip) => {
            let mut names = Vec::new();
            for n in zip.file_names() {
                let n = n.map_err(|e| err(format!("an entry name of the archive is unreadable: {e}")))?;
                names.extend(n.strip_suffix(".npy").map(str::to_string));
            }
            let mut headers = BTreeMap::new();
            for n in &names {
                headers.insert(n.clone(), npz_header(zip, n, path)?);
            }
            let name = pick_array(&headers, opts.array.as_deref()).map_err(&err)?;
            let meta = match headers.get("meta") {
                Some(h) if name != "meta" => Some(read_meta(zip, h, path)?),
                _ => None,
            };
            let offsets = ["seq_offsets", "offsets"]
                .into_iter()
                .find(|n| headers.contains_key(*n) && *n != name)
                .map(|n| read_offsets(zip, n, &headers[n], path).map(|o| (n, o)))
                .transpose()?;
            let header = headers.remove(&name).ok_or_else(|| err(format!("no array `{name}`")))?;
            (name, header, meta, offsets)
        }
    };
    let arr = |msg: String| err(format!("array `{name}`: {msg}"));
    let int = int_type(&header).map_err(arr)?;
    let shape: Vec<usize> = header.shape().iter().map(|&d| d as usize).collect();
    let [a0, a1, k] = shape[..] else {
        let hint = if shape.len() == 2 {
            ": a 2-D array holds one layer's [tokens, k] (or one token's [layers, k]); stack the layers into \
             [layers, tokens, k] (np.stack) before saving"
        } else {
            ""
        };
        return Err(arr(format!("shape {shape:?}: expected 3 axes, [layers, tokens, k] or [tokens, layers, k]{hint}")));
    };
    if header.order() == Order::Fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err(arr(
            "Fortran order (fortran_order: True): only C order is read; save np.ascontiguousarray(a) instead".into(),
        ));
    }
    let meta = Meta::from_json(meta.as_ref()).map_err(|m| err(format!("array `meta`: {m}")))?;
    let facts = Facts::resolve(opts, &meta, [a0, a1, k]).map_err(&err)?;
    let (layers, tokens) = match facts.layout {
        Layout::Ltk => (a0, a1),
        Layout::Tlk => (a1, a0),
    };
    if layers == 0 || tokens == 0 || k == 0 {
        return Err(arr(format!("shape {shape:?}: no {}", if tokens == 0 { "tokens" } else { "layers or slots" })));
    }
    let mut at = Where { name: &name, layout: facts.layout, layers, tokens, k, data_start: npy_start };
    let raw = match source {
        Source::Npy(r) => {
            // The data read straight into the chunk buffer (what the reader holds past the header
            // first): through the reader's buffer it would be copied twice.
            let held = r.buffer().to_vec();
            read_ids(held.as_slice().chain(r.into_inner()), int, &at, facts.num_experts).map_err(err)?
        }
        Source::Npz(mut zip) => {
            let entry = zip
                .by_name(&format!("{name}.npy"))
                .map_err(|e| err(format!("array `{name}`: cannot read the archive entry: {e}")))?;
            let mut r = BufReader::with_capacity(1 << 20, entry);
            at.data_start = data_start(r.fill_buf().map_err(|e| arr(e.to_string()))?);
            NpyHeader::from_reader(&mut r).map_err(|e| arr(format!("not a readable .npy header: {e}")))?;
            read_ids(r, int, &at, facts.num_experts).map_err(err)?
        }
    };
    finish(path, opts, &at, facts, meta, offsets, raw, &shape, int)
}

/// Where the array's elements are, for error messages and the axis order.
struct Where<'a> {
    name: &'a str,
    layout: Layout,
    layers: usize,
    tokens: usize,
    k: usize,
    /// Bytes before the data in the `.npy` (its header).
    data_start: u64,
}

impl Where<'_> {
    /// (layer index, token) of input row `r` (one row = k slots).
    fn layer_token(&self, r: usize) -> (usize, usize) {
        match self.layout {
            Layout::Ltk => (r / self.tokens, r % self.tokens),
            Layout::Tlk => (r % self.layers, r / self.layers),
        }
    }

    /// "array `x` [i, j, s] (element n, byte b of x.npy)".
    fn element(&self, r: usize, slot: usize, size: usize) -> String {
        let (l, t) = self.layer_token(r);
        let idx = match self.layout {
            Layout::Ltk => [l, t, slot],
            Layout::Tlk => [t, l, slot],
        };
        let n = (r * self.k + slot) as u64;
        format!(
            "array `{}` [{}, {}, {}] (layer index {l}, token {t}, slot {slot}; element {n}, byte {} of {}.npy)",
            self.name,
            idx[0],
            idx[1],
            idx[2],
            self.data_start + n * size as u64,
            self.name
        )
    }
}

/// Bytes before the data of a `.npy` whose first bytes are `head`: magic (6), version (2), the
/// header's length (2 bytes in version 1, 4 in versions 2 and 3), the header.
fn data_start(head: &[u8]) -> u64 {
    match head {
        [_, _, _, _, _, _, 1, _, a, b, ..] => 10 + u64::from(u16::from_le_bytes([*a, *b])),
        [_, _, _, _, _, _, _, _, a, b, c, d, ..] => 12 + u64::from(u32::from_le_bytes([*a, *b, *c, *d])),
        _ => 0,
    }
}

/// The dtype as numpy spells it (`<i2`, `|O`; a structured one as its descr).
fn dtype_name(h: &NpyHeader) -> String {
    match h.dtype() {
        DType::Plain(ts) => ts.to_string(),
        d => d.descr(),
    }
}

fn int_type(h: &NpyHeader) -> std::result::Result<IntType, String> {
    let DType::Plain(ts) = h.dtype() else {
        return Err(format!("dtype {}: expected integer expert ids (a structured array is not)", dtype_name(h)));
    };
    let signed = match ts.type_char() {
        TypeChar::Int => true,
        TypeChar::Uint => false,
        TypeChar::Float => {
            return Err(format!(
                "dtype {ts}: expected integer expert ids (i1-i8, u1-u8); a float array holds scores or \
                 probabilities, not ids: save the top-k ids (e.g. topk_ids.astype(np.int32))"
            ));
        }
        _ => return Err(format!("dtype {ts}: expected integer expert ids (i1-i8, u1-u8)")),
    };
    let size = ts.size_field() as usize;
    if ![1, 2, 4, 8].contains(&size) {
        return Err(format!("dtype {ts}: expected integer expert ids (i1-i8, u1-u8)"));
    }
    Ok(IntType { size, signed, big: ts.endianness() == Endianness::Big })
}

fn npz_header(zip: &mut zip::ZipArchive<BufReader<std::fs::File>>, name: &str, path: &Path) -> Result<NpyHeader> {
    let entry = zip
        .by_name(&format!("{name}.npy"))
        .map_err(|e| import_err(path, format!("array `{name}`: cannot read the archive entry: {e}")))?;
    NpyHeader::from_reader(entry)
        .map_err(|e| import_err(path, format!("array `{name}`: not a readable .npy header: {e}")))
}

/// Is the header a 3-D integer array?
fn is_id_array(h: &NpyHeader) -> bool {
    h.shape().len() == 3 && int_type(h).is_ok()
}

/// The array of ids: the one asked for, else the only 3-D integer array, else `experts` or
/// `topk_ids`.
fn pick_array(headers: &BTreeMap<String, NpyHeader>, asked: Option<&str>) -> std::result::Result<String, String> {
    let listed =
        || headers.iter().map(|(n, h)| format!("{n} {} {:?}", dtype_name(h), h.shape())).collect::<Vec<_>>().join(", ");
    if let Some(a) = asked {
        return if headers.contains_key(a) {
            Ok(a.to_string())
        } else {
            Err(format!("no array `{a}` (--array); the archive holds: {}", listed()))
        };
    }
    let ids: Vec<&String> = headers.iter().filter(|(_, h)| is_id_array(h)).map(|(n, _)| n).collect();
    match ids[..] {
        [one] => Ok(one.clone()),
        [] => Err(format!(
            "no 3-D integer array ([layers, tokens, k] or [tokens, layers, k] expert ids); the archive holds: {}",
            if headers.is_empty() { "no arrays".to_string() } else { listed() }
        )),
        _ => ["experts", "topk_ids"].into_iter().find(|n| headers.contains_key(*n)).map(str::to_string).ok_or_else(
            || {
                format!(
                    "several 3-D integer arrays ({}) and none named experts or topk_ids: choose one with --array",
                    ids.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
                )
            },
        ),
    }
}

/// The JSON object of the 0-d string array `meta`.
fn read_meta(
    zip: &mut zip::ZipArchive<BufReader<std::fs::File>>,
    h: &NpyHeader,
    path: &Path,
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let err = |m: String| import_err(path, format!("array `meta`: {m}"));
    let DType::Plain(ts) = h.dtype() else {
        return Err(err(format!("dtype {}: expected a 0-d string holding a JSON object", h.dtype().descr())));
    };
    if ts.type_char() == TypeChar::Object {
        return Err(err(
            "a pickled Python object (np.savez of a dict): save np.array(json.dumps(meta)) instead, a 0-d unicode \
             array holding a JSON object"
                .into(),
        ));
    }
    let unicode = match ts.type_char() {
        TypeChar::UnicodeStr => true,
        TypeChar::ByteStr => false,
        _ => return Err(err(format!("dtype {ts}: expected a 0-d string (U or S) holding a JSON object"))),
    };
    if !h.shape().is_empty() {
        return Err(err(format!("shape {:?}: expected a 0-d string array (np.array(json.dumps(meta)))", h.shape())));
    }
    let size = ts.size_field() as usize * if unicode { 4 } else { 1 };
    let entry = zip.by_name("meta.npy").map_err(|e| err(format!("cannot read the archive entry: {e}")))?;
    let mut r = BufReader::new(entry);
    NpyHeader::from_reader(&mut r).map_err(|e| err(format!("not a readable .npy header: {e}")))?;
    let mut bytes = vec![0u8; size];
    r.read_exact(&mut bytes).map_err(|e| err(format!("truncated string: {e}")))?;
    let text: String = if unicode {
        let big = ts.endianness() == Endianness::Big;
        let (units, _) = bytes.as_chunks::<4>();
        units
            .iter()
            .map(|&u| if big { u32::from_be_bytes(u) } else { u32::from_le_bytes(u) })
            .take_while(|&c| c != 0)
            .map(|c| char::from_u32(c).ok_or_else(|| err(format!("code point {c:#x} is not a character"))))
            .collect::<Result<_>>()?
    } else {
        let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
        String::from_utf8(bytes[..end].to_vec()).map_err(|e| err(format!("not UTF-8: {e}")))?
    };
    match serde_json::from_str(&text) {
        Ok(serde_json::Value::Object(m)) => Ok(m),
        Ok(_) => Err(err(format!("{text:?} is not a JSON object"))),
        Err(e) => Err(err(format!("not JSON ({e}): {text:?}"))),
    }
}

/// A 1-D integer array of sequence starts.
fn read_offsets(
    zip: &mut zip::ZipArchive<BufReader<std::fs::File>>,
    name: &str,
    h: &NpyHeader,
    path: &Path,
) -> Result<Vec<i64>> {
    let err = |m: String| import_err(path, format!("array `{name}` (sequence offsets): {m}"));
    int_type(h).map_err(&err)?;
    if h.shape().len() != 1 {
        return Err(err(format!("shape {:?}: expected 1-D sequence starts", h.shape())));
    }
    let entry = zip.by_name(&format!("{name}.npy")).map_err(|e| err(format!("cannot read the archive entry: {e}")))?;
    let f = NpyFile::new(BufReader::new(entry)).map_err(|e| err(format!("not a readable .npy: {e}")))?;
    let ts = match f.dtype() {
        DType::Plain(ts) => ts,
        d => return Err(err(format!("dtype {}", d.descr()))),
    };
    let v: Vec<i64> = match (ts.type_char(), ts.size_field()) {
        (TypeChar::Uint, 8) => f
            .into_vec::<u64>()
            .map_err(|e| err(e.to_string()))?
            .into_iter()
            .map(|x| i64::try_from(x).unwrap_or(i64::MAX))
            .collect(),
        (TypeChar::Uint, _) => {
            f.into_vec::<u32>().map_err(|e| err(e.to_string()))?.into_iter().map(i64::from).collect()
        }
        _ => f.into_vec::<i64>().map_err(|e| err(e.to_string()))?,
    };
    Ok(v)
}

/// Builds the trace and the report from the ids read.
#[expect(clippy::too_many_arguments, reason = "one private step of import_numpy")]
fn finish(
    path: &Path,
    opts: &NumpyOptions,
    at: &Where<'_>,
    facts: Facts,
    meta: Meta,
    offsets: Option<(&str, Vec<i64>)>,
    raw: Raw,
    shape: &[usize],
    int: IntType,
) -> Result<Imported> {
    let err = |msg: String| import_err(path, msg);
    let (layers, tokens, k) = (at.layers, at.tokens, at.k);
    let Raw { mut ids, padding_row, padding_rows, id_sums, ids_checked } = raw;
    // Padding tokens: padding rows in every layer; a token padded in some layers only is refused.
    let mut keep = vec![true; tokens];
    for (t, kept) in keep.iter_mut().enumerate().filter(|_| padding_rows > 0) {
        let padded = (0..layers).filter(|&l| padding_row[l * tokens + t]).count();
        if padded == layers {
            *kept = false;
        } else if padded > 0 {
            let l = (0..layers).find(|&l| padding_row[l * tokens + t]).unwrap_or(0);
            return Err(err(format!(
                "array `{}`: token {t} is padding (-1) in {padded} of {layers} layers (the first: layer index {l}) \
                 and routed in the others: a token passes every MoE layer",
                at.name
            )));
        }
    }
    let kept_tokens = keep.iter().filter(|&&x| x).count();
    if kept_tokens == 0 {
        return Err(err(format!("array `{}`: every row is padding (-1): no tokens", at.name)));
    }
    let dropped_tokens = tokens - kept_tokens;
    if dropped_tokens > 0 {
        let mut w = 0;
        for l in 0..layers {
            for (t, _) in keep.iter().enumerate().filter(|(_, kept)| **kept) {
                let src = (l * tokens + t) * k;
                ids.copy_within(src..src + k, w);
                w += k;
            }
        }
        ids.truncate(w);
    }
    // Sequence starts in the array's token indices.
    let starts: Option<(Vec<u64>, String)> = match (opts.chunk, offsets) {
        (Some(_), Some((name, _))) => {
            return Err(err(format!("--chunk and the array `{name}` both give sequences: give one")));
        }
        (Some(0), None) => return Err(err("--chunk 0: a sequence holds at least one token".into())),
        (Some(n), None) => Some(((0..tokens).step_by(n).map(|s| s as u64).collect(), format!("--chunk {n}"))),
        (None, Some((name, v))) => {
            let bad = |m: String| err(format!("array `{name}` (sequence offsets): {m}"));
            let mut v = v;
            if v.len() > 1 && v.last() == Some(&(tokens as i64)) {
                v.pop();
            }
            if v.first() != Some(&0) {
                return Err(bad(format!("{v:?}: the first sequence must start at token 0")));
            }
            if let Some(w) = v.windows(2).position(|w| w[1] <= w[0]) {
                return Err(bad(format!("entry {}: {} after {}: starts must increase", w + 1, v[w + 1], v[w])));
            }
            if let Some(&last) = v.last()
                && last >= tokens as i64
            {
                return Err(bad(format!("start {last} is past the last token ({})", tokens - 1)));
            }
            Some((v.into_iter().map(|s| s as u64).collect(), format!("array `{name}`")))
        }
        (None, None) => None,
    };
    // The same starts in kept-token indices (sequences left empty by padding disappear).
    let mut new_index = Vec::with_capacity(tokens + 1);
    let mut n = 0u64;
    for &kept in &keep {
        new_index.push(n);
        n += u64::from(kept);
    }
    let seq_offsets = starts.as_ref().map(|(s, _)| {
        let mut out: Vec<u64> = s.iter().map(|&x| new_index[x as usize]).filter(|&x| x < n).collect();
        out.dedup();
        out
    });
    // Layers in which every expert is used equally often, c = k T / E times: counted only where
    // the sum of the layer's ids is the sum that gives, c (0 + 1 + ... + E-1).
    let e = facts.num_experts as usize;
    let per_layer = kept_tokens * k;
    let c = per_layer / e.max(1);
    let even: Vec<usize> = (0..layers)
        .filter(|&l| {
            e > 1
                && c > 0
                && c * e == per_layer
                && u128::from(id_sums[l]) == (c as u128) * (e as u128) * (e as u128 - 1) / 2
                && {
                    let mut counts = vec![0usize; e];
                    for &id in &ids[l * per_layer..(l + 1) * per_layer] {
                        counts[usize::from(id)] += 1;
                    }
                    counts.iter().all(|&x| x == c)
                }
        })
        .collect();
    let mut warnings = Vec::new();
    if !even.is_empty() {
        warnings.push(format!(
            "in {} of {layers} layers every one of the {e} experts is used exactly equally often ({} times in layer \
             index {}): routing does not look so, but a flat copy of a strided top-k view does (llama.cpp's \
             ffn_moe_topk is the first k rows of an argsort of all E experts; copying its memory flat gives whole \
             permutations of 0..E-1); record the view by its strides (or ggml_cont it) and record again",
            even.len(),
            c,
            even[0]
        ));
    }
    let layer_ids = match &facts.layer_ids {
        Some((v, _)) => v.clone(),
        None => (0..layers as u32).collect(),
    };
    let dtype = format!("{}{}{}", if int.big { '>' } else { '<' }, if int.signed { 'i' } else { 'u' }, int.size);
    let mut notes = vec![
        format!(
            "array `{}`: {dtype} {shape:?}, layout {} ({}): {layers} layers x {tokens} tokens x k = {k}",
            at.name, facts.layout, facts.layout_from
        ),
        format!("E = {} ({}); m = k = {k}: ids only, no scores, no gates", facts.num_experts, facts.experts_from),
        match &facts.layer_ids {
            Some((_, from)) => format!("layer ids from {from}"),
            None => format!("layer ids 0..{}: the array's indices (no layer_ids given)", layers - 1),
        },
    ];
    notes.push(match (&starts, &seq_offsets) {
        (Some((_, from)), Some(s)) => {
            let sizes = crate::summary::span_sizes(s, kept_tokens);
            let (min, max) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
            format!("{} sequences from {from} (sizes {min}..={max} tokens)", s.len())
        }
        _ => "no sequences (no offsets array, no --chunk)".to_string(),
    });
    notes.push(if padding_rows == 0 {
        "padding: none (no -1)".to_string()
    } else {
        format!("padding: {padding_rows} rows of -1 ({dropped_tokens} tokens padded in every layer, dropped)")
    });
    let mut dropped = Vec::new();
    if dropped_tokens > 0 {
        dropped.push(Dropped {
            reason: DropReason::Padding,
            records: padding_rows as u64,
            tokens: dropped_tokens as u64,
            detail: format!(
                "tokens whose k slots are -1 in every layer (first: token {})",
                keep.iter().position(|&x| !x).unwrap_or(0)
            ),
        });
    }
    let mut extra = BTreeMap::new();
    extra.insert("array".to_string(), at.name.to_string());
    extra.insert("layout".to_string(), facts.layout.to_string());
    extra.insert("padding_tokens_dropped".to_string(), dropped_tokens.to_string());
    if let Some(raw) = &meta.raw {
        extra.insert("numpy_meta".to_string(), raw.clone());
    }
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let trace_meta = TraceMeta {
        model: opts.model.clone().or(meta.model).unwrap_or_else(|| "unknown".into()),
        num_experts: facts.num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind: ScoreKind::None,
        phase: opts.phase.or(meta.phase).unwrap_or(Phase::Unknown),
        source: match meta.source {
            Some(s) => format!("numpy {file}: array `{}` ({s})", at.name),
            None => format!("numpy {file}: array `{}`", at.name),
        },
        extra,
    };
    let sequences = seq_offsets.as_ref().map(Vec::len);
    let parts = OwnedParts { ids, scores: None, gates: None, out_norms: None, seq_offsets, step_offsets: None };
    // Ids that passed the trace's own id check while read are not checked a second time.
    let done = if ids_checked { Reads::ids(k) } else { Reads::NOTHING };
    let trace =
        TraceData::new_validated_before(trace_meta, kept_tokens, k, parts, done).map_err(|e| e.in_file(path))?;
    let report = ImportReport {
        format: FORMAT,
        files: 1,
        records_read: (layers * tokens) as u64,
        layers,
        tokens: kept_tokens,
        sequences,
        steps: None,
        floored_probs: 0,
        dropped,
        notes,
        warnings,
    };
    Ok(Imported { trace, report })
}

fn import_err(path: &Path, message: String) -> TraceError {
    super::import_err(FORMAT, path, None, message)
}

#[cfg(test)]
mod tests;
