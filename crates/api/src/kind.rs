//! The `kind` tag of every JSON document the tool writes (files, `--json` output, and the
//! dictionaries the Python package returns), so that a reader (pandas, jq, a script) tells them
//! apart by one field: `moe-offload-<what>`, always the document's first field. This module is
//! the one table of them: the library crates' own files ([`STATS`], [`KEEP_MAP`],
//! [`SWEEP_RESULTS`], [`TRACE_FORMAT`]) are named here by their crates' constants, the documents
//! the command layer assembles are defined here. The exports in other tools' formats (`export
//! vllm-ascend`, `export gguf-prune`) carry no tag: their readers take every top-level key, or
//! every line, as a layer.

use serde_json::Value;

/// `plan` (the file and `--json`).
pub const PLAN: &str = "moe-offload-plan";
/// `plan --exec host` (the file): pins per layer chosen by tok/s (SEMANTICS.md §14).
pub const HYBRID_PLAN: &str = "moe-offload-hybrid-plan";
/// `mrc` (the file and `--json`): per-layer misses of every cache size.
pub const MRC: &str = "moe-offload-mrc";
/// `inspect --json`.
pub const INSPECT: &str = "moe-offload-inspect";
/// `retention --json`: one entry of `maps` per keep map.
pub const RETENTION: &str = "moe-offload-retention";
/// `replay --json` (with or without prefetch, pins, tiers, batches, hybrid execution).
pub const REPLAY: &str = "moe-offload-replay";
/// `stats --reap-agg FILE --list-corpora --json`.
pub const REAP_CORPORA: &str = "moe-offload-reap-corpora";
/// `import sglang-dump --json`, `import routed-experts --json`: the trace written and the
/// importer's report.
pub const IMPORT: &str = "moe-offload-import";
/// `capture --json`: the trace written, what was recorded and llama.cpp's timings.
pub const CAPTURE: &str = "moe-offload-capture";
/// `profile measure --json`: the timings and the profile made of them.
pub const PROFILE_MEASURE: &str = "moe-offload-profile-measure";
/// `keep --json`: the maps written, with their sizes.
pub const KEEP_MAPS: &str = "moe-offload-keep-maps";
/// `sweep --json` and `sweep merge --json`: the summary the table prints.
pub const SWEEP_SUMMARY: &str = "moe-offload-sweep-summary";
/// `profile show --json`: a device profile's fields, units and derived figures.
pub const PROFILE: &str = "moe-offload-profile";
/// `export keep-set`.
pub const KEEP_SET: &str = "moe-offload-keep-set";
/// A statistics file (`stats -o`), tagged by `saliency`.
pub const STATS: &str = saliency::STATS_KIND;
/// A keep map (`keep -o`), tagged by `saliency`.
pub const KEEP_MAP: &str = saliency::KEEP_MAP_KIND;
/// A sweep's `results.json`, tagged by `sweep`.
pub const SWEEP_RESULTS: &str = sweep::RESULTS_KIND;
/// A trace's `format` metadata key, written by `trace-io`.
pub const TRACE_FORMAT: &str = trace_io::FORMAT_NAME;

/// Every kind, once (a test checks that no two are equal).
pub const ALL: [&str; 18] = [
    IMPORT,
    CAPTURE,
    PROFILE_MEASURE,
    PLAN,
    HYBRID_PLAN,
    MRC,
    INSPECT,
    RETENTION,
    REPLAY,
    REAP_CORPORA,
    KEEP_MAPS,
    SWEEP_SUMMARY,
    PROFILE,
    KEEP_SET,
    STATS,
    KEEP_MAP,
    SWEEP_RESULTS,
    TRACE_FORMAT,
];

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

    #[test]
    fn every_kind_is_tagged_and_distinct() {
        let mut all = super::ALL.to_vec();
        assert!(all.iter().all(|k| k.starts_with("moe-offload-")), "{all:?}");
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), super::ALL.len(), "two kinds are equal");
    }
}
