//! `inv_router`: s ← d·s + p, p = the softmax of the row's router scores, a [`Decayed`] policy.

use super::decayed::{Credit, Decayed};
use super::{PolicyFacts, PolicyKind, Shares};
use crate::engine::{Cache, LayerInput, Params};

/// inv_router: x = the softmax of the row's scores over all m candidates (0 for experts not
/// among them).
pub(crate) struct RouterCredit<'a> {
    /// The softmax of the current row, `[m]`.
    pub(crate) exps: Vec<f64>,
    pub(crate) memo: ExpMemo,
    /// The layer's softmax rows computed beforehand ([`softmax_layer`], `[T, m]`), if given.
    pub(crate) probs: Option<&'a [f64]>,
}

/// `keys[pos[ids[i]]] += xs[i]` for each credited expert, in order: the scores of [`Decayed`]. A
/// pruned expert (inv_router credits every candidate of the row) collects credits without decay
/// in an entry nobody reads: it is never cached.
#[inline(never)]
pub(crate) fn add_credits(ids: &[u16], xs: &[f64], keys: &mut [f64], pos: &[u32]) {
    for (&e, &x) in ids.iter().zip(xs) {
        keys[pos[usize::from(e)] as usize] += x;
    }
}

/// The softmax of one row of router scores over all m candidates, into `out` (`[m]`): exp(z −
/// max) / sum, in f64, in this order (the reference computes the same). Scores are
/// non-increasing along a row, so z[0] is the maximum.
#[inline(never)]
pub(crate) fn softmax_row(z: &[f32], memo: &mut ExpMemo, out: &mut [f64]) {
    let max = f64::from(z[0]);
    let mut sum = 0.0;
    if memo.on {
        let mut hits = 0;
        for (x, &zi) in out.iter_mut().zip(z) {
            let (v, hit) = memo.exp(f64::from(zi) - max);
            *x = v;
            hits += usize::from(hit);
            sum += v;
        }
        memo.probe(z.len(), hits);
    } else {
        for (x, &zi) in out.iter_mut().zip(z) {
            *x = (f64::from(zi) - max).exp();
            sum += *x;
        }
    }
    for x in out.iter_mut() {
        *x /= sum;
    }
}

/// A direct-mapped memo of `f64::exp`: exact (the same function on the same argument), and a
/// saving when router scores are quantized (bf16 logits, rounded probabilities), so that the
/// same differences z − max recur. A miss costs one hash and one store on top of the `exp`, so
/// the memo watches its first [`MEMO_PROBE`] lookups and turns itself off when fewer than half
/// of them hit (continuous scores).
pub(crate) struct ExpMemo {
    /// Argument bits per entry; a NaN pattern (never an argument: scores are finite) when empty.
    pub(crate) keys: Vec<u64>,
    pub(crate) vals: Vec<f64>,
    pub(crate) on: bool,
    pub(crate) lookups: u32,
    pub(crate) hits: u32,
}

pub(crate) const MEMO_BITS: u32 = 10;

/// Lookups after which [`ExpMemo`] decides whether it pays.
pub(crate) const MEMO_PROBE: u32 = 1 << 16;

impl ExpMemo {
    pub(crate) fn new() -> ExpMemo {
        ExpMemo { keys: vec![u64::MAX; 1 << MEMO_BITS], vals: vec![0.0; 1 << MEMO_BITS], on: true, lookups: 0, hits: 0 }
    }

    /// exp(x) and whether the memo held it.
    #[inline(always)]
    pub(crate) fn exp(&mut self, x: f64) -> (f64, bool) {
        let bits = x.to_bits();
        let i = ((bits ^ (bits >> 31)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO_BITS)) as usize;
        if self.keys[i] == bits {
            return (self.vals[i], true);
        }
        let v = x.exp();
        self.keys[i] = bits;
        self.vals[i] = v;
        (v, false)
    }

    /// Accounts one row's lookups while probing; turns the memo off when it does not pay.
    #[inline(always)]
    pub(crate) fn probe(&mut self, lookups: usize, hits: usize) {
        if self.lookups < MEMO_PROBE {
            self.lookups = self.lookups.saturating_add(lookups as u32);
            self.hits = self.hits.saturating_add(hits as u32);
            if self.lookups >= MEMO_PROBE {
                self.on = self.hits >= self.lookups / 2;
            }
        }
    }
}

impl Credit for RouterCredit<'_> {
    fn f_needed(&self) -> usize {
        0
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, t: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        let m = row.len();
        let p: &[f64] = match (self.probs, scores) {
            (Some(probs), _) => &probs[t * m..(t + 1) * m],
            (None, Some(z)) => {
                softmax_row(z, &mut self.memo, &mut self.exps);
                &self.exps
            }
            // validate() guarantees scores for inv_router; without them there is nothing to credit.
            (None, None) => return,
        };
        add_credits(row, p, &mut cache.keys, &cache.pos);
    }
}

/// inv_router's evictor.
pub(crate) type InvRouter<'a> = Decayed<RouterCredit<'a>>;

impl<'a> PolicyKind<'a> for InvRouter<'a> {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "inv_router",
        needs_scores: true,
        allows_lambda: true,
        token_indices: false,
        shares: Shares::ScoresAndSoftmax,
        cost_per_pick: 810,
        cost_per_pick_shared: 420,
    };
    fn build(params: &Params<'a>, input: &LayerInput<'a>) -> InvRouter<'a> {
        let credit = RouterCredit { exps: vec![0.0; params.m], memo: ExpMemo::new(), probs: input.probs };
        Decayed::new(params, credit)
    }
}
