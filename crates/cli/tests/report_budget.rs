//! The report's memory-budget section (`report/budget.rs`) on a small sweep with pins: memory
//! per configuration and the best configuration at each memory, checked by hand against
//! `results.json`.

mod common;

use common::{ok, s, synth};

use serde_json::Value;

/// tok/s of the cost model (SEMANTICS.md §6) for the test profile: 10 ms compute, 10 MB experts.
fn tok_s(misses_per_token: f64, bw: f64) -> f64 {
    1.0 / (0.010 + misses_per_token * 10.0 / (1000.0 * bw))
}

#[test]
fn tok_s_against_memory_counts_caches_and_pins() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(&d.join("c.safetensors"), [2, 8, 2, 4, 300], &["--seed", "1"]);
    synth(&d.join("h.safetensors"), [2, 8, 2, 4, 300], &["--seed", "2"]);
    ok(&["stats", s(&d.join("c.safetensors")), "-o", s(&d.join("stats.json"))]);
    // Pins: the 2 most used experts of each layer.
    ok(&["keep", s(&d.join("stats.json")), "--metric", "frequency", "--k", "2", "-o", s(&d.join("hot2.json"))]);
    std::fs::write(
        d.join("grid.json"),
        r#"{"name": "budget", "traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
            "variants": ["full"], "warmup": 0,
            "blocks": [{"policies": ["lru", "fifo", "belady"], "cap": [2, 4]},
                       {"policies": ["lru"], "cap": [2], "pin": ["hot2.json"]}],
            "profiles": [{"name": "p10", "expert_mb": 10.0, "compute_ms": 10.0, "bandwidth_gbps": [1.0, 2.0]}]}"#,
    )
    .unwrap();
    let out = d.join("sweep");
    ok(&["sweep", s(&d.join("grid.json")), "-o", s(&out)]);
    let html_path = d.join("report.html");
    ok(&["report", s(&out), "-o", s(&html_path)]);
    let html = std::fs::read_to_string(&html_path).unwrap();
    let budget = &html[html.find("id=\"budget\"").expect("a budget section")..];
    let budget = &budget[..budget.find("</section>").unwrap()];
    assert!(budget.contains("p10: tok/s vs memory budget, best configuration per policy (out of sample)"), "{budget}");
    assert!(budget.contains("tok/s at 1 GB/s (p10)"));

    // Memory in slots over the 2 layers: cap 2 -> 4, cap 4 -> 8, 2 pins + cap 2 -> 8 (0.04 and
    // 0.08 GB of 10 MB experts). At each, the best online row has the fewest misses per token.
    let results: Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let oos: Vec<&Value> =
        results["rows"].as_array().unwrap().iter().filter(|r| r["sample"] == "out_of_sample").collect();
    let mpt = |key: &str| oos.iter().find(|r| r["key"] == key).unwrap()["misses_per_token"].as_f64().unwrap();
    for (gb, slots, keys) in [
        ("0.0400", 4, vec!["full/fifo/0/0/2/2", "full/lru/0/0/2/2"]),
        ("0.0800", 8, vec!["full/fifo/0/0/4/2", "full/lru/0/0/4/2", "full/lru/0/0/2/2/pin:hot2"]),
    ] {
        let mut best = keys.clone();
        best.sort_by(|a, b| mpt(a).total_cmp(&mpt(b)).then(a.cmp(b)));
        let key = best[0];
        let m = mpt(key);
        let row = format!(
            "<tr><td>{gb}</td><td>{slots}</td><td class=\"l\">{key}</td><td>{m:.4}</td><td>{:.2}</td><td>{:.2}</td></tr>",
            tok_s(m, 1.0),
            tok_s(m, 2.0)
        );
        assert!(budget.contains(&row), "missing {row} in {budget}");
    }
    // Belady (an offline oracle) has its line but is never the table's best online configuration.
    assert!(budget.contains("</b> belady</span>"), "{budget}");
    assert!(!budget.contains("<td class=\"l\">full/belady"), "{budget}");
}
