//! Audit checks of statistics and keep maps (SEMANTICS.md §8, checks 1 and 2).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::stats::OPTIONAL_STATS;
use crate::{BudgetScale, KeepConfig, KeepMap, Stats};

/// Calibration hits below which a kept expert is counted as rarely seen (SEMANTICS.md §8.2).
pub const LOW_HIT_THRESHOLD: u64 = 100;

/// The outcome of one audit check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepCheck {
    /// What was checked, e.g. `stats: count sums` or `reap@128: reproduces`.
    pub name: String,
    /// Whether the invariant holds.
    pub passed: bool,
    /// On failure the first offending item; on success the figures.
    pub detail: String,
}

impl KeepCheck {
    fn new(name: impl Into<String>, result: Result<String, String>) -> KeepCheck {
        let (passed, detail) = match result {
            Ok(d) => (true, d),
            Err(d) => (false, d),
        };
        KeepCheck { name: name.into(), passed, detail }
    }
}

/// Audit check 1 of SEMANTICS.md §8 on statistics, as two checks:
/// - `stats: well-formed`: [`Stats::validate`] (shapes; every statistic finite and >= 0);
/// - `stats: count sums`: per layer, Σ_e count = tokens · k. This holds for statistics from a
///   trace by construction, and is checked as well for statistics from other sources (the REAP
///   aggregate file states it holds there too); a failure names the first layer.
pub fn check_stats(stats: &Stats) -> Vec<KeepCheck> {
    let well_formed = stats.validate().map_err(|e| e.to_string()).map(|()| {
        let present: Vec<&str> = OPTIONAL_STATS
            .iter()
            .filter(|(_, get)| stats.layers.iter().all(|l| get(l).is_some()))
            .map(|(n, _)| *n)
            .collect();
        format!(
            "{} layers x {} experts, all finite and >= 0; statistics: count{}{}",
            stats.layers.len(),
            stats.meta.num_experts,
            if present.is_empty() { "" } else { ", " },
            present.join(", ")
        )
    });
    let k = u128::from(stats.meta.top_k);
    let sums = (|| {
        let mut total: u128 = 0;
        for (layer, id) in stats.layers.iter().zip(&stats.meta.layer_ids) {
            let sum: u128 = layer.count.iter().map(|&c| u128::from(c)).sum();
            let expected = u128::from(layer.tokens) * k;
            if sum != expected {
                return Err(format!("layer {id}: sum of counts {sum} != tokens {} x k {k} = {expected}", layer.tokens));
            }
            total += sum;
        }
        Ok(format!("{} layers: sum of counts = tokens x {k} in every layer ({total} slots in all)", stats.layers.len()))
    })();
    vec![KeepCheck::new("stats: well-formed", well_formed), KeepCheck::new("stats: count sums", sums)]
}

