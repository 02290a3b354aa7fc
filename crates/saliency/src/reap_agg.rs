//! Reader for per-(layer, expert) REAP aggregate files (`reap-agg-dsv4/core_agg.json` format).
//!
//! Format: `{corpus: {n, tok, freq: {layer: [E]}, reap: {layer: [E]}}}`, where `freq` is the number
//! of used slots routed to each expert (so a layer sums to k · tok) and `reap` is Σ g·‖o‖ over those
//! slots. The file has no top-k, gate sums, norm sums or sums of squares. Some corpora of the real
//! file hold bare `NaN` tokens (not JSON) in `reap` for experts with hits; see [`NonFiniteReap`].

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::invalid;
use crate::stats::{LayerStats, Stats, StatsMeta};
use crate::{Result, SaliencyError, jsonio};

/// What to do when a corpus's `reap` vector holds a non-finite value (`NaN`, `Infinity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NonFiniteReap {
    /// Drop the `reap` statistic of the whole corpus (`reap_sum = None`) and say so in
    /// [`StatsMeta::source`]: REAP-based metrics then fail with `MissingStatistic` instead of
    /// silently using a guessed value. Counts are kept.
    #[default]
    DropStatistic,
    /// Refuse the corpus with [`SaliencyError::Invalid`] naming the first offending layer and expert.
    Reject,
    /// Keep the corpus's `reap_sum`, with each non-finite entry stored as 0 and its expert listed in
    /// [`LayerStats::reap_missing`] (and the total in [`StatsMeta::source`]). Such statistics
    /// serve as held-out statistics: retention computes `reap_retention` over the experts whose
    /// REAP mass is known and reports the excluded slots; metrics reading `reap_sum` refuse them
    /// with [`SaliencyError::PartialStatistic`].
    MaskExperts,
}

impl NonFiniteReap {
    /// Every policy.
    pub const ALL: [NonFiniteReap; 3] =
        [NonFiniteReap::DropStatistic, NonFiniteReap::Reject, NonFiniteReap::MaskExperts];

    /// The policy's name on the command line: `drop`, `reject`, `mask`.
    pub fn as_str(self) -> &'static str {
        match self {
            NonFiniteReap::DropStatistic => "drop",
            NonFiniteReap::Reject => "reject",
            NonFiniteReap::MaskExperts => "mask",
        }
    }
}

impl std::str::FromStr for NonFiniteReap {
    type Err = SaliencyError;

    /// Parses `drop`, `reject` or `mask`.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] naming the valid spellings.
    fn from_str(s: &str) -> Result<NonFiniteReap> {
        NonFiniteReap::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| invalid("non-finite reap policy", format!("`{s}`; expected drop, reject or mask")))
    }
}

impl std::fmt::Display for NonFiniteReap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One corpus of a REAP aggregate file, as listed by [`Stats::reap_agg_summary`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReapAggCorpus {
    /// The corpus name (the top-level key).
    pub name: String,
    /// `tok`: tokens of the corpus (`None` when absent or not a whole number).
    pub tokens: Option<u64>,
    /// Layers of `freq`.
    pub layers: usize,
    /// Non-finite (`NaN`, `Infinity`) values in `reap`.
    pub non_finite_reap: usize,
}

/// Options of [`Stats::from_reap_agg_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReapAggOptions {
    /// k, the model's top-k (the file does not record it; 6 for the DeepSeek-V4 file).
    pub top_k: u32,
    /// Policy for non-finite `reap` values.
    pub non_finite_reap: NonFiniteReap,
}

impl Stats {
    /// Loads one corpus of a REAP aggregate file as statistics: `count` = `freq`, `reap_sum` =
    /// `reap`, `tokens` = `tok` for every layer, layer ids = the numeric layer keys ascending,
    /// E = the vector length; `gate_sum`, `ean_sum` and `reap_sumsq` are `None` (the file does not
    /// hold them; `shrink` therefore cannot be computed). `top_k` is the model's k, which the file
    /// lacks. Non-finite `reap` values drop the corpus's `reap_sum` (see [`NonFiniteReap`]).
    ///
    /// # Errors
    /// [`SaliencyError::Io`] / [`SaliencyError::Json`] for the file, [`SaliencyError::Invalid`]
    /// naming the corpus, layer and key when one is absent or malformed (non-integral or negative
    /// `freq`, vectors of different lengths, `freq` and `reap` with different layers), or when the
    /// result fails [`Stats::validate`].
    pub fn from_reap_agg(path: &Path, corpus: &str, top_k: u32) -> Result<Stats> {
        let opts = ReapAggOptions { top_k, non_finite_reap: NonFiniteReap::default() };
        Stats::from_reap_agg_with(path, corpus, &opts)
    }

