//! Round trips and hostile inputs for the trace file format.

use std::collections::BTreeMap;
use std::path::Path;

use trace_io::synth::{SynthConfig, generate};
use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceError, TraceFile, TraceMeta, ValueProblem, write_trace};

fn meta(layers: u32, e: u32, k: u32) -> TraceMeta {
    TraceMeta {
        model: "test".into(),
        num_experts: e,
        top_k: k,
        layer_ids: (0..layers).collect(),
        score_kind: ScoreKind::Logits,
        phase: Phase::Decode,
        source: "unit test".into(),
        extra: BTreeMap::new(),
    }
}

/// 1 layer, 2 tokens, m = 3, k = 2, E = 4.
fn tiny_parts() -> OwnedParts {
    OwnedParts {
        ids: vec![0, 1, 2, 3, 2, 1],
        scores: Some(vec![3.0, 2.0, 1.0, 5.0, 5.0, -1.0]),
        gates: Some(vec![0.6, 0.4, 0.5, 0.5]),
        out_norms: Some(vec![1.0, 2.0, 3.0, 4.0]),
        seq_offsets: Some(vec![0]),
        step_offsets: Some(vec![0, 1]),
    }
}

/// Writes a safetensors file from a header JSON value and raw data bytes, without any checks.
fn raw_file(path: &Path, header: serde_json::Value, data: &[u8]) {
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

fn meta_json(m: &TraceMeta) -> serde_json::Value {
    serde_json::to_value(m.to_map()).unwrap()
}

fn open_err(path: &Path) -> TraceError {
    match TraceFile::open(path).unwrap_err() {
        TraceError::File { path: p, source } => {
            assert_eq!(p, path);
            *source
        }
        other => panic!("expected an error wrapped with the path, got {other}"),
    }
}

#[test]
fn write_then_open_round_trips_every_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let data = TraceData::new(meta(1, 4, 2), 2, 3, tiny_parts()).unwrap();
    let path = dir.path().join("t.safetensors");
    write_trace(&path, &data.view()).unwrap();
    let file = TraceFile::open(&path).unwrap();
    let v = file.view();
    assert_eq!(v.meta(), data.meta());
    assert_eq!(v.parts().ids, data.view().parts().ids);
    assert_eq!(v.parts().scores, data.view().parts().scores);
    assert_eq!(v.parts().gates, data.view().parts().gates);
    assert_eq!(v.parts().out_norms, data.view().parts().out_norms);
    assert_eq!(v.seq_offsets(), Some(&[0u64][..]));
    assert_eq!(v.step_offsets(), Some(&[0u64, 1][..]));
    assert_eq!(v.row(0, 1), &[3, 2, 1]);
    // The same bytes from memory.
    let bytes = std::fs::read(&path).unwrap();
    let heap = TraceFile::from_bytes(&bytes).unwrap();
    assert_eq!(heap.view().parts().ids, v.parts().ids);
    // Writing again gives identical bytes; no temporary file is left behind.
    let path2 = dir.path().join("t2.safetensors");
    write_trace(&path2, &file.view()).unwrap();
    assert_eq!(std::fs::read(&path2).unwrap(), bytes);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    // Missing parent directories of the output are created.
    let nested = dir.path().join("a").join("b").join("t.safetensors");
    write_trace(&nested, &file.view()).unwrap();
    assert_eq!(std::fs::read(&nested).unwrap(), bytes);
}

