//! Importer for vLLM route logs: JSON Lines, one file per MoE layer, served traffic.
//!
//! Input, per file (the schema of several independent vLLM route-logging patches):
//! - line 1: `{"type": "meta", "model_id", "vllm_version", "layers_logged": [l], "top_k", ...}`,
//!   optionally with `num_experts`;
//! - then one line per (token, layer): `{"type": "route", "req_id", "token_idx", "layer",
//!   "topk_ids": [k], "topk_weights": [k]}`. `token_idx` counts rows within an engine step (batch)
//!   and restarts at 0 at every step; `req_id` is ignored (the patches do not fill it usefully).
//!   Weights are full-softmax probabilities of the chosen experts, not renormalized.
//!
//! Output: one multi-layer trace, layers sorted by id, the files aligned row by row (they must
//! share the same batch structure), with
//! - `step_offsets` at every engine step (where `token_idx` restarts at 0);
//! - the engine's warm-up profiling batches dropped (a leading run of steps of two or more rows in
//!   which every row of every layer has the same route), unless [`VllmRoutelogOptions::keep_warmup`];
//! - rows sorted by (score desc, id asc), `scores = ln(max(p, PROB_FLOOR))` (`score_kind =
//!   log_probs`), `gates = p`, `m = k = top_k`; `phase = mixed` (prefill and decode steps).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use std::ops::ControlFlow;

use super::{DropReason, Dropped, ImportReport, Imported, PROB_FLOOR, RowSink, check_row, for_each_line};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceError, TraceMeta};

const FORMAT: &str = "vllm-routelog";

/// Options of [`import_vllm_routelog`].
#[derive(Debug, Clone, Default)]
pub struct VllmRoutelogOptions {
    /// E, routed experts per layer. Required when the meta lines lack `num_experts`; when both are
    /// given they must agree. (Qwen1.5-MoE-A2.7B has 60.)
    pub num_experts: Option<u32>,
    /// Keep the detected warm-up batches instead of dropping them (the report still names them).
    pub keep_warmup: bool,
    /// Model name for the metadata; default: the meta line's `model_id`.
    pub model: Option<String>,
}

#[derive(serde::Deserialize)]
struct MetaLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    model_id: Option<String>,
    vllm_version: Option<String>,
    layers_logged: Option<Vec<u32>>,
    top_k: Option<u32>,
    num_experts: Option<u32>,
}

#[derive(serde::Deserialize)]
struct RouteLine<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    token_idx: u64,
    layer: u32,
    topk_ids: Vec<u32>,
    topk_weights: Vec<f64>,
}

/// One parsed file: one layer's rows, flattened `[rows, k]`, and its step sizes.
struct LayerLog {
    path: PathBuf,
    layer: u32,
    model: Option<String>,
    vllm_version: Option<String>,
    ids: Vec<u16>,
    probs: Vec<f64>,
    steps: Vec<usize>,
}

impl LayerLog {
    fn rows(&self) -> usize {
        self.steps.iter().sum()
    }
}

