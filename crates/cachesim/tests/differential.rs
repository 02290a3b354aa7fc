//! The fast replayer against the plain reference over a configuration matrix on seeded random
//! traces (SEMANTICS.md §8.4): counts must be identical.

mod common;

use cachesim::{Keep, Policy, ReplayConfig, ReplayCounts, Semantics, reference};
use common::{Synth, random_keep, synth};
use trace_io::TraceView;

const SMALL: Synth = Synth {
    layers: 2,
    tokens: 160,
    num_experts: 12,
    top_k: 3,
    candidates: 6,
    reuse: 0.5,
    sequences: 4,
    with_scores: true,
};

fn keeps(shape: &trace_io::Shape, seed: u64) -> Vec<(&'static str, Keep)> {
    let (l, e) = (shape.layers, shape.num_experts);
    vec![
        ("full", Keep::full(shape)),
        ("pruned", Keep::from_layers(shape, &random_keep(seed, l, e, 0.7, 6)).expect("valid keep")),
        // 4 of 12 experts: rows often have fewer than k kept candidates: forced misses.
        ("forcing", Keep::from_layers(shape, &random_keep(seed + 1, l, e, 0.25, 2)).expect("valid keep")),
    ]
}

/// Replays every configuration of `cfgs` alone (`replay`) and all together (`replay_many`:
/// shared scores, F tables) and asserts that both equal the reference; returns the reference's
/// counts in the order of `cfgs`. `what` names the case in a failure.
fn equal_alone_and_together(view: &TraceView<'_>, keep: &Keep, cfgs: &[ReplayConfig], what: &str) -> Vec<ReplayCounts> {
    let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().map(|c| (keep, c)).collect();
    let many = cachesim::replay_many(view, &runs, &|_| {}).expect("valid configs");
    let mut slow = Vec::with_capacity(cfgs.len());
    for (cfg, shared) in cfgs.iter().zip(&many) {
        let reference = reference::replay(view, keep, cfg).expect("valid config");
        let fast = cachesim::replay(view, keep, cfg).expect("valid config");
        assert_eq!(fast, reference, "{what}, {cfg:?}");
        assert_eq!(shared, &reference, "replay_many: {what}, {cfg:?}");
        slow.push(reference);
    }
    slow
}

