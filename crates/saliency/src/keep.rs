//! Keep maps: which experts of each layer survive pruning (SEMANTICS.md §3).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, mismatch};
use crate::metric::cmp_score;
use crate::placement::{DEFAULT_PLACEMENT_SEED, Placement, PlacementRecord};
use crate::{Metric, MetricConfig, Result, SaliencyError, Stats, jsonio, metric_scores, rank_percentiles};

/// The `kind` tag of a keep-map file (its first field, [`KeepMap::write_json`]); ignored when
/// reading, so maps written before the tag (and pin maps written by hand) read alike.
pub const KEEP_MAP_KIND: &str = "moe-offload-keep-map";

/// Configuration of keep-map construction.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KeepConfig {
    /// Metric parameters (τ, hybrid base metrics).
    pub metric: MetricConfig,
    /// Accept layers with fewer than K experts with c > 0 (keep all of them and record the layer
    /// in [`KeepMap::short_layers`]) instead of failing with [`SaliencyError::ShortLayer`].
    /// Default: not allowed.
    pub allow_short_layers: bool,
}

/// The experts kept per layer for one metric and budget K (SEMANTICS.md §3). Serialized as the
/// JSON keep-map file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeepMap {
    /// The metric name ([`Metric::as_str`]), or `full` for the unpruned map.
    pub metric: String,
    /// K, the budget per layer (E for `full`).
    pub k: u32,
    /// E, routed experts per layer; every kept id is `< E`.
    pub num_experts: u32,
    /// The model's id of each layer, one per entry of `layers`.
    pub layer_ids: Vec<u32>,
    /// Kept expert ids per layer, ascending, unique: K of them, or fewer for a layer listed in
    /// `short_layers`.
    pub layers: Vec<Vec<u16>>,
    /// [`Stats::sha256`] of the statistics the map was built from (empty for `full`).
    pub stats_sha256: String,
    /// Ids of layers that had fewer than K usable experts (only when short layers were allowed).
    /// For a budget map: layers with fewer usable experts than the floor.
    pub short_layers: Vec<u32>,
    /// For a map with a different K per layer ([`KeepMap::build_budget`]): the global budget it
    /// was built with; `k` is then the largest per-layer K. `None` (and absent from the file) for
    /// a uniform-K map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
    /// For a pin map placed by one of kTransformers' rules ([`KeepMap::place`]): the placement,
    /// N and seed; `metric` is then the placement's name, `k` the largest per-layer size, and a
    /// layer may hold no expert. `None` (and absent from the file) otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementRecord>,
}

/// How [`KeepMap::build_budget`] compares experts of different layers. Within a layer every scale
/// orders experts exactly as the metric does; the scale only decides which layer's next expert is
/// worth more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BudgetScale {
    /// score / Σ of the layer's usable scores: the expert's share of its layer. For the additive
    /// metrics (`frequency`, `gate_sum`, `ean_sum`, `l2_sum`) this is the fraction of the layer's
    /// calibration mass the expert carries, and the greedy allocation maximizes the mean over layers
    /// of the in-sample retention of that mass (for `frequency`: minimizes the mean slot
    /// replacement). Removes each layer's scale (output norms differ between layers; raw REAP
    /// mass would send the budget to the layers with the largest norms). Needs non-negative
    /// scores (every metric on consistent statistics). A layer whose usable scores are all 0 gives
    /// all its experts share 0.
    Share,
    /// Rank-percentile among the layer's usable experts (ascending rank, ties averaged, / (n − 1);
    /// 0 for n = 1): scale-free and defined for every metric, but it carries no magnitude, so
    /// layers with the same number of usable experts receive nearly the same K (the allocation is
    /// close to uniform).
    Percentile,
    /// The metric's raw score. Meaningful only when the metric is in the same units in every layer
    /// (for example `frequency` with the same token count in every layer, where it equals
    /// `share` up to a constant).
    Raw,
}

impl BudgetScale {
    /// Every scale.
    pub const ALL: [BudgetScale; 3] = [BudgetScale::Share, BudgetScale::Percentile, BudgetScale::Raw];

    /// `share`, `percentile` or `raw`.
    pub fn as_str(self) -> &'static str {
        match self {
            BudgetScale::Share => "share",
            BudgetScale::Percentile => "percentile",
            BudgetScale::Raw => "raw",
        }
    }

    /// The default scale of a metric: `share` for every metric. (`shrink` is the one metric that
    /// could score below 0, but for statistics that come from data it cannot: mean − SE < 0 would
    /// need Σx² > (Σx)², impossible for x = g·‖o‖ >= 0; only inconsistent statistics make
    /// `share` fail.)
    pub fn default_for(_metric: Metric) -> BudgetScale {
        BudgetScale::Share
    }
}

