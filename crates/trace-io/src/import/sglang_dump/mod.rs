//! Importer for SGLang's `per_token` expert-distribution dumps (`torch.save` files).
//!
//! SGLang started with `--expert-distribution-recorder-mode per_token` records, between
//! `POST /start_expert_distribution_record` and `POST /dump_expert_distribution_record`, one
//! record per forward pass and writes, per rank, `expert_distribution_recorder_<time>_<rank>.pt`
//! into `SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR` (`/tmp` by default):
//!
//! ```text
//! {"records": [{"forward_pass_id": int, "rank": int, "gatherer_key": "primary",
//!               "input_ids": [n ints], "positions": [n ints],
//!               "extend_seq_lens": [ints] or None (decode), "forward_mode": int,
//!               "topk_ids_of_layer": int32 tensor [num_layers, n, 8],
//!               "misc_objects": [...], "global_physical_count": tensor}, ...],
//!  "last_physical_to_logical_map": int tensor [num_layers, num_physical_experts]}
//! ```
//!
//! (`python/sglang/srt/eplb/expert_distribution.py`: `_DetailSinglePassGatherer`,
//! `_DetailAccumulator.dump`.) The ids tensor keeps 8 columns whatever the model's top-k and is
//! reset to -1 before every pass: the trailing all -1 columns are padding (k = the columns used),
//! layers never written (dense layers) are dropped, and tokens that are -1 in every routed layer
//! (padded tokens) are dropped; a row with a -1 among its k ids (mixed k), or a token padded in
//! some routed layers only, is refused. With EPLB redundancy the ids are physical
//! slots: they are mapped to logical experts through `last_physical_to_logical_map`.
//!
//! `forward_mode` (the `ForwardMode` enum's value): 1 extend (prefill), 2 decode, 3 mixed
//! (chunked prefill with decodes), 4 idle (no tokens); passes of other modes (speculative
//! verification and draft passes, whose numbering changed between SGLang versions) are dropped and
//! reported. Every pass with tokens is an engine step (`step_offsets`). Sequences: the dump names no
//! request, so sequence starts are written only when every pass is a prefill of whole prompts
//! (every `extend_seq_lens` segment starts at position 0); otherwise requests interleave across
//! passes and the trace has no `seq_offsets` (the report counts prompts started and continued).

use std::collections::BTreeMap;
use std::path::Path;

use pytorch_reader::PickleValue;

use super::id_grid::{self, Axes, Block};
use super::{DropReason, Dropped, ImportReport, Imported};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceMeta};

mod torch;

use torch::{TorchFile, int_list, type_name};

const FORMAT: &str = "sglang-dump";

/// Keys of a record this importer knows (read or deliberately ignored).
const RECORD_KEYS: [&str; 10] = [
    "forward_pass_id",
    "rank",
    "gatherer_key",
    "input_ids",
    "positions",
    "extend_seq_lens",
    "forward_mode",
    "topk_ids_of_layer",
    "misc_objects",
    "global_physical_count",
];

/// Options of [`import_sglang_dump`].
#[derive(Debug, Clone, Default)]
pub struct SglangDumpOptions {
    /// E, logical routed experts per layer (default: the physical-to-logical map's largest
    /// expert + 1; required when the file has no map).
    pub num_experts: Option<u32>,
    /// Model name for the metadata (default `unknown`: the dump does not record it).
    pub model: Option<String>,
}

/// The kind of a forward pass, from its `forward_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Extend,
    Decode,
    Mixed,
    Idle,
    Other(i64),
}

impl Mode {
    fn of(v: i64) -> Mode {
        match v {
            1 => Mode::Extend,
            2 => Mode::Decode,
            3 => Mode::Mixed,
            4 => Mode::Idle,
            n => Mode::Other(n),
        }
    }
}

/// A forward pass kept for the trace.
struct Pass {
    mode: Mode,
    /// `extend_seq_lens` segments: (first token, tokens, first position).
    segments: Vec<(usize, usize, i64)>,
}

