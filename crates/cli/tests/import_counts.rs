//! `moe-offload import counts` (count files and llama.cpp's expert_stats.json to statistics), the
//! REAP aggregate variants of `stats --reap-agg`, and the vLLM importer's dummy-row options, end to
//! end through the binary.

mod common;

use common::{fails, ok, s};

use std::path::Path;

fn stats_json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

#[test]
fn count_files_feed_frequency_keep_maps_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Layers are indices 0, 1 in the file; the model's ids are 3 and 7. Top-2.
    let counts = d.join("counts.json");
    std::fs::write(&counts, r#"{"0": [5, 1, 0, 2], "1": [0, 4, 2, 2]}"#).unwrap();
    let st = d.join("stats.json");
    let err = fails(&["import", "counts", s(&counts), "-o", s(&st)]);
    assert!(err.contains("counts.json") && err.contains("pass --top-k"), "{err}");
    assert!(!st.exists());
    let msg = ok(&["import", "counts", s(&counts), "--top-k", "2", "--layer-ids", "3,7", "-o", s(&st)]);
    assert!(msg.contains("2 layers x 4 experts, top-2, statistics: count (from counts-json:"), "{msg}");
    let j = stats_json(&st);
    assert_eq!(j["meta"]["layer_ids"], serde_json::json!([3, 7]));
    assert_eq!(j["layers"][1]["count"], serde_json::json!([0, 4, 2, 2]));
    assert_eq!(j["layers"][0]["tokens"], 4);

    let map = d.join("freq.json");
    ok(&["keep", s(&st), "--metric", "frequency", "--k", "2", "-o", s(&map)]);
    let v: serde_json::Value =
        serde_json::from_str(&ok(&["retention", s(&map), "--heldout", s(&st), "--json"])).unwrap();
    // Layer 3 keeps experts 0 and 3 (7 of 8 slots), layer 7 keeps 1 and 2 (ties to the lower id: 6 of 8).
    assert_eq!(v["maps"][0]["per_layer"][0]["figures"]["slot_replacement"], 0.125);
    assert_eq!(v["maps"][0]["per_layer"][1]["figures"]["slot_replacement"], 0.25);
    let err = fails(&["keep", s(&st), "--metric", "reap", "--k", "2", "-o", s(&d.join("r.json"))]);
    assert!(err.contains("reap_sum"), "{err}");

    // The same counts as CSV rows give the same statistics (but for the source).
    let csv = d.join("counts.csv");
    std::fs::write(&csv, "layer,expert,count\n0,0,5\n0,1,1\n0,3,2\n1,1,4\n1,2,2\n1,3,2\n").unwrap();
    let st2 = d.join("stats2.json");
    ok(&["import", "counts", s(&csv), "--top-k", "2", "--layer-ids", "3,7", "-o", s(&st2)]);
    assert_eq!(stats_json(&st2)["layers"], j["layers"]);
    let err = fails(&["import", "counts", s(&csv), "--top-k", "3", "-o", s(&st2)]);
    assert!(err.contains("counts sum to 8, not a multiple of top-k 3"), "{err}");
}

