//! Synthetic routing traces for fixtures, benchmarks and scale tests (never a substitute for real
//! routing). `docs/synth.md` describes the model, its fit to real traces and the commands.
//!
//! # The routing model
//!
//! Each layer is an independent process over the tokens. Per layer, the model (drawn from
//! `model_seed`) fixes a popularity `w_e ∝ rank_e^(-s_l)` over a random permutation of the live
//! experts, with a per-layer skew `s_l = skew · exp(skew_spread · N(0, 1))`. At every sequence start
//! the topic redraws `q_e = w_e · exp(drift · N(0, 1))`, and the locality memory is cleared.
//!
//! A row is filled slot by slot: the k used experts first, then the `m - k` further candidates. Each
//! slot takes, with probability `reuse`, an expert the previous token used (weighted by `q`); else,
//! with probability `window_reuse`, an expert used in the last `window` tokens but not by the
//! previous one (weighted by how often it was used there); else a fresh draw from `q`. Window and fresh draws exclude the
//! previous token's experts, so the next-token reuse of the used slots is `reuse` in expectation
//! (up to sequence starts), whatever the popularity. No expert appears twice in a row. The used
//! experts, and separately the further candidates, are ranked by `ln q_e + Gumbel noise`.
//!
//! Scores are logits: the top one is `spacing · Gumbel`, and the gap between ranks `i - 1` and `i`
//! is `spacing · Exp(1) / i` (the spacings of the top order statistics of Gumbel logits), except the
//! gap between rank k - 1 (the last used expert) and rank k (the first unused candidate), which is
//! `Gamma(gap_shape)` with mean `gap · spacing / k`. Gates are the softmax of the k used scores.
//! Output norms (on request) are `base_e · exp(0.25 · N(0, 1))` with `base_e` log-normal; the
//! `outlier_share` outlier experts get `base_e · outlier_scale · Pareto(outlier_tail)` instead, a
//! heavy tail. `dead_experts` (layer, expert) pairs, spread evenly over the layers (the highest ids
//! of a layer), are never routed.
//!
//! # Presets
//!
//! The routing defaults are fitted to one real trace (DeepSeek-V2-Lite on ESFT translation);
//! [`SynthPreset`] names them and the parameters fitted to other real traces (the flatter ESFT
//! domains, Qwen1.5-MoE served by vLLM). The fits, their tolerances and the grid searches are in `docs/synth.md`.
//!
//! # Determinism and memory
//!
//! Layer l is generated from its own ChaCha8 streams seeded by `(model_seed, l)` (popularity, norm
//! scales) and `(seed, l)` (tokens), so the output depends only on the configuration, never on
//! threads. Across platforms it also depends on `f64::exp`, `ln` and `powf`, which Rust takes from
//! the system's libm: another libm (macOS, Windows, musl) can change last bits, so the committed
//! fixtures are checked (`gen-data --check`) on the CI's Linux/glibc. [`write()`] streams the trace to disk block by block ([`BLOCK_ROWS`] rows), one
//! layer per thread, through [`write_trace_streamed`]; its memory does not grow with T or L.

use std::collections::BTreeMap;
use std::path::Path;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1, Gamma, LogNormal, StandardNormal};

pub use crate::write::{RowBlock, StreamedTrace, write_trace_streamed};
use crate::{OwnedParts, Phase, Result, ScoreKind, TraceData, TraceError, TraceMeta};

/// Rows generated and written per block by [`write()`] (per thread: `BLOCK_ROWS · m` ids and scores).
pub const BLOCK_ROWS: usize = 8192;