/// Imports the route logs `paths` (one file per layer, any order) into one trace.
///
/// # Errors
/// [`TraceError::Import`] naming the file (and line) for an unreadable file, a first line that is
/// not a meta record, a line that is not a route record, a malformed record, rows of several
/// layers in one file, a layer logged by two files, a `token_idx` that neither restarts at 0 nor
/// follows the previous one, a row with the wrong width, an id `>= num_experts`, a repeated id or a
/// probability outside `[0, 1]`, files whose `top_k`, `num_experts` or batch structure differ, or
/// nothing left after dropping warm-up; [`TraceError::Config`] when no path is given or
/// `num_experts` is known from neither the meta lines nor the options.
pub fn import_vllm_routelog(paths: &[impl AsRef<Path>], opts: &VllmRoutelogOptions) -> Result<Imported> {
    if paths.is_empty() {
        return Err(TraceError::Config { key: "inputs", reason: "at least one route-log file is needed".into() });
    }
    // Metadata first (cheap: the first line of each file) to fix E and k before parsing rows.
    let mut logs = Vec::with_capacity(paths.len());
    let mut num_experts = opts.num_experts;
    let mut top_k: Option<(u32, PathBuf)> = None;
    for path in paths {
        let path = path.as_ref();
        let mut first = String::new();
        for_each_line(path, |_, line| {
            first.push_str(line);
            Ok(ControlFlow::Break(()))
        })?;
        let meta: MetaLine<'_> = serde_json::from_str(&first).map_err(|e| {
            import_err(
                path,
                Some(1),
                format!("the first line must be the meta record ({{\"type\": \"meta\", ...}}): {e}"),
            )
        })?;
        if meta.kind != "meta" {
            return Err(import_err(
                path,
                Some(1),
                format!("the first line must be the meta record, not type {:?}", meta.kind),
            ));
        }
        if let Some(e) = meta.num_experts {
            match num_experts {
                Some(n) if n != e => {
                    return Err(import_err(
                        path,
                        Some(1),
                        format!("meta num_experts = {e} disagrees with {n} (option or another file)"),
                    ));
                }
                _ => num_experts = Some(e),
            }
        }
        if let Some(k) = meta.top_k {
            match &top_k {
                Some((prev, p)) if *prev != k => {
                    return Err(import_err(
                        path,
                        Some(1),
                        format!("meta top_k = {k} disagrees with top_k = {prev} of {}", p.display()),
                    ));
                }
                _ => top_k = Some((k, path.to_path_buf())),
            }
        }
        logs.push((path.to_path_buf(), meta.model_id, meta.vllm_version, meta.layers_logged));
    }
    let num_experts = num_experts.ok_or_else(|| TraceError::Config {
        key: "num_experts",
        reason: "the meta lines do not record num_experts: give it (--num-experts; Qwen1.5-MoE-A2.7B has 60)".into(),
    })?;
    if num_experts == 0 || num_experts > u32::from(u16::MAX) + 1 {
        return Err(TraceError::Config { key: "num_experts", reason: format!("{num_experts} is not in 1..=65536") });
    }
    let mut parsed = Vec::with_capacity(logs.len());
    for (path, model, vllm_version, layers_logged) in logs {
        let log = parse_rows(&path, num_experts, top_k.as_ref().map(|t| t.0 as usize))?;
        let log = LayerLog { model, vllm_version, ..log };
        if let Some(ll) = layers_logged
            && !ll.contains(&log.layer)
        {
            return Err(import_err(
                &path,
                None,
                format!("rows are for layer {} but the meta line logs layers {ll:?}", log.layer),
            ));
        }
        if top_k.is_none() {
            top_k = Some(((log.ids.len() / log.rows().max(1)) as u32, path.clone()));
        }
        parsed.push(log);
    }
    let k = top_k.map(|t| t.0 as usize).unwrap_or(0);
    parsed.sort_by_key(|l| l.layer);
    for w in parsed.windows(2) {
        if w[0].layer == w[1].layer {
            return Err(import_err(
                &w[1].path,
                None,
                format!("layer {} is also logged by {}", w[1].layer, w[0].path.display()),
            ));
        }
    }
    // Row-by-row alignment needs one batch structure.
    let first = &parsed[0];
    for log in &parsed[1..] {
        let k_log = log.ids.len() / log.rows().max(1);
        if log.rows() > 0 && k_log != k {
            return Err(import_err(&log.path, None, format!("rows have {k_log} experts, other files have {k}")));
        }
        if let Some(s) = (0..first.steps.len().max(log.steps.len())).find(|&s| first.steps.get(s) != log.steps.get(s)) {
            let size = |l: &LayerLog| l.steps.get(s).map_or("none".to_string(), |n| format!("{n} rows"));
            return Err(import_err(
                &log.path,
                None,
                format!(
                    "batch structure differs from {} at engine step {s}: {} here, {} there ({} vs {} steps, {} vs {} rows); \
                     files of one run must align row by row",
                    first.path.display(),
                    size(log),
                    size(first),
                    log.steps.len(),
                    first.steps.len(),
                    log.rows(),
                    first.rows()
                ),
            ));
        }
    }
    let steps = &first.steps;
    let warm_steps = warmup_steps(&parsed, k);
    let warm_rows: usize = steps[..warm_steps].iter().sum();
    let records_read: u64 = parsed.iter().map(|l| l.rows() as u64).sum();
    let mut dropped = Vec::new();
    let mut notes = Vec::new();
    let warm_detail = || {
        format!(
            "{warm_steps} leading engine step(s) of {:?} rows in which every row of every layer has the same route",
            &steps[..warm_steps]
        )
    };
    let skip_steps = if opts.keep_warmup {
        if warm_steps > 0 {
            notes.push(format!("kept warm-up batches on request: {}", warm_detail()));
        }
        0
    } else {
        if warm_steps > 0 {
            dropped.push(Dropped {
                reason: DropReason::WarmUp,
                records: (warm_rows * parsed.len()) as u64,
                tokens: warm_rows as u64,
                detail: warm_detail(),
            });
        }
        warm_steps
    };
    let skip_rows: usize = steps[..skip_steps].iter().sum();
    let tokens = first.rows() - skip_rows;
    if tokens == 0 {
        let path = &first.path;
        return Err(import_err(path, None, "no route rows left (after dropping warm-up batches)".into()));
    }
    let mut sink = RowSink::with_capacity(parsed.len() * tokens * k);
    for log in &parsed {
        for r in skip_rows..log.rows() {
            let ids = &log.ids[r * k..(r + 1) * k];
            let probs = &log.probs[r * k..(r + 1) * k];
            sink.push(ids.iter().copied().zip(probs.iter().copied()));
        }
    }
    let mut step_offsets = Vec::with_capacity(steps.len() - skip_steps);
    let mut start = 0u64;
    for &n in &steps[skip_steps..] {
        step_offsets.push(start);
        start += n as u64;
    }
    let model = opts.model.clone().or_else(|| first.model.clone()).unwrap_or_else(|| "unknown".into());
    let mut extra = BTreeMap::new();
    if let Some(v) = &first.vllm_version {
        extra.insert("vllm_version".to_string(), v.clone());
    }
    extra.insert("prob_floor".to_string(), PROB_FLOOR.to_string());
    extra.insert("floored_probs".to_string(), sink.floored.to_string());
    extra.insert("warmup_rows_dropped".to_string(), (if opts.keep_warmup { 0 } else { warm_rows }).to_string());
    extra.insert("warmup_rows_detected".to_string(), warm_rows.to_string());
    extra.insert("gates".to_string(), "full-softmax probabilities of the used experts, not renormalized".to_string());
    let files: Vec<String> = parsed.iter().map(|l| file_name(&l.path)).collect();
    let layer_ids: Vec<u32> = parsed.iter().map(|l| l.layer).collect();
    let meta = TraceMeta {
        model,
        num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind: ScoreKind::LogProbs,
        phase: Phase::Mixed,
        source: format!("vllm route log: {}", files.join(",")),
        extra,
    };
    let n_steps = step_offsets.len();
    let floored = sink.floored;
    let parts = OwnedParts {
        ids: sink.ids,
        scores: Some(sink.scores),
        gates: Some(sink.gates),
        out_norms: None,
        seq_offsets: None,
        step_offsets: Some(step_offsets),
    };
    let trace = TraceData::new(meta, tokens, k, parts).map_err(|e| e.in_file(&first.path))?;
    let report = ImportReport {
        format: FORMAT,
        files: parsed.len(),
        records_read,
        layers: parsed.len(),
        tokens,
        sequences: None,
        steps: Some(n_steps),
        floored_probs: floored,
        dropped,
        notes,
    };
    Ok(Imported { trace, report })
}

