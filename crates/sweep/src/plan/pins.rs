//! Plans with pinned experts (SEMANTICS.md §9): per layer a pinned count, a cache size and the
//! keep map, together under one budget of expert slots (memory per layer = pins + cap).
//!
//! For each candidate variant and each pinned count p of the request, the pins of a layer are its
//! p most used kept experts on the calibration trace (count desc, id asc; all kept ones when
//! fewer), and [`cachesim::mrc::lru_curve_pinned`] gives the LRU curve of the unpinned stream in
//! one pass. Per layer and memory m, the best (p, m − p) over the counts makes one curve over
//! memory, and [`super::allocate`] splits the slots between layers exactly. The chosen plan is
//! verified by a deployed replay on both traces.

use cachesim::mrc::{CurveConfig, LayerCurve, MissCurve, lru_curve_pinned};
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use saliency::{KeepConfig, Stats};

use super::{PlanOutcome, PlanRequest, allocate};
use crate::{Result, SweepError};

/// A plan with pins, verified by replay.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PinnedPlan {
    /// The keep map's label.
    pub variant: String,
    /// Pinned experts per layer (the hot counts of [`hot_count_list`]).
    pub pin_counts: Vec<usize>,
    /// The pinned expert ids per layer.
    pub pins: Vec<Vec<u16>>,
    /// Cache capacity per layer.
    pub caps: Vec<usize>,
    /// Slots used: Σ (pins + caps).
    pub slots: usize,
    /// Misses per token on the calibration trace (from its curves).
    pub in_sample_misses_per_token: f64,
    /// Misses per token on the held-out trace with the same pins and caps.
    pub out_of_sample_misses_per_token: f64,
    /// The keep map of `variant` (the pins are among its experts). Not serialized with the plan:
    /// `moe-offload plan` writes it beside, as `pinned.keep_map`.
    #[serde(skip)]
    pub keep_map: saliency::KeepMap,
}

impl PinnedPlan {
    /// The pinned counts as a per-layer hot-count list ([`hot_count_list`]);
    /// `layer_ids` are the model's ids of the trace's layers (the keep map's `layer_ids`).
    pub fn hot_count_list(&self, layer_ids: &[u32]) -> String {
        hot_count_list(layer_ids, &self.pin_counts)
    }
}

