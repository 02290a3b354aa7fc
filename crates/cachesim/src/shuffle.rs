//! The locality control of SEMANTICS.md §12: a token-shuffled copy of a trace (a seeded
//! permutation of token order, the same for every layer), whose replay gives the misses a policy
//! would have without temporal locality.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use trace_io::{Lookahead, TraceMeta, TraceParts, TraceView};

/// A token-shuffled copy of a trace: ids, scores and `lookahead_ids` permuted by token, the
/// same permutation in every layer. Sequence and step boundaries are dropped (they mean nothing
/// in a shuffled order), and so are gates and output norms (a replay does not read them).
#[derive(Debug, Clone)]
pub struct Shuffled {
    meta: TraceMeta,
    tokens: usize,
    candidates: usize,
    ids: Vec<u16>,
    scores: Option<Vec<f32>>,
    lookahead: Option<(Vec<u16>, usize)>,
    /// `order[t]`: the original token at position t.
    order: Vec<usize>,
}

impl Shuffled {
    /// Shuffles `trace`'s tokens with the permutation of `seed` (ChaCha8 seeded with `seed`,
    /// Fisher-Yates: the same permutation on every platform).
    pub fn new(trace: &TraceView<'_>, seed: u64) -> Shuffled {
        let s = trace.shape();
        let (t_n, m) = (s.tokens, s.candidates);
        let mut order: Vec<usize> = (0..t_n).collect();
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let permute = |data: &[u16], w: usize| -> Vec<u16> {
            let mut out = Vec::with_capacity(data.len());
            for layer in data.chunks_exact(t_n * w) {
                for &t in &order {
                    out.extend_from_slice(&layer[t * w..(t + 1) * w]);
                }
            }
            out
        };
        let ids = permute(trace.parts().ids, m);
        let scores = trace.parts().scores.map(|z| {
            let mut out = Vec::with_capacity(z.len());
            for layer in z.chunks_exact(t_n * m) {
                for &t in &order {
                    out.extend_from_slice(&layer[t * m..(t + 1) * m]);
                }
            }
            out
        });
        let lookahead = trace.lookahead().map(|la| (permute(la.ids, la.width), la.width));
        Shuffled { meta: trace.meta().clone(), tokens: t_n, candidates: m, ids, scores, lookahead, order }
    }

    /// The original token index of each shuffled position, `[T]`.
    pub fn order(&self) -> &[usize] {
        &self.order
    }

    /// The shuffled trace.
    pub fn view(&self) -> TraceView<'_> {
        let parts = TraceParts {
            ids: &self.ids,
            scores: self.scores.as_deref(),
            gates: None,
            out_norms: None,
            seq_offsets: None,
            step_offsets: None,
            lookahead_ids: self.lookahead.as_ref().map(|(ids, width)| Lookahead { ids, width: *width }),
        };
        TraceView::new(&self.meta, self.tokens, self.candidates, parts)
            .expect("a token permutation of a validated trace is valid")
    }
}