/// Parses the route lines of one file (the meta line was read by the caller).
fn parse_rows(path: &Path, num_experts: u32, top_k: Option<usize>) -> Result<LayerLog> {
    let mut ids = Vec::new();
    let mut probs = Vec::new();
    let mut steps: Vec<usize> = Vec::new();
    let mut layer: Option<u32> = None;
    let mut k = top_k;
    let mut prev_idx: Option<u64> = None;
    for_each_line(path, |line_no, line| {
        if line_no == 1 || line.trim().is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        let err = |msg: String| import_err(path, Some(line_no), msg);
        let r: RouteLine<'_> = serde_json::from_str(line).map_err(|e| err(format!("not a route record: {e}")))?;
        if r.kind != "route" {
            return Err(err(format!("record type {:?}, expected \"route\"", r.kind)));
        }
        match layer {
            None => layer = Some(r.layer),
            Some(l) if l != r.layer => {
                return Err(err(format!(
                    "layer {} in a file of layer {l}: give one file per layer (rows of one layer each)",
                    r.layer
                )));
            }
            Some(_) => {}
        }
        let width = *k.get_or_insert(r.topk_ids.len());
        check_row(&r.topk_ids, &r.topk_weights, width, num_experts).map_err(err)?;
        match (prev_idx, r.token_idx) {
            (_, 0) => steps.push(1),
            (Some(p), t) if t == p + 1 => *steps.last_mut().expect("a step is open after token_idx 0") += 1,
            (p, t) => {
                let expected = p.map_or("0".to_string(), |p| format!("0 (a new step) or {}", p + 1));
                return Err(err(format!("token_idx {t}, expected {expected}")));
            }
        }
        prev_idx = Some(r.token_idx);
        // Ids were checked against num_experts <= 65536.
        ids.extend(r.topk_ids.iter().map(|&i| i as u16));
        probs.extend_from_slice(&r.topk_weights);
        Ok(ControlFlow::Continue(()))
    })?;
    let layer = layer.ok_or_else(|| import_err(path, None, "no route records after the meta line".into()))?;
    Ok(LayerLog { path: path.to_path_buf(), layer, model: None, vllm_version: None, ids, probs, steps })
}

