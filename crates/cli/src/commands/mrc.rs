//! `moe-offload mrc`: miss-ratio curves, the misses of every cache size per layer, and the curve
//! helpers `plan` shares (the work a curve costs, its bound, the keep map of a curve).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::mrc::CurveConfig;
use cachesim::{Keep, Policy, Semantics};
use clap::Args;

use crate::args::Spelled;
use api::inputs::MapSource;
use trace_io::{TraceFile, TraceView};

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

/// The keep map of `path` (a keep map, or a plan's chosen keep map: `api::inputs::read_keep`)
/// checked against the trace of `v`; every expert kept for `None`.
pub(super) fn open_keep(path: Option<&PathBuf>, v: &TraceView<'_>) -> Result<Keep> {
    Ok(match path {
        Some(p) => {
            let src = MapSource::Path(p.clone());
            let map = api::inputs::read_keep(&src, false).flags()?;
            api::inputs::check_map_fits(&map, v.meta(), &src.name()).flags()?;
            Keep::from_layers(&v.shape(), &map.layers).with_context(|| format!("keep map {}", p.display()))?
        }
        None => Keep::full(&v.shape()),
    })
}

/// A pin map: a keep-map file, or a plan's pins (`api::inputs::read_pins`, as `replay --pin`).
fn open_pins(path: &std::path::Path, v: &TraceView<'_>) -> Result<Keep> {
    let layers = api::inputs::read_pins(&MapSource::Path(path.to_path_buf()), v.meta()).flags()?;
    Keep::from_layers(&v.shape(), &layers).with_context(|| format!("pin map {}", path.display()))
}

/// The work of the curve of `policy` on `v` over `caps` (default k_used..=E), in steps (one per
/// pick, plus the E experts of state each replay of a layer sets up), and its description.
pub(super) fn curve_work(
    v: &TraceView<'_>,
    policy: Policy,
    semantics: Semantics,
    k_used: Option<usize>,
    caps: Option<(usize, usize)>,
) -> (u64, String) {
    let s = v.shape();
    let k = k_used.unwrap_or(s.top_k);
    let (lo, hi) = caps.unwrap_or((k, s.num_experts));
    let work = cachesim::mrc::curve_work(&s, policy, semantics, k, lo, hi);
    let (n, per_replay) = (work.caps, work.per_replay);
    // One pass over every cap from k_used to E, sliced to the caps asked for.
    if work.one_pass {
        let order = match policy.facts().curve {
            cachesim::OnePass::Lru { .. } => "log E",
            _ => "the depth of the deepest pick",
        };
        let what = format!(
            "{policy} curve of caps {lo}..={hi} in one pass (O(L x T x k x {order})): about {per_replay} steps"
        );
        return (per_replay, what);
    }
    let steps = work.steps;
    let what = format!(
        "{policy} curve of caps {lo}..={hi} by one replay per cap: {n} caps x {} x ({} tokens x k_used {k} + E = {} \
         experts of state) = {steps} steps",
        super::layers(s.layers),
        s.tokens,
        s.num_experts
    );
    (steps, what)
}

/// Refuses `steps` of curve work above the limit without `--yes` (`api::work::bound_curves`).
/// `narrow`: how the command's own options make the work smaller, with option markers.
pub(super) fn bound_curves(steps: u64, yes: bool, narrow: &str) -> Result<()> {
    api::work::bound_curves(steps, yes, narrow).flags()
}

/// Refuses caps of `caps` outside k_used..=E (before any work): below k_used a token cannot
/// hold its experts (SEMANTICS.md §5; cap 0, no cache, is the deployed replay of §9, `replay
/// --cap 0`), above E there is nothing more to cache.
fn check_caps(caps: Option<(usize, usize)>, k_used: usize, e: usize) -> Result<()> {
    let Some((lo, hi)) = caps else { return Ok(()) };
    if lo < k_used {
        bail!(
            "--caps {lo}..{hi}: cap {lo} is below k_used = {k_used} (a token needs all its experts resident at once, \
             SEMANTICS.md §5): a curve covers caps k_used..E = {k_used}..{e}; cap 0 (no cache, §9) is \
             `replay --cap 0`"
        );
    }
    if hi > e {
        bail!(
            "--caps {lo}..{hi}: cap {hi} is more than the E = {e} experts per layer (a cache of E holds every \
             expert): give caps up to {e}"
        );
    }
    Ok(())
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
    let f = TraceFile::open(&a.trace)?;
    let v = f.view();
    super::require_tokens(v.shape(), &a.trace)?;
    let keep = open_keep(a.keep.as_ref(), &v)?;
    let base = CurveConfig { k_used: a.k_used, warmup: a.warmup, semantics: a.semantics, ..CurveConfig::default() };
    if a.pin.is_some() && !cachesim::mrc::has_pinned_curve(a.policy) {
        bail!(
            "--pin gives the one-pass lru curve of the unpinned stream; for {} replay each cap with `replay --pin`",
            a.policy
        );
    }
    let k_used = a.k_used.unwrap_or(v.shape().top_k);
    check_caps(a.caps, k_used, v.shape().num_experts)?;
    // The replay of the curve's first cap, refused here as the curve would refuse it (k_used above
    // the candidates, a policy that needs scores on a trace without them), before any work.
    let first = cachesim::ReplayConfig {
        k_used: a.k_used,
        warmup: a.warmup,
        semantics: a.semantics,
        ..cachesim::ReplayConfig::new(a.policy, a.caps.map_or(k_used, |(lo, _)| lo))
    };
    cachesim::validate(&v.shape(), v.parts().scores.is_some(), &first)?;
    let pins = match &a.pin {
        Some(p) => Some(open_pins(p, &v).with_context(|| format!("--pin {}", p.display()))?),
        None => None,
    };
    let (steps, what) = curve_work(&v, a.policy, a.semantics, a.k_used, a.caps);
    // The work line comes first: it is what the refusal of too much work without --yes is about.
    crate::progress::status!("mrc: {what}");
    bound_curves(steps, a.yes, "narrow ‹caps›")?;
    let working = crate::progress::working("mrc");
    let (c, pins) = match &pins {
        None => (sweep::plan::miss_curve(&v, &keep, a.policy, &base, a.caps)?, None),
        Some(pins) => {
            let full = cachesim::mrc::lru_curve_pinned(&v, &keep, Some(pins), &base)?;
            let per_layer: Vec<usize> = (0..pins.layers()).map(|l| pins.kept_count(l)).collect();
            (slice_caps(full, a.caps)?, Some(per_layer))
        }
    };
    working.finish();
    let mut value = super::json::tagged(super::json::MRC, serde_json::to_value(&c)?);
    if let (Some(obj), Some(pins)) = (value.as_object_mut(), &pins) {
        obj.insert("layer_pins".into(), serde_json::json!(pins));
    }
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

fn slice_caps(c: cachesim::mrc::MissCurve, caps: Option<(usize, usize)>) -> Result<cachesim::mrc::MissCurve> {
    let Some((lo, hi)) = caps else { return Ok(c) };
    let (min, max) = (c.min_cap, c.max_cap);
    c.sliced(lo, hi).with_context(|| format!("--caps {lo}..{hi}: the curve covers k_used..E = {min}..{max}"))
}
