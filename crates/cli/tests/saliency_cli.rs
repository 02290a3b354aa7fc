//! `moe-offload stats`, `keep` and `retention` end to end: multi-K and budget keep maps, the
//! retention table and JSON on a trace and on statistics, REAP aggregate files, refusals, real data.

mod common;

use common::{fails, json, ok, s, synth};

use std::path::{Path, PathBuf};

/// The rows of `retention --json` (its `maps`), after checking the document's kind.
fn retention_json(args: &[&str]) -> serde_json::Value {
    let mut v = json(args);
    assert_eq!(v["kind"], "moe-offload-retention", "{args:?}");
    v["maps"].take()
}

/// A synthetic trace (2 layers, 16 experts, top-2, gates and norms) and its statistics.
fn synth_with_stats(dir: &Path, name: &str, seed: &str) -> (PathBuf, PathBuf) {
    let trace = dir.join(format!("{name}.safetensors"));
    let stats = dir.join(format!("{name}.json"));
    synth(&trace, [2, 16, 2, 4, 600], &["--seed", seed, "--norms"]);
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    (trace, stats)
}

#[test]
fn multi_k_budget_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let (_, calib) = synth_with_stats(dir.path(), "calib", "1");
    let (held_trace, held_stats) = synth_with_stats(dir.path(), "held", "2");

    // several K: a directory of `<label>.json`
    let maps = dir.path().join("maps");
    ok(&["keep", s(&calib), "--metric", "frequency", "--k", "4,8", "-o", s(&maps)]);
    ok(&["keep", s(&calib), "--metric", "hybrid", "--hybrid-base", "frequency,gate_sum", "--k", "4,8", "-o", s(&maps)]);
    for f in ["frequency@4", "frequency@8", "hybrid@4", "hybrid@8"] {
        assert!(maps.join(format!("{f}.json")).is_file(), "{f}");
    }
    // one K: the file itself
    let one = dir.path().join("reap4.json");
    ok(&["keep", s(&calib), "--metric", "reap", "--k", "4", "-o", s(&one)]);
    // one K into a path written as a directory that does not exist yet
    let new_dir = format!("{}/", dir.path().join("new").display());
    ok(&["keep", s(&calib), "--metric", "reap", "--k", "4", "-o", &new_dir]);
    assert!(dir.path().join("new/reap@4.json").is_file());
    // a global budget: 2 layers x 6 = 12 experts, floor 2
    let out = ok(&["keep", s(&calib), "--metric", "l2_sum", "--budget", "12,20", "--floor", "2", "-o", s(&maps)]);
    assert!(out.contains("l2_sum@budget12"), "{out}");
    let b: serde_json::Value =
        serde_json::from_slice(&std::fs::read(maps.join("l2_sum@budget12.json")).unwrap()).unwrap();
    assert_eq!(b["budget"]["total"], 12);
    assert_eq!(b["budget"]["floor"], 2);
    assert_eq!(b["budget"]["scale"], "share");
    let sizes: Vec<usize> = b["layers"].as_array().unwrap().iter().map(|l| l.as_array().unwrap().len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 12);
    assert!(sizes.iter().all(|&n| n >= 2));

    // retention on the held-out trace: prob_retention is available; `full` retains everything
    let f4 = maps.join("frequency@4.json");
    let f8 = maps.join("frequency@8.json");
    let bud = maps.join("l2_sum@budget12.json");
    let v = retention_json(&["retention", s(&f4), s(&f8), s(&bud), "full", "--heldout", s(&held_trace), "--json"]);
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 4);
    let labels: Vec<&str> = rows.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["frequency@4", "frequency@8", "l2_sum@budget12", "full"]);
    for r in rows {
        assert!(r["mean"]["prob_retention"].is_number());
        assert_eq!(r["per_layer"].as_array().unwrap().len(), 2);
    }
    let full = &rows[3];
    for key in ["reap_retention", "gate_retention", "prob_retention"] {
        assert_eq!(full["min"][key], 1.0, "{key}");
    }
    assert_eq!(full["mean"]["slot_replacement"], 0.0);
    // more experts kept, less replaced (nesting)
    let rep = |r: &serde_json::Value| r["mean"]["slot_replacement"].as_f64().unwrap();
    assert!(rep(&rows[1]) <= rep(&rows[0]));

    // the same maps on the held-out statistics: the same mass figures, no prob_retention
    let w = retention_json(&["retention", s(&f4), "--heldout", s(&held_stats), "--json"]);
    assert!(w[0]["mean"]["prob_retention"].is_null());
    assert_eq!(w[0]["mean"]["reap_retention"], rows[0]["mean"]["reap_retention"]);
    assert_eq!(w[0]["mean"]["slot_replacement"], rows[0]["mean"]["slot_replacement"]);
    // held-out statistics without a .json extension are detected by content
    let renamed = dir.path().join("held.stats");
    std::fs::copy(&held_stats, &renamed).unwrap();
    let w2 = retention_json(&["retention", s(&f4), "--heldout", s(&renamed), "--json"]);
    assert_eq!(w2[0]["mean"], w[0]["mean"]);

    // the table: one row per map, REAP retention column, per-layer tables on request
    let t = ok(&["retention", s(&f4), s(&f8), "--heldout", s(&held_trace), "--per-layer"]);
    assert!(t.contains("reap_retention mean") && t.contains("frequency@8"), "{t}");
    assert!(t.contains("prob_retention min"), "{t}");
}

