//! `inv_router`: s ← d·s + p, p = the softmax of the row's router scores, a [`Decayed`] policy.

use super::decayed::{Credit, Decayed};
use super::{Credits, OnePass, PolicyFacts, PolicyKind, Shares};
use crate::deploy::heap::KeyHeap;
use crate::deploy::prio::{DecayedSteps, Lazy, StepCredit, StepParams, StepSets};
use crate::engine::{Cache, LayerInput, Params};
use crate::exp::exp_lanes;

/// inv_router's credits: x = the softmax of the row's scores over all m candidates (0 for
/// experts not among them).
pub(crate) struct RouterCredit<'a> {
    /// The softmax of the current row, `[m]`.
    pub(crate) probs_row: Vec<f64>,
    /// The layer's softmax rows computed beforehand ([`crate::engine::softmax_layer`],
    /// `[T, m]`), if given.
    pub(crate) probs: Option<&'a [f64]>,
}

/// `keys[pos[ids[i]]] += xs[i] * m` for each credited expert, in order. A pruned expert
/// (inv_router credits every candidate of the row) collects credits in an entry nobody reads:
/// it is never cached.
#[inline(never)]
fn add_scaled(ids: &[u16], xs: &[f64], m: f64, keys: &mut [f64], pos: &[u32]) {
    for (&e, &x) in ids.iter().zip(xs) {
        keys[pos[usize::from(e)] as usize] += x * m;
    }
}

/// Lanes of the vector exp in [`softmax_row`].
const LANES: usize = 8;

/// The softmax of one row of router scores over all m candidates, into `out` (`[m]`), as
/// SEMANTICS.md §5 defines it: w_i = exp(z_i − max z) with the project's exp
/// ([`crate::exp`]), p_i = w_i / Σ w, the sum in candidate order. Scores are non-increasing
/// along a row, so z[0] is the maximum. The reference replayer computes the same values.
#[inline(never)]
pub(crate) fn softmax_row(z: &[f32], out: &mut [f64]) {
    let max = f64::from(z[0]);
    let (z_chunks, z_tail) = z.as_chunks::<LANES>();
    let (out_chunks, out_tail) = out.as_chunks_mut::<LANES>();
    for (o, zc) in out_chunks.iter_mut().zip(z_chunks) {
        *o = exp_lanes(zc.map(|zi| f64::from(zi) - max));
    }
    for (o, &zi) in out_tail.iter_mut().zip(z_tail) {
        *o = crate::exp::exp(f64::from(zi) - max);
    }
    let mut sum = 0.0;
    for &w in out.iter() {
        sum += w;
    }
    for w in out.iter_mut() {
        *w /= sum;
    }
}

impl Credit for RouterCredit<'_> {
    fn f_needed(&self) -> usize {
        0
    }
    #[inline(always)]
    fn credit(&mut self, cache: &mut Cache<f64>, t: usize, _f: &[u16], row: &[u16], scores: Option<&[f32]>, m: f64) {
        let width = row.len();
        let p: &[f64] = match (self.probs, scores) {
            (Some(probs), _) => &probs[t * width..(t + 1) * width],
            (None, Some(z)) => {
                softmax_row(z, &mut self.probs_row);
                &self.probs_row
            }
            // validate() guarantees scores for inv_router; without them there is nothing to credit.
            (None, None) => return,
        };
        add_scaled(row, p, m, &mut cache.keys, &cache.pos);
    }
}

/// inv_router's evictor.
pub(crate) type InvRouter<'a> = Decayed<RouterCredit<'a>>;

impl<'a> PolicyKind<'a> for InvRouter<'a> {
    const FACTS: PolicyFacts = PolicyFacts {
        name: "inv_router",
        offline: false,
        credits: Credits::RouterScores,
        token_indices: false,
        shares: Shares::Softmax,
        curve: OnePass::Stack { pays_from: 3 },
        cost_per_pick: 320,
    };
    type Steps = DecayedSteps<RouterStepCredit>;
    fn build_steps(p: &StepParams, _sets: impl FnOnce() -> StepSets) -> Self::Steps {
        DecayedSteps::new(p.num_experts, p.decay, RouterStepCredit { probs: vec![0.0; p.m] })
    }
    fn build(params: &Params<'a>, input: &LayerInput<'a>) -> InvRouter<'a> {
        let credit = RouterCredit { probs_row: vec![0.0; params.m], probs: input.probs };
        Decayed::new(params, credit)
    }
}

/// inv_router's deployed credits: s ← d·s + p per row (p the softmax of the row's scores over
/// all m candidates), once per step.
pub(crate) struct RouterStepCredit {
    /// The row's probabilities, `[m]`.
    probs: Vec<f64>,
}

impl StepCredit for RouterStepCredit {
    fn f_needed(&self) -> usize {
        0
    }
    fn credit_row(&mut self, _f: &[u16], row: &[u16], scores: Option<&[f32]>, lazy: &mut Lazy, heap: &mut KeyHeap) {
        // validate() guarantees scores for inv_router.
        let Some(z) = scores else { return };
        softmax_row(z, &mut self.probs);
        for (&e, &p) in row.iter().zip(&self.probs) {
            lazy.credit(usize::from(e), p, heap);
        }
    }
}
