//! `plan`: per-layer cache sizes and a keep map for a memory budget, as `moe-offload plan --json`
//! computes them (the sweep crate's `plan::search` and `plan::search_pinned`).

use std::sync::Arc;

use cachesim::Policy;
use pyo3::prelude::*;
use serde_json::json;
use sweep::DeviceProfile;
use sweep::plan::{PlanOutcome, PlanRequest};
use trace_io::{Reads, TraceFile};

use crate::errors::{Error, Result};
use crate::trace::Trace;
use crate::usage;

/// Adds `plan` to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(plan, m)?)?;
    Ok(())
}

/// Everything `plan` was given, owned (the work runs on another thread).
struct Args {
    calib: (Arc<TraceFile>, String),
    held: (Arc<TraceFile>, String),
    variants: Vec<String>,
    budget_gb: f64,
    pinned_gb: f64,
    profile: Option<String>,
    expert_mb: Option<f64>,
    policy: Policy,
    k_used: Option<usize>,
    warmup: usize,
    max_slot_replacement: Option<f64>,
    pin_counts: Option<Vec<usize>>,
    yes: bool,
}

/// The plan for a memory budget (docs/planning.md), as `moe-offload plan --in-sample IN
/// --out-of-sample OUT --budget-gb B --json` computes it: the fields of the plan file
/// (`slots`, `chosen` with its `variant`, `keep_map`, `plan.caps` per layer and the misses per
/// token `replayed` on both traces, `uniform_best`, `candidates`, with `pin_counts` also
/// `pinned`), except `tool_version`.
///
/// - `budget_gb`: memory for cached experts, GB (10^9 bytes); `pinned_gb`: memory inside it
///   held for other things.
/// - `variants`: `full`, `METRIC@K`, `file:KEEP.json`; `max_slot_replacement`: the quality
///   floor of pruned variants (a fraction).
/// - `profile` (default: the trace model's preset, else `reference`), `expert_mb` (MB),
///   `policy`, `k_used`, `warmup`, `pin_counts` (pinned experts per layer to try; lru only).
#[pyfunction]
#[pyo3(signature = (
    in_sample, out_of_sample, *, budget_gb, variants=None, pinned_gb=0.0, profile=None, expert_mb=None,
    policy="lru", k_used=None, warmup=64, max_slot_replacement=None, pin_counts=None, yes=false
))]
#[expect(clippy::too_many_arguments, reason = "one keyword argument per CLI flag: the Python signature is the API")]
pub fn plan<'py>(
    py: Python<'py>,
    in_sample: &Trace,
    out_of_sample: &Trace,
    budget_gb: f64,
    variants: Option<Vec<String>>,
    pinned_gb: f64,
    profile: Option<String>,
    expert_mb: Option<f64>,
    policy: &str,
    k_used: Option<usize>,
    warmup: usize,
    max_slot_replacement: Option<f64>,
    pin_counts: Option<Vec<usize>>,
    yes: bool,
) -> PyResult<Bound<'py, PyAny>> {
    in_sample.require_tokens()?;
    out_of_sample.require_tokens()?;
    let a = Args {
        calib: (in_sample.file.clone(), in_sample.display()),
        held: (out_of_sample.file.clone(), out_of_sample.display()),
        variants: variants.unwrap_or_else(|| vec!["full".into()]),
        budget_gb,
        pinned_gb,
        profile,
        expert_mb,
        policy: policy.parse().map_err(|e| Error::Usage(format!("policy: {e}")))?,
        k_used,
        warmup,
        max_slot_replacement,
        pin_counts,
        yes,
    };
    let v = crate::run::detached(py, move || run(&a))?;
    crate::run::to_result(py, &v)
}

/// The work of one k-way curve of caps k_used..=E, in steps (as the CLI's `plan` counts it).
fn curve_steps(s: &trace_io::Shape, policy: Policy, k_used: Option<usize>) -> u64 {
    let k = k_used.unwrap_or(s.top_k);
    cachesim::mrc::curve_work(s, policy, cachesim::Semantics::KWay, k, k, s.num_experts).steps
}

