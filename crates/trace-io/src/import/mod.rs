//! Importers: real-world routing logs to [`crate::TraceData`].
//!
//! - [`esft`]: the ESFT expert-score layout (DeepSeek-V2-Lite, one text file per domain and layer).
//! - [`vllm_routelog`]: vLLM route-logging JSON Lines (one file per layer, meta line first,
//!   prefill + batched decode, warm-up batches detected and dropped).
//! - [`mixtral_jsonl`]: per-(problem, layer, token) JSON Lines of Mixtral decode routing.
//! - [`llama_dump`]: routing dumps of llama.cpp forks (`ffn_moe_topk` ids read by an eval
//!   callback), as CSV rows (`llama-csv`) or a binary record stream (`llama-bin`); ids only.
//! - [`numpy`]: integer routing arrays (`[layers, tokens, k]` or `[tokens, layers, k]`) in `.npy` /
//!   `.npz` files (ids only: no scores).
//! - [`sglang_dump`]: SGLang's `per_token` expert-distribution dumps (`torch.save` files, read by
//!   the `pytorch-reader` crate): one record per forward pass, physical slots mapped to logical
//!   experts; ids only.
//! - [`routed_experts`]: the routed experts SGLang and vLLM return with each response
//!   (`return_routed_experts`: base64 `int32 [tokens, layers, k]`), one sequence per response;
//!   ids only.
//!
//! Every importer returns an [`Imported`]: the validated trace plus an [`ImportReport`] (records
//! read, what was dropped and why, warnings) for the caller to show. Importers never print.
//! Probabilities become scores as `ln(p)`; a probability recorded as exactly 0 (ESFT's 4-decimal
//! rounding) becomes `ln(PROB_FLOOR)` instead, counted in the report and in the metadata key
//! `floored_probs`. A full-precision probability below the floor is kept as it is.
//! Renormalization is detected, not assumed: see `RowSink::renormalized`.

use std::fmt;
use std::path::Path;

use crate::{TraceData, TraceError};

pub mod esft;
pub(crate) mod id_grid;
pub mod llama_dump;
pub mod mixtral_jsonl;
pub mod numpy;
pub mod routed_experts;
pub mod sglang_dump;
pub mod vllm_routelog;

pub use esft::PROB_FLOOR;

/// A trace built by an importer, with the report of what the importer read and dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The validated trace, ready for [`crate::write_trace`].
    pub trace: TraceData,
    /// Figures for the user: records read, tokens and layers kept, records dropped and why.
    pub report: ImportReport,
}

/// What an importer read and what it did with it. Printed by the CLI through its `Display`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ImportReport {
    /// The importer (`esft`, `vllm-routelog`, `mixtral-jsonl`, `numpy`, `llama-csv`, `llama-bin`,
    /// `sglang-dump`, `routed-experts`).
    pub format: &'static str,
    /// Input files read.
    pub files: usize,
    /// Routing records read (one record = one (layer, token) row; meta lines not counted).
    pub records_read: u64,
    /// L: layers in the trace.
    pub layers: usize,
    /// T: tokens in the trace.
    pub tokens: usize,
    /// Sequences (`seq_offsets` entries), when the input identifies them.
    pub sequences: Option<usize>,
    /// Engine steps (`step_offsets` entries), when the input records them.
    pub steps: Option<usize>,
    /// Probabilities recorded as exactly 0, floored at [`PROB_FLOOR`] before `ln`.
    pub floored_probs: u64,
    /// Input that did not make it into the trace, one entry per reason.
    pub dropped: Vec<Dropped>,
    /// Other facts worth telling the user (for example warm-up batches detected but kept).
    pub notes: Vec<String>,
    /// Signs that the trace may still hold something it should not (for example dummy rows no
    /// heuristic caught), each with what to do.
    pub warnings: Vec<String>,
}

/// Records left out of the trace for one reason.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Dropped {
    /// Why.
    pub reason: DropReason,
    /// Routing records (rows, summed over layers) dropped.
    pub records: u64,
    /// Tokens (trace positions) dropped.
    pub tokens: u64,
    /// Details in words (for example which steps).
    pub detail: String,
}

