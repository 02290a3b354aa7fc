//! `moe-offload import numpy` and `inspect`, end to end through the binary.

mod common;

use common::{ok, s};

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_qwen3_arrays_import_and_inspect() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    for (name, figures) in [
        ("code", "next-token expert reuse (mean over layers): 0.474, shuffled-order control 0.276"),
        ("general", "next-token expert reuse (mean over layers): 0.446, shuffled-order control 0.188"),
    ] {
        let input = real.join(format!("qwen3-30b-a3b-llamacpp/{name}.npz"));
        let out = dir.path().join(format!("{name}.safetensors"));
        let msg = ok(&["import", "numpy", s(&input), "--chunk", "512", "--phase", "prefill", "-o", s(&out)]);
        assert!(msg.contains("trace: 48 layers x 8000 tokens, 16 sequences"), "{msg}");
        assert!(msg.contains("layout ltk (axis 0 matches meta n_moe_layers = 48)"), "{msg}");
        assert!(msg.contains("48 layers x 8000 tokens, 128 experts, top-8") && !msg.contains("warning"), "{msg}");
        let text = ok(&["inspect", s(&out)]);
        assert!(text.contains("E = 128, top-8 of 8 candidates; scores: none, phase: prefill"), "{text}");
        assert!(text.contains("16 sequences; tokens per sequence: min 320, median 512"), "{text}");
        assert!(text.contains(figures), "{text}");
    }
}

/// A `.npy` as `np.save` writes it (version 1.0, header padded to 64 bytes).
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}");
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

#[test]
fn tokens_major_npy_imports_with_flags_and_bad_ids_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // [3 tokens, 2 layers, k 2], int32, as SGLang/vLLM return routed experts.
    let ids: [i32; 12] = [0, 1, 3, 2, 2, 3, 0, 1, 1, 0, 2, 3];
    let data: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let input = dir.path().join("routed.npy");
    std::fs::write(&input, npy("<i4", "3, 2, 2", &data)).unwrap();
    let out = dir.path().join("t.safetensors");
    let msg =
        ok(&["import", "numpy", s(&input), "--layout", "tlk", "--num-experts", "4", "--layers", "5,9", "-o", s(&out)]);
    assert!(msg.contains("trace: 2 layers x 3 tokens") && msg.contains("layout tlk (--layout)"), "{msg}");
    let text = ok(&["inspect", s(&out)]);
    assert!(text.contains("2 layers x 3 tokens, E = 4, top-2 of 2 candidates; scores: none"), "{text}");
    let msg = common::fails(&["import", "numpy", s(&input), "--layout", "tlk", "--num-experts", "3", "-o", s(&out)]);
    assert!(msg.contains("routed.npy") && msg.contains("expert id 3 is >= num_experts 3"), "{msg}");
}
