//! Properties of the replay that must hold on any trace (SEMANTICS.md §5, §8.5).

mod common;

use std::collections::BTreeSet;

use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use common::{Synth, random_keep, synth};
use proptest::prelude::*;

fn synth_params() -> impl Strategy<Value = (u64, Synth, f64)> {
    (any::<u64>(), 6usize..20, 1usize..4, 0usize..4, 0.0f64..0.9, 1usize..4, 0.2f64..1.0).prop_map(
        |(seed, e, k, extra, reuse, sequences, keep_p)| {
            let s = Synth {
                layers: 2,
                tokens: 120,
                num_experts: e,
                top_k: k,
                candidates: (k + extra).min(e),
                reuse,
                sequences,
                with_scores: true,
            };
            (seed, s, keep_p)
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Belady (offline optimum) never misses more than an online policy at λ = 0, k-way, when every
    /// token counts (W = 0), in total and per layer (layers are independent).
    ///
    /// Counted from W > 0 it is not a bound (`hand.rs`, `belady_counted_from_warmup_is_not_a_bound`):
    /// the two caches enter the window in different states. From token W on, Belady is the optimum
    /// for the rest of the trace from its own state, and a state differing in at most `cap` experts
    /// costs at most `cap` extra misses per layer; so per layer belady <= online + cap.
    #[test]
    fn belady_is_a_lower_bound((seed, s, keep_p) in synth_params(), cap_extra in 0usize..6, warmup in 0usize..20) {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        let keep = Keep::from_layers(&shape, &random_keep(seed, s.layers, s.num_experts, keep_p, 1)).expect("valid");
        let cap = s.top_k + cap_extra;
        for w in [0, warmup] {
            let base = ReplayConfig { warmup: w, near_pick_n: 3, ..ReplayConfig::new(Policy::Belady, cap) };
            let slack = if w == 0 { 0 } else { cap as u64 };
            let opt = cachesim::replay(&view, &keep, &base).expect("valid");
            for policy in Policy::ALL {
                let c = cachesim::replay(&view, &keep, &ReplayConfig { policy, ..base.clone() }).expect("valid");
                prop_assert!(opt.misses <= c.misses + slack * s.layers as u64, "W {w}: belady {} > {policy} {}", opt.misses, c.misses);
                for (l, (b, o)) in opt.layer_misses.iter().zip(&c.layer_misses).enumerate() {
                    prop_assert!(*b <= o + slack, "W {w}, layer {l}: belady {b} > {policy} {o} + {slack}");
                }
                prop_assert_eq!(c.hits + c.misses, c.picks);
                prop_assert_eq!(c.forced_misses, opt.forced_misses);
            }
        }
    }

    /// With room for every expert, the only misses are compulsory (first use of each expert,
    /// counted from W on) and forced ones.
    #[test]
    fn unbounded_cache_has_only_compulsory_misses((seed, s, keep_p) in synth_params(), warmup in 0usize..30) {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        let lists = random_keep(seed, s.layers, s.num_experts, keep_p, 1);
        let keep = Keep::from_layers(&shape, &lists).expect("valid");
        let k = shape.top_k;
        let mut expected = 0u64;
        for l in 0..shape.layers {
            let mut seen = BTreeSet::new();
            for t in 0..shape.tokens {
                let chosen: Vec<u16> = view.row(l, t).iter().copied().filter(|&e| keep.is_kept(l, e.into())).take(k).collect();
                if t >= warmup {
                    expected += (k - chosen.len()) as u64;
                }
                for e in chosen {
                    if seen.insert(e) && t >= warmup {
                        expected += 1;
                    }
                }
            }
        }
        for policy in Policy::ALL {
            for semantics in [Semantics::KWay, Semantics::Sequential] {
                let cfg = ReplayConfig { warmup, semantics, ..ReplayConfig::new(policy, s.num_experts + 3) };
                let c = cachesim::replay(&view, &keep, &cfg).expect("valid");
                prop_assert_eq!(c.misses, expected, "{} {}", policy, semantics);
            }
        }
    }

    /// Cache-aware routing that boosts every candidate (j >= m) changes no order: same counts as
    /// λ = 0. And λ > 0 with k = 1 has δ = 0: again the same counts.
    #[test]
    fn routing_that_cannot_reorder_equals_plain_replay((seed, s, keep_p) in synth_params(), lambda in 0.01f64..2.0) {
        let trace = synth(seed, Synth { candidates: (s.top_k + 2).min(s.num_experts), ..s });
        let view = trace.view();
        let shape = view.shape();
        prop_assume!(shape.candidates > shape.top_k);
        let keep = Keep::from_layers(&shape, &random_keep(seed, s.layers, s.num_experts, keep_p, 1)).expect("valid");
        for policy in Policy::ALL.into_iter().filter(|p| p.facts().allows_lambda()) {
            let plain = ReplayConfig { warmup: 3, ..ReplayConfig::new(policy, shape.top_k + 1) };
            let p = cachesim::replay(&view, &keep, &plain).expect("valid");
            let all_boosted = ReplayConfig { lambda, j: shape.candidates, ..plain.clone() };
            prop_assert_eq!(&cachesim::replay(&view, &keep, &all_boosted).expect("valid"), &p);
            let k1 = ReplayConfig { k_used: Some(1), ..plain.clone() };
            let k1_routed = ReplayConfig { lambda, j: 0, ..k1.clone() };
            prop_assert_eq!(
                cachesim::replay(&view, &keep, &k1_routed).expect("valid"),
                cachesim::replay(&view, &keep, &k1).expect("valid")
            );
        }
    }
}
