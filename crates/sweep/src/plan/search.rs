//! The plan search behind `moe-offload plan`: [`search`] of a [`PlanRequest`].

use cachesim::mrc::{CurveConfig, MissCurve, replay_curve};
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use saliency::{KeepConfig, KeepMap, Stats};
use trace_io::TraceView;

use super::{Allocation, QualityFloor, allocate, evaluate, non_convex_layers, uniform};
use crate::{DeviceProfile, Result, SweepError};

/// What to plan: two traces, the candidate variants, the memory and the replay settings.
#[derive(Debug, Clone)]
pub struct PlanRequest<'a> {
    /// Calibration trace: keep maps and the plan are chosen on it.
    pub in_sample: &'a TraceView<'a>,
    /// Its name in the statistics' provenance (the path).
    pub in_sample_name: String,
    /// Held-out trace: the plan is evaluated on it.
    pub out_of_sample: &'a TraceView<'a>,
    /// Its name in the statistics' provenance.
    pub out_of_sample_name: String,
    /// Candidate variants: `full`, `METRIC@K`, `file:KEEP.json`.
    pub variants: &'a [String],
    /// Memory for cached experts, GB (10^9 bytes).
    pub budget_gb: f64,
    /// Memory pinned for other things inside the budget, GB.
    pub pinned_gb: f64,
    /// The device profile (expert size, compute time, bandwidths).
    pub profile: &'a DeviceProfile,
    /// Cache policy of the plan.
    pub policy: Policy,
    /// Experts used per token (`None`: the trace's top-k).
    pub k_used: Option<usize>,
    /// Warmup tokens not counted.
    pub warmup: usize,
    /// Largest allowed mean held-out slot replacement of a pruned variant.
    pub max_slot_replacement: Option<f64>,
    /// Measured quality of keep maps and its floors (`plan --quality`, [`QualityFloor`]).
    pub quality: Option<&'a QualityFloor>,
}

/// An allocation evaluated on both traces.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Evaluated {
    /// Cache capacity per layer.
    pub caps: Vec<usize>,
    /// Slots used (`Σ caps`).
    pub slots: usize,
    /// `slots · expert_mb / 1000 + pinned_gb`.
    pub memory_gb: f64,
    /// Misses per token on the calibration trace (from its curve).
    pub in_sample_misses_per_token: f64,
    /// Misses per token on the held-out trace with the same caps.
    pub out_of_sample_misses_per_token: f64,
    /// (bandwidth GB/s, tok/s) per bandwidth of the profile, in sample.
    pub in_sample_tok_s: Vec<(f64, f64)>,
    /// The same out of sample.
    pub out_of_sample_tok_s: Vec<(f64, f64)>,
}

/// One candidate variant: why it was left out, or its per-layer and uniform plans.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Candidate {
    /// The keep map's label.
    pub variant: String,
    /// Mean held-out slot replacement of its keep map.
    pub heldout_slot_replacement: f64,
    /// Why it was not planned.
    pub excluded: Option<String>,
    /// Layers whose calibration curve is not convex.
    pub non_convex_layers: usize,
    /// The per-layer plan.
    pub per_layer: Option<Evaluated>,
    /// The best uniform cap within the same slots.
    pub uniform: Option<Evaluated>,
    /// Measured mean KL(base ‖ pruned) of its keep map (`--quality`; absent when not measured).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_kl: Option<f64>,
    /// Measured relative perplexity increase of its keep map (`--quality`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub measured_ppl_increase: Option<f64>,
}

/// The chosen plan, verified by replay.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// The chosen candidate's label.
    pub variant: String,
    /// Its keep map.
    pub keep_map: KeepMap,
    /// Its per-layer plan.
    pub plan: Evaluated,
    /// Misses per token of a replay with the plan's caps, in and out of sample (equal to the
    /// plan's prediction, or [`search`] fails).
    pub replayed: (f64, f64),
}

/// What [`search`] found.
#[derive(Debug, Clone)]
pub struct PlanOutcome {
    /// Expert slots the budget holds.
    pub slots: usize,
    /// Every candidate, in the order of the request.
    pub candidates: Vec<Candidate>,
    /// The per-layer plan with the fewest in-sample misses.
    pub chosen: Chosen,
    /// The best uniform plan: (variant, plan).
    pub uniform_best: Option<(String, Evaluated)>,
}

