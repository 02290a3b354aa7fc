//! `replay` with the deployment flags (SEMANTICS.md §9–§11): `--pin`, `--cap 0`, `--tier2`,
//! `--served`, `--batch`, the cost flags, and the refusals.

mod common;

use common::{fails, json, ok, refs, s, synth};

#[test]
fn pins_tier2_and_batch_on_a_synthetic_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &["--sequences", "8"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let pin = dir.path().join("pin.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", s(&pin)]);
    let t = s(&trace);
    let plain = json(&["replay", t, "--policy", "lru", "--cap", "4", "--json"]);
    // The existing fields stay; the new ones describe a plain replay.
    for key in ["tokens", "picks", "hits", "misses", "forced_misses", "layer_misses", "misses_per_token"] {
        assert!(plain.get(key).is_some(), "{key}");
    }
    assert_eq!((plain["pinned_hits"].as_u64(), plain["t2_hits"].as_u64()), (Some(0), Some(0)));
    assert_eq!(plain["steps"], plain["tokens"]);
    assert_eq!(plain["storage_reads"], plain["misses"]);
    // B = 1 re-batching is the plain replay.
    assert_eq!(plain["lookup_hit_rate"], plain["hit_rate"]);
    let b1 = json(&["replay", t, "--policy", "lru", "--cap", "4", "--batch", "1", "--json"]);
    for key in ["tokens", "picks", "hits", "misses", "layer_misses"] {
        assert_eq!(b1[key], plain[key], "{key}");
    }
    // Pins: 4 per layer, counted in hits; with cap 0 every unpinned pick is a miss.
    let pinned = json(&["replay", t, "--policy", "lru", "--cap", "4", "--pin", s(&pin), "--json"]);
    assert_eq!(pinned["layer_pins"], serde_json::json!([4, 4]));
    let ph = pinned["pinned_hits"].as_u64().unwrap();
    assert!(ph > 0 && ph <= pinned["hits"].as_u64().unwrap());
    assert!(pinned["misses"].as_u64() < plain["misses"].as_u64());
    let stream = json(&["replay", t, "--policy", "lru", "--cap", "0", "--pin", s(&pin), "--json"]);
    assert_eq!(stream["hits"], stream["pinned_hits"]);
    assert_eq!(
        stream["hits"].as_u64().unwrap() + stream["misses"].as_u64().unwrap(),
        stream["picks"].as_u64().unwrap()
    );
    // Tier 2: every tier-1 miss is a tier-2 hit or a storage read; misses keep their meaning.
    let tiered =
        json(&["replay", t, "--policy", "lru", "--cap", "4", "--tier2", "lru:8", "--link-gbps", "25", "--json"]);
    assert_eq!(tiered["misses"], plain["misses"]);
    let (h2, reads) = (tiered["t2_hits"].as_u64().unwrap(), tiered["storage_reads"].as_u64().unwrap());
    assert_eq!(h2 + reads, plain["misses"].as_u64().unwrap());
    assert!(h2 > 0);
    assert_eq!(tiered["cost"]["link_gbps"], 25.0);
    // More tier-2 hits cost less than storage reads: tok/s rises.
    let tok_s = |v: &serde_json::Value| v["cost"]["at"][0]["tok_s"].as_f64().unwrap();
    assert!(tok_s(&tiered) > tok_s(&plain));
    // Batches: steps of up to 4 rows.
    let b4 =
        json(&["replay", t, "--policy", "lru", "--cap", "4", "--batch", "4", "--compute-ms-per-step", "30", "--json"]);
    assert_eq!(b4["rows"], plain["tokens"]);
    assert!(b4["steps"].as_u64().unwrap() * 4 >= b4["rows"].as_u64().unwrap());
    assert_eq!(b4["schedule"], "batch:4");
    assert_eq!(b4["cost"]["compute_ms_per_step"], 30.0);
    // Served: hits and misses per (step, expert), picks per row.
    let (h, m) = (b4["hits"].as_u64().unwrap(), b4["misses"].as_u64().unwrap());
    assert!(h + m < b4["picks"].as_u64().unwrap());
    assert_eq!(b4["lookup_hit_rate"].as_f64().unwrap(), h as f64 / (h + m) as f64);
    // The table says so beside §5's hit rate; a per-token deployment has no such line.
    let table = ok(&["replay", t, "--policy", "lru", "--cap", "4", "--batch", "4"]);
    let said = format!("lookup hit rate {:.4} (hits / (hits + misses)", h as f64 / (h + m) as f64);
    assert!(table.contains(&said), "{table}");
    assert!(!ok(&["replay", t, "--policy", "lru", "--cap", "4", "--pin", s(&pin)]).contains("lookup hit rate"));
    // mrc --pin: the lru curve of the unpinned stream, equal to replay --pin at each cap.
    let curve = dir.path().join("mrc.json");
    ok(&["mrc", t, "--pin", s(&pin), "--caps", "4..6", "-o", s(&curve)]);
    let c: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&curve).unwrap()).unwrap();
    assert_eq!(c["layer_pins"], serde_json::json!([4, 4]));
    for (i, cap) in ["4", "5", "6"].iter().enumerate() {
        let r = json(&["replay", t, "--policy", "lru", "--cap", cap, "--pin", s(&pin), "--json"]);
        for l in 0..2 {
            assert_eq!(c["layers"][l]["misses"][i], r["layer_misses"][l], "cap {cap} layer {l}");
        }
    }
    let e = fails(&["mrc", t, "--pin", s(&pin), "--policy", "fifo", "-o", s(&curve)]);
    assert!(e.contains("one-pass lru curve"), "{e}");
}