    /// [`Stats::from_reap_agg`] with an explicit non-finite policy.
    ///
    /// # Errors
    /// As [`Stats::from_reap_agg`], plus [`SaliencyError::Invalid`] for a non-finite `reap` value
    /// under [`NonFiniteReap::Reject`].
    pub fn from_reap_agg_with(path: &Path, corpus: &str, opts: &ReapAggOptions) -> Result<Stats> {
        if opts.top_k == 0 {
            return Err(invalid("top_k", "must be at least 1"));
        }
        let bytes = jsonio::read_bytes(path)?;
        let sha = trace_io::sha256_hex(&bytes);
        let root = parse(path, &bytes)?;
        let key = |k: &str| format!("{}: corpus `{corpus}` key `{k}`", path.display());
        let c = root
            .get(corpus)
            .ok_or_else(|| {
                let names: Vec<&str> = root.keys().map(String::as_str).collect();
                invalid(
                    format!("{}: corpus `{corpus}`", path.display()),
                    format!("absent; the file has: {}", names.join(", ")),
                )
            })?
            .as_object()
            .ok_or_else(|| invalid(key(""), "not an object"))?;
        let field = |k: &str| c.get(k).ok_or_else(|| invalid(key(k), "absent"));
        let tok = as_count(field("tok")?).ok_or_else(|| invalid(key("tok"), "not a non-negative integer"))?;
        let freq = layer_map(field("freq")?, &key("freq"))?;
        let reap = layer_map(field("reap")?, &key("reap"))?;
        let layer_ids: Vec<u32> = freq.iter().map(|(id, _)| *id).collect();
        let reap_ids: Vec<u32> = reap.iter().map(|(id, _)| *id).collect();
        if layer_ids != reap_ids {
            return Err(invalid(
                key("reap"),
                format!("layers {reap_ids:?} differ from the layers of `freq` {layer_ids:?}"),
            ));
        }
        let e = freq.first().map_or(0, |(_, v)| v.len());
        let mut layers = Vec::with_capacity(freq.len());
        let mut non_finite: Vec<(u32, usize)> = Vec::new();
        for ((id, f), (_, r)) in freq.iter().zip(&reap) {
            for (name, v) in [("freq", f), ("reap", r)] {
                if v.len() != e {
                    return Err(invalid(
                        format!("{} layer {id}", key(name)),
                        format!("has {} values, expected {e}", v.len()),
                    ));
                }
            }
            let mut count = Vec::with_capacity(e);
            for (x, v) in f.iter().enumerate() {
                let n = as_count(v).ok_or_else(|| {
                    invalid(
                        format!("{} layer {id} expert {x}", key("freq")),
                        format!("{v} is not a non-negative integer"),
                    )
                })?;
                count.push(n);
            }
            let mut reap_sum = Vec::with_capacity(e);
            for (x, v) in r.iter().enumerate() {
                match v {
                    Value::Null => {
                        non_finite.push((*id, x));
                        reap_sum.push(0.0);
                    }
                    Value::Number(n) => reap_sum.push(n.as_f64().unwrap_or(f64::NAN)),
                    other => {
                        return Err(invalid(
                            format!("{} layer {id} expert {x}", key("reap")),
                            format!("{other} is not a number"),
                        ));
                    }
                }
            }
            layers.push(LayerStats {
                tokens: tok,
                count,
                gate_sum: None,
                ean_sum: None,
                reap_sum: Some(reap_sum),
                reap_sumsq: None,
                reap_missing: Vec::new(),
            });
        }
        let mut source = format!("reap-agg:{}#{corpus}", path.display());
        if let Some(&(id, x)) = non_finite.first() {
            match opts.non_finite_reap {
                NonFiniteReap::Reject => {
                    return Err(invalid(format!("{} layer {id} expert {x}", key("reap")), "not finite"));
                }
                NonFiniteReap::DropStatistic => {
                    for l in &mut layers {
                        l.reap_sum = None;
                    }
                    source.push_str(&format!(
                        " (reap_sum dropped: {} non-finite reap values, first at layer {id} expert {x})",
                        non_finite.len()
                    ));
                }
                NonFiniteReap::MaskExperts => {
                    let mut slots = 0u64;
                    for &(lid, x) in &non_finite {
                        // `freq` and `reap` share the layer order, so the position of the layer id
                        // in `layer_ids` indexes `layers`.
                        let Some(l) = layer_ids.iter().position(|&i| i == lid) else { continue };
                        let layer = &mut layers[l];
                        slots += layer.count[x];
                        layer.reap_missing.push(
                            u16::try_from(x)
                                .map_err(|_| invalid(key("reap"), format!("expert {x} does not fit u16")))?,
                        );
                    }
                    source.push_str(&format!(
                        " (reap_sum masked: {} non-finite reap values treated as missing per expert, {slots} slots, first at layer {id} expert {x})",
                        non_finite.len()
                    ));
                }
            }
        }
        let stats = Stats {
            meta: StatsMeta {
                model: String::new(),
                num_experts: u32::try_from(e)
                    .map_err(|_| invalid(key("freq"), format!("{e} experts per layer is too many")))?,
                top_k: opts.top_k,
                layer_ids,
                source,
                source_sha256: sha,
            },
            layers,
        };
        stats.validate()?;
        Ok(stats)
    }

