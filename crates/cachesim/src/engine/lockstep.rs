//! Several configurations of one layer in one pass over its rows (issue #40): every member's
//! step loop ([`run_rows`], unchanged) replays a block of tokens, one member after another,
//! before the next block, so the block's ids, scores and the shared tables (F, softmax) are read
//! from the core's cache by every member instead of being streamed from memory once per member.
//!
//! What depends only on the trace (F, the softmax) is computed once per row for all members by
//! the tables of [`super::shared`]; what depends on the cache (cache-aware selection, residency,
//! the credits stored in each cache's keys) stays per member. The dispatch on the policy is a
//! `dyn` call per member and block, outside the token loop.

use super::{Evictor, LayerInput, Params, PerToken, State, run_rows};
use crate::LayerCounts;

/// Bytes of row data (ids, scores, softmax, F) one block should span: well inside a core's L2
/// (2 MiB on the development VM) with the members' own state beside it.
const BLOCK_BYTES: usize = 256 * 1024;

/// Bytes per candidate that a block's rows may occupy: a `u16` id, an `f32` score, an `f64`
/// softmax and F's `u16` id and `u16` position.
const BYTES_PER_CANDIDATE: usize = 2 + 4 + 8 + 4;

/// Tokens per block for rows of `m` candidates: [`BLOCK_BYTES`] of rows, at least 16 tokens.
pub(crate) fn block_tokens(m: usize) -> usize {
    (BLOCK_BYTES / (m.max(1) * BYTES_PER_CANDIDATE)).max(16)
}

/// One configuration of a lockstep group: its token loop, resumable block after block.
pub(crate) trait Member {
    /// Replays `tokens` (the next block, in order).
    fn advance(&mut self, tokens: std::ops::Range<usize>);
    /// The counts after the last block.
    fn counts(&self) -> LayerCounts;
}

/// A [`Member`] with policy `P`: its parameters, its slices and its token-loop state.
pub(crate) struct Run<'a, P: Evictor> {
    params: Params<'a>,
    input: LayerInput<'a>,
    /// Always `Some` between calls; moved through [`run_rows`] by value.
    state: Option<State<P>>,
}

impl<'a, P: Evictor> Run<'a, P> {
    /// The member for `params` and `input` with `policy` built for them, before token 0.
    pub(crate) fn new(params: Params<'a>, input: LayerInput<'a>, policy: P) -> Run<'a, P> {
        let state = State::new(&params, &input, policy);
        Run { params, input, state: Some(state) }
    }
}

impl<P: Evictor> Member for Run<'_, P> {
    fn advance(&mut self, tokens: std::ops::Range<usize>) {
        if let Some(state) = self.state.take() {
            self.state = Some(run_rows(&self.params, &self.input, state, tokens, &mut PerToken, &mut ()));
        }
    }
    fn counts(&self) -> LayerCounts {
        self.state.as_ref().map(|s| s.counts).unwrap_or_default()
    }
}

/// Replays `members` (all on one layer of `tokens` tokens) in lockstep, `block` tokens at a
/// time (the sweep uses [`block_tokens`]), and returns their counts in order: each equal to the
/// member's replay alone (the token loop is resumable over consecutive ranges). `progress` is
/// told the tokens replayed after each block (members × block length). Memory: every member's
/// state is alive at once (for `belady`, 4 bytes × T × k_used each; the reference grid's peak
/// RSS did not move, the "Fourteenth round" of docs/performance.md at 29c2d74).
pub(crate) fn run_lockstep(
    members: &mut [Box<dyn Member + '_>],
    tokens: usize,
    block: usize,
    progress: &(dyn Fn(usize) + Sync),
) -> Vec<LayerCounts> {
    let block = block.max(1);
    let mut start = 0;
    while start < tokens {
        let end = (start + block).min(tokens);
        for member in members.iter_mut() {
            member.advance(start..end);
        }
        progress((end - start) * members.len());
        start = end;
    }
    members.iter().map(|member| member.counts()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{FTable, layer_alone, softmax_layer};
    use crate::{Keep, Policy, ReplayConfig, Semantics};

    /// Every policy, in one group with caps, λ, j, k_used, warmups, resets and semantics that
    /// differ, replayed in lockstep blocks of 1, 7 and 64 tokens (and one block for the whole
    /// layer), with and without the shared F and softmax tables: each member's counts equal its
    /// replay alone, and progress adds up to members × tokens.
    #[test]
    fn lockstep_equals_each_alone() {
        let synth = trace_io::synth::SynthConfig {
            layers: 2,
            experts: 16,
            top_k: 3,
            candidates: 7,
            tokens: 250,
            sequences: 3,
            ..Default::default()
        };
        let trace = trace_io::synth::generate(&synth).expect("a valid synthetic trace");
        let view = trace.view();
        let shape = view.shape();
        let pruned = Keep::from_layers(&shape, &[(0..16).step_by(2).chain([1, 3]).collect(), (4..16).collect()])
            .expect("a valid keep set");
        let mut cfgs = Vec::new();
        for policy in Policy::ALL {
            for (cap, lambda, j, k_used, warmup, reset, sequential) in [
                (4, 0.0, 0, None, 0, false, false),
                (6, 0.0, 0, Some(2), 5, true, false),
                (5, 0.3, 2, None, 3, false, false),
                (3, 0.12, 1, None, 0, true, true),
            ] {
                if lambda > 0.0 && !policy.facts().allows_lambda() {
                    continue;
                }
                let semantics = if sequential { Semantics::Sequential } else { Semantics::KWay };
                cfgs.push(ReplayConfig {
                    lambda,
                    j,
                    k_used,
                    warmup,
                    reset_at_sequence: reset,
                    semantics,
                    near_pick_n: 4,
                    ..ReplayConfig::new(policy, cap)
                });
            }
        }
        for keep in [Keep::full(&shape), pruned] {
            for l in 0..shape.layers {
                let mut f_table = FTable::default();
                let table = f_table.rebuild(view.layer_ids(l), keep.layer_mask(l), shape.candidates);
                let probs = softmax_layer(view.layer_scores(l).expect("scores"), shape.candidates);
                for shared in [false, true] {
                    let alone: Vec<LayerCounts> = cfgs
                        .iter()
                        .map(|cfg| {
                            let (params, input) = layer_alone(&view, &keep, cfg, l);
                            crate::policy::replay_layer(&params, &input)
                        })
                        .collect();
                    for block in [1, 7, 64, shape.tokens] {
                        let mut group: Vec<Box<dyn Member + '_>> = cfgs
                            .iter()
                            .map(|cfg| {
                                let (params, mut input) = layer_alone(&view, &keep, cfg, l);
                                if shared {
                                    input.probs = Some(&probs);
                                    input.f_table = Some(table).filter(|_| !keep.layer_mask(l).iter().all(|&k| k));
                                }
                                crate::policy::lockstep_member(params, input)
                            })
                            .collect();
                        let steps = std::sync::atomic::AtomicUsize::new(0);
                        let got = run_lockstep(&mut group, shape.tokens, block, &|n| {
                            steps.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                        });
                        assert_eq!(steps.into_inner(), cfgs.len() * shape.tokens);
                        for ((cfg, got), alone) in cfgs.iter().zip(&got).zip(&alone) {
                            assert!(got.hits > 0 && got.misses > 0, "{cfg:?}");
                            assert_eq!(got, alone, "layer {l}, block {block}, shared {shared}: {cfg:?}");
                        }
                    }
                }
            }
        }
    }
}