#[test]
fn deployment_flags_that_do_not_apply_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [1, 16, 2, 4, 200], &[]);
    let t = s(&trace);
    let check = |extra: &[&str], needle: &str| {
        let mut args = vec!["replay", t, "--policy", "lru", "--cap", "4"];
        args.extend(extra);
        let e = fails(&args);
        assert!(e.contains(needle), "{extra:?}: {e}");
    };
    check(&["--served"], "no step_offsets");
    check(&["--batch", "0"], "0 is not a whole number >= 1");
    check(&["--served", "--batch", "2"], "cannot be used with");
    check(&["--tier2", "near_pick:8"], "tier 2 takes lru, fifo, lfu, belady, perfect_lfu or lfru");
    check(&["--tier2", "lru"], "expected POLICY:CAP");
    check(&["--tier2", "lru:1"], "tier2 cap");
    check(&["--link-gbps", "10"], "applies only with --tier2");
    check(&["--compute-ms-per-step", "10"], "applies only with --served, --batch or --exec host");
    check(&["--tier2", "lru:4", "--semantics", "sequential"], "k-way only");
    // A cap between 0 and k_used is still refused.
    let e = fails(&["replay", t, "--policy", "lru", "--cap", "1", "--tier2", "lru:4"]);
    assert!(e.contains("below k_used"), "{e}");
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn served_qwen_replay() {
    let real = real_data::dir().join("vllm-routelog-qwen15moe");
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("qwen.safetensors");
    let files: Vec<String> =
        [0, 8, 12, 18, 23].iter().map(|l| format!("{}/moe_layer{l}.jsonl", real.display())).collect();
    let mut args = vec!["import", "vllm-routelog"];
    args.extend(files.iter().map(String::as_str));
    args.extend(["--num-experts", "60", "-o", s(&trace)]);
    ok(&args);
    let v = json(&["replay", s(&trace), "--policy", "lru", "--cap", "16", "--served", "--json"]);
    // 129 steps, the first (65 rows from token 0) inside the warmup.
    assert_eq!((v["steps"].as_u64(), v["rows"].as_u64()), (Some(128), Some(4357 - 65)));
    assert_eq!(v["tokens"], v["rows"]);
    // One load serves every row of a step: far fewer misses than picks.
    assert!(v["hits"].as_u64().unwrap() + v["misses"].as_u64().unwrap() < v["picks"].as_u64().unwrap());
    let per_token = json(&["replay", s(&trace), "--policy", "lru", "--cap", "16", "--json"]);
    assert!(v["misses"].as_u64() < per_token["misses"].as_u64());
}

