//! The document of `import ... --json`: the trace written and what the importer read, dropped and
//! noticed (its [`ImportReport`]). The imports themselves are trace-io's
//! (`trace_io::import::*`); this module only shapes what the front ends print.

use std::path::Path;

use serde_json::{Value, json};
use trace_io::TraceView;
use trace_io::import::ImportReport;

/// The `moe-offload-import` document of a trace written to `output` from `report`.
pub fn document(output: &Path, trace: &TraceView<'_>, report: &ImportReport) -> Value {
    let m = trace.meta();
    json!({
        "kind": crate::kind::IMPORT,
        "output": output,
        "format": report.format,
        "shape": trace.shape(),
        "layer_ids": m.layer_ids,
        "phase": m.phase.as_str(),
        "score_kind": m.score_kind.as_str(),
        "sequences": report.sequences,
        "steps": report.steps,
        "report": report,
        "metadata": m.extra,
    })
}
