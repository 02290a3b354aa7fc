//! Importer for per-record Mixtral routing JSON Lines (decode tokens of a few problems).
//!
//! Input: one JSON object per line and per (problem, layer, token):
//! `{"dataset", "problem_id", "layer", "experts": [k], "gating_probs": [k], "token_idx"}`, in any
//! order (the recorded file is grouped by problem, then layer). In the recorded file the
//! probabilities are renormalized over the k chosen experts (they sum to 1); this is detected, not
//! assumed. `token_idx` is the token's position in the problem's generated sequence.
//! A record without `token_idx` (say with `token_pos`) is refused naming the fields it has, and
//! a log whose records all carry `token_idx` 0 (the position within a decode step, not in the
//! sequence) is refused saying why: the tokens could be neither ordered nor aligned across layers.
//!
//! Output: one trace with
//! - layers = every layer id seen, sorted; tokens = the (problem, token) pairs present in **every**
//!   layer, ordered by (problem_id, token_idx); the others are dropped and counted in the report;
//! - `seq_offsets` at the first kept token of each problem;
//! - rows sorted by (score desc, id asc), `scores = ln(p)` (`ln(PROB_FLOOR)` for a recorded 0) with
//!   `score_kind = log_probs_renormalized` when every row sums to 1 (order right, softmax not the
//!   model's; the metadata key `renormalized` says so), else `log_probs`; `gates = p`, `m = k`;
//!   `phase = decode`.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use std::ops::ControlFlow;

use super::{DropReason, Dropped, ImportReport, Imported, PROB_FLOOR, RowSink, check_row, for_each_line};
use crate::{Phase, Result, TraceError, TraceMeta};

const FORMAT: &str = "mixtral-jsonl";

/// Options of [`import_mixtral_jsonl`].
#[derive(Debug, Clone)]
pub struct MixtralJsonlOptions {
    /// E, routed experts per layer. Default 8 (Mixtral-8x7B).
    pub num_experts: u32,
    /// Model name recorded in the metadata.
    pub model: String,
}

impl Default for MixtralJsonlOptions {
    fn default() -> Self {
        MixtralJsonlOptions { num_experts: 8, model: "mistralai/Mixtral-8x7B-Instruct-v0.1 (FP8)".into() }
    }
}

#[derive(serde::Deserialize)]
struct Record<'a> {
    #[serde(borrow)]
    dataset: Option<Cow<'a, str>>,
    problem_id: u64,
    layer: u32,
    experts: Vec<u32>,
    gating_probs: Vec<f64>,
    token_idx: u64,
}

/// The fields of a record, for error messages.
const FIELDS: [&str; 6] = ["dataset (optional)", "problem_id", "layer", "experts", "gating_probs", "token_idx"];

