//! `sweep`: a grid over two traces, as `moe-offload sweep GRID -o DIR` runs it (the sweep
//! crate's `prepare` then `Prepared::run`), its rows returned and, with an output directory,
//! written as the CLI writes them (results.json, results.csv, summary.md, ...).

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use sweep::{Grid, InputRef, Provenance, SweepOutput, TraceInput};
use trace_io::TraceFile;

use crate::errors::{Error, Result};
use crate::usage;

/// Adds `_sweep_json` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sweep_json, m)?)?;
    Ok(())
}

/// Configurations a grid may expand to without `yes` (the CLI's limit).
const MAX_CONFIGS: u64 = 10_000;

/// Runs the grid at `grid` (docs/grid-format.md) and returns the `results.json` document; with
/// `output`, writes the sweep's output directory too (atomically, under the same lock as the CLI).
#[pyfunction]
#[pyo3(name = "_sweep_json", signature = (grid, output=None, in_sample=None, out_of_sample=None, yes=false))]
pub fn sweep_json(
    py: Python<'_>,
    grid: PathBuf,
    output: Option<PathBuf>,
    in_sample: Option<PathBuf>,
    out_of_sample: Option<PathBuf>,
    yes: bool,
) -> PyResult<Bound<'_, PyAny>> {
    let v = crate::run::detached(py, move || run(&grid, output.as_deref(), in_sample, out_of_sample, yes))?;
    crate::run::to_py(py, &v)
}

fn run(
    path: &Path,
    output: Option<&Path>,
    in_sample: Option<PathBuf>,
    out_of_sample: Option<PathBuf>,
    yes: bool,
) -> Result<serde_json::Value> {
    // Taken first, as the CLI does: a second sweep into the same directory fails now.
    let set = output
        .map(|o| {
            trace_io::OutputSet::begin(o)
                .map_err(|e| Error::Sweep(format!("cannot write the output directory {}: {e}", o.display())))
        })
        .transpose()?;
    let mut grid = Grid::read(path).map_err(|e| {
        Error::from(e).context(format!("cannot use grid {} (see docs/grid-format.md and data/grids/)", path.display()))
    })?;
    if let Some(p) = in_sample {
        grid.traces.in_sample = p;
    }
    if let Some(p) = out_of_sample {
        grid.traces.out_of_sample = p;
    }
    let open = |p: &Path| -> Result<(TraceFile, String)> {
        let (file, digest) = rayon::join(|| TraceFile::open(p), || trace_io::trace_digest(p));
        Ok((file?, digest?))
    };
    let (calib, heldout) = rayon::join(|| open(&grid.traces.in_sample), || open(&grid.traces.out_of_sample));
    let calib = calib.map_err(|e| e.context("the in-sample trace (the grid's traces.in_sample, or in_sample)"))?;
    let heldout = heldout
        .map_err(|e| e.context("the out-of-sample trace (the grid's traces.out_of_sample, or out_of_sample)"))?;
    let recorded = grid.relative_to(path.parent().unwrap_or(Path::new("")));
    let (cs, hs) =
        (recorded.traces.in_sample.display().to_string(), recorded.traces.out_of_sample.display().to_string());
    let ins = TraceInput { view: calib.0.view(), source: &cs, digest: &calib.1 };
    let oos = TraceInput { view: heldout.0.view(), source: &hs, digest: &heldout.1 };
    let size = grid.size();
    if size > MAX_CONFIGS && !yes {
        usage!(
            "the grid expands to {size} configurations (x 2 traces), above the limit of {MAX_CONFIGS} without \
             yes=True: check the lists of its blocks, or pass yes=True to run it"
        );
    }
    let prepared = sweep::prepare(&grid, &ins, &oos)?;
    let files = grid
        .files()
        .iter()
        .zip(recorded.files())
        .map(|(path, written)| {
            Ok(InputRef {
                source: written.display().to_string(),
                digest: trace_io::Digest::sha256(trace_io::sha256_file(path)?),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = prepared.run(&ins.view, &oos.view, &|_| {});
    let out = SweepOutput {
        provenance: Provenance {
            tool_version: format!("moe-offload {} (python package)", env!("CARGO_PKG_VERSION")),
            grid: recorded,
            in_sample: InputRef { source: cs.clone(), digest: trace_io::Digest::parse(&calib.1) },
            out_of_sample: InputRef { source: hs.clone(), digest: trace_io::Digest::parse(&heldout.1) },
            stats_sha256: prepared.stats.sha256(),
            files,
            keep_maps: prepared.keep_maps(),
            // The canonical grid file's directory, as the CLI records it.
            grid_dir: path.canonicalize().ok().and_then(|g| g.parent().map(|d| d.display().to_string())),
        },
        shard: None,
        rows,
    };
    if let Some(set) = set {
        out.write_set(set)?;
    }
    let v = serde_json::to_value(&out).map_err(|e| Error::Internal(format!("internal error: {e}")))?;
    let mut doc = serde_json::Map::new();
    doc.insert("kind".into(), sweep::RESULTS_KIND.into());
    if let serde_json::Value::Object(fields) = v {
        doc.extend(fields);
    }
    Ok(serde_json::Value::Object(doc))
}