/// Why records were dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DropReason {
    /// Engine warm-up (profiling) batches on dummy input: every row of the batch has the same route.
    WarmUp,
    /// Tokens that some layers did not record: only tokens present in every layer are kept.
    IncompleteToken,
    /// Rows the user asked to skip (`--skip-rows A..B`).
    Skipped,
    /// Tokens whose every slot is padding (-1) in every layer.
    Padding,
    /// Rows repeated byte for byte (same token, layer and ids): the copies after the first.
    Duplicate,
    /// Forward passes of a kind the importer does not read (SGLang's speculative verify and draft
    /// passes).
    OtherPass,
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropReason::WarmUp => "warm-up batches",
            DropReason::IncompleteToken => "tokens missing from some layers",
            DropReason::Skipped => "rows skipped on request (--skip-rows)",
            DropReason::Padding => "padding (every slot -1 in every layer)",
            DropReason::Duplicate => "duplicate rows",
            DropReason::OtherPass => "forward passes of other modes",
        })
    }
}

impl fmt::Display for ImportReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: read {} records from {} file(s); trace: {} layers x {} tokens",
            self.format, self.records_read, self.files, self.layers, self.tokens
        )?;
        if let Some(s) = self.sequences {
            write!(f, ", {s} sequences")?;
        }
        if let Some(s) = self.steps {
            write!(f, ", {s} engine steps")?;
        }
        if self.dropped.is_empty() {
            write!(f, "\nnothing dropped")?;
        }
        for d in &self.dropped {
            let s = if d.tokens == 1 { "" } else { "s" };
            write!(f, "\ndropped {} token{s} ({} records): {}; {}", d.tokens, d.records, d.reason, d.detail)?;
        }
        if self.floored_probs > 0 {
            write!(f, "\n{} zero probabilities floored at {PROB_FLOOR} before ln", self.floored_probs)?;
        }
        for n in &self.notes {
            write!(f, "\nnote: {n}")?;
        }
        for w in &self.warnings {
            write!(f, "\nwarning: {w}")?;
        }
        Ok(())
    }
}

/// How far a row's probabilities may sum from 1 and still count as renormalized: covers f32
/// storage (about 1e-7 per value) and 4-decimal rounding of up to 20 values (5e-5 each).
pub const RENORM_TOLERANCE: f64 = 1e-3;

/// Layer-major output buffers shared by the importers: one call of [`RowSink::push`] per
/// (layer, token), layers outermost.
pub(crate) struct RowSink {
    pub ids: Vec<u16>,
    pub scores: Vec<f32>,
    pub gates: Vec<f32>,
    /// Probabilities recorded as exactly 0 (floored before `ln`).
    pub floored: u64,
    /// Rows pushed.
    pub rows: u64,
    /// Rows whose probabilities sum to 1 within [`RENORM_TOLERANCE`].
    pub rows_summing_to_one: u64,
    row: Vec<(f32, u16, f32)>,
}

impl RowSink {
    pub fn with_capacity(values: usize) -> RowSink {
        RowSink {
            ids: Vec::with_capacity(values),
            scores: Vec::with_capacity(values),
            gates: Vec::with_capacity(values),
            floored: 0,
            rows: 0,
            rows_summing_to_one: 0,
            row: Vec::new(),
        }
    }

    /// Appends one row of (id, probability) pairs: sorted by (score desc, id asc) with
    /// score = `ln(p)` computed in f64 and stored as f32, or `ln(PROB_FLOOR)` for a `p` recorded
    /// as exactly 0; gate = `p` as f32. The caller has checked ids and probabilities.
    pub fn push(&mut self, pairs: impl IntoIterator<Item = (u16, f64)>) {
        self.row.clear();
        let mut sum = 0.0;
        for (id, p) in pairs {
            sum += p;
            let score = if p == 0.0 {
                self.floored += 1;
                f64::from(PROB_FLOOR).ln() as f32
            } else {
                p.ln() as f32
            };
            self.row.push((score, id, p as f32));
        }
        self.rows += 1;
        if (sum - 1.0).abs() <= RENORM_TOLERANCE {
            self.rows_summing_to_one += 1;
        }
        self.row.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(s, id, g) in &self.row {
            self.ids.push(id);
            self.scores.push(s);
            self.gates.push(g);
        }
    }

