//! Every JSON document the tool writes, file or `--json` output, carries its `kind` tag as its
//! first field (`moe-offload-<what>`), and `--json` prints one document on stdout: a table of
//! every command that writes JSON, each with a figure checked by hand. The exports in other
//! tools' formats carry no tag (their readers take every key, or line, as a layer).

mod common;

use common::{ok, run, s, synth};

use std::path::Path;

use serde_json::Value;

/// Where a command's JSON document is.
enum At {
    /// Its standard output (`--json`, `-o -`).
    Stdout,
    /// A file it writes, relative to the test directory.
    File(&'static str),
}

/// One command of the table: its arguments (`{d}` is the test directory), where its document
/// is, the `kind` it must have and a figure of it checked by hand.
struct Case {
    args: &'static str,
    at: At,
    kind: &'static str,
    check: fn(&Value),
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a whole number: {v}"))
}

/// 4 layers x 16 experts, top-2 of 4 candidates, 400 tokens; E = 16 for every cap check.
const TRACE: [usize; 5] = [4, 16, 2, 4, 400];
/// Picks of one layer: tokens x top-k.
const PICKS: u64 = 400 * 2;

const CASES: &[Case] = &[
    Case {
        args: "stats {d}/c.safetensors -o {d}/stats.json",
        at: At::File("stats.json"),
        kind: "moe-offload-stats",
        // Every layer's counts sum to tokens x k.
        check: |v| {
            for l in v["layers"].as_array().unwrap() {
                assert_eq!(l["count"].as_array().unwrap().iter().map(u).sum::<u64>(), PICKS);
            }
        },
    },
    Case {
        args: "keep {d}/stats.json --metric frequency --k 8 -o {d}/keep.json",
        at: At::File("keep.json"),
        kind: "moe-offload-keep-map",
        check: |v| assert!(v["layers"].as_array().unwrap().iter().all(|l| l.as_array().unwrap().len() == 8)),
    },
    Case {
        args: "keep {d}/stats.json --metric frequency --k 6,8 -o {d}/maps/ --json",
        at: At::Stdout,
        kind: "moe-offload-keep-maps",
        check: |v| {
            let maps = v["maps"].as_array().unwrap();
            assert_eq!(
                maps.iter().map(|m| m["label"].as_str().unwrap()).collect::<Vec<_>>(),
                ["frequency@6", "frequency@8"]
            );
            assert_eq!(maps[1]["kept_per_layer"], serde_json::json!([8, 8, 8, 8]));
            assert_eq!(u(&maps[1]["total_kept"]), 32);
        },
    },
    Case {
        args: "inspect {d}/c.safetensors --json",
        at: At::Stdout,
        kind: "moe-offload-inspect",
        check: |v| assert_eq!((u(&v["shape"]["layers"]), u(&v["shape"]["tokens"])), (4, 400)),
    },
    Case {
        args: "retention {d}/keep.json full --heldout {d}/h.safetensors --json",
        at: At::Stdout,
        kind: "moe-offload-retention",
        // The unpruned map replaces no slot and keeps every held-out expert.
        check: |v| {
            let maps = v["maps"].as_array().unwrap();
            assert_eq!(maps.len(), 2);
            assert_eq!(maps[1]["label"], "full");
            assert_eq!(maps[1]["mean"]["slot_replacement"].as_f64(), Some(0.0));
            assert!(v["heldout"].as_str().unwrap().ends_with("h.safetensors"));
        },
    },
    Case {
        // Cap E: nothing is ever evicted, so every miss is an expert's first use (<= E per layer).
        args: "replay {d}/h.safetensors --policy lru --cap 16 --warmup 0 --json",
        at: At::Stdout,
        kind: "moe-offload-replay",
        check: |v| {
            assert_eq!(u(&v["hits"]) + u(&v["misses"]), 4 * PICKS);
            assert!(v["layer_misses"].as_array().unwrap().iter().all(|m| u(m) <= 16));
        },
    },
    Case {
        args: "replay {d}/h.safetensors --policy lru --cap 16 --warmup 0 --shuffle 3 --json",
        at: At::Stdout,
        kind: "moe-offload-replay",
        check: |v| assert_eq!(u(&v["hits"]) + u(&v["misses"]), 4 * PICKS),
    },
    Case {
        args: "mrc {d}/c.safetensors --warmup 0 -o {d}/mrc.json",
        at: At::File("mrc.json"),
        kind: "moe-offload-mrc",
        // Caps k..E = 2..16; at cap E only first uses miss.
        check: |v| {
            assert_eq!((u(&v["min_cap"]), u(&v["max_cap"])), (2, 16));
            for l in v["layers"].as_array().unwrap() {
                assert!(u(l["misses"].as_array().unwrap().last().unwrap()) <= 16);
            }
        },
    },
    Case {
        args: "mrc {d}/c.safetensors --warmup 0 -o {d}/mrc2.json --json",
        at: At::Stdout,
        kind: "moe-offload-mrc",
        check: |v| assert_eq!(v["layers"].as_array().unwrap().len(), 4),
    },
    Case {
        // 24 slots of 1 MB for 4 layers.
        args: "plan --in-sample {d}/c.safetensors --out-of-sample {d}/h.safetensors --budget-gb 0.024 --expert-mb 1 \
               -o {d}/plan.json",
        at: At::File("plan.json"),
        kind: "moe-offload-plan",
        check: |v| {
            assert_eq!(u(&v["slots"]), 24);
            assert!(v["chosen"]["plan"]["caps"].as_array().unwrap().iter().map(u).sum::<u64>() <= 24);
        },
    },
    Case {
        args: "plan --in-sample {d}/c.safetensors --out-of-sample {d}/h.safetensors --budget-gb 0.024 --expert-mb 1 \
               -o {d}/plan2.json --json",
        at: At::Stdout,
        kind: "moe-offload-plan",
        check: |v| assert_eq!(u(&v["slots"]), 24),
    },
    Case {
        args: "plan --exec host --in-sample {d}/c.safetensors --out-of-sample {d}/h.safetensors --profile-file \
               {d}/hw.json -o {d}/hplan.json",
        at: At::File("hplan.json"),
        kind: "moe-offload-hybrid-plan",
        // The profile's gpu_gb is the budget; per layer, a layer is all on the GPU or all on the CPU.
        check: |v| {
            assert_eq!(v["gpu_budget_gb"].as_f64(), Some(1.0));
            let e = TRACE[1] as u64;
            assert!(v["per_layer"]["counts"].as_array().unwrap().iter().all(|n| u(n) == 0 || u(n) == e), "{v}");
        },
    },
    Case {
        args: "sweep {d}/grid.json -o {d}/sweep",
        at: At::File("sweep/results.json"),
        kind: "moe-offload-sweep-results",
        // 1 variant x 1 policy x 2 caps, in and out of sample.
        check: |v| assert_eq!(v["rows"].as_array().unwrap().len(), 4),
    },
    Case {
        args: "sweep {d}/grid.json -o {d}/sweep2 --json",
        at: At::Stdout,
        kind: "moe-offload-sweep-summary",
        check: |v| {
            assert_eq!((u(&v["rows"]), u(&v["configurations"])), (4, 2));
            let per = v["best_per_variant"].as_array().unwrap();
            assert_eq!(per.iter().map(|b| u(&b["cap"])).collect::<Vec<_>>(), [4, 8]);
        },
    },
    Case {
        args: "stats --reap-agg {d}/agg.json --list-corpora --json",
        at: At::Stdout,
        kind: "moe-offload-reap-corpora",
        check: |v| {
            let c = &v["corpora"][0];
            assert_eq!((c["corpus"].as_str(), u(&c["tokens"]), u(&c["non_finite_reap"])), (Some("bible"), 10, 1));
        },
    },
    Case {
        args: "export keep-set {d}/keep.json -o -",
        at: At::Stdout,
        kind: "moe-offload-keep-set",
        check: |v| assert_eq!(u(&v["k"]), 8),
    },
    Case {
        args: "profile show dsv2-lite-bf16 --json",
        at: At::Stdout,
        kind: "moe-offload-profile",
        // 3 · 2048 · 1408 · 16 / 8 / 10^6 MB
        check: |v| assert_eq!(v["profile"]["expert_mb"].as_f64(), Some(17.301504)),
    },
    Case {
        // Two tokens of one response, one layer, k 2.
        args: "import routed-experts {d}/routed.jsonl --num-experts 4 -o {d}/routed.safetensors --json",
        at: At::Stdout,
        kind: "moe-offload-import",
        check: |v| {
            assert_eq!((u(&v["shape"]["tokens"]), u(&v["shape"]["top_k"]), u(&v["sequences"])), (2, 2, 1));
            assert_eq!(v["report"]["format"], "routed-experts");
        },
    },
];

/// Splits a case's arguments, with `{d}` replaced by the test directory.
fn args(case: &Case, dir: &Path) -> Vec<String> {
    case.args.split_whitespace().map(|a| a.replace("{d}", s(dir))).collect()
}

#[test]
fn every_json_output_has_its_kind_first() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(&d.join("c.safetensors"), TRACE, &["--seed", "1"]);
    synth(&d.join("h.safetensors"), TRACE, &["--seed", "2"]);
    std::fs::write(
        d.join("grid.json"),
        r#"{"name": "kinds", "traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
            "variants": ["full"], "warmup": 0, "blocks": [{"policies": ["lru"], "cap": [4, 8]}],
            "profiles": ["reference"]}"#,
    )
    .unwrap();
    // A hybrid device (SEMANTICS.md §14) for `plan --exec host`.
    std::fs::write(
        d.join("hw.json"),
        r#"{"name": "hw", "expert_mb": 2.0, "compute_ms": 10.0, "host_gbps": 4.0, "host_ms_per_row": 3.0,
            "host_sync_ms": 0.2, "gpu_gb": 1.0}"#,
    )
    .unwrap();
    // Routed experts of one response, as vLLM returns them in nested lists.
    std::fs::write(d.join("routed.jsonl"), r#"{"choices": [{"routed_experts": [[[0, 1]], [[2, 3]]]}]}"#).unwrap();
    // A REAP aggregate: one corpus, one layer, one NaN (as the real files have).
    std::fs::write(
        d.join("agg.json"),
        r#"{"bible": {"tok": 10, "freq": {"0": [6, 4, 10, 0]}, "reap": {"0": [1.0, NaN, 2.0, 0.0]}}}"#,
    )
    .unwrap();
    for case in CASES {
        let args = args(case, d);
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let stdout = ok(&argv);
        let text = match &case.at {
            At::Stdout => stdout,
            At::File(f) => std::fs::read_to_string(d.join(f)).unwrap(),
        };
        // One document: the whole text parses as one JSON value.
        let v: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: not one JSON document: {e}", case.args));
        let first = v.as_object().and_then(|o| o.iter().next());
        assert_eq!(first.map(|(k, v)| (k.as_str(), v.as_str())), Some(("kind", Some(case.kind))), "{}", case.args);
        (case.check)(&v);
    }
    // `--json` prints the document the file holds, byte for byte.
    assert_eq!(std::fs::read(d.join("plan2.json")).unwrap(), run_stdout("plan", d));
    let mrc2: Value = serde_json::from_slice(&std::fs::read(d.join("mrc2.json")).unwrap()).unwrap();
    let mrc: Value = serde_json::from_slice(&std::fs::read(d.join("mrc.json")).unwrap()).unwrap();
    assert_eq!(mrc, mrc2);
}