/// Parameters of a synthetic trace. The shape defaults make a small 4-layer, 32-expert, top-4
/// trace; the routing defaults are the [`SynthPreset::Dsv2Lite`] preset, fitted to the real
/// DeepSeek-V2-Lite ESFT translation trace (`docs/synth.md`). [`SynthPreset`] names other fitted
/// routing parameters.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SynthConfig {
    /// L: MoE layers.
    pub layers: usize,
    /// E: routed experts per layer (at most 65,536: ids are u16).
    pub experts: usize,
    /// k: experts used per token.
    pub top_k: usize,
    /// m: candidates recorded per row (`k <= m <= E - ceil(dead_experts / L)`).
    pub candidates: usize,
    /// T: tokens.
    pub tokens: usize,
    /// Sequences the tokens are split into (equal lengths, the last takes the remainder).
    pub sequences: usize,
    /// Seed of the token stream (topics, draws, norm jitter).
    pub seed: u64,
    /// Seed of the model (popularity, per-layer skew, norm scales, outliers): two traces with the
    /// same `model_seed` and different `seed`s behave like two text samples run through one model.
    pub model_seed: u64,
    /// Record `out_norms`.
    pub norms: bool,
    /// Popularity skew: mean Zipf exponent `s` of the expert weights `w ∝ rank^(-s)` (0 = uniform).
    pub skew: f64,
    /// Spread of the skew across layers: `s_l = skew · exp(skew_spread · N(0, 1))` (0 = every layer
    /// has `skew`).
    pub skew_spread: f64,
    /// Next-token locality: probability that a slot takes an expert the previous token used; the
    /// expected next-token reuse rate of the used slots (what `moe-offload inspect` reports). In [0, 1].
    pub reuse: f64,
    /// Longer-window locality: probability that a slot takes an expert used in the last `window`
    /// tokens of the sequence but not by the previous one. In [0, 1 - reuse].
    pub window_reuse: f64,
    /// Length, in tokens, of the locality window of `window_reuse`, including the previous token
    /// (>= 1; 1 disables window draws).
    pub window: usize,
    /// Topic drift between sequences: standard deviation of the per-sequence log-weight offsets of
    /// the experts (0 = every sequence has the layer's popularity).
    pub drift: f64,
    /// Logit scale: the mean score gap between ranks `i - 1` and `i` is `spacing / i` (> 0).
    pub spacing: f64,
    /// Mean of the score gap between rank k - 1 and rank k, as a multiple of `spacing / k` (the
    /// value the interior spacings would give); > 0. Small gaps make cache-aware routing substitute
    /// more often.
    pub gap: f64,
    /// Gamma shape of that gap (1 = exponential; larger = less spread); > 0.
    pub gap_shape: f64,
    /// (layer, expert) pairs that are never routed, spread evenly over the layers (the highest ids
    /// of a layer). The original study saw 8 zero-hit experts of 48 x 512.
    pub dead_experts: usize,
    /// Share of the live experts (drawn per layer from `model_seed`) whose output norms are
    /// heavy-tailed outliers. In [0, 1].
    pub outlier_share: f64,
    /// Scale of an outlier expert's norms relative to its base (>= 0).
    pub outlier_scale: f64,
    /// Pareto tail index of an outlier's per-token norm factor (> 0; below 2 the variance is
    /// infinite).
    pub outlier_tail: f64,
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
            skew: 1.1,
            skew_spread: 0.15,
            reuse: 0.27,
            window_reuse: 0.15,
            window: 8,
            drift: 0.8,
            spacing: 0.66,
            gap: 1.0,
            gap_shape: 1.0,
            dead_experts: 4,
            outlier_share: 1.0 / 16.0,
            outlier_scale: 4.0,
            outlier_tail: 1.5,
        }
    }
}

