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
    while h.len() % 8 != 0 {
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
}

#[test]
fn content_violations_name_tensor_layer_token_and_value() {
    let cases: Vec<(fn(&mut OwnedParts), &str, usize, ValueProblem)> = vec![
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
    assert!(matches!(open_err(&p), TraceError::Container(_)));
    // Header length longer than the file.
    let p = dir.path().join("header.safetensors");
    let mut b = bytes.clone();
    b[..8].copy_from_slice(&(bytes.len() as u64 * 2).to_le_bytes());
    std::fs::write(&p, &b).unwrap();
    assert!(matches!(open_err(&p), TraceError::Container(_)));
    // Shorter than the length prefix.
    std::fs::write(&p, [1u8, 2, 3]).unwrap();
    assert!(matches!(open_err(&p), TraceError::Container(_)));

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