#[test]
fn refusals_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, calib) = synth_with_stats(dir.path(), "calib", "3");
    let maps = dir.path().join("maps");
    // K = 99 > E: nothing written, not even the K = 4 map before it
    let err = fails(&["keep", s(&calib), "--metric", "frequency", "--k", "4,99", "-o", s(&maps)]);
    assert!(err.contains("K = 99"), "{err}");
    assert!(!maps.exists());
    let err = fails(&["keep", s(&calib), "--metric", "frequency", "--budget", "3", "-o", s(&maps)]);
    assert!(err.contains("floor"), "{err}");
    // Neither --k nor --budget: the message offers both.
    let err = fails(&["keep", s(&calib), "--metric", "frequency", "-o", s(&maps)]);
    assert!(err.contains("--k <K>|--budget <BUDGET>"), "{err}");
    let err = fails(&["keep", s(&calib), "--metric", "frequency", "--k", "4", "--budget", "8", "-o", s(&maps)]);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = fails(&["keep", s(&calib), "--metric", "reap", "--hybrid-base", "reap", "--k", "4", "-o", s(&maps)]);
    assert!(err.contains("--hybrid-base"), "{err}");
    let err = fails(&["keep", s(&calib), "--metric", "frequency", "--k", "4", "--floor", "2", "-o", s(&maps)]);
    assert!(err.contains("--floor and --budget-scale apply to --budget maps only"), "{err}");
    // a negative λ reaches the replay's own check (not taken for an unknown flag)
    let err = fails(&["replay", s(&trace), "--policy", "lru", "--cap", "4", "--lambda", "-1"]);
    assert!(err.contains("invalid lambda = -1"), "{err}");
    // a map for another shape
    let other = dir.path().join("other.safetensors");
    synth(&other, [3, 16, 2, 4, 50], &[]);
    let m = dir.path().join("m.json");
    ok(&["keep", s(&calib), "--metric", "frequency", "--k", "4", "-o", s(&m)]);
    let err = fails(&["retention", s(&m), "--heldout", s(&other)]);
    assert!(err.contains("layer"), "{err}");
    // -o naming an input (the same file by another path too) is refused and the input kept
    let before = std::fs::read(&trace).unwrap();
    let err = fails(&["stats", s(&trace), "-o", s(&dir.path().join(".").join("calib.safetensors"))]);
    assert!(err.contains("is an input of this command"), "{err}");
    assert_eq!(std::fs::read(&trace).unwrap(), before);
    let err = fails(&["keep", s(&m), "--metric", "frequency", "--k", "4", "-o", s(&m)]);
    assert!(err.contains("is an input of this command"), "{err}");
    let err = fails(&["export", "keep-set", s(&m), "-o", s(&m)]);
    assert!(err.contains("is an input of this command"), "{err}");
    // the wrong kind of file is named: statistics as a trace, a keep map as statistics
    let err = fails(&["stats", s(&calib), "-o", s(&dir.path().join("x.json"))]);
    assert!(err.contains("the file is JSON text"), "{err}");
    let err = fails(&["keep", s(&m), "--metric", "frequency", "--k", "4", "-o", s(&dir.path().join("y.json"))]);
    assert!(err.contains("a keep map (from `moe-offload keep`), not statistics JSON"), "{err}");
}