fn run_matrix(trace: &trace_io::TraceData, seed: u64) -> usize {
    let view = trace.view();
    let shape = view.shape();
    let mut runs = 0;
    let mut forced_seen = false;
    let mut substituted_by_routing = false;
    for (keep_name, keep) in keeps(&shape, seed) {
        for k_used in [shape.top_k, shape.top_k - 1] {
            for policy in Policy::ALL {
                let lambdas: &[f64] = if !policy.facts().allows_lambda() { &[0.0] } else { &[0.0, 0.05, 0.12, 0.7] };
                for &lambda in lambdas {
                    let js: &[usize] = if lambda == 0.0 { &[2] } else { &[2, 3] };
                    for &j in js {
                        for cap in [k_used, k_used + 2, shape.num_experts] {
                            for semantics in [Semantics::KWay, Semantics::Sequential] {
                                for (warmup, reset) in [(0, false), (0, true), (17, false), (17, true)] {
                                    let cfg = ReplayConfig {
                                        k_used: Some(k_used),
                                        lambda,
                                        j,
                                        warmup,
                                        decay: 0.9,
                                        near_pick_n: 4,
                                        semantics,
                                        reset_at_sequence: reset,
                                        ..ReplayConfig::new(policy, cap)
                                    };
                                    let fast = cachesim::replay(&view, &keep, &cfg).expect("valid config");
                                    let slow = reference::replay(&view, &keep, &cfg).expect("valid config");
                                    assert_eq!(fast, slow, "seed {seed}, keep {keep_name}, {cfg:?}");
                                    assert_eq!(fast.hits + fast.misses, fast.picks);
                                    assert_eq!(fast.picks, fast.tokens * (k_used * shape.layers) as u64);
                                    assert_eq!(fast.layer_misses.iter().sum::<u64>(), fast.misses);
                                    assert!(fast.forced_misses <= fast.misses);
                                    forced_seen |= fast.forced_misses > 0;
                                    substituted_by_routing |= keep_name == "full" && fast.substituted > 0;
                                    runs += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(forced_seen, "the matrix must exercise forced misses");
    assert!(substituted_by_routing, "the matrix must exercise cache-aware substitutions");
    runs
}

#[test]
fn fast_equals_reference_on_random_traces() {
    let mut runs = 0;
    for seed in [1u64, 2] {
        runs += run_matrix(&synth(seed, SMALL), seed);
    }
    assert!(runs > 1000, "{runs}");
}

#[test]
fn fast_equals_reference_with_wide_rows_and_weak_locality() {
    let s = Synth { num_experts: 40, top_k: 4, candidates: 12, reuse: 0.2, sequences: 1, tokens: 160, ..SMALL };
    let trace = synth(7, s);
    let view = trace.view();
    let shape = view.shape();
    for (keep_name, keep) in keeps(&shape, 7) {
        for policy in Policy::ALL {
            for lambda in [0.0, 0.09, 0.3] {
                if !policy.facts().allows_lambda() && lambda > 0.0 {
                    continue;
                }
                for cap in [4, 9, 16, 40] {
                    for semantics in [Semantics::KWay, Semantics::Sequential] {
                        let cfg = ReplayConfig { lambda, semantics, warmup: 5, ..ReplayConfig::new(policy, cap) };
                        let fast = cachesim::replay(&view, &keep, &cfg).expect("valid config");
                        let slow = reference::replay(&view, &keep, &cfg).expect("valid config");
                        assert_eq!(fast, slow, "keep {keep_name}, {cfg:?}");
                    }
                }
            }
        }
    }
}

/// Many protected experts per token (k = 8) in small caches: exercises the victim search past
/// protected heap nodes and list entries.
#[test]
fn fast_equals_reference_with_many_protected_experts() {
    let s = Synth { num_experts: 24, top_k: 8, candidates: 12, reuse: 0.6, sequences: 3, tokens: 200, ..SMALL };
    for seed in [11u64, 12, 13] {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        for (keep_name, keep) in keeps(&shape, seed) {
            for policy in Policy::ALL {
                for lambda in [0.0, 0.12] {
                    if !policy.facts().allows_lambda() && lambda > 0.0 {
                        continue;
                    }
                    for cap in [8, 9, 12] {
                        for semantics in [Semantics::KWay, Semantics::Sequential] {
                            let cfg = ReplayConfig {
                                lambda,
                                semantics,
                                warmup: 10,
                                near_pick_n: 10,
                                reset_at_sequence: seed == 12,
                                ..ReplayConfig::new(policy, cap)
                            };
                            let fast = cachesim::replay(&view, &keep, &cfg).expect("valid config");
                            let slow = reference::replay(&view, &keep, &cfg).expect("valid config");
                            assert_eq!(fast, slow, "seed {seed}, keep {keep_name}, {cfg:?}");
                        }
                    }
                }
            }
        }
    }
}

/// The parallel replay gives the same counts whatever the thread count.
#[test]
fn thread_count_does_not_change_results() {
    let s = Synth { layers: 6, ..SMALL };
    let trace = synth(3, s);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let run = |threads: usize| -> Vec<ReplayCounts> {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
        pool.install(|| {
            Policy::ALL
                .iter()
                .map(|&p| cachesim::replay(&view, &keep, &ReplayConfig::new(p, 5)).expect("valid config"))
                .collect()
        })
    };
    assert_eq!(run(1), run(4));
}

/// Corner cases of the fast replayer's structures: decays that tie every score (d = 1: integer
/// counts), that underflow to 0 within a few tokens (ties broken by last access only), ordinary
/// decays; caps at k_used, one above, and E (no eviction); sequence resets; λ > 0 over the group
/// lists and the per-token victim scan, and λ = 1 (the bonus is δ itself, a multiple of the
/// scores' quantum, so boosted scores tie plain ones exactly, also at the cut where the fast
/// replayer stops reading F); full and pruned keep sets (F = the row, or built).
#[test]
fn fast_equals_reference_on_ties_underflow_and_edge_caps() {
    let s = Synth { num_experts: 16, top_k: 4, candidates: 8, reuse: 0.7, sequences: 3, tokens: 240, ..SMALL };
    for seed in [21u64, 22] {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        for (keep_name, keep) in keeps(&shape, seed) {
            for policy in Policy::ALL {
                for decay in [1.0, 0.5, 1e-200, 0.9] {
                    for lambda in [0.0, 0.12, 1.0] {
                        if !policy.facts().allows_lambda() && lambda > 0.0 {
                            continue;
                        }
                        for cap in [4, 5, 16] {
                            for semantics in [Semantics::KWay, Semantics::Sequential] {
                                for (reset, near_pick_n) in [(false, 2), (true, 5), (false, 8)] {
                                    let cfg = ReplayConfig {
                                        lambda,
                                        decay,
                                        semantics,
                                        warmup: 3,
                                        near_pick_n,
                                        reset_at_sequence: reset,
                                        ..ReplayConfig::new(policy, cap)
                                    };
                                    let fast = cachesim::replay(&view, &keep, &cfg).expect("valid config");
                                    let slow = reference::replay(&view, &keep, &cfg).expect("valid config");
                                    assert_eq!(fast, slow, "seed {seed}, keep {keep_name}, {cfg:?}");
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `replay_many` (configurations replayed layer by layer, one softmax table per layer shared by
/// the `inv_router` ones) gives each configuration the counts of `replay`, in order, with keep
/// maps interleaved, k_used below k, sequential semantics and sequence resets among them.
#[test]
fn replay_many_equals_replay() {
    let trace = synth(31, Synth { sequences: 3, ..SMALL });
    let view = trace.view();
    let shape = view.shape();
    let keeps = keeps(&shape, 31);
    let mut cfgs = Vec::new();
    for policy in Policy::ALL {
        for lambda in [0.0, 0.12, 0.7] {
            if !policy.facts().allows_lambda() && lambda > 0.0 {
                continue;
            }
            for (cap, k_used, semantics, reset) in
                [(3, None, Semantics::KWay, false), (5, Some(shape.top_k - 1), Semantics::Sequential, true)]
            {
                cfgs.push(ReplayConfig {
                    lambda,
                    j: 1,
                    warmup: 2,
                    k_used,
                    semantics,
                    reset_at_sequence: reset,
                    ..ReplayConfig::new(policy, cap)
                });
            }
        }
    }
    let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().flat_map(|c| keeps.iter().map(move |(_, k)| (k, c))).collect();
    assert!(runs.iter().filter(|(_, c)| c.policy == Policy::InvRouter).count() >= 2, "the softmax is shared");
    let steps = std::sync::atomic::AtomicUsize::new(0);
    let many = cachesim::replay_many(&view, &runs, &|tokens| {
        steps.fetch_add(tokens, std::sync::atomic::Ordering::Relaxed);
    })
    .expect("valid configs");
    assert_eq!(steps.into_inner(), runs.len() * shape.layers * shape.tokens);
    for ((keep, cfg), got) in runs.iter().zip(&many) {
        assert_eq!(got, &cachesim::replay(&view, keep, cfg).expect("valid config"), "{cfg:?}");
    }
    // A bad configuration is refused before any work.
    let bad = ReplayConfig { lambda: 0.1, ..ReplayConfig::new(Policy::Belady, 4) };
    assert!(cachesim::replay_many(&view, &[(&keeps[0].1, &bad)], &|_| {}).is_err());
}

/// Continuous router scores (the trace generator's logits, not quantized): the `exp` memo of
/// `inv_router` sees almost no repeats and turns itself off after its probe; counts still equal
/// the reference's, alone and through `replay_many`.
#[test]
fn inv_router_on_continuous_scores() {
    let cfg = trace_io::synth::SynthConfig {
        layers: 2,
        experts: 24,
        top_k: 3,
        candidates: 8,
        tokens: 9000,
        sequences: 3,
        ..Default::default()
    };
    let trace = trace_io::synth::generate(&cfg).expect("a valid synthetic trace");
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let cfgs: Vec<ReplayConfig> = [0.0, 0.12]
        .into_iter()
        .flat_map(|lambda| [4, 9].map(|cap| ReplayConfig { lambda, j: 1, ..ReplayConfig::new(Policy::InvRouter, cap) }))
        .collect();
    let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().map(|c| (&keep, c)).collect();
    let many = cachesim::replay_many(&view, &runs, &|_| {}).expect("valid configs");
    for (cfg, got) in cfgs.iter().zip(&many) {
        let slow = reference::replay(&view, &keep, cfg).expect("valid config");
        assert_eq!(cachesim::replay(&view, &keep, cfg).expect("valid config"), slow, "{cfg:?}");
        assert_eq!(got, &slow, "{cfg:?}");
    }
}

/// near_pick with its window N below k_used, and with λ > 0 choosing beyond it: chosen experts
/// outside F's first N keep their near value while their last access moves, so the order among
/// experts of equal near value changes mid-sequence (a design that keeps the cached experts
/// sorted by near value, tried in the sixth round of docs/performance.md at 29c2d74, failed only this test when
/// its reordering after such a hit was removed). Long traces, so that experts of one near value
/// meet again.
#[test]
fn near_pick_outside_its_window_equals_reference() {
    let s = Synth { num_experts: 16, top_k: 4, candidates: 8, reuse: 0.7, sequences: 2, tokens: 1500, ..SMALL };
    let mut substituted = 0;
    for seed in [41u64, 42, 43] {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        for (keep_name, keep) in keeps(&shape, seed).into_iter().take(2) {
            for near_pick_n in [1, 2, 3] {
                for lambda in [0.0, 0.12, 1.0] {
                    for cap in [4, 5, 7] {
                        for reset in [false, true] {
                            let cfg = ReplayConfig {
                                lambda,
                                warmup: 0,
                                near_pick_n,
                                reset_at_sequence: reset,
                                ..ReplayConfig::new(Policy::NearPick, cap)
                            };
                            let fast = cachesim::replay(&view, &keep, &cfg).expect("valid config");
                            let slow = reference::replay(&view, &keep, &cfg).expect("valid config");
                            assert_eq!(fast, slow, "seed {seed}, keep {keep_name}, {cfg:?}");
                            substituted += fast.substituted;
                        }
                    }
                }
            }
        }
    }
    assert!(substituted > 0, "λ > 0 chose beyond the row's first k_used");
}

/// near_pick_ema and inv_router with caps far above k_used (30 and 60 of 96 experts), the regime
/// of the study (cap 128 of 512, k = 10) where a victim search must look past dozens of cached
/// experts: decays that keep scores apart, that tie them (1.0, where near_pick_ema's credits are
/// integers) and that underflow; λ = 0 and λ > 0; alone (`replay`) and with shared scores
/// (`replay_many`). A victim search over a short candidate list with a score bound (tried in
/// the sixth round of docs/performance.md at 29c2d74) passed every other test with a wrong bound; this one
/// failed it.
#[test]
fn decayed_candidates_equal_reference() {
    let s = Synth { num_experts: 96, top_k: 4, candidates: 12, reuse: 0.6, sequences: 2, tokens: 700, ..SMALL };
    for seed in [51u64, 52] {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        for (keep_name, keep) in keeps(&shape, seed).into_iter().take(2) {
            let mut cfgs = Vec::new();
            for policy in [Policy::NearPickEma, Policy::InvRouter] {
                for decay in [0.99, 0.9, 1.0, 1e-200] {
                    for (lambda, j) in [(0.0, 0), (0.12, 2), (0.7, 3)] {
                        for cap in [30, 60] {
                            for reset in [false, true] {
                                cfgs.push(ReplayConfig {
                                    lambda,
                                    j,
                                    decay,
                                    warmup: 5,
                                    near_pick_n: 6,
                                    reset_at_sequence: reset,
                                    ..ReplayConfig::new(policy, cap)
                                });
                            }
                        }
                    }
                }
            }
            equal_alone_and_together(&view, &keep, &cfgs, &format!("seed {seed}, keep {keep_name}"));
        }
    }
}

/// The lazy decay of SEMANTICS.md §5 where it rescales and underflows: d close to 1 (M grows
/// slowly, scores of experts credited long ago stay close), 0.5 and 0.3 (M passes 1e100 every
/// 333 and 192 tokens: several rescales in 2,000 tokens), 0.01 (every 51), 1e-200 and 1e-300
/// (every token, the inverse near the top of f64's range), where the scores of experts not
/// credited for a few tokens underflow to 0 and tie (then last access decides). N = 1 and a
/// cap of 40 of 64 experts leave cached experts without credits for long runs. Alone and
/// together (one softmax table).
#[test]
fn lazy_decay_rescales_and_underflows_equal_reference() {
    let s = Synth { num_experts: 64, top_k: 4, candidates: 10, reuse: 0.8, sequences: 2, tokens: 2000, ..SMALL };
    let trace = synth(71, s);
    let view = trace.view();
    let shape = view.shape();
    for (keep_name, keep) in keeps(&shape, 71).into_iter().take(2) {
        let mut cfgs = Vec::new();
        for policy in [Policy::NearPickEma, Policy::InvRouter] {
            for decay in [1.0 - 1e-12, 0.999, 0.5, 0.3, 0.01, 1e-200, 1e-300] {
                for (near_pick_n, cap, lambda, reset) in [(1, 40, 0.0, false), (3, 8, 0.12, true), (10, 20, 0.0, true)]
                {
                    cfgs.push(ReplayConfig {
                        lambda,
                        decay,
                        near_pick_n,
                        warmup: 10,
                        reset_at_sequence: reset,
                        ..ReplayConfig::new(policy, cap)
                    });
                }
            }
        }
        let counts = equal_alone_and_together(&view, &keep, &cfgs, &format!("keep {keep_name}"));
        assert!(counts.iter().all(|c| c.hits > 0 && c.misses > 0));
    }
}

/// Every policy with caps of dozens to over a hundred experts (33, 70 and 140 of 160), each of
/// which evicts (it misses more than a cache of all 160 experts): the victim searches compare
/// the cached keys in vectors (32 at a time for near_pick and belady, chunks of 16 for
/// near_pick_ema and inv_router, whose chunk minimums span two vectors once more than 128 are
/// cached), with a partial last chunk at 33 and 70; alone (`replay`) and together
/// (`replay_many`: shared scores, F tables). The other tests keep caps small enough that these
/// paths ran only on the real traces: making the vector compare strict at the bound (two
/// mutations) or reading only the first vector of chunk minimums (one) passed every test without
/// `MOE_OFFLOAD_REAL_DATA`, and each fails this one.
#[test]
fn every_policy_with_large_caps_equals_reference() {
    let s = Synth { num_experts: 160, top_k: 6, candidates: 24, reuse: 0.6, sequences: 1, tokens: 900, ..SMALL };
    for seed in [61u64, 62] {
        let trace = synth(seed, s);
        let view = trace.view();
        let shape = view.shape();
        let pruned = Keep::from_layers(&shape, &random_keep(seed, shape.layers, shape.num_experts, 0.95, 145))
            .expect("valid keep");
        for (keep_name, keep) in [("full", Keep::full(&shape)), ("pruned", pruned)] {
            let mut cfgs = Vec::new();
            for policy in Policy::ALL {
                for (lambda, j) in [(0.0, 0), (0.12, 2)] {
                    if !policy.facts().allows_lambda() && lambda > 0.0 {
                        continue;
                    }
                    for cap in [33, 70, 140] {
                        for semantics in [Semantics::KWay, Semantics::Sequential] {
                            cfgs.push(ReplayConfig {
                                lambda,
                                j,
                                warmup: 5,
                                near_pick_n: 12,
                                semantics,
                                ..ReplayConfig::new(policy, cap)
                            });
                        }
                    }
                }
            }
            let slow = equal_alone_and_together(&view, &keep, &cfgs, &format!("seed {seed}, keep {keep_name}"));
            for (cfg, slow) in cfgs.iter().zip(&slow) {
                let all = ReplayConfig { cap: shape.num_experts, ..cfg.clone() };
                let unbounded = reference::replay(&view, &keep, &all).expect("valid config");
                assert!(slow.misses > unbounded.misses, "cap {} evicts: {cfg:?}", cfg.cap);
            }
        }
    }
}