    /// Every corpus of a REAP aggregate file, in file order, with its tokens, layers and number of
    /// non-finite `reap` values (parsed once).
    ///
    /// # Errors
    /// [`SaliencyError::Io`] / [`SaliencyError::Json`] for the file, [`SaliencyError::Invalid`]
    /// when the top level is not an object.
    pub fn reap_agg_summary(path: &Path) -> Result<Vec<ReapAggCorpus>> {
        let bytes = jsonio::read_bytes(path)?;
        let root = parse(path, &bytes)?;
        Ok(root
            .iter()
            .map(|(name, c)| {
                let layers = c.get("freq").and_then(Value::as_object).map_or(0, Map::len);
                let non_finite_reap = c
                    .get("reap")
                    .and_then(Value::as_object)
                    .map_or(0, |m| m.values().filter_map(Value::as_array).flatten().filter(|v| v.is_null()).count());
                ReapAggCorpus { name: name.clone(), tokens: c.get("tok").and_then(as_count), layers, non_finite_reap }
            })
            .collect())
    }

    /// The corpus names of a REAP aggregate file, in file order.
    ///
    /// # Errors
    /// [`SaliencyError::Io`] / [`SaliencyError::Json`] for the file, [`SaliencyError::Invalid`]
    /// when the top level is not an object.
    pub fn reap_agg_corpora(path: &Path) -> Result<Vec<String>> {
        let bytes = jsonio::read_bytes(path)?;
        Ok(parse(path, &bytes)?.keys().cloned().collect())
    }
}

/// Parses the file after turning bare `NaN`, `Infinity` and `-Infinity` tokens (outside strings)
/// into `null`, which the caller treats as non-finite.
fn parse(path: &Path, bytes: &[u8]) -> Result<Map<String, Value>> {
    let cleaned = replace_non_finite(bytes);
    let value: Value =
        serde_json::from_slice(&cleaned).map_err(|source| SaliencyError::Json { path: path.to_path_buf(), source })?;
    match value {
        Value::Object(m) => Ok(m),
        _ => Err(invalid(format!("{}", path.display()), "the top level is not an object of corpora")),
    }
}

fn replace_non_finite(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if b == b'"' {
            in_string = true;
        } else if let Some(len) = ["-Infinity", "Infinity", "NaN"]
            .iter()
            .find_map(|t| bytes[i..].starts_with(t.as_bytes()).then_some(t.len()))
        {
            out.extend_from_slice(b"null");
            i += len;
            continue;
        }
        out.push(b);
        i += 1;
    }
    out
}

fn as_count(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 9.007_199_254_740_992e15).then_some(f as u64)
}

/// `{layer: [values]}` as (layer id, values) sorted by id.
fn layer_map<'a>(v: &'a Value, key: &str) -> Result<Vec<(u32, &'a Vec<Value>)>> {
    let m = v.as_object().ok_or_else(|| invalid(key, "not an object of layers"))?;
    let mut out = Vec::with_capacity(m.len());
    for (k, v) in m {
        let id: u32 =
            k.parse().map_err(|_| invalid(format!("{key} layer `{k}`"), "the layer key is not an integer"))?;
        let arr = v.as_array().ok_or_else(|| invalid(format!("{key} layer {id}"), "not an array"))?;
        out.push((id, arr));
    }
    out.sort_by_key(|(id, _)| *id);
    if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(invalid(format!("{key} layer {}", w[0].0), "the layer appears twice"));
    }
    if out.is_empty() {
        return Err(invalid(key, "no layers"));
    }
    Ok(out)
}
