//! The per-token misses of a plain configuration (SEMANTICS.md §5: one row per step, no pins,
//! one tier, cap > 0) from the fast token loop itself, told to a [`LayerEvents`] after each
//! token: under `exec host` every such miss that is not forced is a host run chosen by one row
//! and a background copy (§14), so these counts are all the cost needs.

use trace_io::TraceView;

use super::LayerEvents;
use crate::engine::{Evictor, LayerInput, Params, PerToken, State, TokenHook, run_rows};
use crate::policy::{VisitPolicy, with_policy};
use crate::{Keep, LayerCounts, ReplayConfig};

/// Layer `l`'s counts, with every token's misses told to `events`. The configuration is
/// validated and plain.
pub(crate) fn token_misses(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    l: usize,
    events: &mut LayerEvents,
) -> LayerCounts {
    let (params, input) = crate::engine::layer_alone(trace, keep, cfg, l);
    with_policy(&params, &input, Visit { params: &params, input: &input, events })
}

impl TokenHook for LayerEvents {
    #[inline(always)]
    fn token(&mut self, _t: usize, _chosen: &[u16], misses: u32, _loads: u32, _counted: bool) {
        LayerEvents::token(self, misses);
    }
}

/// Runs the token loop over every token with the policy [`with_policy`] builds.
struct Visit<'p, 'a, 'e> {
    params: &'p Params<'a>,
    input: &'p LayerInput<'a>,
    events: &'e mut LayerEvents,
}

impl VisitPolicy for Visit<'_, '_, '_> {
    type Out = LayerCounts;
    fn visit<P: Evictor>(self, policy: P) -> LayerCounts {
        let Visit { params, input, events } = self;
        run_rows(params, input, State::new(params, input, policy), 0..params.tokens, &mut PerToken, events).counts
    }
}
