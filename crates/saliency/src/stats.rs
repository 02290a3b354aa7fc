//! Per-(layer, expert) saliency statistics (SEMANTICS.md §2) and their JSON file.

use std::path::Path;

use serde::{Deserialize, Serialize};
use trace_io::TraceView;

use crate::error::{invalid, mismatch};
use crate::{Result, jsonio};

/// The `kind` tag of a statistics file (its first field, [`Stats::write_json`]); ignored when
/// reading, so files written before the tag read alike.
pub const STATS_KIND: &str = "moe-offload-stats";

/// Provenance and shape of a statistics file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatsMeta {
    /// Free-form model name.
    pub model: String,
    /// E: routed experts per layer; every per-expert vector has this length.
    pub num_experts: u32,
    /// k: experts the model used per token (the slots the statistics are summed over).
    pub top_k: u32,
    /// The model's id of each layer, one per entry of [`Stats::layers`].
    pub layer_ids: Vec<u32>,
    /// Where the statistics came from (trace path, or aggregate file and corpus, plus any note on
    /// what was dropped when loading).
    pub source: String,
    /// Digest of the source file's bytes as recorded (`trace_io::split_digest`): `blake3:HEX`
    /// for a trace (`trace_io::trace_digest`), a bare hex SHA-256 in older files and for REAP
    /// aggregates; empty when unknown ([`StatsMeta::digest`] reads it). Files written before the
    /// rename name it `source_sha256`, read as an alias; [`Stats::sha256`] hashes it under that
    /// older key, so the rename changed no recorded digest.
    #[serde(alias = "source_sha256")]
    pub source_digest: String,
}

impl StatsMeta {
    /// [`StatsMeta::source_digest`] named by its algorithm, `None` when it is empty (unknown).
    pub fn digest(&self) -> Option<trace_io::Digest> {
        (!self.source_digest.is_empty()).then(|| trace_io::Digest::parse(&self.source_digest))
    }
}

/// The key [`StatsMeta::source_digest`] had in files before the rename, and still has in the
/// form [`Stats::sha256`] hashes.
const LEGACY_DIGEST_KEY: &str = "source_sha256";

/// Statistics of one layer: per expert e (vectors of length E), summed over the k used slots of
/// every token (SEMANTICS.md §2). Optional statistics are `None` when the source did not record
/// what they need.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LayerStats {
    /// Tokens the layer saw (T).
    pub tokens: u64,
    /// c: used slots routed to each expert.
    pub count: Vec<u64>,
    /// Σg: sum of the gate weights applied to each expert (needs gates).
    pub gate_sum: Option<Vec<f64>>,
    /// Σ‖o‖: sum of each expert's output L2 norms (needs output norms).
    pub ean_sum: Option<Vec<f64>>,
    /// Σ g·‖o‖: REAP mass (needs gates and output norms).
    pub reap_sum: Option<Vec<f64>>,
    /// Σ (g·‖o‖)²: for the REAP standard error (needs gates and output norms).
    pub reap_sumsq: Option<Vec<f64>>,
    /// Experts whose `reap_sum` is unknown (strictly ascending ids, `< E`; their `reap_sum` entry
    /// is stored as 0). Empty for statistics from a trace; a REAP aggregate file loaded with
    /// [`crate::NonFiniteReap::MaskExperts`] lists here the experts whose `reap` was `NaN`.
    /// Metrics reading `reap_sum` refuse statistics with missing entries
    /// ([`crate::SaliencyError::PartialStatistic`]); retention leaves them out of
    /// `reap_retention` and reports how many slots that excluded (SEMANTICS.md §4). Omitted from
    /// the JSON file when empty, so files and hashes of complete statistics are unchanged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reap_missing: Vec<u16>,
}

/// Saliency statistics of every layer: the input of metrics, keep maps and retention.
/// Serialized as the JSON statistics file ([`Stats::read_json`], [`Stats::write_json`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Provenance and shape.
    pub meta: StatsMeta,
    /// One entry per layer, in the order of `meta.layer_ids`.
    pub layers: Vec<LayerStats>,
}

/// Accessor of one optional statistic.
pub(crate) type StatGetter = fn(&LayerStats) -> Option<&Vec<f64>>;

/// Names and accessors of the optional statistics, for validation and error messages.
pub(crate) const OPTIONAL_STATS: [(&str, StatGetter); 4] = [
    ("gate_sum", |l| l.gate_sum.as_ref()),
    ("ean_sum", |l| l.ean_sum.as_ref()),
    ("reap_sum", |l| l.reap_sum.as_ref()),
    ("reap_sumsq", |l| l.reap_sumsq.as_ref()),
];

