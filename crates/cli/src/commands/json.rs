//! The `kind` tag of every JSON document the tool writes (files and `--json` output), so that a
//! reader (pandas, jq, a script) tells them apart by one field: `moe-offload-<what>`, always the
//! document's first field. The library crates tag their own files ([`saliency::STATS_KIND`],
//! [`saliency::KEEP_MAP_KIND`], [`sweep::RESULTS_KIND`]); the ones the command line assembles are
//! here. The exports in other tools' formats (`export vllm-ascend`, `export gguf-prune`) carry no
//! tag: their readers take every top-level key, or every line, as a layer.

use std::io::Write as _;

use anyhow::Result;
use serde_json::Value;

/// `moe-offload plan` (the file and `--json`).
pub const PLAN: &str = "moe-offload-plan";
/// `moe-offload plan --exec host` (the file): pins per layer chosen by tok/s (SEMANTICS.md §14).
pub const HYBRID_PLAN: &str = "moe-offload-hybrid-plan";
/// `moe-offload mrc` (the file and `--json`): per-layer misses of every cache size.
pub const MRC: &str = "moe-offload-mrc";
/// `moe-offload inspect --json`.
pub const INSPECT: &str = "moe-offload-inspect";
/// `moe-offload retention --json`: one entry of `maps` per keep map.
pub const RETENTION: &str = "moe-offload-retention";
/// `moe-offload replay --json` (with or without prefetch, pins, tiers, batches).
pub const REPLAY: &str = "moe-offload-replay";
/// `moe-offload stats --reap-agg FILE --list-corpora --json`.
pub const REAP_CORPORA: &str = "moe-offload-reap-corpora";
/// `moe-offload keep --json`: the maps written, with their sizes.
pub const KEEP_MAPS: &str = "moe-offload-keep-maps";
/// `moe-offload sweep --json` and `sweep merge --json`: the summary the table prints.
pub const SWEEP_SUMMARY: &str = "moe-offload-sweep-summary";
/// `moe-offload profile show --json`: a device profile's fields, units and derived figures.
pub const PROFILE: &str = "moe-offload-profile";
/// `moe-offload export keep-set`.
pub const KEEP_SET: &str = "moe-offload-keep-set";

/// `value` (an object) with `"kind": kind` as its first field, replacing a `kind` it had; any
/// other value wrapped as `{"kind": kind, "value": value}`.
pub fn tagged(kind: &str, value: Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("kind".into(), kind.into());
    match value {
        Value::Object(fields) => out.extend(fields.into_iter().filter(|(k, _)| k != "kind")),
        other => {
            out.insert("value".into(), other);
        }
    }
    Value::Object(out)
}

/// Prints `value` as pretty JSON and a newline on standard output: the one document of `--json`.
///
/// # Errors
/// A failed write (a closed pipe ends the command quietly, `main`).
pub fn print(value: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value)?;
    writeln!(out)?;
    Ok(out.flush()?)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn the_kind_comes_first_and_replaces_an_older_one() {
        let v = super::tagged("moe-offload-x", json!({"b": 1, "kind": "old", "a": [2]}));
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"kind":"moe-offload-x","b":1,"a":[2]}"#);
        let v = super::tagged("moe-offload-y", json!([1, 2]));
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"kind":"moe-offload-y","value":[1,2]}"#);
    }
}
