//! Validation of what a command reads (SEMANTICS.md §1): the parallel, vectorized check names
//! the first violation exactly as a plain element-by-element scan does, for every part a
//! command may ask for, and a view records what was validated.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trace_io::summary::{SHUFFLE_SEED, layer_usage, shuffled_order, validate_with_usage};
use trace_io::synth::SynthConfig;
use trace_io::{Reads, TraceError, TraceFile};

/// L, E, k, m, T: 9,000 rows, so blocks of 1,024 rows cross layer boundaries.
fn config() -> SynthConfig {
    SynthConfig {
        layers: 3,
        experts: 20,
        top_k: 3,
        candidates: 8,
        tokens: 3000,
        sequences: 3,
        norms: true,
        ..SynthConfig::default()
    }
}

/// Byte position of element `index` of `tensor` (of `size` bytes) in the safetensors file `bytes`.
fn position(bytes: &[u8], tensor: &str, index: usize, size: usize) -> usize {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    8 + n + header[tensor]["data_offsets"][0].as_u64().unwrap() as usize + index * size
}

/// The plain scan (the validator before issue 29): the first violation of `need`, as the
/// message of [`TraceError::Value`] without the file.
fn plain(ids: &[u16], scores: &[f32], gates: &[f32], norms: &[f32], need: Reads) -> Option<String> {
    let SynthConfig { experts: e, top_k: k, candidates: m, tokens: t, .. } = config();
    let at = |tensor: &str, row: usize, slot: usize, what: String| {
        Some(format!(
            "tensor `{tensor}`, layer {} (index {}), token {}, slot {slot}: {what}",
            row / t,
            row / t,
            row % t
        ))
    };
    for (r, row) in ids.chunks(m).enumerate() {
        let mut seen = vec![false; e];
        for (i, &id) in row[..need.ids.min(m)].iter().enumerate() {
            if usize::from(id) >= e {
                return at("ids", r, i, format!("expert id {id} >= num_experts {e}"));
            }
            if std::mem::replace(&mut seen[usize::from(id)], true) {
                return at("ids", r, i, format!("expert id {id} repeated in the row"));
            }
        }
    }
    if need.scores {
        for (r, row) in scores.chunks(m).enumerate() {
            let mut prev = f32::INFINITY;
            for (i, &v) in row.iter().enumerate() {
                if !v.is_finite() {
                    return at("scores", r, i, format!("value {v} is not finite"));
                }
                if v > prev {
                    let what = format!(
                        "score {v} is larger than the previous score {prev} (rows must be in descending score)"
                    );
                    return at("scores", r, i, what);
                }
                prev = v;
            }
        }
    }
    for (tensor, data, on) in [("gates", gates, need.gates), ("out_norms", norms, need.out_norms)] {
        for (pos, &v) in data.iter().enumerate().filter(|_| on) {
            if !v.is_finite() {
                return at(tensor, pos / k, pos % k, format!("value {v} is not finite"));
            }
            if v < 0.0 {
                return at(tensor, pos / k, pos % k, format!("value {v} is negative"));
            }
        }
    }
    None
}

/// The message of a content error, without the file around it.
fn message(e: &TraceError) -> String {
    match e {
        TraceError::File { source, .. } => message(source),
        e => e.to_string(),
    }
}

