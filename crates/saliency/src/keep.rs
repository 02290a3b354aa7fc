//! Keep maps: which experts of each layer survive pruning (SEMANTICS.md §3).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{invalid, mismatch};
use crate::metric::cmp_score;
use crate::{Metric, MetricConfig, Result, SaliencyError, Stats, jsonio, metric_scores};

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
    pub short_layers: Vec<u32>,
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
        let e = stats.num_experts();
        if k == 0 {
            return Err(invalid("k", "K must be at least 1"));
        }
        if k > e {
            return Err(SaliencyError::KTooLarge { k, num_experts: e });
        }
        let scores = metric_scores(stats, metric, &cfg.metric)?;
        let mut layers = Vec::with_capacity(stats.layers.len());
        let mut short_layers = Vec::new();
        for ((layer, s), &layer_id) in stats.layers.iter().zip(&scores).zip(&stats.meta.layer_ids) {
            let mut order: Vec<usize> = (0..e).filter(|&x| layer.count[x] > 0).collect();
            if order.len() < k {
                if !cfg.allow_short_layers {
                    return Err(SaliencyError::ShortLayer {
                        layer_id,
                        available: order.len(),
                        k,
                    });
                }
                short_layers.push(layer_id);
            }
            order.sort_by(|&a, &b| cmp_score(s[b], s[a]).then(a.cmp(&b)));
            order.truncate(k);
            order.sort_unstable();
            // E <= 65536 is not enforced by Stats; ids that do not fit u16 cannot be stored.
            let ids = order
                .into_iter()
                .map(|x| {
                    u16::try_from(x).map_err(|_| {
                        invalid("num_experts", format!("{e} experts do not fit u16 ids"))
                    })
                })
                .collect::<Result<Vec<u16>>>()?;
            layers.push(ids);
        }
        Ok(KeepMap {
            metric: metric.as_str().to_string(),
            k: k as u32,
            num_experts: stats.meta.num_experts,
            layer_ids: stats.meta.layer_ids.clone(),
            layers,
            stats_sha256: stats.sha256(),
            short_layers,
        })
    }

    /// The unpruned map: every layer keeps all E experts; metric `full`, K = E, no statistics hash.
    /// E must be <= 65536 (ids are u16); larger values are clamped to 65536 ids.
    pub fn full(num_experts: u32, layer_ids: Vec<u32>) -> KeepMap {
        let ids: Vec<u16> = (0..num_experts.min(u32::from(u16::MAX) + 1))
            .map(|x| x as u16)
            .collect();
        KeepMap {
            metric: "full".to_string(),
            k: num_experts,
            num_experts,
            layers: vec![ids; layer_ids.len()],
            layer_ids,
            stats_sha256: String::new(),
            short_layers: Vec::new(),
        }
    }

    /// True for the unpruned map (metric `full`).
    pub fn is_full(&self) -> bool {
        self.metric == "full"
    }

    /// `full`, or `metric@K` (for example `frequency@32`): the variant name used in sweeps.
    pub fn label(&self) -> String {
        if self.is_full() {
            "full".to_string()
        } else {
            format!("{}@{}", self.metric, self.k)
        }
    }

    /// The metric, or `None` for `full`.
    ///
    /// # Errors
    /// [`SaliencyError::UnknownMetric`] for a name that is neither `full` nor a metric.
    pub fn parsed_metric(&self) -> Result<Option<Metric>> {
        if self.is_full() {
            Ok(None)
        } else {
            self.metric.parse().map(Some)
        }
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
    /// all E ids.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] or [`SaliencyError::Mismatch`] naming the layer id.
    pub fn validate(&self) -> Result<()> {
        self.parsed_metric()?;
        let (k, e) = (self.k as usize, self.num_experts as usize);
        if e == 0 {
            return Err(invalid("num_experts", "must be at least 1"));
        }
        if k == 0 || k > e {
            return Err(invalid("k", format!("K = {k} is not in 1..={e}")));
        }
        if self.is_full() && k != e {
            return Err(invalid(
                "k",
                format!("the full map must have K = E = {e}, found {k}"),
            ));
        }
        if self.layers.len() != self.layer_ids.len() {
            return Err(mismatch(
                "number of layers (layers vs layer_ids)",
                self.layer_ids.len(),
                self.layers.len(),
            ));
        }
        for &s in &self.short_layers {
            if !self.layer_ids.contains(&s) {
                return Err(invalid(
                    "short_layers",
                    format!("layer {s} is not a layer of the map"),
                ));
            }
        }
        for (ids, &layer_id) in self.layers.iter().zip(&self.layer_ids) {
            for (i, &id) in ids.iter().enumerate() {
                if usize::from(id) >= e {
                    return Err(invalid(
                        format!("layer {layer_id}"),
                        format!("expert id {id} is not below E = {e}"),
                    ));
                }
                if i > 0 && ids[i - 1] >= id {
                    let reason = if ids[i - 1] == id {
                        "is listed twice"
                    } else {
                        "is out of ascending order"
                    };
                    return Err(invalid(
                        format!("layer {layer_id}"),
                        format!("expert id {id} {reason}"),
                    ));
                }
            }
            let short = self.short_layers.contains(&layer_id);
            if (short && ids.len() >= k) || (!short && ids.len() != k) {
                let expected = if short {
                    format!("fewer than {k} (short layer)")
                } else {
                    k.to_string()
                };
                return Err(mismatch(
                    format!("layer {layer_id} number of kept experts"),
                    expected,
                    ids.len(),
                ));
            }
        }
        Ok(())
    }

    /// Reads and validates a keep-map JSON file.
    ///
    /// # Errors
    /// [`SaliencyError::Io`], [`SaliencyError::Json`], or a validation error of [`KeepMap::validate`].
    pub fn read_json(path: impl AsRef<Path>) -> Result<KeepMap> {
        let map: KeepMap = jsonio::read(path.as_ref())?;
        map.validate()?;
        Ok(map)
    }

    /// Validates, then writes the map as pretty JSON atomically (temporary file + rename).
    ///
    /// # Errors
    /// A validation error, [`SaliencyError::Io`] or [`SaliencyError::Json`].
    pub fn write_json(&self, path: impl AsRef<Path>) -> Result<()> {
        self.validate()?;
        jsonio::write_atomic(path.as_ref(), self)
    }

    /// Errors unless the map's E and layer ids equal those of `stats`.
    pub(crate) fn check_shape(&self, stats: &Stats, what: &str) -> Result<()> {
        if self.num_experts != stats.meta.num_experts {
            return Err(mismatch(
                format!("{what}: num_experts of map {}", self.label()),
                stats.meta.num_experts,
                self.num_experts,
            ));
        }
        if self.layer_ids != stats.meta.layer_ids {
            return Err(mismatch(
                format!("{what}: layer_ids of map {}", self.label()),
                format!("{:?}", stats.meta.layer_ids),
                format!("{:?}", self.layer_ids),
            ));
        }
        Ok(())
    }
}
