//! Work limits: what a command may cost before it asks for `yes`.

use cachesim::{Policy, Semantics};
use trace_io::TraceView;

use crate::error::Result;
use crate::usage;

/// Steps (picks plus per-replay expert state, `cachesim::mrc::curve_work`) the curves of one
/// command may cost without `yes`: about a minute.
pub const MAX_CURVE_STEPS: u64 = 4_000_000_000;

/// Refuses `steps` of curve work above [`MAX_CURVE_STEPS`] without `yes`. `narrow`: how the
/// command's own options make the work smaller (`mrc`: `‹caps›`; `plan`: fewer `‹variants›`).
///
/// # Errors
/// [`crate::Error::Usage`] naming the work, the limit and the ways out.
pub fn bound_curves(steps: u64, yes: bool, narrow: &str) -> Result<()> {
    if steps > MAX_CURVE_STEPS && !yes {
        usage!(
            "{steps} steps is above the limit of {MAX_CURVE_STEPS} without ‹yes› (minutes of work or more): {narrow}, \
             use a policy with a one-pass curve (lru, see the mrc command's help), or pass ‹yes› to run it"
        );
    }
    Ok(())
}

/// The work of the curve of `policy` on `v` over `caps` (default k_used..=E), in steps (one per
/// pick, plus the E experts of state each replay of a layer sets up:
/// `cachesim::mrc::curve_work`), and its description.
pub fn curve_work(
    v: &TraceView<'_>,
    policy: Policy,
    semantics: Semantics,
    k_used: Option<usize>,
    caps: Option<(usize, usize)>,
) -> (u64, String) {
    let s = v.shape();
    let k = k_used.unwrap_or(s.top_k);
    let (lo, hi) = caps.unwrap_or((k, s.num_experts));
    let work = cachesim::mrc::curve_work(&s, policy, semantics, k, lo, hi);
    let (n, per_replay) = (work.caps, work.per_replay);
    // One pass over every cap from k_used to E, sliced to the caps asked for.
    if work.one_pass {
        let order = match policy.facts().curve {
            cachesim::OnePass::Lru { .. } => "log E",
            _ => "the depth of the deepest pick",
        };
        let what = format!(
            "{policy} curve of caps {lo}..={hi} in one pass (O(L x T x k x {order})): about {per_replay} steps"
        );
        return (per_replay, what);
    }
    let steps = work.steps;
    let layers = if s.layers == 1 { "1 layer".to_string() } else { format!("{} layers", s.layers) };
    let what = format!(
        "{policy} curve of caps {lo}..={hi} by one replay per cap: {n} caps x {layers} x ({} tokens x k_used {k} + E \
         = {} experts of state) = {steps} steps",
        s.tokens, s.num_experts
    );
    (steps, what)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_limit_is_inclusive_and_yes_lifts_it() {
        assert!(super::bound_curves(super::MAX_CURVE_STEPS, false, "x").is_ok());
        let e = super::bound_curves(super::MAX_CURVE_STEPS + 1, false, "narrow ‹caps›").unwrap_err();
        assert!(e.to_string().contains("4000000001 steps is above the limit of 4000000000 without yes"), "{e}");
        assert!(super::bound_curves(u64::MAX, true, "x").is_ok());
    }
}