#[test]
fn expert_stats_json_and_reap_aggregate_variants() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let es = d.join("expert_stats.json");
    std::fs::write(
        &es,
        r#"{"0": {"total_tokens": 2, "activation_counts": [2, 1, 1], "activation_frequency": [1, 0.5, 0.5],
             "avg_gate_weight": [0.5, 0.25, 0.25], "ean_mean": [1, 2, 4], "reap": [0.5, 0.5, 1], "never_activated": 0}}"#,
    )
    .unwrap();
    let st = d.join("es.json");
    let msg = ok(&["import", "counts", s(&es), "-o", s(&st)]);
    assert!(msg.contains("1 layer x 3 experts, top-2, statistics: count, gate_sum, ean_sum, reap_sum"), "{msg}");
    assert_eq!(stats_json(&st)["layers"][0]["reap_sum"], serde_json::json!([1.0, 0.5, 1.0]));

    // A REAP aggregate without the corpus wrapper, with tokens and per-token means.
    let agg = d.join("means.json");
    std::fs::write(&agg, r#"{"tokens": 2, "freq": {"0": [2, 1, 1]}, "reap_mean": {"0": [0.5, 0.5, 1.0]}}"#).unwrap();
    let st = d.join("agg.json");
    let msg = ok(&["stats", "--reap-agg", s(&agg), "-o", s(&st)]);
    assert!(msg.contains("corpus (top level)") && msg.contains("statistics: count, reap_sum"), "{msg}");
    assert_eq!(stats_json(&st)["layers"][0]["reap_sum"], serde_json::json!([1.0, 0.5, 1.0]));
    let list = ok(&["stats", "--reap-agg", s(&agg), "--list-corpora"]);
    assert!(list.contains("(top level: no corpus wrapper, omit --corpus)"), "{list}");
    let err = fails(&["stats", "--reap-agg", s(&agg), "--corpus", "bible", "-o", s(&st)]);
    assert!(err.contains("drop --corpus"), "{err}");
    // Counts only: accepted, no NaN invented.
    std::fs::write(&agg, r#"{"c": {"tok": 2, "freq": {"0": [2, 1, 1]}}}"#).unwrap();
    let msg = ok(&["stats", "--reap-agg", s(&agg), "--corpus", "c", "-o", s(&st)]);
    assert!(msg.contains("statistics: count\n") && msg.contains("counts only"), "{msg}");
    assert!(!std::fs::read_to_string(&st).unwrap().contains("NaN"));
}

/// A one-layer route log of two engine runs: each a warm-up step of 3 identical rows, then real
/// steps of 2 and 1 rows.
fn two_runs(dir: &Path) -> std::path::PathBuf {
    let route = |t: u32, a: u32, b: u32, w: f64| {
        format!(
            r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": 0, "topk_ids": [{a}, {b}], "topk_weights": [{w}, 0.25]}}"#
        )
    };
    let mut lines = vec![r#"{"type": "meta", "model_id": "tiny", "layers_logged": [0], "top_k": 2}"#.to_string()];
    for run in 0..2 {
        lines.extend((0..3).map(|t| route(t, 0, 1, 0.5)));
        lines.extend([route(0, 2, 3, 0.3 + 0.1 * f64::from(run)), route(1, 3, 1, 0.4), route(0, 1, 2, 0.35)]);
    }
    let p = dir.join("layer0.jsonl");
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

#[test]
fn vllm_second_run_becomes_a_sequence_and_skip_rows_drops_rows() {
    let dir = tempfile::tempdir().unwrap();
    let log = two_runs(dir.path());
    let out = dir.path().join("t.safetensors");
    let msg = ok(&["import", "vllm-routelog", s(&log), "--num-experts", "4", "-o", s(&out)]);
    assert!(msg.contains("1 layer x 6 tokens"), "{msg}");
    assert!(msg.contains("2 sequences, 4 engine steps"), "{msg}");
    assert!(
        msg.contains(
            "dropped 3 tokens (3 records): warm-up batches; rows 6..9 (lines 8-10 of each file; engine step 3)"
        ),
        "{msg}"
    );
    assert!(msg.contains("note: engine run starts at row 6"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 sequences"), "{text}");
    ok(&["replay", s(&out), "--policy", "lru", "--cap", "2", "--warmup", "0", "--reset-at-sequence", "--json"]);

    let msg =
        ok(&["import", "vllm-routelog", s(&log), "--num-experts", "4", "--skip-rows", "3..4,10..11", "-o", s(&out)]);
    assert!(msg.contains("1 layer x 4 tokens"), "{msg}");
    assert!(msg.contains("rows skipped on request (--skip-rows); rows 3..4 (lines 5-5 of each file)"), "{msg}");
    let err = fails(&["import", "vllm-routelog", s(&log), "--num-experts", "4", "--skip-rows", "5-9", "-o", s(&out)]);
    assert!(err.contains("write A..B"), "{err}");
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_reap_frequencies_as_a_count_file_match_the_aggregate() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agg = real.join("reap-agg-dsv4/core_agg.json");
    let from_agg = d.join("bible-agg.json");
    ok(&["stats", "--reap-agg", s(&agg), "--corpus", "bible", "-o", s(&from_agg)]);
    // The bible corpus's `freq`, published alone as {layer: [counts]}.
    let text = std::fs::read_to_string(&agg).unwrap().replace("NaN", "null");
    let root: serde_json::Value = serde_json::from_str(&text).unwrap();
    let counts = d.join("bible-counts.json");
    std::fs::write(&counts, root["bible"]["freq"].to_string()).unwrap();
    let from_counts = d.join("bible-counts-stats.json");
    ok(&["import", "counts", s(&counts), "--top-k", "6", "-o", s(&from_counts)]);
    let (a, b) = (stats_json(&from_agg), stats_json(&from_counts));
    assert_eq!(b["meta"]["layer_ids"], a["meta"]["layer_ids"]);
    for (la, lb) in a["layers"].as_array().unwrap().iter().zip(b["layers"].as_array().unwrap()) {
        assert_eq!((&la["count"], &la["tokens"]), (&lb["count"], &lb["tokens"]));
    }
    // So the frequency keep maps keep the same experts.
    for (st, out) in [(&from_agg, "m1.json"), (&from_counts, "m2.json")] {
        ok(&["keep", s(st), "--metric", "frequency", "--k", "64", "-o", s(&d.join(out))]);
    }
    let (m1, m2) = (stats_json(&d.join("m1.json")), stats_json(&d.join("m2.json")));
    assert_eq!(m1["layers"].as_array().map(Vec::len), Some(43));
    assert_eq!(m1["layers"], m2["layers"]);
}
