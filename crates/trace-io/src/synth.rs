//! Synthetic routing traces for fixtures and benchmarks (never a substitute for real routing).
//!
//! The routing model, per layer and token, draws a logit for every expert
//! `z_e = skew · ln(w_e) + topic_e + reuse · [e used at the previous token] + g_e`, where
//! `w_e ∝ 1 / rank_e` is a Zipf popularity over a per-layer random permutation, `topic_e ~ N(0, drift²)`
//! is redrawn at every sequence start, and `g_e` is standard Gumbel noise (so without the other terms
//! the top-1 follows the popularity exactly). The `m` largest logits become the row, in descending
//! order (ties: lower id first); gates are the softmax of the first k; output norms (on request) are
//! `base_e · exp(0.25 · N(0, 1))` with `base_e` log-normal and a few heavy-tailed outlier experts.
//! The `dead_experts` highest ids of every layer are never routed (they never enter a row).
//!
//! Each layer is generated from its own ChaCha8 streams seeded by `(model_seed, layer)` (popularity,
//! norm scales) and `(seed, layer)` (tokens), so the output depends only on the configuration,
//! never on threads or platform.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, StandardNormal};

use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceError, TraceMeta};

/// Parameters of a synthetic trace. Defaults make a small 4-layer, 32-expert, top-4 trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SynthConfig {
    /// L: MoE layers.
    pub layers: usize,
    /// E: routed experts per layer.
    pub experts: usize,
    /// k: experts used per token.
    pub top_k: usize,
    /// m: candidates recorded per row (`k <= m <= E - dead_experts`).
    pub candidates: usize,
    /// T: tokens.
    pub tokens: usize,
    /// Sequences the tokens are split into (equal lengths, the last takes the remainder).
    pub sequences: usize,
    /// Seed of the token stream (topics, noise, norms jitter).
    pub seed: u64,
    /// Seed of the model (expert popularity and norm scales): two traces with the same
    /// `model_seed` and different `seed`s behave like two text samples run through one model.
    pub model_seed: u64,
    /// Record `out_norms`.
    pub norms: bool,
    /// Popularity skew: weight of `ln(w_e)` in the logit (0 = uniform).
    pub skew: f64,
    /// Logit bonus of experts used at the previous token (temporal locality).
    pub reuse: f64,
    /// Standard deviation of the per-sequence topic offsets (topic drift).
    pub drift: f64,
    /// Experts per layer that are never routed (the highest ids).
    pub dead_experts: usize,
}

impl Default for SynthConfig {
    fn default() -> Self {
        SynthConfig {
            layers: 4,
            experts: 32,
            top_k: 4,
            candidates: 8,
            tokens: 4096,
            sequences: 16,
            seed: 0,
            model_seed: 0,
            norms: true,
            skew: 1.0,
            reuse: 1.5,
            drift: 0.5,
            dead_experts: 1,
        }
    }
}

