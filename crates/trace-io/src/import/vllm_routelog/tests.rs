//! Unit tests of the vLLM route-log importer on small hand-written logs.

use std::path::{Path, PathBuf};

use super::*;
use crate::ScoreKind;
use crate::import::DropReason;

const META: &str = r#"{"type": "meta", "model_id": "m", "vllm_version": "0.x", "layers_logged": [LAYER], "top_k": 2}"#;

fn route(layer: u32, t: u64, ids: [u32; 2], w: [f64; 2]) -> String {
    format!(
        r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": {layer}, "topk_ids": [{}, {}], "topk_weights": [{}, {}]}}"#,
        ids[0], ids[1], w[0], w[1]
    )
}

/// A layer file: a warm-up step of 3 identical rows, a prefill step of 2 rows, 2 decode steps
/// of 1 row. `shift` varies the routes between layers.
fn layer_file(dir: &Path, layer: u32, shift: u32) -> PathBuf {
    let mut lines = vec![META.replace("LAYER", &layer.to_string())];
    for t in 0..3 {
        lines.push(route(layer, t, [shift, 1 + shift], [0.5, 0.25]));
    }
    lines.push(route(layer, 0, [2 + shift, 3 + shift], [0.25, 0.5])); // unsorted: 3 first
    lines.push(route(layer, 1, [4, 5], [0.3, 0.3])); // tie: 4 first
    lines.push(route(layer, 0, [1, 0], [0.6, 0.0])); // zero probability: floored
    lines.push(route(layer, 0, [6, 7], [0.4, 0.1]));
    let p = dir.join(format!("moe_layer{layer}.jsonl"));
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

fn opts() -> VllmRoutelogOptions {
    VllmRoutelogOptions { num_experts: Some(8), ..Default::default() }
}

#[test]
fn aligns_layers_drops_warmup_and_records_steps() {
    let dir = tempfile::tempdir().unwrap();
    let l8 = layer_file(dir.path(), 8, 1);
    let l0 = layer_file(dir.path(), 0, 0);
    let out = import_vllm_routelog(&[&l8, &l0], &opts()).unwrap();
    let v = out.trace.view();
    assert_eq!(v.meta().layer_ids, vec![0, 8]);
    let s = v.shape();
    assert_eq!((s.layers, s.tokens, s.candidates, s.top_k, s.num_experts), (2, 4, 2, 2, 8));
    assert_eq!(v.layer_ids(0), &[3, 2, 4, 5, 1, 0, 6, 7]);
    assert_eq!(v.layer_ids(1), &[4, 3, 4, 5, 1, 0, 6, 7]);
    assert_eq!(v.step_offsets().unwrap(), &[0, 2, 3]);
    assert_eq!(v.layer_gates(0).unwrap(), &[0.5, 0.25, 0.3, 0.3, 0.6, 0.0, 0.4, 0.1]);
    let sc = v.layer_scores(0).unwrap();
    assert_eq!(sc[0], 0.5f64.ln() as f32);
    assert_eq!(sc[5], f64::from(PROB_FLOOR).ln() as f32);
    assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::LogProbs, Phase::Mixed));
    assert_eq!(v.meta().model, "m");
    assert_eq!(v.meta().extra["warmup_rows_dropped"], "3");
    let r = &out.report;
    assert_eq!((r.records_read, r.tokens, r.layers, r.steps, r.floored_probs), (14, 4, 2, Some(3), 2));
    assert_eq!(r.dropped.len(), 1);
    assert_eq!((r.dropped[0].reason, r.dropped[0].tokens, r.dropped[0].records), (DropReason::WarmUp, 3, 6));

    let kept = import_vllm_routelog(&[&l0], &VllmRoutelogOptions { keep_warmup: true, ..opts() }).unwrap();
    assert_eq!(kept.trace.view().shape().tokens, 7);
    assert_eq!(kept.trace.view().step_offsets().unwrap(), &[0, 3, 5, 6]);
    assert!(kept.report.dropped.is_empty());
    assert!(kept.report.notes[0].starts_with("kept dummy rows on request: rows 0..3"), "{:?}", kept.report.notes);
}