/// The number of leading warm-up steps: steps of two or more rows in which, in every layer, every
/// row repeats the step's first row exactly (ids and weights).
fn warmup_steps(logs: &[LayerLog], k: usize) -> usize {
    let steps = &logs[0].steps;
    let mut start = 0;
    for (s, &n) in steps.iter().enumerate() {
        let uniform = n >= 2
            && logs.iter().all(|l| {
                let ids = &l.ids[start * k..(start + n) * k];
                let probs = &l.probs[start * k..(start + n) * k];
                ids.chunks_exact(k).all(|r| r == &ids[..k])
                    && probs.chunks_exact(k).all(|r| r.iter().zip(&probs[..k]).all(|(a, b)| a.to_bits() == b.to_bits()))
            });
        if !uniform {
            return s;
        }
        start += n;
    }
    steps.len()
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn import_err(path: &Path, line: Option<usize>, message: String) -> TraceError {
    super::import_err(FORMAT, path, line, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const META: &str =
        r#"{"type": "meta", "model_id": "m", "vllm_version": "0.x", "layers_logged": [LAYER], "top_k": 2}"#;

    fn route(layer: u32, t: u64, ids: [u32; 2], w: [f64; 2]) -> String {
        format!(
            r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": {layer}, "topk_ids": [{}, {}], "topk_weights": [{}, {}]}}"#,
            ids[0], ids[1], w[0], w[1]
        )
    }

    /// A layer file: a warm-up step of 3 identical rows, a prefill step of 2 rows, 2 decode steps
    /// of 1 row. `shift` varies the routes between layers.
    fn layer_file(dir: &Path, layer: u32, shift: u32) -> PathBuf {
        let mut lines = vec![META.replace("LAYER", &layer.to_string())];
        for t in 0..3 {
            lines.push(route(layer, t, [shift, 1 + shift], [0.5, 0.25]));
        }
        lines.push(route(layer, 0, [2 + shift, 3 + shift], [0.25, 0.5])); // unsorted: 3 first
        lines.push(route(layer, 1, [4, 5], [0.3, 0.3])); // tie: 4 first
        lines.push(route(layer, 0, [1, 0], [0.6, 0.0])); // zero probability: floored
        lines.push(route(layer, 0, [6, 7], [0.4, 0.1]));
        let p = dir.join(format!("moe_layer{layer}.jsonl"));
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    }

    fn opts() -> VllmRoutelogOptions {
        VllmRoutelogOptions { num_experts: Some(8), ..Default::default() }
    }

    #[test]
    fn aligns_layers_drops_warmup_and_records_steps() {
        let dir = tempfile::tempdir().unwrap();
        let l8 = layer_file(dir.path(), 8, 1);
        let l0 = layer_file(dir.path(), 0, 0);
        let out = import_vllm_routelog(&[&l8, &l0], &opts()).unwrap();
        let v = out.trace.view();
        assert_eq!(v.meta().layer_ids, vec![0, 8]);
        let s = v.shape();
        assert_eq!((s.layers, s.tokens, s.candidates, s.top_k, s.num_experts), (2, 4, 2, 2, 8));
        assert_eq!(v.layer_ids(0), &[3, 2, 4, 5, 1, 0, 6, 7]);
        assert_eq!(v.layer_ids(1), &[4, 3, 4, 5, 1, 0, 6, 7]);
        assert_eq!(v.step_offsets().unwrap(), &[0, 2, 3]);
        assert_eq!(v.layer_gates(0).unwrap(), &[0.5, 0.25, 0.3, 0.3, 0.6, 0.0, 0.4, 0.1]);
        let sc = v.layer_scores(0).unwrap();
        assert_eq!(sc[0], 0.5f64.ln() as f32);
        assert_eq!(sc[5], f64::from(PROB_FLOOR).ln() as f32);
        assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::LogProbs, Phase::Mixed));
        assert_eq!(v.meta().model, "m");
        assert_eq!(v.meta().extra["warmup_rows_dropped"], "3");
        let r = &out.report;
        assert_eq!((r.records_read, r.tokens, r.layers, r.steps, r.floored_probs), (14, 4, 2, Some(3), 2));
        assert_eq!(r.dropped.len(), 1);
        assert_eq!((r.dropped[0].reason, r.dropped[0].tokens, r.dropped[0].records), (DropReason::WarmUp, 3, 6));

        let kept = import_vllm_routelog(&[&l0], &VllmRoutelogOptions { keep_warmup: true, ..opts() }).unwrap();
        assert_eq!(kept.trace.view().shape().tokens, 7);
        assert_eq!(kept.trace.view().step_offsets().unwrap(), &[0, 3, 5, 6]);
        assert!(kept.report.dropped.is_empty());
        assert!(kept.report.notes[0].contains("kept warm-up"), "{:?}", kept.report.notes);
    }

    #[test]
    fn refuses_misaligned_and_malformed_logs() {
        let dir = tempfile::tempdir().unwrap();
        let l0 = layer_file(dir.path(), 0, 0);
        // A layer whose last decode step is missing: batch structure differs.
        let l1 = dir.path().join("moe_layer1.jsonl");
        let text = std::fs::read_to_string(layer_file(dir.path(), 1, 0)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        std::fs::write(&l1, lines[..lines.len() - 1].join("\n")).unwrap();
        let e = import_vllm_routelog(&[&l0, &l1], &opts()).unwrap_err().to_string();
        assert!(e.contains("moe_layer1.jsonl") && e.contains("batch structure differs") && e.contains("step 3"), "{e}");

        // No num_experts anywhere.
        let e = import_vllm_routelog(&[&l0], &VllmRoutelogOptions::default()).unwrap_err();
        assert!(matches!(e, TraceError::Config { key: "num_experts", .. }), "{e}");
        // The same layer twice.
        let e = import_vllm_routelog(&[&l0, &l0], &opts()).unwrap_err().to_string();
        assert!(e.contains("layer 0 is also logged by"), "{e}");

        let bad = dir.path().join("bad.jsonl");
        let cases: [(String, &str); 7] = [
            (route(0, 0, [1, 2], [0.5, 0.2]), "first line must be the meta record"),
            (
                format!("{}\n{}", META.replace("LAYER", "0"), route(0, 1, [1, 2], [0.5, 0.2])),
                ":2: token_idx 1, expected 0",
            ),
            (
                format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 9], [0.5, 0.2])),
                ":2: slot 1: expert id 9 >= num_experts 8",
            ),
            (format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 1], [0.5, 0.2])), "repeated"),
            (format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 2], [0.5, -0.2])), "probability -0.2"),
            (
                format!(
                    "{}\n{}\n{}",
                    META.replace("LAYER", "0"),
                    route(0, 0, [1, 2], [0.5, 0.2]),
                    route(3, 1, [1, 2], [0.5, 0.2])
                ),
                ":3: layer 3 in a file of layer 0",
            ),
            (
                format!("{}\n{{\"type\": \"route\", \"token_idx\": 0}}", META.replace("LAYER", "0")),
                ":2: not a route record",
            ),
        ];
        for (text, want) in cases {
            std::fs::write(&bad, text).unwrap();
            let e = import_vllm_routelog(&[&bad], &opts()).unwrap_err();
            assert!(matches!(e, TraceError::Import { format: "vllm-routelog", .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains("bad.jsonl") && e.contains(want), "want {want:?} in {e}");
        }
        // A file that holds only warm-up.
        let mut lines = vec![META.replace("LAYER", "0")];
        lines.extend((0..4).map(|t| route(0, t, [1, 2], [0.5, 0.2])));
        std::fs::write(&bad, lines.join("\n")).unwrap();
        let e = import_vllm_routelog(&[&bad], &opts()).unwrap_err().to_string();
        assert!(e.contains("no route rows left"), "{e}");
    }
}
