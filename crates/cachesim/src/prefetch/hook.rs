//! The prefetch hook of the one token loop (SEMANTICS.md §12, then §5 steps 1-5):
//! [`crate::engine::run_rows`] with a [`PrefetchHook`]. Per token the loop builds F (step 1),
//! asks the hook's predictor for proposals (pruned ids dropped) and inserts them (each an access
//! for the policy; a victim is any cached expert that is not a proposal of this token), then
//! selection (step 2, which sees the prefetched experts as resident), counts (step 3), demand
//! accesses with k-way protection (step 4), credits (step 5).
//!
//! Bookkeeping of §12, in the hook: `tag[e]` is non-zero while expert e sits in the cache since
//! a prefetch and has not been accessed by demand: `(t' + 1) << 17 | i << 1 | counted`, the
//! prefetch's token, its index among that token's prefetch loads and whether it was made at a
//! counted token. A demand hit on a tagged expert is `useful` (when counted) and clears the tag;
//! a demand miss clears it too (the expert was evicted since, and a stale tag is overwritten by
//! every insert), so evictions need no bookkeeping. The largest tag among a token's demand hits
//! is the latest prefetch load the layer waits for on the timeline ([`crate::timeline`]).

use super::predict::Predict;
use crate::LayerCounts;
use crate::engine::{Evictor, LayerInput, Params, PerToken, State, TokenHook, run_rows};
use crate::timeline::LayerEvent;

/// The counts of one layer's prefetch replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PfLayerCounts {
    pub(crate) base: LayerCounts,
    pub(crate) prefetch_loads: u64,
    pub(crate) useful: u64,
}

/// What one layer's replay writes besides its counts.
pub(crate) struct Outputs<'o> {
    /// Per token, the layer's loads for the timeline, `[T]`.
    pub(crate) events: Option<&'o mut [LayerEvent]>,
    /// Per token, the chosen experts `[T, k_used]` and their number `[T]` (coact of the next
    /// layer at λ > 0).
    pub(crate) chosen: Option<(&'o mut [u16], &'o mut [u16])>,
}

/// The prefetch part of the token loop: the predictor, the tags of §12 and what the layer
/// records.
struct PrefetchHook<'o, R> {
    pred: R,
    /// `[E]`, as in the module doc.
    tag: Vec<u64>,
    /// The current token's useful loads and its latest awaited load (the largest tag hit).
    useful: u64,
    dep: u64,
    k_used: usize,
    prefetch_loads: u64,
    useful_total: u64,
    out: Outputs<'o>,
}

impl<R: Predict> TokenHook for PrefetchHook<'_, R> {
    const PREFETCH: bool = R::ACTIVE;
    #[inline(always)]
    fn propose(&mut self, t: usize, oracle: &[u16], out: &mut Vec<u16>) {
        self.pred.propose(t, oracle, out);
    }
    #[inline(always)]
    fn prefetched(&mut self, e: usize, t: usize, i: u64, counted: bool) {
        self.tag[e] = ((t as u64 + 1) << 17) | (i << 1) | u64::from(counted);
    }
    #[inline(always)]
    fn demand(&mut self, e: usize, hit: bool) {
        if !R::ACTIVE {
            return;
        }
        let tg = self.tag[e];
        self.useful += u64::from(hit) & tg;
        self.dep = self.dep.max(if hit { tg } else { 0 });
        self.tag[e] = 0;
    }
    #[inline(always)]
    fn token(&mut self, t: usize, chosen: &[u16], misses: u32, loads: u32, counted: bool) {
        if counted {
            self.prefetch_loads += u64::from(loads);
            self.useful_total += self.useful;
        }
        if let Some(events) = self.out.events.as_deref_mut() {
            events[t] = LayerEvent { prefetch_loads: loads, demand_loads: misses, dep: self.dep };
        }
        if let Some((ids, lens)) = self.out.chosen.as_mut() {
            let k = self.k_used;
            ids[t * k..t * k + chosen.len()].copy_from_slice(chosen);
            lens[t] = chosen.len() as u16;
        }
        (self.useful, self.dep) = (0, 0);
        self.pred.observe(chosen);
    }
}

/// The token loop of one layer with policy `policy` and predictor `pred` (both monomorphized):
/// [`run_rows`] over every token with the prefetch hook.
pub(crate) fn run<P: Evictor, R: Predict>(
    params: &Params<'_>,
    input: &LayerInput<'_>,
    budget: usize,
    policy: P,
    pred: R,
    out: Outputs<'_>,
) -> PfLayerCounts {
    let mut hook = PrefetchHook {
        pred,
        tag: vec![0; params.num_experts],
        useful: 0,
        dep: 0,
        k_used: params.k_used,
        prefetch_loads: 0,
        useful_total: 0,
        out,
    };
    let state = State::with_budget(params, input, policy, budget);
    let state = run_rows(params, input, state, 0..params.tokens, &mut PerToken, &mut hook);
    PfLayerCounts { base: state.counts, prefetch_loads: hook.prefetch_loads, useful: hook.useful_total }
}
