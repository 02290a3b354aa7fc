//! Importer for the routed experts SGLang and vLLM return with each response
//! (`return_routed_experts`): one sequence per response (per choice).
//!
//! Input: a JSON file holding one response object or a list of them, or JSON Lines (one response
//! per line). Where each runtime puts the ids (read in their sources; see docs/importers.md):
//!
//! | response | field | encoding |
//! |---|---|---|
//! | SGLang `/generate` | `meta_info.routed_experts` | base64 of the raw bytes of an `int32` `[tokens, layers, k]` array (no shape); `meta_info.prompt_tokens`, `completion_tokens` |
//! | SGLang `/v1/chat/completions`, `/v1/completions` | `choices[i].sglext.routed_experts` | the same; `usage.prompt_tokens`, `completion_tokens` |
//! | vLLM `/v1/chat/completions`, `/v1/completions` | `choices[i].routed_experts` | base64 of `.npy` bytes (`np.save`: shape and dtype inside), or nested JSON lists; older versions put the prompt's rows apart in `prompt_routed_experts` |
//!
//! The rows cover the prompt then the generated tokens but the last (`prompt + completion - 1`
//! rows: the last token sampled is never fed back): the first `prompt_tokens` rows are prefill,
//! the rest decode. A raw SGLang payload holds no shape: the layer count or k comes from
//! [`RoutedExpertsOptions`] (`--num-layers`, `--top-k`), the token count from the response.
//! `-1` rows and layers never written are handled as in the SGLang dump importer (dense layers dropped,
//! padding tokens dropped, mixed k refused). ids only: `m = k`, no scores, no gates. E is not in
//! any response: `--num-experts` gives it.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::Path;

use base64::Engine as _;
use npyz::{DType, NpyHeader, Order, TypeChar};
use serde_json::Value;

use super::id_grid::{self, Axes, Block};
use super::{Dropped, ImportReport, Imported};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceMeta};

const FORMAT: &str = "routed-experts";

/// Options of [`import_routed_experts`].
#[derive(Debug, Clone, Default)]
pub struct RoutedExpertsOptions {
    /// E, routed experts per layer: required (no response records it).
    pub num_experts: Option<u32>,
    /// Layers of the arrays (the model's `num_hidden_layers`), for raw payloads without a shape.
    pub num_layers: Option<usize>,
    /// k of the arrays (`num_experts_per_tok`), for raw payloads without a shape.
    pub top_k: Option<usize>,
    /// Model name for the metadata (default: the response's `model`, else `unknown`).
    pub model: Option<String>,
}

/// One sequence's array, before the shared reduction.
struct Seq {
    /// `[tokens, layers, slots]` ids.
    ids: Vec<i64>,
    tokens: usize,
    layers: usize,
    slots: usize,
    /// Rows of the prompt (prefill), when the response says.
    prompt_rows: Option<usize>,
    /// Where, for errors (`response 3, choices[0].routed_experts`).
    name: String,
}

/// How a payload was encoded (for the report).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Encoding {
    RawInt32,
    Npy,
    Lists,
}

