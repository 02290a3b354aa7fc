//! `moe-offload import sglang-dump` and `import routed-experts`, end to end through the binary, on
//! the fixtures `python/make_runtime_fixtures.py` wrote the way SGLang and vLLM write them.

mod common;

use std::path::PathBuf;

use common::{fails, json, ok, s};

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../trace-io/tests/data").join(rel)
}

#[test]
fn sglang_dump_imports_with_passes_as_steps() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let input = fixture("sglang/basic.pt");
    let msg = ok(&["import", "sglang-dump", s(&input), "-o", s(&out)]);
    assert!(
        msg.contains("sglang-dump: read 21 records from 1 file(s); trace: 2 layers x 7 tokens, 2 engine steps"),
        "{msg}"
    );
    assert!(msg.contains("layers 0 never routed (every row -1: dense layers), dropped"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 layers x 7 tokens, E = 4, top-2 of 2 candidates; scores: none, phase: mixed"), "{text}");
    let v = json(&["import", "sglang-dump", s(&input), "-o", s(&out), "--json"]);
    assert_eq!(v["kind"], "moe-offload-import");
    assert_eq!((v["shape"]["tokens"].as_u64(), v["steps"].as_u64()), (Some(7), Some(2)));
    assert_eq!(v["layer_ids"], serde_json::json!([1, 2]));
    assert_eq!(v["metadata"]["decode_tokens"], "2");
    // A row with fewer ids than k, named by record and element.
    let msg = fails(&["import", "sglang-dump", s(&fixture("sglang/mixed_k.pt")), "-o", s(&out)]);
    assert!(msg.contains("mixed_k.pt") && msg.contains("records[0].topk_ids_of_layer[0, 1, 1]"), "{msg}");
}

#[test]
fn routed_experts_import_sglang_and_vllm_responses() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("t.safetensors");
    let vllm = fixture("routed/vllm_chat.jsonl");
    let msg = ok(&["import", "routed-experts", s(&vllm), "--num-experts", "4", "-o", s(&out)]);
    assert!(
        msg.contains("routed-experts: read 14 records from 1 file(s); trace: 2 layers x 7 tokens, 2 sequences"),
        "{msg}"
    );
    assert!(msg.contains("4 prompt (prefill) and 3 completion (decode) tokens"), "{msg}");
    let sglang = fixture("routed/sglang_generate.json");
    // SGLang's raw bytes hold no shape: the flag splits a row into layers x k.
    let msg = fails(&["import", "routed-experts", s(&sglang), "--num-experts", "4", "-o", s(&out)]);
    assert!(msg.contains("rows of 6 ids: give --num-layers or --top-k"), "{msg}");
    let v =
        json(&["import", "routed-experts", s(&sglang), "--num-experts", "4", "--top-k", "2", "-o", s(&out), "--json"]);
    assert_eq!((v["shape"]["tokens"].as_u64(), v["sequences"].as_u64()), (Some(6), Some(2)));
    assert_eq!(v["phase"], "mixed");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 layers x 6 tokens, E = 4, top-2 of 2 candidates"), "{text}");
    let msg = fails(&["import", "routed-experts", s(&vllm), "--num-experts", "3", "-o", s(&out)]);
    assert!(msg.contains("vllm_chat.jsonl") && msg.contains("expert id 3 >= num_experts 3"), "{msg}");
}
