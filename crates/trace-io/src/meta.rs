//! Trace metadata: the string map stored in the safetensors `__metadata__` header.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use crate::{Result, TraceError};

/// The trace format version this build reads and writes (metadata key `format_version`).
pub const FORMAT_VERSION: u32 = 1;
/// Value of the metadata key `format`, identifying a moe-offload trace.
pub const FORMAT_NAME: &str = "moe-offload-trace";

/// What the `scores` tensor holds. All three order candidates identically; a per-row constant
/// shift (logits vs log-probabilities) changes nothing downstream (SEMANTICS.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoreKind {
    /// Raw router logits.
    Logits,
    /// ln of the full-softmax router probability (logits up to a per-row constant).
    LogProbs,
    /// ln of probabilities renormalized over the recorded candidates only: the order is right,
    /// but the softmax over these scores is not the model's full softmax.
    LogProbsRenormalized,
    /// The file has no `scores` tensor.
    None,
}

/// Which inference phase the tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Prompt processing (all tokens of a sequence at once, or teacher-forced text).
    Prefill,
    /// Autoregressive generation, one token per sequence per step.
    Decode,
    /// A served trace mixing both.
    Mixed,
    /// Not recorded.
    Unknown,
}

macro_rules! str_enum {
    ($t:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            /// The spelling used in metadata and on the command line.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$v => $s),* }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($s => Ok(Self::$v),)*
                    _ => Err(format!("expected one of: {}", [$($s),*].join(", "))),
                }
            }
        }
    };
}
str_enum!(ScoreKind { Logits => "logits", LogProbs => "log_probs", LogProbsRenormalized => "log_probs_renormalized", None => "none" });
str_enum!(Phase { Prefill => "prefill", Decode => "decode", Mixed => "mixed", Unknown => "unknown" });

/// Metadata of a trace. Stored as strings in the safetensors header under the keys named on each
/// field; unknown keys are kept in [`TraceMeta::extra`] and written back unchanged.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceMeta {
    /// `model`: free-form model name (for example `deepseek-ai/ESFT-vanilla-lite`).
    pub model: String,
    /// `num_experts`: E, routed experts per layer; every id is `< E`.
    pub num_experts: u32,
    /// `top_k`: k, experts the model used per token; the first k candidates of a row.
    pub top_k: u32,
    /// `layer_ids`: the model's index of each traced MoE layer, JSON list, one per trace layer.
    pub layer_ids: Vec<u32>,
    /// `score_kind`: what `scores` holds.
    pub score_kind: ScoreKind,
    /// `phase`: prefill, decode, mixed or unknown.
    pub phase: Phase,
    /// `source`: where the routing came from (importer and input description).
    pub source: String,
    /// Any other metadata keys (for example `prob_floor`, `domains`), sorted.
    pub extra: BTreeMap<String, String>,
}

const KNOWN_KEYS: [&str; 9] =
    ["format", "format_version", "model", "num_experts", "top_k", "layer_ids", "score_kind", "phase", "source"];

impl TraceMeta {
    /// Encodes the metadata as the header's string map, keys sorted.
    pub fn to_map(&self) -> BTreeMap<String, String> {
        let mut m = self.extra.clone();
        let ids = serde_json::to_string(&self.layer_ids).expect("a Vec<u32> always serializes");
        for (k, v) in [
            ("format", FORMAT_NAME.to_string()),
            ("format_version", FORMAT_VERSION.to_string()),
            ("model", self.model.clone()),
            ("num_experts", self.num_experts.to_string()),
            ("top_k", self.top_k.to_string()),
            ("layer_ids", ids),
            ("score_kind", self.score_kind.to_string()),
            ("phase", self.phase.to_string()),
            ("source", self.source.clone()),
        ] {
            m.insert(k.to_string(), v);
        }
        m
    }

    /// Decodes the header's string map.
    ///
    /// # Errors
    /// [`TraceError::MissingMetadata`] for an absent required key, [`TraceError::UnsupportedVersion`]
    /// for another format version, [`TraceError::BadMetadata`] for an unparsable or invalid value
    /// (for example `layer_ids` repeating an id).
    pub fn from_map(m: &HashMap<String, String>) -> Result<TraceMeta> {
        let get = |key: &'static str| m.get(key).ok_or(TraceError::MissingMetadata { key });
        let format = get("format")?;
        if format != FORMAT_NAME {
            return Err(bad("format", format, format!("expected {FORMAT_NAME:?}")));
        }
        let version = get("format_version")?;
        if version.parse::<u32>().ok() != Some(FORMAT_VERSION) {
            return Err(TraceError::UnsupportedVersion { found: version.clone(), supported: FORMAT_VERSION });
        }
        let num_experts = parse_u32(m, "num_experts")?;
        if num_experts == 0 || num_experts > u32::from(u16::MAX) + 1 {
            return Err(bad("num_experts", &num_experts.to_string(), "must be in 1..=65536 (ids are u16)".into()));
        }
        let top_k = parse_u32(m, "top_k")?;
        if top_k == 0 {
            return Err(bad("top_k", "0", "must be at least 1".into()));
        }
        let raw_ids = get("layer_ids")?;
        let layer_ids: Vec<u32> = serde_json::from_str(raw_ids)
            .map_err(|e| bad("layer_ids", raw_ids, format!("expected a JSON list of integers: {e}")))?;
        check_layer_ids(&layer_ids)?;
        let score_kind = get("score_kind")?;
        let score_kind = score_kind.parse().map_err(|r| bad("score_kind", score_kind, r))?;
        let phase = get("phase")?;
        let phase = phase.parse().map_err(|r| bad("phase", phase, r))?;
        let extra =
            m.iter().filter(|(k, _)| !KNOWN_KEYS.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(TraceMeta {
            model: get("model")?.clone(),
            num_experts,
            top_k,
            layer_ids,
            score_kind,
            phase,
            source: get("source")?.clone(),
            extra,
        })
    }
}

/// Checks a `layer_ids` list: at least one layer, and no layer id twice (every consumer that keys
/// by layer id, such as keep maps, would otherwise merge two trace layers into one). The order is
/// free; the importers write them increasing.
///
/// # Errors
/// [`TraceError::BadMetadata`] for `layer_ids`, naming the repeated id and both of its positions.
pub(crate) fn check_layer_ids(layer_ids: &[u32]) -> Result<()> {
    let raw = || serde_json::to_string(layer_ids).expect("a slice of u32 always serializes");
    if layer_ids.is_empty() {
        return Err(bad("layer_ids", &raw(), "a trace needs at least one MoE layer".into()));
    }
    let mut first_at: HashMap<u32, usize> = HashMap::with_capacity(layer_ids.len());
    for (i, &id) in layer_ids.iter().enumerate() {
        if let Some(first) = first_at.insert(id, i) {
            return Err(bad(
                "layer_ids",
                &raw(),
                format!("layer id {id} is repeated (entries {first} and {i}); every traced layer needs its own id"),
            ));
        }
    }
    Ok(())
}

fn parse_u32(m: &HashMap<String, String>, key: &'static str) -> Result<u32> {
    let v = m.get(key).ok_or(TraceError::MissingMetadata { key })?;
    v.parse().map_err(|e| bad(key, v, format!("expected an unsigned integer: {e}")))
}

fn bad(key: &'static str, value: &str, reason: String) -> TraceError {
    TraceError::BadMetadata { key, value: value.to_string(), reason }
}
