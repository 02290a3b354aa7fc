//! What a replay reads of a trace (SEMANTICS.md §1, §5), so that exactly that is validated
//! before it runs.

use trace_io::{Reads, Shape};

use crate::{Credits, Keep, ReplayConfig};

/// The content of a trace of shape `shape` that replaying `cfg` with `keep` reads:
/// - cache-aware routing (λ > 0) and `inv_router`: every candidate id and every score;
/// - a keep set that prunes some layer: every candidate id (F may reach the row's end);
/// - otherwise (λ = 0, every expert kept): the first `k_used` ids of each row, and for
///   `near_pick` and `near_pick_ema` the first max(k_used, N) (their credits read F up to N).
pub fn replay_reads(shape: &Shape, keep: &Keep, cfg: &ReplayConfig) -> Reads {
    let credits = cfg.policy.facts().credits;
    if cfg.lambda > 0.0 || credits == Credits::RouterScores {
        return Reads::ids_and_scores();
    }
    let pruned = (0..keep.layers()).any(|l| !keep.layer_mask(l).iter().all(|&kept| kept));
    if pruned {
        return Reads::ids(usize::MAX);
    }
    let k_used = cfg.k_used_or(shape.top_k);
    match credits {
        Credits::NearPickRanks => Reads::ids(k_used.max(cfg.near_pick_n)),
        Credits::None | Credits::RouterScores => Reads::ids(k_used),
    }
}

/// What replaying every `(keep, cfg)` of `runs` reads ([`replay_reads`] of each, together).
pub fn runs_reads(shape: &Shape, runs: &[(&Keep, &ReplayConfig)]) -> Reads {
    runs.iter().fold(Reads::NOTHING, |r, (keep, cfg)| r.union(replay_reads(shape, keep, cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Policy;

    /// Each rule of SEMANTICS.md §1 for the replay, on a shape with k = 4, m = 16, N = 6.
    #[test]
    fn reads_follow_the_rules() {
        let shape = Shape { layers: 2, tokens: 10, candidates: 16, top_k: 4, num_experts: 8 };
        let full = Keep::full(&shape);
        let pruned = Keep::from_layers(&shape, &[(0..8).collect(), (0..7).collect()]).unwrap();
        let cfg =
            |policy, lambda, k_used| ReplayConfig { lambda, k_used, near_pick_n: 6, ..ReplayConfig::new(policy, 8) };
        let cases: [(&Keep, ReplayConfig, Reads); 9] = [
            (&full, cfg(Policy::Lru, 0.0, None), Reads::ids(4)),
            (&full, cfg(Policy::Fifo, 0.0, Some(2)), Reads::ids(2)),
            (&full, cfg(Policy::Lfu, 0.0, None), Reads::ids(4)),
            (&full, cfg(Policy::Belady, 0.0, None), Reads::ids(4)),
            (&full, cfg(Policy::NearPick, 0.0, None), Reads::ids(6)),
            (&full, cfg(Policy::NearPickEma, 0.0, Some(8)), Reads::ids(8)),
            (&full, cfg(Policy::InvRouter, 0.0, None), Reads::ids_and_scores()),
            (&full, cfg(Policy::Lru, 0.1, None), Reads::ids_and_scores()),
            (&pruned, cfg(Policy::Lru, 0.0, None), Reads::ids(usize::MAX)),
        ];
        for (keep, cfg, want) in cases {
            assert_eq!(replay_reads(&shape, keep, &cfg), want, "{cfg:?}");
        }
        let lru = cfg(Policy::Lru, 0.0, None);
        let np = cfg(Policy::NearPick, 0.0, None);
        assert_eq!(runs_reads(&shape, &[(&full, &lru), (&full, &np)]), Reads::ids(6));
        assert_eq!(runs_reads(&shape, &[]), Reads::NOTHING);
    }
}
