//! `moe-offload mrc` (miss-ratio curves) and `moe-offload plan` (per-layer caches for a memory budget).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::mrc::{CurveConfig, MissCurve, lru_curve, replay_curve};
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use clap::Args;
use saliency::{KeepConfig, KeepMap, Stats};
use sweep::DeviceProfile;
use sweep::plan::{Allocation, allocate, evaluate, non_convex_layers, uniform};
use trace_io::{TraceFile, TraceView};

#[derive(Debug, Args)]
pub struct MrcArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Keep map JSON (default: every expert kept).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Cache policy; `lru` is computed in one pass, the others by one replay per cap.
    #[arg(long, default_value = "lru")]
    pub policy: Policy,
    /// Caps `a..b` (inclusive; default k_used..E).
    #[arg(long, value_parser = parse_caps)]
    pub caps: Option<(usize, usize)>,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long)]
    pub k_used: Option<usize>,
    /// Warmup tokens not counted. Belady is a lower bound of every online policy only with
    /// `--warmup 0`; counted from a warmup it may exceed one by up to the cap per layer.
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// Residency semantics: k-way (default) or sequential.
    #[arg(long, default_value = "k-way")]
    pub semantics: Semantics,
    /// Output JSON; a CSV (layer_id, cap, misses, misses_per_token) is written beside it.
    #[arg(short, long)]
    pub output: PathBuf,
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
            super::replay::check_map_fits(&map, v, p)?;
            Keep::from_layers(&v.shape(), &map.layers).with_context(|| format!("keep map {}", p.display()))?
        }
        None => Keep::full(&v.shape()),
    })
}

/// The curve of `policy` on `v` over `caps` (default k_used..=E).
fn curve(
    v: &TraceView<'_>,
    keep: &Keep,
    policy: Policy,
    base: &CurveConfig,
    caps: Option<(usize, usize)>,
) -> Result<MissCurve> {
    let k = base.k_used.unwrap_or(v.shape().top_k);
    let (lo, hi) = caps.unwrap_or((k, v.shape().num_experts));
    if policy == Policy::Lru && lo == k && hi == v.shape().num_experts {
        return Ok(lru_curve(v, keep, base)?);
    }
    let cfg = ReplayConfig {
        k_used: base.k_used,
        warmup: base.warmup,
        semantics: base.semantics,
        reset_at_sequence: base.reset_at_sequence,
        ..ReplayConfig::new(policy, lo)
    };
    let caps: Vec<usize> = (lo..=hi).collect();
    Ok(replay_curve(v, keep, &cfg, &caps)?)
}

/// Runs `mrc`.
pub fn mrc(a: &MrcArgs) -> Result<()> {
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
    let keep = open_keep(a.keep.as_ref(), &v)?;
    let base = CurveConfig { k_used: a.k_used, warmup: a.warmup, semantics: a.semantics, reset_at_sequence: false };
    let c = curve(&v, &keep, a.policy, &base, a.caps)?;
    let json = serde_json::to_vec_pretty(&c)?;
    trace_io::write_atomic(&a.output, |w| w.write_all(&json))
        .with_context(|| format!("writing {}", a.output.display()))?;
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(["layer_id", "cap", "misses", "misses_per_token"])?;
    for l in &c.layers {
        for (i, m) in l.misses.iter().enumerate() {
            let mpt = if c.tokens == 0 { 0.0 } else { *m as f64 / c.tokens as f64 };
            w.write_record([l.layer_id.to_string(), (c.min_cap + i).to_string(), m.to_string(), mpt.to_string()])?;
        }
    }
    let bytes = w.into_inner()?;
    trace_io::write_atomic(&csv_path, |w| w.write_all(&bytes))
        .with_context(|| format!("writing {}", csv_path.display()))?;
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
    /// Memory for cached experts, in GB (10^9 bytes).
    #[arg(long)]
    pub budget_gb: f64,
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
    /// Cache policy of the plan (`lru` curves are computed in one pass).
    #[arg(long, default_value = "lru")]
    pub policy: Policy,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long)]
    pub k_used: Option<usize>,
    /// Warmup tokens not counted. Belady is a lower bound of every online policy only with
    /// `--warmup 0`; counted from a warmup it may exceed one by up to the cap per layer.
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// Quality floor for pruned variants: the largest allowed mean held-out slot replacement
    /// (fraction of used slots whose expert is pruned, SEMANTICS §4).
    #[arg(long)]
    pub max_slot_replacement: Option<f64>,
    /// Output plan JSON (`-` for stdout; the table then goes to stderr).
    #[arg(short, long)]
    pub output: PathBuf,
}

/// An allocation evaluated on both traces.
#[derive(Debug, serde::Serialize)]
struct Evaluated {
    caps: Vec<usize>,
    slots: usize,
    memory_gb: f64,
    in_sample_misses_per_token: f64,
    out_of_sample_misses_per_token: f64,
    in_sample_tok_s: Vec<(f64, f64)>,
    out_of_sample_tok_s: Vec<(f64, f64)>,
}

