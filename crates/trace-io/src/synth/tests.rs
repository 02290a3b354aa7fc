//! Tests of the generator: determinism, shape, the model's expectations, streamed = in memory.

use super::*;
use crate::{TraceError, TraceFile, TraceView, write_trace};

fn small() -> SynthConfig {
    SynthConfig {
        layers: 3,
        experts: 16,
        top_k: 3,
        candidates: 6,
        tokens: 1500,
        sequences: 5,
        ..SynthConfig::default()
    }
}

fn write_bytes(cfg: &SynthConfig, threads: usize) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    write(&p, cfg, threads, &|_| {}).unwrap();
    std::fs::read(&p).unwrap()
}

/// Mean over layers of the fraction of used slots of tokens 1..T (within a sequence) whose
/// expert was used by the previous token, and by one of the `w` tokens before (not the previous).
fn locality(v: &TraceView<'_>, w: usize) -> (f64, f64) {
    let s = v.shape();
    let (k, m) = (s.top_k, s.candidates);
    let starts: Vec<usize> = v.parts().seq_offsets.unwrap().iter().map(|&x| x as usize).collect();
    let (mut next, mut win, mut slots) = (0usize, 0usize, 0usize);
    for l in 0..s.layers {
        let ids = v.layer_ids(l);
        let used = |t: usize| &ids[t * m..t * m + k];
        for t in 1..s.tokens {
            let seq_start = starts.iter().rev().find(|&&x| x <= t).copied().unwrap_or(0);
            if t == seq_start {
                continue;
            }
            for e in used(t) {
                slots += 1;
                if used(t - 1).contains(e) {
                    next += 1;
                } else if (t.saturating_sub(w).max(seq_start)..t - 1).any(|u| used(u).contains(e)) {
                    win += 1;
                }
            }
        }
    }
    (next as f64 / slots as f64, win as f64 / slots as f64)
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let cfg = small();
    let one = write_bytes(&cfg, 1);
    assert_eq!(one, write_bytes(&cfg, 1));
    assert_eq!(one, write_bytes(&cfg, 2));
    assert_eq!(one, write_bytes(&cfg, 3));
    // The streamed file equals the in-memory generation written by `write_trace`.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mem.safetensors");
    write_trace(&p, &generate(&cfg).unwrap().view()).unwrap();
    assert_eq!(one, std::fs::read(&p).unwrap());
    // More tokens than one block: blocks continue the same streams.
    let long = SynthConfig { layers: 2, tokens: BLOCK_ROWS + 700, sequences: 3, ..small() };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("long.safetensors");
    write_trace(&p, &generate(&long).unwrap().view()).unwrap();
    assert_eq!(write_bytes(&long, 2), std::fs::read(&p).unwrap());
    assert_ne!(one, write_bytes(&SynthConfig { seed: 1, ..cfg }, 2));
}

#[test]
fn written_traces_pass_validation() {
    let dir = tempfile::tempdir().unwrap();
    for (i, cfg) in [
        small(),
        SynthConfig { norms: false, ..small() },
        SynthConfig { candidates: 3, reuse: 1.0, window_reuse: 0.0, ..small() },
        SynthConfig { experts: 8, candidates: 7, dead_experts: 3, skew: 40.0, ..small() },
        SynthConfig { tokens: 7, sequences: 7, window: 100, ..small() },
    ]
    .into_iter()
    .enumerate()
    {
        let p = dir.path().join(format!("{i}.safetensors"));
        write(&p, &cfg, 2, &|_| {}).unwrap();
        let f = TraceFile::open(&p).unwrap_or_else(|e| panic!("{cfg:?}: {e}"));
        let v = f.view();
        assert_eq!(v.parts().out_norms.is_some(), cfg.norms);
        // Strictly decreasing scores (no ties to order).
        for row in v.parts().scores.unwrap().chunks_exact(cfg.candidates) {
            assert!(row.windows(2).all(|w| w[0] > w[1]), "{row:?}");
        }
    }
}

#[test]
fn measured_locality_matches_the_request() {
    let shape = SynthConfig { experts: 64, top_k: 4, candidates: 8, tokens: 4000, sequences: 4, window: 8, ..small() };
    for (reuse, window_reuse) in [(0.1, 0.1), (0.27, 0.15), (0.5, 0.3)] {
        let cfg = SynthConfig { reuse, window_reuse, ..shape.clone() };
        let (next, win) = locality(&generate(&cfg).unwrap().view(), 8);
        assert!((next - reuse).abs() < 0.02, "requested next-token reuse {reuse}, measured {next}");
        // Fresh draws also land in the window, at the rate b measured without window draws:
        // expected share = window_reuse + (1 - reuse - window_reuse) · b.
        let control = SynthConfig { window_reuse: 0.0, ..cfg };
        let (_, base) = locality(&generate(&control).unwrap().view(), 8);
        let b = base / (1.0 - reuse);
        let expected = window_reuse + (1.0 - reuse - window_reuse) * b;
        assert!((win - expected).abs() < 0.03, "window reuse {window_reuse}: measured {win}, expected {expected}");
    }
}