    /// True when at least one row was pushed and every row's probabilities sum to 1 within
    /// [`RENORM_TOLERANCE`]: the logger renormalized them over the k used experts, so their
    /// `ln` orders the experts right but is not the model's log-softmax (`log_probs_renormalized`).
    pub fn renormalized(&self) -> bool {
        self.rows > 0 && self.rows_summing_to_one == self.rows
    }

    /// A warning when most rows sum to 1 but some do not: a renormalizing logger with damaged
    /// rows looks so, and the whole trace is then read as not renormalized.
    pub fn renorm_warning(&self) -> Option<String> {
        let off = self.rows - self.rows_summing_to_one;
        (off > 0 && self.rows_summing_to_one > off).then(|| {
            format!(
                "{off} of {} rows do not sum to 1 (the others do, within {RENORM_TOLERANCE}): the gates are read as \
                 full-softmax probabilities, not renormalized; if the logger renormalizes, those rows are damaged",
                self.rows
            )
        })
    }

    /// The metadata entries `renormalized` and `gates` for `k` used experts, from
    /// [`RowSink::renormalized`], and the score kind that goes with them.
    pub fn renorm_meta(&self, k: usize) -> (crate::ScoreKind, String, String) {
        if self.renormalized() {
            (
                crate::ScoreKind::LogProbsRenormalized,
                format!("true: probabilities renormalized over the top-{k}"),
                format!("probabilities renormalized over the {k} used experts"),
            )
        } else {
            (
                crate::ScoreKind::LogProbs,
                format!("false: {} of {} rows sum to 1 within {RENORM_TOLERANCE}", self.rows_summing_to_one, self.rows),
                "full-softmax probabilities of the used experts, not renormalized".to_string(),
            )
        }
    }
}

impl RowSink {
    /// The trace of the rows pushed (`tokens` rows of `k` per layer, scores and gates, no output
    /// norms) with its offsets, validated by [`TraceData::new`]; errors name `path`.
    pub fn into_trace(
        self,
        meta: crate::TraceMeta,
        tokens: usize,
        k: usize,
        offsets: (Option<Vec<u64>>, Option<Vec<u64>>),
        path: &Path,
    ) -> Result<TraceData, TraceError> {
        let (seq_offsets, step_offsets) = offsets;
        let parts = crate::OwnedParts {
            ids: self.ids,
            scores: Some(self.scores),
            gates: Some(self.gates),
            out_norms: None,
            seq_offsets,
            step_offsets,
        };
        TraceData::new(meta, tokens, k, parts).map_err(|e| e.in_file(path))
    }
}

/// Checks one recorded row (ids and probabilities of one (layer, token)) and converts the ids to
/// u16. `Err` carries the message for a [`TraceError::Import`].
pub(crate) fn check_row(ids: &[u32], probs: &[f64], k: usize, num_experts: u32) -> Result<(), String> {
    if ids.len() != k || probs.len() != k {
        return Err(format!("{} ids and {} weights, expected top_k = {k} of each", ids.len(), probs.len()));
    }
    for (i, &id) in ids.iter().enumerate() {
        if id >= num_experts {
            return Err(format!(
                "slot {i}: expert id {id} >= num_experts {num_experts}: is --num-experts right? (ids counted from 1 \
                 also end here)"
            ));
        }
        if ids[..i].contains(&id) {
            return Err(format!("slot {i}: expert id {id} repeated in the row"));
        }
    }
    for (i, &p) in probs.iter().enumerate() {
        // Softmax outputs; allow float noise just above 1.
        if !(p.is_finite() && (0.0..=1.0 + 1e-6).contains(&p)) {
            return Err(format!("slot {i}: probability {p} is not in [0, 1]"));
        }
    }
    Ok(())
}

