//! Importers: real-world routing logs to [`crate::TraceData`].
//!
//! - [`esft`]: the ESFT expert-score layout (DeepSeek-V2-Lite, one text file per domain and layer).
//! - [`vllm_routelog`]: vLLM route-logging JSON Lines (one file per layer, meta line first,
//!   prefill + batched decode, warm-up batches detected and dropped).
//! - [`mixtral_jsonl`]: per-(problem, layer, token) JSON Lines of Mixtral decode routing.
//!
//! Every importer returns an [`Imported`]: the validated trace plus an [`ImportReport`] (records
//! read, what was dropped and why) for the caller to show. Importers never print.
//! Probabilities become scores as `ln(max(p, PROB_FLOOR))`; floored values are counted in the
//! report and in the metadata key `floored_probs`.

use std::fmt;
use std::path::Path;

use crate::{TraceData, TraceError};

pub mod esft;
pub mod mixtral_jsonl;
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
    /// The importer (`esft`, `vllm-routelog`, `mixtral-jsonl`).
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
    /// Probabilities below [`PROB_FLOOR`] that were floored before `ln`.
    pub floored_probs: u64,
    /// Input that did not make it into the trace, one entry per reason.
    pub dropped: Vec<Dropped>,
    /// Other facts worth telling the user (for example warm-up batches detected but kept).
    pub notes: Vec<String>,
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
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DropReason::WarmUp => "warm-up batches",
            DropReason::IncompleteToken => "tokens missing from some layers",
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
        Ok(())
    }
}

/// Layer-major output buffers shared by the importers: one call of [`RowSink::push`] per
/// (layer, token), layers outermost.
pub(crate) struct RowSink {
    pub ids: Vec<u16>,
    pub scores: Vec<f32>,
    pub gates: Vec<f32>,
    pub floored: u64,
    row: Vec<(f32, u16, f32)>,
}

impl RowSink {
    pub fn with_capacity(values: usize) -> RowSink {
        RowSink {
            ids: Vec::with_capacity(values),
            scores: Vec::with_capacity(values),
            gates: Vec::with_capacity(values),
            floored: 0,
            row: Vec::new(),
        }
    }

    /// Appends one row of (id, probability) pairs: sorted by (score desc, id asc) with
    /// score = `ln(max(p, PROB_FLOOR))` computed in f64 and stored as f32; gate = `p` as f32.
    /// The caller has checked ids and probabilities.
    pub fn push(&mut self, pairs: impl IntoIterator<Item = (u16, f64)>) {
        self.row.clear();
        for (id, p) in pairs {
            if p < f64::from(PROB_FLOOR) {
                self.floored += 1;
            }
            let score = p.max(f64::from(PROB_FLOOR)).ln() as f32;
            self.row.push((score, id, p as f32));
        }
        self.row.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(s, id, g) in &self.row {
            self.ids.push(id);
            self.scores.push(s);
            self.gates.push(g);
        }
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
            return Err(format!("slot {i}: expert id {id} >= num_experts {num_experts}"));
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
/// ending; a trailing `\r` removed), one reused buffer, stopping at `f`'s first error.
pub(crate) fn for_each_line(
    path: &Path,
    mut f: impl FnMut(usize, &str) -> crate::Result<std::ops::ControlFlow<()>>,
) -> crate::Result<()> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).map_err(|e| TraceError::Io(e).in_file(path))?;
    let mut r = std::io::BufReader::with_capacity(1 << 16, file);
    let mut buf = String::new();
    let mut n = 0;
    loop {
        buf.clear();
        if r.read_line(&mut buf).map_err(|e| TraceError::Io(e).in_file(path))? == 0 {
            return Ok(());
        }
        n += 1;
        let line = buf.trim_end_matches('\n').trim_end_matches('\r');
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
