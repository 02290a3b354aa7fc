//! `plan --exec host`: per-layer pinned experts for a GPU memory budget, chosen by the
//! in-sample tok/s of hybrid execution (SEMANTICS.md §14), not by misses, and reported with the
//! out-of-sample tok/s of the same choice (the held-out trace never steers the choice, so its
//! figure is not flattered by it).
//!
//! Placement is static (cap 0, every non-pinned pick a host run), one row per step (a decode).
//! Layer l pins the top n_l experts of its in-sample counts (ties: lower id first). On a
//! trace, step s of layer l then has m = the chosen experts ranked n_l or below
//! as host runs, so h(s, l) = m · max(expert_mb / (1000 · host_gbps), host_ms_per_row / 1000)
//! plus host_sync_ms / 1000 when m > 0, and g = compute / (1000 · L) (no loads, no copies). With no
//! copies §14's step time is Σ_l (g + h) or Σ_l max(g, h): a sum over layers, so the total time
//! is Σ_l T_l(n_l) with T_l(n) = Σ_s layer_time(g, h(s, l)) — one pass per layer gives every
//! T_l(n), n = 0..E ([`LayerCurves`]), and [`allocate`] minimises Σ_l T_l(n_l) exactly under
//! Σ_l n_l · expert_mb + kv ≤ budget by dynamic programming, preferring fewer experts on ties.
//! Under `concurrent`, T_l stops falling once h ≤ g in every step, so the plan stops pinning
//! there. The curves equal cachesim's `replay_hybrid` + `cost` (a test checks it).

use cachesim::hybrid::{HybridDevice, Overlap};
use trace_io::TraceView;

use crate::SweepError;

/// Whole experts or whole layers on the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Granularity {
    /// Any count per layer (kTransformers' `--kt-num-gpu-experts`, per-expert hot sets).
    #[default]
    Expert,
    /// Each layer all on the GPU or all on the CPU (llama.cpp's `-ot` / `--n-cpu-moe`).
    Layer,
}

/// The request of [`plan_hybrid`].
#[derive(Debug, Clone, Copy)]
pub struct HybridPlanRequest<'a> {
    /// Calibration trace: the pin order (in-sample counts) comes from it.
    pub in_sample: &'a TraceView<'a>,
    /// Held-out trace: the chosen plan's figures come from it.
    pub out_of_sample: &'a TraceView<'a>,
    /// The device of §14 (overlap included).
    pub device: HybridDevice,
    /// GPU memory for pinned experts and the KV cache, GB (10^9 bytes).
    pub gpu_budget_gb: f64,
    /// GPU memory the KV cache takes from the budget, GB.
    pub kv_gb: f64,
    /// Experts used per token (≤ the trace's top-k).
    pub k_used: usize,
    /// Tokens not counted at the start (§5's warmup).
    pub warmup: usize,
    /// Whole experts or whole layers.
    pub granularity: Granularity,
}

/// Per layer, a trace's counted time in seconds with the top n experts pinned, n = 0..=E.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LayerCurves {
    /// `seconds[l][n]`.
    pub seconds: Vec<Vec<f64>>,
    /// Rows (tokens) counted.
    pub rows: u64,
}

impl LayerCurves {
    /// tok/s of per-layer pinned counts `n`: rows / Σ_l T_l(n_l).
    pub fn tok_s(&self, n: &[usize]) -> f64 {
        let t: f64 = self.seconds.iter().zip(n).map(|(c, &n)| c[n]).sum();
        if t > 0.0 { self.rows as f64 / t } else { 0.0 }
    }
}