impl SynthConfig {
    /// Checks the configuration.
    ///
    /// # Errors
    /// [`TraceError::Config`] naming the first impossible parameter: `k = 0` or `k > m`, `m` above
    /// the routable experts of a layer, `E > 65536`, no layers, tokens or sequences, more
    /// sequences than tokens, a probability outside [0, 1] or `reuse + window_reuse > 1`, a
    /// non-finite or negative scale, `window = 0`, a non-positive `spacing`, `gap`, `gap_shape` or
    /// `outlier_tail`, more dead experts than the layers hold.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &'static str, reason: String| Err(TraceError::Config { key, reason });
        if self.layers == 0 {
            return bad("layers", "need at least one layer".into());
        }
        if self.experts == 0 || self.experts > 1 << 16 {
            return bad("experts", format!("need 1 <= E <= 65536 (ids are u16), got {}", self.experts));
        }
        if self.top_k == 0 || self.top_k > self.candidates {
            return bad("top_k", format!("need 1 <= k <= m, got k = {} and m = {}", self.top_k, self.candidates));
        }
        let max_dead = self.dead_experts.div_ceil(self.layers);
        if max_dead > self.experts {
            return bad(
                "dead_experts",
                format!("{} over {} layers exceeds E = {}", self.dead_experts, self.layers, self.experts),
            );
        }
        let live = self.experts - max_dead;
        if self.candidates > live {
            return bad(
                "candidates",
                format!("m = {} exceeds the {live} routable experts of a layer", self.candidates),
            );
        }
        if self.tokens == 0 {
            return bad("tokens", "must be at least 1".to_string());
        }
        if self.sequences == 0 || self.sequences > self.tokens {
            return bad(
                "sequences",
                format!("need 1 <= sequences <= tokens, got {} and {}", self.sequences, self.tokens),
            );
        }
        let nonneg = |x: f64| x.is_finite() && x >= 0.0;
        let pos = |x: f64| x.is_finite() && x > 0.0;
        for (key, x, ok) in [
            ("skew", self.skew, nonneg(self.skew)),
            ("skew_spread", self.skew_spread, nonneg(self.skew_spread)),
            ("reuse", self.reuse, nonneg(self.reuse) && self.reuse <= 1.0),
            ("window_reuse", self.window_reuse, nonneg(self.window_reuse) && self.reuse + self.window_reuse <= 1.0),
            ("drift", self.drift, nonneg(self.drift)),
            ("spacing", self.spacing, pos(self.spacing)),
            ("gap", self.gap, pos(self.gap)),
            ("gap_shape", self.gap_shape, pos(self.gap_shape)),
            ("outlier_share", self.outlier_share, nonneg(self.outlier_share) && self.outlier_share <= 1.0),
            ("outlier_scale", self.outlier_scale, nonneg(self.outlier_scale)),
            ("outlier_tail", self.outlier_tail, pos(self.outlier_tail)),
        ] {
            if !ok {
                let range = match key {
                    "reuse" | "outlier_share" => "in [0, 1]",
                    "window_reuse" => "in [0, 1 - reuse]",
                    "spacing" | "gap" | "gap_shape" | "outlier_tail" => "finite and > 0",
                    _ => "finite and >= 0",
                };
                return bad(key, format!("{x} is not {range}"));
            }
        }
        if self.window == 0 {
            return bad("window", "need a window of at least 1 token".into());
        }
        Ok(())
    }

    /// Dead (never routed) experts of layer index `l`: the highest ids of the layer.
    pub fn dead_in_layer(&self, l: usize) -> usize {
        let d = self.dead_experts as u128;
        let n = self.layers.max(1) as u128;
        ((l as u128 + 1) * d / n - l as u128 * d / n) as usize
    }

    /// The first token of each sequence (`[sequences]`).
    pub fn seq_offsets(&self) -> Vec<u64> {
        let len = self.tokens / self.sequences.max(1);
        (0..self.sequences).map(|s| (s * len) as u64).collect()
    }

    /// The trace metadata (the configuration is recorded under `synth_config`).
    pub fn meta(&self) -> TraceMeta {
        let mut extra = BTreeMap::new();
        extra.insert("synth_config".to_string(), serde_json::to_string(self).expect("config serializes"));
        TraceMeta {
            model: format!("synthetic {}x{} top-{}", self.layers, self.experts, self.top_k),
            num_experts: self.experts as u32,
            top_k: self.top_k as u32,
            layer_ids: (0..self.layers as u32).collect(),
            score_kind: ScoreKind::Logits,
            phase: Phase::Prefill,
            source: format!("moe-offload synth model_seed {} seed {}", self.model_seed, self.seed),
            extra,
        }
    }
}

/// A named set of routing parameters (the fields `skew` to `outlier_tail` of [`SynthConfig`]),
/// each fitted to one real trace by the grid search of `docs/synth.md` ("Fit to real routing").
/// Shape, seeds and `norms` are not part of a preset: [`SynthPreset::config`] gives the default
/// shape, to be overridden by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SynthPreset {
    /// `dsv2-lite`: exactly [`SynthConfig::default`]'s routing, fitted to DeepSeek-V2-Lite (ESFT)
    /// on the translation corpus (teacher-forced prefill): next-token reuse 0.27, top-10% share 0.42.
    #[default]
    Dsv2Lite,
    /// `dsv2-lite-flat`: the same model fitted to the flatter ESFT domains (intent, law, summary;
    /// each at its own shape): next-token reuse 0.28, top-10% share 0.27 instead of 0.42, so lower
    /// LRU hit rates at E/4 and E/2.
    Dsv2LiteFlat,
    /// `qwen15-moe`: fitted to Qwen1.5-MoE-A2.7B-Chat served by vLLM (25 GSM8K requests, prefill and
    /// batched decode, the 5 logged layers): next-token reuse 0.12 against a shuffled control of
    /// 0.07, nearly flat popularity (top-10% share 0.13), every expert routed.
    Qwen15Moe,
}

