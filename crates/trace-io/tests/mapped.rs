//! A mapped trace truncated under the reader: the process ends with status 1 and a message naming
//! the file, not a silent SIGBUS.
//!
//! The truncation must happen in a process of its own (it ends that process), so the test runs
//! this test binary again with `MOE_OFFLOAD_TEST_TRUNCATE` set: in that child, `truncate_child`
//! opens the trace, truncates it and reads it.

#![cfg(unix)]

use std::collections::BTreeMap;
use std::path::Path;

use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceFile, TraceMeta, write_trace};

const CHILD: &str = "MOE_OFFLOAD_TEST_TRUNCATE";

/// A trace of several pages: 2 layers, 20,000 tokens, m = k = 2, E = 8, ids shifted by `shift`.
fn write_big(path: &Path, shift: usize) {
    let meta = TraceMeta {
        model: "sigbus".into(),
        num_experts: 8,
        top_k: 2,
        layer_ids: vec![0, 1],
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: "test".into(),
        extra: BTreeMap::new(),
    };
    let t = 20_000;
    let ids: Vec<u16> = (0..2 * t).map(|r| r + shift).flat_map(|r| [(r % 8) as u16, ((r + 1) % 8) as u16]).collect();
    let parts = OwnedParts { ids, scores: None, gates: None, out_norms: None, seq_offsets: None, step_offsets: None };
    let data = TraceData::new(meta, t, 2, parts).unwrap();
    write_trace(path, &data.view()).unwrap();
}

/// The child of `a_trace_truncated_while_mapped_ends_the_process_with_a_message`, which runs it
/// with `--ignored` and the trace's path in `CHILD`: open, truncate to 100 bytes, read.
#[test]
#[ignore = "the child process of a_trace_truncated_while_mapped_ends_the_process_with_a_message, run by it"]
fn truncate_child() {
    let path = std::env::var(CHILD).expect("run by its parent test, which sets the trace path");
    let f = TraceFile::open(&path).unwrap();
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(100).unwrap();
    let v = f.view();
    let sum: u64 = (0..v.shape().layers).map(|l| v.layer_ids(l).iter().map(|&e| u64::from(e)).sum::<u64>()).sum();
    // Not reached: the read above faults.
    println!("read {sum} without a fault");
}

#[test]
fn a_trace_truncated_while_mapped_ends_the_process_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shrinks.safetensors");
    write_big(&p, 0);
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "truncate_child", "--ignored", "--nocapture", "--test-threads", "1"])
        .env(CHILD, &p)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains(&format!("error: {}: the trace file changed or was truncated while in use", p.display())),
        "{stderr}"
    );
    assert!(!stdout.contains("without a fault"), "{stdout}");
}

#[test]
fn a_trace_replaced_by_rename_keeps_the_old_mapping_readable() {
    // What moe-offload's own writers do: the old mapping stays valid, no fault, no message.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("replaced.safetensors");
    write_big(&p, 0);
    let f = TraceFile::open(&p).unwrap();
    assert_eq!(f.view().layer_ids(1)[..8], [0, 1, 1, 2, 2, 3, 3, 4]);
    write_big(&p, 3);
    assert_eq!(f.view().layer_ids(1)[..8], [0, 1, 1, 2, 2, 3, 3, 4]);
    assert_eq!(TraceFile::open(&p).unwrap().view().layer_ids(1)[..8], [3, 4, 4, 5, 5, 6, 6, 7]);
}
