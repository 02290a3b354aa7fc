//! Importers for the routing dumps of llama.cpp forks: the top-k expert ids that an eval callback
//! reads from the graph's `ffn_moe_topk-<il>` tensors, written in one of two layouts.
//!
//! - [`import_llama_csv`]: text, one row `pos,layer,id0,...,id{k-1}` per (token, layer), an
//!   optional header line `pos,layer,id0,...`; prefill (prompt) tokens have negative positions,
//!   decode tokens positions `>= 0`.
//! - [`import_llama_bin`]: a stream of little-endian records `int32 layer, int32 n_tokens,
//!   int32 k, int32 ids[n_tokens * k]`, one record per MoE layer per graph evaluation (ubatch).
//!
//! Both hold the ids only: `m = k`, no scores (`score_kind = none`), no gates, no candidates
//! beyond k; ids keep the order the runtime gave them (llama.cpp's argsort: descending
//! probability). The layer field is the model's block index (`il`), so a model whose first
//! blocks are dense gives layer ids that do not start at 0; they become `layer_ids`.
//!
//! Rules shared by both (docs/importers.md states them with the format-specific ones):
//! - a token is kept when every layer seen anywhere in the file routed it; the others are dropped
//!   and reported (`tokens missing from some layers`): llama.cpp's last layer routes only the
//!   output tokens of a prompt ubatch (`inp_out_ids`), which drops the other prompt tokens so;
//! - a layer recorded twice for one token is refused, except a row repeated byte for byte (CSV),
//!   which is dropped and reported as a duplicate;
//! - an id `< 0` or `>= num_experts`, or repeated in a row, is refused.

use std::collections::BTreeMap;
use std::path::Path;

use super::{DropReason, Dropped, ImportReport, Imported};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceMeta};

mod bin;
mod csv;

pub use bin::import_llama_bin;
pub use csv::import_llama_csv;

/// Options of [`import_llama_csv`] and [`import_llama_bin`].
#[derive(Debug, Clone, Default)]
pub struct LlamaDumpOptions {
    /// E, routed experts per layer (the dumps do not record it; 0 is refused).
    pub num_experts: u32,
    /// Model name for the metadata (default `unknown`).
    pub model: Option<String>,
}

/// One token as read: its rows (layer, index of the row in [`Collected::ids`]) and its phase.
#[derive(Debug, Default)]
struct Token {
    rows: Vec<(u32, u32)>,
    prefill: bool,
}

/// What a parser read, in trace order, before the incomplete tokens are dropped.
#[derive(Debug, Default)]
struct Collected {
    /// k, once a row fixed it.
    k: usize,
    /// The ids of every row kept, k per row.
    ids: Vec<u16>,
    /// The tokens, in trace order.
    tokens: Vec<Token>,
    /// First token of each sequence (indices into `tokens`).
    seq_starts: Vec<usize>,
    /// First token of each ubatch, when the format records them.
    step_starts: Option<Vec<usize>>,
    /// Rows (or records) read.
    records: u64,
    /// Rows repeated byte for byte, dropped: (count, first line).
    duplicates: (u64, usize),
    /// Facts about the input for the report.
    notes: Vec<String>,
}

impl Collected {
    /// Appends one row of checked ids and returns its index.
    fn push_row(&mut self, ids: &[u16]) -> u32 {
        let r = (self.ids.len() / self.k.max(1)) as u32;
        self.ids.extend_from_slice(ids);
        r
    }
}

/// Checks one row of raw ids: `k` of them, each in `0..num_experts`, none repeated; `Err` is the
/// message.
fn check_ids(raw: &[i64], num_experts: u32, out: &mut Vec<u16>) -> std::result::Result<(), String> {
    out.clear();
    for (i, &id) in raw.iter().enumerate() {
        if id < 0 || id >= i64::from(num_experts) {
            return Err(format!(
                "slot {i}: expert id {id} is not in 0..{num_experts} (--num-experts {num_experts}){}",
                if id < 0 { "" } else { ": is --num-experts right?" }
            ));
        }
        let id = id as u16;
        if out.contains(&id) {
            return Err(format!("slot {i}: expert id {id} repeated in the row"));
        }
        out.push(id);
    }
    Ok(())
}