#[test]
fn content_violations_name_tensor_layer_token_and_value() {
    type Case = (fn(&mut OwnedParts), &'static str, usize, ValueProblem);
    let cases: Vec<Case> = vec![
        (|p| p.ids[4] = 9, "ids", 1, ValueProblem::IdOutOfRange { id: 9, num_experts: 4 }),
        (|p| p.ids[5] = 3, "ids", 1, ValueProblem::RepeatedId { id: 3 }),
        (|p| p.scores.as_mut().unwrap()[1] = f32::NAN, "scores", 0, ValueProblem::NotFinite { value: f32::NAN }),
        (|p| p.scores.as_mut().unwrap()[5] = 6.0, "scores", 1, ValueProblem::Increasing { previous: 5.0, value: 6.0 }),
        (|p| p.gates.as_mut().unwrap()[3] = -0.5, "gates", 1, ValueProblem::Negative { value: -0.5 }),
        (
            |p| p.out_norms.as_mut().unwrap()[0] = f32::INFINITY,
            "out_norms",
            0,
            ValueProblem::NotFinite { value: f32::INFINITY },
        ),
    ];
    for (mutate, tensor_want, token_want, problem_want) in cases {
        let mut parts = tiny_parts();
        mutate(&mut parts);
        match TraceData::new(meta(1, 4, 2), 2, 3, parts).unwrap_err() {
            TraceError::Value { tensor, layer, layer_id, token, problem, .. } => {
                assert_eq!((tensor, layer, layer_id, token), (tensor_want, 0, 0, token_want));
                // NaN != NaN: compare the rendered problem.
                assert_eq!(problem.to_string(), problem_want.to_string());
            }
            other => panic!("expected a value error, got {other}"),
        }
    }
    let mut parts = tiny_parts();
    parts.seq_offsets = Some(vec![0, 2]);
    let e = TraceData::new(meta(1, 4, 2), 2, 3, parts).unwrap_err();
    assert!(matches!(e, TraceError::Offsets { tensor: "seq_offsets", index: 1, value: 2, .. }), "{e}");
    let mut parts = tiny_parts();
    parts.gates = Some(vec![0.5; 3]);
    let e = TraceData::new(meta(1, 4, 2), 2, 3, parts).unwrap_err();
    assert!(matches!(e, TraceError::Shape { tensor: "gates", .. }), "{e}");
}

#[test]
fn hostile_files_are_refused_with_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.safetensors");
    let data = TraceData::new(meta(1, 4, 2), 2, 3, tiny_parts()).unwrap();
    write_trace(&good, &data.view()).unwrap();
    let bytes = std::fs::read(&good).unwrap();

    // Truncated data.
    let p = dir.path().join("truncated.safetensors");
    std::fs::write(&p, &bytes[..bytes.len() - 3]).unwrap();
    let n = bytes.len() as u64;
    let e = open_err(&p);
    assert!(
        matches!(&e, TraceError::Extent { tensor, expected, problem, .. }
            if tensor == "ids" && expected.end == n && problem.contains(&format!("the file ends at byte {}", n - 3))),
        "{e}"
    );
    // Header length longer than the file.
    let p = dir.path().join("header.safetensors");
    let mut b = bytes.clone();
    b[..8].copy_from_slice(&(bytes.len() as u64 * 2).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert!(matches!(open_err(&p), TraceError::Container(_)));
    // Shorter than the length prefix.
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(matches!(open_err(&p), TraceError::Container(ref m) if !m.contains("JSON text")));
    // JSON text (statistics or a keep map given as a trace) is named as such.
    std::fs::write(&p, "\n  {\"meta\": {\"model\": \"x\"}, \"layers\": []}\n").unwrap();
    assert!(matches!(open_err(&p), TraceError::Container(ref m) if m.contains("the file is JSON text")));

    let m = meta(1, 4, 2);
    // Wrong dtype for ids.
    let p = dir.path().join("dtype.safetensors");
    raw_file(
        &p,
        serde_json::json!({"__metadata__": meta_json(&m), "ids": {"dtype": "I32", "shape": [1, 2, 3], "data_offsets": [0, 24]}}),
        &[0u8; 24],
    );
    assert!(matches!(open_err(&p), TraceError::Dtype { tensor: "ids", expected: "U16", .. }));
    // A well-formed container whose rows break a content rule: validated on open too.
    let p = dir.path().join("content.safetensors");
    raw_file(
        &p,
        serde_json::json!({"__metadata__": {"format": "moe-offload-trace", "format_version": "1", "model": "x", "num_experts": "4",
            "top_k": "2", "layer_ids": "[0]", "score_kind": "logits", "phase": "decode", "source": "x"},
            "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]},
            "scores": {"dtype": "F32", "shape": [1, 2, 3], "data_offsets": [12, 36]}}),
        &[0u8; 36],
    );
    let e = open_err(&p);
    assert!(matches!(e, TraceError::Value { tensor: "ids", problem: ValueProblem::RepeatedId { id: 0 }, .. }), "{e}");
    // Misaligned f32 tensor: 2 bytes of ids put `scores` at byte offset 2.
    let p = dir.path().join("misaligned.safetensors");
    raw_file(
        &p,
        serde_json::json!({"__metadata__": {"format": "moe-offload-trace", "format_version": "1", "model": "x", "num_experts": "4",
            "top_k": "1", "layer_ids": "[0]", "score_kind": "logits", "phase": "decode", "source": "x"},
            "ids": {"dtype": "U16", "shape": [1, 1, 1], "data_offsets": [0, 2]},
            "scores": {"dtype": "F32", "shape": [1, 1, 1], "data_offsets": [2, 6]}}),
        &[0u8; 6],
    );
    assert!(matches!(open_err(&p), TraceError::Misaligned { tensor: "scores", .. }));
    // Shape mismatch between tensors.
    let p = dir.path().join("shape.safetensors");
    raw_file(
        &p,
        serde_json::json!({"__metadata__": meta_json(&m),
            "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]},
            "scores": {"dtype": "F32", "shape": [1, 3, 3], "data_offsets": [12, 48]}}),
        &[0u8; 48],
    );
    assert!(matches!(open_err(&p), TraceError::Shape { tensor: "scores", .. }));
    // Layer count disagreeing with layer_ids.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": meta_json(&meta(2, 4, 2)),
            "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]}}),
        &[0u8; 12],
    );
    assert!(matches!(open_err(&p), TraceError::Shape { tensor: "ids", .. }));
    // Missing metadata and unknown version.
    let p = dir.path().join("meta.safetensors");
    let mut md = m.to_map();
    md.remove("num_experts");
    raw_file(
        &p,
        serde_json::json!({"__metadata__": md, "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]}}),
        &[0u8; 12],
    );
    assert!(matches!(open_err(&p), TraceError::MissingMetadata { key: "num_experts" }));
    let mut md = m.to_map();
    md.insert("format_version".into(), "99".into());
    raw_file(
        &p,
        serde_json::json!({"__metadata__": md, "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]}}),
        &[0u8; 12],
    );
    assert!(matches!(open_err(&p), TraceError::UnsupportedVersion { .. }));
    // No ids tensor.
    raw_file(&p, serde_json::json!({"__metadata__": meta_json(&m)}), &[]);
    assert!(matches!(open_err(&p), TraceError::MissingTensor { tensor: "ids" }));
    // A missing file names the path.
    let missing = dir.path().join("nope.safetensors");
    assert!(matches!(open_err(&missing), TraceError::Io(_)));
}

#[test]
fn synth_is_deterministic_and_valid() {
    let cfg = SynthConfig { tokens: 512, sequences: 4, ..Default::default() };
    let a = generate(&cfg).unwrap();
    let b = generate(&cfg).unwrap();
    assert_eq!(a, b);
    let c = generate(&SynthConfig { seed: 1, ..cfg.clone() }).unwrap();
    assert_ne!(a.view().parts().ids, c.view().parts().ids);
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2) = (dir.path().join("a"), dir.path().join("b"));
    write_trace(&p1, &a.view()).unwrap();
    write_trace(&p2, &b.view()).unwrap();
    assert_eq!(std::fs::read(&p1).unwrap(), std::fs::read(&p2).unwrap());
    // Dead experts (the highest id) never appear.
    assert!(a.view().parts().ids.iter().all(|&id| id < 31));
    // Temporal locality: the next token reuses experts more often than popularity alone would.
    let v = a.view();
    let (k, m) = (v.shape().top_k, v.shape().candidates);
    let ids = v.layer_ids(0);
    let mut reuse = 0;
    for t in 1..v.shape().tokens {
        let prev = &ids[(t - 1) * m..(t - 1) * m + k];
        reuse += ids[t * m..t * m + k].iter().filter(|e| prev.contains(e)).count();
    }
    let rate = reuse as f64 / ((v.shape().tokens - 1) * k) as f64;
    assert!(rate > 4.0 / 31.0 * 1.5, "next-token reuse {rate}");
    let e = generate(&SynthConfig { candidates: 40, ..cfg }).unwrap_err();
    assert!(matches!(e, TraceError::Config { key: "candidates", .. }));
}

/// Metadata of the raw files below: 1 layer, E = 4, k = 2.
fn raw_meta() -> serde_json::Value {
    meta_json(&meta(1, 4, 2))
}

/// Writes raw bytes (a length prefix of our choice, then anything) and returns the unwrapped error.
fn open_bytes(dir: &Path, name: &str, bytes: &[u8]) -> TraceError {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    // The in-memory constructor must agree with the file opener.
    let heap = TraceFile::from_bytes(bytes).unwrap_err();
    let file = open_err(&p);
    assert_eq!(std::mem::discriminant(&heap), std::mem::discriminant(&file), "{heap} vs {file}");
    file
}

fn with_header(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend_from_slice(data);
    b
}

/// The ids of two layers of 2 tokens, m = 3, E = 4, as little-endian bytes.
fn two_layer_ids_bytes() -> Vec<u8> {
    [0u16, 1, 2, 3, 2, 1, 0, 1, 2, 3, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn repeated_layer_ids_are_refused_on_open_and_in_memory() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("dup.safetensors");
    let ids_t = serde_json::json!({"dtype": "U16", "shape": [2, 2, 3], "data_offsets": [0, 24]});
    let mut m = meta(2, 4, 2);
    m.score_kind = ScoreKind::None;
    // The same file with distinct ids, in any order, opens.
    for ok in [vec![0, 1], vec![7, 3]] {
        m.layer_ids = ok;
        raw_file(&p, serde_json::json!({"__metadata__": meta_json(&m), "ids": ids_t}), &two_layer_ids_bytes());
        assert_eq!(TraceFile::open(&p).unwrap().meta().layer_ids, m.layer_ids);
    }
    m.layer_ids = vec![0, 0];
    raw_file(&p, serde_json::json!({"__metadata__": meta_json(&m), "ids": ids_t}), &two_layer_ids_bytes());
    let full = TraceFile::open(&p).unwrap_err().to_string();
    assert!(full.contains("dup.safetensors") && full.contains("layer id 0 is repeated (entries 0 and 1)"), "{full}");
    match open_err(&p) {
        TraceError::BadMetadata { key: "layer_ids", value, reason } => {
            assert_eq!(value, "[0,0]");
            assert!(reason.contains("layer id 0 is repeated"), "{reason}");
        }
        other => panic!("expected BadMetadata for layer_ids, got {other}"),
    }
    // The reported case: 32 layers all claiming id 0 (the bytes do not matter, metadata comes first).
    m.layer_ids = vec![0; 32];
    raw_file(&p, serde_json::json!({"__metadata__": meta_json(&m), "ids": ids_t}), &two_layer_ids_bytes());
    assert!(matches!(open_err(&p), TraceError::BadMetadata { key: "layer_ids", .. }));
    // In memory: a later repeat, with the positions of both entries.
    let mut m = meta(3, 4, 2);
    m.layer_ids = vec![5, 3, 5];
    let mut parts = tiny_parts();
    parts.ids = [0u16, 1, 2, 3, 2, 1].repeat(3);
    parts.scores = Some([3.0f32, 2.0, 1.0, 5.0, 5.0, -1.0].repeat(3));
    parts.gates = None;
    parts.out_norms = None;
    let e = TraceData::new(m, 2, 3, parts).unwrap_err();
    match e {
        TraceError::BadMetadata { key: "layer_ids", reason, .. } => {
            assert!(reason.contains("layer id 5 is repeated (entries 0 and 2)"), "{reason}");
        }
        other => panic!("expected BadMetadata for layer_ids, got {other}"),
    }
}

#[test]
fn malformed_headers_are_container_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [(&str, Vec<u8>); 8] = [
        ("array.st", with_header(b"[1, 2, 3]", &[])),
        ("string.st", with_header(b"\"ids\"   ", &[])),
        ("not-json.st", with_header(b"{\"ids\": ", &[])),
        ("not-utf8.st", with_header(&[b'{', 0xff, 0xfe, b'}'], &[])),
        ("huge-len.st", {
            let mut b = u64::MAX.to_le_bytes().to_vec();
            b.extend_from_slice(b"{}");
            b
        }),
        ("empty.st", Vec::new()),
        // Metadata values must be strings.
        ("md-number.st", with_header(br#"{"__metadata__": {"num_experts": 4}}"#, &[])),
        // A dtype safetensors does not know.
        (
            "dtype-unknown.st",
            with_header(br#"{"ids": {"dtype": "U17", "shape": [1, 1, 1], "data_offsets": [0, 2]}}"#, &[0, 0]),
        ),
    ];
    for (name, bytes) in cases {
        let e = open_bytes(d, name, &bytes);
        assert!(matches!(e, TraceError::Container(_)), "{name}: {e}");
    }
}

#[test]
fn tensor_geometry_violations_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let ids = |shape: serde_json::Value, end: u64| serde_json::json!({"dtype": "U16", "shape": shape, "data_offsets": [0, end]});
    // A shape whose element count overflows usize.
    let big = 1u64 << 40;
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([big, big, big]), 12)}),
        &[0u8; 12],
    );
    let e = open_err(&p);
    assert!(
        matches!(&e, TraceError::Shape { tensor: "ids", expected, .. } if expected.contains("fits in memory")),
        "{e}"
    );
    // Element count disagreeing with the byte range: safetensors does not say which tensor, we do.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 10)}),
        &[0u8; 10],
    );
    let e = open_err(&p);
    assert!(matches!(&e, TraceError::Shape { tensor: "ids", actual, .. } if actual == &[1, 2, 3]), "{e}");
    // Zero layers, [0, T, m], with the data of one layer: the message names the tensor.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([0, 2, 3]), 12)}),
        &[0u8; 12],
    );
    assert_eq!(
        open_err(&p).to_string(),
        "tensor `ids` has shape [0, 2, 3], expected 6 elements of U16 to fill data_offsets 0..12 (12 bytes), not 0"
    );
    // The same for the second tensor in data order, and for a tensor the format does not define.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "scores": {"dtype": "F32", "shape": [0, 2, 3], "data_offsets": [12, 36]}}),
        &[0u8; 36],
    );
    assert!(matches!(open_err(&p), TraceError::Shape { tensor: "scores", .. }));
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "extra": {"dtype": "F32", "shape": [3], "data_offsets": [12, 14]}}),
        &[0u8; 14],
    );
    assert!(matches!(open_err(&p), TraceError::Container(m) if m.contains("tensor `extra`") && m.contains("2 bytes")));
    // Data bytes beyond the last tensor.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12)}),
        &[0u8; 16],
    );
    let e = open_err(&p);
    assert!(
        matches!(&e, TraceError::Extent { tensor, data_offsets, problem, .. }
            if tensor == "ids" && *data_offsets == (0..12) && problem.contains("belong to no tensor")),
        "{e}"
    );
    // Overlapping tensors.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "scores": {"dtype": "F32", "shape": [1, 2, 3], "data_offsets": [8, 32]}}),
        &[0u8; 32],
    );
    assert!(matches!(open_err(&p), TraceError::Container(_)));
    // A tensor name the format does not define.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "logits": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}),
        &[0u8; 16],
    );
    assert!(matches!(open_err(&p), TraceError::Container(m) if m.contains("logits")));
    // ids of rank 2.
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([2, 3]), 12)}),
        &[0u8; 12],
    );
    assert!(matches!(open_err(&p), TraceError::Shape { tensor: "ids", .. }));
    // gates of the wrong width (k = 2 expected).
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(),
            "gates": {"dtype": "F32", "shape": [1, 2, 3], "data_offsets": [0, 24]},
            "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [24, 36]}}),
        &[0u8; 24 + 12],
    );
    assert!(matches!(open_err(&p), TraceError::Shape { tensor: "gates", .. }));
    // Offsets of rank 2 and of the wrong dtype.
    for (dtype, shape, want_dtype) in [("U64", serde_json::json!([1, 1]), false), ("I64", serde_json::json!([1]), true)]
    {
        raw_file(
            &p,
            serde_json::json!({"__metadata__": raw_meta(),
                "seq_offsets": {"dtype": dtype, "shape": shape, "data_offsets": [0, 8]},
                "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [8, 20]}}),
            &[0u8; 20],
        );
        let e = open_err(&p);
        if want_dtype {
            assert!(matches!(e, TraceError::Dtype { tensor: "seq_offsets", expected: "U64", .. }), "{e}");
        } else {
            assert!(matches!(e, TraceError::Shape { tensor: "seq_offsets", .. }), "{e}");
        }
    }
    // score_kind says logits, but there is no scores tensor.
    let ok_ids: Vec<u8> = [0u16, 1, 2, 3, 2, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
    raw_file(
        &p,
        serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12)}),
        &ok_ids,
    );
    assert!(matches!(open_err(&p), TraceError::MissingTensor { tensor: "scores" }));
}

