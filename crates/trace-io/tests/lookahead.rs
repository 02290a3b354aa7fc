//! The optional `lookahead_ids` tensor: round trip, and refusals on open and in memory.

use std::collections::BTreeMap;
use std::path::Path;

use trace_io::{
    Lookahead, Phase, ScoreKind, TraceError, TraceFile, TraceMeta, TraceParts, TraceView, ValueProblem, write_trace,
};

/// 2 layers (ids 3 and 5), 2 tokens, m = 2, k = 1, E = 4.
fn meta() -> TraceMeta {
    TraceMeta {
        model: "test".into(),
        num_experts: 4,
        top_k: 1,
        layer_ids: vec![3, 5],
        score_kind: ScoreKind::None,
        phase: Phase::Prefill,
        source: "unit test".into(),
        extra: BTreeMap::new(),
    }
}

const IDS: [u16; 8] = [0, 1, 2, 3, 1, 0, 3, 2];

fn parts<'a>(la: &'a [u16], width: usize) -> TraceParts<'a> {
    TraceParts {
        ids: &IDS,
        scores: None,
        gates: None,
        out_norms: None,
        seq_offsets: Some(&[0]),
        step_offsets: None,
        lookahead_ids: Some(Lookahead { ids: la, width }),
    }
}

fn unwrap_file(path: &Path, e: TraceError) -> TraceError {
    match e {
        TraceError::File { path: p, source } if p == path => *source,
        other => panic!("expected an error naming {}, got {other}", path.display()),
    }
}

/// Rewrites the `lookahead_ids` entry of a valid file's header (same byte length) and its data.
fn with_lookahead(dir: &Path, shape: &str, dtype: &str, la: &[u16]) -> std::path::PathBuf {
    let m = meta();
    let good: Vec<u16> = vec![1, 2, 3, 0, 2, 1, 0, 3, 1, 3, 2, 0];
    let src = dir.join("good.safetensors");
    write_trace(&src, &TraceView::new(&m, 2, 2, parts(&good, 3)).unwrap()).unwrap();
    let mut bytes = std::fs::read(&src).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = String::from_utf8(bytes[8..8 + n].to_vec()).unwrap();
    let fixed = header.replace(r#""shape":[2,2,3]"#, shape).replace(r#""dtype":"U16","shape":[2,2,3]"#, dtype);
    assert_eq!(fixed.len(), header.len(), "the edit keeps the header length");
    bytes[8..8 + n].copy_from_slice(fixed.as_bytes());
    let tail = bytes.len() - 2 * la.len();
    bytes[tail..].copy_from_slice(bytemuck::cast_slice(la));
    let p = dir.join("edited.safetensors");
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn lookahead_ids_round_trip_and_are_exposed_on_the_view() {
    let dir = tempfile::tempdir().unwrap();
    let m = meta();
    let la = [1, 2, 3, 0, 2, 1, 0, 3];
    let path = dir.path().join("t.safetensors");
    write_trace(&path, &TraceView::new(&m, 2, 2, parts(&la, 2)).unwrap()).unwrap();
    let f = TraceFile::open(&path).unwrap();
    let v = f.view();
    assert_eq!(v.lookahead(), Some(Lookahead { ids: &la, width: 2 }));
    // Layer index 1 (id 5), token 0: elements (1 * 2 + 0) * 2 .. + 2.
    assert_eq!(v.lookahead_row(1, 0), Some(&[2u16, 1][..]));
    assert_eq!(v.lookahead_row(1, 1), Some(&[0u16, 3][..]));
    assert_eq!(v.row(1, 0), &[1, 0]);
    // A trace without it has none.
    let plain = TraceParts { lookahead_ids: None, ..parts(&la, 2) };
    let p2 = dir.path().join("plain.safetensors");
    write_trace(&p2, &TraceView::new(&m, 2, 2, plain).unwrap()).unwrap();
    assert_eq!(TraceFile::open(&p2).unwrap().view().lookahead_row(0, 0), None);
}

#[test]
fn bad_lookahead_ids_are_refused_naming_the_tensor() {
    let m = meta();
    // In memory: a length that is not L * T * width, a zero width, ids out of range or repeated.
    let e = TraceView::new(&m, 2, 2, parts(&[0, 1, 2], 1)).unwrap_err();
    assert!(matches!(e, TraceError::Shape { tensor: "lookahead_ids", .. }), "{e}");
    let e = TraceView::new(&m, 2, 2, parts(&[], 0)).unwrap_err();
    assert!(matches!(e, TraceError::Shape { tensor: "lookahead_ids", .. }), "{e}");
    let e = TraceView::new(&m, 2, 2, parts(&[0, 1, 2, 3, 0, 1, 2, 4], 2)).unwrap_err();
    assert!(
        matches!(
            e,
            TraceError::Value {
                tensor: "lookahead_ids",
                layer: 1,
                layer_id: 5,
                token: 1,
                slot: 1,
                problem: ValueProblem::IdOutOfRange { id: 4, num_experts: 4 }
            }
        ),
        "{e}"
    );
    let e = TraceView::new(&m, 2, 2, parts(&[0, 1, 2, 2, 0, 1, 2, 3], 2)).unwrap_err();
    assert!(
        matches!(
            e,
            TraceError::Value {
                tensor: "lookahead_ids",
                layer: 0,
                token: 1,
                slot: 1,
                problem: ValueProblem::RepeatedId { id: 2 },
                ..
            }
        ),
        "{e}"
    );

    // On open: the same content rules, a shape that is not [L, T, m'], a dtype other than U16.
    let dir = tempfile::tempdir().unwrap();
    let la = [1, 2, 3, 0, 2, 1, 0, 3, 1, 3, 2, 3];
    let p = with_lookahead(dir.path(), r#""shape":[2,2,3]"#, r#""dtype":"U16","shape":[2,2,3]"#, &la);
    let e = unwrap_file(&p, TraceFile::open(&p).unwrap_err());
    assert!(
        matches!(
            e,
            TraceError::Value {
                tensor: "lookahead_ids",
                layer: 1,
                token: 1,
                slot: 2,
                problem: ValueProblem::RepeatedId { id: 3 },
                ..
            }
        ),
        "{e}"
    );
    let good = [1, 2, 3, 0, 2, 1, 0, 3, 1, 3, 2, 0];
    let p = with_lookahead(dir.path(), r#""shape":[1,4,3]"#, r#""dtype":"U16","shape":[1,4,3]"#, &good);
    let e = unwrap_file(&p, TraceFile::open(&p).unwrap_err());
    assert!(matches!(&e, TraceError::Shape { tensor: "lookahead_ids", actual, .. } if actual == &[1, 4, 3]), "{e}");
    let p = with_lookahead(dir.path(), r#""shape":[2,2,3]"#, r#""dtype":"I16","shape":[2,2,3]"#, &good);
    let e = unwrap_file(&p, TraceFile::open(&p).unwrap_err());
    assert!(matches!(e, TraceError::Dtype { tensor: "lookahead_ids", expected: "U16", .. }), "{e}");
}