/// Imports the routing file at `path`.
///
/// # Errors
/// [`TraceError::Import`] naming the file and line for an unreadable file, a line that is not a
/// record, rows of different widths, an id `>= num_experts`, a repeated id, a probability outside
/// `[0, 1]`, a (problem, layer, token) recorded twice, a layer with no record between the lowest
/// and highest layer recorded (a gap in the layer ids), or no token present in every layer;
/// [`TraceError::Config`] for `num_experts` outside `1..=65536`.
pub fn import_mixtral_jsonl(path: impl AsRef<Path>, opts: &MixtralJsonlOptions) -> Result<Imported> {
    let path = path.as_ref();
    let num_experts = opts.num_experts;
    if num_experts == 0 || num_experts > u32::from(u16::MAX) + 1 {
        return Err(TraceError::Config { key: "num_experts", reason: format!("{num_experts} is not in 1..=65536") });
    }
    let mut k: Option<usize> = None;
    // Flattened rows in file order; `index` maps (problem, token, layer) to the row.
    let mut ids: Vec<u16> = Vec::new();
    let mut probs: Vec<f64> = Vec::new();
    let mut index: HashMap<(u64, u64, u32), (usize, usize)> = HashMap::new();
    let mut datasets = BTreeSet::new();
    let mut records = 0u64;
    let mut all_at_zero = true;
    for_each_line(path, |line_no, line| {
        if line.trim().is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        let err = |msg: String| import_err(path, Some(line_no), msg);
        let r: Record<'_> = serde_json::from_str(line)
            .map_err(|e| err(format!("not a routing record: {}", super::record_error(line, &e, &FIELDS))))?;
        let width = *k.get_or_insert(r.experts.len());
        check_row(&r.experts, &r.gating_probs, width, num_experts).map_err(err)?;
        if let Some(d) = r.dataset
            && !datasets.contains(d.as_ref())
        {
            datasets.insert(d.into_owned());
        }
        let row = index.len();
        all_at_zero &= r.token_idx == 0;
        if let Some((_, first)) = index.insert((r.problem_id, r.token_idx, r.layer), (row, line_no)) {
            if all_at_zero {
                return Err(err(format!(
                    "problem {}, layer {}: a second record at token_idx 0 (the first at line {first}), and every \
                     record so far has token_idx 0: the logger wrote each token's position within its decode step \
                     (always 0 for the one new token), not its position in the sequence, so the tokens can be \
                     neither ordered nor aligned across layers; record the position in the sequence as token_idx \
                     (generated tokens counted from 0 per problem)",
                    r.problem_id, r.layer
                )));
            }
            return Err(err(format!(
                "problem {}, layer {}, token {} is recorded twice (first at line {first}); each (problem, layer, \
                 token_idx) must appear once: remove the repeated record or give one run per file",
                r.problem_id, r.layer, r.token_idx
            )));
        }
        ids.extend(r.experts.iter().map(|&i| i as u16));
        probs.extend_from_slice(&r.gating_probs);
        records += 1;
        Ok(ControlFlow::Continue(()))
    })?;
    let k = k.ok_or_else(|| {
        import_err(path, None, "no routing records: the file is empty or holds only blank lines".into())
    })?;
    let layer_ids: Vec<u32> = index.keys().map(|key| key.2).collect::<BTreeSet<_>>().into_iter().collect();
    if let Some((_, missing)) = super::missing_layers(&layer_ids) {
        return Err(import_err(
            path,
            None,
            format!(
                "no record for {missing}, between layers {} and {}: every layer of the model is logged, \
                 so a gap means lost records; log or fetch the file again",
                layer_ids[0],
                layer_ids[layer_ids.len() - 1]
            ),
        ));
    }
    // Per (problem, token): how many layers recorded it.
    let mut layers_seen: BTreeMap<(u64, u64), usize> = BTreeMap::new();
    for &(p, t, _) in index.keys() {
        *layers_seen.entry((p, t)).or_default() += 1;
    }
    let n_layers = layer_ids.len();
    let kept: Vec<(u64, u64)> = layers_seen.iter().filter(|(_, c)| **c == n_layers).map(|(key, _)| *key).collect();
    let dropped_tokens: Vec<(u64, u64)> =
        layers_seen.iter().filter(|(_, c)| **c != n_layers).map(|(key, _)| *key).collect();
    if kept.is_empty() {
        return Err(import_err(
            path,
            None,
            format!(
                "no token is recorded in all {n_layers} layers: the layers were logged for different tokens; give the records of one run"
            ),
        ));
    }
    // A dropped token followed by a kept token of the same problem leaves a gap in the sequence.
    let mut last_kept: HashMap<u64, u64> = HashMap::new();
    for &(p, t) in &kept {
        last_kept.insert(p, t);
    }
    let interior = dropped_tokens.iter().filter(|(p, t)| last_kept.get(p).is_some_and(|&last| last > *t)).count();
    let tokens = kept.len();
    let mut sink = RowSink::with_capacity(n_layers * tokens * k);
    for &layer in &layer_ids {
        for &(p, t) in &kept {
            let (r, _) = index[&(p, t, layer)];
            sink.push(ids[r * k..(r + 1) * k].iter().copied().zip(probs[r * k..(r + 1) * k].iter().copied()));
        }
    }
    let mut seq_offsets = Vec::new();
    for (i, &(p, _)) in kept.iter().enumerate() {
        if i == 0 || kept[i - 1].0 != p {
            seq_offsets.push(i as u64);
        }
    }
    // Positions inside a problem that no layer recorded: the trace puts the tokens around them
    // side by side, and next-token statistics (reuse, prev_token prefetch) read across the hole.
    let absent: Vec<(u64, u64, u64)> = kept
        .windows(2)
        .filter(|w| w[0].0 == w[1].0 && w[1].1 > w[0].1 + 1)
        .map(|w| (w[0].0, w[0].1 + 1, w[1].1 - 1))
        .filter(|&(p, from, to)| !dropped_tokens.iter().any(|&(dp, dt)| dp == p && (from..=to).contains(&dt)))
        .collect();
    let mut warnings = Vec::new();
    if !absent.is_empty() {
        let n: u64 = absent.iter().map(|&(_, from, to)| to - from + 1).sum();
        let listed: Vec<String> = absent
            .iter()
            .take(5)
            .map(|&(p, from, to)| {
                if from == to {
                    format!("problem {p} token {from}")
                } else {
                    format!("problem {p} tokens {from}..={to}")
                }
            })
            .collect();
        warnings.push(format!(
            "{n} token position(s) inside a problem are recorded in no layer ({}{}): the trace joins the tokens \
             around them, so reuse and prefetch from one token to the next read across the gap; log or fetch the \
             file again if records were lost",
            listed.join(", "),
            if absent.len() > 5 { ", ..." } else { "" }
        ));
    }
    let mut dropped = Vec::new();
    if !dropped_tokens.is_empty() {
        let records_dropped: usize = dropped_tokens.iter().map(|key| layers_seen[key]).sum();
        let listed: Vec<String> =
            dropped_tokens.iter().take(10).map(|(p, t)| format!("problem {p} token {t}")).collect();
        dropped.push(Dropped {
            reason: DropReason::IncompleteToken,
            records: records_dropped as u64,
            tokens: dropped_tokens.len() as u64,
            detail: format!(
                "{} ({} inside a sequence, the rest trailing)",
                listed.join(", ") + if dropped_tokens.len() > 10 { ", ..." } else { "" },
                interior
            ),
        });
    }
    let mut extra = BTreeMap::new();
    extra.insert("prob_floor".to_string(), PROB_FLOOR.to_string());
    extra.insert("floored_probs".to_string(), sink.floored.to_string());
    let (score_kind, renormalized, gates) = sink.renorm_meta(k);
    warnings.extend(sink.renorm_warning());
    extra.insert("renormalized".to_string(), renormalized);
    extra.insert("gates".to_string(), gates);
    extra.insert("incomplete_tokens_dropped".to_string(), dropped_tokens.len().to_string());
    if !datasets.is_empty() {
        extra.insert("datasets".to_string(), datasets.into_iter().collect::<Vec<_>>().join(","));
    }
    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let meta = TraceMeta {
        model: opts.model.clone(),
        num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind,
        phase: Phase::Decode,
        source: format!("mixtral routing jsonl: {file}"),
        extra,
    };
    let sequences = seq_offsets.len();
    let floored = sink.floored;
    let trace = sink.into_trace(meta, tokens, k, (Some(seq_offsets), None), path)?;
    let report = ImportReport {
        format: FORMAT,
        files: 1,
        records_read: records,
        layers: n_layers,
        tokens,
        sequences: Some(sequences),
        steps: None,
        floored_probs: floored,
        dropped,
        notes: Vec::new(),
        warnings,
    };
    Ok(Imported { trace, report })
}

