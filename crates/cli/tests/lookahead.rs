//! A captured trace with `lookahead_ids` (python/capture_routing.py --lookahead) is accepted,
//! inspected and replayed.

mod common;

use std::collections::BTreeMap;

use common::{ok, s};
use trace_io::{Lookahead, Phase, ScoreKind, TraceMeta, TraceParts, TraceView, write_trace};

#[test]
fn inspect_shows_the_lookahead_width_and_replay_accepts_the_trace() {
    let meta = TraceMeta {
        model: "tiny".into(),
        num_experts: 4,
        top_k: 1,
        layer_ids: vec![0, 1],
        score_kind: ScoreKind::None,
        phase: Phase::Prefill,
        source: "test".into(),
        extra: BTreeMap::new(),
    };
    // 2 layers, 3 tokens, m = 2; lookahead m' = 3.
    let ids = [0, 1, 2, 3, 0, 2, 1, 0, 3, 2, 2, 1];
    let la = [1, 2, 3, 0, 1, 2, 3, 2, 1, 0, 3, 2, 2, 1, 0, 1, 0, 3];
    let parts = TraceParts {
        ids: &ids,
        scores: None,
        gates: None,
        out_norms: None,
        seq_offsets: Some(&[0]),
        step_offsets: None,
        lookahead_ids: Some(Lookahead { ids: &la, width: 3 }),
    };
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("la.safetensors");
    write_trace(&trace, &TraceView::new(&meta, 3, 2, parts).unwrap()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&trace), "--json"])).unwrap();
    assert_eq!(json["tensors"]["lookahead_ids"], 3);
    assert!(ok(&["inspect", s(&trace)]).contains("lookahead_ids: 3 ids per layer and token"));
    let r: serde_json::Value =
        serde_json::from_str(&ok(&["replay", s(&trace), "--policy", "lru", "--cap", "2", "--warmup", "0", "--json"]))
            .unwrap();
    assert_eq!(r["picks"], 2 * 3);
}
