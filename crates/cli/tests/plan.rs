//! `moe-offload mrc` and `moe-offload plan` end to end on small synthetic traces.

mod common;

use common::{fails, ok, s, synth};

use std::path::Path;

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn mrc_and_a_verified_plan() {
    let dir = tempfile::tempdir().unwrap();
    let (calib, held) = (dir.path().join("c.safetensors"), dir.path().join("h.safetensors"));
    for (p, seed) in [(&calib, "1"), (&held, "2")] {
        synth(p, [4, 24, 3, 6, 800], &["--seed", seed]);
    }
    // LRU curve in one pass, a policy curve by replays; both non-increasing, CSV beside.
    let mrc = dir.path().join("mrc.json");
    ok(&["mrc", s(&calib), "-o", s(&mrc)]);
    let c = json(&mrc);
    assert_eq!((c["min_cap"].as_u64(), c["max_cap"].as_u64()), (Some(3), Some(24)));
    for l in c["layers"].as_array().unwrap() {
        let m: Vec<u64> = l["misses"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
        assert_eq!(m.len(), 22);
        assert!(m.windows(2).all(|w| w[0] >= w[1]));
    }
    assert!(dir.path().join("mrc.csv").is_file());
    let lfu = dir.path().join("lfu.json");
    ok(&["mrc", s(&calib), "--policy", "lfu", "--caps", "4..8", "-o", s(&lfu)]);
    assert_eq!(json(&lfu)["layers"][0]["misses"].as_array().unwrap().len(), 5);

    // The CSV beside the output must be neither the output itself nor an input: both refused
    // before any file is written, and the trace is left as it was.
    let csv_out = dir.path().join("m.csv");
    let err = fails(&["mrc", s(&calib), "-o", s(&csv_out)]);
    assert!(err.contains("would be this same file"), "{err}");
    assert!(!csv_out.exists());
    let trace_csv = dir.path().join("t.csv");
    std::fs::copy(&calib, &trace_csv).unwrap();
    let err = fails(&["mrc", s(&trace_csv), "-o", s(&dir.path().join("t.json"))]);
    assert!(err.contains("is an input of this command"), "{err}");
    assert_eq!(std::fs::read(&trace_csv).unwrap(), std::fs::read(&calib).unwrap());
    assert!(!dir.path().join("t.json").exists());

    // 40 slots of 1 MB within a 0.04 GB budget.
    let plan = dir.path().join("plan.json");
    let out = ok(&[
        "plan",
        "--in-sample",
        s(&calib),
        "--out-of-sample",
        s(&held),
        "--variants",
        "full,frequency@16",
        "--budget-gb",
        "0.04",
        "--expert-mb",
        "1",
        "-o",
        s(&plan),
    ]);
    assert!(out.contains("verified by replay"), "{out}");
    let p = json(&plan);
    assert_eq!(p["slots"], 40);
    // The budget flags of `--exec host` are refused on a cache plan, not ignored (issue #55).
    for flag in ["--kv-gb", "--gpu-budget-gb"] {
        let args = ["plan", "--in-sample", s(&calib), "--out-of-sample", s(&held), "--budget-gb", "0.04"];
        let err = fails(&[&args[..], &["--expert-mb", "1", flag, "2", "-o", s(&plan)]].concat());
        assert!(err.contains(flag) && err.contains("--exec"), "{err}");
    }
    let chosen = &p["chosen"]["plan"];
    let caps: Vec<u64> = chosen["caps"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(caps.len(), 4);
    assert!(caps.iter().sum::<u64>() <= 40 && caps.iter().all(|&c| c >= 3));
    assert_eq!(p["chosen"]["replayed"]["in_sample_misses_per_token"], chosen["in_sample_misses_per_token"]);
    // The exact plan is never worse than the uniform one in sample.
    for cand in p["candidates"].as_array().unwrap() {
        let (pl, un) = (&cand["per_layer"], &cand["uniform"]);
        assert!(pl["in_sample_misses_per_token"].as_f64() <= un["in_sample_misses_per_token"].as_f64());
        assert_eq!(un["caps"], serde_json::json!([10, 10, 10, 10]));
    }
    // The plan records what it was made with, and its chosen keep map.
    assert_eq!((p["k_used"].as_u64(), p["warmup"].as_u64()), (Some(3), Some(64)));
    assert_eq!(p["chosen"]["keep_map"]["layers"].as_array().unwrap().len(), 4);
    assert_eq!(p["kind"], "moe-offload-plan");
    // llama.cpp flags from the plan, one argument per line: `-ot` for the layers whose cache
    // holds every kept expert, then `--cpu-moe`; the hot counts of unmerged patches on request,
    // one per model layer.
    let flags = ok(&["export", "llama-cpp", s(&plan), "-o", "-", "--unmerged-hot-count"]);
    let lines: Vec<&str> = flags.lines().collect();
    let ids: Vec<usize> = serde_json::from_value(p["chosen"]["keep_map"]["layer_ids"].clone()).unwrap();
    assert_eq!(lines[0], "--moe-hot-count");
    let hot: Vec<u64> = lines[1].split(',').map(|n| n.parse().unwrap()).collect();
    assert_eq!(hot.len(), ids.iter().max().unwrap() + 1);
    for (l, &id) in ids.iter().enumerate() {
        assert_eq!(hot[id], caps[l]);
    }
    let whole: Vec<String> = ids
        .iter()
        .zip(&caps)
        .zip(p["chosen"]["keep_map"]["layers"].as_array().unwrap())
        .filter(|((_, c), kept)| **c as usize >= kept.as_array().unwrap().len())
        .map(|((id, _), _)| id.to_string())
        .collect();
    let mut want = vec!["--moe-hot-count".to_string(), lines[1].to_string()];
    if !whole.is_empty() {
        want.extend(["-ot".into(), format!("blk\\.({}){}=CUDA0", whole.join("|"), sweep::plan::llama::EXPS_REGEX)]);
    }
    want.push("--cpu-moe".into());
    assert_eq!(lines, want, "{flags}");
    assert_eq!(ok(&["export", "llama-cpp", s(&plan), "-o", "-"]).lines().collect::<Vec<_>>(), want[2..], "{flags}");
    // The plan replays through `replay --keep plan.json --layer-caps plan.json` to the figure it
    // printed (with or without a --cap, which the caps override).
    let replay = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["replay", s(&held), "--policy", "lru", "--layer-caps", s(&plan), "--json"];
        args.extend(extra);
        serde_json::from_str(&ok(&args)).unwrap()
    };
    let r = replay(&["--keep", s(&plan)]);
    assert_eq!(r, replay(&["--keep", s(&plan), "--cap", "3"]));
    assert_eq!(r["misses_per_token"], chosen["out_of_sample_misses_per_token"]);
    // Other settings would not give the plan's figures: refused, naming each and the flags.
    let e =
        fails(&["replay", s(&held), "--policy", "lfu", "--keep", s(&plan), "--layer-caps", s(&plan), "--warmup", "0"]);
    assert!(e.contains("policy lru (here lfu), warmup 64 (here 0)") && e.contains("--policy lru --warmup 64"), "{e}");
    let other = if p["chosen"]["variant"] == "full" { "frequency@16" } else { "full" };
    let map = dir.path().join("other.json");
    if other == "full" {
        let e = fails(&["replay", s(&held), "--policy", "lru", "--layer-caps", s(&plan)]);
        assert!(e.contains("(here full)") && e.contains(&format!("--keep {}", s(&plan))), "{e}");
    } else {
        let stats = dir.path().join("stats.json");
        ok(&["stats", s(&calib), "-o", s(&stats)]);
        ok(&["keep", s(&stats), "--metric", "frequency", "--k", "16", "-o", s(&map)]);
        let e = fails(&["replay", s(&held), "--policy", "lru", "--keep", s(&map), "--layer-caps", s(&plan)]);
        assert!(e.contains("keep map full (here frequency@16)"), "{e}");
    }
    // A plan of another model (other layers) is named as such, before any setting it differs in.
    let other_model = dir.path().join("other-model.safetensors");
    synth(&other_model, [3, 24, 3, 6, 300], &[]);
    let e = fails(&["replay", s(&other_model), "--policy", "lfu", "--layer-caps", s(&plan)]);
    assert!(e.contains("the plan has caps for 4 layers") && e.contains("has 3 MoE layers"), "{e}");
    assert!(!e.contains("here lfu"), "{e}");
    // So would the settings plan leaves at their defaults.
    let e = fails(&[
        "replay",
        s(&held),
        "--policy",
        "lru",
        "--keep",
        s(&plan),
        "--layer-caps",
        s(&plan),
        "--lambda",
        "0.1",
    ]);
    assert!(e.contains("made with lambda 0 (here 0.1)") && e.contains("add --lambda 0"), "{e}");
    // A per-layer cap below k_used = 3 names its layer, with or without --cap.
    for extra in [&[][..], &["--cap", "3"][..]] {
        let mut args = vec!["replay", s(&held), "--policy", "lru", "--layer-caps", "3,3,2,3"];
        args.extend(extra);
        let e = fails(&args);
        assert!(e.contains("the cap of layer 2"), "{extra:?}: {e}");
    }
    // The caps alone, as a list, replay under any settings.
    let caps_list = caps.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    ok(&["replay", s(&held), "--policy", "lfu", "--layer-caps", &caps_list, "--warmup", "0"]);
    let e = fails(&["replay", s(&held), "--policy", "lru", "--json"]);
    assert!(e.contains("--cap"), "{e}");

    // A budget below k_used = 3 experts in each of the 4 layers (12 slots of 1 MB) is refused
    // with the smallest budget that works, which then plans.
    let small = |gb: &'static str| {
        [
            "plan",
            "--in-sample",
            s(&calib),
            "--out-of-sample",
            s(&held),
            "--budget-gb",
            gb,
            "--expert-mb",
            "1",
            "-o",
            s(&plan),
        ]
    };
    // Candidates must be told apart; sizes must be sizes.
    let mut args = small("0.04").to_vec();
    args.extend(["--variants", "full,full"]);
    let e = fails(&args);
    assert!(e.contains("full and full both give the keep map full"), "{e}");
    let mut args = small("0.04").to_vec();
    args.push("--pinned-gb=-0.01");
    assert!(fails(&args).contains("cannot be negative"));
    for mb in ["0", "NaN", "-1"] {
        let mut args = small("0.04").to_vec();
        let flag = format!("--expert-mb={mb}");
        let i = args.iter().position(|a| *a == "--expert-mb").unwrap();
        args.remove(i + 1);
        args[i] = &flag;
        let e = fails(&args);
        let want = format!("--expert-mb {mb}: profile \"reference\": expert_mb: {mb} must be a finite size > 0");
        assert!(e.contains(&want), "{mb}: {e}");
    }
    let e = fails(&small("0.011"));
    assert!(e.contains("11 slots cannot give every layer k_used = 3 experts (12 needed)"), "{e}");
    assert!(
        e.contains("smallest budget that caches k_used experts in every layer is 12 slots: --budget-gb 0.012"),
        "{e}"
    );
    assert!(ok(&small("0.012")).contains("verified by replay"));
}