fn import_err(path: &Path, line: Option<usize>, message: String) -> TraceError {
    super::import_err(FORMAT, path, line, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ScoreKind;

    fn rec(p: u64, layer: u32, t: u64, e: [u32; 2], g: [f64; 2]) -> String {
        format!(
            r#"{{"dataset": "gsm8k", "problem_id": {p}, "layer": {layer}, "experts": [{}, {}], "gating_probs": [{}, {}], "token_idx": {t}}}"#,
            e[0], e[1], g[0], g[1]
        )
    }

    fn write(dir: &Path, lines: &[String]) -> std::path::PathBuf {
        let p = dir.join("routing.jsonl");
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    /// A position no layer recorded inside a problem is a warning naming it; the tokens around it
    /// are kept; a gap of an incomplete token is the drop's, not repeated here.
    #[test]
    fn a_position_no_layer_recorded_is_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = [0u64, 2, 3, 6]
            .iter()
            .flat_map(|&t| (0..2).map(move |l| rec(0, l, t, [1, 2], [0.5, 0.5])))
            .chain([rec(1, 0, 0, [1, 2], [0.5, 0.5]), rec(1, 1, 0, [1, 2], [0.5, 0.5])])
            .collect();
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        assert_eq!(out.trace.view().shape().tokens, 5);
        assert_eq!(out.report.warnings.len(), 1, "{:?}", out.report.warnings);
        let w = &out.report.warnings[0];
        assert!(
            w.starts_with("3 token position(s) inside a problem")
                && w.contains("problem 0 token 1, problem 0 tokens 4..=5"),
            "{w}"
        );
        // Token 1 recorded in layer 0 only: dropped as incomplete, and no warning.
        let mut lines = lines;
        lines.push(rec(0, 0, 1, [1, 2], [0.5, 0.5]));
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        assert!(
            out.report.warnings[0].contains("problem 0 tokens 4..=5") && !out.report.warnings[0].contains("token 1")
        );
    }

    /// Most rows renormalized and one not: the trace is read as not renormalized, and warned.
    #[test]
    fn a_few_rows_off_a_renormalized_log_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let mut lines: Vec<String> = (0..3).map(|t| rec(0, 0, t, [1, 2], [0.75, 0.25])).collect();
        lines.push(rec(0, 0, 3, [1, 2], [0.3, 0.2]));
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        assert_eq!(out.trace.view().meta().score_kind, ScoreKind::LogProbs);
        assert_eq!(out.report.warnings.len(), 1, "{:?}", out.report.warnings);
        assert!(out.report.warnings[0].starts_with("1 of 4 rows do not sum to 1"), "{:?}", out.report.warnings);
        // None renormalized (a full-softmax log): no warning.
        let lines: Vec<String> = (0..3).map(|t| rec(0, 0, t, [1, 2], [0.3, 0.2])).collect();
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        assert!(out.report.warnings.is_empty(), "{:?}", out.report.warnings);
    }

    #[test]
    fn keeps_complete_tokens_in_problem_order() {
        let dir = tempfile::tempdir().unwrap();
        // Grouped by problem then layer, as recorded. Problem 1 comes first in the file.
        // Layer 1 lacks (problem 0, token 2): that token is dropped (trailing).
        let lines = [
            rec(1, 0, 0, [3, 4], [0.75, 0.25]),
            rec(1, 1, 0, [5, 6], [0.5, 0.5]),
            rec(0, 0, 0, [1, 0], [0.25, 0.75]),
            rec(0, 0, 1, [2, 7], [0.625, 0.375]),
            rec(0, 0, 2, [2, 3], [0.5, 0.5]),
            rec(0, 1, 1, [6, 5], [1.0, 0.0]),
            rec(0, 1, 0, [0, 1], [0.875, 0.125]),
        ];
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        let v = out.trace.view();
        assert_eq!(v.meta().layer_ids, vec![0, 1]);
        assert_eq!((v.shape().tokens, v.shape().top_k, v.shape().num_experts), (3, 2, 8));
        // Tokens: (0,0), (0,1), (1,0).
        assert_eq!(v.layer_ids(0), &[0, 1, 2, 7, 3, 4]);
        assert_eq!(v.layer_ids(1), &[0, 1, 6, 5, 5, 6]);
        assert_eq!(v.layer_gates(1).unwrap(), &[0.875, 0.125, 1.0, 0.0, 0.5, 0.5]);
        assert_eq!(v.layer_scores(0).unwrap()[0], 0.75f64.ln() as f32);
        assert_eq!(v.seq_offsets().unwrap(), &[0, 2]);
        assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::LogProbsRenormalized, Phase::Decode));
        assert!(v.meta().extra["renormalized"].starts_with("true"));
        assert_eq!(v.meta().extra["datasets"], "gsm8k");
        let r = &out.report;
        assert_eq!((r.records_read, r.tokens, r.layers, r.sequences, r.floored_probs), (7, 3, 2, Some(2), 1));
        assert_eq!(r.dropped.len(), 1);
        let d = &r.dropped[0];
        assert_eq!((d.reason, d.tokens, d.records), (DropReason::IncompleteToken, 1, 1));
        assert!(d.detail.contains("problem 0 token 2") && d.detail.contains("0 inside"), "{}", d.detail);
    }

    #[test]
    fn renormalization_is_detected_and_tiny_probabilities_kept() {
        let dir = tempfile::tempdir().unwrap();
        // Full-softmax probabilities of the top-2 (rows sum below 1), one of them 2.8e-5.
        let lines = [rec(0, 0, 0, [3, 4], [0.5, 0.25]), rec(0, 0, 1, [5, 6], [0.6, 2.8e-5])];
        let out = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap();
        let v = out.trace.view();
        assert_eq!(v.meta().score_kind, ScoreKind::LogProbs);
        assert_eq!(v.meta().extra["renormalized"], "false: 0 of 2 rows sum to 1 within 0.001");
        assert!(v.meta().extra["gates"].ends_with("not renormalized"));
        assert_eq!(v.layer_scores(0).unwrap()[3], 2.8e-5f64.ln() as f32);
        assert_eq!((out.report.floored_probs, v.meta().extra["floored_probs"].as_str()), (0, "0"));
    }

    #[test]
    fn refuses_bad_records() {
        let dir = tempfile::tempdir().unwrap();
        let ok = rec(0, 0, 0, [1, 2], [0.5, 0.5]);
        let one = rec(0, 0, 1, [1, 2], [0.5, 0.5]);
        let cases: [(Vec<String>, &str); 9] = [
            (
                vec![ok.clone(), one.clone(), one.clone()],
                ":3: problem 0, layer 0, token 1 is recorded twice (first at line 2)",
            ),
            // Every record at position 0: the position within the decode step, not in the sequence.
            (
                vec![ok.clone(), rec(0, 1, 0, [1, 2], [0.5, 0.5]), ok.clone()],
                ":3: problem 0, layer 0: a second record at token_idx 0 (the first at line 1), and every record so far has token_idx 0",
            ),
            // token_pos instead of token_idx: the message names both.
            (
                vec![ok.clone(), ok.replace("token_idx", "token_pos")],
                ":2: not a routing record: missing field `token_idx`",
            ),
            (vec![ok.clone(), ok.replace("token_idx", "token_pos")], "`token_pos` is not `token_idx`"),
            (vec![ok.clone(), rec(0, 0, 1, [1, 8], [0.5, 0.5])], ":2: slot 1: expert id 8 >= num_experts 8"),
            (vec![ok.clone(), "{\"problem_id\": 0}".into()], ":2: not a routing record"),
            (vec![ok.clone(), rec(0, 0, 1, [1, 2], [1.5, 0.5])], "probability 1.5"),
            (vec![ok.clone(), rec(0, 1, 1, [1, 2], [0.5, 0.5])], "no token is recorded in all 2 layers"),
            // Layer 1 entirely absent between layers 0 and 2: refused, not imported as 2 layers.
            (
                vec![ok.clone(), rec(0, 2, 0, [1, 2], [0.5, 0.5]), rec(0, 3, 0, [1, 2], [0.5, 0.5])],
                ": no record for layer 1, between layers 0 and 3",
            ),
        ];
        for (lines, want) in cases {
            let e = import_mixtral_jsonl(write(dir.path(), &lines), &MixtralJsonlOptions::default()).unwrap_err();
            assert!(matches!(e, TraceError::Import { format: "mixtral-jsonl", .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains("routing.jsonl") && e.contains(want), "want {want:?} in {e}");
        }
        let e = import_mixtral_jsonl(dir.path().join("none.jsonl"), &MixtralJsonlOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::File { .. }), "{e}");
    }
}