/// Imports the responses in `path` (JSON, or JSON Lines).
///
/// # Errors
/// [`TraceError::Import`](crate::TraceError::Import) naming the file, the response (line or list
/// index) and the field at fault: text that is not JSON (with serde's line and column); a response
/// with none of the fields above (the error lists the fields it has); a payload that is not valid
/// base64, a `.npy` that is not 3-D integers, raw bytes not a whole number of `int32`s or of rows;
/// a raw payload whose shape neither the flags nor the token counts give; arrays of different layer
/// counts or widths; an id below -1, `>= num_experts`, repeated in a row; a row with fewer ids than
/// k (mixed k); a token padded in some layers only; no routing in any response; no `--num-experts`.
pub fn import_routed_experts(path: impl AsRef<Path>, opts: &RoutedExpertsOptions) -> Result<Imported> {
    let path = path.as_ref();
    let err = |m: String| super::import_err(FORMAT, path, None, m);
    let text = std::io::read_to_string(crate::open_regular_file(path).map_err(|e| err(format!("cannot open: {e}")))?)
        .map_err(|e| err(format!("cannot read as UTF-8 text: {e}")))?;
    let text = text.strip_prefix('\u{feff}').unwrap_or(&text);
    // One JSON document (a response or a list of them), else JSON Lines.
    let responses: Vec<(String, Option<usize>, Value)> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => {
            items.into_iter().enumerate().map(|(i, v)| (format!("response [{i}]"), None, v)).collect()
        }
        Ok(v @ Value::Object(_)) => vec![("the response".to_string(), None, v)],
        Ok(v) => {
            return Err(err(format!(
                "the file holds a JSON {}, expected a response object or a list of them",
                kind(&v)
            )));
        }
        Err(whole) if text.trim_start().starts_with('[') => {
            return Err(err(format!("not JSON: {whole} (a list of responses, cut or damaged)")));
        }
        Err(whole) => {
            let mut out = Vec::new();
            for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                let v: Value = serde_json::from_str(line).map_err(|e| {
                    let why = if i == 0 { format!(" (as one JSON document: {whole})") } else { String::new() };
                    super::import_err(FORMAT, path, Some(i + 1), format!("not JSON: {e}{why}"))
                })?;
                out.push((format!("line {}", i + 1), Some(i + 1), v));
            }
            out
        }
    };
    if responses.is_empty() {
        return Err(err("no responses: the file is empty".into()));
    }
    let Some(num_experts) = opts.num_experts else {
        return Err(err("--num-experts is required: no response records the number of routed experts".into()));
    };
    let mut seqs = Vec::new();
    let mut encodings = Vec::new();
    let (mut nulls, mut model) = (0usize, None::<String>);
    for (name, line, v) in &responses {
        let rerr = |m: String| super::import_err(FORMAT, path, *line, format!("{name}: {m}"));
        let Value::Object(resp) = v else {
            return Err(rerr(format!("a JSON {}, expected a response object", kind(v))));
        };
        if model.is_none() {
            model = resp.get("model").and_then(Value::as_str).map(str::to_string);
        }
        let found = sequences(resp, opts).map_err(&rerr)?;
        if found.is_empty() {
            return Err(rerr(format!(
                "no routed experts: expected `meta_info.routed_experts` (SGLang /generate), \
                 `choices[].sglext.routed_experts` (SGLang OpenAI API) or `choices[].routed_experts` (vLLM); \
                 the response has fields {}",
                resp.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
            )));
        }
        for f in found {
            match f {
                Found::Null => nulls += 1,
                Found::Seq(s, e) => {
                    if !encodings.contains(&e) {
                        encodings.push(e);
                    }
                    seqs.push(Seq { name: format!("{name}, {}", s.name), ..s });
                }
            }
        }
    }
    if seqs.is_empty() {
        return Err(err(format!(
            "every routed-experts field is null ({nulls}): start the server with --enable-return-routed-experts and \
             send return_routed_experts: true with each request"
        )));
    }
    let (layers, slots) = (seqs[0].layers, seqs[0].slots);
    if let Some(s) = seqs.iter().find(|s| (s.layers, s.slots) != (layers, slots)) {
        return Err(err(format!(
            "{}: [{}, {}, {}], the first array [_, {layers}, {slots}]: one file holds one model (or mixed k)",
            s.name, s.tokens, s.layers, s.slots
        )));
    }
    let blocks: Vec<Block> = seqs
        .iter_mut()
        .map(|s| Block { ids: std::mem::take(&mut s.ids), tokens: s.tokens, name: s.name.clone() })
        .collect();
    let e = i64::from(num_experts);
    let r = id_grid::reduce(&blocks, Axes::Tlk, layers, slots, |_, x| {
        if x >= e {
            return Err(format!("expert id {x} >= num_experts {num_experts}"));
        }
        u16::try_from(x).map_err(|_| format!("expert id {x} past u16"))
    })
    .map_err(err)?;
    // Sequences, phases.
    let kept = r.kept();
    let mut seq_offsets = Vec::new();
    let (mut at, mut prefill, mut decode, mut unsplit) = (0u64, 0usize, 0usize, 0usize);
    for ((s, keep), &n) in seqs.iter().zip(&r.keep).zip(&kept) {
        if n == 0 {
            continue;
        }
        seq_offsets.push(at);
        at += n as u64;
        match s.prompt_rows {
            Some(p) => {
                let p = p.min(s.tokens);
                let pk = keep[..p].iter().filter(|&&x| x).count();
                prefill += pk;
                decode += n - pk;
            }
            None => unsplit += n,
        }
    }
    let tokens = at as usize;
    let phase = match (prefill > 0, decode > 0, unsplit > 0) {
        (_, _, true) => Phase::Unknown,
        (true, false, false) => Phase::Prefill,
        (false, true, false) => Phase::Decode,
        _ => Phase::Mixed,
    };
    let mut notes = vec![format!(
        "{} responses, {} sequences with routing{}; encoding: {}",
        responses.len(),
        seqs.len(),
        if nulls > 0 {
            format!(" ({nulls} routed-experts fields null: aborted requests, or capture off)")
        } else {
            String::new()
        },
        encodings
            .iter()
            .map(|e| match e {
                Encoding::RawInt32 => "base64 of raw int32 bytes (SGLang)",
                Encoding::Npy => "base64 of .npy bytes (vLLM)",
                Encoding::Lists => "JSON lists",
            })
            .collect::<Vec<_>>()
            .join(", ")
    )];
    notes.push(format!(
        "arrays [tokens, {layers} layers, {slots}]; k = {}{}; E = {num_experts} (--num-experts); m = k: ids only, no scores, no gates",
        r.k,
        if slots > r.k { format!(" ({} trailing columns -1 in every row)", slots - r.k) } else { String::new() }
    ));
    notes.push(if r.unrouted_layers.is_empty() {
        format!("layers: all {layers} routed (layer ids 0..{})", layers - 1)
    } else {
        format!(
            "layers: {} routed, ids {}; layers {} never routed (every row -1 or zeros: dense layers), dropped",
            r.layers.len(),
            id_grid::ranges(&r.layers),
            id_grid::ranges(&r.unrouted_layers)
        )
    });
    notes.push(if unsplit == 0 {
        format!(
            "{prefill} prompt (prefill) and {decode} completion (decode) tokens: rows are prompt + completion - 1 (the \
             last sampled token is never forwarded)"
        )
    } else {
        format!(
            "prompt and completion rows told apart for {} of {} tokens: the other responses' row counts are not \
             prompt_tokens + completion_tokens - 1 (phase unknown)",
            prefill + decode,
            tokens
        )
    });
    let dropped_tokens = r.dropped();
    if r.blank_rows > 0 {
        notes.push(format!(
            "padding: {} rows of -1 or unwritten zeros ({} zeros); {dropped_tokens} tokens padded in every routed layer, \
             dropped",
            r.blank_rows, r.zero_rows
        ));
    }
    let dropped: Vec<Dropped> =
        r.padding_dropped("tokens whose ids are -1 (or unwritten zeros) in every routed layer").into_iter().collect();
    let mut extra = BTreeMap::new();
    extra.insert("prefill_tokens".to_string(), prefill.to_string());
    extra.insert("decode_tokens".to_string(), decode.to_string());
    extra.insert("padding_tokens_dropped".to_string(), dropped_tokens.to_string());
    if !r.unrouted_layers.is_empty() {
        extra.insert("unrouted_layers_dropped".to_string(), id_grid::ranges(&r.unrouted_layers));
    }
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let k = r.k;
    let layer_ids: Vec<u32> = r.layers.iter().map(|&l| l as u32).collect();
    let meta = TraceMeta {
        model: opts.model.clone().or(model).unwrap_or_else(|| "unknown".into()),
        num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind: ScoreKind::None,
        phase,
        source: format!("routed-experts {file}: routed experts returned with {} responses", responses.len()),
        extra,
    };
    let sequences = seq_offsets.len();
    let routed_layers = r.layers.len();
    let parts = OwnedParts {
        ids: r.ids,
        scores: None,
        gates: None,
        out_norms: None,
        seq_offsets: Some(seq_offsets),
        step_offsets: None,
    };
    let trace = TraceData::new(meta, tokens, k, parts).map_err(|e| e.in_file(path))?;
    let report = ImportReport {
        format: FORMAT,
        files: 1,
        records_read: seqs.iter().map(|s| (s.tokens * s.layers) as u64).sum(),
        layers: routed_layers,
        tokens,
        sequences: Some(sequences),
        steps: None,
        floored_probs: 0,
        dropped,
        notes,
        warnings: Vec::new(),
    };
    Ok(Imported { trace, report })
}

