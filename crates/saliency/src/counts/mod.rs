//! Per-expert count files, the statistics people publish most, as [`Stats`] holding `count` only.
//!
//! Layouts ([`CountsFormat`], detected from the extension, else from the content):
//! - JSON `{layer: [E counts], ...}`: one key per layer. A key is the layer id (`"3"`) or a name
//!   with exactly one number in it (`"model.layers.3.mlp"`, `"layer_3"`), which is the id;
//! - JSON `{"layers": [ids], "counts": [[E counts], ...]}` (`"layers"` optional: then the rows are
//!   layer indices 0..L), optionally with `"top_k"`: the layout `python/convert_counts.py` writes;
//! - CSV (or TSV) rows `layer, expert, count`, with or without a header naming those columns (in
//!   any order; `layer_id`, `expert_id`, `freq`, `frequency`, `hits` accepted too); a (layer,
//!   expert) pair absent from the file counts 0; E = the largest expert id + 1 unless
//!   [`CountsOptions::num_experts`] says more;
//! - `.npy`, an `L x E` array of integers (or floats with whole values), C or Fortran order:
//!   rows are layer indices 0..L;
//! - llama.cpp's `expert_stats.json` (detected by its `activation_counts` key): read by
//!   [`Stats::from_llama_expert_stats`] with all its statistics, not as counts only.
//!
//! Layer ids: the file's ids, or with [`CountsOptions::layer_ids`] the given ids in place of layer
//! indices 0..L (the file's keys, ascending, must then be exactly 0..L). The file records neither
//! k nor the token count: k comes from the file's `top_k` or [`CountsOptions::top_k`], and the
//! tokens of a layer are Σ count / k (SEMANTICS.md §8.1), which must be whole. `gate_sum`,
//! `ean_sum`, `reap_sum` and `reap_sumsq` are `None`: metrics that need them are errors
//! (SEMANTICS.md §2), while `frequency` keep maps and retention (slot replacement, zero-hit kept
//! experts) work.

use std::path::Path;

use crate::error::invalid;
use crate::stats::{LayerStats, Stats, StatsMeta};
use crate::{Result, jsonio};

pub(crate) mod read;

/// The layouts of count files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountsFormat {
    /// A JSON object (either JSON layout, or llama.cpp's `expert_stats.json`).
    Json,
    /// Comma- or tab-separated `layer, expert, count` rows.
    Csv,
    /// A NumPy `.npy` array `[L, E]`.
    Npy,
}

impl CountsFormat {
    /// From the extension (`.json`, `.csv`, `.tsv`, `.npy`), else from the first bytes (the NumPy
    /// magic, `{`, else CSV).
    pub fn detect(path: &Path, bytes: &[u8]) -> CountsFormat {
        match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
            Some("json") => CountsFormat::Json,
            Some("csv" | "tsv") => CountsFormat::Csv,
            Some("npy") => CountsFormat::Npy,
            _ if bytes.starts_with(b"\x93NUMPY") => CountsFormat::Npy,
            _ if bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') => CountsFormat::Json,
            _ => CountsFormat::Csv,
        }
    }
}

/// Options of [`Stats::from_counts_file`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CountsOptions {
    /// k, the model's experts per token; required unless the file records `top_k` (when both are
    /// given they must agree).
    pub top_k: Option<u32>,
    /// The model's layer ids, in place of the file's layer indices 0..L.
    pub layer_ids: Option<Vec<u32>>,
    /// E when the file does not show it whole (a CSV whose last experts never appear); must not be
    /// below the file's.
    pub num_experts: Option<u32>,
}

/// Counts as read from a file, before layer ids and k are applied.
pub(crate) struct RawCounts {
    /// (layer key, counts of E experts), keys strictly ascending; positions 0..L for an npy
    /// array or a `counts` array without `layers`.
    pub layers: Vec<(u32, Vec<u64>)>,
    /// `top_k` recorded by the file.
    pub top_k: Option<u32>,
    /// How the keys were read, for [`StatsMeta::source`] (for example "layer ids from key names").
    pub note: Option<String>,
}

