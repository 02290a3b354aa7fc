//! The bytes of each export, as the consuming tool reads them (`docs/report.md`, "Exports").
//! Pure functions of their inputs: deterministic, layers in file order.

use anyhow::{Result, bail};
use saliency::{KeepMap, Metric, MetricConfig, Stats, metric_scores};

/// Every expert of every layer, best first by `metric` (ties: lower id first); experts never
/// routed (no score) follow in ascending id. So the first K of a layer are exactly the experts
/// `moe-offload keep --metric <metric> --k K` keeps.
///
/// # Errors
/// The metric's error (a statistic it needs is missing).
pub fn saliency_order(stats: &Stats, metric: Metric, cfg: &MetricConfig) -> Result<Vec<Vec<u32>>> {
    let scores = metric_scores(stats, metric, cfg)?;
    Ok(stats
        .layers
        .iter()
        .zip(&scores)
        .map(|(layer, s)| {
            let (mut routed, never): (Vec<u32>, Vec<u32>) =
                (0..s.len() as u32).partition(|&e| layer.count[e as usize] > 0);
            routed.sort_by(|&a, &b| {
                let (x, y) = (s[a as usize], s[b as usize]);
                let ord = if x == y { std::cmp::Ordering::Equal } else { y.total_cmp(&x) };
                ord.then(a.cmp(&b))
            });
            routed.extend(never);
            routed
        })
        .collect())
}

/// vLLM-Ascend's `expert_list_file` (`--additional-config '{"expert_list_file": ...,
/// "expert_prune_ratio": r}'`): JSON Lines, one line per MoE layer, `{"<layer_id>": [every
/// expert id, most salient first]}`; vLLM-Ascend keeps the first (1 − r)·E of each line.
pub fn vllm_ascend(layer_ids: &[u32], order: &[Vec<u32>]) -> Vec<u8> {
    let mut out = Vec::new();
    for (id, experts) in layer_ids.iter().zip(order) {
        let line = serde_json::json!({ id.to_string(): experts });
        out.extend(serde_json::to_vec(&line).expect("a map of a list serializes"));
        out.push(b'\n');
    }
    out
}

/// The `expert_stats.json` that llama.cpp's `tools/moe-pruning/gguf_prune.py --stats` reads:
/// `{"<layer_id>": {"reap": [E], "importance_score": [E], "frequency": [E], "never_activated": n}}`.
/// `gguf_prune.py` keeps the `--keep_n` experts of highest `reap` (else `importance_score`) per
/// layer. `reap` = Σ g·‖o‖ / c (present when every layer has `reap_sum`), `importance_score` =
/// Σg (the gate-weighted frequency; the count c without gates), `frequency` = c; an expert never
/// routed scores 0 (the file is JSON numbers, never null).
///
/// # Errors
/// The metric's error (partial REAP statistics).
pub fn gguf_prune_stats(stats: &Stats) -> Result<Vec<u8>> {
    let cfg = MetricConfig::default();
    let has_reap = stats.layers.iter().all(|l| l.reap_sum.is_some());
    let has_gates = stats.layers.iter().all(|l| l.gate_sum.is_some());
    let finite = |v: Vec<Vec<f64>>| -> Vec<Vec<f64>> {
        v.into_iter().map(|l| l.into_iter().map(|x| if x.is_finite() { x } else { 0.0 }).collect()).collect()
    };
    let reap = if has_reap { Some(finite(metric_scores(stats, Metric::Reap, &cfg)?)) } else { None };
    let importance = finite(metric_scores(stats, if has_gates { Metric::GateSum } else { Metric::Frequency }, &cfg)?);
    let mut o = serde_json::Map::new();
    for (l, (id, layer)) in stats.meta.layer_ids.iter().zip(&stats.layers).enumerate() {
        let mut entry = serde_json::Map::new();
        if let Some(r) = &reap {
            entry.insert("reap".into(), r[l].clone().into());
        }
        entry.insert("importance_score".into(), importance[l].clone().into());
        entry.insert("frequency".into(), layer.count.clone().into());
        entry.insert("never_activated".into(), layer.count.iter().filter(|&&c| c == 0).count().into());
        o.insert(id.to_string(), entry.into());
    }
    let mut v = serde_json::to_vec_pretty(&o).expect("JSON values serialize");
    v.push(b'\n');
    Ok(v)
}