#[test]
fn dead_experts_are_never_routed_and_outliers_are_heavy() {
    let cfg = SynthConfig { layers: 4, dead_experts: 3, skew: 0.5, tokens: 3000, ..small() };
    let t = generate(&cfg).unwrap();
    let v = t.view();
    let (e_n, m, k) = (cfg.experts, cfg.candidates, cfg.top_k);
    let mut zero_hit = 0;
    let mut mean_norms = Vec::new();
    for l in 0..cfg.layers {
        let (mut count, mut sum) = (vec![0usize; e_n], vec![0f64; e_n]);
        for (row, norms) in v.layer_ids(l).chunks_exact(m).zip(v.layer_out_norms(l).unwrap().chunks_exact(k)) {
            for (&e, &n) in row[..k].iter().zip(norms) {
                count[e as usize] += 1;
                sum[e as usize] += f64::from(n);
            }
        }
        let dead = cfg.dead_in_layer(l);
        assert!(v.layer_ids(l).iter().all(|&e| (e as usize) < e_n - dead), "layer {l}");
        zero_hit += count.iter().filter(|&&c| c == 0).count();
        mean_norms.extend(count.iter().zip(&sum).filter(|(c, _)| **c > 0).map(|(&c, &s)| s / c as f64));
    }
    assert_eq!(zero_hit, cfg.dead_experts);
    mean_norms.sort_by(f64::total_cmp);
    let median = mean_norms[mean_norms.len() / 2];
    assert!(*mean_norms.last().unwrap() > 3.0 * median, "no outlier: {mean_norms:?}");
}

#[test]
fn presets_by_name() {
    // The default preset is exactly the defaults (the embedded data/ files depend on them).
    assert_eq!(SynthPreset::default(), SynthPreset::Dsv2Lite);
    assert_eq!(SynthPreset::Dsv2Lite.config(), SynthConfig::default());
    for p in SynthPreset::ALL {
        assert_eq!(SynthPreset::from_name(p.as_str()).unwrap(), p);
        assert_eq!(p.to_string().parse::<SynthPreset>().unwrap(), p);
        // A preset sets routing parameters only: the shape, seeds and norms are the defaults'.
        let (c, d) = (p.config(), SynthConfig::default());
        assert_eq!(
            (c.layers, c.experts, c.top_k, c.candidates, c.tokens, c.sequences, c.seed, c.model_seed, c.norms),
            (d.layers, d.experts, d.top_k, d.candidates, d.tokens, d.sequences, d.seed, d.model_seed, d.norms)
        );
        c.validate().unwrap();
    }
    let e = SynthPreset::from_name("qwen").unwrap_err();
    assert!(matches!(e, TraceError::Config { key: "preset", .. }), "{e}");
    assert!(e.to_string().contains("dsv2-lite, dsv2-lite-flat, qwen15-moe"), "{e}");
}

#[test]
fn bad_configurations_are_refused_by_key() {
    let cases: [(&str, SynthConfig); 13] = [
        ("layers", SynthConfig { layers: 0, ..small() }),
        ("tokens", SynthConfig { tokens: 0, ..small() }),
        ("experts", SynthConfig { experts: 70_000, ..small() }),
        ("top_k", SynthConfig { top_k: 0, ..small() }),
        ("top_k", SynthConfig { top_k: 7, ..small() }),
        ("candidates", SynthConfig { candidates: 16, ..small() }),
        ("dead_experts", SynthConfig { dead_experts: 100, ..small() }),
        ("sequences", SynthConfig { sequences: 2000, ..small() }),
        ("reuse", SynthConfig { reuse: 1.5, ..small() }),
        ("window_reuse", SynthConfig { reuse: 0.6, window_reuse: 0.6, ..small() }),
        ("skew", SynthConfig { skew: f64::NAN, ..small() }),
        ("gap", SynthConfig { gap: 0.0, ..small() }),
        ("window", SynthConfig { window: 0, ..small() }),
    ];
    let dir = tempfile::tempdir().unwrap();
    for (key, cfg) in cases {
        let e = generate(&cfg).unwrap_err();
        assert!(matches!(e, TraceError::Config { key: k, .. } if k == key), "{key}: {e}");
        let p = dir.path().join("x.safetensors");
        assert!(write(&p, &cfg, 2, &|_| {}).is_err());
        assert!(!p.exists());
    }
    // A producer that supplies too few rows: an error, and nothing left behind.
    let cfg = small();
    let meta = cfg.meta();
    let layout = StreamedTrace {
        meta: &meta,
        tokens: cfg.tokens,
        candidates: cfg.candidates,
        scores: false,
        gates: false,
        out_norms: false,
        seq_offsets: None,
        step_offsets: None,
    };
    let p = dir.path().join("short.safetensors");
    let ids = vec![0u16; cfg.candidates];
    let e = write_trace_streamed(&p, &layout, 2, |_, sink| {
        sink(RowBlock { ids: &ids, scores: None, gates: None, out_norms: None })
    })
    .unwrap_err();
    assert!(e.to_string().contains("rows supplied"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