/// Imports the SGLang `per_token` dump at `path`.
///
/// # Errors
/// [`TraceError::Import`](crate::TraceError::Import) naming the file and the record, key and element at fault: a file that is
/// not a `torch.save` zip or is truncated or damaged; a dump of another recorder mode (`stat`: no
/// `records`); a record without one of `input_ids`, `positions`, `forward_mode`,
/// `topk_ids_of_layer`, or with a value of the wrong type; ids that are not integers; shapes that
/// disagree (between records, with `input_ids`, with the map); `extend_seq_lens` that do not add up
/// to the tokens, or positions that do not count up within a segment; an id below -1, past the
/// map's physical slots or `>= num_experts`, repeated in a row; a row with fewer ids than k (mixed
/// k); a token padded in some layers only; no routing at all; no map and no `--num-experts`.
pub fn import_sglang_dump(path: impl AsRef<Path>, opts: &SglangDumpOptions) -> Result<Imported> {
    let path = path.as_ref();
    let err = |m: String| super::import_err(FORMAT, path, None, m);
    let tf = TorchFile::open(path).map_err(err)?;
    let PickleValue::Dict(root) = &tf.root else {
        return Err(err(format!(
            "the file holds a {}, expected the dict SGLang's per_token recorder dumps (`records`, \
             `last_physical_to_logical_map`)",
            type_name(&tf.root)
        )));
    };
    let Some(records) = root.get("records") else {
        let mut keys: Vec<&str> = root.keys().map(String::as_str).collect();
        keys.sort_unstable();
        let hint = if root.contains_key("logical_count") {
            ": this is a `stat`-mode dump (per-expert counts, `logical_count`), not routing; start SGLang with \
             --expert-distribution-recorder-mode per_token to record every token's experts"
        } else {
            ""
        };
        return Err(err(format!("no key `records` (the file has keys {}){hint}", keys.join(", "))));
    };
    let PickleValue::List(records) = records else {
        return Err(err(format!("`records` is a {}, expected a list of per-pass dicts", type_name(records))));
    };
    let mut unknown: Vec<String> =
        root.keys().filter(|k| !["records", "last_physical_to_logical_map"].contains(&k.as_str())).cloned().collect();
    // The physical-to-logical map.
    let map_key = "last_physical_to_logical_map";
    let map = tf.ints(map_key).map_err(|m| err(format!("`{map_key}`: {m}")))?;
    let map = match map {
        Some((v, shape)) => {
            let [ml, mp] = shape[..] else {
                return Err(err(format!("`{map_key}`: shape {shape:?}, expected [num_layers, num_physical_experts]")));
            };
            if let Some(i) = v.iter().position(|&x| x < 0) {
                return Err(err(format!(
                    "`{map_key}`[{}, {}] = {}: not an expert id",
                    i / mp.max(1),
                    i % mp.max(1),
                    v[i]
                )));
            }
            Some((v, ml, mp))
        }
        None if root.contains_key(map_key) => {
            return Err(err(format!("`{map_key}` is a {}, expected a tensor", type_name(&root[map_key]))));
        }
        None => None,
    };
    // The records.
    let mut blocks = Vec::new();
    let mut passes = Vec::new();
    let mut shape_of: Option<(usize, usize, usize)> = None; // (record, layers, slots)
    let (mut idle, mut other, mut other_tokens, mut other_modes) = (0usize, 0usize, 0u64, Vec::new());
    let mut records_read = 0u64;
    for (i, rec) in records.iter().enumerate() {
        let rerr = |m: String| err(format!("records[{i}]: {m}"));
        let PickleValue::Dict(rec) = rec else {
            return Err(rerr(format!("a {}, expected a dict", type_name(rec))));
        };
        let get = |key: &str| {
            rec.get(key).ok_or_else(|| {
                let mut keys: Vec<&str> = rec.keys().map(String::as_str).collect();
                keys.sort_unstable();
                rerr(format!("no key `{key}` (the record has keys {})", keys.join(", ")))
            })
        };
        for k in rec.keys().filter(|k| !RECORD_KEYS.contains(&k.as_str())) {
            if !unknown.iter().any(|u| u == &format!("records[].{k}")) {
                unknown.push(format!("records[].{k}"));
            }
        }
        let input_ids = int_list(get("input_ids")?).map_err(|m| rerr(format!("`input_ids`: {m}")))?;
        let n = input_ids.len();
        let positions = int_list(get("positions")?).map_err(|m| rerr(format!("`positions`: {m}")))?;
        if positions.len() != n {
            return Err(rerr(format!("`positions` holds {} entries, `input_ids` {n}", positions.len())));
        }
        let mode = match get("forward_mode")? {
            PickleValue::Int(v) => Mode::of(*v),
            v => return Err(rerr(format!("`forward_mode` is a {}, expected an int", type_name(v)))),
        };
        let key = format!("records.{i}.topk_ids_of_layer");
        let (ids, shape) = match tf.ints(&key).map_err(|m| rerr(format!("`topk_ids_of_layer`: {m}")))? {
            Some(x) => x,
            None => {
                let v = get("topk_ids_of_layer")?;
                return Err(rerr(format!("`topk_ids_of_layer` is a {}, expected a tensor", type_name(v))));
            }
        };
        let [layers, tokens, slots] = shape[..] else {
            return Err(rerr(format!("`topk_ids_of_layer` has shape {shape:?}, expected [num_layers, tokens, 8]")));
        };
        if tokens != n {
            return Err(rerr(format!("`topk_ids_of_layer` has shape {shape:?}: {tokens} tokens, `input_ids` {n}")));
        }
        match shape_of {
            None => shape_of = Some((i, layers, slots)),
            Some((j, l, s)) if (l, s) != (layers, slots) => {
                return Err(rerr(format!(
                    "`topk_ids_of_layer` has shape {shape:?}, records[{j}]'s [{l}, _, {s}]: one dump holds one model"
                )));
            }
            _ => {}
        }
        records_read += (layers * n) as u64;
        match mode {
            Mode::Idle if n > 0 => return Err(rerr(format!("forward_mode 4 (idle) with {n} tokens"))),
            Mode::Idle => {
                idle += 1;
                continue;
            }
            Mode::Other(m) => {
                other += 1;
                other_tokens += n as u64;
                if !other_modes.contains(&m) {
                    other_modes.push(m);
                }
                continue;
            }
            _ if n == 0 => {
                idle += 1;
                continue;
            }
            _ => {}
        }
        let segments = segments(get("extend_seq_lens")?, &positions, mode).map_err(rerr)?;
        blocks.push(Block { ids, tokens: n, name: format!("records[{i}].topk_ids_of_layer") });
        passes.push(Pass { mode, segments });
    }
    let Some((_, layers, slots)) = shape_of else {
        return Err(err("`records` is empty: nothing was recorded between start and dump".into()));
    };
    if blocks.is_empty() {
        return Err(err(format!(
            "no forward pass with tokens ({} records: {idle} idle or empty, {other} of other modes)",
            records.len()
        )));
    }
    // E and the map.
    let (num_experts, experts_from) = match (&map, opts.num_experts) {
        (Some((v, ..)), e) => {
            let logical = v.iter().max().map_or(0, |&m| m + 1);
            match e {
                Some(e) if i64::from(e) < logical => {
                    return Err(err(format!(
                        "--num-experts {e}, but `{map_key}` maps slots to expert ids up to {}",
                        logical - 1
                    )));
                }
                Some(e) => (e, "--num-experts".to_string()),
                None => (
                    u32::try_from(logical).map_err(|_| err(format!("`{map_key}`: expert ids past u32")))?,
                    format!("`{map_key}`: its largest expert + 1"),
                ),
            }
        }
        (None, Some(e)) => (e, "--num-experts".into()),
        (None, None) => {
            return Err(err(format!(
                "no `{map_key}` in the file and no --num-experts: the number of experts is unknown"
            )));
        }
    };
    if let Some((_, ml, _)) = &map
        && *ml != layers
    {
        return Err(err(format!("`{map_key}` has {ml} layers, `topk_ids_of_layer` {layers}")));
    }
    let e = i64::from(num_experts);
    let reduced = id_grid::reduce(&blocks, Axes::Ltk, layers, slots, |l, x| {
        let logical = match &map {
            Some((v, _, mp)) => {
                if x >= *mp as i64 {
                    return Err(format!("physical slot {x} >= the map's {mp} slots (`{map_key}`)"));
                }
                v[l * mp + x as usize]
            }
            None => x,
        };
        if logical >= e {
            return Err(format!("expert id {logical} >= num_experts {num_experts}"));
        }
        u16::try_from(logical).map_err(|_| format!("expert id {logical} past u16"))
    })
    .map_err(|m| {
        let hint = if m.contains("repeated") && map.as_ref().is_some_and(|(_, _, mp)| *mp as i64 > e) {
            " (after mapping physical slots to logical experts: the map may have changed during the recording, \
             an EPLB rebalancing; SGLang dumps only the last one)"
        } else {
            ""
        };
        err(format!("{m}{hint}"))
    })?;
    unknown.sort();
    let counts = Counts { records: records.len(), records_read, idle, other, other_tokens, other_modes, unknown };
    finish(path, opts, Built { reduced, passes, layers, num_experts, experts_from, map }, counts)
}

