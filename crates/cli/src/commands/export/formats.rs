//! The bytes of each export, as the consuming tool reads them (`docs/report.md`, "Exports").
//! Pure functions of their inputs: deterministic, layers in file order.

use anyhow::{Context, Result, bail};
use saliency::{KeepMap, Metric, MetricConfig, Stats, metric_scores};
use sweep::plan::llama::{self, LlamaFlags};

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

/// What llama.cpp's flags are made of, read from a plan JSON of `moe-offload plan`.
///
/// Stock llama.cpp places experts by whole blocks only (`-ot`, `--cpu-moe`, `--n-cpu-moe`): a
/// block's experts are one tensor per projection. A cache plan's layers whose fast memory holds
/// every kept expert are kept whole in fast memory, every other expert on the CPU
/// ([`sweep::plan::llama::whole_layer_flags`]). Its per-layer hot counts (experts kept resident,
/// the layer's most used ones: a static hot set) are the `--moe-hot-count` of unmerged llama.cpp
/// patches (pull request "MoE expert stats persistence + per-layer hot-count", closed), written
/// only on request: a plan made with `--pin-counts` (SEMANTICS.md §9) gives its pinned counts, a
/// plan without pins its cache sizes (the same fast memory per layer, held as a hot set, whose
/// misses the plan did not compute).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LlamaPlan {
    /// The model's id of each traced layer.
    pub layer_ids: Vec<u32>,
    /// Hot counts per traced layer: pinned experts (a plan with pins), else the cache size.
    pub hot: Vec<usize>,
    /// Experts in fast memory per traced layer: pins + cache (a plan with pins), else the cache.
    pub resident: Vec<usize>,
    /// Experts the plan's keep map keeps per traced layer.
    pub kept: Vec<usize>,
    /// Whether `hot` are pinned counts.
    pub pinned: bool,
}

/// A plan of either kind, as `export llama-cpp` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AnyPlan {
    /// A cache plan (`moe-offload plan`).
    Cache(LlamaPlan),
    /// The per-layer part of a hybrid plan (`moe-offload plan --exec host`): the traced layers,
    /// those whose experts go to the CPU, and the `--moe-layers` the plan was made with.
    Hybrid {
        /// The model's id of each traced layer.
        layer_ids: Vec<u32>,
        /// The layers on the CPU (`per_layer.counts` 0).
        cpu: Vec<u32>,
        /// The model's MoE blocks given to `plan`, if any.
        moe_layers: Option<Vec<u32>>,
    },
}

impl AnyPlan {
    /// A hybrid plan (kind `moe-offload-hybrid-plan`: `layer_ids`, `per_layer.counts`) or a
    /// cache plan ([`LlamaPlan::of`]).
    ///
    /// # Errors
    /// A document that is neither, or whose lists do not fit its layers.
    pub fn of(v: &serde_json::Value) -> Result<AnyPlan> {
        if v["kind"] != crate::commands::json::HYBRID_PLAN {
            return LlamaPlan::of(v).map(AnyPlan::Cache);
        }
        let layer_ids: Vec<u32> =
            serde_json::from_value(v["layer_ids"].clone()).context("layer_ids is not a list of layer ids")?;
        let counts: Vec<usize> = serde_json::from_value(v["per_layer"]["counts"].clone())
            .context("per_layer.counts is not a list of expert counts")?;
        if counts.len() != layer_ids.len() {
            bail!("per_layer.counts: {} counts for {} layers", counts.len(), layer_ids.len());
        }
        let moe_layers = serde_json::from_value(v["moe_layers"].clone()).context("moe_layers is not a list")?;
        let cpu = layer_ids.iter().zip(&counts).filter(|(_, n)| **n == 0).map(|(&id, _)| id).collect();
        Ok(AnyPlan::Hybrid { layer_ids, cpu, moe_layers })
    }
}