impl std::fmt::Display for BudgetScale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BudgetScale {
    type Err = SaliencyError;

    /// Parses `share`, `percentile` or `raw`.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] naming the valid spellings.
    fn from_str(s: &str) -> Result<BudgetScale> {
        BudgetScale::ALL
            .into_iter()
            .find(|b| b.as_str() == s)
            .ok_or_else(|| invalid("budget scale", format!("`{s}`; expected share, percentile or raw")))
    }
}

/// A global expert budget for a map with a different K per layer ([`KeepMap::build_budget`]).
///
/// Rule: every layer first keeps its `floor` best experts (metric order); the remaining
/// `total − L·floor` places go to the best remaining experts of the whole model, compared across
/// layers by `scale` (ties: lower layer index, then the layer's own order). Experts with c = 0 are
/// never kept. The map is recorded with this value and labelled `metric@budgetTOTAL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Experts kept over all layers (Σ_l K_l).
    pub total: u64,
    /// Least experts kept per layer (typically the k_used of the replay, default the model's k, so
    /// every token can still be routed to k experts).
    pub floor: u32,
    /// How experts of different layers are compared.
    pub scale: BudgetScale,
}

impl Budget {
    /// A budget with the defaults: floor = the statistics' k, scale = [`BudgetScale::default_for`].
    pub fn new(stats: &Stats, metric: Metric, total: u64) -> Budget {
        Budget { total, floor: stats.meta.top_k, scale: BudgetScale::default_for(metric) }
    }
}

/// Per layer, the usable (c > 0) experts in (score desc, id asc) order.
fn layer_orders(stats: &Stats, scores: &[Vec<f64>]) -> Vec<Vec<usize>> {
    stats
        .layers
        .iter()
        .zip(scores)
        .map(|(layer, s)| {
            let mut order: Vec<usize> = (0..layer.count.len()).filter(|&x| layer.count[x] > 0).collect();
            order.sort_by(|&a, &b| cmp_score(s[b], s[a]).then(a.cmp(&b)));
            order
        })
        .collect()
}

/// The first `take[l]` experts of each layer's order, as ascending u16 ids.
fn prefixes(orders: &[Vec<usize>], take: &[usize], e: usize) -> Result<Vec<Vec<u16>>> {
    orders
        .iter()
        .zip(take)
        .map(|(order, &k)| {
            let mut ids = order[..k.min(order.len())]
                .iter()
                .map(|&x| {
                    u16::try_from(x).map_err(|_| invalid("num_experts", format!("{e} experts do not fit u16 ids")))
                })
                .collect::<Result<Vec<u16>>>()?;
            ids.sort_unstable();
            Ok(ids)
        })
        .collect()
}

/// Cross-layer comparison keys aligned with `orders` (non-increasing along each layer's order).
fn cross_layer_keys(
    stats: &Stats,
    metric: Metric,
    scores: &[Vec<f64>],
    orders: &[Vec<usize>],
    scale: BudgetScale,
) -> Result<Vec<Vec<f64>>> {
    let mut out = Vec::with_capacity(orders.len());
    // Rounding can leave a mathematically zero score (shrink with mean = SE) a hair below 0:
    // within 1e-9 of the largest magnitude of any layer it counts as 0. (The scale is the whole
    // map's: a layer whose every score is 0 has no scale of its own, and its residues, e.g.
    // -1.2e-18, would be refused against it.) A map whose every score is such a residue has no
    // scale either, so anything within 1e-12 of 0 counts as 0 too (scores of real metrics are
    // counts, gate sums or gate·norm means, far above that).
    let largest = scores.iter().zip(orders).flat_map(|(s, order)| order.iter().map(|&x| s[x].abs()));
    let tol = (1e-9 * largest.fold(0.0f64, f64::max)).max(1e-12);
    for ((s, order), &layer_id) in scores.iter().zip(orders).zip(&stats.meta.layer_ids) {
        let usable: Vec<f64> = order.iter().map(|&x| s[x]).collect();
        let keys = match scale {
            BudgetScale::Raw => usable,
            BudgetScale::Percentile => rank_percentiles(&usable),
            BudgetScale::Share => {
                if let Some((j, v)) = usable.iter().enumerate().find(|(_, v)| **v < -tol) {
                    return Err(invalid(
                        "budget scale",
                        format!(
                            "share needs non-negative scores, but {metric} scores layer {layer_id} expert {} at {v}; use percentile",
                            order[j]
                        ),
                    ));
                }
                let usable: Vec<f64> = usable.iter().map(|v| v.max(0.0)).collect();
                let sum: f64 = usable.iter().sum();
                if sum > 0.0 { usable.iter().map(|v| v / sum).collect() } else { vec![0.0; usable.len()] }
            }
        };
        out.push(keys);
    }
    Ok(out)
}

