//! `moe-offload import llama-csv` and `llama-bin`, end to end through the binary.

mod common;

use common::{fails, ok, s};

#[test]
fn llama_csv_imports_and_bad_ids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Layers 1 and 2 (layer 0 dense), k 2: a 2-token prompt (layer-major, as the callback sees
    // each layer's ffn_moe_topk), then one decode token.
    let text = "pos,layer,id0,id1\n-2,1,0,1\n-1,1,2,3\n-2,2,3,2\n-1,2,1,0\n0,1,1,2\n0,2,0,3\n";
    let input = dir.path().join("routing.csv");
    std::fs::write(&input, text).unwrap();
    let out = dir.path().join("t.safetensors");
    let msg = ok(&["import", "llama-csv", s(&input), "--num-experts", "4", "-o", s(&out)]);
    assert!(
        msg.contains("llama-csv: read 6 records") && msg.contains("trace: 2 layers x 3 tokens, 1 sequences"),
        "{msg}"
    );
    assert!(msg.contains("2 prefill, 1 decode (phase mixed)"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 layers x 3 tokens, E = 4, top-2 of 2 candidates; scores: none, phase: mixed"), "{text}");
    let msg = fails(&["import", "llama-csv", s(&input), "--num-experts", "3", "-o", s(&out)]);
    assert!(msg.contains("routing.csv:3") && msg.contains("expert id 3 is not in 0..3"), "{msg}");
}

#[test]
fn llama_bin_imports_with_ubatches_as_steps_and_truncation_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rec = |layer: i32, n: i32, ids: &[i32]| -> Vec<u8> {
        [layer, n, 2].iter().chain(ids).flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>()
    };
    // Layers 1 and 2, k 2: a 2-token prompt ubatch, then one decode step.
    let bytes = [rec(1, 2, &[0, 1, 2, 3]), rec(2, 2, &[3, 2, 1, 0]), rec(1, 1, &[1, 2]), rec(2, 1, &[0, 3])].concat();
    let input = dir.path().join("routing.bin");
    std::fs::write(&input, &bytes).unwrap();
    let out = dir.path().join("t.safetensors");
    let msg = ok(&["import", "llama-bin", s(&input), "--num-experts", "4", "-o", s(&out)]);
    assert!(msg.contains("trace: 2 layers x 3 tokens, 1 sequences, 2 engine steps"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 layers x 3 tokens, E = 4, top-2 of 2 candidates; scores: none"), "{text}");
    std::fs::write(&input, &bytes[..bytes.len() - 2]).unwrap();
    let msg = fails(&["import", "llama-bin", s(&input), "--num-experts", "4", "-o", s(&out)]);
    assert!(msg.contains("routing.bin") && msg.contains("record 3 at byte 76: truncated record"), "{msg}");
}
