//! `moe-offload plan --exec host`: the plan file (kind, both granularities, llama.cpp flags),
//! its tok/s equal to `sweep::plan::hybrid` on the same traces, and refusals.

mod common;

use common::{fails, ok, s, synth};

use serde_json::Value;

const PROFILE: &str = r#"{"name": "hw", "expert_mb": 2.0, "compute_ms": 10.0, "host_gbps": 4.0,
  "host_ms_per_row": 3.0, "host_sync_ms": 0.2, "gpu_gb": 1.0}"#;

/// In `d`: the calibration and held-out traces (3 layers, E = 16, top-2), the profile and the
/// plan's path, `[c, h, hw.json, plan.json]`.
fn inputs(d: &std::path::Path) -> [std::path::PathBuf; 4] {
    let (c, h, p, out) = (d.join("c.safetensors"), d.join("h.safetensors"), d.join("hw.json"), d.join("plan.json"));
    synth(&c, [3, 16, 2, 4, 400], &["--seed", "1"]);
    synth(&h, [3, 16, 2, 4, 300], &["--seed", "2"]);
    std::fs::write(&p, PROFILE).unwrap();
    [c, h, p, out]
}

#[test]
fn plan_exec_host_writes_both_granularities() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let [c, h, p, out] = inputs(d);
    for overlap in ["sequential", "concurrent"] {
        let args = ["plan", "--exec", "host", "--in-sample", s(&c), "--out-of-sample", s(&h), "--profile-file", s(&p)];
        let text = ok(&[&args[..], &["--overlap", overlap, "--kv-gb", "0.01", "-o", s(&out)]].concat());
        assert!(text.contains("per expert:") && text.contains("per layer:"), "{text}");
        let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        assert_eq!(v["kind"], "moe-offload-hybrid-plan");
        assert_eq!(v["overlap"], overlap);
        // the profile's gpu_gb is the budget: 1 GB - 0.01 GB of KV fits every expert (96 x 2 MB)
        assert_eq!(v["gpu_budget_gb"].as_f64(), Some(1.0));
        let counts =
            |g: &str| -> Vec<u64> { v[g]["counts"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect() };
        assert!(counts("per_layer").iter().all(|&n| n == 0 || n == 16));
        let (pe, pl) = (&v["per_expert"], &v["per_layer"]);
        // more freedom never loses where the choice is made: per expert at least per layer in sample
        assert!(pe["in_sample_tok_s"].as_f64().unwrap() >= pl["in_sample_tok_s"].as_f64().unwrap());
        assert!(pe["tok_s"].as_f64().unwrap() >= pe["baseline_tok_s"].as_f64().unwrap());
        let pins = pe["pins"].as_array().unwrap();
        for (l, n) in counts("per_expert").iter().enumerate() {
            assert_eq!(pins[l].as_array().unwrap().len() as u64, *n);
        }
        assert!(v["unmerged_moe_hot_count"].as_str().unwrap().split(',').count() >= 3);
        // Layers 0..2, all traced: flags for the CPU layers, one argument each, and the
        // `--n-cpu-moe` only when the CPU layers are the first ones.
        let f = &v["llama_cpp"]["flags"];
        let cpu: Vec<u64> =
            counts("per_layer").iter().enumerate().filter(|(_, n)| **n == 0).map(|(l, _)| l as u64).collect();
        assert_eq!(f["cpu_blocks"], serde_json::json!(cpu));
        assert_eq!(f["args"].as_array().unwrap().len(), if cpu.is_empty() { 0 } else { 2 }, "{f}");
        let first = cpu.iter().enumerate().all(|(i, &b)| i as u64 == b);
        assert_eq!(f["n_cpu_moe"].as_u64(), (first && !cpu.is_empty()).then_some(cpu.len() as u64), "{f}");
        // The plan exports as it prints.
        let flags = ok(&["export", "llama-cpp", s(&out), "-o", "-"]);
        let args: Vec<&str> = f["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(flags.lines().collect::<Vec<_>>(), args);
    }
    // A preset has no host_gbps; a budget below the KV cache; exec transfer
    let base = ["plan", "--in-sample", s(&c), "--out-of-sample", s(&h), "-o", s(&out)];
    let e = fails(&[&base[..], &["--exec", "host", "--profile", "reference", "--gpu-budget-gb", "1"]].concat());
    assert!(e.contains("host_gbps"), "{e}");
    let e = fails(
        &[&base[..], &["--exec", "host", "--profile-file", s(&p), "--gpu-budget-gb", "1", "--kv-gb", "2"]].concat(),
    );
    assert!(e.contains("KV cache"), "{e}");
    let e = fails(&[&base[..], &["--exec", "transfer", "--profile-file", s(&p)]].concat());
    assert!(e.contains("exec host"), "{e}");
    // The cache plan's flags are refused, not ignored; the file is left alone.
    std::fs::remove_file(&out).ok();
    let host = [&base[..], &["--exec", "host", "--profile-file", s(&p)]].concat();
    for (extra, named) in [
        (&["--budget-gb", "3"][..], "--budget-gb is not read by plan --exec host (the GPU budget is --gpu-budget-gb)"),
        (&["--pinned-gb", "1"][..], "--pinned-gb is not read"),
        (&["--policy", "fifo"][..], "--policy is not read"),
        (&["--variants", "full,frequency@4"][..], "--variants is not read"),
        (&["--pin-counts", "2"][..], "--pin-counts is not read"),
        (&["--max-slot-replacement", "0.1"][..], "--max-slot-replacement is not read"),
    ] {
        let e = fails(&[&host[..], extra].concat());
        assert!(e.contains(named), "{extra:?}: {e}");
        assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    }
}

#[test]
fn a_hybrid_plan_replays_to_its_own_figure_and_is_chosen_in_sample() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let [c, h, p, out] = inputs(d);
    // 0.02 GB: 10 experts of 2 MB, fewer than the 48 of the model.
    let args = ["plan", "--exec", "host", "--in-sample", s(&c), "--out-of-sample", s(&h), "--profile-file", s(&p)];
    ok(&[&args[..], &["--gpu-budget-gb", "0.02", "--warmup", "16", "-o", s(&out)]].concat());
    let v: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let figure = |trace: &std::path::Path| {
        let r = ok(&[
            "replay",
            s(trace),
            "--policy",
            "lru",
            "--pin",
            s(&out),
            "--exec",
            "host",
            "--cap",
            "0",
            "--warmup",
            "16",
            "--profile-file",
            s(&p),
            "--json",
        ]);
        serde_json::from_str::<Value>(&r).unwrap()["cost"]["tok_s"].as_f64().unwrap()
    };
    // `replay --pin plan.json --exec host` gives the plan's out-of-sample figure on the held-out
    // trace, and its in-sample figure, the one it was chosen by, on the calibration trace.
    let pe = &v["per_expert"];
    let (held_out, inside) = (figure(&h), figure(&c));
    assert!((held_out - pe["tok_s"].as_f64().unwrap()).abs() < 1e-9 * held_out, "{held_out} {pe}");
    assert!((inside - pe["in_sample_tok_s"].as_f64().unwrap()).abs() < 1e-9 * inside, "{inside} {pe}");
    // A hybrid plan of another model's layers is refused by name.
    let other = d.join("o.safetensors");
    synth(&other, [2, 16, 2, 4, 50], &["--seed", "3"]);
    let e = fails(&[
        "replay",
        s(&other),
        "--policy",
        "lru",
        "--pin",
        s(&out),
        "--exec",
        "host",
        "--cap",
        "0",
        "--profile-file",
        s(&p),
    ]);
    assert!(e.contains("a hybrid plan for layers [0, 1, 2]; the trace has layers [0, 1]"), "{e}");
}