/// Random corruptions (one to three per file, of every kind, anywhere): `view_for` with every
/// kind of request and `open` refuse with the plain scan's first violation, or accept when the
/// scan finds none in what was asked; a view records what was validated.
#[test]
fn fast_check_names_what_the_plain_scan_names() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean.safetensors");
    let cfg = config();
    trace_io::synth::write(&clean, &cfg, 1, &|_| {}).unwrap();
    let original = std::fs::read(&clean).unwrap();
    let (m, k, rows) = (cfg.candidates, cfg.top_k, cfg.layers * cfg.tokens);
    let mut rng = ChaCha8Rng::seed_from_u64(29);
    let requests = [
        Reads::ids(1),
        Reads::ids(k),
        Reads::ids(5),
        Reads::ids(usize::MAX),
        Reads::ids_and_scores(),
        Reads::stats(k),
        Reads::EVERYTHING,
    ];
    let mut refused = 0;
    for case in 0..60 {
        let mut bytes = original.clone();
        for _ in 0..rng.random_range(1..=3) {
            match rng.random_range(0..6) {
                0 | 1 => {
                    let (row, slot) = (rng.random_range(0..rows), rng.random_range(0..m));
                    let id: u16 =
                        if rng.random_bool(0.3) { rng.random_range(20..100) } else { rng.random_range(0..20) };
                    let p = position(&bytes, "ids", row * m + slot, 2);
                    bytes[p..p + 2].copy_from_slice(&id.to_le_bytes());
                }
                2 | 3 => {
                    let v = [f32::NAN, f32::INFINITY, 100.0, -100.0][rng.random_range(0..4)];
                    let p = position(&bytes, "scores", rng.random_range(0..rows * m), 4);
                    bytes[p..p + 4].copy_from_slice(&v.to_le_bytes());
                }
                kind => {
                    let tensor = if kind == 4 { "gates" } else { "out_norms" };
                    let v = [f32::NAN, f32::NEG_INFINITY, -1.0, -0.0][rng.random_range(0..4)];
                    let p = position(&bytes, tensor, rng.random_range(0..rows * k), 4);
                    bytes[p..p + 4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
        let path: PathBuf = dir.path().join(format!("case{case}.safetensors"));
        std::fs::write(&path, &bytes).unwrap();
        let (ids, scores, gates, norms) = tensors(&path);
        for need in requests {
            let want = plain(&ids, &scores, &gates, &norms, need);
            let file = TraceFile::open_lazy(&path).unwrap();
            match (file.view_for(need), &want) {
                (Ok(v), None) => {
                    v.require(need).unwrap();
                    assert!(file.view().require(need).is_ok());
                }
                (Err(e), Some(w)) => {
                    assert_eq!(&message(&e), w, "case {case}, {need}");
                    refused += 1;
                }
                (got, want) => panic!("case {case}, {need}: got {:?}, the plain scan {want:?}", got.err()),
            }
        }
        let full = plain(&ids, &scores, &gates, &norms, Reads::EVERYTHING);
        let opened = TraceFile::open(&path).err().map(|e| e.to_string());
        assert_eq!(TraceFile::open(&path).err().map(|e| message(&e)), full, "case {case}");
        // inspect's fused check and summary refuses with open's error, file and all.
        let lazy = TraceFile::open_lazy(&path).unwrap();
        let fused = validate_with_usage(&lazy, SHUFFLE_SEED).err().map(|e| e.to_string());
        assert_eq!(fused, opened, "case {case}");
    }
    assert!(refused > 100, "the corruptions reach every request ({refused} refusals)");
}

/// The tensors of a file as stored (read without validation, by the header's offsets).
fn tensors(path: &Path) -> (Vec<u16>, Vec<f32>, Vec<f32>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap();
    let cfg = config();
    let (m, k, rows) = (cfg.candidates, cfg.top_k, cfg.layers * cfg.tokens);
    let read = |tensor: &str, n: usize, size: usize| -> Vec<[u8; 4]> {
        let p = position(&bytes, tensor, 0, size);
        bytes[p..p + n * size]
            .chunks(size)
            .map(|c| [c[0], c[1], *c.get(2).unwrap_or(&0), *c.get(3).unwrap_or(&0)])
            .collect()
    };
    let ids = read("ids", rows * m, 2).iter().map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
    let f32s = |t: &str, n| read(t, n, 4).iter().map(|b| f32::from_le_bytes(*b)).collect();
    (ids, f32s("scores", rows * m), f32s("gates", rows * k), f32s("out_norms", rows * k))
}

/// A view of a lazily opened file covers what was asked and refuses more, naming both; asking
/// again validates nothing new; `open` validates everything.
#[test]
fn views_record_what_was_validated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    trace_io::synth::write(&path, &config(), 1, &|_| {}).unwrap();
    let lazy = TraceFile::open_lazy(&path).unwrap();
    let e = lazy.view().require(Reads::ids(1)).unwrap_err();
    assert_eq!(e.to_string(), "the trace view was validated for nothing, but this computation reads ids up to rank 1");
    let v = lazy.view_for(Reads::ids(3)).unwrap();
    assert!(v.require(Reads::ids(2)).is_ok());
    let e = v.require(Reads::stats(3)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the trace view was validated for ids up to rank 3, but this computation reads ids up to rank 3, gates, out_norms"
    );
    // m = 8: every candidate is rank 8.
    assert_eq!(lazy.view_for(Reads::ids(usize::MAX)).unwrap().reads(), Reads::ids(8));
    let full = TraceFile::open(&path).unwrap();
    assert!(full.view().require(Reads::EVERYTHING).is_ok());
}

/// inspect's fused pass gives every layer the figures of `layer_usage` on the validated view,
/// bit for bit, on one thread and on two, on a trace whose layers span several parallel tasks of
/// the reuse passes (8,192 tokens) and blocks of the check (1,024 rows) with a remainder, and
/// validates everything.
#[test]
fn fused_usage_equals_the_plain_summary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.safetensors");
    let cfg = SynthConfig { layers: 2, tokens: 20_011, sequences: 7, ..config() };
    trace_io::synth::write(&path, &cfg, 1, &|_| {}).unwrap();
    let full = TraceFile::open(&path).unwrap();
    let perm = shuffled_order(cfg.tokens, SHUFFLE_SEED);
    let want: Vec<_> = (0..cfg.layers).map(|l| layer_usage(&full.view(), l, &perm)).collect();
    assert!(want.iter().all(|u| u.next_token_reuse > u.shuffled_reuse && u.shuffled_reuse > 0.0), "{want:?}");
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let lazy = TraceFile::open_lazy(&path).unwrap();
        let (view, got) = pool.install(|| validate_with_usage(&lazy, SHUFFLE_SEED)).unwrap();
        assert_eq!(view.reads(), full.view().reads(), "{threads} threads");
        assert_eq!(format!("{got:?}"), format!("{want:?}"), "{threads} threads");
    }
}
