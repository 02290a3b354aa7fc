//! Importer for vLLM route logs: JSON Lines, one file per MoE layer, served traffic.
//!
//! Input, per file (the schema of several independent vLLM route-logging patches):
//! - line 1: `{"type": "meta", "model_id", "vllm_version", "layers_logged": [l], "top_k", ...}`,
//!   optionally with `num_experts`;
//! - then one line per (token, layer): `{"type": "route", "req_id", "token_idx", "layer",
//!   "topk_ids": [k], "topk_weights": [k]}`. `token_idx` counts rows within an engine step (batch)
//!   and restarts at 0 at every step (a logger that never restarts it gives one step); `req_id` is
//!   ignored (the patches do not fill it usefully). Weights are probabilities of the chosen
//!   experts; whether they were renormalized is detected from the row sums.
//! - a meta line further down: the logger appended a second engine run to the file.
//!
//! Output: one multi-layer trace, layers sorted by id, the files aligned row by row (they must
//! share the same batch structure), with
//! - `step_offsets` at every engine step (where `token_idx` restarts at 0) that keeps a row;
//! - dummy rows (the engine's warm-up runs on dummy input, see the `dummy` module) dropped wherever they
//!   are, unless [`VllmRoutelogOptions::keep_warmup`]; each region reported and listed in the
//!   metadata key `dummy_rows`; rows of [`VllmRoutelogOptions::skip_rows`] dropped too;
//! - `seq_offsets` when the log holds more than one engine run (the first row kept of each run),
//!   so that a replay can reset its caches between runs; none for a log of one run;
//! - rows sorted by (score desc, id asc), `scores = ln(p)` (`ln(PROB_FLOOR)` for a recorded 0),
//!   `score_kind = log_probs`, or `log_probs_renormalized` when every row sums to 1; `gates = p`,
//!   `m = k = top_k`; `phase = mixed` (prefill and decode steps).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use super::{DropReason, Dropped, ImportReport, Imported, PROB_FLOOR, RowSink};
use crate::{Phase, Result, TraceError, TraceMeta};

mod dummy;
mod parse;
#[cfg(test)]
mod tests;

use parse::{LayerLog, parse_rows, read_meta};

const FORMAT: &str = "vllm-routelog";

/// Options of [`import_vllm_routelog`].
#[derive(Debug, Clone, Default)]
pub struct VllmRoutelogOptions {
    /// E, routed experts per layer. Required when the meta lines lack `num_experts`; when both are
    /// given they must agree. (Qwen1.5-MoE-A2.7B has 60.)
    pub num_experts: Option<u32>,
    /// Keep the detected dummy (warm-up) rows instead of dropping them (the report still names
    /// them, and engine-run boundaries are kept).
    pub keep_warmup: bool,
    /// Model name for the metadata; default: the meta line's `model_id`.
    pub model: Option<String>,
    /// Route rows to drop whatever the heuristics say: 0-based indices of the route rows of a file
    /// (meta lines not counted; the same rows in every file), half-open `A..B`. For dummy rows no
    /// rule catches.
    pub skip_rows: Vec<Range<usize>>,
}

/// Parses `A..B` (0-based route rows, half-open, `A < B`) for [`VllmRoutelogOptions::skip_rows`].
///
/// # Errors
/// A message saying what was expected.
pub fn parse_row_range(s: &str) -> std::result::Result<Range<usize>, String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("`{s}` is not a row range: write A..B (0-based route rows, B excluded)"))?;
    let num = |x: &str| {
        x.trim().parse::<usize>().map_err(|_| format!("`{s}`: `{x}` is not a row number (0-based route rows)"))
    };
    let (a, b) = (num(a)?, num(b)?);
    if a >= b {
        return Err(format!("`{s}` is empty: A..B needs A < B (B is excluded)"));
    }
    Ok(a..b)
}

/// A file's path with what its meta line records: model_id, vllm_version, layers_logged.
type MetaOf = (PathBuf, Option<String>, Option<String>, Option<Vec<u32>>);

