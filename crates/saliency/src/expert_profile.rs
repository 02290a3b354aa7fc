//! llama.cpp's expert profile (`expert_stats.json` of the `llama-expert-profile` tool in the pull
//! request "MoE expert profiling and REAP-based pruning tools") as statistics.
//!
//! Format, as the tool writes it (one object per MoE layer, keyed by the layer index `il` of the
//! GGUF graph, ascending):
//! `{"<il>": {"total_tokens": T, "activation_counts": [E], "activation_frequency": [E],
//! "avg_gate_weight": [E], "ean_mean": [E], "reap": [E], "never_activated": n}, ...}`, where, per
//! expert, `activation_counts` = c (slots routed to it), `activation_frequency` = c / T,
//! `avg_gate_weight` = Σg / c, `ean_mean` = Σ‖o‖ / c and `reap` = Σ g·‖o‖ / c (0 where c = 0;
//! g is the gate weight the model applied, ‖o‖ the L2 norm of the expert's output before
//! weighting). E is the profiler's `--n-experts` (default 128), which may exceed the model's:
//! the extra experts count 0. The means are printed with 6 significant digits.
//!
//! Statistics: `count` = c, `tokens` = T, `gate_sum` = avg_gate_weight × c, `ean_sum` = ean_mean × c,
//! `reap_sum` = reap × c (each a sum recovered from a 6-digit mean: relative error up to 5e-6),
//! `reap_sumsq` = `None` (the file has no second moment, so `shrink` cannot be computed). k is
//! Σ c / T when that is the same whole number in every layer, else it must be given.

use std::path::Path;

use serde_json::{Map, Value};

use crate::counts::read::whole;
use crate::error::invalid;
use crate::stats::{LayerStats, Stats, StatsMeta};
use crate::{Result, jsonio};

/// Options of [`Stats::from_llama_expert_stats`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpertStatsOptions {
    /// k; default Σ count / total_tokens (the same whole number in every layer). Given, it must
    /// agree with the counts.
    pub top_k: Option<u32>,
    /// The model's layer ids, in place of the file's layer indices.
    pub layer_ids: Option<Vec<u32>>,
    /// The model's E, when the profiler ran with a larger `--n-experts`: the experts from E on
    /// must count 0, and are cut.
    pub num_experts: Option<u32>,
}

/// True when `value` looks like an `expert_stats.json`: an object whose first value is an object
/// holding `activation_counts`.
pub(crate) fn is_llama_expert_stats(value: &Value) -> bool {
    value
        .as_object()
        .and_then(|m| m.values().next())
        .and_then(Value::as_object)
        .is_some_and(|l| l.contains_key("activation_counts"))
}

impl Stats {
    /// Reads llama.cpp's `expert_stats.json` (see the module documentation for the format and the
    /// statistics it gives).
    ///
    /// # Errors
    /// [`crate::SaliencyError::Io`] / [`crate::SaliencyError::Json`] for the file;
    /// [`crate::SaliencyError::Invalid`] naming the file, layer key and field for a layer that is
    /// not an object, an absent or malformed field, vectors of different lengths, a count that is
    /// not a whole number, a mean that is negative or not finite, experts beyond `num_experts`
    /// that were routed to, a top-k the counts contradict or that cannot be inferred, or bad
    /// `layer_ids`; [`crate::SaliencyError::CountAboveTokens`] for an expert counted more often
    /// than its layer's `total_tokens`; a validation error of [`Stats::validate`].
    pub fn from_llama_expert_stats(path: &Path, opts: &ExpertStatsOptions) -> Result<Stats> {
        let bytes = jsonio::read_bytes(path)?;
        let value: Value = serde_json::from_slice(&bytes)
            .map_err(|source| crate::SaliencyError::Json { path: path.to_path_buf(), source })?;
        Stats::from_llama_expert_stats_value(path, &bytes, &value, opts)
    }