#[test]
fn plan_with_pin_counts_chooses_pins_and_caps_under_one_budget() {
    let dir = tempfile::tempdir().unwrap();
    let (calib, held) = (dir.path().join("c.safetensors"), dir.path().join("h.safetensors"));
    synth(&calib, [3, 16, 2, 4, 600], &["--seed", "1"]);
    synth(&held, [3, 16, 2, 4, 400], &["--seed", "2"]);
    let plan = dir.path().join("plan.json");
    // 30 slots of the reference profile's 1.3824 MB.
    let budget = format!("{}", 30.0 * 1.3824 / 1000.0);
    // `plan` on the two traces at that budget, with `extra` flags.
    let plan_with = |extra: &[&str]| -> Vec<String> {
        let fixed = ["plan", "--in-sample", s(&calib), "--out-of-sample", s(&held), "--budget-gb", &budget];
        fixed.iter().chain(extra).map(ToString::to_string).collect()
    };
    // A count above E = 16 is refused naming it (it was accepted).
    let e = fails(&refs(&plan_with(&["--profile", "reference", "--pin-counts", "2,17", "-o", s(&plan)])));
    assert!(e.contains("--pin-counts: 17 is more than the 16 experts of a layer"), "{e}");
    assert!(!plan.exists());
    let out = ok(&refs(&plan_with(&["--profile", "reference", "--pin-counts", "2,4", "-o", s(&plan)])));
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let p = &v["pinned"]["plan"];
    let counts: Vec<u64> = p["pin_counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(counts.len(), 3);
    assert!(counts.iter().all(|c| [0, 2, 4].contains(c)), "{counts:?}");
    let caps: Vec<u64> = p["caps"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert!(caps.iter().all(|&c| c >= 2));
    assert!(counts.iter().sum::<u64>() + caps.iter().sum::<u64>() <= 30);
    // No pins is one of the options: the pinned plan is never worse in sample.
    let plain = v["chosen"]["plan"]["in_sample_misses_per_token"].as_f64().unwrap();
    assert!(p["in_sample_misses_per_token"].as_f64().unwrap() <= plain);
    let list = counts.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    assert_eq!(v["pinned"]["moe_hot_count"], list.as_str());
    assert!(out.contains(&format!("hot counts per model layer: {list} (`--moe-hot-count` of unmerged")), "{out}");
    // llama.cpp's flags from this plan carry the same hot counts on request (the synthetic layers
    // are 0..3, so the list of model layers is the plan's); `-ot` names the layers whose pins +
    // cache hold every kept expert.
    let flags = ok(&["export", "llama-cpp", s(&plan), "-o", "-", "--unmerged-hot-count"]);
    assert_eq!(flags.lines().take(2).collect::<Vec<_>>(), ["--moe-hot-count", list.as_str()], "{flags}");
    let kept: Vec<usize> =
        v["pinned"]["keep_map"]["layers"].as_array().unwrap().iter().map(|l| l.as_array().unwrap().len()).collect();
    let whole: Vec<String> = (0..3)
        .filter(|&l| (counts[l] + caps[l]) as usize >= kept[l])
        .map(|l| v["pinned"]["keep_map"]["layer_ids"][l].to_string())
        .collect();
    assert_eq!(
        flags.lines().nth(3).map(str::to_string),
        (!whole.is_empty()).then(|| format!("blk\\.({}){}=CUDA0", whole.join("|"), sweep::plan::llama::EXPS_REGEX))
    );
    // The plan replayed as its pinned plan (its pins, its caps, its keep map) gives its figure on
    // the held-out trace; the pins are the plan's, not its keep map.
    let replayed = json(&[
        "replay",
        s(&held),
        "--policy",
        "lru",
        "--pin",
        s(&plan),
        "--layer-caps",
        s(&plan),
        "--keep",
        s(&plan),
        "--json",
    ]);
    let pins: Vec<u64> = replayed["layer_pins"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).collect();
    assert_eq!(pins, counts);
    let mpt = replayed["misses_per_token"].as_f64().unwrap();
    assert!((mpt - p["out_of_sample_misses_per_token"].as_f64().unwrap()).abs() < 1e-9, "{mpt} vs {p}");
    // A plan made without --pin-counts pins nothing: refused as a pin map.
    let unpinned = dir.path().join("unpinned.json");
    ok(&refs(&plan_with(&["--profile", "reference", "-o", s(&unpinned)])));
    let e = fails(&["replay", s(&held), "--policy", "lru", "--cap", "4", "--pin", s(&unpinned), "--json"]);
    assert!(e.contains("without --pin-counts pins nothing"), "{e}");
    let e = fails(&refs(&plan_with(&["--policy", "fifo", "--pin-counts", "2", "-o", s(&plan)])));
    assert!(e.contains("one-pass lru curve"), "{e}");
}

#[test]
fn sweep_with_deployment_axes_and_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let (calib, held) = (dir.path().join("c.safetensors"), dir.path().join("h.safetensors"));
    synth(&calib, [2, 16, 2, 4, 500], &["--seed", "1", "--sequences", "10"]);
    synth(&held, [2, 16, 2, 4, 400], &["--seed", "2", "--sequences", "8"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&calib), "-o", s(&stats)]);
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", s(&dir.path().join("hot4.json"))]);
    let grid = serde_json::json!({
        "traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
        "variants": ["full"],
        "blocks": [
            {"policies": ["lru"], "cap": [8], "batch": [null, 2, 4]},
            {"policies": ["lru"], "cap": [4], "pin": [null, "hot4.json"], "tier2": [null, "lru:8"]}
        ]
    });
    let g = dir.path().join("grid.json");
    std::fs::write(&g, grid.to_string()).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&g), "-o", s(&out)]);
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let keys: Vec<&str> = results["rows"].as_array().unwrap().iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert!(keys.contains(&"full/lru/0/0/4/2/pin:hot4/t2:lru:8"), "{keys:?}");
    assert!(keys.contains(&"full/lru/0/0/8/2/batch:4"), "{keys:?}");
    let html = dir.path().join("report.html");
    ok(&["report", s(&out), "-o", s(&html)]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Misses per token against the batch size B"));
    assert!(page.contains("Pinned, cached and tiered at 8 experts of fast memory per layer"), "pins 4 + cap 4");
    assert!(page.contains("full/lru/0/0/4/2/pin:hot4/t2:lru:8"));
}