/// The plan: pinned experts per layer and its figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HybridPlan {
    /// Whole experts or whole layers.
    pub granularity: Granularity,
    /// The overlap planned for.
    pub overlap: Overlap,
    /// Pinned experts per layer (the first n_l of the in-sample order).
    pub counts: Vec<usize>,
    /// Their ids per layer.
    pub pins: Vec<Vec<u16>>,
    /// GPU memory used: Σ n_l · expert_mb / 1000 + kv_gb, GB.
    pub gpu_gb: f64,
    /// Out-of-sample tok/s of the plan (from the held-out trace's curves).
    pub tok_s: f64,
    /// In-sample tok/s of the plan: the figure the counts were chosen by.
    #[serde(default)]
    pub in_sample_tok_s: f64,
    /// The all-CPU baseline (no pins) on the held-out trace.
    pub baseline_tok_s: f64,
    /// Every expert on the GPU (the upper bound, ignoring the budget), on the held-out trace.
    pub all_gpu_tok_s: f64,
}

/// Per layer, the experts in order of in-sample count (most first, ties: lower id).
pub fn pin_order(view: &TraceView<'_>, k_used: usize) -> Vec<Vec<u16>> {
    let s = view.shape();
    (0..s.layers)
        .map(|l| {
            let mut count = vec![0u64; s.num_experts];
            for row in view.layer_ids(l).chunks(s.candidates) {
                for &e in &row[..k_used] {
                    count[e as usize] += 1;
                }
            }
            let mut order: Vec<u16> = (0..s.num_experts as u16).collect();
            order.sort_by_key(|&e| (std::cmp::Reverse(count[e as usize]), e));
            order
        })
        .collect()
}

/// The per-layer time curves of `order` on `view` (one row per step, tokens from `warmup` on).
pub fn layer_curves(
    view: &TraceView<'_>,
    order: &[Vec<u16>],
    dev: &HybridDevice,
    k_used: usize,
    warmup: usize,
) -> LayerCurves {
    let s = view.shape();
    let l_n = s.layers.max(1) as f64;
    let g = dev.compute_ms_per_step.unwrap_or(dev.compute_ms) / (1000.0 * l_n);
    let run = (dev.expert_mb / (1000.0 * dev.host_gbps)).max(dev.host_ms_per_row / 1000.0);
    let sync = dev.host_sync_ms / 1000.0;
    let layer_time = |m: usize| {
        let h = if m == 0 { 0.0 } else { m as f64 * run + sync };
        match dev.overlap {
            Overlap::Sequential => g + h,
            Overlap::Concurrent => g.max(h),
        }
    };
    let seconds = (0..s.layers)
        .map(|l| {
            let mut rank = vec![0usize; s.num_experts];
            for (r, &e) in order[l].iter().enumerate() {
                rank[e as usize] = r;
            }
            // curve[n]: Σ over counted steps of the layer time with the first n of `order` pinned.
            let mut curve = vec![0.0; s.num_experts + 1];
            let mut ranks = Vec::with_capacity(k_used);
            for row in view.layer_ids(l).chunks(s.candidates).skip(warmup) {
                ranks.clear();
                ranks.extend(row[..k_used].iter().map(|&e| rank[e as usize]));
                ranks.sort_unstable();
                // with n pinned, the host runs are the ranks >= n
                let mut below = 0;
                for (n, c) in curve.iter_mut().enumerate() {
                    while below < ranks.len() && ranks[below] < n {
                        below += 1;
                    }
                    *c += layer_time(ranks.len() - below);
                }
            }
            curve
        })
        .collect();
    LayerCurves { seconds, rows: s.tokens.saturating_sub(warmup) as u64 }
}