/// The segments of a pass: `extend_seq_lens` (decode: one token each) checked against the tokens
/// and positions.
fn segments(
    lens: &PickleValue,
    positions: &[i64],
    mode: Mode,
) -> std::result::Result<Vec<(usize, usize, i64)>, String> {
    let n = positions.len();
    let lens: Vec<i64> = match (lens, mode) {
        (PickleValue::None, Mode::Decode) => vec![1; n],
        (PickleValue::None, _) => return Err("`extend_seq_lens` is None in an extend pass".into()),
        (v, _) => int_list(v).map_err(|m| format!("`extend_seq_lens`: {m}"))?,
    };
    let sum: i64 = lens.iter().sum();
    if let Some(i) = lens.iter().position(|&x| x <= 0) {
        return Err(format!("`extend_seq_lens`[{i}] = {}: a segment holds at least one token", lens[i]));
    }
    if sum != n as i64 {
        return Err(format!("`extend_seq_lens` {lens:?} add up to {sum} tokens, the pass has {n}"));
    }
    let mut out = Vec::with_capacity(lens.len());
    let mut start = 0usize;
    for (s, &len) in lens.iter().enumerate() {
        let len = len as usize;
        let seg = &positions[start..start + len];
        if seg[0] < 0 {
            return Err(format!("`positions`[{start}] = {}: negative", seg[0]));
        }
        if let Some(j) = seg.windows(2).position(|w| w[1] != w[0] + 1) {
            return Err(format!(
                "`positions`[{}] = {} after {} in segment {s} of `extend_seq_lens`: a request's tokens count up by one",
                start + j + 1,
                seg[j + 1],
                seg[j]
            ));
        }
        out.push((start, len, seg[0]));
        start += len;
    }
    Ok(out)
}