impl SynthPreset {
    /// Every preset, in declaration order.
    pub const ALL: [SynthPreset; 3] = [SynthPreset::Dsv2Lite, SynthPreset::Dsv2LiteFlat, SynthPreset::Qwen15Moe];

    /// The preset's name on the command line (`moe-offload synth --preset NAME`).
    pub fn as_str(self) -> &'static str {
        match self {
            SynthPreset::Dsv2Lite => "dsv2-lite",
            SynthPreset::Dsv2LiteFlat => "dsv2-lite-flat",
            SynthPreset::Qwen15Moe => "qwen15-moe",
        }
    }

    /// The preset named `name`.
    ///
    /// # Errors
    /// [`TraceError::Config`] with key `preset` for an unknown name (the message lists the known
    /// ones).
    pub fn from_name(name: &str) -> Result<SynthPreset> {
        SynthPreset::ALL.into_iter().find(|p| p.as_str() == name).ok_or_else(|| TraceError::Config {
            key: "preset",
            reason: format!(
                "unknown preset {name:?}; expected one of: {}",
                SynthPreset::ALL.map(SynthPreset::as_str).join(", ")
            ),
        })
    }

    /// The default shape, seeds and norms of [`SynthConfig::default`] with this preset's routing
    /// parameters; set the shape with struct update syntax:
    /// `SynthConfig { layers: 5, experts: 60, ..SynthPreset::Qwen15Moe.config() }`.
    pub fn config(self) -> SynthConfig {
        let dsv2_lite = SynthConfig::default();
        match self {
            SynthPreset::Dsv2Lite => dsv2_lite,
            SynthPreset::Dsv2LiteFlat => SynthConfig {
                skew: 0.5,
                reuse: 0.28,
                window_reuse: 0.15,
                window: 8,
                drift: 0.3,
                spacing: 0.484,
                ..dsv2_lite
            },
            SynthPreset::Qwen15Moe => SynthConfig {
                skew: 0.125,
                reuse: 0.117,
                window_reuse: 0.1,
                window: 16,
                drift: 0.2,
                spacing: 0.556,
                dead_experts: 0,
                ..dsv2_lite
            },
        }
    }
}

impl std::fmt::Display for SynthPreset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for SynthPreset {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<SynthPreset> {
        SynthPreset::from_name(s)
    }
}

/// Generates a trace from `cfg` in memory (fixtures and tests; [`write()`] streams large ones).
///
/// # Errors
/// [`TraceError::Config`] from [`SynthConfig::validate`].
pub fn generate(cfg: &SynthConfig) -> Result<TraceData> {
    cfg.validate()?;
    let (l_n, t_n, m, k) = (cfg.layers, cfg.tokens, cfg.candidates, cfg.top_k);
    let mut ids = Vec::with_capacity(l_n * t_n * m);
    let mut scores = Vec::with_capacity(l_n * t_n * m);
    let mut gates = Vec::with_capacity(l_n * t_n * k);
    let mut norms = Vec::with_capacity(if cfg.norms { l_n * t_n * k } else { 0 });
    let mut block = Block::default();
    for l in 0..l_n {
        let mut g = LayerGen::new(cfg, l);
        while g.t < t_n {
            g.fill(BLOCK_ROWS.min(t_n - g.t), &mut block);
            ids.extend_from_slice(&block.ids);
            scores.extend_from_slice(&block.scores);
            gates.extend_from_slice(&block.gates);
            norms.extend_from_slice(&block.norms);
        }
    }
    let parts = OwnedParts {
        ids,
        scores: Some(scores),
        gates: Some(gates),
        out_norms: cfg.norms.then_some(norms),
        seq_offsets: Some(cfg.seq_offsets()),
        step_offsets: None,
    };
    TraceData::new(cfg.meta(), t_n, m, parts)
}