/// The curve of `policy` on `v` over `caps` (default `k_used..=E`): one pass over every cap for
/// a policy that has one ([`cachesim::mrc::has_one_pass`]: lru; belady and the credit policies
/// under k-way residency), sliced to `caps`; else one replay per cap.
///
/// # Errors
/// [`SweepError::CacheSim`] for a configuration cachesim refuses, and
/// [`cachesim::CacheSimError::InvalidParameter`] (`caps`) for a cap above E.
pub fn miss_curve(
    v: &TraceView<'_>,
    keep: &Keep,
    policy: Policy,
    base: &CurveConfig,
    caps: Option<(usize, usize)>,
) -> Result<MissCurve> {
    let k = base.k_used.unwrap_or(v.shape().top_k);
    let (lo, hi) = caps.unwrap_or((k, v.shape().num_experts));
    if hi > v.shape().num_experts {
        return Err(cachesim::CacheSimError::InvalidParameter {
            name: "caps",
            value: format!("{lo}..={hi}"),
            reason: "a cap is above E, the experts per layer (a cache of E holds every expert): give caps up to E",
        }
        .into());
    }
    if lo >= k
        && let Some(curve) = cachesim::mrc::one_pass_curve(v, keep, policy, base)
    {
        return Ok(curve?.sliced(lo, hi)?);
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

/// Plans per-layer caches for `req`: for each candidate variant, the exact minimum-miss
/// allocation of the budget's slots ([`allocate`]) and the best uniform cap, evaluated on both
/// traces; the per-layer plan with the fewest in-sample misses is chosen and verified by replay.
///
/// # Errors
/// [`SweepError::Plan`] when the traces' shapes differ, the budget leaves no memory, two variants
/// give one keep map, no variant fits, or the replay disagrees with the plan; keep-map and
/// cachesim errors as they come.
pub fn search(req: &PlanRequest<'_>) -> Result<PlanOutcome> {
    let bad = |reason: String| Err(SweepError::Plan { reason });
    let (cv, hv) = (req.in_sample, req.out_of_sample);
    let (cm, hm) = (cv.meta(), hv.meta());
    if cm.num_experts != hm.num_experts || cm.layer_ids != hm.layer_ids {
        return bad(format!(
            "the in-sample trace {} (E = {}, layer ids {:?}) and the out-of-sample trace {} (E = {}, layer ids {:?}) \
             are of different models",
            req.in_sample_name, cm.num_experts, cm.layer_ids, req.out_of_sample_name, hm.num_experts, hm.layer_ids
        ));
    }
    let profile = req.profile;
    profile.check()?;
    let usable_mb = (req.budget_gb - req.pinned_gb) * 1000.0;
    if usable_mb.is_nan() || usable_mb <= 0.0 {
        return bad(format!(
            "budget {} GB minus pinned {} GB leaves no memory for experts",
            req.budget_gb, req.pinned_gb
        ));
    }
    // A hair of tolerance so that a budget of exactly n experts is n slots despite decimal rounding.
    // More slots than experts in all layers cache everything: capped there (and so finite).
    let all_experts = cm.num_experts as usize * cm.layer_ids.len();
    let slots = ((usable_mb / profile.expert_mb + 1e-9).floor() as usize).min(all_experts);
    let stats = Stats::from_trace(cv, req.in_sample_name.clone(), String::new());
    let held_stats = Stats::from_trace(hv, req.out_of_sample_name.clone(), String::new());
    let base =
        CurveConfig { k_used: req.k_used, warmup: req.warmup, semantics: Semantics::KWay, ..CurveConfig::default() };
    let eval = |alloc: &Allocation, cin: &MissCurve, cout: &MissCurve| {
        let mpt = |m: u64, c: &MissCurve| if c.tokens == 0 { 0.0 } else { m as f64 / c.tokens as f64 };
        let (i, o) = (mpt(alloc.misses, cin), mpt(evaluate(cout, &alloc.caps), cout));
        let tok = |m: f64| profile.bandwidth_gbps.iter().map(|&bw| (bw, profile.tok_s(m, bw))).collect::<Vec<_>>();
        Evaluated {
            caps: alloc.caps.clone(),
            slots: alloc.slots,
            memory_gb: alloc.slots as f64 * profile.expert_mb / 1000.0 + req.pinned_gb,
            in_sample_misses_per_token: i,
            out_of_sample_misses_per_token: o,
            in_sample_tok_s: tok(i),
            out_of_sample_tok_s: tok(o),
        }
    };
    let mut candidates = Vec::new();
    // The slots an evaluated candidate needs, k_used per layer (the same for every candidate).
    let mut needed_slots: Option<usize> = None;
    let mut maps: Vec<(KeepMap, &String)> = Vec::new();
    for spec in req.variants {
        let map = crate::variant_keep_map(spec, &stats, &KeepConfig::default(), cm)?;
        if let Some((_, first)) = maps.iter().find(|(m, _)| m.label() == map.label()) {
            return bad(format!(
                "--variants: {first} and {spec} both give the keep map {}; the plan could not tell which one it chose",
                map.label()
            ));
        }
        let r = saliency::retention(&map, &held_stats, None)?;
        let sr = r.mean.slot_replacement;
        let excluded = req
            .max_slot_replacement
            .filter(|&max| !map.is_full() && sr > max)
            .map(|max| format!("held-out slot replacement {sr:.4} exceeds --max-slot-replacement {max}"))
            .or_else(|| req.quality.and_then(|q| q.exclusion(&map)));
        let measured = req.quality.and_then(|q| q.of(&map));
        let mut cand = Candidate {
            variant: map.label(),
            heldout_slot_replacement: sr,
            excluded,
            non_convex_layers: 0,
            per_layer: None,
            uniform: None,
            measured_kl: measured.map(|m| m.kl),
            measured_ppl_increase: measured.map(|m| m.ppl_increase),
        };
        if cand.excluded.is_none() {
            let keep_c = Keep::from_layers(&cv.shape(), &map.layers)?;
            let cin = miss_curve(cv, &keep_c, req.policy, &base, None)?;
            let cout = miss_curve(hv, &keep_c, req.policy, &base, None)?;
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
        maps.push((map, spec));
        candidates.push(cand);
    }
    let best = |f: fn(&Candidate) -> Option<&Evaluated>| {
        candidates
            .iter()
            .enumerate()
            .filter_map(|(i, c)| f(c).map(|e| (i, e)))
            .min_by(|x, y| x.1.in_sample_misses_per_token.total_cmp(&y.1.in_sample_misses_per_token))
    };
    let uniform_best = best(|c| c.uniform.as_ref()).map(|(i, e)| (candidates[i].variant.clone(), e.clone()));
    let Some((chosen_i, chosen_e)) = best(|c| c.per_layer.as_ref()) else {
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
            let gb = ((need as f64 * profile.expert_mb / 1000.0 + req.pinned_gb) * 1e4).ceil() / 1e4;
            msg += &format!(
                "; the smallest budget that caches k_used experts in every layer is {need} slots: --budget-gb {gb}"
            );
        }
        return bad(msg);
    };
    let chosen_e = chosen_e.clone();
    // Verify by replay: the chosen variant with its per-layer caps, on both traces.
    let map = maps.swap_remove(chosen_i).0;
    let keep = Keep::from_layers(&cv.shape(), &map.layers)?;
    let cfg = ReplayConfig {
        k_used: req.k_used,
        warmup: req.warmup,
        layer_caps: Some(chosen_e.caps.clone()),
        ..ReplayConfig::new(req.policy, chosen_e.caps.iter().copied().min().unwrap_or(1))
    };
    let replayed_in = cachesim::replay(cv, &keep, &cfg)?.misses_per_token();
    let replayed_out = cachesim::replay(hv, &keep, &cfg)?.misses_per_token();
    if replayed_in != chosen_e.in_sample_misses_per_token || replayed_out != chosen_e.out_of_sample_misses_per_token {
        return bad(format!(
            "internal error: the plan predicts {} / {} misses per token but its replay gives {replayed_in} / {replayed_out}",
            chosen_e.in_sample_misses_per_token, chosen_e.out_of_sample_misses_per_token
        ));
    }
    let chosen = Chosen {
        variant: candidates[chosen_i].variant.clone(),
        keep_map: map,
        plan: chosen_e,
        replayed: (replayed_in, replayed_out),
    };
    Ok(PlanOutcome { slots, candidates, chosen, uniform_best })
}