impl KeepMap {
    /// Builds the map of `metric` with budget `k` (SEMANTICS.md §3): per layer, order experts by
    /// (score desc, id asc) using [`metric_scores`], drop those with c = 0, keep the first K, store
    /// the ids ascending. Maps of one metric nest across K because the order does not depend on K.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] for K = 0; [`SaliencyError::KTooLarge`] for K > E;
    /// [`SaliencyError::ShortLayer`] naming the first layer with fewer than K experts with c > 0
    /// unless `cfg.allow_short_layers`; any error of [`metric_scores`] (validation, missing
    /// statistic).
    pub fn build(stats: &Stats, metric: Metric, k: usize, cfg: &KeepConfig) -> Result<KeepMap> {
        let mut maps = KeepMap::build_many(stats, metric, &[k], cfg)?;
        maps.pop().ok_or_else(|| invalid("k", "no budget given"))
    }

    /// [`KeepMap::build`] for several budgets at once, scoring the statistics once: one map per
    /// entry of `ks`, in the order given. Maps of one call nest (K1 < K2 implies keep(K1) ⊂
    /// keep(K2) in every layer). Nothing is returned unless every K succeeds.
    ///
    /// # Errors
    /// As [`KeepMap::build`], for the first K that fails; [`SaliencyError::Invalid`] when `ks` is
    /// empty.
    pub fn build_many(stats: &Stats, metric: Metric, ks: &[usize], cfg: &KeepConfig) -> Result<Vec<KeepMap>> {
        let e = stats.num_experts();
        if ks.is_empty() {
            return Err(invalid("k", "no budget given"));
        }
        for &k in ks {
            if k == 0 {
                return Err(invalid("k", "K must be at least 1"));
            }
            if k > e {
                return Err(SaliencyError::KTooLarge { k, num_experts: e });
            }
        }
        let scores = metric_scores(stats, metric, &cfg.metric)?;
        let orders = layer_orders(stats, &scores);
        let sha = stats.sha256();
        ks.iter()
            .map(|&k| {
                let mut take = Vec::with_capacity(orders.len());
                let mut short_layers = Vec::new();
                for (order, &layer_id) in orders.iter().zip(&stats.meta.layer_ids) {
                    if order.len() < k {
                        if !cfg.allow_short_layers {
                            return Err(SaliencyError::ShortLayer { layer_id, available: order.len(), k });
                        }
                        short_layers.push(layer_id);
                    }
                    take.push(k.min(order.len()));
                }
                let layers = prefixes(&orders, &take, e)?;
                Ok(KeepMap {
                    metric: metric.as_str().to_string(),
                    k: k as u32,
                    num_experts: stats.meta.num_experts,
                    layer_ids: stats.meta.layer_ids.clone(),
                    layers,
                    stats_sha256: sha.clone(),
                    short_layers,
                    budget: None,
                    placement: None,
                })
            })
            .collect()
    }

