//! Out-of-sample retention of a keep map on held-out statistics (SEMANTICS.md §4).

use serde::{Deserialize, Serialize};
use trace_io::TraceView;

use crate::error::{invalid, mismatch};
use crate::{KeepCheck, KeepMap, Result, Stats};

/// Tolerance of [`check_retention`] (SEMANTICS.md §8.3: "equal to the stored figures to 1e-4").
pub const RETENTION_TOLERANCE: f64 = 1e-4;

/// Retention figures of one layer, or their aggregate over layers.
///
/// Convention for empty denominators: a ratio of 0/0 (no mass at all in the layer or token) counts
/// as full retention (1.0, nothing to lose) and as 0 replacement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetentionFigures {
    /// Σ_kept reap_sum / Σ_all reap_sum, in [0, 1]; `None` when the held-out statistics have no
    /// `reap_sum` (no output norms).
    pub reap_retention: Option<f64>,
    /// Σ_kept gate_sum / Σ_all gate_sum, in [0, 1]; `None` without `gate_sum`. SEMANTICS.md §4
    /// asks for it when REAP is unavailable; it is reported whenever gates are.
    pub gate_retention: Option<f64>,
    /// Fraction of used slots whose expert is not kept: Σ_not-kept count / Σ_all count, in [0, 1].
    pub slot_replacement: f64,
    /// Mean over tokens of (gate mass of the kept used slots / gate mass of all used slots), in
    /// [0, 1]; needs the held-out trace with gates, `None` otherwise.
    pub prob_retention: Option<f64>,
    /// Kept experts with zero held-out count. In [`Retention::mean`] and [`Retention::min`] this
    /// is the SUM over layers (a count of (layer, expert) pairs), not a mean or minimum.
    pub zero_hit_kept: u64,
    /// Experts left out of `reap_retention` because their held-out `reap_sum` is unknown
    /// ([`crate::LayerStats::reap_missing`]); 0 for complete statistics. Summed over layers in
    /// the mean and min rows.
    #[serde(default)]
    pub reap_excluded_experts: u64,
    /// Held-out used slots routed to those experts (so `reap_retention` covers the other
    /// `Σ count − reap_excluded_slots` slots). Summed over layers in the mean and min rows.
    #[serde(default)]
    pub reap_excluded_slots: u64,
}

/// Retention of one layer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerRetention {
    /// The model's id of the layer.
    pub layer_id: u32,
    /// Experts the map keeps in this layer.
    pub kept: usize,
    /// The figures.
    pub figures: RetentionFigures,
}

/// Out-of-sample retention of a keep map (SEMANTICS.md §4): per layer, and mean and min over
/// layers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Retention {
    /// [`KeepMap::label`] of the map.
    pub label: String,
    /// One entry per layer, in map order.
    pub per_layer: Vec<LayerRetention>,
    /// Mean over layers of each ratio (`None` if it is `None` in the layers); `zero_hit_kept` is
    /// the sum over layers.
    pub mean: RetentionFigures,
    /// Minimum over layers of each ratio, as SEMANTICS.md §4 says. Note that for
    /// `slot_replacement` lower is better, so its worst layer is [`Retention::max_slot_replacement`].
    /// `zero_hit_kept` is the sum over layers.
    pub min: RetentionFigures,
    /// Maximum over layers of `slot_replacement` (the worst layer).
    pub max_slot_replacement: f64,
}

fn ratio(num: f64, den: f64) -> f64 {
    if den > 0.0 { (num / den).clamp(0.0, 1.0) } else { 1.0 }
}

