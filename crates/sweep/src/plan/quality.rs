//! Measured quality as a floor of `moe-offload plan --quality`: the figures `python/eval_pruned.py`
//! writes for a keep map (docs/quality.md), joined to a plan's variants by the experts kept.

use saliency::KeepMap;

/// The measured quality of one keep map (one `moe-offload-quality` document).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Measured {
    /// Where it was read from.
    pub source: String,
    /// `keep_map.sha256` of the document (crate::keep_map_sha256 of the map measured).
    pub keep_sha256: String,
    /// The measured map's E.
    pub num_experts: u32,
    /// The measured map's layer ids.
    pub layer_ids: Vec<u32>,
    /// The measured map's kept experts per layer (ascending).
    pub layers: Vec<Vec<u16>>,
    /// `replace` or `drop` (docs/quality.md).
    pub mode: String,
    /// Mean KL(base ‖ pruned), nats per scored position.
    pub kl: f64,
    /// ppl_pruned / ppl_base − 1.
    pub ppl_increase: f64,
}

/// Quality floors over measured keep maps: a variant whose measured KL or perplexity increase
/// exceeds its limit is excluded, and with a limit set a pruned variant without a measurement is
/// excluded too (a floor nobody measured is not met).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QualityFloor {
    /// The measurements, at most one per keep map.
    pub measured: Vec<Measured>,
    /// Largest allowed mean KL.
    pub max_kl: Option<f64>,
    /// Largest allowed relative perplexity increase.
    pub max_ppl_increase: Option<f64>,
}

impl QualityFloor {
    /// The measurement of `map`, if any: the one that kept the same experts in the same layers.
    /// (Not by the keep map's digest: it covers the statistics' digest too, which differs between
    /// a map `moe-offload keep` wrote and the same map a plan builds from the trace.)
    pub fn of(&self, map: &KeepMap) -> Option<&Measured> {
        self.measured
            .iter()
            .find(|m| m.num_experts == map.num_experts && m.layer_ids == map.layer_ids && m.layers == map.layers)
    }

    /// Why `map` fails the floor (`None`: it passes). The full map always passes: it is the base.
    pub fn exclusion(&self, map: &KeepMap) -> Option<String> {
        if map.is_full() || (self.max_kl.is_none() && self.max_ppl_increase.is_none()) {
            return None;
        }
        let Some(m) = self.of(map) else {
            return Some("no measured quality (--quality) for this keep map".into());
        };
        if let Some(max) = self.max_kl.filter(|&max| m.kl > max) {
            return Some(format!("measured KL {} exceeds --max-kl {max} ({})", figure(m.kl), m.source));
        }
        if let Some(max) = self.max_ppl_increase.filter(|&max| m.ppl_increase > max) {
            return Some(format!(
                "measured perplexity increase {} exceeds --max-ppl-increase {max} ({})",
                figure(m.ppl_increase),
                m.source
            ));
        }
        None
    }
}

/// A measured figure for people: 4 decimals, or 4 significant digits in scientific notation when
/// 4 decimals would hide it (a KL of 1e-5 is not 0.0000).
pub fn figure(x: f64) -> String {
    if x != 0.0 && x.abs() < 1e-3 { format!("{x:.3e}") } else { format!("{x:.4}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(metric: &str, layers: Vec<Vec<u16>>) -> KeepMap {
        KeepMap {
            metric: metric.into(),
            k: layers[0].len() as u32,
            num_experts: 4,
            layer_ids: (0..layers.len() as u32).collect(),
            layers,
            stats_sha256: String::new(),
            short_layers: vec![],
            budget: None,
            placement: None,
        }
    }

    fn measured(m: &KeepMap, kl: f64, ppl_increase: f64) -> Measured {
        Measured {
            source: "q.json".into(),
            keep_sha256: crate::keep_map_sha256(m),
            num_experts: m.num_experts,
            layer_ids: m.layer_ids.clone(),
            layers: m.layers.clone(),
            mode: "replace".into(),
            kl,
            ppl_increase,
        }
    }

    #[test]
    fn floors_exclude_by_measured_kl_and_perplexity_and_unmeasured_maps() {
        let (a, b, c) =
            (map("frequency", vec![vec![0, 1]]), map("frequency", vec![vec![1, 2]]), map("gate_sum", vec![vec![0, 3]]));
        let full = map("full", vec![vec![0, 1, 2, 3]]);
        let mut f =
            QualityFloor { measured: vec![measured(&a, 0.02, 0.01), measured(&b, 0.2, 0.3)], ..Default::default() };
        assert_eq!(f.exclusion(&b), None, "no limit set: nothing excluded");
        f.max_kl = Some(0.1);
        assert_eq!(f.exclusion(&a), None);
        assert_eq!(f.exclusion(&b).unwrap(), "measured KL 0.2000 exceeds --max-kl 0.1 (q.json)");
        assert_eq!(f.exclusion(&c).unwrap(), "no measured quality (--quality) for this keep map");
        assert_eq!(f.exclusion(&full), None);
        f.max_kl = None;
        f.max_ppl_increase = Some(0.005);
        assert!(f.exclusion(&a).unwrap().starts_with("measured perplexity increase 0.0100 exceeds"));
        assert_eq!(f.of(&b).map(|m| m.kl), Some(0.2));
        assert_eq!(
            (figure(0.0), figure(9.198e-6), figure(-2e-5), figure(0.25)),
            ("0.0000".into(), "9.198e-6".into(), "-2.000e-5".into(), "0.2500".into())
        );
        // The same experts from other statistics: the same measurement.
        let b2 = KeepMap { stats_sha256: "other".into(), ..b.clone() };
        assert_eq!(f.of(&b2).map(|m| m.kl), Some(0.2));
    }
}
