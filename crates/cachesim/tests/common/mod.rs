//! Shared test helpers: hand-built and seeded random synthetic traces.

#![allow(dead_code, reason = "each test binary uses a different subset of the helpers")]

pub mod spec;

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trace_io::import::esft::{EsftOptions, import_esft};
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};
use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

pub fn meta(num_experts: usize, top_k: usize, layers: usize) -> TraceMeta {
    TraceMeta {
        model: "synthetic".into(),
        num_experts: num_experts as u32,
        top_k: top_k as u32,
        layer_ids: (0..layers as u32).collect(),
        score_kind: ScoreKind::Logits,
        phase: Phase::Unknown,
        source: "cachesim tests".into(),
        extra: BTreeMap::new(),
    }
}

/// A one-layer trace from rows of candidate ids (all rows the same length m), optional scores.
pub fn one_layer(num_experts: usize, top_k: usize, rows: &[&[u16]], scores: Option<&[&[f32]]>) -> TraceData {
    let m = rows[0].len();
    let ids: Vec<u16> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let scores = scores.map(|s| s.iter().flat_map(|r| r.iter().copied()).collect());
    let parts = OwnedParts { ids, scores, ..Default::default() };
    TraceData::new(meta(num_experts, top_k, 1), rows.len(), m, parts).expect("valid hand-built trace")
}

/// Parameters of a random synthetic trace.
#[derive(Debug, Clone, Copy)]
pub struct Synth {
    pub layers: usize,
    pub tokens: usize,
    pub num_experts: usize,
    pub top_k: usize,
    pub candidates: usize,
    /// Probability that a slot reuses one of the previous row's candidates (locality).
    pub reuse: f64,
    /// Number of sequences (1 = no seq_offsets recorded).
    pub sequences: usize,
    pub with_scores: bool,
}

/// The trace of the replay benchmark and of the `replay_probe` example (seed [`BENCH_SEED`]): the
/// study's per-layer shape (512 experts, k = 10, m = 64), 8 layers x 8192 tokens.
pub const BENCH_TRACE: Synth = Synth {
    layers: 8,
    tokens: 8192,
    num_experts: 512,
    top_k: 10,
    candidates: 64,
    reuse: 0.3,
    sequences: 1,
    with_scores: true,
};

/// The small trace of the deployed and hybrid matrices: 2 layers, 150 tokens, 12 experts, top-3
/// of 6 candidates, 7 sequences, scores.
pub const DEPLOY_SMALL: Synth = Synth {
    layers: 2,
    tokens: 150,
    num_experts: 12,
    top_k: 3,
    candidates: 6,
    reuse: 0.5,
    sequences: 7,
    with_scores: true,
};

/// Seed of [`BENCH_TRACE`] and of its pruned keep set.
pub const BENCH_SEED: u64 = 42;

/// A seeded random trace with temporal locality, quantized (so sometimes tied) scores and
/// optional sequence starts.
pub fn synth(seed: u64, s: Synth) -> TraceData {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (l_n, t_n, e_n, m) = (s.layers, s.tokens, s.num_experts, s.candidates);
    let mut ids = Vec::with_capacity(l_n * t_n * m);
    let mut scores = Vec::with_capacity(l_n * t_n * m);
    // A per-layer skewed popularity: expert e drawn with weight ~ 1 / (1 + rank).
    for _ in 0..l_n {
        let mut prev: Vec<u16> = Vec::new();
        let mut perm: Vec<u16> = (0..e_n as u16).collect();
        for i in (1..perm.len()).rev() {
            let j = rng.random_range(0..=i);
            perm.swap(i, j);
        }
        for _ in 0..t_n {
            let mut row: Vec<u16> = Vec::with_capacity(m);
            while row.len() < m {
                let e = if !prev.is_empty() && rng.random_bool(s.reuse) {
                    prev[rng.random_range(0..prev.len())]
                } else {
                    // skewed: square of a uniform picks low ranks more often
                    let u: f64 = rng.random();
                    perm[((u * u) * e_n as f64) as usize % e_n]
                };
                if !row.contains(&e) {
                    row.push(e);
                }
            }
            let mut z = 2.0f32;
            for _ in 0..m {
                scores.push(z);
                // steps of 0.25 with ~20% zero steps: ties happen
                z -= 0.25 * rng.random_range(0..4u8) as f32;
            }
            ids.extend_from_slice(&row);
            prev = row;
        }
    }
    let seq_offsets = (s.sequences > 1).then(|| {
        let mut offs: Vec<u64> = vec![0];
        for i in 1..s.sequences {
            let base = (i * t_n / s.sequences) as u64;
            let jitter = rng.random_range(0..(t_n / s.sequences / 2).max(1)) as u64;
            let o = base + jitter;
            if o > *offs.last().expect("non-empty") && (o as usize) < t_n {
                offs.push(o);
            }
        }
        offs
    });
    let parts = OwnedParts { ids, scores: s.with_scores.then_some(scores), seq_offsets, ..Default::default() };
    TraceData::new(meta(e_n, s.top_k, l_n), t_n, m, parts).expect("valid synthetic trace")
}