/// The stdout of the `--json` case of `command`, run again.
fn run_stdout(command: &str, d: &Path) -> Vec<u8> {
    let case = CASES.iter().find(|c| c.args.starts_with(command) && c.args.ends_with("--json")).unwrap();
    let args = args(case, d);
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.status.success());
    out.stdout
}

#[test]
fn exports_in_other_tools_formats_have_no_kind() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    synth(&d.join("c.safetensors"), TRACE, &["--seed", "1"]);
    ok(&["stats", s(&d.join("c.safetensors")), "-o", s(&d.join("stats.json"))]);
    let stats = d.join("stats.json");
    // gguf_prune.py reads `{int(k): v for k, v in json.load(f).items()}`: every key a layer id.
    let v: Value = serde_json::from_str(&ok(&["export", "gguf-prune", s(&stats), "-o", "-"])).unwrap();
    let keys: Vec<u32> = v.as_object().unwrap().keys().map(|k| k.parse().unwrap()).collect();
    assert_eq!(keys, [0, 1, 2, 3]);
    // vLLM-Ascend reads one layer per line, each line one key.
    let lines = ok(&["export", "vllm-ascend", s(&stats), "--metric", "frequency", "-o", "-"]);
    for (i, line) in lines.lines().enumerate() {
        let o: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        assert_eq!(o.keys().collect::<Vec<_>>(), [&i.to_string()]);
        assert_eq!(o[&i.to_string()].as_array().unwrap().len(), 16);
    }
}