/// Builds the trace and report from what a parser collected.
fn finish(format: &'static str, path: &Path, opts: &LlamaDumpOptions, mut c: Collected) -> Result<Imported> {
    let err = |m: String| super::import_err(format, path, None, m);
    if c.tokens.is_empty() {
        return Err(err("no routing rows: the file is empty".into()));
    }
    let k = c.k;
    let mut layer_set = BTreeMap::new();
    for t in &c.tokens {
        for &(l, _) in &t.rows {
            *layer_set.entry(l).or_insert(0u64) += 1;
        }
    }
    let layer_ids: Vec<u32> = layer_set.keys().copied().collect();
    let layers = layer_ids.len();
    let keep: Vec<bool> = c.tokens.iter().map(|t| t.rows.len() == layers).collect();
    let kept = keep.iter().filter(|&&x| x).count();
    let dropped_tokens = c.tokens.len() - kept;
    // Which layers the dropped tokens miss, counted.
    let mut missing: BTreeMap<u32, u64> = BTreeMap::new();
    for t in c.tokens.iter().filter(|t| t.rows.len() != layers) {
        for l in &layer_ids {
            if !t.rows.iter().any(|(x, _)| x == l) {
                *missing.entry(*l).or_insert(0) += 1;
            }
        }
    }
    if kept == 0 {
        return Err(err(format!(
            "no token was routed by every one of the {layers} layers seen ({}): nothing to keep",
            layer_list(&layer_ids)
        )));
    }
    for t in &mut c.tokens {
        t.rows.sort_unstable();
    }
    let mut ids = Vec::with_capacity(kept * layers * k);
    for li in 0..layers {
        for t in c.tokens.iter().filter(|t| t.rows.len() == layers) {
            let r = t.rows[li].1 as usize;
            ids.extend_from_slice(&c.ids[r * k..(r + 1) * k]);
        }
    }
    // Offsets in kept-token indices (spans left empty disappear).
    let mut new_index = Vec::with_capacity(keep.len() + 1);
    let mut n = 0u64;
    for &x in &keep {
        new_index.push(n);
        n += u64::from(x);
    }
    let remap = |starts: &[usize]| {
        let mut v: Vec<u64> = starts.iter().map(|&s| new_index[s]).filter(|&s| s < n).collect();
        v.dedup();
        v
    };
    let seq_offsets = remap(&c.seq_starts);
    let step_offsets = c.step_starts.as_deref().map(remap);
    let prefill = c.tokens.iter().zip(&keep).filter(|(t, k)| **k && t.prefill).count();
    let decode = kept - prefill;
    let phase = match (prefill, decode) {
        (_, 0) => Phase::Prefill,
        (0, _) => Phase::Decode,
        _ => Phase::Mixed,
    };
    let mut notes = c.notes;
    notes.push(format!(
        "{layers} MoE layers: ids {} (the model's block indices); k = {k}; m = k: ids only, no scores, no gates",
        layer_list(&layer_ids)
    ));
    notes.push(format!("tokens kept: {prefill} prefill, {decode} decode (phase {phase})"));
    let mut dropped = Vec::new();
    let mut warnings = Vec::new();
    if dropped_tokens > 0 {
        let miss: Vec<String> = missing.iter().map(|(l, n)| format!("layer {l}: {n}")).collect();
        let records: u64 = c.tokens.iter().filter(|t| t.rows.len() != layers).map(|t| t.rows.len() as u64).sum();
        dropped.push(Dropped {
            reason: DropReason::IncompleteToken,
            records,
            tokens: dropped_tokens as u64,
            detail: format!("tokens missing per layer: {}", miss.join(", ")),
        });
        if missing.len() == 1 && missing.contains_key(layer_ids.last().unwrap_or(&0)) {
            warnings.push(format!(
                "only the last layer ({}) misses tokens: llama.cpp routes only a prompt ubatch's output tokens \
                 through its last layer (inp_out_ids), so the other prompt tokens were dropped; to keep them, \
                 record with every token's logits requested (e.g. llama-perplexity, or n_outputs = n_tokens)",
                layer_ids[layers - 1]
            ));
        }
    }
    if c.duplicates.0 > 0 {
        dropped.push(Dropped {
            reason: DropReason::Duplicate,
            records: c.duplicates.0,
            tokens: 0,
            detail: format!("rows repeated byte for byte (the first at line {})", c.duplicates.1),
        });
    }
    let mut extra = BTreeMap::new();
    extra.insert("prefill_tokens".to_string(), prefill.to_string());
    extra.insert("decode_tokens".to_string(), decode.to_string());
    extra.insert("incomplete_tokens_dropped".to_string(), dropped_tokens.to_string());
    extra.insert("duplicate_rows_dropped".to_string(), c.duplicates.0.to_string());
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let meta = TraceMeta {
        model: opts.model.clone().unwrap_or_else(|| "unknown".into()),
        num_experts: opts.num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind: ScoreKind::None,
        phase,
        source: format!("{format} {file}: llama.cpp ffn_moe_topk dump"),
        extra,
    };
    let (sequences, steps) = (seq_offsets.len(), step_offsets.as_ref().map(Vec::len));
    let parts =
        OwnedParts { ids, scores: None, gates: None, out_norms: None, seq_offsets: Some(seq_offsets), step_offsets };
    let trace = TraceData::new(meta, kept, k, parts).map_err(|e| e.in_file(path))?;
    let report = ImportReport {
        format,
        files: 1,
        records_read: c.records,
        layers,
        tokens: kept,
        sequences: Some(sequences),
        steps,
        floored_probs: 0,
        dropped,
        notes,
        warnings,
    };
    Ok(Imported { trace, report })
}

/// `1, 2, 3` (at most twelve listed, then the count).
fn layer_list(ids: &[u32]) -> String {
    let mut s: Vec<String> = ids.iter().take(12).map(u32::to_string).collect();
    if ids.len() > 12 {
        s.push(format!("... ({} in all)", ids.len()));
    }
    s.join(", ")
}

#[cfg(test)]
mod tests;