impl Stats {
    /// Reads a per-expert count file ([`CountsFormat`]) as statistics with `count` only, or
    /// llama.cpp's `expert_stats.json` with [`Stats::from_llama_expert_stats`].
    ///
    /// # Errors
    /// [`crate::SaliencyError::Io`] for the file; [`crate::SaliencyError::Json`] for bad JSON;
    /// [`crate::SaliencyError::Invalid`] naming the file, line or key, layer and expert for a
    /// layout not recognized, a count that is not a whole number >= 0, layers of different
    /// lengths, a layer twice, a (layer, expert) pair twice, an expert id `>= num_experts`,
    /// `--layer-ids` of the wrong length or for keys that are not indices, no k, k above E, or a
    /// layer whose counts are not a multiple of k; [`crate::SaliencyError::CountAboveTokens`] for
    /// an expert counted more often than its layer has tokens; a validation error of
    /// [`Stats::validate`].
    pub fn from_counts_file(path: &Path, opts: &CountsOptions) -> Result<Stats> {
        let bytes = jsonio::read_bytes(path)?;
        let format = CountsFormat::detect(path, &bytes);
        let raw = match format {
            CountsFormat::Json => {
                let value: serde_json::Value = serde_json::from_slice(&bytes)
                    .map_err(|source| crate::SaliencyError::Json { path: path.to_path_buf(), source })?;
                if let Some(key) = trace_io::repeated_top_key(&bytes) {
                    return Err(invalid(
                        format!("{}: key `{key}`", path.display()),
                        "appears twice at the top level: the second would replace the first without a word; \
                         give each layer once",
                    ));
                }
                if crate::expert_profile::is_llama_expert_stats(&value) {
                    let p = crate::expert_profile::ExpertStatsOptions {
                        top_k: opts.top_k,
                        layer_ids: opts.layer_ids.clone(),
                        num_experts: opts.num_experts,
                    };
                    return Stats::from_llama_expert_stats_value(path, &bytes, &value, &p);
                }
                read::json(path, &value)?
            }
            CountsFormat::Csv => read::csv(path, &bytes, opts.num_experts)?,
            CountsFormat::Npy => read::npy(path, &bytes)?,
        };
        let file_k = raw.top_k;
        let top_k = match (opts.top_k, file_k) {
            (Some(a), Some(b)) if a != b => {
                return Err(invalid(
                    format!("{}: key `top_k`", path.display()),
                    format!("{b} disagrees with --top-k {a}: omit --top-k or correct it"),
                ));
            }
            (Some(k), _) | (None, Some(k)) => k,
            (None, None) => {
                return Err(invalid(
                    path.display().to_string(),
                    "the file does not record top-k: pass --top-k K (the model's experts per token), from which \
                     each layer's token count (sum of counts / K) follows",
                ));
            }
        };
        if top_k == 0 {
            return Err(invalid("top_k", "must be at least 1"));
        }
        let ids = layer_ids(path, &raw, opts.layer_ids.as_deref())?;
        let e = raw.layers.first().map_or(0, |(_, c)| c.len());
        let e_model = opts.num_experts.map_or(e, |n| e.max(n as usize));
        if top_k as usize > e_model {
            return Err(invalid(
                format!("{}: top-k", path.display()),
                format!(
                    "{top_k} is more than the {e_model} experts per layer: top-{top_k} routing chooses {top_k} distinct \
                     experts; check --top-k (or --num-experts)"
                ),
            ));
        }
        let mut layers = Vec::with_capacity(raw.layers.len());
        for ((_, mut count), &id) in raw.layers.into_iter().zip(&ids) {
            if let Some(n) = opts.num_experts
                && (n as usize) > count.len()
            {
                count.resize(n as usize, 0);
            }
            // Summed in u128: a sum of u64 counts can pass 2^64, and the message shows the true figure.
            let wide: u128 = count.iter().map(|&c| u128::from(c)).sum();
            let Ok(sum) = u64::try_from(wide) else {
                return Err(invalid(
                    format!("{}: layer {id}", path.display()),
                    format!(
                        "counts sum to {wide}, which exceeds 2^64 - 1 = {}: no trace has that many tokens x top-k; \
                         check whether the file counts something else",
                        u64::MAX
                    ),
                ));
            };
            if !sum.is_multiple_of(u64::from(top_k)) {
                return Err(invalid(
                    format!("{}: layer {id}", path.display()),
                    format!(
                        "counts sum to {sum}, not a multiple of top-k {top_k}: a layer's counts of top-{top_k} routing sum \
                         to tokens x {top_k} (SEMANTICS.md §8.1); check --top-k, or whether the file counts something else"
                    ),
                ));
            }
            let tokens = sum / u64::from(top_k);
            counts_within_tokens(path, id, &count, tokens, || format!("sum of counts {sum} / top-k {top_k}"))?;
            layers.push(LayerStats {
                tokens,
                count,
                gate_sum: None,
                ean_sum: None,
                reap_sum: None,
                reap_sumsq: None,
                reap_missing: Vec::new(),
            });
        }
        let e = e_model;
        let what = match format {
            CountsFormat::Json => "json",
            CountsFormat::Csv => "csv",
            CountsFormat::Npy => "npy",
        };
        let mut source = format!("counts-{what}:{}", path.display());
        if let Some(n) = raw.note {
            source.push_str(&format!(" ({n})"));
        }
        let stats = Stats {
            meta: StatsMeta {
                model: String::new(),
                num_experts: u32::try_from(e)
                    .map_err(|_| invalid("num_experts", format!("{e} experts is too many")))?,
                top_k,
                layer_ids: ids,
                source,
                source_digest: trace_io::sha256_hex(&bytes),
            },
            layers,
        };
        stats.validate().map_err(|e| e.in_file(path))?;
        Ok(stats)
    }
}