/// Streams the lines of the text file at `path` to `f` with their 1-based numbers (without the line
/// ending; a trailing `\r` removed; a UTF-8 byte-order mark before the first line removed), one
/// reused buffer, stopping at `f`'s first error.
pub(crate) fn for_each_line(
    path: &Path,
    mut f: impl FnMut(usize, &str) -> crate::Result<std::ops::ControlFlow<()>>,
) -> crate::Result<()> {
    use std::io::BufRead;
    let file = crate::open_regular_file(path).map_err(|e| TraceError::Io(e).in_file(path))?;
    let mut r = std::io::BufReader::with_capacity(1 << 16, file);
    let mut buf = String::new();
    let mut n = 0;
    loop {
        buf.clear();
        if r.read_line(&mut buf).map_err(|e| TraceError::Io(e).in_file(path))? == 0 {
            return Ok(());
        }
        n += 1;
        let mut line = buf.trim_end_matches('\n').trim_end_matches('\r');
        if n == 1 {
            line = line.strip_prefix('\u{feff}').unwrap_or(line);
        }
        if f(n, line)?.is_break() {
            return Ok(());
        }
    }
}

/// The first layer id missing between the lowest and the highest of `sorted` (increasing,
/// distinct), with all the missing ones in words (`"layer 7"`, `"layers 3, 7"`; at most ten
/// listed, then the count), or `None` when the ids are consecutive. For logs that record every MoE
/// layer of the model: a gap means a lost file or lost records, not a layer the model lacks.
pub(crate) fn missing_layers(sorted: &[u32]) -> Option<(u32, String)> {
    const LISTED: usize = 10;
    let mut first = None;
    let mut listed = Vec::new();
    let mut total = 0u64;
    for w in sorted.windows(2) {
        let gap = w[0].saturating_add(1)..w[1];
        if gap.is_empty() {
            continue;
        }
        total += u64::from(w[1] - w[0] - 1);
        first.get_or_insert(gap.start);
        // Only the ids still to be listed are visited: a gap of billions costs nothing.
        listed.extend(gap.take(LISTED - listed.len()).map(|id| id.to_string()));
    }
    let words = match total {
        1 => format!("layer {}", listed[0]),
        n if n as usize <= LISTED => format!("layers {}", listed.join(", ")),
        n => format!("layers {}, ... ({n} in all)", listed.join(", ")),
    };
    first.map(|f| (f, words))
}

/// The message for a JSON record that did not parse as the importer's record: serde's error,
/// then, when the line is a JSON object, the fields it has and the ones `expected` (each
/// possibly with a note such as `(optional)`), and for a field that looks like a renamed
/// expected one (`token_pos` for `token_idx`) what to do.
pub(crate) fn record_error(line: &str, e: &serde_json::Error, expected: &[&str]) -> String {
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(line) else {
        return format!("{e}{}", not_a_record_line(line));
    };
    let name = |f: &str| f.split(' ').next().unwrap_or(f).to_string();
    let wanted: Vec<String> = expected.iter().map(|f| name(f)).collect();
    let found: Vec<&str> = m.keys().map(String::as_str).collect();
    // A value of the wrong type or range (not a missing field): the field whose value holds
    // serde's column.
    let field = (e.classify() == serde_json::error::Category::Data && e.to_string().starts_with("invalid"))
        .then(|| field_at(line, &found, e.column()))
        .flatten()
        .map_or_else(String::new, |f| format!("field `{f}`: "));
    let mut msg = format!("{field}{e}; the record has fields {}; expected {}", found.join(", "), expected.join(", "));
    for w in wanted.iter().filter(|w| !m.contains_key(w.as_str())) {
        // A present field that shares the expected one's first word (`token_pos` ~ `token_idx`).
        let stem = w.split('_').next().unwrap_or(w);
        if let Some(f) = found.iter().find(|f| !wanted.iter().any(|x| x == *f) && f.split('_').next() == Some(stem)) {
            msg.push_str(&format!(
                "; `{f}` is not `{w}`: if it holds the same thing, rename it (for `token_idx`: the \
                 token's position in its sequence, 0, 1, 2, ...)"
            ));
        }
    }
    msg
}

