//! [`SynthConfig`]: the shape, seeds and routing parameters of a synthetic trace, and their checks.

use std::collections::BTreeMap;

use crate::{Phase, Result, ScoreKind, TraceError, TraceMeta};

/// Parameters of a synthetic trace. The shape defaults make a small 4-layer, 32-expert, top-4
/// trace; the routing defaults are the [`SynthPreset::Dsv2Lite`](super::SynthPreset::Dsv2Lite)
/// preset, fitted to the real DeepSeek-V2-Lite ESFT translation trace (`docs/synth.md`).
/// [`SynthPreset`](super::SynthPreset) names other fitted routing parameters.
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