/// A keep list per layer: each expert kept with probability `p` (seeded), at least `min_kept`.
pub fn random_keep(seed: u64, layers: usize, num_experts: usize, p: f64, min_kept: usize) -> Vec<Vec<u16>> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    (0..layers)
        .map(|_| {
            let mut kept: Vec<u16> = (0..num_experts as u16).filter(|_| rng.random_bool(p)).collect();
            let mut e = 0u16;
            while kept.len() < min_kept {
                if !kept.contains(&e) {
                    kept.push(e);
                }
                e += 1;
            }
            kept.sort_unstable();
            kept
        })
        .collect()
}

/// The same trace with `step_offsets` added.
pub fn with_steps(trace: TraceData, steps: Vec<u64>) -> TraceData {
    let (meta, tokens, m, mut parts) = trace.into_parts();
    parts.step_offsets = Some(steps);
    TraceData::new(meta, tokens, m, parts).expect("valid steps")
}

/// Seeded random step boundaries: steps of 1 to `max` rows.
pub fn random_steps(seed: u64, tokens: usize, max: usize) -> Vec<u64> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut offs = vec![0u64];
    loop {
        let next = offs.last().expect("non-empty") + rng.random_range(1..=max as u64);
        if next as usize >= tokens {
            return offs;
        }
        offs.push(next);
    }
}

/// The ESFT translation domain of the real data (`MOE_OFFLOAD_REAL_DATA`).
pub fn real_translation() -> TraceData {
    let dir = real_data::dir().join("esft-dsv2lite");
    let opts = EsftOptions { domains: vec!["translation".into()], ..Default::default() };
    import_esft(&dir, &opts).unwrap_or_else(|e| panic!("importing {}: {e}", dir.display()))
}

/// The Qwen1.5-MoE vLLM route logs of the real data, five layers.
pub fn real_qwen() -> TraceData {
    let dir = real_data::dir().join("vllm-routelog-qwen15moe");
    let files: Vec<_> = [0, 8, 12, 18, 23].iter().map(|l| dir.join(format!("moe_layer{l}.jsonl"))).collect();
    let opts = VllmRoutelogOptions { num_experts: Some(60), ..Default::default() };
    import_vllm_routelog(&files, &opts).unwrap_or_else(|e| panic!("importing {}: {e}", dir.display())).trace
}

/// The `n` most frequent experts of each layer (ties: lowest id), as `keep --metric frequency`
/// would pick from the trace's own counts.
pub fn top_frequency(trace: &TraceData, n: usize) -> Vec<Vec<u16>> {
    let view = trace.view();
    let s = view.shape();
    (0..s.layers)
        .map(|l| {
            let mut count = vec![0u64; s.num_experts];
            for t in 0..s.tokens {
                for &e in &view.row(l, t)[..s.top_k] {
                    count[usize::from(e)] += 1;
                }
            }
            let mut ids: Vec<u16> = (0..s.num_experts as u16).collect();
            ids.sort_by_key(|&e| (std::cmp::Reverse(count[usize::from(e)]), e));
            ids.truncate(n);
            ids.sort_unstable();
            ids
        })
        .collect()
}

/// A replay configuration counted from token 0 (warmup 0), as the hand-computed cases are.
pub fn cfg0(policy: cachesim::Policy, cap: usize) -> cachesim::ReplayConfig {
    cachesim::ReplayConfig { warmup: 0, ..cachesim::ReplayConfig::new(policy, cap) }
}

/// One case of a parsing table: `given` parses to `Ok(value)`, or fails with an error whose
/// message contains `Err(said)`.
pub fn check_parse<T>(given: &str, expect: Result<T, &str>)
where
    T: std::str::FromStr + PartialEq + std::fmt::Debug,
    T::Err: std::fmt::Display + std::fmt::Debug,
{
    match (given.parse::<T>(), expect) {
        (Ok(got), Ok(want)) => assert_eq!(got, want, "{given}"),
        (Err(e), Err(said)) => assert!(e.to_string().contains(said), "{given}: {e}"),
        (got, want) => panic!("{given}: {got:?}, expected {want:?}"),
    }
}