/// Audit check 2 of SEMANTICS.md §8 on keep maps built from `stats` with `cfg`. Per map (name
/// prefix = [`KeepMap::label`]):
/// - `reproduces`: the map's statistics hash equals [`Stats::sha256`] and rebuilding it with
///   [`KeepMap::build`] (short layers allowed when the map records some) gives the same map; for
///   `full`, it equals [`KeepMap::full`] of the statistics' shape. The metric parameters (τ,
///   hybrid base) are not stored in maps: `cfg` must be the one the maps were built with;
/// - `K unique ids per layer`: [`KeepMap::validate`];
/// - `no zero-hit expert`: every kept expert has count > 0 (not emitted for `full`, which keeps
///   every expert by definition);
/// - `kept experts with < 100 hits`: a figure (always passes): how many kept (layer, expert) pairs
///   have fewer than [`LOW_HIT_THRESHOLD`] calibration hits, and the worst layer.
///
/// Then per metric with two or more uniform maps, `nesting: <metric>`: for K1 < K2 each layer's
/// kept set of K1 is a subset of that of K2 (maps of equal K are not compared); and per (metric,
/// scale, floor) with two or more budget maps, `nesting: <metric> budget (<scale>, floor <f>)`,
/// the same across totals. Budget maps are rebuilt with [`KeepMap::build_budget`] and their
/// recorded [`crate::Budget`].
pub fn check_keep_maps(stats: &Stats, maps: &[KeepMap], cfg: &KeepConfig) -> Vec<KeepCheck> {
    let mut out = Vec::new();
    let stats_sha = stats.sha256();
    for map in maps {
        let label = map.label();
        out.push(KeepCheck::new(format!("{label}: reproduces"), reproduces(stats, &stats_sha, map, cfg)));
        out.push(KeepCheck::new(
            format!("{label}: K unique ids per layer"),
            map.validate().map_err(|e| e.to_string()).map(|()| match &map.budget {
                None => format!("{} layers, K = {}, {} short layers", map.layers.len(), map.k, map.short_layers.len()),
                Some(b) => format!(
                    "{} layers, budget {} (floor {}, scale {}): per-layer K from {} to {}, {} short layers",
                    map.layers.len(),
                    b.total,
                    b.floor,
                    b.scale,
                    map.layers.iter().map(Vec::len).min().unwrap_or(0),
                    map.k,
                    map.short_layers.len()
                ),
            }),
        ));
        if !map.is_full() {
            out.push(KeepCheck::new(format!("{label}: no zero-hit expert"), no_zero_hit(stats, map)));
        }
        out.push(KeepCheck::new(
            format!("{label}: kept experts with < {LOW_HIT_THRESHOLD} hits"),
            Ok(low_hits(stats, map)),
        ));
    }
    // Uniform maps nest across K per metric; budget maps nest across totals per (metric, scale,
    // floor). The two families are not compared with each other.
    type Family<'a> = (&'a str, Option<(BudgetScale, u32)>);
    let mut groups: BTreeMap<Family<'_>, Vec<&KeepMap>> = BTreeMap::new();
    // Placed pin maps are not nesting families (uniform's layers, say, do not nest across N).
    for map in maps.iter().filter(|m| !m.is_full() && m.placement.is_none()) {
        groups.entry((map.metric.as_str(), map.budget.map(|b| (b.scale, b.floor)))).or_default().push(map);
    }
    for ((metric, budget), mut group) in groups {
        if group.len() < 2 {
            continue;
        }
        group.sort_by_key(|m| m.budget.map_or(u64::from(m.k), |b| b.total));
        let name = match budget {
            None => format!("nesting: {metric}"),
            Some((scale, floor)) => format!("nesting: {metric} budget ({scale}, floor {floor})"),
        };
        out.push(KeepCheck::new(name, nesting(&group)));
    }
    out
}

fn reproduces(stats: &Stats, stats_sha: &str, map: &KeepMap, cfg: &KeepConfig) -> Result<String, String> {
    map.check_shape(stats, "reproduce").map_err(|e| e.to_string())?;
    if let Some(p) = &map.placement {
        let rebuilt =
            KeepMap::place(stats, p.placement, p.total, p.seed).map_err(|e| format!("rebuilding failed: {e}"))?;
        return if rebuilt.layers == map.layers {
            Ok(format!("equals the {} placement rebuilt from the statistics", p.placement))
        } else {
            Err(format!("differs from the {} placement rebuilt from the statistics", p.placement))
        };
    }
    let Some(metric) = map.parsed_metric().map_err(|e| e.to_string())? else {
        let full = KeepMap::full(stats.meta.num_experts, stats.meta.layer_ids.clone());
        return if &full == map {
            Ok("equals the full map of the statistics' shape".to_string())
        } else {
            Err("differs from the full map of the statistics' shape".to_string())
        };
    };
    if map.stats_sha256 != stats_sha {
        return Err(format!("map records statistics sha256 {}, the statistics hash to {stats_sha}", map.stats_sha256));
    }
    let cfg = KeepConfig { allow_short_layers: cfg.allow_short_layers || !map.short_layers.is_empty(), ..cfg.clone() };
    let rebuilt = match &map.budget {
        None => KeepMap::build(stats, metric, map.k as usize, &cfg),
        Some(b) => KeepMap::build_budget(stats, metric, b, &cfg),
    }
    .map_err(|e| format!("rebuilding failed: {e}"))?;
    if rebuilt.short_layers != map.short_layers {
        return Err(format!("short layers {:?}, rebuilt {:?}", map.short_layers, rebuilt.short_layers));
    }
    for ((a, b), id) in map.layers.iter().zip(&rebuilt.layers).zip(&map.layer_ids) {
        if a != b {
            let extra: Vec<u16> = a.iter().filter(|x| !b.contains(x)).copied().collect();
            let missing: Vec<u16> = b.iter().filter(|x| !a.contains(x)).copied().collect();
            return Err(format!("layer {id}: map keeps {extra:?} not in the rebuilt map, lacks {missing:?}"));
        }
    }
    if &rebuilt != map {
        return Err("the rebuilt map differs in its header fields".to_string());
    }
    Ok(format!("identical to the map rebuilt from statistics {}", &stats_sha[..stats_sha.len().min(12)]))
}