/// A routed-experts field found in a response.
enum Found {
    Null,
    Seq(Seq, Encoding),
}

/// Every routed-experts field of one response.
fn sequences(
    resp: &serde_json::Map<String, Value>,
    opts: &RoutedExpertsOptions,
) -> std::result::Result<Vec<Found>, String> {
    let int = |v: Option<&Value>| v.and_then(Value::as_u64).map(|n| n as usize);
    // SGLang /generate.
    if let Some(Value::Object(meta)) = resp.get("meta_info")
        && let Some(v) = meta.get("routed_experts")
    {
        let (p, c) = (int(meta.get("prompt_tokens")), int(meta.get("completion_tokens")));
        return Ok(vec![payload(v, "meta_info.routed_experts", rows_of(p, c), p, opts)?]);
    }
    let usage = resp.get("usage");
    let (up, uc) =
        (int(usage.and_then(|u| u.get("prompt_tokens"))), int(usage.and_then(|u| u.get("completion_tokens"))));
    let prompt = up.or_else(|| resp.get("prompt_token_ids").and_then(Value::as_array).map(Vec::len));
    let prompt_part = resp.get("prompt_routed_experts").filter(|v| !v.is_null());
    let Some(Value::Array(choices)) = resp.get("choices") else { return Ok(Vec::new()) };
    let single = choices.len() == 1;
    let mut out = Vec::new();
    for (i, ch) in choices.iter().enumerate() {
        let Value::Object(ch) = ch else { continue };
        // This choice's completion tokens: its token_ids, else the usage when it is the only choice.
        let completion = ch.get("token_ids").and_then(Value::as_array).map(Vec::len).or(if single { uc } else { None });
        let (field, v) = match (ch.get("sglext").and_then(|x| x.get("routed_experts")), ch.get("routed_experts")) {
            (Some(v), _) => (format!("choices[{i}].sglext.routed_experts"), v),
            (None, Some(v)) => (format!("choices[{i}].routed_experts"), v),
            (None, None) => continue,
        };
        match prompt_part {
            // Older vLLM: the prompt's rows apart, the completion's on the choice.
            Some(pv) => {
                let pf = payload(pv, "prompt_routed_experts", prompt, None, opts)?;
                let cf = payload(v, &field, completion.map(|c| c.saturating_sub(1)), Some(0), opts)?;
                out.push(join(pf, cf, &field)?);
            }
            None => out.push(payload(v, &field, rows_of(prompt, completion), prompt, opts)?),
        }
    }
    Ok(out)
}