    /// [`Stats::from_llama_expert_stats`] on a file already read and parsed.
    pub(crate) fn from_llama_expert_stats_value(
        path: &Path,
        bytes: &[u8],
        value: &Value,
        opts: &ExpertStatsOptions,
    ) -> Result<Stats> {
        let file = path.display().to_string();
        let root = value.as_object().ok_or_else(|| invalid(&file, "the top level is not an object of layers"))?;
        let mut layers: Vec<(u32, LayerStats, String)> = Vec::with_capacity(root.len());
        for (key, v) in root {
            let at = |f: &str| format!("{file}: layer `{key}` field `{f}`");
            let id: u32 = key.trim().parse().map_err(|_| {
                invalid(
                    format!("{file}: key `{key}`"),
                    "is not a layer index: expert_stats.json keys its layers by number",
                )
            })?;
            let l = v.as_object().ok_or_else(|| invalid(format!("{file}: layer `{key}`"), "is not an object"))?;
            let tokens = l
                .get("total_tokens")
                .and_then(whole)
                .ok_or_else(|| invalid(at("total_tokens"), "absent or not a whole number >= 0"))?;
            let count: Vec<u64> = array(l, "activation_counts", &at)?
                .iter()
                .enumerate()
                .map(|(x, c)| {
                    whole(c).ok_or_else(|| {
                        invalid(
                            format!("{} expert {x}", at("activation_counts")),
                            format!("{c} is not a whole number >= 0"),
                        )
                    })
                })
                .collect::<Result<_>>()?;
            let sum = |name: &str| -> Result<Vec<f64>> {
                let means = array(l, name, &at)?;
                if means.len() != count.len() {
                    return Err(invalid(
                        at(name),
                        format!("has {} values, activation_counts has {}", means.len(), count.len()),
                    ));
                }
                means
                    .iter()
                    .zip(&count)
                    .enumerate()
                    .map(|(x, (m, &c))| match m.as_f64() {
                        Some(m) if m.is_finite() && m >= 0.0 => Ok(if c == 0 { 0.0 } else { m * c as f64 }),
                        _ => Err(invalid(format!("{} expert {x}", at(name)), format!("{m} is not a finite mean >= 0"))),
                    })
                    .collect()
            };
            let stats = LayerStats {
                tokens,
                gate_sum: Some(sum("avg_gate_weight")?),
                ean_sum: Some(sum("ean_mean")?),
                reap_sum: Some(sum("reap")?),
                reap_sumsq: None,
                reap_missing: Vec::new(),
                count,
            };
            layers.push((id, stats, format!("layer `{key}`")));
        }
        layers.sort_by_key(|(id, _, _)| *id);
        if let Some(w) = layers.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(invalid(format!("{file}: {}", w[1].2), format!("layer {} again (also {})", w[1].0, w[0].2)));
        }
        let Some(first) = layers.first() else {
            return Err(invalid(&file, "holds no layer"));
        };
        let e_file = first.1.count.len();
        if let Some((_, l, what)) = layers.iter().find(|(_, l, _)| l.count.len() != e_file) {
            return Err(invalid(
                format!("{file}: {what}"),
                format!("has {} experts, {} has {e_file}", l.count.len(), first.2),
            ));
        }
        let e = match opts.num_experts {
            Some(n) if n as usize > e_file => {
                return Err(invalid(
                    "--num-experts",
                    format!("{n} is more than the {e_file} experts per layer of {file}"),
                ));
            }
            Some(n) => n as usize,
            None => e_file,
        };
        for (id, l, _) in &mut layers {
            if let Some(x) = (e..e_file).find(|&x| l.count[x] > 0) {
                return Err(invalid(
                    format!("{file}: layer `{id}` expert {x}"),
                    format!("routed to {} times, but --num-experts is {e}: raise --num-experts", l.count[x]),
                ));
            }
            l.count.truncate(e);
            for s in [&mut l.gate_sum, &mut l.ean_sum, &mut l.reap_sum].into_iter().flatten() {
                s.truncate(e);
            }
        }
        let raw = crate::counts::RawCounts {
            layers: layers.iter().map(|(id, l, _)| (*id, l.count.clone())).collect(),
            top_k: None,
            note: None,
        };
        let ids = crate::counts::layer_ids(path, &raw, opts.layer_ids.as_deref())?;
        for ((_, l, _), &id) in layers.iter().zip(&ids) {
            crate::counts::counts_within_tokens(path, id, &l.count, l.tokens, || "its total_tokens".into())?;
        }
        let mut stats = Stats {
            meta: StatsMeta {
                model: String::new(),
                num_experts: u32::try_from(e)
                    .map_err(|_| invalid("num_experts", format!("{e} experts is too many")))?,
                top_k: 1,
                layer_ids: ids,
                source: format!("llama-expert-stats:{file} (sums = 6-digit means x activation_counts)"),
                source_digest: trace_io::sha256_hex(bytes),
            },
            layers: layers.into_iter().map(|(_, l, _)| l).collect(),
        };
        let inferred = stats.infer_top_k();
        stats.meta.top_k = match (opts.top_k, inferred) {
            (Some(k), Some(i)) if k != i => {
                return Err(invalid(
                    "--top-k",
                    format!(
                        "{k} disagrees with {file}: its counts sum to {i} x total_tokens in every layer \
                         (SEMANTICS.md §8.1); omit --top-k or pass {i}"
                    ),
                ));
            }
            (Some(k), _) => k,
            (None, Some(i)) => i,
            (None, None) => {
                return Err(invalid(
                    &file,
                    "cannot infer top-k: the sum of activation_counts / total_tokens differs between layers or is not \
                     whole (the profiler drops experts beyond its --n-experts); pass --top-k",
                ));
            }
        };
        stats.validate().map_err(|e| e.in_file(path))?;
        Ok(stats)
    }
}

fn array<'a>(l: &'a Map<String, Value>, name: &str, at: &dyn Fn(&str) -> String) -> Result<&'a Vec<Value>> {
    l.get(name)
        .and_then(Value::as_array)
        .ok_or_else(|| invalid(at(name), "absent or not an array of per-expert values"))
}