/// Retention of `map` on the held-out statistics `heldout` (SEMANTICS.md §4): per layer
/// `reap_retention` (from `reap_sum`), `gate_retention` (from `gate_sum`), `slot_replacement`
/// (from `count`), `prob_retention` (from the per-token gates of `heldout_trace`, `None` without
/// the trace or its gates) and `zero_hit_kept`; then mean and min over layers.
///
/// Experts whose held-out `reap_sum` is unknown ([`crate::LayerStats::reap_missing`]) are left
/// out of both sums of `reap_retention` (numerator and denominator), and counted in
/// `reap_excluded_experts` / `reap_excluded_slots`: the figure is the retained share of the REAP
/// mass that is known. The other figures use every expert.
///
/// `heldout` should be [`Stats::from_trace`] of `heldout_trace` when both are given; this is
/// checked on the counts.
///
/// # Errors
/// [`crate::SaliencyError::Mismatch`] when the map's E or layer ids differ from the held-out
/// statistics', the trace's shape differs from the statistics', or the trace's counts differ from
/// the statistics'; [`crate::SaliencyError::Invalid`] for a map or statistics that fail validation
/// or have no layers.
pub fn retention(map: &KeepMap, heldout: &Stats, heldout_trace: Option<&TraceView<'_>>) -> Result<Retention> {
    heldout.validate()?;
    map.validate()?;
    map.check_shape(heldout, "retention")?;
    if heldout.layers.is_empty() {
        return Err(invalid("layers", "retention needs at least one layer"));
    }
    let e = heldout.num_experts();
    if let Some(trace) = heldout_trace {
        check_trace(heldout, trace)?;
    }
    let mut per_layer = Vec::with_capacity(heldout.layers.len());
    for (l, (layer, &layer_id)) in heldout.layers.iter().zip(&heldout.meta.layer_ids).enumerate() {
        let kept = map.kept_mask(l);
        let mut known = vec![true; e];
        for &x in &layer.reap_missing {
            if let Some(k) = known.get_mut(usize::from(x)) {
                *k = false;
            }
        }
        let split = |v: &[f64], over: &[bool]| {
            let all: f64 = v.iter().zip(over).filter(|(_, o)| **o).map(|(x, _)| x).sum();
            let in_kept: f64 =
                v.iter().zip(&kept).zip(over).filter(|((_, k), o)| **k && **o).map(|((x, _), _)| x).sum();
            ratio(in_kept, all)
        };
        let every = vec![true; e];
        let reap_excluded_slots: u64 = layer.reap_missing.iter().map(|&x| layer.count[usize::from(x)]).sum();
        let all_slots: u64 = layer.count.iter().sum();
        let lost_slots: u64 = layer.count.iter().zip(&kept).filter(|(_, k)| !**k).map(|(c, _)| c).sum();
        let slot_replacement = if all_slots > 0 { lost_slots as f64 / all_slots as f64 } else { 0.0 };
        let prob_retention = heldout_trace.and_then(|t| prob_retention(t, l, &kept));
        let zero_hit_kept = (0..e).filter(|&x| kept[x] && layer.count[x] == 0).count() as u64;
        per_layer.push(LayerRetention {
            layer_id,
            kept: map.layers[l].len(),
            figures: RetentionFigures {
                reap_retention: layer.reap_sum.as_deref().map(|v| split(v, &known)),
                gate_retention: layer.gate_sum.as_deref().map(|v| split(v, &every)),
                slot_replacement,
                prob_retention,
                zero_hit_kept,
                reap_excluded_experts: layer.reap_missing.len() as u64,
                reap_excluded_slots,
            },
        });
    }
    let n = per_layer.len() as f64;
    let figs = || per_layer.iter().map(|p| &p.figures);
    let opt = |get: fn(&RetentionFigures) -> Option<f64>, mean: bool| -> Option<f64> {
        let vals: Option<Vec<f64>> = figs().map(get).collect();
        let vals = vals?;
        Some(if mean { vals.iter().sum::<f64>() / n } else { vals.iter().copied().fold(f64::INFINITY, f64::min) })
    };
    let zero_hit_total: u64 = figs().map(|f| f.zero_hit_kept).sum();
    let excluded_experts: u64 = figs().map(|f| f.reap_excluded_experts).sum();
    let excluded_slots: u64 = figs().map(|f| f.reap_excluded_slots).sum();
    let agg = |mean: bool| RetentionFigures {
        reap_retention: opt(|f| f.reap_retention, mean),
        gate_retention: opt(|f| f.gate_retention, mean),
        slot_replacement: opt(|f| Some(f.slot_replacement), mean).unwrap_or(0.0),
        prob_retention: opt(|f| f.prob_retention, mean),
        zero_hit_kept: zero_hit_total,
        reap_excluded_experts: excluded_experts,
        reap_excluded_slots: excluded_slots,
    };
    Ok(Retention {
        label: map.label(),
        mean: agg(true),
        min: agg(false),
        max_slot_replacement: figs().map(|f| f.slot_replacement).fold(0.0, f64::max),
        per_layer,
    })
}

/// Errors unless the trace has the statistics' shape and counts.
fn check_trace(stats: &Stats, trace: &TraceView<'_>) -> Result<()> {
    let meta = trace.meta();
    let shape = trace.shape();
    if meta.num_experts != stats.meta.num_experts {
        return Err(mismatch("retention: num_experts of the held-out trace", stats.meta.num_experts, meta.num_experts));
    }
    if meta.top_k != stats.meta.top_k {
        return Err(mismatch("retention: top_k of the held-out trace", stats.meta.top_k, meta.top_k));
    }
    if meta.layer_ids != stats.meta.layer_ids {
        return Err(mismatch(
            "retention: layer_ids of the held-out trace",
            format!("{:?}", stats.meta.layer_ids),
            format!("{:?}", meta.layer_ids),
        ));
    }
    let (k, m) = (shape.top_k, shape.candidates);
    for (l, (layer, id)) in stats.layers.iter().zip(&stats.meta.layer_ids).enumerate() {
        if layer.tokens != shape.tokens as u64 {
            return Err(mismatch(
                format!("retention: layer {id} tokens of the held-out trace"),
                layer.tokens,
                shape.tokens,
            ));
        }
        let mut count = vec![0u64; stats.num_experts()];
        for row in trace.layer_ids(l).chunks_exact(m.max(1)) {
            for &x in &row[..k] {
                count[usize::from(x)] += 1;
            }
        }
        if let Some(x) = (0..count.len()).find(|&x| count[x] != layer.count[x]) {
            return Err(mismatch(
                format!("retention: layer {id} expert {x} count of the held-out trace vs its statistics"),
                layer.count[x],
                count[x],
            ));
        }
    }
    Ok(())
}