/// `prompt + completion - 1`, the rows a response's array holds, when both are known.
fn rows_of(prompt: Option<usize>, completion: Option<usize>) -> Option<usize> {
    Some((prompt? + completion?).saturating_sub(1))
}

/// The prompt's rows and a choice's rows as one sequence.
fn join(p: Found, c: Found, field: &str) -> std::result::Result<Found, String> {
    match (p, c) {
        (Found::Seq(p, e), Found::Seq(c, _)) => {
            if (p.layers, p.slots) != (c.layers, c.slots) {
                return Err(format!(
                    "prompt_routed_experts is [_, {}, {}], {field} [_, {}, {}]",
                    p.layers, p.slots, c.layers, c.slots
                ));
            }
            let mut ids = p.ids;
            ids.extend(c.ids);
            let seq =
                Seq { ids, tokens: p.tokens + c.tokens, prompt_rows: Some(p.tokens), name: field.to_string(), ..p };
            Ok(Found::Seq(seq, e))
        }
        (Found::Seq(p, e), Found::Null) => Ok(Found::Seq(Seq { prompt_rows: Some(p.tokens), ..p }, e)),
        (Found::Null, c) => Ok(c),
    }
}

/// One payload: null, base64 (raw int32 or `.npy`), or nested lists; `rows` is the row count the
/// response implies (used for a raw payload's shape and for the prompt split), `prompt` the rows of
/// the prompt.
fn payload(
    v: &Value,
    field: &str,
    rows: Option<usize>,
    prompt: Option<usize>,
    opts: &RoutedExpertsOptions,
) -> std::result::Result<Found, String> {
    let ferr = |m: String| format!("`{field}`: {m}");
    let (ids, shape, enc) = match v {
        Value::Null => return Ok(Found::Null),
        Value::String(s) => {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(s.trim())
                .map_err(|e| ferr(format!("not base64 ({e})")))?;
            if bytes.starts_with(b"\x93NUMPY") {
                let (ids, shape) = npy(&bytes).map_err(&ferr)?;
                (ids, shape, Encoding::Npy)
            } else {
                let (ids, shape) = raw_int32(&bytes, rows, opts).map_err(&ferr)?;
                (ids, shape, Encoding::RawInt32)
            }
        }
        Value::Array(_) => {
            let (ids, shape) = lists(v).map_err(&ferr)?;
            (ids, shape, Encoding::Lists)
        }
        other => return Err(ferr(format!("a JSON {}, expected a base64 string or nested lists", kind(other)))),
    };
    let [tokens, layers, slots] = shape;
    for (what, flag, got) in [("layers", opts.num_layers, layers), ("k", opts.top_k, slots)] {
        if let Some(f) = flag
            && f != got
        {
            return Err(ferr(format!("the array has {got} {what}, the flag says {f}")));
        }
    }
    // The prompt's rows, when the row count is the one the response implies.
    let prompt_rows = match (rows, prompt) {
        (Some(r), Some(p)) if r == tokens => Some(p.min(tokens)),
        _ => None,
    };
    Ok(Found::Seq(Seq { ids, tokens, layers, slots, prompt_rows, name: field.to_string() }, enc))
}