/// The field of a one-line JSON object whose value holds 1-based column `col`: the last of
/// `keys` whose `"key":` starts before it.
fn field_at<'k>(line: &str, keys: &[&'k str], col: usize) -> Option<&'k str> {
    let before = line.get(..col.min(line.len()))?;
    keys.iter()
        .filter_map(|k| {
            let quoted = format!("\"{k}\"");
            before
                .match_indices(&quoted)
                .map(|(i, _)| i)
                .find(|&i| before[i + quoted.len()..].trim_start().starts_with(':'))
                .map(|i| (i, *k))
        })
        .max()
        .map(|(_, k)| k)
}

/// What a line that is no JSON object looks like, as a hint after serde's message: a JSON
/// array (the file is one document, not one record per line), a record spread over lines
/// (pretty-printed), or a non-finite number as Python's `json.dumps` writes it.
fn not_a_record_line(line: &str) -> &'static str {
    let t = line.trim_start();
    if t.starts_with('[') {
        "; the line is a JSON array: this format is JSON Lines, one record (an object) per line (`jq -c '.[]' FILE` \
         writes a JSON array so)"
    } else if t == "{" || (t.starts_with('{') && !t.trim_end().ends_with('}')) {
        "; the record is spread over several lines (pretty-printed JSON): this format is JSON Lines, one record per \
         line (`jq -c . FILE` writes it so)"
    } else if ["NaN", "Infinity"].iter().any(|w| line.contains(w)) {
        "; NaN and Infinity (as Python's json.dumps writes non-finite floats) are not JSON, and a routing record's \
         probabilities must be finite: fix the logger or drop those records"
    } else {
        ""
    }
}

