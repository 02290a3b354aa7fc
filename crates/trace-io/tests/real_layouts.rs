//! Layouts of vLLM route logs that real loggers produce, built from the real Qwen1.5-MoE logs in
//! `$MOE_OFFLOAD_REAL_DATA/vllm-routelog-qwen15moe/`: a log holding two engine runs one after the
//! other (the second run's warm-up in the middle), and a logger that never restarts `token_idx`
//! with placeholder rows of uniform weights in front. Each must give the rows of the plain import,
//! with the runs as sequences and every dummy region reported.

use std::path::{Path, PathBuf};

use trace_io::import::DropReason;
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};

const LAYERS: [u32; 5] = [0, 8, 12, 18, 23];
/// Route rows per real file, and the rows after the two warm-up batches (8,192 + 256).
const ROWS: usize = 12805;
const REAL: usize = 4357;
const WARM: usize = 8448;

fn opts() -> VllmRoutelogOptions {
    VllmRoutelogOptions { num_experts: Some(60), ..Default::default() }
}

fn real_files(real: &Path) -> Vec<PathBuf> {
    LAYERS.iter().map(|l| real.join(format!("vllm-routelog-qwen15moe/moe_layer{l}.jsonl"))).collect()
}

/// Writes each real file transformed by `f` (its lines in, the new text out) under `dir`.
fn rewrite(real: &Path, dir: &Path, f: impl Fn(&[&str]) -> String) -> Vec<PathBuf> {
    real_files(real)
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            let out = dir.join(p.file_name().unwrap());
            std::fs::write(&out, f(&lines)).unwrap();
            out
        })
        .collect()
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn a_log_of_two_engine_runs_gives_two_sequences() {
    let real = real_data::dir();
    let plain = import_vllm_routelog(&real_files(&real), &opts()).unwrap();
    let pv = plain.trace.view();
    let dir = tempfile::tempdir().unwrap();
    // `cat log log`: the second copy's meta line and warm-up batches sit in the middle. Then the
    // same without the second meta line (a logger that appends rows only).
    for with_meta in [true, false] {
        let files = rewrite(&real, dir.path(), |lines| {
            let second = if with_meta { lines } else { &lines[1..] };
            lines.iter().chain(second).copied().collect::<Vec<_>>().join("\n") + "\n"
        });
        let out = import_vllm_routelog(&files, &opts()).unwrap();
        let v = out.trace.view();
        assert_eq!(v.shape().tokens, 2 * REAL, "with_meta {with_meta}");
        assert_eq!(v.seq_offsets().unwrap(), &[0, REAL as u64]);
        // The step structure of each run, twice: 129 steps each.
        let steps = v.step_offsets().unwrap();
        assert_eq!(steps.len(), 2 * 129);
        assert_eq!(steps[129], REAL as u64);
        assert_eq!(&steps[..129], pv.step_offsets().unwrap());
        // Both halves are the plain import, layer by layer.
        for l in 0..LAYERS.len() {
            let (a, b) = v.layer_ids(l).split_at(REAL * 4);
            assert_eq!((a, b), (pv.layer_ids(l), pv.layer_ids(l)), "layer {l}");
        }
        let r = &out.report;
        let regions: Vec<(DropReason, u64, u64)> = r.dropped.iter().map(|d| (d.reason, d.tokens, d.records)).collect();
        assert_eq!(regions, [(DropReason::WarmUp, WARM as u64, 5 * WARM as u64); 2]);
        assert!(
            r.dropped[1].detail.starts_with(&format!("rows {ROWS}..{} (lines", ROWS + WARM)),
            "{}",
            r.dropped[1].detail
        );
        assert_eq!(
            v.meta().extra["dummy_rows"],
            format!(
                "0..8192 identical_route,8192..8448 identical_route,{ROWS}..{} identical_route,{}..{} identical_route",
                ROWS + 8192,
                ROWS + 8192,
                ROWS + WARM
            )
        );
        assert_eq!(v.meta().extra["engine_run_rows"], format!("0,{ROWS}"));
        let why = if with_meta {
            "a meta line before line 12808 starts a new engine run"
        } else {
            "(a warm-up batch) after 4357 real rows of the run"
        };
        assert!(
            r.notes.iter().any(|n| n.starts_with(&format!("engine run starts at row {ROWS}")) && n.contains(why)),
            "{:?}",
            r.notes
        );
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);

        // --keep-warmup keeps every row and the boundary at the second warm-up.
        let kept = import_vllm_routelog(&files, &VllmRoutelogOptions { keep_warmup: true, ..opts() }).unwrap();
        assert_eq!(kept.trace.view().shape().tokens, 2 * ROWS);
        assert_eq!(kept.trace.view().seq_offsets().unwrap(), &[0, ROWS as u64]);
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn a_never_restarting_token_idx_with_uniform_dummies_in_front() {
    let real = real_data::dir();
    let plain = import_vllm_routelog(&real_files(&real), &opts()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    const DUMMIES: usize = 2048;
    let files = rewrite(&real, dir.path(), |lines| {
        let layer: u32 = lines[1].split("\"layer\": ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
        let mut out = vec![lines[0].to_string()];
        let route = |t: usize, ids: &str, weights: &str| {
            format!(
                r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": {layer}, "topk_ids": {ids}, "topk_weights": {weights}}}"#
            )
        };
        for t in 0..DUMMIES {
            out.push(route(t, "[0, 1, 2, 3]", "[0.25, 0.25, 0.25, 0.25]"));
        }
        for (i, line) in lines[1..].iter().enumerate() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            out.push(route(DUMMIES + i, &v["topk_ids"].to_string(), &v["topk_weights"].to_string()));
        }
        out.join("\n") + "\n"
    });
    let out = import_vllm_routelog(&files, &opts()).unwrap();
    let v = out.trace.view();
    assert_eq!(v.shape().tokens, REAL);
    // One step: the engine steps are unknown, so the content alone found the dummies.
    assert_eq!(v.step_offsets().unwrap(), &[0]);
    assert_eq!(v.seq_offsets(), None);
    assert_eq!(v.parts().ids, plain.trace.view().parts().ids);
    assert_eq!(v.parts().scores, plain.trace.view().parts().scores);
    let r = &out.report;
    assert_eq!(r.dropped.len(), 1);
    let d = &r.dropped[0];
    assert_eq!(
        (d.reason, d.tokens, d.records),
        (DropReason::WarmUp, (DUMMIES + WARM) as u64, 5 * (DUMMIES + WARM) as u64)
    );
    assert_eq!(
        d.detail,
        "rows 0..10496 (lines 2-10497 of each file; engine step 0, in part): 2048 rows with uniform weights 1/4, \
         then 8192 rows with one identical route, then 256 rows with one identical route, in every layer"
    );
    assert_eq!(
        v.meta().extra["dummy_rows"],
        "0..2048 uniform_weights,2048..10240 identical_route,10240..10496 identical_route"
    );
    assert!(r.notes.iter().any(|n| n.starts_with("token_idx never restarts at 0: the log records a single engine step of 14853 rows")), "{:?}", r.notes);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);

    // --skip-rows takes what the rules would not: the first 100 real rows, on top of the dummies.
    let skip = VllmRoutelogOptions { skip_rows: one(10496..10596), ..opts() };
    let out = import_vllm_routelog(&files, &skip).unwrap();
    assert_eq!(out.trace.view().shape().tokens, REAL - 100);
    assert_eq!(out.trace.view().layer_ids(0), &plain.trace.view().layer_ids(0)[400..]);
    assert_eq!(out.report.dropped.last().map(|d| (d.reason, d.tokens)), Some((DropReason::Skipped, 100)));
}

/// One range of rows to skip.
fn one(rows: std::ops::Range<usize>) -> Vec<std::ops::Range<usize>> {
    vec![rows]
}