impl Stats {
    /// Accumulates the statistics of a trace over the first k = `top_k` slots of every
    /// (layer, token) row, in f64: `count` always; `gate_sum` when the trace has gates; `ean_sum`
    /// when it has output norms; `reap_sum` = Σ g·‖o‖ and `reap_sumsq` = Σ (g·‖o‖)² when it has
    /// both. `tokens` = T for every layer (SEMANTICS.md §2).
    ///
    /// `source` and `source_digest` are recorded as given (typically the trace path and
    /// `trace_io::trace_digest` of it). The view must be validated for what this reads
    /// (`trace_io::Reads::stats`: the first k ids, gates, norms; the caller checks with
    /// `TraceView::require`), so this cannot fail.
    pub fn from_trace(trace: &TraceView<'_>, source: String, source_digest: String) -> Stats {
        let shape = trace.shape();
        let meta = trace.meta();
        let (e, k, m) = (shape.num_experts, shape.top_k, shape.candidates);
        let mut layers = Vec::with_capacity(shape.layers);
        for l in 0..shape.layers {
            let ids = trace.layer_ids(l);
            let gates = trace.layer_gates(l);
            let norms = trace.layer_out_norms(l);
            let mut count = vec![0u64; e];
            let mut gate_sum = gates.map(|_| vec![0f64; e]);
            let mut ean_sum = norms.map(|_| vec![0f64; e]);
            let both = gates.is_some() && norms.is_some();
            let mut reap_sum = both.then(|| vec![0f64; e]);
            let mut reap_sumsq = both.then(|| vec![0f64; e]);
            for t in 0..shape.tokens {
                let row = &ids[t * m..t * m + k];
                for (slot, &id) in row.iter().enumerate() {
                    let id = usize::from(id);
                    let i = t * k + slot;
                    count[id] += 1;
                    let g = gates.map(|g| f64::from(g[i]));
                    let o = norms.map(|o| f64::from(o[i]));
                    if let (Some(s), Some(g)) = (gate_sum.as_mut(), g) {
                        s[id] += g;
                    }
                    if let (Some(s), Some(o)) = (ean_sum.as_mut(), o) {
                        s[id] += o;
                    }
                    if let (Some(s), Some(sq), Some(g), Some(o)) = (reap_sum.as_mut(), reap_sumsq.as_mut(), g, o) {
                        let r = g * o;
                        s[id] += r;
                        sq[id] += r * r;
                    }
                }
            }
            layers.push(LayerStats {
                tokens: shape.tokens as u64,
                count,
                gate_sum,
                ean_sum,
                reap_sum,
                reap_sumsq,
                reap_missing: Vec::new(),
            });
        }
        Stats {
            meta: StatsMeta {
                model: meta.model.clone(),
                num_experts: meta.num_experts,
                top_k: meta.top_k,
                layer_ids: meta.layer_ids.clone(),
                source,
                source_digest,
            },
            layers,
        }
    }

    /// E as a `usize`.
    pub fn num_experts(&self) -> usize {
        self.meta.num_experts as usize
    }

    /// Hex SHA-256 of the canonical JSON of the statistics: `serde_json::to_vec(self)`, compact,
    /// fields in declaration order, with `meta.source_digest` under its older key `source_sha256`
    /// (in its place), so that statistics hash as they did before the rename. Keep maps record
    /// it to tie themselves to their statistics.
    pub fn sha256(&self) -> String {
        trace_io::sha256_hex(&self.canonical_bytes())
    }

    /// The bytes [`Stats::sha256`] hashes.
    fn canonical_bytes(&self) -> Vec<u8> {
        // Serializing plain structs of integers, finite floats and strings cannot fail; a non-finite
        // float serializes as `null`, which still hashes deterministically. serde_json keeps the
        // declaration order of fields (feature `preserve_order`), so the value writes the same
        // bytes as the struct.
        let mut value = serde_json::to_value(self).unwrap_or_default();
        if let Some(meta) = value.get_mut("meta").and_then(serde_json::Value::as_object_mut) {
            let renamed = std::mem::take(meta)
                .into_iter()
                .map(|(k, v)| if k == "source_digest" { (LEGACY_DIGEST_KEY.to_string(), v) } else { (k, v) })
                .collect();
            *meta = renamed;
        }
        serde_json::to_vec(&value).unwrap_or_default()
    }