/// What the records gave, for [`finish`].
struct Built {
    reduced: id_grid::Reduced,
    passes: Vec<Pass>,
    layers: usize,
    num_experts: u32,
    experts_from: String,
    map: Option<(Vec<i64>, usize, usize)>,
}

/// What was counted while reading.
struct Counts {
    records: usize,
    records_read: u64,
    idle: usize,
    other: usize,
    other_tokens: u64,
    other_modes: Vec<i64>,
    unknown: Vec<String>,
}

/// Builds the trace and the report from what the records gave.
fn finish(path: &Path, opts: &SglangDumpOptions, b: Built, c: Counts) -> Result<Imported> {
    let mut notes = Vec::new();
    let mut warnings = Vec::new();
    let r = &b.reduced;
    let k = r.k;
    let kept = r.kept();
    let tokens: usize = kept.iter().sum();
    // Steps: one per pass with kept tokens.
    let mut step_offsets = Vec::new();
    let mut at = 0u64;
    for &n in &kept {
        if n > 0 {
            step_offsets.push(at);
        }
        at += n as u64;
    }
    // Tokens per phase, requests started and continued.
    let (mut prefill, mut decode, mut mixed) = (0usize, 0usize, 0usize);
    let (mut started, mut continued) = (0usize, 0usize);
    for (p, &n) in b.passes.iter().zip(&kept) {
        match p.mode {
            Mode::Extend => prefill += n,
            Mode::Decode => decode += n,
            _ => mixed += n,
        }
        if p.mode != Mode::Decode {
            for &(_, _, first) in &p.segments {
                if first == 0 { started += 1 } else { continued += 1 }
            }
        }
    }
    let phase = match (prefill > 0, decode > 0, mixed > 0) {
        (true, false, false) => Phase::Prefill,
        (false, true, false) => Phase::Decode,
        _ => Phase::Mixed,
    };
    // Sequences: only when every pass is a prefill of whole prompts.
    let whole_prompts = b.passes.iter().all(|p| p.mode == Mode::Extend && p.segments.iter().all(|s| s.2 == 0));
    let seq_offsets = whole_prompts.then(|| {
        let mut out = Vec::new();
        let mut base = 0u64;
        for (p, keep) in b.passes.iter().zip(&r.keep) {
            for &(start, len, _) in &p.segments {
                let before = keep[..start].iter().filter(|&&x| x).count() as u64;
                if keep[start..start + len].iter().any(|&x| x) {
                    out.push(base + before);
                }
            }
            base += keep.iter().filter(|&&x| x).count() as u64;
        }
        out
    });
    notes.push(format!(
        "{} records (forward passes): {} with tokens ({} prefill, {} decode, {} mixed tokens), {} idle or empty{}",
        c.records,
        b.passes.len(),
        prefill,
        decode,
        mixed,
        c.idle,
        if c.other > 0 { format!(", {} of other modes dropped", c.other) } else { String::new() }
    ));
    notes.push(format!(
        "topk_ids_of_layer: [{} layers, tokens, {} columns] per pass; k = {}{}",
        b.layers,
        r.slots,
        r.k,
        if r.slots > r.k {
            format!(
                " ({} trailing columns -1 in every row: SGLang's recorder keeps {} columns)",
                r.slots - r.k,
                r.slots
            )
        } else {
            String::new()
        }
    ));
    notes.push(if r.unrouted_layers.is_empty() {
        format!("layers: all {} routed (layer ids 0..{})", b.layers, b.layers - 1)
    } else {
        format!(
            "layers: {} routed, ids {}; layers {} never routed (every row -1: dense layers), dropped",
            r.layers.len(),
            id_grid::ranges(&r.layers),
            id_grid::ranges(&r.unrouted_layers)
        )
    });
    let map_words = match &b.map {
        Some((v, ml, mp)) => {
            let identity = *mp as u32 == b.num_experts && (0..*ml).all(|l| (0..*mp).all(|p| v[l * mp + p] == p as i64));
            if identity {
                "ids: logical experts (`last_physical_to_logical_map` is the identity: no EPLB redundancy)".to_string()
            } else {
                format!(
                    "ids: physical slots ({mp} per layer for {} logical experts: EPLB placement), mapped to logical \
                     experts through `last_physical_to_logical_map` (the map when the dump was written)",
                    b.num_experts
                )
            }
        }
        None => "ids: taken as logical experts (the file has no `last_physical_to_logical_map`)".to_string(),
    };
    notes.push(format!("E = {} ({}); m = k = {}: ids only, no scores, no gates", b.num_experts, b.experts_from, r.k));
    notes.push(map_words.clone());
    notes.push(match &seq_offsets {
        Some(s) => {
            format!("{} sequences: every pass is a prefill of whole prompts (extend_seq_lens from position 0)", s.len())
        }
        None => format!(
            "requests: {started} prompts started, {continued} continued (chunked prefill or a cached prefix), {decode} \
             decode tokens; no sequences written: the dump names no request and requests interleave across passes \
             (the trace's engine steps are the passes)"
        ),
    });
    let dropped_tokens = r.dropped();
    let unrouted_rows = r.unrouted_layers.len() * r.keep.iter().map(Vec::len).sum::<usize>();
    notes.push(match (r.blank_rows, dropped_tokens) {
        (0, _) => "padding: none".to_string(),
        (n, 0) => format!("padding: {n} rows of -1 ({unrouted_rows} in never-routed layers); no padded token"),
        (n, d) => format!(
            "padding: {n} rows of -1 ({unrouted_rows} in never-routed layers); {d} tokens -1 in every routed layer, dropped"
        ),
    });
    if !c.unknown.is_empty() {
        notes.push(format!("keys not read: {}", c.unknown.join(", ")));
    }
    let mut dropped: Vec<Dropped> = r
        .padding_dropped("tokens whose ids are -1 in every routed layer (SGLang's padded tokens)")
        .into_iter()
        .collect();
    if c.other > 0 {
        let modes: Vec<String> = c.other_modes.iter().map(i64::to_string).collect();
        dropped.push(Dropped {
            reason: DropReason::OtherPass,
            records: c.other_tokens * b.layers as u64,
            tokens: c.other_tokens,
            detail: format!("{} forward passes of forward_mode {}", c.other, modes.join(", ")),
        });
        warnings.push(format!(
            "{} forward passes of forward_mode {} (neither extend 1, decode 2, mixed 3 nor idle 4: speculative \
             verification or draft passes, numbered differently by SGLang versions) were dropped: the trace lacks \
             their {} tokens; record without speculative decoding for a complete trace",
            c.other,
            modes.join(", "),
            c.other_tokens
        ));
    }
    let mut extra = BTreeMap::new();
    extra.insert("forward_passes".to_string(), b.passes.len().to_string());
    extra.insert("prefill_tokens".to_string(), prefill.to_string());
    extra.insert("decode_tokens".to_string(), decode.to_string());
    extra.insert("mixed_tokens".to_string(), mixed.to_string());
    extra.insert("padding_tokens_dropped".to_string(), dropped_tokens.to_string());
    extra.insert("expert_ids".to_string(), map_words);
    if !r.unrouted_layers.is_empty() {
        extra.insert("unrouted_layers_dropped".to_string(), id_grid::ranges(&r.unrouted_layers));
    }
    let layer_ids: Vec<u32> = r.layers.iter().map(|&l| l as u32).collect();
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let meta = TraceMeta {
        model: opts.model.clone().unwrap_or_else(|| "unknown".into()),
        num_experts: b.num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind: ScoreKind::None,
        phase,
        source: format!("sglang-dump {file}: per_token expert-distribution records"),
        extra,
    };
    let sequences = seq_offsets.as_ref().map(Vec::len);
    let steps = step_offsets.len();
    let parts = OwnedParts {
        ids: b.reduced.ids,
        scores: None,
        gates: None,
        out_norms: None,
        seq_offsets,
        step_offsets: Some(step_offsets),
    };
    let trace = TraceData::new(meta, tokens, k, parts).map_err(|e| e.in_file(path))?;
    let report = ImportReport {
        format: FORMAT,
        files: 1,
        records_read: c.records_read,
        layers: trace.view().shape().layers,
        tokens,
        sequences,
        steps: Some(steps),
        floored_probs: 0,
        dropped,
        notes,
        warnings,
    };
    Ok(Imported { trace, report })
}

#[cfg(test)]
mod tests;