impl LlamaPlan {
    /// The flags' inputs from a plan: its `pinned` part when present (`pinned.plan.pin_counts`,
    /// `pinned.plan.caps`, `pinned.keep_map`), else `chosen` (`chosen.plan.caps`,
    /// `chosen.keep_map`).
    ///
    /// # Errors
    /// A document that is not a plan, or whose lists do not fit its keep map.
    pub fn of(v: &serde_json::Value) -> Result<LlamaPlan> {
        let chosen = &v["chosen"];
        let (Some(map), Some(caps)) = (chosen.get("keep_map"), chosen["plan"].get("caps")) else {
            bail!(
                "not a plan (from `moe-offload plan`): no chosen.keep_map and chosen.plan.caps, and not a hybrid plan \
                 (kind {})",
                crate::commands::json::HYBRID_PLAN
            );
        };
        let counts = |x: &serde_json::Value, what: &str| -> Result<Vec<usize>> {
            serde_json::from_value(x.clone()).with_context(|| format!("{what} is not a list of expert counts"))
        };
        let chosen_map: KeepMap = serde_json::from_value(map.clone()).context("chosen.keep_map is not a keep map")?;
        let (map, hot, resident, pinned) = match v.get("pinned").filter(|p| !p.is_null()) {
            None => {
                let caps = counts(caps, "chosen.plan.caps")?;
                (chosen_map, caps.clone(), caps, false)
            }
            Some(p) => {
                let pins = counts(&p["plan"]["pin_counts"], "pinned.plan.pin_counts")?;
                let caps = counts(&p["plan"]["caps"], "pinned.plan.caps")?;
                let map = match p.get("keep_map") {
                    Some(m) => serde_json::from_value(m.clone()).context("pinned.keep_map is not a keep map")?,
                    None if p["plan"]["variant"] == chosen["variant"] => chosen_map,
                    None => bail!(
                        "pinned.plan.variant {} is not chosen.variant {} and the plan has no pinned.keep_map (an \
                         older moe-offload wrote it): run `moe-offload plan ... --pin-counts` again",
                        p["plan"]["variant"],
                        chosen["variant"]
                    ),
                };
                if caps.len() != pins.len() {
                    bail!("pinned.plan: {} pinned counts but {} caps", pins.len(), caps.len());
                }
                let resident: Vec<usize> = pins.iter().zip(&caps).map(|(p, c)| p + c).collect();
                (map, pins, resident, true)
            }
        };
        if hot.len() != map.layer_ids.len() {
            bail!("{} per-layer counts for a keep map of {} layers", hot.len(), map.layer_ids.len());
        }
        let kept = map.layers.iter().map(Vec::len).collect();
        Ok(LlamaPlan { layer_ids: map.layer_ids, hot, resident, kept, pinned })
    }

    /// The ids of the layers whose fast memory holds every kept expert (resident >= kept).
    pub fn whole_layers(&self) -> Vec<u32> {
        self.layer_ids
            .iter()
            .zip(self.resident.iter().zip(&self.kept))
            .filter(|(_, (r, k))| r >= k)
            .map(|(id, _)| *id)
            .collect()
    }
}