/// A generic keep-set JSON, the input of MTPLX's `qwen4_expert_keep` and similar pruners:
/// `{"kind": "moe-offload-keep-set", "k", "num_experts", "metric", "stats_sha256", "layers":
/// [{"layer", "keep"}]}` with `keep` ascending, `stats_sha256` null for the full map. One K for every layer (the runtime config carries one expert count).
///
/// # Errors
/// A map that keeps a different number of experts per layer (a budget map).
pub fn keep_set(map: &KeepMap, version: &str) -> Result<Vec<u8>> {
    if let Some((id, kept)) = map.layer_ids.iter().zip(&map.layers).find(|(_, l)| l.len() != map.k as usize) {
        bail!(
            "layer {id} keeps {} experts, not K = {}: a keep set has one K for every layer (make the map with --k, not --budget)",
            kept.len(),
            map.k
        );
    }
    let layers: Vec<serde_json::Value> = map
        .layer_ids
        .iter()
        .zip(&map.layers)
        .map(|(id, kept)| serde_json::json!({ "layer": id, "keep": kept }))
        .collect();
    let v = serde_json::json!({
        "kind": crate::commands::json::KEEP_SET,
        "k": map.k,
        "num_experts": map.num_experts,
        "metric": map.metric,
        // `null` for a map built from no statistics (`full`, which keeps every expert).
        "stats_sha256": (!map.stats_sha256.is_empty()).then_some(&map.stats_sha256),
        "moe_offload_version": version,
        "layers": layers,
    });
    let mut v = serde_json::to_vec_pretty(&v).expect("JSON values serialize");
    v.push(b'\n');
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use saliency::{KeepConfig, LayerStats, StatsMeta};

    /// Two layers (ids 1 and 3) of 4 experts; expert 3 of layer 1 is never routed.
    fn stats() -> Stats {
        let layer = |count: Vec<u64>, gate: Vec<f64>, reap: Vec<f64>| LayerStats {
            tokens: 10,
            count,
            gate_sum: Some(gate),
            ean_sum: None,
            reap_sumsq: Some(reap.iter().map(|r| r * r).collect()),
            reap_sum: Some(reap),
            reap_missing: vec![],
        };
        Stats {
            meta: StatsMeta {
                model: "m".into(),
                num_experts: 4,
                top_k: 2,
                layer_ids: vec![1, 3],
                source: "t".into(),
                source_digest: String::new(),
            },
            layers: vec![
                layer(vec![10, 6, 4, 0], vec![5.0, 3.0, 1.0, 0.0], vec![10.0, 12.0, 2.0, 0.0]),
                layer(vec![5, 5, 5, 5], vec![1.0, 4.0, 3.0, 2.0], vec![4.0, 8.0, 6.0, 1.0]),
            ],
        }
    }

    #[test]
    fn saliency_order_is_descending_with_never_routed_last() {
        let o = saliency_order(&stats(), Metric::Frequency, &MetricConfig::default()).unwrap();
        // layer 1: counts 10, 6, 4 then the never-routed expert 3; layer 3: all tie, ids ascending
        assert_eq!(o, vec![vec![0, 1, 2, 3], vec![0, 1, 2, 3]]);
        // reap = Σ g·‖o‖ / c: layer 1 = 1.0, 2.0, 0.5; layer 3 = 0.8, 1.6, 1.2, 0.2
        let o = saliency_order(&stats(), Metric::Reap, &MetricConfig::default()).unwrap();
        assert_eq!(o, vec![vec![1, 0, 2, 3], vec![1, 2, 0, 3]]);
    }

    #[test]
    fn vllm_ascend_lines_match_the_documented_example_shape() {
        // The pull request's example: `{"0":[106,65,113,...]}` one layer per line.
        let bytes = vllm_ascend(&[0, 1], &[vec![106, 65, 113], vec![86, 48, 18]]);
        assert_eq!(String::from_utf8(bytes).unwrap(), "{\"0\":[106,65,113]}\n{\"1\":[86,48,18]}\n");
    }

    /// Reads an `expert_list_file` as vLLM-Ascend does: each line one object of one layer id,
    /// keep the first `E - round(E * ratio)` experts.
    fn vllm_keep(file: &[u8], e: usize, ratio: f64) -> Vec<(u32, Vec<u16>)> {
        let keep_n = e - (e as f64 * ratio).round() as usize;
        std::str::from_utf8(file)
            .unwrap()
            .lines()
            .map(|line| {
                let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
                assert_eq!(v.len(), 1, "one layer per line");
                let (id, list) = v.into_iter().next().unwrap();
                let list: Vec<u16> = serde_json::from_value(list).unwrap();
                assert_eq!(list.len(), e, "a full ordered list");
                let mut kept = list[..keep_n].to_vec();
                kept.sort_unstable();
                (id.parse().unwrap(), kept)
            })
            .collect()
    }

    #[test]
    fn vllm_ascend_keeps_what_moe_offload_keep_keeps() {
        let s = stats();
        for metric in [Metric::Frequency, Metric::Reap, Metric::GateSum] {
            let order = saliency_order(&s, metric, &MetricConfig::default()).unwrap();
            let file = vllm_ascend(&s.meta.layer_ids, &order);
            let map = KeepMap::build(&s, metric, 2, &KeepConfig::default()).unwrap();
            let got = vllm_keep(&file, 4, 0.5);
            let want: Vec<(u32, Vec<u16>)> = s.meta.layer_ids.iter().copied().zip(map.layers.clone()).collect();
            assert_eq!(got, want, "{metric:?}");
        }
    }

    /// `gguf_prune.py`'s `pick_experts`: the `keep_n` highest of `reap` (else `importance_score`),
    /// sorted ascending (the test data has no ties, where numpy's argsort order is unspecified).
    fn gguf_pick(layer: &serde_json::Value, keep_n: usize) -> Vec<u16> {
        let scores: Vec<f64> =
            serde_json::from_value(layer.get("reap").or(layer.get("importance_score")).unwrap().clone()).unwrap();
        let mut idx: Vec<usize> = (0..scores.len()).collect();
        idx.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]));
        let mut kept: Vec<u16> = idx[idx.len() - keep_n..].iter().map(|&i| i as u16).collect();
        kept.sort_unstable();
        kept
    }

    #[test]
    fn gguf_prune_stats_pick_the_reap_keep_map() {
        let s = stats();
        let v: serde_json::Value = serde_json::from_slice(&gguf_prune_stats(&s).unwrap()).unwrap();
        // gguf_prune.py: `{int(k): v for k, v in json.load(f).items()}`
        let layers: Vec<u32> = v.as_object().unwrap().keys().map(|k| k.parse().unwrap()).collect();
        assert_eq!(layers, [1, 3]);
        assert_eq!(v["1"]["reap"], serde_json::json!([1.0, 2.0, 0.5, 0.0]));
        assert_eq!(v["1"]["importance_score"], serde_json::json!([5.0, 3.0, 1.0, 0.0]));
        assert_eq!(v["1"]["never_activated"], 1);
        assert_eq!(v["3"]["never_activated"], 0);
        let map = KeepMap::build(&s, Metric::Reap, 2, &KeepConfig::default()).unwrap();
        assert_eq!(gguf_pick(&v["1"], 2), map.layers[0]);
        assert_eq!(gguf_pick(&v["3"], 2), map.layers[1]);
        // Without output norms there is no reap: the pruner falls back to importance_score = Σg.
        let mut s = s;
        for l in &mut s.layers {
            (l.reap_sum, l.reap_sumsq) = (None, None);
        }
        let v: serde_json::Value = serde_json::from_slice(&gguf_prune_stats(&s).unwrap()).unwrap();
        assert!(v["3"].get("reap").is_none());
        let map = KeepMap::build(&s, Metric::GateSum, 2, &KeepConfig::default()).unwrap();
        assert_eq!(gguf_pick(&v["3"], 2), map.layers[1]);
    }

    #[test]
    fn keep_set_has_k_layers_and_keep() {
        let map = KeepMap::build(&stats(), Metric::Frequency, 2, &KeepConfig::default()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&keep_set(&map, "v").unwrap()).unwrap();
        assert_eq!(v["kind"], "moe-offload-keep-set");
        assert_eq!(v["k"], 2);
        assert_eq!(v["layers"], serde_json::json!([{"layer": 1, "keep": [0, 1]}, {"layer": 3, "keep": [0, 1]}]));
        // A consumer slices every layer to k experts: each keep list has exactly k distinct ids < E.
        for l in v["layers"].as_array().unwrap() {
            let keep: Vec<u32> = serde_json::from_value(l["keep"].clone()).unwrap();
            assert_eq!(keep.len() as u64, v["k"].as_u64().unwrap());
            assert!(keep.windows(2).all(|w| w[0] < w[1]) && keep.iter().all(|&e| e < 4));
        }
        assert_eq!(v["stats_sha256"], map.stats_sha256.as_str());
        // The full map (a plan's choice `full`) was built from no statistics: null, not "".
        let full: serde_json::Value =
            serde_json::from_slice(&keep_set(&KeepMap::full(4, vec![1, 3]), "v").unwrap()).unwrap();
        assert_eq!(full["stats_sha256"], serde_json::Value::Null);
        let mut m = map;
        m.layers[1] = vec![0, 1, 2];
        let err = keep_set(&m, "v").unwrap_err().to_string();
        assert!(err.contains("layer 3 keeps 3 experts, not K = 2"), "{err}");
    }
}