#[test]
fn metadata_and_content_violations_in_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let ids_t = serde_json::json!({"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]});
    let u16s = |v: [u16; 6]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut none = meta(1, 4, 2);
    none.score_kind = ScoreKind::None;
    // Metadata: absent entirely, wrong format name, bad values.
    raw_file(&p, serde_json::json!({"ids": ids_t}), &u16s([0, 1, 2, 3, 2, 1]));
    assert!(matches!(open_err(&p), TraceError::MissingMetadata { key: "format" }));
    for (key, value) in [
        ("format", "other"),
        ("num_experts", "0"),
        ("num_experts", "65537"),
        ("num_experts", "-1"),
        ("top_k", "0"),
        ("layer_ids", "{}"),
        ("layer_ids", "[]"),
        ("score_kind", "probs"),
        ("phase", "train"),
    ] {
        let mut md = none.to_map();
        md.insert(key.into(), value.into());
        raw_file(&p, serde_json::json!({"__metadata__": md, "ids": ids_t}), &u16s([0, 1, 2, 3, 2, 1]));
        let e = open_err(&p);
        assert!(matches!(&e, TraceError::BadMetadata { key: k, .. } if *k == key), "{key}={value}: {e}");
    }
    for key in ["model", "top_k", "layer_ids", "score_kind", "phase", "source", "format_version"] {
        let mut md = none.to_map();
        md.remove(key);
        raw_file(&p, serde_json::json!({"__metadata__": md, "ids": ids_t}), &u16s([0, 1, 2, 3, 2, 1]));
        let e = open_err(&p);
        assert!(matches!(&e, TraceError::MissingMetadata { key: k } if *k == key), "{key}: {e}");
    }
    // top_k larger than the row width.
    let mut md = none.to_map();
    md.insert("top_k".into(), "4".into());
    raw_file(&p, serde_json::json!({"__metadata__": md, "ids": ids_t}), &u16s([0, 1, 2, 3, 2, 1]));
    assert!(matches!(open_err(&p), TraceError::BadMetadata { key: "top_k", .. }));
    // Content of a file: an id >= E (token 1, slot 2), a repeated id, offsets.
    let md = none.to_map();
    raw_file(&p, serde_json::json!({"__metadata__": md, "ids": ids_t}), &u16s([0, 1, 2, 3, 2, 4]));
    let e = open_err(&p);
    assert!(
        matches!(
            e,
            TraceError::Value {
                tensor: "ids",
                layer: 0,
                layer_id: 0,
                token: 1,
                slot: 2,
                problem: ValueProblem::IdOutOfRange { id: 4, num_experts: 4 }
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("token 1, slot 2: expert id 4 >= num_experts 4"), "{e}");
    for (offs, index, reason) in [([1u64, 1], 0, "first"), ([0, 0], 1, "increasing"), ([0, 2], 1, "below")] {
        let data: Vec<u8> = offs.iter().flat_map(|x| x.to_le_bytes()).chain(u16s([0, 1, 2, 3, 2, 1])).collect();
        raw_file(
            &p,
            serde_json::json!({"__metadata__": md,
                "step_offsets": {"dtype": "U64", "shape": [2], "data_offsets": [0, 16]},
                "ids": {"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [16, 28]}}),
            &data,
        );
        let e = open_err(&p);
        assert!(
            matches!(&e, TraceError::Offsets { tensor: "step_offsets", index: i, reason: r, .. } if *i == index && r.contains(reason)),
            "{e}"
        );
    }
}

#[test]
fn negative_norms_and_absurd_dimensions_are_refused() {
    let mut parts = tiny_parts();
    parts.out_norms.as_mut().unwrap()[2] = -1.0;
    let e = TraceData::new(meta(1, 4, 2), 2, 3, parts).unwrap_err();
    assert!(
        matches!(
            e,
            TraceError::Value { tensor: "out_norms", token: 1, slot: 0, problem: ValueProblem::Negative { .. }, .. }
        ),
        "{e}"
    );
    // A token count whose [L, T, m] product overflows is a shape error, not a panic.
    let e = TraceData::new(meta(1, 4, 2), usize::MAX / 2, 3, tiny_parts()).unwrap_err();
    assert!(matches!(e, TraceError::Shape { tensor: "ids", .. }), "{e}");
}

#[test]
fn a_directory_is_refused_as_one() {
    let dir = tempfile::tempdir().unwrap();
    let e = open_err(dir.path());
    assert!(e.to_string().contains("a directory, not a regular file"), "{e}");
}

#[cfg(unix)]
#[test]
fn fifos_and_devices_are_refused_before_opening() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("pipe.safetensors");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Opening a FIFO for reading blocks until a writer comes: this returns at once instead.
    let e = open_err(&fifo);
    assert!(e.to_string().contains("a FIFO (named pipe), not a regular file"), "{e}");
    let e = open_err(std::path::Path::new("/dev/null"));
    assert!(e.to_string().contains("a device, not a regular file"), "{e}");
}

#[test]
fn atomic_writes_create_parents_and_name_a_file_in_the_way() {
    let dir = tempfile::tempdir().unwrap();
    // missing parents are created
    let nested = dir.path().join("a/b/out.json");
    trace_io::write_atomic(&nested, |w| w.write_all(b"{}")).unwrap();
    assert_eq!(std::fs::read(&nested).unwrap(), b"{}");
    // a file where a directory is needed is named, and nothing is written
    let file = dir.path().join("j.json");
    std::fs::write(&file, "x").unwrap();
    let err = trace_io::write_atomic(&file.join("s.json"), |w| w.write_all(b"{}")).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotADirectory);
    assert!(err.to_string().contains("j.json is a file, not a directory"), "{err}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn refusals_do_not_depend_on_the_order_of_the_header_map() {
    // Found by the fuzz target: with two unknown tensors, or two tensors at the same offsets, the
    // tensor named depended on the order of a hash map (the mapped and the in-memory opener of
    // the same bytes disagreed).
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    let z = |o: [usize; 2]| serde_json::json!({"dtype": "U8", "shape": [0], "data_offsets": o});
    let ids = |shape: serde_json::Value, end: u64| serde_json::json!({"dtype": "U16", "shape": shape, "data_offsets": [0, end]});
    let cases = [
        (
            serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "zz": z([12, 12]), "mm": z([12, 12]), "aa": z([12, 12])}),
            "unexpected tensor `aa`",
            12,
        ),
        (
            serde_json::json!({"__metadata__": raw_meta(), "ids": ids(serde_json::json!([1, 2, 3]), 12),
            "scores": {"dtype": "F32", "shape": [1, 2, 3], "data_offsets": [0, 24]}}),
            "tensor `scores` has data_offsets 0..24, but it must start where `ids` ends (12)",
            36,
        ),
    ];
    for (header, want, data) in cases {
        raw_file(&p, header, &vec![0u8; data]);
        for _ in 0..16 {
            let e = open_err(&p).to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}

/// A header written twice over one key (a tensor entry, or a metadata key) is refused naming the
/// key and the file: serde keeps the last one, so the file would be read as something else.
#[test]
fn repeated_header_keys_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let md = r#"{"format": "moe-offload-trace", "format_version": "1", "model": "x", "num_experts": "4",
        "top_k": "2", "layer_ids": "[0]", "score_kind": "none", "phase": "decode", "source": "x"}"#;
    let ids = r#"{"dtype": "U16", "shape": [1, 2, 3], "data_offsets": [0, 12]}"#;
    let raw = |name: &str, header: String| {
        let mut h = header.into_bytes();
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(&h);
        bytes.extend_from_slice(&[0, 0, 1, 0, 2, 0, 3, 0, 2, 0, 1, 0]);
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let ok = raw("ok.safetensors", format!(r#"{{"__metadata__": {md}, "ids": {ids}}}"#));
    TraceFile::open(&ok).unwrap();
    // (file, header, the message)
    let twice_model = md.replace(r#""source": "x""#, r#""source": "x", "model": "y""#);
    let cases = [
        (
            "tensor.safetensors",
            format!(r#"{{"__metadata__": {md}, "ids": {ids}, "ids": {ids}}}"#),
            "tensor `ids` twice",
        ),
        (
            "meta.safetensors",
            format!(r#"{{"__metadata__": {twice_model}, "ids": {ids}}}"#),
            "`__metadata__` key `model` twice",
        ),
        (
            "metadata.safetensors",
            format!(r#"{{"__metadata__": {md}, "__metadata__": {md}, "ids": {ids}}}"#),
            "`__metadata__` twice",
        ),
    ];
    for (name, header, want) in cases {
        let p = raw(name, header);
        let e = TraceFile::open(&p).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains(name), "{name}: {e}");
        let bytes = std::fs::read(&p).unwrap();
        let e = TraceFile::from_bytes(&bytes).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains(want), "{name} in memory: {e}");
    }
}