/// Raw little-endian `int32` bytes (SGLang: `tensor.numpy().tobytes()`): the shape from the flags
/// and the row count.
fn raw_int32(
    bytes: &[u8],
    rows: Option<usize>,
    opts: &RoutedExpertsOptions,
) -> std::result::Result<(Vec<i64>, [usize; 3]), String> {
    let (quads, rest) = bytes.as_chunks::<4>();
    if !rest.is_empty() {
        return Err(format!("{} bytes: not a whole number of int32 ids (4 bytes each)", bytes.len()));
    }
    let n = quads.len();
    let per_row = match (opts.num_layers, opts.top_k, rows) {
        (Some(l), Some(k), _) => l * k,
        (_, _, Some(r)) if r > 0 && n % r == 0 => n / r,
        _ => {
            return Err(format!(
                "{n} int32 ids with no shape (raw bytes): give --num-layers and --top-k, or responses with \
                 prompt_tokens and completion_tokens"
            ));
        }
    };
    if per_row == 0 || n % per_row != 0 {
        return Err(format!("{n} ids are not a whole number of rows of {per_row} (layers x k)"));
    }
    let tokens = n / per_row;
    let (layers, k) = match (opts.num_layers, opts.top_k) {
        (Some(l), _) if per_row % l == 0 => (l, per_row / l),
        (_, Some(k)) if per_row % k == 0 => (per_row / k, k),
        _ => return Err(format!("rows of {per_row} ids: give --num-layers or --top-k to split them into layers x k")),
    };
    Ok((quads.iter().map(|q| i64::from(i32::from_le_bytes(*q))).collect(), [tokens, layers, k]))
}