    /// Builds a map with a different K per layer from a global budget (see [`Budget`] for the
    /// rule and the cross-layer scale). Per layer the kept experts are the first K_l of the same
    /// (score desc, id asc) order as [`KeepMap::build`], so a budget map's layer equals the uniform
    /// map's layer at that layer's K_l. The map records the budget in [`KeepMap::budget`]; its `k`
    /// is the largest K_l.
    ///
    /// Invariants (tested as properties): Σ_l K_l = total; K_l >= floor for every layer that has
    /// `floor` usable experts; maps of one (metric, scale, floor) nest across totals.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] for floor = 0 or floor > E, a total of 0 or below the sum of the floors
    /// or above the number of usable (c > 0) experts, or the `share` scale on a metric with a
    /// negative score; [`SaliencyError::ShortLayer`] for a layer with fewer usable experts than
    /// the floor unless `cfg.allow_short_layers` (then it keeps all of them and is recorded in
    /// `short_layers`); any error of [`metric_scores`].
    pub fn build_budget(stats: &Stats, metric: Metric, budget: &Budget, cfg: &KeepConfig) -> Result<KeepMap> {
        let e = stats.num_experts();
        let floor = budget.floor as usize;
        if floor == 0 || floor > e {
            return Err(invalid("floor", format!("{floor} is not in 1..={e}")));
        }
        let scores = metric_scores(stats, metric, &cfg.metric)?;
        let orders = layer_orders(stats, &scores);
        let keys = cross_layer_keys(stats, metric, &scores, &orders, budget.scale)?;
        let mut take = Vec::with_capacity(orders.len());
        let mut short_layers = Vec::new();
        for (order, &layer_id) in orders.iter().zip(&stats.meta.layer_ids) {
            if order.len() < floor {
                if !cfg.allow_short_layers {
                    return Err(SaliencyError::ShortLayer { layer_id, available: order.len(), k: floor });
                }
                short_layers.push(layer_id);
            }
            take.push(floor.min(order.len()));
        }
        let base: usize = take.iter().sum();
        let usable: usize = orders.iter().map(Vec::len).sum();
        let total = usize::try_from(budget.total).unwrap_or(usize::MAX);
        if total == 0 {
            return Err(invalid("budget", "total must be at least 1"));
        }
        if total < base {
            return Err(invalid(
                "budget",
                format!("total {total} is below the {base} experts the per-layer floor of {floor} already keeps"),
            ));
        }
        if total > usable {
            return Err(invalid(
                "budget",
                format!("total {total} is above the {usable} experts with calibration hits in all layers"),
            ));
        }
        // The pool: every usable expert beyond its layer's floor, as (key, layer, position in the
        // layer's order). Keys never increase along a layer's order, and ties break by layer then
        // position, so the first `total - base` entries are a prefix of each layer's order: this
        // order does not depend on the total, hence nesting across totals.
        let mut pool: Vec<(f64, usize, usize)> = Vec::with_capacity(usable - base);
        for (l, (order, k)) in keys.iter().zip(&take).enumerate() {
            pool.extend(order.iter().enumerate().skip(*k).map(|(j, &key)| (key, l, j)));
        }
        pool.sort_by(|a, b| cmp_score(b.0, a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
        for &(_, l, _) in &pool[..total - base] {
            take[l] += 1;
        }
        let layers = prefixes(&orders, &take, e)?;
        let k = layers.iter().map(Vec::len).max().unwrap_or(0);
        Ok(KeepMap {
            metric: metric.as_str().to_string(),
            k: k as u32,
            num_experts: stats.meta.num_experts,
            layer_ids: stats.meta.layer_ids.clone(),
            layers,
            stats_sha256: stats.sha256(),
            short_layers,
            budget: Some(*budget),
            placement: None,
        })
    }

    /// The unpruned map: every layer keeps all E experts; metric `full`, K = E, no statistics hash.
    /// E must be <= 65536 (ids are u16); larger values are clamped to 65536 ids.
    pub fn full(num_experts: u32, layer_ids: Vec<u32>) -> KeepMap {
        let ids: Vec<u16> = (0..num_experts.min(u32::from(u16::MAX) + 1)).map(|x| x as u16).collect();
        KeepMap {
            metric: "full".to_string(),
            k: num_experts,
            num_experts,
            layers: vec![ids; layer_ids.len()],
            layer_ids,
            stats_sha256: String::new(),
            short_layers: Vec::new(),
            budget: None,
            placement: None,
        }
    }

    /// True for the unpruned map (metric `full`).
    pub fn is_full(&self) -> bool {
        self.metric == "full"
    }

    /// `full`, `metric@K` (for example `frequency@32`), or for a budget map `metric@budgetTOTAL`
    /// (for example `frequency@budget1536`), with `:SCALE` appended when the scale is not the
    /// metric's default (`shrink@budget1536:share`). The variant name used in sweeps and the file
    /// stem of `moe-offload keep` with several budgets.
    pub fn label(&self) -> String {
        if self.is_full() {
            return "full".to_string();
        }
        if let Some(p) = &self.placement {
            return match p.seed {
                Some(seed) if seed != DEFAULT_PLACEMENT_SEED => format!("{}@pins{}:seed{seed}", p.placement, p.total),
                _ => format!("{}@pins{}", p.placement, p.total),
            };
        }
        match &self.budget {
            None => format!("{}@{}", self.metric, self.k),
            Some(b) => {
                let default = self.metric.parse::<Metric>().ok().map(BudgetScale::default_for);
                if default == Some(b.scale) {
                    format!("{}@budget{}", self.metric, b.total)
                } else {
                    format!("{}@budget{}:{}", self.metric, b.total, b.scale)
                }
            }
        }
    }

    /// Experts kept over all layers (Σ_l K_l).
    pub fn total_kept(&self) -> usize {
        self.layers.iter().map(Vec::len).sum()
    }

    /// The metric, or `None` for `full` and for a placed pin map ([`KeepMap::placement`]).
    ///
    /// # Errors
    /// [`SaliencyError::UnknownMetric`] for a name that is neither `full` nor a metric.
    pub fn parsed_metric(&self) -> Result<Option<Metric>> {
        if self.is_full() || self.placement.is_some() { Ok(None) } else { self.metric.parse().map(Some) }
    }

    /// Kept flags of the layer at index `l`, `[E]` (`true` = kept). Panics if `l >= L`.
    pub fn kept_mask(&self, l: usize) -> Vec<bool> {
        let mut mask = vec![false; self.num_experts as usize];
        for &id in &self.layers[l] {
            if let Some(m) = mask.get_mut(usize::from(id)) {
                *m = true;
            }
        }
        mask
    }

    /// Checks the structure: a known metric (or `full`), 1 <= K <= E, one id list per layer id,
    /// ids `< E`, strictly ascending (so unique), K ids per layer except layers listed in
    /// `short_layers` (which must be layer ids of the map and have fewer than K), and for `full`
    /// all E ids. For a budget map instead: no budget on `full`, 1 <= floor <= E, Σ_l K_l = total,
    /// K = max_l K_l, K_l >= floor except short layers (which have fewer than floor).
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] or [`SaliencyError::Mismatch`] naming the layer id.
    pub fn validate(&self) -> Result<()> {
        if let Some(p) = &self.placement {
            return self.validate_placed(p);
        }
        self.parsed_metric()?;
        let (k, e) = (self.k as usize, self.num_experts as usize);
        if e == 0 {
            return Err(invalid("num_experts", "must be at least 1"));
        }
        if k == 0 || k > e {
            return Err(invalid("k", format!("K = {k} is not in 1..={e}")));
        }
        if self.is_full() && k != e {
            return Err(invalid("k", format!("the full map must have K = E = {e}, found {k}")));
        }
        if self.layers.len() != self.layer_ids.len() {
            return Err(mismatch("number of layers (layers vs layer_ids)", self.layer_ids.len(), self.layers.len()));
        }
        if let Some(b) = &self.budget {
            if self.is_full() {
                return Err(invalid("budget", "the full map has no budget"));
            }
            if b.floor == 0 || b.floor as usize > e {
                return Err(invalid("budget.floor", format!("{} is not in 1..={e}", b.floor)));
            }
            let total = self.total_kept();
            if total as u64 != b.total {
                return Err(mismatch("budget total (sum of kept experts over layers)", b.total, total));
            }
            let max = self.layers.iter().map(Vec::len).max().unwrap_or(0);
            if max != k {
                return Err(mismatch("k of a budget map (largest per-layer K)", max, k));
            }
        }
        for &s in &self.short_layers {
            if !self.layer_ids.contains(&s) {
                return Err(invalid("short_layers", format!("layer {s} is not a layer of the map")));
            }
        }
        for (ids, &layer_id) in self.layers.iter().zip(&self.layer_ids) {
            for (i, &id) in ids.iter().enumerate() {
                if usize::from(id) >= e {
                    return Err(invalid(format!("layer {layer_id}"), format!("expert id {id} is not below E = {e}")));
                }
                if i > 0 && ids[i - 1] >= id {
                    let reason = if ids[i - 1] == id { "is listed twice" } else { "is out of ascending order" };
                    return Err(invalid(format!("layer {layer_id}"), format!("expert id {id} {reason}")));
                }
            }
            let short = self.short_layers.contains(&layer_id);
            if let Some(b) = &self.budget {
                let floor = b.floor as usize;
                if (short && ids.len() >= floor) || (!short && ids.len() < floor) {
                    let expected =
                        if short { format!("fewer than {floor} (short layer)") } else { format!("at least {floor}") };
                    return Err(mismatch(format!("layer {layer_id} number of kept experts"), expected, ids.len()));
                }
                continue;
            }
            if (short && ids.len() >= k) || (!short && ids.len() != k) {
                let expected = if short { format!("fewer than {k} (short layer)") } else { k.to_string() };
                return Err(mismatch(format!("layer {layer_id} number of kept experts"), expected, ids.len()));
            }
        }
        Ok(())
    }

    /// [`KeepMap::validate`] for a placed pin map: metric = the placement's name, no budget or
    /// short layers, a seed for `random` only, ids `< E` strictly ascending, Σ_l |layer| = N,
    /// K = the largest layer (>= 1).
    fn validate_placed(&self, p: &PlacementRecord) -> Result<()> {
        let e = self.num_experts as usize;
        if self.metric != p.placement.as_str() {
            return Err(mismatch("metric of a placed pin map", p.placement.as_str(), &self.metric));
        }
        if self.budget.is_some() || !self.short_layers.is_empty() {
            return Err(invalid("placement", "a placed pin map has no budget and no short layers"));
        }
        if p.seed.is_some() != (p.placement == Placement::Random) {
            return Err(invalid("placement.seed", "the random placement records its seed, the others none"));
        }
        if e == 0 {
            return Err(invalid("num_experts", "must be at least 1"));
        }
        if self.layers.len() != self.layer_ids.len() {
            return Err(mismatch("number of layers (layers vs layer_ids)", self.layer_ids.len(), self.layers.len()));
        }
        for (ids, &layer_id) in self.layers.iter().zip(&self.layer_ids) {
            for (i, &id) in ids.iter().enumerate() {
                if usize::from(id) >= e {
                    return Err(invalid(format!("layer {layer_id}"), format!("expert id {id} is not below E = {e}")));
                }
                if i > 0 && ids[i - 1] >= id {
                    return Err(invalid(
                        format!("layer {layer_id}"),
                        format!("expert id {id} is repeated or out of order"),
                    ));
                }
            }
        }
        let total = self.total_kept();
        if total as u64 != p.total {
            return Err(mismatch("placement total (sum of pinned experts over layers)", p.total, total));
        }
        let max = self.layers.iter().map(Vec::len).max().unwrap_or(0);
        if max == 0 || max != self.k as usize {
            return Err(mismatch("k of a placed pin map (largest per-layer size, >= 1)", max, self.k));
        }
        Ok(())
    }

    /// Reads and validates a keep-map JSON file.
    ///
    /// # Errors
    /// [`SaliencyError::Io`], [`SaliencyError::Json`], [`SaliencyError::NotJson`] (a trace given
    /// as a keep map, say), or a validation error of [`KeepMap::validate`] inside
    /// [`SaliencyError::InFile`] (naming the file).
    pub fn read_json(path: impl AsRef<Path>) -> Result<KeepMap> {
        let map: KeepMap = jsonio::read(path.as_ref(), jsonio::Kind::KeepMap)?;
        map.validate().map_err(|e| e.in_file(path.as_ref()))?;
        Ok(map)
    }

    /// Validates, then writes the map as pretty JSON atomically (temporary file + rename).
    ///
    /// # Errors
    /// A validation error, [`SaliencyError::Io`] or [`SaliencyError::Json`].
    pub fn write_json(&self, path: impl AsRef<Path>) -> Result<()> {
        self.validate()?;
        jsonio::write_atomic(path.as_ref(), KEEP_MAP_KIND, self)
    }

    /// Validates, then returns the bytes [`KeepMap::write_json`] writes (for standard output).
    ///
    /// # Errors
    /// A validation error of [`KeepMap::validate`].
    pub fn to_json_bytes(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(jsonio::to_bytes(KEEP_MAP_KIND, self))
    }

    /// Errors unless the map's E and layer ids equal those of `stats`.
    pub(crate) fn check_shape(&self, stats: &Stats, what: &str) -> Result<()> {
        if self.num_experts != stats.meta.num_experts {
            return Err(mismatch(
                format!("{what}: num_experts of map {} (built for another model?)", self.label()),
                format!("{} (the statistics' or trace's)", stats.meta.num_experts),
                format!("{} (the map's)", self.num_experts),
            ));
        }
        if self.layer_ids != stats.meta.layer_ids {
            return Err(mismatch(
                format!("{what}: layer_ids of map {} (built for another model?)", self.label()),
                format!("{:?} (the statistics' or trace's)", stats.meta.layer_ids),
                format!("{:?} (the map's)", self.layer_ids),
            ));
        }
        Ok(())
    }
}