#[derive(Debug, serde::Serialize)]
struct Candidate {
    variant: String,
    heldout_slot_replacement: f64,
    excluded: Option<String>,
    non_convex_layers: usize,
    per_layer: Option<Evaluated>,
    uniform: Option<Evaluated>,
}

/// Runs `plan`.
pub fn plan(a: &PlanArgs) -> Result<()> {
    super::refuse_overwrite(&a.output, [a.in_sample.as_path(), a.out_of_sample.as_path()])?;
    if let Some(max) = a.max_slot_replacement.filter(|m| !(0.0..=1.0).contains(m)) {
        bail!("--max-slot-replacement {max}: a fraction of slots, between 0 and 1");
    }
    if !a.budget_gb.is_finite() || !a.pinned_gb.is_finite() {
        bail!("--budget-gb {} and --pinned-gb {} must be finite numbers of GB", a.budget_gb, a.pinned_gb);
    }
    if a.pinned_gb < 0.0 {
        bail!("--pinned-gb {}: memory pinned inside the budget cannot be negative", a.pinned_gb);
    }
    if let Some(mb) = a.expert_mb.filter(|mb| !(mb.is_finite() && *mb > 0.0)) {
        bail!("--expert-mb {mb}: the size of one expert must be a positive number of MB");
    }
    let calib = TraceFile::open(&a.in_sample)?;
    let held = TraceFile::open(&a.out_of_sample)?;
    let (cv, hv) = (calib.view(), held.view());
    let (cm, hm) = (cv.meta(), hv.meta());
    if cm.num_experts != hm.num_experts || cm.layer_ids != hm.layer_ids {
        bail!("the in-sample and out-of-sample traces have different shapes (E, layers)");
    }
    // The profile named, else the one of the trace's model, else the study's reference.
    let inferred = a.profile.is_none().then(|| sweep::preset_for_model(&cm.model)).flatten();
    let profile_name = a.profile.as_deref().or(inferred).unwrap_or("reference");
    let mut profile = DeviceProfile::preset(profile_name)
        .with_context(|| format!("unknown profile {profile_name:?}; see docs/grid-format.md"))?;
    if let Some(mb) = a.expert_mb {
        profile.expert_mb = mb;
    }
    let usable_mb = (a.budget_gb - a.pinned_gb) * 1000.0;
    if !(usable_mb > 0.0 && profile.expert_mb > 0.0) {
        bail!("budget {} GB minus pinned {} GB leaves no memory for experts", a.budget_gb, a.pinned_gb);
    }
    // A hair of tolerance so that a budget of exactly n experts is n slots despite decimal rounding.
    // More slots than experts in all layers cache everything: capped there (and so finite).
    let all_experts = cm.num_experts as usize * cm.layer_ids.len();
    let slots = ((usable_mb / profile.expert_mb + 1e-9).floor() as usize).min(all_experts);
    let stats = Stats::from_trace(&cv, a.in_sample.display().to_string(), String::new());
    let held_stats = Stats::from_trace(&hv, a.out_of_sample.display().to_string(), String::new());
    let base = CurveConfig { k_used: a.k_used, warmup: a.warmup, semantics: Semantics::KWay, reset_at_sequence: false };
    let eval = |alloc: &Allocation, cin: &MissCurve, cout: &MissCurve| {
        let mpt = |m: u64, c: &MissCurve| if c.tokens == 0 { 0.0 } else { m as f64 / c.tokens as f64 };
        let (i, o) = (mpt(alloc.misses, cin), mpt(evaluate(cout, &alloc.caps), cout));
        let tok = |m: f64| profile.bandwidth_gbps.iter().map(|&bw| (bw, profile.tok_s(m, bw))).collect::<Vec<_>>();
        Evaluated {
            caps: alloc.caps.clone(),
            slots: alloc.slots,
            memory_gb: alloc.slots as f64 * profile.expert_mb / 1000.0 + a.pinned_gb,
            in_sample_misses_per_token: i,
            out_of_sample_misses_per_token: o,
            in_sample_tok_s: tok(i),
            out_of_sample_tok_s: tok(o),
        }
    };
    let mut candidates = Vec::new();
    // The slots an evaluated candidate needs, k_used per layer (the same for every candidate).
    let mut needed_slots: Option<usize> = None;
    let mut labels: Vec<(String, &String)> = Vec::new();
    for spec in &a.variants {
        let map = sweep::variant_keep_map(spec, &stats, &KeepConfig::default(), cm)?;
        if let Some((_, first)) = labels.iter().find(|(l, _)| *l == map.label()) {
            bail!(
                "--variants: {first} and {spec} both give the keep map {}; the plan could not tell which one it chose",
                map.label()
            );
        }
        labels.push((map.label(), spec));
        let r = saliency::retention(&map, &held_stats, None)?;
        let sr = r.mean.slot_replacement;
        let excluded = a
            .max_slot_replacement
            .filter(|&max| !map.is_full() && sr > max)
            .map(|max| format!("held-out slot replacement {sr:.4} exceeds --max-slot-replacement {max}"));
        let mut cand = Candidate {
            variant: map.label(),
            heldout_slot_replacement: sr,
            excluded,
            non_convex_layers: 0,
            per_layer: None,
            uniform: None,
        };
        if cand.excluded.is_none() {
            let keep_c = Keep::from_layers(&cv.shape(), &map.layers)?;
            let cin = curve(&cv, &keep_c, a.policy, &base, None)?;
            let cout = curve(&hv, &keep_c, a.policy, &base, None)?;
            cand.non_convex_layers = non_convex_layers(&cin);
            cand.per_layer = allocate(&cin, slots).map(|x| eval(&x, &cin, &cout));
            cand.uniform = uniform(&cin, slots).map(|x| eval(&x, &cin, &cout));
            let needed = cin.min_cap * cin.layers.len();
            needed_slots = Some(needed);
            if cand.per_layer.is_none() {
                cand.excluded = Some(format!(
                    "{slots} slots cannot give every layer k_used = {} experts ({needed} needed)",
                    cin.min_cap
                ));
            }
        }
        candidates.push(cand);
    }
    let best = |f: fn(&Candidate) -> Option<&Evaluated>| {
        candidates
            .iter()
            .filter_map(|c| f(c).map(|e| (c, e)))
            .min_by(|x, y| x.1.in_sample_misses_per_token.total_cmp(&y.1.in_sample_misses_per_token))
    };
    let chosen = best(|c| c.per_layer.as_ref());
    let uniform_best = best(|c| c.uniform.as_ref());
    let Some((chosen_c, chosen_e)) = chosen else {
        let reasons: Vec<String> = candidates
            .iter()
            .map(|c| format!("{}: {}", c.variant, c.excluded.as_deref().unwrap_or("no plan")))
            .collect();
        let mut msg = format!(
            "no variant can be planned in {slots} expert slots of {:.3} MB, profile {} ({})",
            profile.expert_mb,
            profile.name,
            reasons.join("; ")
        );
        if let Some(need) = needed_slots.filter(|&n| n > slots) {
            // Rounded up, so that the budget printed is enough.
            let gb = ((need as f64 * profile.expert_mb / 1000.0 + a.pinned_gb) * 1e4).ceil() / 1e4;
            msg += &format!(
                "; the smallest budget that caches k_used experts in every layer is {need} slots: --budget-gb {gb}"
            );
        }
        bail!(msg);
    };
    // Verify by replay: the chosen variant with its per-layer caps, on both traces.
    let spec = a.variants.iter().find(|s| {
        sweep::variant_keep_map(s, &stats, &KeepConfig::default(), cm).map(|m| m.label()).ok().as_deref()
            == Some(chosen_c.variant.as_str())
    });
    let map =
        sweep::variant_keep_map(spec.expect("the chosen variant is a candidate"), &stats, &KeepConfig::default(), cm)?;
    let keep = Keep::from_layers(&cv.shape(), &map.layers)?;
    let cfg = ReplayConfig {
        k_used: a.k_used,
        warmup: a.warmup,
        layer_caps: Some(chosen_e.caps.clone()),
        ..ReplayConfig::new(a.policy, chosen_e.caps.iter().copied().min().unwrap_or(1))
    };
    let replayed_in = cachesim::replay(&cv, &keep, &cfg)?.misses_per_token();
    let replayed_out = cachesim::replay(&hv, &keep, &cfg)?.misses_per_token();
    if replayed_in != chosen_e.in_sample_misses_per_token || replayed_out != chosen_e.out_of_sample_misses_per_token {
        bail!(
            "internal error: the plan predicts {} / {} misses per token but its replay gives {replayed_in} / {replayed_out}",
            chosen_e.in_sample_misses_per_token,
            chosen_e.out_of_sample_misses_per_token
        );
    }
    let report = serde_json::json!({
        "kind": "moe-offload-plan",
        "tool_version": super::version(),
        "budget_gb": a.budget_gb,
        "pinned_gb": a.pinned_gb,
        "profile": profile,
        "slots": slots,
        "policy": a.policy,
        "k_used": a.k_used.unwrap_or(cv.shape().top_k),
        "warmup": a.warmup,
        "in_sample": a.in_sample.display().to_string(),
        "out_of_sample": a.out_of_sample.display().to_string(),
        "chosen": { "variant": chosen_c.variant, "keep_map": map, "plan": chosen_e,
                    "replayed": { "in_sample_misses_per_token": replayed_in, "out_of_sample_misses_per_token": replayed_out } },
        "uniform_best": uniform_best.map(|(c, e)| serde_json::json!({ "variant": c.variant, "plan": e })),
        "candidates": candidates,
    });
    let bytes = serde_json::to_vec_pretty(&report)?;
    super::write_output(&a.output, &bytes)?;
    let mut out = super::human(&a.output);
    writeln!(
        out,
        "budget {} GB ({} pinned): {slots} expert slots of {:.3} MB (profile {}{}); policy {}; plan in {}\n",
        a.budget_gb,
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
    writeln!(out, "chosen: {} with per-layer caps {:?}", chosen_c.variant, chosen_e.caps)?;
    writeln!(
        out,
        "verified by replay with these caps: {replayed_in:.4} misses/token in sample, {replayed_out:.4} out of sample (equal to the prediction)"
    )?;
    Ok(())
}
