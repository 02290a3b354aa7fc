//! `moe-offload mrc` (miss-ratio curves) and `moe-offload plan` (per-layer caches for a memory budget).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::mrc::CurveConfig;
use cachesim::{Keep, Policy, Semantics};
use clap::Args;
use saliency::KeepMap;
use sweep::DeviceProfile;
use sweep::plan::{PlanOutcome, PlanRequest};
use trace_io::{TraceFile, TraceView};

#[derive(Debug, Args)]
pub struct MrcArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Keep map JSON (default: every expert kept).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Cache policy; `lru` (both semantics) and `belady` (k-way) are computed in one pass over
    /// every cap, the others by one replay per cap.
    #[arg(long, default_value = "lru")]
    pub policy: Policy,
    /// Caps `a..b` (inclusive; default k_used..E).
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
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the output JSON (kind `moe-offload-mrc`) on stdout instead of the table; status
    /// lines go to stderr.
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

fn open_keep(path: Option<&PathBuf>, v: &TraceView<'_>) -> Result<Keep> {
    Ok(match path {
        Some(p) => {
            let map = KeepMap::read_json(p)?;
            super::replay::inputs::check_map_fits(&map, v.meta(), p)?;
            Keep::from_layers(&v.shape(), &map.layers).with_context(|| format!("keep map {}", p.display()))?
        }
        None => Keep::full(&v.shape()),
    })
}

/// Steps (picks plus per-replay expert state) a curve may cost without `--yes`: about a minute.
const MAX_CURVE_STEPS: u64 = 4_000_000_000;

/// The work of the curve of `policy` on `v` over `caps` (default k_used..=E), in steps (one per
/// pick, plus the E experts of state each replay of a layer sets up), and its description.
fn curve_work(
    v: &TraceView<'_>,
    policy: Policy,
    semantics: Semantics,
    k_used: Option<usize>,
    caps: Option<(usize, usize)>,
) -> (u64, String) {
    let s = v.shape();
    let k = k_used.unwrap_or(s.top_k);
    let (lo, hi) = caps.unwrap_or((k, s.num_experts));
    let n = hi.saturating_sub(lo) as u64 + 1;
    let per_replay =
        (s.layers as u64).saturating_mul((s.tokens as u64).saturating_mul(k as u64) + s.num_experts as u64);
    // One pass over every cap from k_used to E, sliced to the caps asked for.
    if cachesim::mrc::has_one_pass(policy, semantics) && lo >= k && hi <= s.num_experts {
        let order = if policy == Policy::Lru { "log E" } else { "the depth of the deepest pick" };
        let what = format!(
            "{policy} curve of caps {lo}..={hi} in one pass (O(L x T x k x {order})): about {per_replay} steps"
        );
        return (per_replay, what);
    }
    let steps = n.saturating_mul(per_replay);
    let what = format!(
        "{policy} curve of caps {lo}..={hi} by one replay per cap: {n} caps x {} x ({} tokens x k_used {k} + E = {} \
         experts of state) = {steps} steps",
        super::layers(s.layers),
        s.tokens,
        s.num_experts
    );
    (steps, what)
}

/// Refuses `steps` of curve work above [`MAX_CURVE_STEPS`] without `--yes`.
fn bound_curves(steps: u64, yes: bool) -> Result<()> {
    if steps > MAX_CURVE_STEPS && !yes {
        bail!(
            "{steps} steps is above the limit of {MAX_CURVE_STEPS} without --yes (minutes of work or more): narrow \
             --caps, use --policy lru (one pass), or pass --yes to run it"
        );
    }
    Ok(())
}

