//! `moe-offload plan`: per-layer caches (and keep map) for a memory budget. With `--exec host`
//! the hybrid plan (`hybrid`); with `--quality` the measured quality beside it (`quality`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::{Policy, Semantics};
use clap::Args;
use sweep::DeviceProfile;
use sweep::plan::{PlanOutcome, PlanRequest};
use trace_io::TraceFile;

use super::mrc::{bound_curves, curve_work};

mod hybrid;
mod quality;

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
    /// Cache policy of the plan (the work of its curves is printed before they run).
    #[arg(long, default_value = "lru", value_parser = crate::args::policy())]
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
    /// always tried) plus a cache, within the same slots; printed as a per-layer hot-count list
    /// (the `--moe-hot-count` of unmerged llama.cpp patches, not a llama.cpp flag). lru only.
    #[arg(long, value_delimiter = ',')]
    pub pin_counts: Option<Vec<usize>>,
    /// Output plan JSON (`-` for stdout; the table then goes to stderr). Required unless --json.
    #[arg(short, long, required_unless_present = "json")]
    pub output: Option<PathBuf>,
    /// Print the plan JSON (kind `moe-offload-plan`, the bytes of the output file) on stdout
    /// instead of the table; status lines go to stderr. Without -o nothing is written.
    #[arg(long)]
    pub json: bool,
    /// `--exec host` and its flags (SEMANTICS.md §14): pins chosen by tok/s.
    #[command(flatten)]
    pub hybrid: hybrid::HybridFlags,
}

impl PlanArgs {
    /// Where the plan goes: `-o`, else (`--json` alone) standard output.
    pub fn output(&self) -> &std::path::Path {
        self.output.as_deref().unwrap_or(std::path::Path::new("-"))
    }
}

/// Runs `plan`.
pub fn plan(a: &PlanArgs) -> Result<()> {
    if a.hybrid.exec.is_some() {
        return hybrid::run(a);
    }
    if a.hybrid.moe_layers.is_some() {
        bail!("--moe-layers is read by plan --exec host; for the flags of this plan give it to `export llama-cpp`");
    }
    let budget_gb = a.budget_gb.context("--budget-gb is required without --exec")?;
    super::refuse_overwrite(a.output(), [a.in_sample.as_path(), a.out_of_sample.as_path()])?;
    if let Some(max) = a.max_slot_replacement.filter(|m| !(0.0..=1.0).contains(m)) {
        bail!("--max-slot-replacement {max}: a fraction of slots, between 0 and 1");
    }
    if !budget_gb.is_finite() || !a.pinned_gb.is_finite() {
        bail!("--budget-gb {} and --pinned-gb {} must be finite numbers of GB", budget_gb, a.pinned_gb);
    }
    if a.pinned_gb < 0.0 {
        bail!("--pinned-gb {}: memory pinned inside the budget cannot be negative", a.pinned_gb);
    }
    let floor = quality::read_floor(&a.quality, a.max_kl, a.max_ppl_increase)?;
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
        profile.check().with_context(|| format!("--expert-mb {mb}"))?;
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
    bound_curves(steps, a.yes, "give fewer ‹variants›")?;
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
    super::write_output(a.output(), &bytes)?;
    if a.json {
        if !super::is_stdout(a.output()) {
            super::status(format_args!("wrote {}", a.output().display()));
            super::write_output(std::path::Path::new("-"), &bytes)?;
        }
        return Ok(());
    }
    let mut out = super::human(a.output());
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
        a.output().display()
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
        quality::write_table(&mut out, &candidates)?;
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
        writeln!(
            out,
            "hot counts per model layer: {} (`--moe-hot-count` of unmerged llama.cpp patches, not a llama.cpp flag)",
            p.hot_count_list(&p.keep_map.layer_ids)
        )?;
    }
    Ok(())
}

/// A flags refusal ([`sweep::plan::llama::FlagsError`]) as the command line says it:
/// `moe_layers` is `--moe-layers`.
pub(crate) fn spell_moe_layers(e: &str) -> String {
    e.replace("moe_layers", "--moe-layers")
}
