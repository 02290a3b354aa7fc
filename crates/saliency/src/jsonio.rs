//! JSON file helpers shared by statistics and keep maps: typed read, atomic pretty write.

use std::path::Path;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Result, SaliencyError};

pub(crate) fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> SaliencyError + '_ {
    move |source| SaliencyError::Io { path: path.to_path_buf(), source }
}

/// The bytes of an input file, a leading UTF-8 byte-order mark removed ([`trace_io::read_text`]);
/// a FIFO, device or directory is refused before it is opened (a FIFO would block).
pub(crate) fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    trace_io::read_text(path).map_err(io_err(path))
}

/// The tool's JSON files that [`read`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Stats,
    KeepMap,
}

impl Kind {
    /// What a file of this kind is, and the command that writes it.
    fn described(self) -> &'static str {
        match self {
            Kind::Stats => "statistics JSON (`moe-offload stats TRACE -o stats.json` writes it)",
            Kind::KeepMap => "a keep-map JSON (`moe-offload keep` writes it)",
        }
    }
}

/// Reads a JSON file of kind `expected`. A file of another kind is named as such in the error
/// ([`SaliencyError::NotJson`]); a file of the expected kind with a bad field keeps the JSON
/// error and its position.
pub(crate) fn read<T: DeserializeOwned>(path: &Path, expected: Kind) -> Result<T> {
    let bytes = read_bytes(path)?;
    serde_json::from_slice(&bytes).map_err(|source| {
        let other = match json_kind(&bytes) {
            Some((kind, _)) if kind == Some(expected) => None,
            Some((_, found)) => Some(found),
            None => None,
        };
        match binary_kind(&bytes).or(other) {
            Some(found) => SaliencyError::NotJson { path: path.to_path_buf(), found, expected: expected.described() },
            None => SaliencyError::Json { path: path.to_path_buf(), source },
        }
    })
}

/// What a JSON file holds, recognized by its top-level keys: one of the tool's files (with its
/// [`Kind`] when [`read`] reads that kind), or a REAP aggregate file (per-corpus objects with
/// `freq` and `tok`; they hold NaN, which JSON does not allow). `None` when it is none of them.
fn json_kind(bytes: &[u8]) -> Option<(Option<Kind>, &'static str)> {
    let text = std::str::from_utf8(bytes).ok()?;
    let parsed = serde_json::from_str::<serde_json::Value>(text);
    if let Ok(serde_json::Value::Array(_)) = parsed {
        return Some((
            None,
            "a JSON list (statistics and keep maps are JSON objects: a keep map holds `metric`, `k`, `num_experts`, \
             `layer_ids` and `layers`, one list of expert ids per layer)",
        ));
    }
    let Ok(serde_json::Value::Object(top)) = parsed else {
        let start = &text[..text.len().min(4096)];
        return (start.contains("\"freq\"") && start.contains("\"tok\""))
            .then_some((None, "a REAP aggregate file (read it with `moe-offload stats --reap-agg FILE`)"));
    };
    let has = |k: &str| top.contains_key(k);
    match top.get("kind").and_then(|k| k.as_str()) {
        Some(crate::STATS_KIND) => return Some((Some(Kind::Stats), "statistics JSON (from `moe-offload stats`)")),
        Some(crate::KEEP_MAP_KIND) => return Some((Some(Kind::KeepMap), "a keep map (from `moe-offload keep`)")),
        Some("moe-offload-plan") => {
            return Some((
                None,
                "a plan of `moe-offload plan` (its keep map is `chosen.keep_map`, which `replay --keep` and `export keep-set` read)",
            ));
        }
        Some(k) if k.starts_with("moe-offload-") => {
            return Some((None, "another output of moe-offload (see its `kind` field)"));
        }
        _ => {}
    }
    if has("meta") && has("layers") {
        Some((Some(Kind::Stats), "statistics JSON (from `moe-offload stats`)"))
    } else if has("metric") && has("layers") && has("k") {
        Some((Some(Kind::KeepMap), "a keep map (from `moe-offload keep`)"))
    } else if has("provenance") && has("rows") {
        Some((None, "sweep results (results.json of `moe-offload sweep`)"))
    } else {
        None
    }
}

/// What a file that failed to parse as JSON looks like when it is binary: a safetensors file
/// (an 8-byte little-endian header length, then a JSON header opening with `{`), or any file
/// with a NUL byte near its start. `None` for text (the JSON error says more then).
fn binary_kind(bytes: &[u8]) -> Option<&'static str> {
    if let Some((len, rest)) = bytes.split_first_chunk::<8>() {
        let n = u64::from_le_bytes(*len);
        if n > 0 && n <= rest.len() as u64 && rest.first() == Some(&b'{') {
            return Some("a safetensors file (a trace?)");
        }
    }
    bytes.iter().take(4096).any(|&b| b == 0).then_some("a binary file")
}

/// A value written with its `kind` tag as the first field (ignored when reading: the structs
/// have no `kind` field and accept unknown ones). Hashes of the values
/// ([`crate::Stats::sha256`]) are of the untagged struct, so the tag changes no recorded digest.
#[derive(Serialize)]
struct Tagged<'a, T> {
    kind: &'static str,
    #[serde(flatten)]
    value: &'a T,
}

/// Writes pretty JSON, with the `kind` tag first, through [`trace_io::write_atomic`] (temporary
/// file in the target's directory, then rename): readers never see a partial file.
pub(crate) fn write_atomic<T: Serialize>(path: &Path, kind: &'static str, value: &T) -> Result<()> {
    let bytes = to_bytes(kind, value);
    trace_io::write_atomic(path, |w| w.write_all(&bytes)).map_err(io_err(path))
}

/// The bytes [`write_atomic`] writes: pretty JSON with the `kind` tag first, then a newline.
pub(crate) fn to_bytes<T: Serialize>(kind: &'static str, value: &T) -> Vec<u8> {
    let mut out = serde_json::to_vec_pretty(&Tagged { kind, value }).expect("our outputs serialize");
    out.push(b'\n');
    out
}
