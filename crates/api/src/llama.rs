//! llama.cpp flags from a plan document (`export llama-cpp`): which part of a cache plan or a
//! hybrid plan the flags place, read once here; the flags themselves are
//! [`sweep::plan::llama`]'s.

use saliency::KeepMap;
use serde_json::Value;
use sweep::plan::llama::{self, LlamaFlags};

use crate::{Error, Result, usage};

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
    pub fn of(v: &Value) -> Result<AnyPlan> {
        if v["kind"] != crate::kind::HYBRID_PLAN {
            return LlamaPlan::of(v).map(AnyPlan::Cache);
        }
        let layer_ids: Vec<u32> = field(&v["layer_ids"], "layer_ids is not a list of layer ids")?;
        let counts: Vec<usize> = field(&v["per_layer"]["counts"], "per_layer.counts is not a list of expert counts")?;
        if counts.len() != layer_ids.len() {
            usage!("per_layer.counts: {} counts for {} layers", counts.len(), layer_ids.len());
        }
        let moe_layers = field(&v["moe_layers"], "moe_layers is not a list of blocks")?;
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
    pub fn of(v: &Value) -> Result<LlamaPlan> {
        let chosen = &v["chosen"];
        let (Some(map), Some(caps)) = (chosen.get("keep_map"), chosen["plan"].get("caps")) else {
            usage!(
                "not a plan (from `moe-offload plan`): no chosen.keep_map and chosen.plan.caps, and not a hybrid plan \
                 (kind {})",
                crate::kind::HYBRID_PLAN
            );
        };
        let counts = |x: &Value, what: &str| -> Result<Vec<usize>> {
            field(x, &format!("{what} is not a list of expert counts"))
        };
        let chosen_map: KeepMap = field(map, "chosen.keep_map is not a keep map")?;
        let (map, hot, resident, pinned) = match v.get("pinned").filter(|p| !p.is_null()) {
            None => {
                let caps = counts(caps, "chosen.plan.caps")?;
                (chosen_map, caps.clone(), caps, false)
            }
            Some(p) => {
                let pins = counts(&p["plan"]["pin_counts"], "pinned.plan.pin_counts")?;
                let caps = counts(&p["plan"]["caps"], "pinned.plan.caps")?;
                let map = match p.get("keep_map") {
                    Some(m) => field(m, "pinned.keep_map is not a keep map")?,
                    None if p["plan"]["variant"] == chosen["variant"] => chosen_map,
                    None => usage!(
                        "pinned.plan.variant {} is not chosen.variant {} and the plan has no pinned.keep_map (an \
                         older moe-offload wrote it): run `moe-offload plan ... --pin-counts` again",
                        p["plan"]["variant"],
                        chosen["variant"]
                    ),
                };
                if caps.len() != pins.len() {
                    usage!("pinned.plan: {} pinned counts but {} caps", pins.len(), caps.len());
                }
                let resident: Vec<usize> = pins.iter().zip(&caps).map(|(p, c)| p + c).collect();
                (map, pins, resident, true)
            }
        };
        if hot.len() != map.layer_ids.len() {
            usage!("{} per-layer counts for a keep map of {} layers", hot.len(), map.layer_ids.len());
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

/// The llama.cpp flags of a plan: for a cache plan `-ot PATTERN=<device>` for its whole layers
/// then `--cpu-moe` ([`llama::whole_layer_flags`]; `device` CUDA0 when `None`), and when
/// `hot_counts` the `--moe-hot-count` list of unmerged llama.cpp patches, returned apart (stock
/// llama.cpp refuses the flag); for a hybrid plan `-ot PATTERN=CPU` for its CPU layers
/// ([`llama::cpu_layer_flags`]). `moe_layers` overrides a hybrid plan's own.
///
/// # Errors
/// [`Error::Sweep`] with [`sweep::SweepError::LlamaFlags`]; [`Error::Usage`] for ‹device› or
/// ‹unmerged_hot_count› with a hybrid plan.
pub fn flags(
    p: &AnyPlan,
    device: Option<&str>,
    moe_layers: Option<&[u32]>,
    hot_counts: bool,
) -> Result<(LlamaFlags, Option<String>)> {
    let typed = |e: llama::FlagsError| Error::Sweep(sweep::SweepError::LlamaFlags(e));
    match p {
        AnyPlan::Cache(c) => {
            let device = device.unwrap_or("CUDA0");
            let f = llama::whole_layer_flags(&c.layer_ids, &c.whole_layers(), device, moe_layers).map_err(typed)?;
            Ok((f, hot_counts.then(|| sweep::plan::hot_count_list(&c.layer_ids, &c.hot))))
        }
        AnyPlan::Hybrid { layer_ids, cpu, moe_layers: own } => {
            if hot_counts {
                usage!(
                    "‹unmerged_hot_count›: a hybrid plan's per-expert counts are its `unmerged_moe_hot_count`; its \
                     llama.cpp flags place whole layers"
                );
            }
            if device.is_some() {
                usage!("‹device›: a hybrid plan's flags name the CPU only; the other layers stay where -ngl puts them");
            }
            let f = llama::cpu_layer_flags(layer_ids, cpu, moe_layers.or(own.as_deref())).map_err(typed)?;
            Ok((f, None))
        }
    }
}

/// A field of a plan document, or a usage error saying what it is not.
fn field<T: serde::de::DeserializeOwned>(v: &Value, what: &str) -> Result<T> {
    serde_json::from_value(v.clone()).map_err(|_| Error::usage(what.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
            let (f, h) = flags(&AnyPlan::Cache(p.clone()), Some(dev), Some(&[1, 2]), hot).unwrap();
            h.map(|x| format!("--moe-hot-count\n{x}\n")).unwrap_or_default() + &f.lines()
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

    #[test]
    fn a_hybrid_plan_gives_its_cpu_layers() {
        let v = serde_json::json!({"kind": "moe-offload-hybrid-plan", "layer_ids": [1, 2, 3],
            "per_layer": {"counts": [0, 0, 64]}, "moe_layers": [1, 2, 3]});
        let p = AnyPlan::of(&v).unwrap();
        let (f, hot) = flags(&p, None, None, false).unwrap();
        assert_eq!((f.cpu_blocks.as_slice(), f.n_cpu_moe, hot), (&[1, 2][..], Some(3), None));
        assert!(flags(&p, Some("CUDA0"), None, false).unwrap_err().to_string().contains("device"));
        assert!(flags(&p, None, None, true).unwrap_err().to_string().contains("unmerged_hot_count"));
        // The plan's own moe_layers, overridden: block 0 has routed experts the trace lacks.
        let e = flags(&p, None, Some(&[0, 1, 2, 3]), false).unwrap_err();
        assert!(matches!(e, Error::Sweep(sweep::SweepError::LlamaFlags(llama::FlagsError::Untraced { .. }))), "{e}");
    }
}