    /// Checks the structure and content: 1 <= E <= 65536, 1 <= k <= E, one layer per layer id, every per-expert vector
    /// of length E, each optional statistic present in all layers or in none, every value finite
    /// and >= 0, every sum 0 where the count is 0, and `reap_missing` (when not empty) strictly
    /// ascending ids `< E` of a layer that has `reap_sum`, each with `reap_sum` 0.
    ///
    /// # Errors
    /// [`crate::SaliencyError::Mismatch`] for a shape disagreement and
    /// [`crate::SaliencyError::Invalid`] for bad content; both name the layer id (and expert).
    pub fn validate(&self) -> Result<()> {
        let e = self.num_experts();
        if e == 0 || e > 1 << 16 {
            return Err(invalid("num_experts", format!("{e} is not in 1..=65536 (expert ids are u16)")));
        }
        if self.meta.top_k == 0 {
            return Err(invalid("top_k", "must be at least 1"));
        }
        if self.meta.top_k as usize > e {
            return Err(invalid(
                "top_k",
                format!("{} is more than the {e} experts: top-k routing chooses k distinct experts", self.meta.top_k),
            ));
        }
        if self.layers.len() != self.meta.layer_ids.len() {
            return Err(mismatch(
                "number of layers (layers vs meta.layer_ids)",
                self.meta.layer_ids.len(),
                self.layers.len(),
            ));
        }
        for (layer, &id) in self.layers.iter().zip(&self.meta.layer_ids) {
            if layer.count.len() != e {
                return Err(mismatch(format!("layer {id} count length"), e, layer.count.len()));
            }
            // Top-k routing chooses an expert at most once per token. (The sum of the counts is
            // not checked against tokens x top_k: a REAP aggregate's top-k is inferred from it.)
            if let Some((x, &c)) = layer.count.iter().enumerate().find(|&(_, &c)| c > layer.tokens) {
                return Err(invalid(
                    format!("layer {id} count[{x}]"),
                    format!(
                        "{c} is more than the layer's tokens = {}: top-k routing chooses an expert at most once per \
                         token; check the layer's `tokens`",
                        layer.tokens
                    ),
                ));
            }
            for (name, get) in OPTIONAL_STATS {
                let first_has = self.layers.first().and_then(get).is_some();
                let Some(v) = get(layer) else {
                    if first_has {
                        return Err(invalid(
                            format!("layer {id} {name}"),
                            "absent here but present in the first layer",
                        ));
                    }
                    continue;
                };
                if !first_has {
                    return Err(invalid(format!("layer {id} {name}"), "present here but absent in the first layer"));
                }
                if v.len() != e {
                    return Err(mismatch(format!("layer {id} {name} length"), e, v.len()));
                }
                for (x, (&s, &c)) in v.iter().zip(&layer.count).enumerate() {
                    if !s.is_finite() || s < 0.0 {
                        return Err(invalid(
                            format!("layer {id} {name}[{x}]"),
                            format!("{s} is not a finite value >= 0"),
                        ));
                    }
                    if c == 0 && s != 0.0 {
                        return Err(invalid(
                            format!("layer {id} {name}[{x}]"),
                            format!("{s} but the expert has count 0"),
                        ));
                    }
                }
            }
            if !layer.reap_missing.is_empty() {
                let key = || format!("layer {id} reap_missing");
                let Some(reap) = &layer.reap_sum else {
                    return Err(invalid(key(), "lists experts but the layer has no reap_sum"));
                };
                for (i, &x) in layer.reap_missing.iter().enumerate() {
                    if usize::from(x) >= e {
                        return Err(invalid(key(), format!("expert id {x} is not below E = {e}")));
                    }
                    if i > 0 && layer.reap_missing[i - 1] >= x {
                        return Err(invalid(key(), format!("expert id {x} is repeated or out of ascending order")));
                    }
                    if reap[usize::from(x)] != 0.0 {
                        return Err(invalid(key(), format!("expert {x} is missing but its reap_sum is not 0")));
                    }
                }
            }
        }
        Ok(())
    }

    /// Number of (layer, expert) entries of `reap_sum` that are missing (see
    /// [`LayerStats::reap_missing`]).
    pub fn reap_missing_total(&self) -> usize {
        self.layers.iter().map(|l| l.reap_missing.len()).sum()
    }

