//! Reading one route-log file: its meta line, then its route rows, engine steps and engine runs.

use std::borrow::Cow;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use super::import_err;
use crate::Result;
use crate::import::{check_row, for_each_line, record_error};

/// The fields of a route record, for error messages.
const ROUTE_FIELDS: [&str; 6] =
    ["type (\"route\")", "req_id (ignored)", "token_idx", "layer", "topk_ids", "topk_weights"];

/// A meta record: line 1 of every file, and again wherever a logger appended a new engine run.
#[derive(serde::Deserialize)]
pub(super) struct MetaLine<'a> {
    #[serde(rename = "type", borrow)]
    pub kind: Cow<'a, str>,
    pub model_id: Option<String>,
    pub vllm_version: Option<String>,
    pub layers_logged: Option<Vec<u32>>,
    pub top_k: Option<u32>,
    pub num_experts: Option<u32>,
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

/// One parsed file: one layer's rows, flattened `[rows, k]`, its step sizes and engine runs.
pub(super) struct LayerLog {
    pub path: PathBuf,
    pub layer: u32,
    pub model: Option<String>,
    pub vllm_version: Option<String>,
    pub ids: Vec<u16>,
    pub probs: Vec<f64>,
    /// Sizes of the engine steps (a step starts where `token_idx` is 0), in file order.
    pub steps: Vec<usize>,
    /// Rows (0-based route-row indices) before which a meta line after line 1 announced a new
    /// engine run.
    pub meta_runs: Vec<usize>,
    /// The 1-based line number of every row.
    pub lines: Vec<u32>,
}

impl LayerLog {
    /// Route rows of the file.
    pub fn rows(&self) -> usize {
        self.lines.len()
    }

    /// The line of row `r` (or of the last row + 1 past the end), for messages.
    pub fn line_of(&self, r: usize) -> usize {
        self.lines.get(r).map_or_else(|| self.lines.last().map_or(2, |&l| l as usize + 1), |&l| l as usize)
    }
}

/// Reads line 1 of `path`, which must be a meta record.
pub(super) fn read_meta(path: &Path) -> Result<MetaLine<'static>> {
    let mut first = String::new();
    for_each_line(path, |_, line| {
        first.push_str(line);
        Ok(ControlFlow::Break(()))
    })?;
    let meta: MetaLine<'_> = serde_json::from_str(&first).map_err(|e| {
        import_err(
            path,
            Some(1),
            format!(
                "the first line must be the meta record ({{\"type\": \"meta\", \"model_id\", \"layers_logged\", \
                 \"top_k\", ...}}): {e}; give the file as the logger wrote it, meta line first"
            ),
        )
    })?;
    if meta.kind != "meta" {
        return Err(import_err(
            path,
            Some(1),
            format!(
                "the first line must be the meta record, not type {:?}; give the file as the logger wrote it",
                meta.kind
            ),
        ));
    }
    Ok(MetaLine { kind: Cow::Owned(meta.kind.into_owned()), ..meta })
}

/// Parses the route lines of one file (line 1, the meta line, was read by [`read_meta`]). A meta
/// line further down starts a new engine run: its `top_k` and `layers_logged` must agree with the
/// file's, and the next row must start a step (`token_idx` 0).
pub(super) fn parse_rows(path: &Path, num_experts: u32, top_k: Option<usize>) -> Result<LayerLog> {
    let mut ids = Vec::new();
    let mut probs = Vec::new();
    let mut steps: Vec<usize> = Vec::new();
    let mut meta_runs = Vec::new();
    let mut lines: Vec<u32> = Vec::new();
    let mut layer: Option<u32> = None;
    let mut k = top_k;
    let mut prev_idx: Option<u64> = None;
    for_each_line(path, |line_no, line| {
        if line_no == 1 || line.trim().is_empty() {
            return Ok(ControlFlow::Continue(()));
        }
        let err = |msg: String| import_err(path, Some(line_no), msg);
        let r: RouteLine<'_> = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) => {
                // A meta line inside the file: the logger appended a second engine run.
                if let Ok(m) = serde_json::from_str::<MetaLine<'_>>(line)
                    && m.kind == "meta"
                {
                    if let (Some(mk), Some(k)) = (m.top_k, k)
                        && mk as usize != k
                    {
                        return Err(err(format!(
                            "meta line of a new engine run has top_k = {mk}, the rows before have {k}: \
                             give each run of another configuration as its own file"
                        )));
                    }
                    if let (Some(ll), Some(l)) = (&m.layers_logged, layer)
                        && !ll.contains(&l)
                    {
                        return Err(err(format!(
                            "meta line of a new engine run logs layers {ll:?}, but this file holds layer {l}"
                        )));
                    }
                    if meta_runs.last() != Some(&lines.len()) && !lines.is_empty() {
                        meta_runs.push(lines.len());
                    }
                    prev_idx = None;
                    return Ok(ControlFlow::Continue(()));
                }
                return Err(err(format!("not a route record: {}", record_error(line, &e, &ROUTE_FIELDS))));
            }
        };
        if r.kind != "route" {
            return Err(err(format!(
                "record type {:?}, expected \"route\" (or \"meta\" for a new engine run)",
                r.kind
            )));
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
        check_row(&r.topk_ids, &r.topk_weights, width, num_experts)
            .map_err(|m| err(format!("topk_ids/topk_weights: {m}")))?;
        match (prev_idx, r.token_idx) {
            (_, 0) => steps.push(1),
            (Some(p), t) if t == p + 1 => *steps.last_mut().expect("a step is open after token_idx 0") += 1,
            (p, t) => {
                let expected = p.map_or("0 (the first row of a step)".to_string(), |p| {
                    format!("0 (a new step) or {} (the next row of this step)", p + 1)
                });
                return Err(err(format!(
                    "token_idx {t}, expected {expected}: rows were lost or reordered here, so the layers cannot be \
                     aligned row by row; use the part of the log before this line (cut it at a step start)"
                )));
            }
        }
        prev_idx = Some(r.token_idx);
        // Ids were checked against num_experts <= 65536.
        ids.extend(r.topk_ids.iter().map(|&i| i as u16));
        probs.extend_from_slice(&r.topk_weights);
        lines.push(u32::try_from(line_no).unwrap_or(u32::MAX));
        Ok(ControlFlow::Continue(()))
    })?;
    let layer = layer.ok_or_else(|| {
        import_err(
            path,
            None,
            "no route records after the meta line: the logger recorded nothing for this layer; leave the file out"
                .into(),
        )
    })?;
    Ok(LayerLog {
        path: path.to_path_buf(),
        layer,
        model: None,
        vllm_version: None,
        ids,
        probs,
        steps,
        meta_runs,
        lines,
    })
}
