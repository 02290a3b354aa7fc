//! The keys of the credit policies for the one-pass priority stack (`stack.rs`): near_pick,
//! near_pick_ema and inv_router at λ = 0 (SEMANTICS.md §5). Each credits every expert of a row
//! whether cached or not, and breaks ties by the last access (a pick time), then the id; at λ = 0
//! both are functions of the trace alone, so the priorities do not depend on the cap.
//!
//! The lazy decay is the replayers' own arithmetic (M ← M · (1/d) with 1/d computed once, S[e] ←
//! S[e] + x · M in candidate order, the rescale above 1e100) and the softmax is
//! [`crate::policy::softmax_row`], so the scores are the same bits as in a replay.

use super::stack::StackKeys;
use crate::policy::softmax_row;

/// The lazy form's rescale threshold (SEMANTICS.md §5).
const RESCALE_ABOVE: f64 = 1e100;

/// Pick times of the last access of every expert: `t · k_used + i + 1` for the i-th pick of
/// token t (0: not accessed since the last reset).
struct LastAccess {
    last: Vec<u64>,
    k_used: usize,
}

impl LastAccess {
    fn new(experts: usize, k_used: usize) -> LastAccess {
        LastAccess { last: vec![0; experts], k_used }
    }
    fn touch(&mut self, t: usize, f: &[u16]) {
        for (i, &e) in f.iter().enumerate() {
            self.last[usize::from(e)] = (t * self.k_used + i + 1) as u64;
        }
    }
    /// (last access, id) in the low 64 bits of a rank: the last access below 2^48 (fewer than
    /// 2^32 tokens of at most 2^16 picks), the id in the low 16 bits.
    fn low_bits(&self, e: u16) -> u128 {
        u128::from((self.last[usize::from(e)] << 16) | u64::from(e))
    }
}

/// near_pick: the last token at which the expert stood in F at rank < N, then the last access.
pub(super) struct NearPickKeys<'a> {
    /// Last near-pick token + 1 (0: never since the last reset).
    near: Vec<u64>,
    last: LastAccess,
    keep: &'a [bool],
    near_n: usize,
}

impl<'a> NearPickKeys<'a> {
    /// Keys over the layer's keep set `keep` (F is its kept candidates), N = `near_n`.
    pub(super) fn new(keep: &'a [bool], k_used: usize, near_n: usize) -> NearPickKeys<'a> {
        NearPickKeys { near: vec![0; keep.len()], last: LastAccess::new(keep.len(), k_used), keep, near_n }
    }
}

impl StackKeys for NearPickKeys<'_> {
    fn start(&mut self, _t: usize, _f: &[u16]) {}
    fn rank(&self, e: u16) -> u128 {
        (u128::from(self.near[usize::from(e)]) << 64) | self.last.low_bits(e)
    }
    fn finish(&mut self, t: usize, f: &[u16], row: &[u16], _scores: Option<&[f32]>, _probs: Option<&[f64]>) {
        let keep = self.keep;
        for e in row.iter().copied().filter(|&e| keep[usize::from(e)]).take(self.near_n) {
            self.near[usize::from(e)] = t as u64 + 1;
        }
        self.last.touch(t, f);
    }
    fn reset(&mut self) {
        self.near.fill(0);
        self.last.last.fill(0);
    }
}

/// What a decayed policy credits after each token.
#[derive(Clone, Copy)]
pub(super) enum DecayedCredit {
    /// near_pick_ema: 1 to each of F's first N.
    NearPick { near_n: usize },
    /// inv_router: the softmax of the row's scores to each of its candidates.
    Router,
}

/// near_pick_ema and inv_router: the lazy scores S with the multiplier M, then the last access.
pub(super) struct DecayedKeys<'a> {
    score: Vec<f64>,
    multiplier: f64,
    inv_decay: f64,
    credit: DecayedCredit,
    last: LastAccess,
    keep: &'a [bool],
    /// One row's softmax (inv_router).
    probs: Vec<f64>,
}

impl<'a> DecayedKeys<'a> {
    /// Keys over the layer's keep set `keep`, decay `decay`, rows of `m` candidates.
    pub(super) fn new(keep: &'a [bool], k_used: usize, m: usize, decay: f64, credit: DecayedCredit) -> DecayedKeys<'a> {
        DecayedKeys {
            score: vec![0.0; keep.len()],
            multiplier: 1.0,
            inv_decay: 1.0 / decay,
            credit,
            last: LastAccess::new(keep.len(), k_used),
            keep,
            probs: vec![0.0; m],
        }
    }
}

impl StackKeys for DecayedKeys<'_> {
    fn start(&mut self, _t: usize, _f: &[u16]) {}
    fn rank(&self, e: u16) -> u128 {
        // Scores are sums of non-negative credits: their bits order as the values do (+0.0
        // lowest).
        (u128::from(self.score[usize::from(e)].to_bits()) << 64) | self.last.low_bits(e)
    }
    fn finish(&mut self, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, probs: Option<&[f64]>) {
        self.multiplier *= self.inv_decay;
        let m = self.multiplier;
        match self.credit {
            DecayedCredit::NearPick { near_n } => {
                let keep = self.keep;
                for e in row.iter().copied().filter(|&e| keep[usize::from(e)]).take(near_n) {
                    self.score[usize::from(e)] += m;
                }
            }
            DecayedCredit::Router => {
                let p: &[f64] = match (probs, scores) {
                    (Some(p), _) => p,
                    (None, Some(z)) => {
                        softmax_row(z, &mut self.probs);
                        &self.probs
                    }
                    (None, None) => &[],
                };
                for (&e, &p) in row.iter().zip(p) {
                    self.score[usize::from(e)] += p * m;
                }
            }
        }
        if self.multiplier > RESCALE_ABOVE {
            for s in &mut self.score {
                *s /= self.multiplier;
            }
            self.multiplier = 1.0;
        }
        self.last.touch(t, f);
    }
    fn reset(&mut self) {
        self.score.fill(0.0);
        self.multiplier = 1.0;
        self.last.last.fill(0);
    }
}
