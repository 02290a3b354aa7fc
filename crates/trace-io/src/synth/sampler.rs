//! The per-layer sampler of the routing model (the crate doc of [`super`] states the model):
//! [`LayerGen`] fills [`Block`]s of rows in token order from its own ChaCha8 streams.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, Exp1, Gamma, LogNormal, StandardNormal};

use super::SynthConfig;

/// Rows of one block: `ids`, `scores` `[n, m]`, `gates`, `norms` `[n, k]` (norms empty without).
#[derive(Debug, Default)]
pub(super) struct Block {
    pub(super) ids: Vec<u16>,
    pub(super) scores: Vec<f32>,
    pub(super) gates: Vec<f32>,
    pub(super) norms: Vec<f32>,
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
pub(super) struct LayerGen<'a> {
    cfg: &'a SynthConfig,
    /// Next token to generate.
    pub(super) t: usize,
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
    pub(super) fn new(cfg: &'a SynthConfig, l: usize) -> LayerGen<'a> {
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
    pub(super) fn fill(&mut self, n: usize, out: &mut Block) {
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