/// Imports the route logs `paths` (one file per layer, any order) into one trace.
///
/// # Errors
/// [`TraceError::Import`] naming the file (and line) for an unreadable file, a first line that is
/// not a meta record, a line that is not a route record, a malformed record, rows of several
/// layers in one file, a layer logged by two files, a `token_idx` that neither restarts at 0 nor
/// follows the previous one, a row with the wrong width, an id `>= num_experts`, a repeated id or a
/// probability outside `[0, 1]`, files whose `top_k`, `num_experts`, batch structure or engine
/// runs differ, or nothing left after dropping dummy and skipped rows; [`TraceError::Config`] when
/// no path is given, `num_experts` is known from neither the meta lines nor the options, or a
/// skipped range lies outside the log or overlaps another.
pub fn import_vllm_routelog(paths: &[impl AsRef<Path>], opts: &VllmRoutelogOptions) -> Result<Imported> {
    if paths.is_empty() {
        return Err(TraceError::Config { key: "inputs", reason: "at least one route-log file is needed".into() });
    }
    // Overlapping skipped ranges would count the rows they share twice in the report: refused
    // before any file is read.
    let mut sorted: Vec<&Range<usize>> = opts.skip_rows.iter().collect();
    sorted.sort_by_key(|r| (r.start, r.end));
    if let Some(w) = sorted.windows(2).find(|w| w[1].start < w[0].end) {
        return Err(TraceError::Config {
            key: "skip_rows",
            reason: format!(
                "{}..{} and {}..{} overlap: give each row once (for example {}..{})",
                w[0].start,
                w[0].end,
                w[1].start,
                w[1].end,
                w[0].start,
                w[0].end.max(w[1].end)
            ),
        });
    }
    // Metadata first (cheap: the first line of each file) to fix E and k before parsing rows.
    let mut logs: Vec<MetaOf> = Vec::with_capacity(paths.len());
    let mut num_experts = opts.num_experts;
    let mut top_k: Option<(u32, PathBuf)> = None;
    for path in paths {
        let path = path.as_ref();
        let meta = read_meta(path)?;
        if let Some(e) = meta.num_experts {
            match num_experts {
                Some(n) if n != e => {
                    return Err(import_err(
                        path,
                        Some(1),
                        format!(
                            "meta num_experts = {e} disagrees with {n} (--num-experts or another file): give files of \
                             one model, and --num-experts only when the meta lines lack it"
                        ),
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
                        format!(
                            "meta top_k = {k} disagrees with top_k = {prev} of {}: give files of one run",
                            p.display()
                        ),
                    ));
                }
                _ => top_k = Some((k, path.to_path_buf())),
            }
        }
        // Files of two models (or two checkpoints) must not be merged into one trace.
        if let Some(m) = meta.model_id.as_deref()
            && let Some((first, Some(other), _, _)) = logs.iter().find(|l| l.1.as_deref().is_some_and(|o| o != m))
        {
            return Err(import_err(
                path,
                Some(1),
                format!(
                    "meta model_id = {m:?} disagrees with {other:?} of {}: give files of one model",
                    first.display()
                ),
            ));
        }
        logs.push((path.to_path_buf(), meta.model_id, meta.vllm_version, meta.layers_logged));
    }
    let num_experts = num_experts.ok_or_else(|| TraceError::Config {
        key: "num_experts",
        reason: format!(
            "the meta lines of {} do not record num_experts: give it (--num-experts; Qwen1.5-MoE-A2.7B has 60)",
            logs.first().map_or_else(String::new, |l| l.0.display().to_string())
        ),
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
                Some(log.line_of(0)),
                format!(
                    "field layer: rows are for layer {} but the meta line (line 1) logs layers {ll:?}: \
                     the file was edited or mixed up; give the files as the logger wrote them",
                    log.layer
                ),
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
                format!("layer {} is also logged by {}: give each layer's file once", w[1].layer, w[0].path.display()),
            ));
        }
    }
    // Row-by-row alignment needs one batch structure.
    let first = &parsed[0];
    for log in &parsed[1..] {
        let k_log = log.ids.len() / log.rows().max(1);
        if log.rows() > 0 && k_log != k {
            return Err(import_err(
                &log.path,
                None,
                format!("rows have {k_log} experts, other files have {k}: give files of one run"),
            ));
        }
        if log.meta_runs != first.meta_runs {
            return Err(import_err(
                &log.path,
                None,
                format!(
                    "engine runs differ from {}: meta lines before rows {:?} here, {:?} there; files of one log \
                     must hold the same runs",
                    first.path.display(),
                    log.meta_runs,
                    first.meta_runs
                ),
            ));
        }
        if let Some(s) = (0..first.steps.len().max(log.steps.len())).find(|&s| first.steps.get(s) != log.steps.get(s)) {
            let size = |l: &LayerLog| l.steps.get(s).map_or("none".to_string(), |n| format!("{n} rows"));
            let row: usize = log.steps.iter().take(s).sum();
            return Err(import_err(
                &log.path,
                Some(log.line_of(row)),
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
    let n = first.rows();
    for r in &opts.skip_rows {
        if r.end > n {
            return Err(TraceError::Config {
                key: "skip_rows",
                reason: format!(
                    "{}..{} reaches past the log: {} has {n} route rows (0..{n})",
                    r.start,
                    r.end,
                    first.path.display()
                ),
            });
        }
    }
    let mut run_starts = vec![0];
    run_starts.extend(&first.meta_runs);
    let regions = dummy::find_dummies(&parsed, k, &run_starts);
    let is_dummy = dummy::dummy_mask(n, &regions);
    let bounds = dummy::engine_runs(first, &regions, &is_dummy);
    let mut skipped = vec![false; n];
    for r in &opts.skip_rows {
        skipped[r.clone()].iter_mut().for_each(|x| *x = true);
    }
    let kept: Vec<bool> = (0..n).map(|r| !skipped[r] && (opts.keep_warmup || !is_dummy[r])).collect();
    let real: Vec<bool> = (0..n).map(|r| !skipped[r] && !is_dummy[r]).collect();
    let tokens = kept.iter().filter(|&&x| x).count();
    let records_read: u64 = parsed.iter().map(|l| l.rows() as u64).sum();
    let layers = parsed.len();
    let mut dropped = Vec::new();
    let mut notes = Vec::new();
    let describe = |r: &dummy::Region| describe_region(first, r, k);
    let dummy_rows: usize = regions.iter().map(|r| r.rows.len()).sum();
    for r in &regions {
        if opts.keep_warmup {
            notes.push(format!("kept dummy rows on request: {}", describe(r)));
        } else {
            // Rows also given to --skip-rows count here, once.
            dropped.push(Dropped {
                reason: DropReason::WarmUp,
                records: (r.rows.len() * layers) as u64,
                tokens: r.rows.len() as u64,
                detail: describe(r),
            });
        }
    }
    for r in &opts.skip_rows {
        let rows = r.clone().filter(|&x| opts.keep_warmup || !is_dummy[x]).count();
        dropped.push(Dropped {
            reason: DropReason::Skipped,
            records: (rows * layers) as u64,
            tokens: rows as u64,
            detail: format!(
                "rows {}..{} (lines {}-{} of each file){}",
                r.start,
                r.end,
                first.line_of(r.start),
                first.line_of(r.end - 1),
                if rows < r.len() {
                    format!(", {} of them already dropped as dummy rows", r.len() - rows)
                } else {
                    String::new()
                }
            ),
        });
    }
    if tokens == 0 {
        let path = &first.path;
        return Err(import_err(
            path,
            None,
            format!(
                "no route rows left: all {n} rows are dummy rows or skipped ({dummy_rows} dummy); if the rules took \
                 real rows for dummies, import with --keep-warmup (and --skip-rows for the dummies)"
            ),
        ));
    }
    // Trace position of every kept row.
    let mut pos = vec![0u64; n + 1];
    let mut next = 0u64;
    for r in 0..n {
        pos[r] = next;
        next += u64::from(kept[r]);
    }
    pos[n] = next;
    let mut sink = RowSink::with_capacity(layers * tokens * k);
    for log in &parsed {
        for r in (0..n).filter(|&r| kept[r]) {
            let ids = &log.ids[r * k..(r + 1) * k];
            let probs = &log.probs[r * k..(r + 1) * k];
            sink.push(ids.iter().copied().zip(probs.iter().copied()));
        }
    }
    // A step keeps an offset when it keeps a row.
    let mut step_offsets = Vec::with_capacity(first.steps.len());
    let mut start = 0;
    for &size in &first.steps {
        if pos[start + size] > pos[start] {
            step_offsets.push(pos[start]);
        }
        start += size;
    }
    let mut seq_offsets = vec![0u64];
    for b in &bounds {
        let p = pos[b.row];
        if p < tokens as u64 && seq_offsets.last() != Some(&p) {
            seq_offsets.push(p);
        }
        notes.push(format!(
            "engine run starts at row {} (line {}; trace token {p}): {}",
            b.row,
            first.line_of(b.row),
            b.why
        ));
    }
    let seq_offsets = (seq_offsets.len() > 1).then_some(seq_offsets);
    if first.steps.len() == 1 && n > 1 {
        notes.push(format!(
            "token_idx never restarts at 0: the log records a single engine step of {n} rows, so the engine steps are \
             unknown (step_offsets = [0]) and dummy rows were found from the rows' content alone"
        ));
    }
    let mut warnings = dummy::warnings(&parsed, k, num_experts, &real, &bounds);
    let model = opts.model.clone().or_else(|| first.model.clone()).unwrap_or_else(|| "unknown".into());
    let mut extra = BTreeMap::new();
    if let Some(v) = &first.vllm_version {
        extra.insert("vllm_version".to_string(), v.clone());
    }
    extra.insert("prob_floor".to_string(), PROB_FLOOR.to_string());
    extra.insert("floored_probs".to_string(), sink.floored.to_string());
    extra.insert("warmup_rows_dropped".to_string(), (if opts.keep_warmup { 0 } else { dummy_rows }).to_string());
    extra.insert("warmup_rows_detected".to_string(), dummy_rows.to_string());
    if !regions.is_empty() {
        let list: Vec<String> = regions
            .iter()
            .flat_map(|r| r.pieces.iter())
            .map(|p| format!("{}..{} {}", p.rows.start, p.rows.end, p.why.as_str()))
            .collect();
        extra.insert("dummy_rows".to_string(), list.join(","));
    }
    if !opts.skip_rows.is_empty() {
        let list: Vec<String> = opts.skip_rows.iter().map(|r| format!("{}..{}", r.start, r.end)).collect();
        extra.insert("skipped_rows".to_string(), list.join(","));
    }
    if !bounds.is_empty() {
        let rows: Vec<String> = std::iter::once(0).chain(bounds.iter().map(|b| b.row)).map(|r| r.to_string()).collect();
        extra.insert("engine_run_rows".to_string(), rows.join(","));
    }
    let (score_kind, renormalized, gates) = sink.renorm_meta(k);
    warnings.extend(sink.renorm_warning());
    if score_kind == crate::ScoreKind::LogProbsRenormalized {
        extra.insert("renormalized".to_string(), renormalized);
    }
    extra.insert("gates".to_string(), gates);
    let files: Vec<String> = parsed.iter().map(|l| file_name(&l.path)).collect();
    let layer_ids: Vec<u32> = parsed.iter().map(|l| l.layer).collect();
    let meta = TraceMeta {
        model,
        num_experts,
        top_k: k as u32,
        layer_ids,
        score_kind,
        phase: Phase::Mixed,
        source: format!("vllm route log: {}", files.join(",")),
        extra,
    };
    let n_steps = step_offsets.len();
    let sequences = seq_offsets.as_ref().map(Vec::len);
    let floored = sink.floored;
    let trace = sink.into_trace(meta, tokens, k, (seq_offsets, Some(step_offsets)), &first.path)?;
    let report = ImportReport {
        format: FORMAT,
        files: layers,
        records_read,
        layers,
        tokens,
        sequences,
        steps: Some(n_steps),
        floored_probs: floored,
        dropped,
        notes,
        warnings,
    };
    Ok(Imported { trace, report })
}

/// A dummy region in words: rows, lines, engine steps, and what each piece is.
fn describe_region(first: &LayerLog, r: &dummy::Region, k: usize) -> String {
    let pieces: Vec<String> = r
        .pieces
        .iter()
        .map(|p| match p.why {
            dummy::Why::IdenticalRoute => format!("{} rows with one identical route", p.rows.len()),
            dummy::Why::UniformWeights => format!("{} rows with uniform weights 1/{k}", p.rows.len()),
        })
        .collect();
    // Engine steps the region covers, and whether it covers them whole.
    let mut start = 0;
    let mut covered = Vec::new();
    let mut whole = true;
    for (s, &size) in first.steps.iter().enumerate() {
        let end = start + size;
        if start < r.rows.end && end > r.rows.start {
            covered.push(s);
            whole &= start >= r.rows.start && end <= r.rows.end;
        }
        start = end;
    }
    let steps = match (covered.first(), covered.last()) {
        (Some(a), Some(b)) if a == b => format!("engine step {a}"),
        (Some(a), Some(b)) => format!("engine steps {a}-{b}"),
        _ => "no engine step".to_string(),
    };
    format!(
        "rows {}..{} (lines {}-{} of each file; {steps}{}): {}, in every layer",
        r.rows.start,
        r.rows.end,
        first.line_of(r.rows.start),
        first.line_of(r.rows.end - 1),
        if whole { "" } else { ", in part" },
        pieces.join(", then ")
    )
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

fn import_err(path: &Path, line: Option<usize>, message: String) -> TraceError {
    super::import_err(FORMAT, path, line, message)
}
