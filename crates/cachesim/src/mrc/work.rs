//! How much work a miss-ratio curve is, before it runs: what the CLI's `mrc` and `plan` and
//! the Python `plan` bound (a limit without `--yes` / `yes=True`) and report.

use trace_io::Shape;

use super::has_one_pass;
use crate::{OnePass, Policy, Semantics};

/// The work of one curve of caps `lo..=hi` ([`curve_work`]), in steps: one step is one pick
/// replayed, or one expert's state set up per layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CurveWork {
    /// Steps of the whole curve.
    pub steps: u64,
    /// Steps of one replay of every layer: L × (T × k_used + E).
    pub per_replay: u64,
    /// Caps in the curve: hi − lo + 1.
    pub caps: u64,
    /// Whether the curve takes one pass for all its caps ([`has_one_pass`], caps inside
    /// k_used..=E); otherwise one replay per cap.
    pub one_pass: bool,
}

/// The work of `policy`'s curve of caps `lo..=hi` under `semantics` on a trace of `shape` with
/// `k_used` experts per token: one pass of `per_replay` steps when the policy has a one-pass
/// curve ([`has_one_pass`]) and the caps lie inside k_used..=E, else `caps × per_replay`.
/// Saturates at `u64::MAX`.
pub fn curve_work(
    shape: &Shape,
    policy: Policy,
    semantics: Semantics,
    k_used: usize,
    lo: usize,
    hi: usize,
) -> CurveWork {
    let caps = hi.saturating_sub(lo) as u64 + 1;
    let (layers, tokens, e_n) = (shape.layers as u64, shape.tokens as u64, shape.num_experts as u64);
    let per_replay = layers.saturating_mul(tokens.saturating_mul(k_used as u64).saturating_add(e_n));
    let one_pass = has_one_pass(policy, semantics) && lo >= k_used && hi <= shape.num_experts;
    let steps = if one_pass { per_replay } else { caps.saturating_mul(per_replay) };
    CurveWork { steps, per_replay, caps, one_pass }
}

/// Whether the curve of `policy` with pinned experts is the one-pass curve of the unpinned
/// stream (`lru_curve_pinned`, SEMANTICS.md §9): a policy whose facts say [`OnePass::Lru`]
/// (an LRU stack: pinned picks leave the order of the others as it is).
pub fn has_pinned_curve(policy: Policy) -> bool {
    matches!(policy.facts().curve, OnePass::Lru { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape { layers: 2, tokens: 100, candidates: 16, top_k: 4, num_experts: 16 }
    }

    /// (policy, semantics, k_used, lo, hi) -> (steps, one_pass); per replay 2 × (100 × k + 16).
    #[test]
    fn curve_work_by_hand() {
        let check = |policy: Policy, sem, k, lo, hi, expect: (u64, bool)| {
            let w = curve_work(&shape(), policy, sem, k, lo, hi);
            assert_eq!((w.steps, w.one_pass), expect, "{policy} {sem:?} k {k} caps {lo}..={hi}");
        };
        check(Policy::Lru, Semantics::KWay, 4, 4, 16, (832, true));
        check(Policy::Lru, Semantics::Sequential, 4, 4, 16, (832, true));
        check(Policy::Belady, Semantics::KWay, 4, 4, 16, (832, true));
        check(Policy::Belady, Semantics::Sequential, 4, 4, 16, (13 * 832, false));
        check(Policy::InvRouter, Semantics::KWay, 2, 2, 16, (432, true));
        check(Policy::Fifo, Semantics::KWay, 4, 4, 16, (13 * 832, false));
        check(Policy::Lfu, Semantics::KWay, 4, 8, 9, (2 * 832, false));
        // Caps below k_used lie outside the one-pass curve.
        check(Policy::Lru, Semantics::KWay, 4, 2, 16, (15 * 832, false));
    }

    #[test]
    fn pinned_curve_is_lru_only() {
        let with: Vec<Policy> = Policy::ALL.into_iter().filter(|&p| has_pinned_curve(p)).collect();
        assert_eq!(with, [Policy::Lru]);
    }
}