#[test]
fn reap_aggregate_stats() {
    let dir = tempfile::tempdir().unwrap();
    let agg = dir.path().join("agg.json");
    std::fs::write(
        &agg,
        r#"{"a": {"n": 1, "tok": 2, "freq": {"0": [2, 1, 1], "1": [2, 1, 1]}, "reap": {"0": [1.0, 2.0, 0.0], "1": [1.0, 0.5, 3.0]}},
            "b": {"n": 1, "tok": 2, "freq": {"0": [2, 2, 0], "1": [1, 1, 2]}, "reap": {"0": [NaN, 2.0, 0.0], "1": [1.0, 1.0, 3.0]}}}"#,
    )
    .unwrap();
    let list = ok(&["stats", "--reap-agg", s(&agg), "--list-corpora"]);
    assert!(list.contains('a') && list.contains('b'), "{list}");
    let a = dir.path().join("a.json");
    let out = ok(&["stats", "--reap-agg", s(&agg), "--corpus", "a", "-o", s(&a)]);
    assert!(out.contains("top-k 2"), "inferred from the counts: {out}");
    // A --top-k the counts contradict (they sum to 4 = 2 tokens x 2 in both layers) would write
    // statistics that the audit rejects: refused; the one they imply is accepted.
    // (3, not more: a top-k above the 3 experts is refused as such.)
    let err = fails(&["stats", "--reap-agg", s(&agg), "--corpus", "a", "--top-k", "3", "-o", s(&a)]);
    assert!(err.contains("--top-k 3 disagrees") && err.contains("pass 2"), "{err}");
    let err = fails(&["stats", "--reap-agg", s(&agg), "--corpus", "a", "--top-k", "4", "-o", s(&a)]);
    assert!(err.contains("4 is more than the 3 experts"), "{err}");
    ok(&["stats", "--reap-agg", s(&agg), "--corpus", "a", "--top-k", "2", "-o", s(&a)]);
    let b = dir.path().join("b.json");
    let out = ok(&["stats", "--reap-agg", s(&agg), "--corpus", "b", "-o", s(&b)]);
    assert!(out.contains("reap_sum dropped") && out.contains("--non-finite-reap mask"), "{out}");
    ok(&["stats", "--reap-agg", s(&agg), "--corpus", "b", "--non-finite-reap", "mask", "-o", s(&b)]);
    let map = dir.path().join("l2.json");
    ok(&["keep", s(&a), "--metric", "l2_sum", "--k", "1", "-o", s(&map)]);
    // layer 0 keeps expert 1 (2.0 of the known 2.0), layer 1 expert 2 (3 of 5)
    let v = retention_json(&["retention", s(&map), "--heldout", s(&b), "--json"]);
    assert_eq!(v[0]["per_layer"][0]["figures"]["reap_retention"], 1.0);
    assert_eq!(v[0]["per_layer"][0]["figures"]["reap_excluded_slots"], 2);
    assert_eq!(v[0]["per_layer"][1]["figures"]["reap_retention"], 0.6);
    let t = ok(&["retention", s(&map), "--heldout", s(&b)]);
    assert!(t.contains("leaves out 1 (layer, expert) entries"), "{t}");
    // ranking by REAP on masked statistics is refused, naming the statistic
    let err = fails(&["keep", s(&b), "--metric", "reap", "--k", "1", "-o", s(&map)]);
    assert!(err.contains("reap_sum") && err.contains("unknown"), "{err}");
    let err = fails(&["stats", "--reap-agg", s(&agg), "--corpus", "zzz", "-o", s(&b)]);
    assert!(err.contains("zzz"), "{err}");
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_reap_aggregate_and_esft_fold() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let agg = real.join("reap-agg-dsv4/core_agg.json");
    let bible = d.join("bible.json");
    let quran = d.join("quran.json");
    ok(&["stats", "--reap-agg", s(&agg), "--corpus", "bible", "-o", s(&bible)]);
    ok(&["stats", "--reap-agg", s(&agg), "--corpus", "quran", "--non-finite-reap", "mask", "-o", s(&quran)]);
    let maps = d.join("maps");
    for m in ["reap", "l2_sum", "frequency", "hybrid"] {
        ok(&["keep", s(&bible), "--metric", m, "--k", "128,160", "-o", s(&maps)]);
    }
    let files: Vec<String> = ["reap", "l2_sum", "frequency", "hybrid"]
        .iter()
        .map(|m| maps.join(format!("{m}@128.json")).display().to_string())
        .collect();
    let mut args = vec!["retention"];
    args.extend(files.iter().map(String::as_str));
    args.extend(["--heldout", s(&quran), "--json"]);
    let v = retention_json(&args);
    let mean: Vec<f64> = v.as_array().unwrap().iter().map(|r| r["mean"]["reap_retention"].as_f64().unwrap()).collect();
    assert!(mean[1] > mean[0] && mean[1] > mean[2] && mean[1] > mean[3], "l2_sum retains the most: {mean:?}");
    assert_eq!(v[0]["mean"]["reap_excluded_experts"], 335);

    // ESFT: calibrate on intent, law, summary; hold out translation
    let esft = real.join("esft-dsv2lite");
    let cal = d.join("cal.safetensors");
    let held = d.join("held.safetensors");
    ok(&["import", "esft", s(&esft), "--domains", "intent,law,summary", "-o", s(&cal)]);
    ok(&["import", "esft", s(&esft), "--domains", "translation", "-o", s(&held)]);
    let st = d.join("cal.json");
    ok(&["stats", s(&cal), "-o", s(&st)]);
    ok(&["keep", s(&st), "--metric", "gate_sum", "--k", "32,48", "-o", s(&maps)]);
    let v = retention_json(&[
        "retention",
        s(&maps.join("gate_sum@32.json")),
        s(&maps.join("gate_sum@48.json")),
        "--heldout",
        s(&held),
        "--json",
    ]);
    let p = |i: usize| v[i]["mean"]["prob_retention"].as_f64().unwrap();
    assert!(p(0) > 0.5 && p(1) > p(0) && p(1) < 1.0, "{} {}", p(0), p(1));
    assert!(v[0]["mean"]["reap_retention"].is_null(), "ESFT has no output norms");
}