/// Mean over tokens of kept gate mass / all gate mass over the k used slots; `None` without gates.
fn prob_retention(trace: &TraceView<'_>, l: usize, kept: &[bool]) -> Option<f64> {
    let gates = trace.layer_gates(l)?;
    let shape = trace.shape();
    let (k, m) = (shape.top_k, shape.candidates);
    if shape.tokens == 0 {
        return Some(1.0);
    }
    let ids = trace.layer_ids(l);
    let mut acc = 0.0f64;
    for t in 0..shape.tokens {
        let (mut all, mut in_kept) = (0.0f64, 0.0f64);
        for slot in 0..k {
            let g = f64::from(gates[t * k + slot]);
            all += g;
            if kept[usize::from(ids[t * m + slot])] {
                in_kept += g;
            }
        }
        acc += ratio(in_kept, all);
    }
    Some(acc / shape.tokens as f64)
}

/// Audit check 3 of SEMANTICS.md §8: recomputes the retention of `map` on `heldout` (and
/// `trace`, for `prob_retention`) with [`retention`] and compares it with `stored`: the same
/// label and layers, every ratio within [`RETENTION_TOLERANCE`] (present in both or absent in
/// both), every count equal, in every layer and in the mean, min and max rows. The check is named
/// `<label>: retention reproduces`; on failure its detail names the first differing figure.
pub fn check_retention(stored: &Retention, map: &KeepMap, heldout: &Stats, trace: Option<&TraceView<'_>>) -> KeepCheck {
    let name = format!("{}: retention reproduces", map.label());
    let result = (|| -> std::result::Result<String, String> {
        let fresh = retention(map, heldout, trace).map_err(|e| format!("recomputing failed: {e}"))?;
        if stored.label != fresh.label {
            return Err(format!("stored label {}, recomputed {}", stored.label, fresh.label));
        }
        if stored.per_layer.len() != fresh.per_layer.len() {
            return Err(format!("stored {} layers, recomputed {}", stored.per_layer.len(), fresh.per_layer.len()));
        }
        let mut worst = 0.0f64;
        for (a, b) in stored.per_layer.iter().zip(&fresh.per_layer) {
            if a.layer_id != b.layer_id || a.kept != b.kept {
                return Err(format!(
                    "layer {} (kept {}) stored, layer {} (kept {}) recomputed",
                    a.layer_id, a.kept, b.layer_id, b.kept
                ));
            }
            worst = worst.max(compare(&a.figures, &b.figures, &format!("layer {}", a.layer_id))?);
        }
        worst = worst.max(compare(&stored.mean, &fresh.mean, "mean")?);
        worst = worst.max(compare(&stored.min, &fresh.min, "min")?);
        let d = (stored.max_slot_replacement - fresh.max_slot_replacement).abs();
        if d.is_nan() || d > RETENTION_TOLERANCE {
            return Err(format!(
                "max slot_replacement: stored {}, recomputed {}",
                stored.max_slot_replacement, fresh.max_slot_replacement
            ));
        }
        Ok(format!(
            "{} layers: every figure within {RETENTION_TOLERANCE:e} (largest difference {:.2e})",
            fresh.per_layer.len(),
            worst.max(d)
        ))
    })();
    let (passed, detail) = match result {
        Ok(d) => (true, d),
        Err(d) => (false, d),
    };
    KeepCheck { name, passed, detail }
}

/// Largest absolute difference of the ratios, or the first figure that differs.
fn compare(a: &RetentionFigures, b: &RetentionFigures, at: &str) -> std::result::Result<f64, String> {
    let mut worst = 0.0f64;
    let ratios = [
        ("reap_retention", a.reap_retention, b.reap_retention),
        ("gate_retention", a.gate_retention, b.gate_retention),
        ("slot_replacement", Some(a.slot_replacement), Some(b.slot_replacement)),
        ("prob_retention", a.prob_retention, b.prob_retention),
    ];
    for (name, x, y) in ratios {
        match (x, y) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                let d = (x - y).abs();
                if d.is_nan() || d > RETENTION_TOLERANCE {
                    return Err(format!("{at} {name}: stored {x}, recomputed {y}"));
                }
                worst = worst.max(d);
            }
            (x, y) => return Err(format!("{at} {name}: stored {x:?}, recomputed {y:?}")),
        }
    }
    let counts = [
        ("zero_hit_kept", a.zero_hit_kept, b.zero_hit_kept),
        ("reap_excluded_experts", a.reap_excluded_experts, b.reap_excluded_experts),
        ("reap_excluded_slots", a.reap_excluded_slots, b.reap_excluded_slots),
    ];
    for (name, x, y) in counts {
        if x != y {
            return Err(format!("{at} {name}: stored {x}, recomputed {y}"));
        }
    }
    Ok(worst)
}