/// Generates the trace of `cfg` straight to `path`, block by block, layers on up to `threads`
/// threads (0 = available parallelism); byte-identical to [`generate`] then
/// [`crate::write_trace`], whatever `threads`. Memory: about `threads · BLOCK_ROWS · (6m + 8k)`
/// bytes plus O(E) per thread. `progress` is called with each layer index when the layer is written
/// (in completion order).
///
/// # Errors
/// [`TraceError::Config`] from [`SynthConfig::validate`]; [`TraceError::File`] naming `path`
/// around an I/O error (no partial file is left behind).
pub fn write(
    path: impl AsRef<Path>,
    cfg: &SynthConfig,
    threads: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<()> {
    cfg.validate()?;
    let meta = cfg.meta();
    let seq = cfg.seq_offsets();
    let layout = StreamedTrace {
        meta: &meta,
        tokens: cfg.tokens,
        candidates: cfg.candidates,
        scores: true,
        gates: true,
        out_norms: cfg.norms,
        seq_offsets: Some(&seq),
        step_offsets: None,
    };
    write_trace_streamed(path, &layout, threads, |l, sink| {
        let mut g = LayerGen::new(cfg, l);
        let mut block = Block::default();
        while g.t < cfg.tokens {
            g.fill(BLOCK_ROWS.min(cfg.tokens - g.t), &mut block);
            sink(RowBlock {
                ids: &block.ids,
                scores: Some(&block.scores),
                gates: Some(&block.gates),
                out_norms: cfg.norms.then_some(&block.norms[..]),
            })?;
        }
        progress(l);
        Ok(())
    })
}

/// Rows of one block: `ids`, `scores` `[n, m]`, `gates`, `norms` `[n, k]` (norms empty without).
#[derive(Debug, Default)]
struct Block {
    ids: Vec<u16>,
    scores: Vec<f32>,
    gates: Vec<f32>,
    norms: Vec<f32>,
}

/// Walker's alias table over `weights` (all finite and >= 0, not all 0): O(1) draws.
#[derive(Debug, Default)]
struct Alias {
    prob: Vec<f64>,
    alias: Vec<u32>,
}

impl Alias {
    fn rebuild(&mut self, weights: &[f64]) {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        self.prob.clear();
        self.prob.extend(weights.iter().map(|w| w * n as f64 / total));
        self.alias.clear();
        self.alias.extend(0..n as u32);
        let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| self.prob[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            self.alias[s] = l as u32;
            self.prob[l] -= 1.0 - self.prob[s];
            if self.prob[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        for i in large.into_iter().chain(small) {
            self.prob[i] = 1.0;
        }
    }

    fn sample(&self, rng: &mut ChaCha8Rng) -> usize {
        let i = rng.random_range(0..self.prob.len());
        if rng.random::<f64>() < self.prob[i] { i } else { self.alias[i] as usize }
    }
}

/// Rejected draws from a pool before falling back (to a fresh draw, or to an exact scan).
const MAX_TRIES: usize = 32;

/// The state of one layer's generator; [`LayerGen::fill`] produces the next rows in token order.
struct LayerGen<'a> {
    cfg: &'a SynthConfig,
    /// Next token to generate.
    t: usize,
    rng: ChaCha8Rng,
    /// Experts that can be routed (`0..live`; the rest are dead).
    live: usize,
    /// ln w_e: the layer's popularity (log weights), `[live]`.
    log_w: Vec<f64>,
    /// The current sequence's weights q_e, `[live]`, and their alias table.
    q: Vec<f64>,
    alias: Alias,
    /// Norm base per expert and whether it is an outlier, `[live]`.
    norm_base: Vec<f64>,
    outlier: Vec<bool>,
    seq_offsets: Vec<u64>,
    next_seq: usize,
    /// The previous token's used experts (empty at a sequence start).
    prev: Vec<u16>,
    /// Used experts of the last `win = min(window, T)` tokens of the sequence, `win · k` slots,
    /// a ring written at `head`; the first `filled` tokens of the ring are valid.
    ring: Vec<u16>,
    win: usize,
    head: usize,
    filled: usize,
    /// Stamps (token + 1) marking membership of the current row and of `prev`, `[live]`.
    in_row: Vec<u64>,
    in_prev: Vec<u64>,
    /// Scratch: the row being built.
    row: Vec<u16>,
    keys: Vec<(f64, u16)>,
}

impl<'a> LayerGen<'a> {
    fn new(cfg: &'a SynthConfig, l: usize) -> LayerGen<'a> {
        let layer_mix = (l as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut model_rng = ChaCha8Rng::seed_from_u64(cfg.model_seed ^ layer_mix);
        let rng = ChaCha8Rng::seed_from_u64(cfg.seed.rotate_left(32) ^ layer_mix);
        let live = cfg.experts - cfg.dead_in_layer(l);
        let mut perm: Vec<usize> = (0..live).collect();
        for i in (1..live).rev() {
            perm.swap(i, model_rng.random_range(0..=i));
        }
        let z: f64 = model_rng.sample(StandardNormal);
        let skew = cfg.skew * (cfg.skew_spread * z).exp();
        let mut log_w = vec![0f64; live];
        for (rank, &e) in perm.iter().enumerate() {
            log_w[e] = -skew * ((rank + 1) as f64).ln();
        }
        let ln = LogNormal::new(0.0, 0.3).expect("valid log-normal");
        let norm_base: Vec<f64> = (0..live).map(|_| ln.sample(&mut model_rng)).collect();
        let outlier: Vec<bool> = (0..live).map(|_| model_rng.random::<f64>() < cfg.outlier_share).collect();
        LayerGen {
            cfg,
            t: 0,
            rng,
            live,
            q: vec![0.0; live],
            log_w,
            alias: Alias::default(),
            norm_base,
            outlier,
            seq_offsets: cfg.seq_offsets(),
            next_seq: 0,
            prev: Vec::with_capacity(cfg.top_k),
            ring: vec![0; cfg.window.min(cfg.tokens) * cfg.top_k],
            win: cfg.window.min(cfg.tokens),
            head: 0,
            filled: 0,
            in_row: vec![0; live],
            in_prev: vec![0; live],
            row: Vec::with_capacity(cfg.candidates),
            keys: Vec::with_capacity(cfg.candidates),
        }
    }

    /// A new sequence: redraw the topic weights, forget the locality memory.
    fn start_sequence(&mut self) {
        for e in 0..self.live {
            let z: f64 = self.rng.sample(StandardNormal);
            self.q[e] = self.log_w[e] + self.cfg.drift * z;
        }
        // Relative to the largest, so the total is >= 1 whatever the skew.
        let top = self.q.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        self.q.iter_mut().for_each(|x| *x = (*x - top).exp());
        self.alias.rebuild(&self.q);
        self.prev.clear();
        self.head = 0;
        self.filled = 0;
    }

    /// Whether `e` may still enter the current row (stamp `s`); `allow_prev`: also when the
    /// previous token used it.
    fn free(&self, e: usize, s: u64, allow_prev: bool) -> bool {
        self.in_row[e] != s && (allow_prev || self.in_prev[e] != s)
    }

    /// One slot's expert (stamp `s` marks the row and the previous token's experts).
    fn draw(&mut self, s: u64) -> u16 {
        let u: f64 = self.rng.random();
        if u < self.cfg.reuse {
            // An expert of the previous token, weighted by q, among those not yet in the row.
            let total: f64 =
                self.prev.iter().filter(|&&e| self.in_row[e as usize] != s).map(|&e| self.q[e as usize]).sum();
            if total > 0.0 {
                let mut x = self.rng.random::<f64>() * total;
                let mut last = None;
                for &e in &self.prev {
                    if self.in_row[e as usize] == s {
                        continue;
                    }
                    last = Some(e);
                    x -= self.q[e as usize];
                    if x < 0.0 {
                        return e;
                    }
                }
                if let Some(e) = last {
                    return e;
                }
            }
        } else if u < self.cfg.reuse + self.cfg.window_reuse && self.filled > 0 {
            // An expert of the window (weighted by its uses there), not used by the previous token.
            let slots = self.filled * self.cfg.top_k;
            for _ in 0..MAX_TRIES {
                let e = self.ring[self.rng.random_range(0..slots)];
                if self.free(e as usize, s, false) {
                    return e;
                }
            }
        }
        // A fresh draw from q, excluding the row and the previous token's experts.
        for _ in 0..MAX_TRIES {
            let e = self.alias.sample(&mut self.rng);
            if self.free(e, s, false) {
                return e as u16;
            }
        }
        // Rare (a few heavy experts excluded): an exact draw over what remains; the previous
        // token's experts are allowed only when nothing else is left.
        for allow_prev in [false, true] {
            let total: f64 = (0..self.live).filter(|&e| self.free(e, s, allow_prev)).map(|e| self.q[e]).sum();
            if total > 0.0 {
                let mut x = self.rng.random::<f64>() * total;
                let mut last = 0;
                for e in (0..self.live).filter(|&e| self.free(e, s, allow_prev)) {
                    last = e;
                    x -= self.q[e];
                    if x < 0.0 {
                        break;
                    }
                }
                return last as u16;
            }
        }
        // Weights underflowed to 0 (an extreme skew): the lowest free id. `validate` guarantees
        // m <= live experts, so one is free.
        (0..self.live).find(|&e| self.free(e, s, true)).unwrap_or(0) as u16
    }

    /// Generates the next `n` rows into `out` (replacing its contents).
    fn fill(&mut self, n: usize, out: &mut Block) {
        let (m, k, w) = (self.cfg.candidates, self.cfg.top_k, self.win);
        let spacing = self.cfg.spacing;
        let gap = Gamma::new(self.cfg.gap_shape, self.cfg.gap * spacing / k as f64 / self.cfg.gap_shape)
            .expect("validated gap parameters");
        out.ids.clear();
        out.scores.clear();
        out.gates.clear();
        out.norms.clear();
        for _ in 0..n {
            let t = self.t;
            if self.next_seq < self.seq_offsets.len() && t as u64 == self.seq_offsets[self.next_seq] {
                self.start_sequence();
                self.next_seq += 1;
            }
            let s = t as u64 + 1;
            for &e in &self.prev {
                self.in_prev[e as usize] = s;
            }
            self.row.clear();
            for _ in 0..m {
                let e = self.draw(s);
                self.in_row[e as usize] = s;
                self.row.push(e);
            }
            // Rank the used experts, then the further candidates, by ln q + Gumbel noise.
            for range in [0..k, k..m] {
                self.keys.clear();
                for &e in &self.row[range.clone()] {
                    let u: f64 = self.rng.random::<f64>().max(f64::MIN_POSITIVE);
                    self.keys.push((self.q[e as usize].ln() - (-u.ln()).ln(), e));
                }
                self.keys.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                for (slot, &(_, e)) in self.row[range].iter_mut().zip(&self.keys) {
                    *slot = e;
                }
            }
            // Scores: strictly decreasing in f32.
            let u: f64 = self.rng.random::<f64>().max(f64::MIN_POSITIVE);
            let mut z = -spacing * (-u.ln()).ln();
            let mut prev_f = f32::INFINITY;
            let first = out.scores.len();
            for i in 0..m {
                if i > 0 {
                    z -= if i == k {
                        gap.sample(&mut self.rng)
                    } else {
                        let x: f64 = self.rng.sample(Exp1);
                        spacing * x / i as f64
                    };
                }
                let f = (z as f32).min(prev_f.next_down());
                out.scores.push(f);
                prev_f = f;
            }
            let top = f64::from(out.scores[first]);
            let denom: f64 = out.scores[first..first + k].iter().map(|&x| (f64::from(x) - top).exp()).sum();
            for i in 0..k {
                out.gates.push(((f64::from(out.scores[first + i]) - top).exp() / denom) as f32);
            }
            if self.cfg.norms {
                for &e in &self.row[..k] {
                    let e = e as usize;
                    let norm = if self.outlier[e] {
                        let u: f64 = 1.0 - self.rng.random::<f64>(); // (0, 1]
                        self.norm_base[e] * self.cfg.outlier_scale * u.powf(-1.0 / self.cfg.outlier_tail)
                    } else {
                        let z: f64 = self.rng.sample(StandardNormal);
                        self.norm_base[e] * (0.25 * z).exp()
                    };
                    out.norms.push(norm as f32);
                }
            }
            out.ids.extend_from_slice(&self.row);
            // Locality memory: this token becomes the previous one and enters the window.
            self.prev.clear();
            self.prev.extend_from_slice(&self.row[..k]);
            self.ring[self.head * k..(self.head + 1) * k].copy_from_slice(&self.row[..k]);
            self.head = (self.head + 1) % w;
            self.filled = (self.filled + 1).min(w);
            self.t += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TraceFile, TraceView, write_trace};

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
        let shape =
            SynthConfig { experts: 64, top_k: 4, candidates: 8, tokens: 4000, sequences: 4, window: 8, ..small() };
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
}