fn run(a: &Args) -> Result<serde_json::Value> {
    if let Some(max) = a.max_slot_replacement.filter(|m| !(0.0..=1.0).contains(m)) {
        usage!("max_slot_replacement {max}: a fraction of slots, between 0 and 1");
    }
    if !a.budget_gb.is_finite() || !a.pinned_gb.is_finite() || a.budget_gb < 0.0 {
        usage!("budget_gb {} and pinned_gb {} must be finite numbers of GB (>= 0)", a.budget_gb, a.pinned_gb);
    }
    if a.pinned_gb < 0.0 {
        usage!("pinned_gb {}: memory pinned inside the budget cannot be negative", a.pinned_gb);
    }
    let cv = a.calib.0.view_for(Reads::EVERYTHING)?;
    let hv = a.held.0.view_for(Reads::EVERYTHING)?;
    let inferred = a.profile.is_none().then(|| sweep::preset_for_model(&cv.meta().model)).flatten();
    let profile_name = a.profile.as_deref().or(inferred).unwrap_or("reference");
    let mut profile = DeviceProfile::preset(profile_name)
        .ok_or_else(|| Error::Usage(format!("unknown profile {profile_name:?}; see docs/grid-format.md")))?;
    if let Some(mb) = a.expert_mb {
        profile.expert_mb = mb;
        // The one rule of a profile (sweep's plan checks it too, after reading the traces).
        profile.check()?;
    }
    let req = PlanRequest {
        in_sample: &cv,
        in_sample_name: a.calib.1.clone(),
        out_of_sample: &hv,
        out_of_sample_name: a.held.1.clone(),
        variants: &a.variants,
        budget_gb: a.budget_gb,
        pinned_gb: a.pinned_gb,
        profile: &profile,
        policy: a.policy,
        k_used: a.k_used,
        warmup: a.warmup,
        max_slot_replacement: a.max_slot_replacement,
        quality: None,
    };
    let steps = curve_steps(&cv.shape(), a.policy, a.k_used)
        .saturating_add(curve_steps(&hv.shape(), a.policy, a.k_used))
        .saturating_mul(a.variants.len() as u64);
    api::work::bound_curves(steps, a.yes, "give fewer ‹variants›")?;
    let outcome = sweep::plan::search(&req)?;
    let pinned =
        a.pin_counts.as_deref().map(|counts| sweep::plan::search_pinned(&req, &outcome, counts)).transpose()?;
    let PlanOutcome { slots, candidates, chosen, uniform_best } = outcome;
    let (replayed_in, replayed_out) = chosen.replayed;
    let mut report = json!({
        "kind": api::kind::PLAN,
        "budget_gb": a.budget_gb,
        "pinned_gb": a.pinned_gb,
        "profile": profile,
        "slots": slots,
        "policy": a.policy,
        "k_used": a.k_used.unwrap_or(cv.shape().top_k),
        "warmup": a.warmup,
        "in_sample": a.calib.1,
        "out_of_sample": a.held.1,
        "chosen": { "variant": chosen.variant, "keep_map": chosen.keep_map, "plan": chosen.plan,
                    "replayed": { "in_sample_misses_per_token": replayed_in, "out_of_sample_misses_per_token": replayed_out } },
        "uniform_best": uniform_best.as_ref().map(|(v, e)| json!({ "variant": v, "plan": e })),
        "candidates": candidates,
    });
    if let (Some(obj), Some(p)) = (report.as_object_mut(), &pinned) {
        obj.insert(
            "pinned".into(),
            json!({ "plan": p, "keep_map": p.keep_map, "moe_hot_count": p.hot_count_list(&p.keep_map.layer_ids) }),
        );
    }
    Ok(report)
}
