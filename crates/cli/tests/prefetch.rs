//! `replay --prefetch`, `--timeline` and `--shuffle` (SEMANTICS.md §12, §13).

mod common;

use common::{fails, json, ok, refs, s, synth};
use serde_json::Value;

/// Counts, derived figures and the timeline of a prefetch replay, beside the plain replay's.
#[test]
fn prefetch_counts_timeline_and_shuffle_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, calib) = (dir.path().join("t.safetensors"), dir.path().join("c.safetensors"));
    synth(&trace, [3, 32, 4, 8, 600], &["--seed", "5"]);
    synth(&calib, [3, 32, 4, 8, 600], &["--seed", "6"]);
    let base = ["replay", s(&trace), "--policy", "lru", "--cap", "8", "--json"];
    let plain = json(&base);
    let mut args = base.to_vec();
    args.extend([
        "--prefetch",
        "coact:3",
        "--calib",
        s(&calib),
        "--timeline",
        "--profile",
        "dsv2-lite-bf16",
        "--bandwidth",
        "3.9",
    ]);
    args.extend(["--shuffle", "7"]);
    let r = json(&args);
    assert_eq!(r["prefetch"], "coact:3");
    assert_eq!(r["tokens"], plain["tokens"]);
    assert_eq!(r["picks"], plain["picks"]);
    assert_eq!(r["plain_misses"], plain["misses"]);
    let (loads, useful, wasted) =
        (r["prefetch_loads"].as_u64().unwrap(), r["useful"].as_u64().unwrap(), r["wasted"].as_u64().unwrap());
    assert!(loads > 0 && useful > 0 && wasted > 0, "{r}");
    assert_eq!(useful + wasted, loads);
    assert_eq!(r["precision"].as_f64().unwrap(), useful as f64 / loads as f64);
    let misses = r["misses"].as_u64().unwrap();
    let saved = plain["misses"].as_u64().unwrap() - misses;
    assert!(saved > 0);
    assert_eq!(r["loads_per_miss_saved"].as_f64().unwrap(), loads as f64 / saved as f64);
    assert_eq!(r["coverage"].as_f64().unwrap(), useful as f64 / (useful + misses) as f64);
    let tokens = r["tokens"].as_u64().unwrap() as f64;
    assert_eq!(r["loads_per_token"].as_f64().unwrap(), (misses + loads) as f64 / tokens);
    assert_eq!(r["expert_mb"].as_f64().unwrap(), 17.301504);
    // Without prefetch the timeline is §6's additive figure, to the last bit.
    assert_eq!(r["tok_s_no_prefetch"], r["additive_tok_s"]);
    let additive = 1.0 / (0.020 + plain["misses_per_token"].as_f64().unwrap() * 17.301504 / 3900.0);
    assert_eq!(r["additive_tok_s"].as_f64().unwrap(), additive);
    assert!(r["tok_s"].as_f64().unwrap() > 0.0 && r["stall_s_per_token"].as_f64().unwrap() >= 0.0);
    assert_eq!(r["shuffle_seed"], 7);
    // Shuffling destroys the locality the synthetic trace has: more misses.
    assert!(r["shuffled"]["misses"].as_u64().unwrap() > misses, "{r}");
    // The table shows the same figures.
    let mut table_args = args.clone();
    table_args.retain(|&x| x != "--json");
    let text = ok(&table_args);
    for figure in ["prefetch_loads", "precision", "coverage", "tok_s", "shuffled misses"] {
        assert!(text.contains(figure), "{figure} missing from:\n{text}");
    }
}

/// oracle with B = k: no demand miss, as many prefetch loads as the plain replay has misses.
#[test]
fn oracle_at_k_moves_every_miss_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 24, 3, 6, 300], &["--seed", "2"]);
    let base = ["replay", s(&trace), "--policy", "lfu", "--cap", "5", "--warmup", "10", "--json"];
    let plain = json(&base);
    let mut args = base.to_vec();
    args.extend(["--prefetch", "oracle:3"]);
    let r = json(&args);
    assert_eq!(r["misses"], 0);
    assert_eq!(r["prefetch_loads"], plain["misses"]);
    assert_eq!(r["wasted"], 0);
    assert_eq!(r["loads_per_miss_saved"], 1.0);
    assert_eq!((r["precision"].as_f64(), r["coverage"].as_f64()), (Some(1.0), Some(1.0)));
    // A budget of 0 prefetches nothing: the ratios are 0/0, null, and the counts are plain.
    let mut args = base.to_vec();
    args.extend(["--prefetch", "oracle:0"]);
    let r = json(&args);
    assert_eq!((r["prefetch_loads"].as_u64(), r["misses"].clone()), (Some(0), plain["misses"].clone()));
    assert!(r["precision"].is_null() && r["loads_per_miss_saved"].is_null(), "{r}");
    assert_eq!(r["coverage"].as_f64(), Some(0.0));
}