/// A grid's `cap: [0]` without pins is what `replay --cap 0` is (it was refused with "invalid
/// cap = 0"): every pick misses, with the same counts and tok/s, in a deployed row.
#[test]
fn a_grid_cap_of_zero_without_pins_is_replay_cap_zero() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 300], &["--sequences", "4"]);
    let grid = dir.path().join("grid.json");
    let text = r#"{"traces": {"in_sample": "t.safetensors", "out_of_sample": "t.safetensors"},
      "variants": ["full"], "blocks": [{"policies": ["lru", "fifo"], "cap": [0, 4]}]}"#;
    std::fs::write(&grid, text).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&grid), "-o", s(&out)]);
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let replay = json(&["replay", s(&trace), "--policy", "lru", "--cap", "0", "--json"]);
    let row = rows["rows"].as_array().unwrap().iter().find(|r| r["key"] == "full/lru/0/0/0/2").expect("a cap-0 row");
    assert_eq!(row["counts"]["misses"], replay["misses"]);
    assert_eq!(row["counts"]["hits"], 0);
    assert_eq!(row["cost"][0]["tok_s"], replay["cost"]["at"][0]["tok_s"]);
    assert_eq!(row["deploy"]["storage_reads"], replay["misses"]);
    // The cap-4 rows stay plain rows.
    let plain = rows["rows"].as_array().unwrap().iter().find(|r| r["key"] == "full/lru/0/0/4/2").unwrap();
    assert!(plain.get("deploy").is_none(), "{plain}");
}