/// Runs `mrc`.
pub fn mrc(a: &MrcArgs) -> Result<()> {
    super::refuse_stdout(
        &a.output,
        "it writes a JSON file and a CSV beside it: give -o mrc.json; --json prints the JSON",
    )?;
    let csv_path = a.output.with_extension("csv");
    if csv_path == a.output {
        bail!(
            "-o {}: the CSV written beside the JSON output would be this same file; give the output a .json name",
            a.output.display()
        );
    }
    for out in [&a.output, &csv_path] {
        super::refuse_overwrite(out, std::iter::once(a.trace.as_path()).chain(a.keep.as_deref()))?;
    }
    let f = TraceFile::open(&a.trace)?;
    let v = f.view();
    super::require_tokens(v.shape(), &a.trace)?;
    let keep = open_keep(a.keep.as_ref(), &v)?;
    let base = CurveConfig { k_used: a.k_used, warmup: a.warmup, semantics: a.semantics, reset_at_sequence: false };
    if a.pin.is_some() && a.policy != Policy::Lru {
        bail!(
            "--pin gives the one-pass lru curve of the unpinned stream; for {} replay each cap with `replay --pin`",
            a.policy
        );
    }
    let (steps, what) = curve_work(&v, a.policy, a.semantics, a.k_used, a.caps);
    crate::progress::status!("mrc: {what}");
    bound_curves(steps, a.yes)?;
    let working = crate::progress::working("mrc");
    let (c, pins) = match &a.pin {
        None => (sweep::plan::miss_curve(&v, &keep, a.policy, &base, a.caps)?, None),
        Some(p) => {
            let pins = open_keep(Some(p), &v).with_context(|| format!("--pin {}", p.display()))?;
            let full = cachesim::mrc::lru_curve_pinned(&v, &keep, Some(&pins), &base)?;
            let per_layer: Vec<usize> = (0..pins.layers()).map(|l| pins.kept_count(l)).collect();
            (slice_caps(full, a.caps)?, Some(per_layer))
        }
    };
    working.finish();
    let mut value = super::json::tagged(super::json::MRC, serde_json::to_value(&c)?);
    if let (Some(obj), Some(pins)) = (value.as_object_mut(), &pins) {
        obj.insert("layer_pins".into(), serde_json::json!(pins));
    }
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
    trace_io::write_atomic_files(&[(&a.output, &json), (&csv_path, &bytes)])
        .with_context(|| format!("writing {} and {}", a.output.display(), csv_path.display()))?;
    if a.json {
        super::status(format_args!("wrote {} and {}", a.output.display(), csv_path.display()));
        return super::json::print(&value);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "wrote {} and {}", a.output.display(), csv_path.display())?;
    let mut t = comfy_table::Table::new();
    t.set_header(["cap", "misses/token (all layers)", "hit rate"]);
    let picks = c.picks_per_layer * c.layers.len() as u64;
    let step = ((c.max_cap - c.min_cap) / 12).max(1);
    for cap in (c.min_cap..=c.max_cap).step_by(step) {
        let m = c.total_misses(cap);
        let hr = if picks == 0 { 0.0 } else { 1.0 - m as f64 / picks as f64 };
        t.add_row([cap.to_string(), format!("{:.4}", c.misses_per_token(cap)), format!("{hr:.4}")]);
    }
    super::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    Ok(())
}

/// The caps `lo..=hi` of a curve computed from k_used to E.
fn slice_caps(mut c: cachesim::mrc::MissCurve, caps: Option<(usize, usize)>) -> Result<cachesim::mrc::MissCurve> {
    let Some((lo, hi)) = caps else { return Ok(c) };
    if lo < c.min_cap || hi > c.max_cap {
        bail!("--caps {lo}..{hi}: the curve covers k_used..E = {}..{}", c.min_cap, c.max_cap);
    }
    for l in &mut c.layers {
        l.misses = l.misses[lo - c.min_cap..=hi - c.min_cap].to_vec();
    }
    (c.min_cap, c.max_cap) = (lo, hi);
    Ok(c)
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Calibration trace: keep maps and the plan are chosen on it.
    #[arg(long)]
    pub in_sample: PathBuf,
    /// Held-out trace: the plan is evaluated on it.
    #[arg(long)]
    pub out_of_sample: PathBuf,
    /// Candidate variants: `full`, `METRIC@K`, `file:KEEP.json` (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "full")]
    pub variants: Vec<String>,
    /// Memory for cached experts, in GB (10^9 bytes; >= 0).
    #[arg(long, value_parser = crate::args::non_negative, required_unless_present = "exec")]
    pub budget_gb: Option<f64>,
    /// Memory pinned for other things inside the budget, in GB.
    #[arg(long, default_value_t = 0.0)]
    pub pinned_gb: f64,
    /// Device profile preset (reference, dsv2-lite-bf16, qwen15-moe-bf16, mixtral-8x7b-q4).
    /// Default: the preset of the in-sample trace's model when one matches (DeepSeek-V2-Lite and
    /// ESFT, Qwen1.5-MoE, Mixtral-8x7B), else `reference`.
    #[arg(long)]
    pub profile: Option<String>,
    /// Override the profile's expert size, in MB (10^6 bytes).
    #[arg(long)]
    pub expert_mb: Option<f64>,
    /// Cache policy of the plan (`lru` and `belady` curves are computed in one pass).
    #[arg(long, default_value = "lru")]
    pub policy: Policy,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long, value_parser = crate::args::at_least_one)]
    pub k_used: Option<usize>,
    /// Warmup tokens not counted. Belady is a lower bound of every online policy only with
    /// `--warmup 0`; counted from a warmup it may exceed one by up to the cap per layer.
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// Quality floor for pruned variants: the largest allowed mean held-out slot replacement
    /// (fraction of used slots whose expert is pruned, SEMANTICS §4).
    #[arg(long, value_parser = crate::args::fraction)]
    pub max_slot_replacement: Option<f64>,
    /// Measured quality of keep maps: `moe-offload-quality` files of `python/eval_pruned.py`
    /// (docs/quality.md), matched to the variants by the keep map's SHA-256.
    #[arg(long, num_args = 1..)]
    pub quality: Vec<PathBuf>,
    /// Quality floor from measurements: the largest measured mean KL(base ‖ pruned) of a pruned
    /// variant; an unmeasured pruned variant is excluded. Needs --quality.
    #[arg(long)]
    pub max_kl: Option<f64>,
    /// Quality floor from measurements: the largest measured ppl_pruned / ppl_base − 1 of a
    /// pruned variant; an unmeasured pruned variant is excluded. Needs --quality.
    #[arg(long)]
    pub max_ppl_increase: Option<f64>,
    /// Compute the curves above the limit of work (see the announcement the command prints).
    #[arg(long)]
    pub yes: bool,
    /// Also plan pinned experts (SEMANTICS.md §9): per layer one of these pinned counts (0 is
    /// always tried) plus a cache, within the same slots; printed as llama.cpp's
    /// `--moe-hot-count` list. lru only.
    #[arg(long, value_delimiter = ',')]
    pub pin_counts: Option<Vec<usize>>,
    /// Output plan JSON (`-` for stdout; the table then goes to stderr).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the plan JSON (kind `moe-offload-plan`, the bytes of the output file) on stdout
    /// instead of the table; status lines go to stderr.
    #[arg(long)]
    pub json: bool,
    /// `--exec host` and its flags (SEMANTICS.md §14): pins chosen by tok/s.
    #[command(flatten)]
    pub hybrid: super::plan_hybrid::HybridFlags,
}

