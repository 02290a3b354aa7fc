//! `moe-offload report`: one self-contained HTML page (inline SVG, no network) of the plots and
//! tables of a sweep directory, plus the retention tables and miss-ratio curves found beside it.
//! `docs/report.md` describes every plot.
//!
//! [`inputs`] finds and reads the files, [`sections`] builds each section from one model of the
//! rows, [`svg`] draws the plots (one colour per policy everywhere), [`html`] lays out the page.

mod budget;
mod deploy;
mod html;
mod hybrid;
mod inputs;
mod prefetch;
mod sections;
mod svg;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use sweep::SweepOutput;

use html::esc;
use inputs::{MrcCurve, RetentionFile};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A `moe-offload sweep -o DIR` output directory (holding results.json). Retention tables
    /// (`retention --json` output) and miss-ratio curves (`mrc` output) saved as *.json in it are
    /// plotted too.
    pub dir: PathBuf,
    /// The HTML file to write (default: DIR/report.html; `-` for stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// More `retention --json` files to plot (besides those found in DIR).
    #[arg(long, value_name = "FILE")]
    pub retention: Vec<PathBuf>,
    /// More miss-ratio-curve JSON files to plot (besides those found in DIR).
    #[arg(long, value_name = "FILE")]
    pub mrc: Vec<PathBuf>,
    /// Draw cache sizes on a logarithmic (base 2) axis.
    #[arg(long)]
    pub log_x: bool,
}

/// Runs `report`.
pub fn run(a: &ReportArgs) -> Result<()> {
    let results = a.dir.join("results.json");
    if !a.dir.is_dir() {
        anyhow::bail!(
            "{}: no such directory: give the output directory of a sweep (`moe-offload sweep -o DIR` writes one)",
            a.dir.display()
        );
    }
    if !results.is_file() {
        anyhow::bail!(
            "{} has no results.json: give the output directory of a sweep (`moe-offload sweep -o {}` writes one)",
            a.dir.display(),
            a.dir.display()
        );
    }
    let sweep = SweepOutput::read(&results)?;
    let inputs = inputs::load(a)?;
    let output = a.output.clone().unwrap_or_else(|| a.dir.join("report.html"));
    super::refuse_directory(&output)?;
    super::refuse_overwrite(
        &output,
        std::iter::once(results.as_path()).chain(inputs.read.iter().map(PathBuf::as_path)),
    )?;
    let html = render(&sweep, &inputs.retention, &inputs.mrc, a.log_x).context("drawing the plots")?;
    super::write_output(&output, html.as_bytes())?;
    let mut out = super::human(&output);
    writeln!(
        out,
        "wrote {}: {} rows, {} retention tables, {} miss-ratio curves",
        output.display(),
        sweep.rows.len(),
        inputs.retention.len(),
        inputs.mrc.len()
    )?;
    for p in inputs.skipped {
        writeln!(out, "note: {} is neither a retention table nor a miss-ratio curve; not plotted", p.display())?;
    }
    Ok(())
}

/// The whole page.
fn render(sweep: &SweepOutput, retention: &[RetentionFile], mrc: &[MrcCurve], log_x: bool) -> Result<String> {
    let m = sections::Model::new(sweep, log_x);
    let mut retention_html = String::new();
    if retention.is_empty() {
        retention_html += "<p>No retention table found. Save <code>moe-offload retention MAPS... --heldout H --json</code> \
                 output as a .json file in the report directory (or pass <code>--retention FILE</code>) to plot \
                 retention vs K per metric.</p>";
    }
    for rf in retention {
        retention_html += &sections::retention(rf)?;
    }
    let parts = [
        ("summary", "Summary: best online policy per variant and cache size", sections::summary(&m)),
        ("policies", "Misses per token by policy and variant", sections::policies_section(&m)?),
        ("capacity", "Miss ratio, tok/s and hit rate vs cache size", sections::capacity(&m, mrc)?),
        ("budget", "tok/s vs memory budget, every configuration", budget::section(sweep)?),
        ("lambda", "Misses per token vs λ", sections::lambda(&m)?),
        ("shift", "In-sample vs out-of-sample", sections::shift(&m)?),
        ("deployments", "Deployments: pins, tier 2, batches", deploy::section(sweep)?),
        (
            "prefetch",
            "Prefetch: precision and tok/s against the budget, real vs shuffled order",
            prefetch::section(sweep)?,
        ),
        ("hybrid", "Hybrid execution: tok/s against experts per layer on the GPU", hybrid::section(sweep)?),
        ("retention", "Retention vs K", retention_html),
        ("provenance", "Provenance", sections::provenance(sweep)),
    ];
    let mut body = String::new();
    let mut toc = Vec::new();
    for (id, name, html) in parts {
        toc.push(format!("<a href=\"#{id}\">{}</a>", esc(name)));
        let _ = writeln!(body, "<section id=\"{id}\"><h2>{}</h2>{html}</section>", esc(name));
    }
    let p = &sweep.provenance;
    let title = if p.grid.name.is_empty() { "moe-offload sweep report".to_string() } else { p.grid.name.clone() };
    let sub = format!(
        "moe-offload {} report of a sweep: {} rows, {} configurations × 2 traces. Self-contained: no scripts, no \
         network.",
        esc(&p.tool_version),
        sweep.rows.len(),
        sweep.rows.len() / 2
    );
    Ok(html::page(&title, &sub, &toc, &body))
}