/// coact learns from --calib; the refusals name the flag or file at fault.
#[test]
fn coact_calibration_and_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let (trace, calib, other) =
        (dir.path().join("t.safetensors"), dir.path().join("c.safetensors"), dir.path().join("o.safetensors"));
    synth(&trace, [3, 32, 4, 8, 400], &["--seed", "1"]);
    synth(&calib, [3, 32, 4, 8, 400], &["--seed", "2"]);
    synth(&other, [3, 16, 4, 8, 400], &["--seed", "3"]);
    let base = ["replay", s(&trace), "--policy", "lru", "--cap", "8", "--json"];
    let with = |extra: &[&str]| -> Vec<String> { base.iter().chain(extra).map(|x| x.to_string()).collect() };
    let r = json(&refs(&with(&["--prefetch", "coact:4", "--calib", s(&calib)])));
    assert!(r["prefetch_loads"].as_u64().unwrap() > 0 && r["useful"].as_u64().unwrap() > 0, "{r}");
    assert!(fails(&refs(&with(&["--prefetch", "coact:4"]))).contains("--calib TRACE"));
    assert!(fails(&refs(&with(&["--prefetch", "prev_token:4", "--calib", s(&calib)]))).contains("coact"));
    let err = fails(&refs(&with(&["--prefetch", "coact:4", "--calib", s(&other)])));
    assert!(err.contains(s(&other)) && err.contains("experts per layer"), "{err}");
    let err = fails(&refs(&with(&["--prefetch", "lookahead:2"])));
    assert!(err.contains(s(&trace)) && err.contains("lookahead_ids"), "{err}");
    assert!(
        fails(&refs(&with(&["--prefetch", "prev_token:9"]))).contains("budget 9 is larger than the cache capacity 8")
    );
    let belady = ["replay", s(&trace), "--policy", "belady", "--cap", "8", "--prefetch", "oracle:4"];
    assert!(fails(&belady).contains("belady cannot be combined with prefetch"));
    assert!(fails(&refs(&with(&["--prefetch", "next:4"]))).contains("prev_token, coact, lookahead, oracle"));
    assert!(fails(&refs(&with(&["--timeline", "--profile", "gpu9"]))).contains("unknown --profile"));
}

/// A sweep with `prefetch` and `shuffle` axes: keys, the rows' prefetch figures, and the
/// report's prefetch section (precision and tok/s against B, real against shuffled order).
#[test]
fn sweep_with_prefetch_axes_and_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let (calib, held) = (dir.path().join("c.safetensors"), dir.path().join("h.safetensors"));
    synth(&calib, [3, 16, 2, 4, 500], &["--seed", "1"]);
    synth(&held, [3, 16, 2, 4, 400], &["--seed", "2"]);
    let grid = serde_json::json!({
        "traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
        "variants": ["full"],
        "blocks": [
            {"policies": ["lru", "lfu"], "cap": [4], "prefetch": ["none", "coact:1", "coact:2", "oracle:1", "oracle:2"]},
            {"policies": ["lru", "lfu"], "cap": [4], "shuffle": [null, 3]}
        ],
        "profiles": ["dsv2-lite-bf16"]
    });
    let g = dir.path().join("grid.json");
    std::fs::write(&g, grid.to_string()).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&g), "-o", s(&out)]);
    let results: Value = serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rows = results["rows"].as_array().unwrap();
    let row = |key: &str| rows.iter().find(|r| r["key"] == key && r["sample"] == "out_of_sample").unwrap();
    let oracle = row("full/lru/0/0/4/2/pf:oracle:2");
    let p = &oracle["prefetch"];
    // oracle at B = k_used: no demand miss, every load useful.
    assert_eq!(oracle["counts"]["misses"], 0);
    assert_eq!(p["useful"], p["prefetch_loads"]);
    assert_eq!(p["precision"], 1.0);
    assert_eq!(p["timeline"].as_array().unwrap().len(), 2, "dsv2-lite-bf16 at 3.9 and 6.8 GB/s");
    assert_eq!(oracle["cost"][0]["tok_s"], p["timeline"][0]["tok_s"]);
    assert!(row("full/lru/0/0/4/2/shuffle:3").get("prefetch").is_none());
    assert!(row("full/lru/0/0/4/2").get("prefetch").is_none());
    let html = dir.path().join("report.html");
    ok(&["report", s(&out), "-o", s(&html)]);
    let page = std::fs::read_to_string(&html).unwrap();
    let section = &page[page.find("id=\"prefetch\"").expect("a prefetch section")..];
    let section = &section[..section.find("</section>").unwrap()];
    assert!(section.contains("Precision against the budget: variant full, cap 4, k_used 2"), "{section}");
    assert!(section.contains(
        "tok/s on the timeline against the budget: variant full, cap 4, k_used 2 (dsv2-lite-bf16 at 3.9 GB/s)"
    ));
    assert!(section.contains("Misses per token, real against shuffled token order"));
    assert!(section.contains("lru, coact") && section.contains("lfu, oracle"), "legend per (policy, predictor)");
    assert!(section.contains("full/lru/0/0/4/2/pf:coact:2"));
    assert_eq!(section.matches("<svg").count(), 3, "two budget plots and one bar chart");
    // A sweep without those axes says how to add them.
    let plain = dir.path().join("plain.json");
    let grid = serde_json::json!({
        "traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
        "variants": ["full"], "blocks": [{"policies": ["lru"], "cap": [4]}]
    });
    std::fs::write(&plain, grid.to_string()).unwrap();
    let out2 = dir.path().join("sweep2");
    ok(&["sweep", s(&plain), "-o", s(&out2)]);
    ok(&["report", s(&out2), "-o", s(&dir.path().join("r2.html"))]);
    let page = std::fs::read_to_string(dir.path().join("r2.html")).unwrap();
    assert!(page.contains("No prefetch or shuffled configurations in this sweep"));
}