#[test]
fn refuses_misaligned_and_malformed_logs() {
    let dir = tempfile::tempdir().unwrap();
    let l0 = layer_file(dir.path(), 0, 0);
    // A layer whose last decode step is missing: batch structure differs.
    let l1 = dir.path().join("moe_layer1.jsonl");
    let text = std::fs::read_to_string(layer_file(dir.path(), 1, 0)).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    std::fs::write(&l1, lines[..lines.len() - 1].join("\n")).unwrap();
    let e = import_vllm_routelog(&[&l0, &l1], &opts()).unwrap_err().to_string();
    assert!(e.contains("moe_layer1.jsonl") && e.contains("batch structure differs") && e.contains("step 3"), "{e}");

    // No num_experts anywhere.
    let e = import_vllm_routelog(&[&l0], &VllmRoutelogOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::Config { key: "num_experts", .. }), "{e}");
    // The same layer twice.
    let e = import_vllm_routelog(&[&l0, &l0], &opts()).unwrap_err().to_string();
    assert!(e.contains("layer 0 is also logged by"), "{e}");
    // Layer 1 logged from another model.
    let other = dir.path().join("other1.jsonl");
    let text = std::fs::read_to_string(layer_file(dir.path(), 1, 0)).unwrap();
    std::fs::write(&other, text.replace(r#""model_id": "m""#, r#""model_id": "other/model""#)).unwrap();
    let e = import_vllm_routelog(&[&l0, &other], &opts()).unwrap_err().to_string();
    assert!(e.contains("other1.jsonl:1") && e.contains(r#"model_id = "other/model" disagrees with "m""#), "{e}");

    let bad = dir.path().join("bad.jsonl");
    let cases: [(String, &str); 7] = [
        (route(0, 0, [1, 2], [0.5, 0.2]), "first line must be the meta record"),
        (format!("{}\n{}", META.replace("LAYER", "0"), route(0, 1, [1, 2], [0.5, 0.2])), ":2: token_idx 1, expected 0"),
        (
            format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 9], [0.5, 0.2])),
            ":2: topk_ids/topk_weights: slot 1: expert id 9 >= num_experts 8",
        ),
        (format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 1], [0.5, 0.2])), "repeated"),
        (format!("{}\n{}", META.replace("LAYER", "0"), route(0, 0, [1, 2], [0.5, -0.2])), "probability -0.2"),
        (
            format!(
                "{}\n{}\n{}",
                META.replace("LAYER", "0"),
                route(0, 0, [1, 2], [0.5, 0.2]),
                route(3, 1, [1, 2], [0.5, 0.2])
            ),
            ":3: layer 3 in a file of layer 0",
        ),
        (
            format!("{}\n{{\"type\": \"route\", \"token_idx\": 0}}", META.replace("LAYER", "0")),
            ":2: not a route record",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&bad, text).unwrap();
        let e = import_vllm_routelog(&[&bad], &opts()).unwrap_err();
        assert!(matches!(e, TraceError::Import { format: "vllm-routelog", .. }), "{e}");
        let e = e.to_string();
        assert!(e.contains("bad.jsonl") && e.contains(want), "want {want:?} in {e}");
    }
    // A file that holds only warm-up.
    let mut lines = vec![META.replace("LAYER", "0")];
    lines.extend((0..4).map(|t| route(0, t, [1, 2], [0.5, 0.2])));
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let e = import_vllm_routelog(&[&bad], &opts()).unwrap_err().to_string();
    assert!(e.contains("no route rows left"), "{e}");
}