/// A [`TraceError::Import`] at `path` (and line, 1-based, when given).
pub(crate) fn import_err(format: &'static str, path: &Path, line: Option<usize>, message: String) -> TraceError {
    let location = match line {
        Some(n) => format!("{}:{n}", path.display()),
        None => path.display().to_string(),
    };
    TraceError::Import { format, location, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_sorts_by_score_then_id_and_floors_zeros() {
        let mut s = RowSink::with_capacity(8);
        s.push([(5, 0.1), (2, 0.3), (7, 0.3), (1, 0.0)]);
        assert_eq!(s.ids, vec![2, 7, 5, 1]);
        assert_eq!(s.gates, vec![0.3, 0.3, 0.1, 0.0]);
        assert_eq!(s.scores[0], 0.3f64.ln() as f32);
        assert_eq!(s.scores[3], f64::from(PROB_FLOOR).ln() as f32);
        assert_eq!(s.floored, 1);
        // A full-precision probability below the floor is kept as it is, and not counted.
        s.push([(0, 0.9999), (3, 2.8e-5)]);
        assert_eq!(s.scores[5], 2.8e-5f64.ln() as f32);
        assert!(s.scores[5] < f64::from(PROB_FLOOR).ln() as f32);
        assert_eq!(s.floored, 1);
    }

    #[test]
    fn renormalization_is_detected_from_the_row_sums() {
        // (rows, renormalized): every row must sum to 1 within the tolerance.
        let cases: [(&[[f64; 2]], bool); 5] = [
            (&[[0.75, 0.25], [0.5, 0.5]], true),
            (&[[0.75, 0.2504]], true), // 4-decimal rounding
            (&[[0.75, 0.25], [0.3, 0.2]], false),
            (&[[0.1, 0.05]], false),
            (&[], false),
        ];
        for (rows, want) in cases {
            let mut s = RowSink::with_capacity(4);
            for r in rows {
                s.push([(0, r[0]), (1, r[1])]);
            }
            assert_eq!(s.renormalized(), want, "{rows:?}");
            let (kind, renorm, gates) = s.renorm_meta(2);
            assert_eq!(kind == crate::ScoreKind::LogProbsRenormalized, want);
            assert_eq!(renorm.starts_with("true"), want, "{renorm}");
            assert_eq!(gates.contains("not renormalized"), !want, "{gates}");
        }
    }

    #[test]
    fn record_errors_name_the_fields_found_and_expected() {
        #[derive(serde::Deserialize, Debug)]
        #[expect(dead_code, reason = "only the parse matters")]
        struct R {
            layer: u32,
            token_idx: u64,
        }
        let line = r#"{"layer": 3, "token_pos": 7}"#;
        let e = serde_json::from_str::<R>(line).unwrap_err();
        let m = record_error(line, &e, &["layer", "token_idx"]);
        assert!(m.starts_with("missing field `token_idx`"), "{m}");
        assert!(m.contains("the record has fields layer, token_pos; expected layer, token_idx"), "{m}");
        assert!(m.contains("`token_pos` is not `token_idx`: if it holds the same thing, rename it"), "{m}");
        // A value of the wrong type names its field.
        let line = r#"{"layer": "3", "token_idx": 7}"#;
        let e = serde_json::from_str::<R>(line).unwrap_err();
        assert!(record_error(line, &e, &["layer"]).starts_with("field `layer`: invalid type: string \"3\""));
        let line = r#"{"layer": 3, "token_idx": 7.5}"#;
        let e = serde_json::from_str::<R>(line).unwrap_err();
        assert!(record_error(line, &e, &["layer"]).starts_with("field `token_idx`: invalid type: floating point"));
        // Not an object: serde's message, and what the line looks like.
        let check = |line: &str, hint: &str| {
            let e = serde_json::from_str::<R>(line).unwrap_err();
            let m = record_error(line, &e, &["layer"]);
            assert!(m.starts_with(&e.to_string()) && m.contains(hint), "{m}");
        };
        check("[1]", "the line is a JSON array: this format is JSON Lines");
        check("{", "spread over several lines");
        check(r#"{"layer": 3, "token_idx": NaN}"#, "NaN and Infinity");
        let e = serde_json::from_str::<R>("7").unwrap_err();
        assert_eq!(record_error("7", &e, &["layer"]), e.to_string());
    }

    #[test]
    fn missing_layers_lists_the_gaps() {
        assert_eq!(missing_layers(&[1, 2, 3]), None);
        assert_eq!(missing_layers(&[4]), None);
        assert_eq!(missing_layers(&[1, 2, 4]), Some((3, "layer 3".into())));
        assert_eq!(missing_layers(&[0, 2, 5]), Some((1, "layers 1, 3, 4".into())));
        let many = "layers 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (99 in all)";
        assert_eq!(missing_layers(&[0, 100]), Some((1, many.into())));
        let huge = "layers 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, ... (4000000000 in all)";
        assert_eq!(missing_layers(&[0, 4_000_000_001]), Some((1, huge.into())));
    }

    #[test]
    fn row_checks_name_the_slot() {
        assert!(check_row(&[1, 2], &[0.5, 0.5], 2, 4).is_ok());
        assert!(check_row(&[1, 4], &[0.5, 0.5], 2, 4).unwrap_err().contains("slot 1: expert id 4 >= num_experts 4"));
        assert!(check_row(&[1, 1], &[0.5, 0.5], 2, 4).unwrap_err().contains("repeated"));
        assert!(check_row(&[1, 2], &[0.5, f64::NAN], 2, 4).unwrap_err().contains("slot 1: probability NaN"));
        assert!(check_row(&[1, 2], &[-0.1, 0.5], 2, 4).unwrap_err().contains("slot 0"));
        assert!(check_row(&[1], &[0.5], 2, 4).unwrap_err().contains("expected top_k = 2"));
    }
}