/// Runs `plan`.
pub fn plan(a: &PlanArgs) -> Result<()> {
    if a.hybrid.exec.is_some() {
        return super::plan_hybrid::run(a);
    }
    let budget_gb = a.budget_gb.context("--budget-gb is required without --exec")?;
    super::refuse_overwrite(&a.output, [a.in_sample.as_path(), a.out_of_sample.as_path()])?;
    if let Some(max) = a.max_slot_replacement.filter(|m| !(0.0..=1.0).contains(m)) {
        bail!("--max-slot-replacement {max}: a fraction of slots, between 0 and 1");
    }
    if !budget_gb.is_finite() || !a.pinned_gb.is_finite() {
        bail!("--budget-gb {} and --pinned-gb {} must be finite numbers of GB", budget_gb, a.pinned_gb);
    }
    if a.pinned_gb < 0.0 {
        bail!("--pinned-gb {}: memory pinned inside the budget cannot be negative", a.pinned_gb);
    }
    if let Some(mb) = a.expert_mb.filter(|mb| !(mb.is_finite() && *mb > 0.0)) {
        bail!("--expert-mb {mb}: the size of one expert must be a positive number of MB");
    }
    let floor = super::plan_quality::read_floor(&a.quality, a.max_kl, a.max_ppl_increase)?;
    let calib = TraceFile::open(&a.in_sample)?;
    let held = TraceFile::open(&a.out_of_sample)?;
    let (cv, hv) = (calib.view(), held.view());
    super::require_tokens(cv.shape(), &a.in_sample)?;
    super::require_tokens(hv.shape(), &a.out_of_sample)?;
    super::warn_same_trace(&a.in_sample, &a.out_of_sample, None);
    // The profile named, else the one of the trace's model, else the study's reference.
    let inferred = a.profile.is_none().then(|| sweep::preset_for_model(&cv.meta().model)).flatten();
    let profile_name = a.profile.as_deref().or(inferred).unwrap_or("reference");
    let mut profile = DeviceProfile::preset(profile_name)
        .with_context(|| format!("unknown profile {profile_name:?}; see docs/grid-format.md"))?;
    if let Some(mb) = a.expert_mb {
        profile.expert_mb = mb;
    }
    let req = PlanRequest {
        in_sample: &cv,
        in_sample_name: a.in_sample.display().to_string(),
        out_of_sample: &hv,
        out_of_sample_name: a.out_of_sample.display().to_string(),
        variants: &a.variants,
        budget_gb,
        pinned_gb: a.pinned_gb,
        profile: &profile,
        policy: a.policy,
        k_used: a.k_used,
        warmup: a.warmup,
        max_slot_replacement: a.max_slot_replacement,
        quality: (!a.quality.is_empty()).then_some(&floor),
    };
    let (ci, _) = curve_work(&cv, a.policy, Semantics::KWay, a.k_used, None);
    let (co, what) = curve_work(&hv, a.policy, Semantics::KWay, a.k_used, None);
    let steps = (ci.saturating_add(co)).saturating_mul(a.variants.len() as u64);
    crate::progress::status!("plan: {} variants x 2 traces, each a {what}; {steps} steps in all", a.variants.len());
    bound_curves(steps, a.yes)?;
    let working = crate::progress::working("plan");
    let outcome = sweep::plan::search(&req)?;
    let pinned =
        a.pin_counts.as_deref().map(|counts| sweep::plan::search_pinned(&req, &outcome, counts)).transpose()?;
    working.finish();
    let PlanOutcome { slots, candidates, chosen, uniform_best } = outcome;
    let (replayed_in, replayed_out) = chosen.replayed;
    let report = serde_json::json!({
        "kind": super::json::PLAN,
        "tool_version": super::version(),
        "budget_gb": budget_gb,
        "pinned_gb": a.pinned_gb,
        "profile": profile,
        "slots": slots,
        "policy": a.policy,
        "k_used": a.k_used.unwrap_or(cv.shape().top_k),
        "warmup": a.warmup,
        "in_sample": a.in_sample.display().to_string(),
        "out_of_sample": a.out_of_sample.display().to_string(),
        "chosen": { "variant": chosen.variant, "keep_map": chosen.keep_map, "plan": chosen.plan,
                    "replayed": { "in_sample_misses_per_token": replayed_in, "out_of_sample_misses_per_token": replayed_out } },
        "uniform_best": uniform_best.as_ref().map(|(v, e)| serde_json::json!({ "variant": v, "plan": e })),
        "candidates": candidates,
    });
    let mut report = report;
    if let (Some(obj), Some(p)) = (report.as_object_mut(), &pinned) {
        obj.insert(
            "pinned".into(),
            serde_json::json!({ "plan": p, "keep_map": p.keep_map,
                                "moe_hot_count": p.hot_count_list(&p.keep_map.layer_ids) }),
        );
    }
    let mut bytes = serde_json::to_vec_pretty(&report)?;
    bytes.push(b'\n');
    super::write_output(&a.output, &bytes)?;
    if a.json {
        if !super::is_stdout(&a.output) {
            super::status(format_args!("wrote {}", a.output.display()));
            super::write_output(std::path::Path::new("-"), &bytes)?;
        }
        return Ok(());
    }
    let mut out = super::human(&a.output);
    writeln!(
        out,
        "budget {} GB ({} pinned): {slots} expert slots of {:.3} MB (profile {}{}); policy {}; plan in {}\n",
        budget_gb,
        a.pinned_gb,
        profile.expert_mb,
        profile.name,
        match (a.profile.is_some(), inferred.is_some()) {
            (true, _) => "",
            (false, true) => ", from the trace's model; --profile to choose",
            (false, false) => ", the default; --profile to choose your model's",
        },
        a.policy,
        a.output.display()
    )?;
    let mut t = comfy_table::Table::new();
    t.set_header(["variant", "plan", "slots", "misses/token in", "misses/token out", "held-out slot repl.", "note"]);
    for c in &candidates {
        for (kind, e) in [("per-layer", &c.per_layer), ("uniform", &c.uniform)] {
            let Some(e) = e else { continue };
            let kind = if kind == "uniform" {
                format!("uniform cap {}", e.caps.first().copied().unwrap_or(0))
            } else {
                kind.into()
            };
            t.add_row([
                c.variant.clone(),
                kind,
                e.slots.to_string(),
                format!("{:.4}", e.in_sample_misses_per_token),
                format!("{:.4}", e.out_of_sample_misses_per_token),
                format!("{:.4}", c.heldout_slot_replacement),
                String::new(),
            ]);
        }
        if let Some(x) = &c.excluded {
            t.add_row([
                c.variant.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                format!("{:.4}", c.heldout_slot_replacement),
                x.clone(),
            ]);
        }
    }
    super::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    if candidates.iter().any(|c| c.measured_kl.is_some()) {
        super::plan_quality::write_table(&mut out, &candidates)?;
    }
    writeln!(out, "chosen: {} with per-layer caps {:?}", chosen.variant, chosen.plan.caps)?;
    writeln!(
        out,
        "verified by replay with these caps: {replayed_in:.4} misses/token in sample, {replayed_out:.4} out of sample (equal to the prediction)"
    )?;
    if let Some(p) = &pinned {
        writeln!(
            out,
            "with pins: {} pinned {:?} + caps {:?} in {} slots: {:.4} misses/token in sample, {:.4} out of sample (verified by replay)",
            p.variant, p.pin_counts, p.caps, p.slots, p.in_sample_misses_per_token, p.out_of_sample_misses_per_token
        )?;
        writeln!(out, "llama.cpp: --moe-hot-count {}", p.hot_count_list(&p.keep_map.layer_ids))?;
    }
    Ok(())
}
