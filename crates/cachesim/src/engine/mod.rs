//! The fast replay core: one layer at a time, generic over the eviction policy (monomorphized),
//! all state allocated before the token loop, no `Result`, no dynamic dispatch inside it.
//!
//! Map (docs/ARCHITECTURE.md has the same with how to add a policy):
//! - [`step_loop`]: the one step loop of a layer ([`run`], `run_rows`): F, selection (λ = 0 and
//!   cache-aware), counts, residency with k-way protection, credits (SEMANTICS.md §5), each row a
//!   step ([`PerToken`]) or a deployment's steps through its tiers ([`Steps`], §9-§11).
//! - [`evictor`]: the [`Evictor`] trait, what the token loop asks of a policy, and [`Pick`],
//!   [`Protected`].
//! - [`cache`]: [`Cache`], the cached experts of one layer (position index, keys beside them).
//! - [`structures`]: the priority structures the policies build on (an intrusive list, groups
//!   of equal count, counts per integer key value, a vector selector of the lowest scores).
//! - [`shared_cache`]: the loop of one cache shared by every layer (SEMANTICS.md §15.1).
//! - [`shared`]: work that depends only on the trace, computed once for several configurations
//!   (F tables, softmax tables).
//! - [`lockstep`]: several configurations of one layer in one pass over its rows, a block of
//!   tokens at a time (the token loop resumed block after block for each).
//! - [`simd`]: small vector and branch-free helpers.
//! - The policies themselves are in `crate::policy`, one file each.
//!
//! In k-way mode the victims of a token can be chosen all at once before its accesses
//! ([`Evictor::BATCH`]): the keys of unchosen experts do not change within a token and chosen
//! ones are protected, so the token's q misses evict exactly the q lowest unprotected keys.
//! Sequential mode selects one victim per miss. Why each piece is shaped as it is, with the
//! measurements, is in docs/performance.md.

pub(crate) mod cache;
pub(crate) mod evictor;
pub(crate) mod lockstep;
pub(crate) mod shared;
pub(crate) mod shared_cache;
pub(crate) mod simd;
pub(crate) mod step_loop;
pub(crate) mod structures;

pub(crate) use cache::{ABSENT, Cache};
pub(crate) use evictor::{Evictor, Pick, Protected};
pub(crate) use shared::{FTable, softmax_layer};
pub(crate) use step_loop::{ByStep, PerToken, State, Steps, TokenHook, run, run_rows};
use trace_io::{Shape, TraceView};

use crate::{Keep, Policy, ReplayConfig, Semantics};

/// Configuration resolved against a trace, shared by all layers.
pub(crate) struct Params<'a> {
    pub policy: Policy,
    pub tokens: usize,
    pub m: usize,
    pub num_experts: usize,
    pub k_used: usize,
    pub cap: usize,
    pub lambda: f64,
    pub j: usize,
    pub warmup: usize,
    pub decay: f64,
    pub near_n: usize,
    pub sequential: bool,
    /// Tokens at which caches and policy state are reset (empty when resets are off).
    pub resets: &'a [u64],
}

impl<'a> Params<'a> {
    pub fn new(shape: &Shape, cfg: &ReplayConfig, seq_offsets: Option<&'a [u64]>) -> Params<'a> {
        Params {
            policy: cfg.policy,
            tokens: shape.tokens,
            m: shape.candidates,
            num_experts: shape.num_experts,
            k_used: cfg.k_used_or(shape.top_k),
            cap: cfg.cap,
            lambda: cfg.lambda,
            j: cfg.j,
            warmup: cfg.warmup,
            decay: cfg.decay,
            near_n: cfg.near_pick_n,
            sequential: cfg.semantics == Semantics::Sequential,
            resets: if cfg.reset_at_sequence { seq_offsets.unwrap_or(&[]) } else { &[] },
        }
    }
}

/// Layer `l` on its own: the parameters with the layer's cap, and its slices with no table shared
/// with other configurations (the token loops of prefetch and hybrid execution, one
/// configuration at a time).
pub(crate) fn layer_alone<'a>(
    trace: &TraceView<'a>,
    keep: &'a Keep,
    cfg: &ReplayConfig,
    l: usize,
) -> (Params<'a>, LayerInput<'a>) {
    let mut params = Params::new(&trace.shape(), cfg, trace.seq_offsets());
    params.cap = cfg.cap_of(l);
    let input = LayerInput {
        ids: trace.layer_ids(l),
        scores: trace.layer_scores(l),
        keep: keep.layer_mask(l),
        probs: None,
        f_table: None,
    };
    (params, input)
}

/// One layer's slices: ids and scores `[T, m]`, keep mask `[E]`, and optionally the softmax of
/// every row ([`softmax_layer`], `[T, m]`) for `inv_router`.
pub(crate) struct LayerInput<'a> {
    pub ids: &'a [u16],
    pub scores: Option<&'a [f32]>,
    pub keep: &'a [bool],
    pub probs: Option<&'a [f64]>,
    /// F of every row for the pruned keep set `keep` ([`FTable`]), if built.
    pub f_table: Option<&'a FTable>,
}