/// The counts n_l (each one of `choices`) minimising Σ_l T_l(n_l) with Σ_l n_l ≤ `slots`, fewer
/// experts first on ties (so no expert is pinned that buys no time); `None` if none fits.
pub fn allocate(curves: &LayerCurves, choices: &[usize], slots: usize) -> Option<Vec<usize>> {
    // best[b] = (time, experts) of the layers so far with b slots used; dp over layers.
    let mut best: Vec<Option<(f64, Vec<usize>)>> = vec![None; slots + 1];
    best[0] = Some((0.0, Vec::new()));
    for c in &curves.seconds {
        let mut next: Vec<Option<(f64, Vec<usize>)>> = vec![None; slots + 1];
        for (b, cur) in best.iter().enumerate() {
            let Some((t, ns)) = cur else { continue };
            for &n in choices.iter().filter(|&&n| b + n <= slots && n < c.len()) {
                let cand = t + c[n];
                let slot = &mut next[b + n];
                if slot.as_ref().is_none_or(|(bt, _)| cand < *bt) {
                    let mut v = ns.clone();
                    v.push(n);
                    *slot = Some((cand, v));
                }
            }
        }
        best = next;
    }
    // The least time over budgets; on a tie (relative 1e-12), the fewest experts.
    let mut out: Option<(f64, usize, Vec<usize>)> = None;
    for (b, cur) in best.into_iter().enumerate() {
        let Some((t, ns)) = cur else { continue };
        if out.as_ref().is_none_or(|(bt, _, _)| t < bt * (1.0 - 1e-12)) {
            out = Some((t, b, ns));
        }
    }
    out.map(|(_, _, ns)| ns)
}

/// Plans pinned experts per layer for `req` (see the module documentation).
///
/// # Errors
/// [`SweepError::Grid`] (key `plan.gpu_budget_gb`) when the KV cache alone exceeds the budget,
/// (key `plan.k_used`) for k_used above the trace's top-k, and (key `plan.out_of_sample`) for
/// traces of different layer or expert counts.
pub fn plan_hybrid(req: &HybridPlanRequest<'_>) -> crate::Result<HybridPlan> {
    let bad = |key: &str, reason: String| SweepError::Grid { key: key.into(), reason };
    let (a, b) = (req.in_sample.shape(), req.out_of_sample.shape());
    if (a.layers, a.num_experts) != (b.layers, b.num_experts) {
        return Err(bad(
            "plan.out_of_sample",
            format!(
                "{} x {} experts against the in-sample {} x {}: the traces must be of one model",
                b.layers, b.num_experts, a.layers, a.num_experts
            ),
        ));
    }
    if req.k_used == 0 || req.k_used > a.top_k.min(b.top_k) {
        return Err(bad("plan.k_used", format!("{} must be between 1 and the traces' top-k", req.k_used)));
    }
    let free_mb = (req.gpu_budget_gb - req.kv_gb) * 1000.0;
    if free_mb.is_nan() || free_mb < 0.0 {
        return Err(bad(
            "plan.gpu_budget_gb",
            format!("the KV cache ({} GB) does not fit in the budget of {} GB", req.kv_gb, req.gpu_budget_gb),
        ));
    }
    let slots = ((free_mb / req.device.expert_mb) + 1e-9).floor() as usize;
    let slots = slots.min(a.layers * a.num_experts);
    let order = pin_order(req.in_sample, req.k_used);
    let chosen_by = layer_curves(req.in_sample, &order, &req.device, req.k_used, req.warmup);
    let curves = layer_curves(req.out_of_sample, &order, &req.device, req.k_used, req.warmup);
    let choices: Vec<usize> = match req.granularity {
        Granularity::Expert => (0..=a.num_experts).collect(),
        Granularity::Layer => vec![0, a.num_experts],
    };
    let counts = allocate(&chosen_by, &choices, slots).expect("0 pins always fit");
    let pins = counts.iter().zip(&order).map(|(&n, o)| o[..n].to_vec()).collect();
    Ok(HybridPlan {
        granularity: req.granularity,
        overlap: req.device.overlap,
        gpu_gb: counts.iter().sum::<usize>() as f64 * req.device.expert_mb / 1000.0 + req.kv_gb,
        tok_s: curves.tok_s(&counts),
        in_sample_tok_s: chosen_by.tok_s(&counts),
        baseline_tok_s: curves.tok_s(&vec![0; a.layers]),
        all_gpu_tok_s: curves.tok_s(&vec![a.num_experts; a.layers]),
        counts,
        pins,
    })
}
