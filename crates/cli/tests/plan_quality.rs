//! `moe-offload plan --quality`: measured quality (docs/quality.md) as the floor of a plan.

mod common;

use common::{fails, ok, s, synth};

use std::path::Path;

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

/// A quality document as `python/eval_pruned.py` writes it, for the keep map at `keep`.
fn quality(dir: &Path, name: &str, keep: &Path, kl: f64, ppl_increase: f64) -> std::path::PathBuf {
    let k = json(keep);
    let doc = serde_json::json!({
        "kind": "moe-offload-quality", "format_version": 1, "mode": "replace",
        "keep_map": { "path": s(keep), "label": "x", "sha256": "not-checked", "metric": k["metric"], "k": k["k"],
                      "num_experts": k["num_experts"], "layer_ids": k["layer_ids"], "layers": k["layers"] },
        "ppl_base": 10.0, "ppl_pruned": 10.0 * (1.0 + ppl_increase), "ppl_increase": ppl_increase, "kl": kl,
    });
    let p = dir.join(name);
    std::fs::write(&p, serde_json::to_vec(&doc).unwrap()).unwrap();
    p
}

#[test]
fn measured_kl_and_perplexity_are_floors_and_the_table_shows_them() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (calib, held) = (d.join("c.safetensors"), d.join("h.safetensors"));
    for (p, seed) in [(&calib, "1"), (&held, "2")] {
        synth(p, [4, 24, 3, 6, 800], &["--seed", seed]);
    }
    let stats = d.join("stats.json");
    ok(&["stats", s(&calib), "-o", s(&stats)]);
    let (k16, k8) = (d.join("k16.json"), d.join("k8.json"));
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "16", "-o", s(&k16)]);
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "8", "-o", s(&k8)]);
    let (q16, q8) = (quality(d, "q16.json", &k16, 0.05, 0.02), quality(d, "q8.json", &k8, 0.5, 0.3));
    let plan = d.join("plan.json");
    let base = [
        "plan",
        "--in-sample",
        s(&calib),
        "--out-of-sample",
        s(&held),
        "--budget-gb",
        "0.04",
        "--expert-mb",
        "1",
        "--variants",
        "full,frequency@16,frequency@8,gate_sum@12",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend(extra);
        args.extend(["-o", s(&plan)]);
        let out = ok(&args);
        (out, json(&plan))
    };
    // The plan builds frequency@16 itself (other statistics digest than the file's): matched by the experts kept.
    let (out, p) = run(&["--quality", s(&q16), s(&q8), "--max-kl", "0.1"]);
    let by = |v: &str| p["candidates"].as_array().unwrap().iter().find(|c| c["variant"] == v).unwrap().clone();
    assert_eq!(by("frequency@16")["measured_kl"], 0.05);
    assert_eq!(by("frequency@16")["measured_ppl_increase"], 0.02);
    assert!(by("frequency@16")["excluded"].is_null());
    assert_eq!(by("frequency@8")["excluded"], format!("measured KL 0.5000 exceeds --max-kl 0.1 ({})", s(&q8)));
    assert_eq!(by("gate_sum@12")["excluded"], "no measured quality (--quality) for this keep map");
    assert!(by("full")["excluded"].is_null() && by("full").get("measured_kl").is_none());
    assert!(out.contains("measured quality (--quality) against the per-layer plan's misses"), "{out}");
    assert!(out.lines().any(|l| l.contains("frequency@8") && l.contains("0.5000") && l.contains("exceeds")), "{out}");
    // The perplexity floor alone; without limits the figures are reported and nothing is excluded.
    let (_, p) = run(&["--quality", s(&q16), "--quality", s(&q8), "--max-ppl-increase", "0.01"]);
    let ex: Vec<bool> = p["candidates"].as_array().unwrap().iter().map(|c| c["excluded"].is_null()).collect();
    assert_eq!(ex, [true, false, false, false]);
    let (_, p) = run(&["--quality", s(&q8)]);
    assert!(p["candidates"].as_array().unwrap().iter().all(|c| c["excluded"].is_null()));
    assert_eq!(p["candidates"][2]["measured_kl"], 0.5);
    // Without --quality the plan is what it was: no measured fields.
    let (_, p) = run(&[]);
    assert!(p["candidates"].as_array().unwrap().iter().all(|c| c.get("measured_kl").is_none()));

    // Bad input names the file or the flag.
    let mut args = base.to_vec();
    args.extend(["--max-kl", "0.1", "-o", s(&plan)]);
    assert!(fails(&args).contains("--max-kl and --max-ppl-increase need measured quality"));
    let mut args = base.to_vec();
    args.extend(["--quality", s(&stats), "-o", s(&plan)]);
    let err = fails(&args);
    assert!(err.contains(&format!("--quality {}: kind \"moe-offload-stats\" is not", s(&stats))), "{err}");
    let dup = quality(d, "dup.json", &k8, 0.1, 0.1);
    let mut args = base.to_vec();
    args.extend(["--quality", s(&q8), s(&dup), "-o", s(&plan)]);
    assert!(fails(&args).contains("measure the same keep map"));
}