/// `N0,N1,...`: the experts kept resident in fast memory per layer, as the `--moe-hot-count` of
/// unmerged llama.cpp patches takes them (pull requests "MoE expert stats persistence + per-layer
/// hot-count", closed; not a flag of llama.cpp itself, so never among [`super::llama`]'s flags),
/// one value per model layer from 0 to the largest of `layer_ids`: `counts[i]` at
/// `layer_ids[i]`, 0 at a layer the trace does not have (a dense layer). Empty for no layers.
pub fn hot_count_list(layer_ids: &[u32], counts: &[usize]) -> String {
    let Some(&max) = layer_ids.iter().max() else { return String::new() };
    let mut hot = vec![0usize; max as usize + 1];
    for (&id, &n) in layer_ids.iter().zip(counts) {
        hot[id as usize] = n;
    }
    hot.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

/// The pins of count `p` per layer: the `p` most used kept experts of each layer on `stats`.
fn top_pins(stats: &Stats, keep: &Keep, p: usize) -> Vec<Vec<u16>> {
    stats
        .layers
        .iter()
        .enumerate()
        .map(|(l, ls)| {
            let mut ids: Vec<u16> = (0..ls.count.len() as u16).filter(|&e| keep.is_kept(l, usize::from(e))).collect();
            ids.sort_by_key(|&e| (std::cmp::Reverse(ls.count[usize::from(e)]), e));
            ids.truncate(p);
            ids.sort_unstable();
            ids
        })
        .collect()
}

/// The best plan with pins among the planned candidates of `outcome` (a [`super::search`] of
/// `req`), trying the pinned counts `pin_counts` (and 0) in every layer.
///
/// # Errors
/// [`SweepError::Plan`] when the policy is not lru (the one-pass pinned curve is LRU's), the
/// count list is empty or holds a count above E, no candidate fits, or the replay disagrees
/// with the plan; cachesim
/// errors as they come.
pub fn search_pinned(req: &PlanRequest<'_>, outcome: &PlanOutcome, pin_counts: &[usize]) -> Result<PinnedPlan> {
    let bad = |reason: String| Err(SweepError::Plan { reason });
    if !cachesim::mrc::has_pinned_curve(req.policy) {
        return bad(format!(
            "plans with pins use the one-pass lru curve of the unpinned stream; got policy {}",
            req.policy
        ));
    }
    if pin_counts.is_empty() {
        return bad("--pin-counts: give at least one count".into());
    }
    // No pins is always an option.
    let mut counts: Vec<usize> = std::iter::once(0).chain(pin_counts.iter().copied()).collect();
    counts.sort_unstable();
    counts.dedup();
    let (cv, hv) = (req.in_sample, req.out_of_sample);
    let shape = cv.shape();
    if let Some(&c) = counts.iter().find(|&&c| c > shape.num_experts) {
        return bad(format!(
            "--pin-counts: {c} is more than the {} experts of a layer: give counts up to {}",
            shape.num_experts, shape.num_experts
        ));
    }
    let stats = Stats::from_trace(cv, req.in_sample_name.clone(), String::new());
    let base =
        CurveConfig { k_used: req.k_used, warmup: req.warmup, semantics: Semantics::KWay, ..CurveConfig::default() };
    let mut best: Option<PinnedPlan> = None;
    for (spec, cand) in req.variants.iter().zip(&outcome.candidates) {
        if cand.excluded.is_some() {
            continue;
        }
        let map = crate::variant_keep_map(spec, &stats, &KeepConfig::default(), cv.meta())?;
        let keep = Keep::from_layers(&shape, &map.layers)?;
        // Per count: the pins and the curves of the unpinned stream on both traces.
        let mut options = Vec::new();
        for &p in &counts {
            let pins = top_pins(&stats, &keep, p);
            let pin_keep = Keep::from_layers(&shape, &pins)?;
            let cin = lru_curve_pinned(cv, &keep, Some(&pin_keep), &base)?;
            let cout = lru_curve_pinned(hv, &keep, Some(&pin_keep), &base)?;
            options.push((pins, cin, cout));
        }
        let (lo, hi) = (options[0].1.min_cap, options[0].1.max_cap);
        // Per layer and memory m in lo..=hi: the best option with m - pins >= lo.
        let mut arg = vec![vec![None::<usize>; hi - lo + 1]; shape.layers];
        let layers: Vec<LayerCurve> = (0..shape.layers)
            .map(|l| {
                let misses = (lo..=hi)
                    .map(|m| {
                        let mut pick: Option<(u64, usize)> = None;
                        for (i, (pins, cin, _)) in options.iter().enumerate() {
                            let Some(cap) = m.checked_sub(pins[l].len()).filter(|&c| c >= lo) else { continue };
                            let v = cin.layer_misses(l, cap.min(hi));
                            if pick.is_none_or(|(b, _)| v < b) {
                                pick = Some((v, i));
                            }
                        }
                        arg[l][m - lo] = pick.map(|p| p.1);
                        pick.map_or(u64::MAX / 1024, |p| p.0)
                    })
                    .collect();
                LayerCurve { layer_id: options[0].1.layers[l].layer_id, misses }
            })
            .collect();
        let combined = MissCurve { layers, ..options[0].1.clone() };
        let Some(alloc) = allocate(&combined, outcome.slots) else { continue };
        let mut plan = PinnedPlan {
            variant: cand.variant.clone(),
            pin_counts: Vec::new(),
            pins: Vec::new(),
            caps: Vec::new(),
            slots: alloc.slots,
            in_sample_misses_per_token: 0.0,
            out_of_sample_misses_per_token: 0.0,
            keep_map: map.clone(),
        };
        let (mut min_in, mut mout) = (0u64, 0u64);
        for (l, &m) in alloc.caps.iter().enumerate() {
            let Some(i) = arg[l][m - lo] else { return bad(format!("layer {l}: no pinned count fits memory {m}")) };
            let (pins, cin, cout) = &options[i];
            let cap = m - pins[l].len();
            min_in += cin.layer_misses(l, cap.min(hi));
            mout += cout.layer_misses(l, cap.min(hi));
            plan.pin_counts.push(pins[l].len());
            plan.pins.push(pins[l].clone());
            plan.caps.push(cap);
        }
        let mpt = |m: u64, c: &MissCurve| if c.tokens == 0 { 0.0 } else { m as f64 / c.tokens as f64 };
        plan.in_sample_misses_per_token = mpt(min_in, &options[0].1);
        plan.out_of_sample_misses_per_token = mpt(mout, &options[0].2);
        // Verify by replay.
        let dep =
            cachesim::deploy::Deployment { pins: Some(Keep::from_layers(&shape, &plan.pins)?), ..Default::default() };
        let cfg = ReplayConfig {
            k_used: req.k_used,
            warmup: req.warmup,
            layer_caps: Some(plan.caps.clone()),
            ..ReplayConfig::new(Policy::Lru, plan.caps.iter().copied().min().unwrap_or(1))
        };
        let rin = cachesim::deploy::replay(cv, &keep, &cfg, &dep)?.counts.misses_per_token();
        let rout = cachesim::deploy::replay(hv, &keep, &cfg, &dep)?.counts.misses_per_token();
        if rin != plan.in_sample_misses_per_token || rout != plan.out_of_sample_misses_per_token {
            return bad(format!(
                "internal error: the pinned plan predicts {} / {} misses per token but its replay gives {rin} / {rout}",
                plan.in_sample_misses_per_token, plan.out_of_sample_misses_per_token
            ));
        }
        if best.as_ref().is_none_or(|b| plan.in_sample_misses_per_token < b.in_sample_misses_per_token) {
            best = Some(plan);
        }
    }
    match best {
        Some(b) => Ok(b),
        None => bad(format!("no candidate variant can be planned with pins in {} slots", outcome.slots)),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn hot_counts_are_listed_by_model_layer() {
        // Layers 1..=3 traced (layer 0 dense): one value per model layer, 0 for layer 0.
        assert_eq!(super::hot_count_list(&[1, 2, 3], &[8, 4, 0]), "0,8,4,0");
        assert_eq!(super::hot_count_list(&[0, 2], &[3, 5]), "3,0,5");
        assert_eq!(super::hot_count_list(&[], &[]), "");
    }
}
