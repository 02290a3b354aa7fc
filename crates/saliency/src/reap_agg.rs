//! Reader for per-(layer, expert) REAP aggregate files (`reap-agg-dsv4/core_agg.json` format and
//! its variants).
//!
//! Format: `{corpus: {n, tok, freq: {layer: [E]}, reap: {layer: [E]}}}`, where `freq` is the number
//! of used slots routed to each expert (so a layer sums to k · tok) and `reap` is Σ g·‖o‖ over those
//! slots. The file has no top-k, gate sums, norm sums or sums of squares. Some corpora of the real
//! file hold bare `NaN` tokens (not JSON) in `reap` for experts with hits; see [`NonFiniteReap`].
//!
//! Variants read the same way (docs/importers.md gives the schema):
//! - `tokens` instead of `tok` (both present: they must agree);
//! - `reap_mean` (per-token means, Σ g·‖o‖ / freq) instead of `reap` (sums): `reap_sum = reap_mean ×
//!   freq`; a mean that is not finite where `freq` is 0 (0/0) counts as 0. A corpus with both
//!   `reap` and `reap_mean` is refused naming both keys: means are never read as sums;
//! - no `reap` at all: counts only (`reap_sum = None`), nothing invented;
//! - no corpus wrapper: the top level itself holds `freq` (one unnamed corpus).

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
    /// The corpus name (the top-level key); empty for a file without the corpus wrapper.
    pub name: String,
    /// `tok` (or `tokens`): tokens of the corpus (`None` when absent or not a whole number).
    pub tokens: Option<u64>,
    /// Layers of `freq`.
    pub layers: usize,
    /// Non-finite (`NaN`, `Infinity`) values in `reap` (or `reap_mean`).
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
    /// `reap` (or `reap_mean × freq`; `None` when the corpus has neither), `tokens` = `tok` (or
    /// `tokens`) for every layer, layer ids = the numeric layer keys ascending, E = the vector
    /// length; `gate_sum`, `ean_sum` and `reap_sumsq` are `None` (the file does not hold them;
    /// `shrink` therefore cannot be computed). `top_k` is the model's k, which the file lacks.
    /// Non-finite `reap` values drop the corpus's `reap_sum` (see [`NonFiniteReap`]).
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
        Stats::from_reap_agg_corpus(path, Some(corpus), opts)
    }

    /// [`Stats::from_reap_agg_with`] for a file with or without the corpus wrapper: `corpus` names
    /// the corpus of a wrapped file, and must be `None` for a file whose top level holds `freq`
    /// itself.
    ///
    /// # Errors
    /// As [`Stats::from_reap_agg_with`], plus [`SaliencyError::Invalid`] for a wrapped file of
    /// several corpora without `corpus` (listing them; a file of one corpus reads that one), an
    /// unwrapped file with one, `tok` and `tokens` that
    /// disagree, or both `reap` and `reap_mean` in a corpus.
    pub fn from_reap_agg_corpus(path: &Path, corpus: Option<&str>, opts: &ReapAggOptions) -> Result<Stats> {
        if opts.top_k == 0 {
            return Err(invalid("top_k", "must be at least 1"));
        }
        let bytes = jsonio::read_bytes(path)?;
        let sha = trace_io::sha256_hex(&bytes);
        let root = parse(path, &bytes)?;
        let unwrapped = is_unwrapped(&root);
        // A wrapped file of one corpus needs no --corpus: that corpus is the only choice.
        let only = match (unwrapped, corpus, root.keys().next()) {
            (false, None, Some(name)) if root.len() == 1 => Some(name.as_str()),
            _ => None,
        };
        let corpus = corpus.or(only);
        let c = match (unwrapped, corpus) {
            (true, None) => &root,
            (true, Some(name)) => {
                return Err(invalid(
                    format!("{}: corpus `{name}`", path.display()),
                    "the file has no corpora (its top level holds `freq` itself): drop --corpus",
                ));
            }
            (false, None) => {
                let names: Vec<&str> = root.keys().map(String::as_str).collect();
                return Err(invalid(
                    format!("{}", path.display()),
                    format!("holds {} corpora; name one with --corpus: {}", names.len(), names.join(", ")),
                ));
            }
            (false, Some(name)) => root
                .get(name)
                .ok_or_else(|| {
                    let names: Vec<&str> = root.keys().map(String::as_str).collect();
                    invalid(
                        format!("{}: corpus `{name}`", path.display()),
                        format!("absent; the file has: {}", names.join(", ")),
                    )
                })?
                .as_object()
                .ok_or_else(|| invalid(format!("{}: corpus `{name}`", path.display()), "not an object"))?,
        };
        let corpus_words = corpus.map_or_else(|| "top level".to_string(), |n| format!("corpus `{n}`"));
        let key = |k: &str| format!("{}: {corpus_words} key `{k}`", path.display());
        let tok = corpus_tokens(c, &key)?;
        let freq = layer_map(
            c.get("freq").ok_or_else(|| invalid(key("freq"), "absent: the per-expert counts are needed"))?,
            &key("freq"),
        )?;
        let reap_kind = match (c.get("reap"), c.get("reap_mean")) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    key("reap"),
                    "and key `reap_mean` are both present: `reap` holds sums and `reap_mean` per-token means, and \
                     one file must say one thing; keep the one your tool wrote",
                ));
            }
            (Some(v), None) => Some((layer_map(v, &key("reap"))?, false)),
            (None, Some(v)) => Some((layer_map(v, &key("reap_mean"))?, true)),
            (None, None) => None,
        };
        let reap_name = if reap_kind.as_ref().is_some_and(|r| r.1) { "reap_mean" } else { "reap" };
        let layer_ids: Vec<u32> = freq.iter().map(|(id, _)| *id).collect();
        if let Some((reap, _)) = &reap_kind {
            let reap_ids: Vec<u32> = reap.iter().map(|(id, _)| *id).collect();
            if layer_ids != reap_ids {
                return Err(invalid(
                    key(reap_name),
                    format!("layers {reap_ids:?} differ from the layers of `freq` {layer_ids:?}"),
                ));
            }
        }
        let e = freq.first().map_or(0, |(_, v)| v.len());
        let mut layers = Vec::with_capacity(freq.len());
        let mut non_finite: Vec<(u32, usize)> = Vec::new();
        for (li, (id, f)) in freq.iter().enumerate() {
            let r = reap_kind.as_ref().map(|(r, _)| r[li].1);
            for (name, v) in [("freq", Some(*f)), (reap_name, r)] {
                if let Some(v) = v
                    && v.len() != e
                {
                    return Err(invalid(
                        format!("{} layer {id}", key(name)),
                        format!("has {} values, expected {e} (the length of the first layer of `freq`)", v.len()),
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
            let mut reap_sum = None;
            if let Some(r) = r {
                let means = reap_kind.as_ref().is_some_and(|k| k.1);
                let mut sums = Vec::with_capacity(e);
                for (x, v) in r.iter().enumerate() {
                    let value = match v {
                        Value::Null => None,
                        Value::Number(n) => n.as_f64().filter(|v| v.is_finite()),
                        other => {
                            return Err(invalid(
                                format!("{} layer {id} expert {x}", key(reap_name)),
                                format!("{other} is not a number"),
                            ));
                        }
                    };
                    match (value, means) {
                        // A mean over no tokens (0/0) is no information, not a missing value.
                        (None, true) if count[x] == 0 => sums.push(0.0),
                        (None, _) => {
                            non_finite.push((*id, x));
                            sums.push(0.0);
                        }
                        (Some(m), true) => sums.push(m * count[x] as f64),
                        (Some(v), false) => sums.push(v),
                    }
                }
                reap_sum = Some(sums);
            }
            layers.push(LayerStats {
                tokens: tok,
                count,
                gate_sum: None,
                ean_sum: None,
                reap_sum,
                reap_sumsq: None,
                reap_missing: Vec::new(),
            });
        }
        let mut source = match corpus {
            Some(c) => format!("reap-agg:{}#{c}", path.display()),
            None => format!("reap-agg:{}", path.display()),
        };
        match reap_kind.as_ref().map(|k| k.1) {
            None => source.push_str(" (counts only: the file has neither `reap` nor `reap_mean`)"),
            Some(true) => source.push_str(" (reap_sum = reap_mean x freq)"),
            Some(false) => {}
        }
        if let Some(&(id, x)) = non_finite.first() {
            match opts.non_finite_reap {
                NonFiniteReap::Reject => {
                    return Err(invalid(
                        format!("{} layer {id} expert {x}", key(reap_name)),
                        "not finite: pass --non-finite-reap drop or mask to load the corpus anyway",
                    ));
                }
                NonFiniteReap::DropStatistic => {
                    for l in &mut layers {
                        l.reap_sum = None;
                    }
                    source.push_str(&format!(
                        " (reap_sum dropped: {} non-finite {reap_name} values, first at layer {id} expert {x})",
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
                                .map_err(|_| invalid(key(reap_name), format!("expert {x} does not fit u16")))?,
                        );
                    }
                    source.push_str(&format!(
                        " (reap_sum masked: {} non-finite {reap_name} values treated as missing per expert, {slots} slots, first at layer {id} expert {x})",
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
                source_digest: sha,
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
        let summary = |name: &str, c: &Map<String, Value>| {
            let layers = c.get("freq").and_then(Value::as_object).map_or(0, Map::len);
            let non_finite_reap = c
                .get("reap")
                .or_else(|| c.get("reap_mean"))
                .and_then(Value::as_object)
                .map_or(0, |m| m.values().filter_map(Value::as_array).flatten().filter(|v| v.is_null()).count());
            let tokens = c.get("tok").or_else(|| c.get("tokens")).and_then(as_count);
            ReapAggCorpus { name: name.to_string(), tokens, layers, non_finite_reap }
        };
        if is_unwrapped(&root) {
            return Ok(vec![summary("", &root)]);
        }
        Ok(root.iter().map(|(name, c)| summary(name, c.as_object().unwrap_or(&Map::new()))).collect())
    }

    /// The corpus names of a REAP aggregate file, in file order (empty for a file without the
    /// corpus wrapper).
    ///
    /// # Errors
    /// [`SaliencyError::Io`] / [`SaliencyError::Json`] for the file, [`SaliencyError::Invalid`]
    /// when the top level is not an object.
    pub fn reap_agg_corpora(path: &Path) -> Result<Vec<String>> {
        let bytes = jsonio::read_bytes(path)?;
        let root = parse(path, &bytes)?;
        if is_unwrapped(&root) {
            return Ok(Vec::new());
        }
        Ok(root.keys().cloned().collect())
    }
}

/// True when the top level holds `freq` itself (no corpus wrapper).
fn is_unwrapped(root: &Map<String, Value>) -> bool {
    root.get("freq").is_some_and(Value::is_object)
}

/// The corpus's token count: `tok` or `tokens` (both present: they must agree).
fn corpus_tokens(c: &Map<String, Value>, key: &dyn Fn(&str) -> String) -> Result<u64> {
    let read = |k: &str| -> Result<Option<u64>> {
        c.get(k)
            .map(|v| as_count(v).ok_or_else(|| invalid(key(k), format!("{v} is not a non-negative integer"))))
            .transpose()
    };
    match (read("tok")?, read("tokens")?) {
        (Some(a), Some(b)) if a != b => {
            Err(invalid(key("tok"), format!("{a} disagrees with key `tokens` {b}: keep the right one")))
        }
        (Some(a), _) | (None, Some(a)) => Ok(a),
        (None, None) => Err(invalid(key("tok"), "absent, and no `tokens` either: the corpus's token count is needed")),
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
