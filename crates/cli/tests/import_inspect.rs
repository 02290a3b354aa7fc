//! `moe-offload import vllm-routelog | mixtral-jsonl` and `inspect`, end to end through the binary.

mod common;

use common::{ok, run, s};

use std::path::Path;

/// A one-layer route log: a warm-up step of 3 identical rows, then steps of 2 and 1 rows.
fn route_log(dir: &Path, layer: u32) -> std::path::PathBuf {
    let route = |t: u32, a: u32, b: u32| {
        format!(
            r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": {layer}, "topk_ids": [{a}, {b}], "topk_weights": [0.5, 0.25]}}"#
        )
    };
    let mut lines = vec![format!(r#"{{"type": "meta", "model_id": "tiny", "layers_logged": [{layer}], "top_k": 2}}"#)];
    lines.extend([route(0, 0, 1), route(1, 0, 1), route(2, 0, 1), route(0, 2, 3), route(1, 3, 2), route(0, 2, 3)]);
    let p = dir.join(format!("layer{layer}.jsonl"));
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

#[test]
fn vllm_routelog_import_reports_warmup_and_inspect_shows_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (route_log(dir.path(), 5), route_log(dir.path(), 2));
    let out = dir.path().join("t.safetensors");
    // Without --num-experts (absent from meta) the import fails and writes nothing.
    let r = run(&["import", "vllm-routelog", s(&a), s(&b), "-o", s(&out)]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("--num-experts"));
    assert!(!out.exists());

    let msg = ok(&["import", "vllm-routelog", s(&a), s(&b), "--num-experts", "4", "-o", s(&out)]);
    assert!(msg.contains("read 12 records from 2 file(s)"), "{msg}");
    assert!(msg.contains("dropped 3 tokens (6 records): warm-up batches"), "{msg}");
    assert!(msg.contains("2 layers x 3 tokens, 4 experts, top-2"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 engine steps; tokens per step: min 1, median 1.5, mean 1.5, max 2"), "{text}");
    assert!(text.contains("step sizes: 2 1"), "{text}");
    let j: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&out), "--json"])).unwrap();
    assert_eq!(j["meta"]["layer_ids"], serde_json::json!([2, 5]));
    assert_eq!(j["step_sizes"], serde_json::json!([2, 1]));
    // Rows 2 3 | 2 3 | 2 3 (sorted by score): every used expert is reused.
    assert_eq!(j["layers"][0]["next_token_reuse"], 1.0);
    assert_eq!(j["layers"][0]["shuffled_reuse"], 1.0);

    let kept = ok(&["import", "vllm-routelog", s(&a), "--num-experts", "4", "--keep-warmup", "-o", s(&out)]);
    assert!(kept.contains("nothing dropped") && kept.contains("kept dummy rows"), "{kept}");
}

#[test]
fn mixtral_jsonl_import_and_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let rec = |p: u32, l: u32, t: u32| {
        format!(
            r#"{{"dataset": "d", "problem_id": {p}, "layer": {l}, "experts": [1, 0], "gating_probs": [0.75, 0.25], "token_idx": {t}}}"#
        )
    };
    let input = dir.path().join("r.jsonl");
    std::fs::write(&input, [rec(0, 0, 0), rec(0, 1, 0), rec(0, 0, 1), rec(1, 0, 0), rec(1, 1, 0)].join("\n")).unwrap();
    let out = dir.path().join("m.safetensors");
    let msg = ok(&["import", "mixtral-jsonl", s(&input), "-o", s(&out)]);
    assert!(msg.contains("2 layers x 2 tokens, 2 sequences"), "{msg}");
    assert!(msg.contains("dropped 1 token (1 records): tokens missing from some layers"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("log_probs_renormalized") && text.contains("2 sequences"), "{text}");

    std::fs::write(&input, rec(0, 0, 0).replace("[1, 0]", "[1, 9]")).unwrap();
    let bad = dir.path().join("bad.safetensors");
    let r = run(&["import", "mixtral-jsonl", s(&input), "-o", s(&bad)]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("r.jsonl:1") && err.contains("expert id 9 >= num_experts 8"), "{err}");
    assert!(!bad.exists());
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_logs_import_end_to_end() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    let q = dir.path().join("qwen.safetensors");
    let logs: Vec<String> = [0, 8, 12, 18, 23]
        .iter()
        .map(|l| real.join(format!("vllm-routelog-qwen15moe/moe_layer{l}.jsonl")).display().to_string())
        .collect();
    let mut args = vec!["import", "vllm-routelog"];
    args.extend(logs.iter().map(String::as_str));
    args.extend(["--num-experts", "60", "-o", s(&q)]);
    let msg = ok(&args);
    assert!(msg.contains("dropped 8448 tokens (42240 records): warm-up batches"), "{msg}");
    assert!(msg.contains("5 layers x 4357 tokens, 60 experts, top-4"), "{msg}");
    let text = ok(&["inspect", s(&q)]);
    assert!(text.contains("129 engine steps; tokens per step: min 11, median 25"), "{text}");
    let replay: serde_json::Value =
        serde_json::from_str(&ok(&["replay", s(&q), "--policy", "lru", "--cap", "16", "--json"])).unwrap();
    assert_eq!(replay["tokens"], 4357 - 64);

    let m = dir.path().join("mixtral.safetensors");
    let input = real.join("mixtral-decode/gsm8k_2_routing.jsonl");
    let msg = ok(&["import", "mixtral-jsonl", s(&input), "-o", s(&m)]);
    assert!(
        msg.contains("32 layers x 244 tokens, 2 sequences") && msg.contains("dropped 3 tokens (81 records)"),
        "{msg}"
    );
}