/// Generates a trace from `cfg`.
///
/// # Errors
/// [`TraceError::Config`] naming the parameter when the shape is impossible (`k = 0`, `k > m`,
/// `m > E - dead_experts`, `E > 65536`, no tokens or sequences, more sequences than tokens).
pub fn generate(cfg: &SynthConfig) -> Result<TraceData> {
    let bad = |key: &'static str, reason: String| Err(TraceError::Config { key, reason });
    let live = cfg.experts.saturating_sub(cfg.dead_experts);
    if cfg.top_k == 0 || cfg.top_k > cfg.candidates {
        return bad("top_k", format!("need 1 <= k <= m, got k = {} and m = {}", cfg.top_k, cfg.candidates));
    }
    if cfg.candidates > live {
        return bad("candidates", format!("m = {} exceeds the {live} routable experts", cfg.candidates));
    }
    if cfg.experts > 1 << 16 {
        return bad("experts", format!("{} exceeds 65536 (ids are u16)", cfg.experts));
    }
    if cfg.tokens == 0 || cfg.sequences == 0 || cfg.sequences > cfg.tokens {
        return bad("sequences", format!("need 1 <= sequences <= tokens, got {} and {}", cfg.sequences, cfg.tokens));
    }
    if cfg.layers == 0 {
        return bad("layers", "need at least one layer".into());
    }
    let (l_n, t_n, m, k, e_n) = (cfg.layers, cfg.tokens, cfg.candidates, cfg.top_k, cfg.experts);
    let seq_len = t_n / cfg.sequences;
    let seq_offsets: Vec<u64> = (0..cfg.sequences).map(|s| (s * seq_len) as u64).collect();

    let mut ids = Vec::with_capacity(l_n * t_n * m);
    let mut scores = Vec::with_capacity(l_n * t_n * m);
    let mut gates = Vec::with_capacity(l_n * t_n * k);
    let mut norms = Vec::with_capacity(if cfg.norms { l_n * t_n * k } else { 0 });
    let mut logits = vec![0f64; live];
    let mut order: Vec<usize> = Vec::with_capacity(live);
    let mut prev_used = vec![false; live];
    for layer in 0..l_n {
        let layer_mix = (layer as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut model_rng = ChaCha8Rng::seed_from_u64(cfg.model_seed ^ layer_mix);
        let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.rotate_left(32) ^ layer_mix);
        // Popularity: Zipf weights over a random permutation of the live experts.
        let mut perm: Vec<usize> = (0..live).collect();
        for i in (1..live).rev() {
            perm.swap(i, model_rng.random_range(0..=i));
        }
        let mut base = vec![0f64; live];
        for (rank, &e) in perm.iter().enumerate() {
            base[e] = -cfg.skew * ((rank + 1) as f64).ln();
        }
        let norm_base: Vec<f64> = {
            let ln = LogNormal::new(0.0, 0.3).expect("valid log-normal");
            (0..live)
                .map(|i| {
                    let b: f64 = ln.sample(&mut model_rng);
                    // A few outliers with heavy-tailed norms (every 16th expert of the permutation).
                    if perm[i] % 16 == 7 { b * 8.0 } else { b }
                })
                .collect()
        };
        let mut topic = vec![0f64; live];
        prev_used.iter_mut().for_each(|p| *p = false);
        let mut next_seq = 0;
        for t in 0..t_n {
            if next_seq < seq_offsets.len() && t as u64 == seq_offsets[next_seq] {
                for x in topic.iter_mut() {
                    let z: f64 = rng.sample(StandardNormal);
                    *x = cfg.drift * z;
                }
                prev_used.iter_mut().for_each(|p| *p = false);
                next_seq += 1;
            }
            for e in 0..live {
                let u: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
                let gumbel = -(-u.ln()).ln();
                logits[e] = base[e] + topic[e] + if prev_used[e] { cfg.reuse } else { 0.0 } + gumbel;
            }
            order.clear();
            order.extend(0..live);
            let by_score = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
            if m < live {
                order.select_nth_unstable_by(m - 1, by_score);
                order.truncate(m);
            }
            order.sort_by(by_score);
            prev_used.iter_mut().for_each(|p| *p = false);
            let zmax = logits[order[0]];
            let denom: f64 = order[..k].iter().map(|&e| (logits[e] - zmax).exp()).sum();
            for (i, &e) in order.iter().enumerate() {
                ids.push(e as u16);
                scores.push(logits[e] as f32);
                if i < k {
                    prev_used[e] = true;
                    gates.push(((logits[e] - zmax).exp() / denom) as f32);
                    if cfg.norms {
                        let z: f64 = rng.sample(StandardNormal);
                        norms.push((norm_base[e] * (0.25 * z).exp()) as f32);
                    }
                }
            }
        }
    }
    // f32 rounding can make two distinct f64 logits equal; rows stay non-increasing because the
    // order was taken in f64 and rounding is monotone.
    let mut extra = BTreeMap::new();
    extra.insert("synth_config".to_string(), serde_json::to_string(cfg).expect("config serializes"));
    let meta = TraceMeta {
        model: format!("synthetic {l_n}x{e_n} top-{k}"),
        num_experts: e_n as u32,
        top_k: k as u32,
        layer_ids: (0..l_n as u32).collect(),
        score_kind: ScoreKind::Logits,
        phase: Phase::Prefill,
        source: format!("moe-offload synth model_seed {} seed {}", cfg.model_seed, cfg.seed),
        extra,
    };
    let parts = OwnedParts {
        ids,
        scores: Some(scores),
        gates: Some(gates),
        out_norms: cfg.norms.then_some(norms),
        seq_offsets: Some(seq_offsets),
        step_offsets: None,
    };
    TraceData::new(meta, t_n, m, parts)
}