    /// Names of the statistics every layer holds: `count` first, then those of `gate_sum`,
    /// `ean_sum`, `reap_sum`, `reap_sumsq` present (in that order).
    pub fn present_statistics(&self) -> Vec<&'static str> {
        let mut out = vec!["count"];
        out.extend(
            OPTIONAL_STATS
                .iter()
                .filter(|(_, get)| !self.layers.is_empty() && self.layers.iter().all(|l| get(l).is_some()))
                .map(|(n, _)| *n),
        );
        out
    }

    /// k inferred from the counts: Σ_e count / tokens when that is the same whole number >= 1 in
    /// every layer with tokens (SEMANTICS.md §8.1 makes Σ count = tokens · k an invariant);
    /// `None` when the layers disagree, a ratio is not whole, or no layer has tokens. Useful for
    /// sources that do not record k, such as REAP aggregate files.
    pub fn infer_top_k(&self) -> Option<u32> {
        let mut k = None;
        for l in self.layers.iter().filter(|l| l.tokens > 0) {
            let sum: u128 = l.count.iter().map(|&c| u128::from(c)).sum();
            let t = u128::from(l.tokens);
            if !sum.is_multiple_of(t) {
                return None;
            }
            let this = u32::try_from(sum / t).ok().filter(|&x| x >= 1)?;
            if k.is_some_and(|k| k != this) {
                return None;
            }
            k = Some(this);
        }
        k
    }

    /// Reads and validates a JSON statistics file (as written by [`Stats::write_json`]).
    ///
    /// # Errors
    /// [`crate::SaliencyError::Io`], [`crate::SaliencyError::Json`],
    /// [`crate::SaliencyError::NotJson`] (a trace given as statistics, say), or a validation error
    /// of [`Stats::validate`] naming the layer, inside [`crate::SaliencyError::InFile`] (naming
    /// the file).
    pub fn read_json(path: impl AsRef<Path>) -> Result<Stats> {
        let stats: Stats = jsonio::read(path.as_ref(), jsonio::Kind::Stats)?;
        stats.validate().map_err(|e| e.in_file(path.as_ref()))?;
        Ok(stats)
    }

    /// Validates, then writes the statistics as pretty JSON, atomically (temporary file in the same
    /// directory, renamed over `path`).
    ///
    /// # Errors
    /// A validation error of [`Stats::validate`], [`crate::SaliencyError::Io`] or
    /// [`crate::SaliencyError::Json`].
    pub fn write_json(&self, path: impl AsRef<Path>) -> Result<()> {
        self.validate()?;
        jsonio::write_atomic(path.as_ref(), STATS_KIND, self)
    }

    /// Validates, then returns the bytes [`Stats::write_json`] writes (for standard output).
    ///
    /// # Errors
    /// A validation error of [`Stats::validate`].
    pub fn to_json_bytes(&self) -> Result<Vec<u8>> {
        self.validate()?;
        Ok(jsonio::to_bytes(STATS_KIND, self))
    }

    /// Ok when every layer holds the optional statistic `statistic` (and, for `reap_sum`, no entry
    /// is missing), else a [`crate::SaliencyError::MissingStatistic`] or
    /// [`crate::SaliencyError::PartialStatistic`] naming `metric`.
    pub(crate) fn require(&self, metric: &str, statistic: &'static str) -> Result<()> {
        let present = OPTIONAL_STATS
            .iter()
            .find(|(n, _)| *n == statistic)
            .is_none_or(|(_, get)| self.layers.iter().all(|l| get(l).is_some()));
        if !present {
            return Err(crate::SaliencyError::MissingStatistic { metric: metric.to_string(), statistic });
        }
        if statistic == "reap_sum"
            && let Some((l, &layer_id)) =
                self.layers.iter().zip(&self.meta.layer_ids).find(|(l, _)| !l.reap_missing.is_empty())
        {
            return Err(crate::SaliencyError::PartialStatistic {
                metric: metric.to_string(),
                statistic,
                missing: self.reap_missing_total(),
                layer_id,
                expert: l.reap_missing[0],
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(digest: &str) -> Stats {
        Stats {
            meta: StatsMeta {
                model: "m".into(),
                num_experts: 2,
                top_k: 1,
                layer_ids: vec![4],
                source: "t.safetensors".into(),
                source_digest: digest.into(),
            },
            layers: vec![LayerStats {
                tokens: 3,
                count: vec![2, 1],
                gate_sum: Some(vec![1.5, 0.25]),
                ean_sum: None,
                reap_sum: None,
                reap_sumsq: None,
                reap_missing: Vec::new(),
            }],
        }
    }

    /// The provenance digest is written as `source_digest`, read from either key, and hashed
    /// under the older key in its place: the digest is the SHA-256 of the compact JSON with the
    /// key spelled as before, so keep maps recorded before the rename still verify.
    #[test]
    fn the_source_digest_reads_its_old_name_and_hashes_as_before() {
        let s = stats("blake3:ab12");
        let compact = String::from_utf8(serde_json::to_vec(&s).unwrap()).unwrap();
        assert!(compact.contains(r#""source":"t.safetensors","source_digest":"blake3:ab12"}"#), "{compact}");
        let legacy = compact.replace("\"source_digest\":", "\"source_sha256\":");
        assert_eq!(s.sha256(), trace_io::sha256_hex(legacy.as_bytes()));
        assert_ne!(s.sha256(), trace_io::sha256_hex(compact.as_bytes()));
        let back: Stats = serde_json::from_str(&legacy).unwrap();
        assert_eq!(back, s);
        assert_eq!(s.meta.digest(), Some(trace_io::Digest { algorithm: "blake3".into(), hex: "ab12".into() }));
        assert_eq!(stats("cd34").meta.digest(), Some(trace_io::Digest::sha256("cd34")));
        assert_eq!(stats("").meta.digest(), None);
    }
}