/// `.npy` bytes (vLLM: `np.save` of the array): a 3-D integer array, C order.
fn npy(bytes: &[u8]) -> std::result::Result<(Vec<i64>, [usize; 3]), String> {
    let mut cur = Cursor::new(bytes);
    let h = NpyHeader::from_reader(&mut cur).map_err(|e| format!("not a readable .npy: {e}"))?;
    let data = &bytes[cur.position() as usize..];
    let DType::Plain(ts) = h.dtype() else { return Err(format!("dtype {}: expected integer ids", h.dtype().descr())) };
    let signed = match ts.type_char() {
        TypeChar::Int => true,
        TypeChar::Uint => false,
        _ => return Err(format!("dtype {ts}: expected integer ids (i1-i8, u1-u8)")),
    };
    let size = ts.size_field() as usize;
    let big = ts.endianness() == npyz::Endianness::Big;
    let shape: Vec<usize> = h.shape().iter().map(|&d| d as usize).collect();
    let [t, l, k] = shape[..] else { return Err(format!("shape {shape:?}: expected [tokens, layers, k]")) };
    if h.order() == Order::Fortran && shape.iter().filter(|&&d| d > 1).count() > 1 {
        return Err("Fortran order: only C order is read".into());
    }
    let n = t.checked_mul(l).and_then(|x| x.checked_mul(k)).ok_or_else(|| format!("shape {shape:?} overflows"))?;
    if ![1, 2, 4, 8].contains(&size) || data.len() / size < n {
        return Err(format!(
            "shape {shape:?} of {ts} needs {} bytes, the payload holds {} (truncated)",
            n * size,
            data.len()
        ));
    }
    let get = |c: &[u8]| -> i64 {
        let mut b = [0u8; 8];
        if big {
            b[8 - size..].copy_from_slice(c);
        } else {
            b[..size].copy_from_slice(c);
        }
        let u = if big { u64::from_be_bytes(b) } else { u64::from_le_bytes(b) };
        if signed {
            let shift = 64 - 8 * size as u32;
            ((u << shift) as i64) >> shift
        } else {
            i64::try_from(u).unwrap_or(i64::MAX)
        }
    };
    Ok((data[..n * size].chunks_exact(size).map(get).collect(), [t, l, k]))
}

/// Nested JSON lists `[tokens][layers][k]`.
fn lists(v: &Value) -> std::result::Result<(Vec<i64>, [usize; 3]), String> {
    let arr = |v: &Value, at: String| {
        v.as_array().cloned().ok_or_else(|| format!("{at} is a JSON {}, expected a list", kind(v)))
    };
    let toks = arr(v, "the value".into())?;
    let (mut layers, mut k) = (None, None);
    let mut ids = Vec::new();
    for (t, row) in toks.iter().enumerate() {
        let ls = arr(row, format!("[{t}]"))?;
        if *layers.get_or_insert(ls.len()) != ls.len() {
            return Err(format!("[{t}] holds {} layers, [0] {}", ls.len(), layers.unwrap_or(0)));
        }
        for (l, slots) in ls.iter().enumerate() {
            let ss = arr(slots, format!("[{t}][{l}]"))?;
            if *k.get_or_insert(ss.len()) != ss.len() {
                return Err(format!("[{t}][{l}] holds {} ids, [0][0] {} (mixed k)", ss.len(), k.unwrap_or(0)));
            }
            for (s, x) in ss.iter().enumerate() {
                ids.push(x.as_i64().ok_or_else(|| format!("[{t}][{l}][{s}] = {x}: not an integer id"))?);
            }
        }
    }
    Ok((ids, [toks.len(), layers.unwrap_or(0), k.unwrap_or(0)]))
}

/// A JSON value's kind in words.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests;
