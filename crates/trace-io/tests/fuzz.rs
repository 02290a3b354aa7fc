//! Property tests: `TraceFile::from_bytes` never panics, whatever the bytes.
//!
//! Three generators: arbitrary bytes; arbitrary bytes behind a plausible length prefix (so the
//! header parser sees JSON-ish input); and mutations of a valid trace (byte flips, overwritten
//! runs, truncation at a random point, a rewritten header length). Every input must give `Ok`
//! or a typed `TraceError`, and an `Ok` must be a trace whose view is usable.
//!
//! More cases: `PROPTEST_CASES=100000 cargo test -p trace-io --release --test fuzz`.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use proptest::prelude::*;
use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceFile, TraceMeta, write_trace};

/// A valid trace with every tensor: 2 layers, 5 tokens, m = 3, k = 2, E = 6.
fn valid_bytes() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| {
        let meta = TraceMeta {
            model: "fuzz".into(),
            num_experts: 6,
            top_k: 2,
            layer_ids: vec![3, 7],
            score_kind: ScoreKind::Logits,
            phase: Phase::Mixed,
            source: "proptest".into(),
            extra: BTreeMap::new(),
        };
        let (l, t, m, k) = (2, 5, 3, 2);
        let ids: Vec<u16> =
            (0..l * t).flat_map(|r| [(r % 6) as u16, ((r + 1) % 6) as u16, ((r + 2) % 6) as u16]).collect();
        let scores: Vec<f32> = (0..l * t).flat_map(|_| [1.0, 0.5, -2.0]).collect();
        let parts = OwnedParts {
            ids,
            scores: Some(scores),
            gates: Some(vec![0.25; l * t * k]),
            out_norms: Some(vec![1.5; l * t * k]),
            seq_offsets: Some(vec![0, 3]),
            step_offsets: Some(vec![0, 1, 4]),
        };
        let data = TraceData::new(meta, t, m, parts).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("valid.safetensors");
        write_trace(&p, &data.view()).unwrap();
        std::fs::read(&p).unwrap()
    })
}

/// Opens `bytes`; on success touches every part of the view.
fn check(bytes: &[u8]) {
    if let Ok(f) = TraceFile::from_bytes(bytes) {
        let v = f.view();
        let s = v.shape();
        for l in 0..s.layers {
            assert_eq!(v.layer_ids(l).len(), s.tokens * s.candidates);
            if let Some(g) = v.layer_gates(l) {
                assert_eq!(g.len(), s.tokens * s.top_k);
            }
            for t in 0..s.tokens {
                assert!(v.row(l, t).iter().all(|&e| usize::from(e) < s.num_experts));
            }
        }
    }
}

#[derive(Debug, Clone)]
enum Mutation {
    Flip { at: usize, mask: u8 },
    Overwrite { at: usize, bytes: Vec<u8> },
    Truncate { at: usize },
    HeaderLen { len: u64 },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| Mutation::Flip { at, mask }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Mutation::Overwrite { at, bytes }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        prop_oneof![any::<u64>(), 0u64..2048].prop_map(|len| Mutation::HeaderLen { len }),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len();
    match m {
        Mutation::Flip { at, mask } => bytes[at % n] ^= mask,
        Mutation::Overwrite { at, bytes: b } => {
            for (i, &x) in b.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(at % n + i) {
                    *slot = x;
                }
            }
        }
        Mutation::Truncate { at } => bytes.truncate(at % n),
        Mutation::HeaderLen { len } => {
            if n >= 8 {
                bytes[..8].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

proptest! {
    // 512 cases per property unless PROPTEST_CASES says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512),
        ..ProptestConfig::default()
    })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        check(&bytes);
    }

    #[test]
    fn arbitrary_headers_never_panic(header in "\\PC{0,200}", data in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&data);
        check(&b);
    }

    #[test]
    fn mutated_valid_files_never_panic(muts in prop::collection::vec(mutation(), 1..6)) {
        let mut b = valid_bytes().to_vec();
        for m in &muts {
            apply(&mut b, m);
        }
        check(&b);
    }

    #[test]
    fn mutated_headers_never_panic(at in any::<usize>(), byte in any::<u8>()) {
        // Mutations aimed at the JSON header, where the parser's branches are.
        let mut b = valid_bytes().to_vec();
        let header_len = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        b[8 + at % header_len] = byte;
        check(&b);
    }
}

#[test]
fn the_unmutated_file_opens() {
    let f = TraceFile::from_bytes(valid_bytes()).unwrap();
    assert_eq!(f.view().shape().tokens, 5);
}