/// Writes a log of one layer (`layer` 0, E = 8, k = 2): `rows` as (token_idx, ids, weights), with
/// a meta line inserted before each row index of `metas`.
fn write_log(dir: &Path, name: &str, rows: &[(u64, [u32; 2], [f64; 2])], metas: &[usize]) -> PathBuf {
    let meta = META.replace("LAYER", "0");
    let mut lines = vec![meta.clone()];
    for (i, &(t, ids, w)) in rows.iter().enumerate() {
        if metas.contains(&i) {
            lines.push(meta.clone());
        }
        lines.push(route(0, t, ids, w));
    }
    let p = dir.join(name);
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

/// A real-looking row: ids and weights that differ from row to row.
fn real(t: u64, i: u32) -> (u64, [u32; 2], [f64; 2]) {
    (t, [i % 8, (i + 3) % 8], [0.3 + 0.01 * f64::from(i), 0.1])
}

const WARM: (u64, [u32; 2], [f64; 2]) = (0, [1, 2], [0.5, 0.25]);

/// `WARM` as step rows 0..n.
fn warm(n: u64) -> Vec<(u64, [u32; 2], [f64; 2])> {
    (0..n).map(|t| (t, WARM.1, WARM.2)).collect()
}

#[test]
fn dummy_rows_anywhere_and_a_second_engine_run() {
    let dir = tempfile::tempdir().unwrap();
    // Warm-up (3 rows), prefill (2), decode (1); then a second run's warm-up (3), prefill (2).
    let mut rows = warm(3);
    rows.extend([real(0, 0), real(1, 1), real(0, 2)]);
    rows.extend(warm(3));
    rows.extend([real(0, 3), real(1, 4)]);
    let p = write_log(dir.path(), "two-runs.jsonl", &rows, &[]);
    let out = import_vllm_routelog(&[&p], &opts()).unwrap();
    let v = out.trace.view();
    assert_eq!(v.shape().tokens, 5);
    assert_eq!(v.step_offsets().unwrap(), &[0, 2, 3]);
    assert_eq!(v.seq_offsets().unwrap(), &[0, 3]);
    let x = &v.meta().extra;
    assert_eq!(x["dummy_rows"], "0..3 identical_route,6..9 identical_route");
    assert_eq!((x["warmup_rows_detected"].as_str(), x["warmup_rows_dropped"].as_str()), ("6", "6"));
    assert_eq!(x["engine_run_rows"], "0,6");
    let r = &out.report;
    let got: Vec<(DropReason, u64)> = r.dropped.iter().map(|d| (d.reason, d.tokens)).collect();
    assert_eq!(got, [(DropReason::WarmUp, 3), (DropReason::WarmUp, 3)]);
    assert!(
        r.dropped[1]
            .detail
            .starts_with("rows 6..9 (lines 8-10 of each file; engine step 3): 3 rows with one identical route"),
        "{}",
        r.dropped[1].detail
    );
    assert_eq!(r.sequences, Some(2));
    assert!(
        r.notes.iter().any(|n| n.contains(
            "engine run starts at row 6 (line 8; trace token 3): dummy rows 6..9 (a warm-up batch) after 3 real rows"
        )),
        "{:?}",
        r.notes
    );
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // Kept: every row, the run boundary at the second warm-up.
    let kept = import_vllm_routelog(&[&p], &VllmRoutelogOptions { keep_warmup: true, ..opts() }).unwrap();
    let v = kept.trace.view();
    assert_eq!(v.shape().tokens, 11);
    assert_eq!(v.step_offsets().unwrap(), &[0, 3, 5, 6, 9]);
    assert_eq!(v.seq_offsets().unwrap(), &[0, 6]);
    assert_eq!(v.meta().extra["warmup_rows_dropped"], "0");
    assert_eq!(kept.report.notes.iter().filter(|n| n.starts_with("kept dummy rows")).count(), 2);

    // The same log with a meta line where the second run starts: the same boundary.
    let p2 = write_log(dir.path(), "two-runs-meta.jsonl", &rows, &[6]);
    let out2 = import_vllm_routelog(&[&p2], &opts()).unwrap();
    assert_eq!(out2.trace.view().seq_offsets().unwrap(), &[0, 3]);
    assert_eq!(out2.trace.view().parts().ids, out.trace.view().parts().ids);
    assert!(
        out2.report.notes.iter().any(|n| n.contains("a meta line before line 9 starts a new engine run")),
        "{:?}",
        out2.report.notes
    );
}

#[test]
fn a_step_larger_than_the_warmup_batch_starts_a_run() {
    let dir = tempfile::tempdir().unwrap();
    // Warm-up of 2 rows, decode steps of 1, then a step of 3 rows (more than the warm-up's 2).
    let mut rows = warm(2);
    rows.extend([real(0, 0), real(0, 1), real(0, 2), real(1, 3), real(2, 4)]);
    let p = write_log(dir.path(), "big-step.jsonl", &rows, &[]);
    let out = import_vllm_routelog(&[&p], &opts()).unwrap();
    let v = out.trace.view();
    assert_eq!((v.shape().tokens, v.seq_offsets().unwrap()), (5, &[0u64, 2][..]));
    assert!(
        out.report
            .notes
            .iter()
            .any(|n| n.contains("engine step 3 has 3 rows, more than the largest warm-up batch (2 rows)")),
        "{:?}",
        out.report.notes
    );
    // Without a warm-up there is no size to compare with: one run.
    let p = write_log(dir.path(), "no-warmup.jsonl", &rows[2..], &[]);
    assert_eq!(import_vllm_routelog(&[&p], &opts()).unwrap().trace.view().seq_offsets(), None);
}

#[test]
fn uniform_leading_rows_in_a_log_of_one_step_and_renormalized_weights() {
    let dir = tempfile::tempdir().unwrap();
    // token_idx never restarts; three placeholder rows of weights 1/2 on varying ids, then rows
    // renormalized over the top-2 (they sum to 1).
    let rows = [
        (0, [1, 2], [0.5, 0.5]),
        (1, [3, 4], [0.5, 0.5]),
        (2, [5, 6], [0.5, 0.5]),
        (3, [1, 5], [0.75, 0.25]),
        (4, [0, 7], [0.625, 0.375]),
    ];
    let p = write_log(dir.path(), "one-step.jsonl", &rows, &[]);
    let out = import_vllm_routelog(&[&p], &opts()).unwrap();
    let v = out.trace.view();
    assert_eq!((v.shape().tokens, v.step_offsets().unwrap()), (2, &[0u64][..]));
    assert_eq!(v.layer_ids(0), &[1, 5, 0, 7]);
    assert_eq!(v.meta().extra["dummy_rows"], "0..3 uniform_weights");
    assert!(
        out.report.dropped[0].detail.contains("3 rows with uniform weights 1/2"),
        "{}",
        out.report.dropped[0].detail
    );
    assert!(out.report.dropped[0].detail.contains("engine step 0, in part"), "{}", out.report.dropped[0].detail);
    assert!(out.report.notes.iter().any(|n| n.starts_with("token_idx never restarts at 0")), "{:?}", out.report.notes);
    // Renormalization detected, and said.
    assert_eq!(v.meta().score_kind, ScoreKind::LogProbsRenormalized);
    assert!(v.meta().extra["renormalized"].starts_with("true"));
    assert_eq!(v.meta().extra["gates"], "probabilities renormalized over the 2 used experts");
    // The layer files of the other tests are not renormalized and say so.
    let l0 = layer_file(dir.path(), 0, 0);
    let v = import_vllm_routelog(&[&l0], &opts()).unwrap();
    assert_eq!(v.trace.view().meta().score_kind, ScoreKind::LogProbs);
    assert!(v.trace.view().meta().extra["gates"].ends_with("not renormalized"));
}

#[test]
fn skip_rows_and_meta_lines_of_new_runs() {
    let dir = tempfile::tempdir().unwrap();
    let rows = [real(0, 0), real(1, 1), real(0, 2), real(1, 3)];
    let p = write_log(dir.path(), "meta.jsonl", &rows, &[2]);
    let out = import_vllm_routelog(&[&p], &opts()).unwrap();
    assert_eq!(out.trace.view().seq_offsets().unwrap(), &[0, 2]);
    assert_eq!(out.trace.view().meta().extra["engine_run_rows"], "0,2");
    assert!(
        out.report.notes.iter().any(|n| n.contains("a meta line before line 5 starts a new engine run")),
        "{:?}",
        out.report.notes
    );

    let skip = VllmRoutelogOptions { skip_rows: one(1..2), ..opts() };
    let out = import_vllm_routelog(&[&p], &skip).unwrap();
    let v = out.trace.view();
    assert_eq!((v.shape().tokens, v.seq_offsets().unwrap()), (3, &[0u64, 1][..]));
    assert_eq!(v.meta().extra["skipped_rows"], "1..2");
    let d = &out.report.dropped[0];
    assert_eq!((d.reason, d.tokens, d.records), (DropReason::Skipped, 1, 1));
    assert_eq!(d.detail, "rows 1..2 (lines 3-3 of each file)");

    let e = import_vllm_routelog(&[&p], &VllmRoutelogOptions { skip_rows: one(2..9), ..opts() }).unwrap_err();
    assert!(
        matches!(&e, TraceError::Config { key: "skip_rows", reason } if reason.contains("has 4 route rows")),
        "{e}"
    );
    let e = import_vllm_routelog(&[&p], &VllmRoutelogOptions { skip_rows: one(0..4), ..opts() }).unwrap_err();
    assert!(e.to_string().contains("no route rows left"), "{e}");
    // Overlapping ranges would count their shared rows twice in the report.
    let overlap = VllmRoutelogOptions { skip_rows: vec![1..3, 0..2], ..opts() };
    let e = import_vllm_routelog(&[&p], &overlap).unwrap_err().to_string();
    assert!(e.contains("0..2 and 1..3 overlap: give each row once (for example 0..3)"), "{e}");

    // A meta line that changes top_k is refused where it stands.
    let text = std::fs::read_to_string(&p).unwrap().replacen("\"top_k\": 2", "\"top_k\": 3", 2).replacen(
        "\"top_k\": 3",
        "\"top_k\": 2",
        1,
    );
    std::fs::write(&p, text).unwrap();
    let e = import_vllm_routelog(&[&p], &opts()).unwrap_err().to_string();
    assert!(e.contains("meta.jsonl:4: meta line of a new engine run has top_k = 3"), "{e}");
}

#[test]
fn rows_that_look_like_dummies_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    // The same two experts on every row with varying weights (no identical route): reuse 1.0;
    // then one row of uniform weights after real rows. Reuse: 5 of 6 transitions reuse both
    // experts, the last neither: 10 / 12.
    let mut rows: Vec<(u64, [u32; 2], [f64; 2])> = (0..6).map(|t| (t, [1, 2], [0.4 + 0.01 * t as f64, 0.2])).collect();
    rows.push((6, [3, 4], [0.5, 0.5]));
    let p = write_log(dir.path(), "suspicious.jsonl", &rows, &[]);
    let out = import_vllm_routelog(&[&p], &opts()).unwrap();
    assert!(out.report.dropped.is_empty());
    let w = &out.report.warnings;
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].starts_with("layer 0: next-token expert reuse 0.833 over the kept rows, above 0.625"), "{w:?}");
    assert!(w[1].starts_with("1 kept row(s) have uniform weights 1/2 in every layer (first: row 6, line 8)"), "{w:?}");
    assert!(out.report.to_string().contains("\nwarning: layer 0: next-token expert reuse"));
}

#[test]
fn row_ranges_parse_or_say_why_not() {
    let cases: [(&str, Result<Range<usize>, &str>); 5] = [
        ("0..2048", Ok(0..2048)),
        (" 5 .. 7", Ok(5..7)),
        ("7..7", Err("is empty")),
        ("3-9", Err("write A..B")),
        ("a..9", Err("`a` is not a row number")),
    ];
    for (s, want) in cases {
        match (parse_row_range(s), want) {
            (Ok(r), Ok(w)) => assert_eq!(r, w, "{s}"),
            (Err(e), Err(w)) => assert!(e.contains(w), "{s}: {e}"),
            (got, want) => panic!("{s}: got {got:?}, want {want:?}"),
        }
    }
}

/// One range of rows to skip.
fn one(rows: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
    vec![rows]
}