fn no_zero_hit(stats: &Stats, map: &KeepMap) -> Result<String, String> {
    map.check_shape(stats, "zero-hit check").map_err(|e| e.to_string())?;
    let mut kept = 0usize;
    for ((ids, layer), id) in map.layers.iter().zip(&stats.layers).zip(&map.layer_ids) {
        for &x in ids {
            if layer.count.get(usize::from(x)).copied().unwrap_or(0) == 0 {
                return Err(format!("layer {id} keeps expert {x}, which has no calibration hits"));
            }
        }
        kept += ids.len();
    }
    Ok(format!("all {kept} kept experts have calibration hits"))
}

fn low_hits(stats: &Stats, map: &KeepMap) -> String {
    if map.check_shape(stats, "low-hit count").is_err() {
        return "not computed: the map does not match the statistics' shape".to_string();
    }
    let mut total = 0usize;
    let mut worst: Option<(u32, usize)> = None;
    for ((ids, layer), &id) in map.layers.iter().zip(&stats.layers).zip(&map.layer_ids) {
        let n =
            ids.iter().filter(|&&x| layer.count.get(usize::from(x)).copied().unwrap_or(0) < LOW_HIT_THRESHOLD).count();
        total += n;
        if n > 0 && worst.is_none_or(|(_, w)| n > w) {
            worst = Some((id, n));
        }
    }
    match worst {
        Some((id, n)) => format!("{total} kept (layer, expert) pairs; most in layer {id} ({n})"),
        None => "0 kept (layer, expert) pairs".to_string(),
    }
}

fn nesting(group: &[&KeepMap]) -> Result<String, String> {
    let mut pairs = 0usize;
    for (i, small) in group.iter().enumerate() {
        for big in &group[i + 1..] {
            if small.k == big.k && small.budget.map(|b| b.total) == big.budget.map(|b| b.total) {
                continue;
            }
            if small.layer_ids != big.layer_ids {
                return Err(format!("{} and {} have different layer ids", small.label(), big.label()));
            }
            for ((a, b), id) in small.layers.iter().zip(&big.layers).zip(&small.layer_ids) {
                if let Some(x) = a.iter().find(|x| !b.contains(x)) {
                    return Err(format!(
                        "layer {id}: expert {x} is kept by {} but not by {}",
                        small.label(),
                        big.label()
                    ));
                }
            }
            pairs += 1;
        }
    }
    let ks: Vec<String> = group.iter().map(|m| m.budget.map_or(u64::from(m.k), |b| b.total).to_string()).collect();
    let what = if group.iter().any(|m| m.budget.is_some()) { "budget" } else { "K" };
    Ok(format!("{what} = {}: {pairs} pairs nest in every layer", ks.join(", ")))
}
