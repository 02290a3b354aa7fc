//! `moe-offload mrc`: miss-ratio curves, the misses of every cache size per layer, and the curve
//! helpers `plan` shares (the work a curve costs, its bound, the keep map of a curve).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use api::inputs::{MapSource, TraceSource};
use api::mrc::MrcRequest;
use cachesim::{Policy, Semantics};
use clap::Args;

use crate::args::{Flags, Spelled};

#[derive(Debug, Args)]
pub struct MrcArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Keep map JSON, or a plan written by `moe-offload plan` (its chosen keep map, as `replay
    /// --keep plan.json` reads it); default: every expert kept.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    // Cache policy (its help says which take one pass, from the policies' facts).
    #[arg(long, default_value = "lru", value_parser = crate::args::policy(), help = crate::args::mrc_policy_help())]
    pub policy: Policy,
    /// Caps `a..b` (inclusive; default k_used..E): k_used <= a, b <= E.
    #[arg(long, value_parser = parse_caps)]
    pub caps: Option<(usize, usize)>,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long, value_parser = crate::args::at_least_one)]
    pub k_used: Option<usize>,
    /// Warmup tokens not counted. Belady is a lower bound of every online policy only with
    /// `--warmup 0`; counted from a warmup it may exceed one by up to the cap per layer.
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// Residency semantics: k-way (default) or sequential.
    #[arg(long, default_value = "k-way")]
    pub semantics: Semantics,
    /// Compute a curve above the limit of work (see the announcement the command prints).
    #[arg(long)]
    pub yes: bool,
    /// Pin map (a keep-map JSON, SEMANTICS.md §9): the curve of the unpinned stream, pinned picks
    /// counted as hits; memory per layer = pins + cap. lru only (one pass).
    #[arg(long)]
    pub pin: Option<PathBuf>,
    /// Output JSON; a CSV (layer_id, cap, misses, misses_per_token) is written beside it.
    /// Required unless --json.
    #[arg(short, long, required_unless_present = "json")]
    pub output: Option<PathBuf>,
    /// Print the output JSON (kind `moe-offload-mrc`) on stdout instead of the table; status
    /// lines go to stderr. Without -o nothing is written.
    #[arg(long)]
    pub json: bool,
}

fn parse_caps(s: &str) -> std::result::Result<(usize, usize), String> {
    let (a, b) = s.split_once("..").ok_or("expected a..b, for example 8..64")?;
    let a: usize = a.parse().map_err(|_| format!("{a:?} is not a whole number"))?;
    let b: usize = b.parse().map_err(|_| format!("{b:?} is not a whole number"))?;
    if a > b {
        return Err(format!("empty range {a}..{b}"));
    }
    Ok((a, b))
}

/// The work of a curve and its description (`api::work::curve_work`; `plan` shares it).
pub(super) use api::work::curve_work;

/// Refuses `steps` of curve work above the limit without `--yes` (`api::work::bound_curves`).
/// `narrow`: how the command's own options make the work smaller, with option markers.
pub(super) fn bound_curves(steps: u64, yes: bool, narrow: &str) -> Result<()> {
    api::work::bound_curves(steps, yes, narrow).flags()
}

/// Runs `mrc`.
pub fn mrc(a: &MrcArgs) -> Result<()> {
    // `--json` without `-o`: the document on stdout, no file.
    let files = match &a.output {
        Some(output) => {
            super::refuse_stdout(
                output,
                "it writes a JSON file and a CSV beside it: give -o mrc.json; --json prints the JSON",
            )?;
            let csv_path = output.with_extension("csv");
            if csv_path == *output {
                bail!(
                    "-o {}: the CSV written beside the JSON output would be this same file; give the output a .json \
                     name",
                    output.display()
                );
            }
            for out in [output, &csv_path] {
                super::refuse_overwrite(out, std::iter::once(a.trace.as_path()).chain(a.keep.as_deref()))?;
            }
            Some((output.clone(), csv_path))
        }
        None => None,
    };
    let request = MrcRequest {
        keep: a.keep.clone().map(MapSource::Path),
        caps: a.caps,
        k_used: a.k_used,
        warmup: a.warmup,
        semantics: a.semantics,
        yes: a.yes,
        pin: a.pin.clone().map(MapSource::Path),
        ..MrcRequest::new(TraceSource::Path(a.trace.clone()), a.policy)
    };
    // The work line comes first: it is what the refusal of too much work without --yes is about;
    // the bar runs from then on.
    let mut working = None;
    let report = request.run(&mut |work| {
        crate::progress::status!("{}", work.render(&Flags));
        working = Some(crate::progress::working("mrc"));
    });
    if let Some(w) = working {
        w.finish();
    }
    let report = report.flags()?;
    let (c, value) = (&report.curve, report.document());
    let Some((output, csv_path)) = files else {
        return super::json::print(&value);
    };
    let json = serde_json::to_vec_pretty(&value)?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["layer_id", "cap", "misses", "misses_per_token"])?;
    for l in &c.layers {
        for (i, m) in l.misses.iter().enumerate() {
            let mpt = if c.tokens == 0 { 0.0 } else { *m as f64 / c.tokens as f64 };
            w.write_record([l.layer_id.to_string(), (c.min_cap + i).to_string(), m.to_string(), mpt.to_string()])?;
        }
    }
    let bytes = w.into_inner()?;
    // Both or neither: a full disk while writing the CSV must not leave the JSON without it.
    trace_io::write_atomic_files(&[(&output, &json), (&csv_path, &bytes)])
        .with_context(|| format!("writing {} and {}", output.display(), csv_path.display()))?;
    if a.json {
        super::status(format_args!("wrote {} and {}", output.display(), csv_path.display()));
        return super::json::print(&value);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "wrote {} and {}", output.display(), csv_path.display())?;
    let mut t = comfy_table::Table::new();
    t.set_header(["cap", "misses/token (all layers)", "hit rate"]);
    let picks = c.picks_per_layer * c.layers.len() as u64;
    for cap in table_caps(c.min_cap, c.max_cap) {
        let m = c.total_misses(cap);
        let hr = if picks == 0 { 0.0 } else { 1.0 - m as f64 / picks as f64 };
        t.add_row([cap.to_string(), format!("{:.4}", c.misses_per_token(cap)), format!("{hr:.4}")]);
    }
    super::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    Ok(())
}

/// The caps of the printed table: about a dozen from `min` in equal steps, and always `max`.
fn table_caps(min: usize, max: usize) -> Vec<usize> {
    let step = ((max - min) / 12).max(1);
    let mut caps: Vec<usize> = (min..=max).step_by(step).collect();
    if caps.last() != Some(&max) {
        caps.push(max);
    }
    caps
}
