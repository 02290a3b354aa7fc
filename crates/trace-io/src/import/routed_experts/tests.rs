//! `tests/data/routed/` was written by `python/make_runtime_fixtures.py` the way the runtimes
//! encode the field (SGLang: base64 of `tensor.numpy().tobytes()`; vLLM: base64 of `np.save`
//! bytes, or nested lists with `prompt_routed_experts` apart); the expected ids are worked out by
//! hand from the rows that script writes.

use super::*;
use crate::import::DropReason;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/routed").join(name)
}

fn opts(e: u32) -> RoutedExpertsOptions {
    RoutedExpertsOptions { num_experts: Some(e), ..Default::default() }
}

fn ids(t: &TraceData) -> Vec<Vec<u16>> {
    let v = t.view();
    (0..v.shape().layers).map(|l| v.layer_ids(l).to_vec()).collect()
}

#[test]
fn sglang_generate_batch_raw_int32() {
    let o = RoutedExpertsOptions { top_k: Some(2), ..opts(4) };
    let out = import_routed_experts(fixture("sglang_generate.json"), &o).unwrap();
    let (t, r) = (&out.trace, &out.report);
    // Layer 0 is dense (zeros: SGLang's capture buffer is never written there): dropped.
    assert_eq!(t.meta().layer_ids, vec![1, 2]);
    assert_eq!(ids(t), vec![vec![0, 1, 1, 2, 2, 3, 3, 0, 1, 0, 0, 3], vec![2, 3, 3, 0, 0, 1, 1, 2, 0, 2, 2, 1]]);
    assert_eq!(t.view().seq_offsets(), Some(&[0u64, 4][..]));
    assert_eq!(t.meta().phase, Phase::Mixed);
    assert_eq!((t.meta().extra["prefill_tokens"].as_str(), t.meta().extra["decode_tokens"].as_str()), ("5", "1"));
    assert_eq!((r.records_read, r.sequences), (18, Some(2)));
    let text = r.to_string();
    for want in [
        "2 responses, 2 sequences with routing; encoding: base64 of raw int32 bytes (SGLang)",
        "layers: 2 routed, ids 1..=2; layers 0 never routed (every row -1 or zeros: dense layers), dropped",
        "5 prompt (prefill) and 1 completion (decode) tokens",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    // --num-layers gives the same split.
    let o = RoutedExpertsOptions { num_layers: Some(3), ..opts(4) };
    assert_eq!(ids(&import_routed_experts(fixture("sglang_generate.json"), &o).unwrap().trace), ids(t));
}

#[test]
fn vllm_npy_and_split_lists() {
    let out = import_routed_experts(fixture("vllm_chat.jsonl"), &opts(4)).unwrap();
    let t = &out.trace;
    assert_eq!(t.meta().layer_ids, vec![0, 1]);
    assert_eq!(t.meta().model, "tiny-moe");
    assert_eq!(
        ids(t),
        vec![vec![0, 1, 1, 2, 2, 3, 3, 0, 0, 2, 2, 0, 3, 2], vec![2, 3, 3, 0, 0, 1, 1, 2, 1, 3, 3, 1, 1, 0]]
    );
    assert_eq!(t.view().seq_offsets(), Some(&[0u64, 4][..]));
    assert_eq!((t.meta().extra["prefill_tokens"].as_str(), t.meta().extra["decode_tokens"].as_str()), ("4", "3"));
    assert!(out.report.to_string().contains("base64 of .npy bytes (vLLM), JSON lists"), "{}", out.report);
}

#[test]
fn hostile_responses_are_refused_naming_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let b64 = |b: &[u8]| base64::engine::general_purpose::STANDARD.encode(b);
    let npy = |descr: &str, shape: &str, data: &[u8]| {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (h.len() + 11) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((h.len() as u16).to_le_bytes());
        out.extend(h.as_bytes());
        out.extend(data);
        out
    };
    let vllm = |re: &str| {
        format!(
            r#"{{"choices": [{{"index": 0, "routed_experts": {re}}}], "usage": {{"prompt_tokens": 1, "completion_tokens": 1}}}}"#
        )
    };
    let sglang_text = std::fs::read_to_string(fixture("sglang_generate.json")).unwrap();
    let cases: Vec<(&str, String, RoutedExpertsOptions, &str)> = vec![
        ("truncated", sglang_text[..300].to_string(), opts(4), "not JSON: EOF while parsing a string at line 17"),
        (
            "float npy",
            vllm(&format!("\"{}\"", b64(&npy("<f4", "(1, 1, 2)", &[0; 8])))),
            opts(4),
            "dtype <f4: expected integer ids",
        ),
        (
            "short npy",
            vllm(&format!("\"{}\"", b64(&npy("<i4", "(2, 1, 2)", &[0; 8])))),
            opts(4),
            "needs 16 bytes, the payload holds 8 (truncated)",
        ),
        (
            "odd bytes",
            vllm(&format!("\"{}\"", b64(&[1, 2, 3, 4, 5]))),
            opts(4),
            "5 bytes: not a whole number of int32 ids",
        ),
        ("not base64", vllm("\"@@@\""), opts(4), "`choices[0].routed_experts`: not base64"),
        ("padding", vllm("[[[-1, -1], [-1, -1]]]"), opts(4), "every row of every layer is padding"),
        (
            "out of range",
            vllm("[[[0, 4]]]"),
            opts(4),
            "the response, choices[0].routed_experts[0, 0, 1] (layer index 0, token 0, slot 1): expert id 4 >= num_experts 4",
        ),
        ("mixed k in lists", vllm("[[[0, 1], [2]]]"), opts(4), "[0][1] holds 1 ids, [0][0] 2 (mixed k)"),
        ("mixed k row", vllm("[[[0, 1]], [[2, -1]]]"), opts(4), "-1 among the row's 2 ids (mixed k"),
        ("repeat", vllm("[[[1, 1]]]"), opts(4), "expert 1 repeated in the row"),
        (
            "unknown keys",
            r#"{"id": "x", "foo": 1}"#.to_string(),
            opts(4),
            "no routed experts: expected `meta_info.routed_experts`",
        ),
        (
            "nulls",
            vllm("null"),
            opts(4),
            "every routed-experts field is null (1): start the server with --enable-return-routed-experts",
        ),
        ("no E", vllm("[[[0, 1]]]"), RoutedExpertsOptions::default(), "--num-experts is required"),
        ("raw, no shape", sglang_text.clone(), opts(4), "rows of 6 ids: give --num-layers or --top-k"),
        (
            "flag disagrees",
            vllm("[[[0, 1]]]"),
            RoutedExpertsOptions { top_k: Some(3), ..opts(4) },
            "the array has 2 k, the flag says 3",
        ),
        ("not a response", "[1, 2]".to_string(), opts(4), "response [0]: a JSON number, expected a response object"),
        ("empty", String::new(), opts(4), "no responses: the file is empty"),
    ];
    for (what, text, o, want) in cases {
        let p = dir.path().join("r.json");
        std::fs::write(&p, &text).unwrap();
        let e = import_routed_experts(&p, &o).unwrap_err().to_string();
        assert!(e.starts_with("routed-experts import, ") && e.contains("r.json"), "{what}: {e}");
        assert!(e.contains(want), "{what}: {e}");
    }
}

#[test]
fn padding_tokens_and_dense_layers_in_lists() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("r.jsonl");
    // Layer 0 never routed (-1), token 1 padding in every routed layer.
    let line = r#"{"choices": [{"routed_experts": [[[-1, -1], [0, 1]], [[-1, -1], [-1, -1]], [[-1, -1], [2, 3]]]}]}"#;
    std::fs::write(&p, format!("{line}\n{line}\n")).unwrap();
    let out = import_routed_experts(&p, &opts(4)).unwrap();
    assert_eq!(ids(&out.trace), vec![vec![0, 1, 2, 3, 0, 1, 2, 3]]);
    assert_eq!(out.trace.meta().layer_ids, vec![1]);
    assert_eq!(out.trace.view().seq_offsets(), Some(&[0u64, 2][..]));
    assert_eq!(out.trace.meta().phase, Phase::Unknown);
    let d = &out.report.dropped[0];
    assert_eq!((d.reason, d.tokens, d.records), (DropReason::Padding, 2, 2));
}