/// Refuses a layer of `path` (id `layer_id`) in which an expert is counted more often than the
/// layer has `tokens`: a token chooses k distinct experts, so each at most once.
pub(crate) fn counts_within_tokens(
    path: &Path,
    layer_id: u32,
    count: &[u64],
    tokens: u64,
    tokens_from: impl FnOnce() -> String,
) -> Result<()> {
    match count.iter().enumerate().find(|&(_, &c)| c > tokens) {
        Some((x, &c)) => Err(crate::SaliencyError::CountAboveTokens {
            path: path.to_path_buf(),
            layer_id,
            expert: x as u32,
            count: c,
            tokens,
            tokens_from: tokens_from(),
        }),
        None => Ok(()),
    }
}

/// The layer ids of `raw`: its keys, or `given` in place of keys that are indices 0..L.
pub(crate) fn layer_ids(path: &Path, raw: &RawCounts, given: Option<&[u32]>) -> Result<Vec<u32>> {
    let keys: Vec<u32> = raw.layers.iter().map(|(k, _)| *k).collect();
    let Some(given) = given else {
        return Ok(keys);
    };
    if given.len() != keys.len() {
        return Err(invalid(
            "--layer-ids",
            format!(
                "{} ids given, but {} has {} layers: give one id per layer",
                given.len(),
                path.display(),
                keys.len()
            ),
        ));
    }
    let indices = keys.iter().enumerate().all(|(i, &k)| k as usize == i);
    if !indices {
        return Err(invalid(
            "--layer-ids",
            format!(
                "the layer keys of {} are {keys:?}, not the indices 0..{}: they are layer ids already; drop --layer-ids",
                path.display(),
                keys.len()
            ),
        ));
    }
    if let Some(w) = given.windows(2).find(|w| w[0] >= w[1]) {
        return Err(invalid("--layer-ids", format!("{} then {}: give the ids in increasing order", w[0], w[1])));
    }
    Ok(given.to_vec())
}