/// The llama.cpp flags of a plan, one argument per line: for a cache plan
/// `-ot PATTERN=<device>` for its whole layers then `--cpu-moe`
/// ([`sweep::plan::llama::whole_layer_flags`]), preceded when `hot_counts` by `--moe-hot-count`
/// and its list (unmerged llama.cpp patches only; stock llama.cpp refuses the flag); for a hybrid
/// plan `-ot PATTERN=CPU` for its CPU layers ([`sweep::plan::llama::cpu_layer_flags`]).
/// `moe_layers` overrides a hybrid plan's own.
///
/// # Errors
/// [`sweep::plan::llama::FlagsError`]; `hot_counts` with a hybrid plan.
pub fn llama_cpp_flags(
    p: &AnyPlan,
    device: &str,
    moe_layers: Option<&[u32]>,
    hot_counts: bool,
) -> Result<(LlamaFlags, Vec<String>)> {
    let spell = |e: llama::FlagsError| anyhow::anyhow!(crate::commands::plan::spell_moe_layers(&e));
    match p {
        AnyPlan::Cache(c) => {
            let f = llama::whole_layer_flags(&c.layer_ids, &c.whole_layers(), device, moe_layers).map_err(spell)?;
            let hot = if hot_counts {
                vec!["--moe-hot-count".into(), sweep::plan::hot_count_list(&c.layer_ids, &c.hot)]
            } else {
                Vec::new()
            };
            Ok((f, hot))
        }
        AnyPlan::Hybrid { layer_ids, cpu, moe_layers: own } => {
            if hot_counts {
                bail!(
                    "--unmerged-hot-count: a hybrid plan's per-expert counts are its `unmerged_moe_hot_count`; its \
                     llama.cpp flags place whole layers"
                );
            }
            let f = llama::cpu_layer_flags(layer_ids, cpu, moe_layers.or(own.as_deref())).map_err(spell)?;
            Ok((f, Vec::new()))
        }
    }
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

    /// A plan of 2 layers (ids 1, 2) of E = 4, the keep map keeping 3 and 4 experts.
    fn plan_json(pinned: Option<serde_json::Value>) -> serde_json::Value {
        let map = serde_json::json!({"metric": "frequency", "k": 4, "num_experts": 4, "layer_ids": [1, 2],
            "layers": [[0, 1, 2], [0, 1, 2, 3]], "stats_sha256": "", "short_layers": []});
        let mut v =
            serde_json::json!({"chosen": {"variant": "frequency@4", "keep_map": map, "plan": {"caps": [3, 2]}}});
        if let Some(p) = pinned {
            v["pinned"] = p;
        }
        v
    }

    #[test]
    fn llama_hot_counts_are_the_pins_of_a_pinned_plan_else_the_caches() {
        // No pins: the cache sizes; layer 1 (cap 3 of 3 kept) is whole.
        let p = LlamaPlan::of(&plan_json(None)).unwrap();
        assert_eq!(
            (p.hot.clone(), p.resident.clone(), p.kept.clone(), p.pinned),
            (vec![3, 2], vec![3, 2], vec![3, 4], false)
        );
        let flags = |p: &LlamaPlan, dev: &str, hot: bool| {
            let (f, h) = llama_cpp_flags(&AnyPlan::Cache(p.clone()), dev, Some(&[1, 2]), hot).unwrap();
            h.iter().map(|x| format!("{x}\n")).collect::<String>() + &f.lines()
        };
        let exps = llama::EXPS_REGEX;
        assert_eq!(flags(&p, "CUDA0", false), format!("-ot\nblk\\.(1){exps}=CUDA0\n--cpu-moe\n"));
        assert_eq!(
            flags(&p, "CUDA0", true),
            format!("--moe-hot-count\n0,3,2\n-ot\nblk\\.(1){exps}=CUDA0\n--cpu-moe\n")
        );
        // Pins 1 and 2 with caps 1 and 2: hot counts 1,2 (what `plan` prints); layer 2 holds
        // 2 + 2 = 4 of its 4 kept experts, layer 1 only 2 of 3.
        let pinned = serde_json::json!({"plan": {"variant": "frequency@4", "pin_counts": [1, 2], "caps": [1, 2]},
            "moe_hot_count": "1,2"});
        let p = LlamaPlan::of(&plan_json(Some(pinned.clone()))).unwrap();
        assert_eq!((p.hot.clone(), p.resident.clone(), p.pinned), (vec![1, 2], vec![2, 4], true));
        assert_eq!(flags(&p, "CPU", true), format!("--moe-hot-count\n0,1,2\n-ot\nblk\\.(2){exps}=CPU\n--cpu-moe\n"));
        // The pinned plan of another variant needs its own keep map.
        let mut other = pinned;
        other["plan"]["variant"] = "full".into();
        let err = LlamaPlan::of(&plan_json(Some(other.clone()))).unwrap_err().to_string();
        assert!(err.contains("no pinned.keep_map"), "{err}");
        other["keep_map"] = serde_json::json!({"metric": "full", "k": 4, "num_experts": 4, "layer_ids": [1, 2],
            "layers": [[0, 1, 2, 3], [0, 1, 2, 3]], "stats_sha256": "", "short_layers": []});
        let p = LlamaPlan::of(&plan_json(Some(other))).unwrap();
        assert_eq!((p.kept.clone(), p.whole_layers()), (vec![4, 4], vec![2]));
        // Not a plan, or lists that do not fit the map.
        assert!(LlamaPlan::of(&serde_json::json!({"k": 4})).unwrap_err().to_string().contains("not a plan"));
        let mut short = plan_json(None);
        short["chosen"]["plan"]["caps"] = serde_json::json!([3]);
        assert!(
            LlamaPlan::of(&short).unwrap_err().to_string().contains("1 per-layer counts for a keep map of 2 layers")
        );
    }
}
