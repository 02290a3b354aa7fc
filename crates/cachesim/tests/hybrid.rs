//! Hybrid execution (SEMANTICS.md §14): hand-computed cases for each cost term, properties of
//! the counts, and the fast replay against the plain reference (`reference::hybrid`) over every
//! policy × exec × overlap × schedule × pins on seeded random traces.

mod common;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::hybrid::{Exec, HybridCost, HybridCounts, HybridDevice, Overlap, replay_hybrid};
use cachesim::{CacheSimError, Keep, Policy, ReplayConfig, reference};
use common::{DEPLOY_SMALL as SMALL, Synth, one_layer, random_keep, random_steps, synth, with_steps};
use trace_io::TraceView;

/// A device: 10 MB experts, 1 ms dense compute per row, host 10 GB/s (a host run reads for at
/// least 1 ms), no per-row host compute, no sync, a 10 GB/s link (τ = 1 ms).
fn dev(overlap: Overlap) -> HybridDevice {
    HybridDevice {
        expert_mb: 10.0,
        compute_ms: 1.0,
        compute_ms_per_step: None,
        host_gbps: 10.0,
        host_ms_per_row: 0.0,
        host_sync_ms: 0.0,
        link_gbps: Some(10.0),
        overlap,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs()).max(1e-300)
}

fn costs_close(a: &HybridCost, b: &HybridCost) -> bool {
    close(a.tok_s, b.tok_s)
        && close(a.host_s_per_row, b.host_s_per_row)
        && close(a.gpu_s_per_row, b.gpu_s_per_row)
        && close(a.link_s_per_row, b.link_s_per_row)
        && close(a.total_s, b.total_s)
}

/// The fast replay and the reference, asserted equal (counts exactly, costs to 1e-12); also
/// asserts the counts are the deployed replay's.
fn both(
    view: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    exec: Exec,
    device: &HybridDevice,
) -> (HybridCounts, HybridCost) {
    let (counts, events) = replay_hybrid(view, keep, cfg, dep, exec).expect("valid hybrid replay");
    let cost = events.cost(device).expect("a device that prices it");
    let (ref_counts, ref_cost) = reference::hybrid::replay(view, keep, cfg, dep, exec, device).expect("valid");
    assert_eq!(counts, ref_counts, "counts: {cfg:?} {dep:?} {exec}");
    assert!(costs_close(&cost, &ref_cost), "cost: {cost:?} vs reference {ref_cost:?} for {cfg:?} {dep:?} {exec}");
    let deployed = cachesim::deploy::replay(view, keep, cfg, dep).expect("valid");
    assert_eq!(counts.deploy, deployed, "§14: the counts are those of §5/§9/§11");
    let c = &counts.deploy.counts;
    assert_eq!(c.misses, counts.host_runs + counts.loads + c.forced_misses, "misses split");
    (counts, cost)
}

fn cfg0(policy: Policy, cap: usize) -> ReplayConfig {
    ReplayConfig { warmup: 0, ..ReplayConfig::new(policy, cap) }
}

/// One hand-computed case: a one-layer, k = 1 trace (`rows`, E = 4, optional step offsets),
/// a configuration, and the expected (host runs, loads, copies) and tok/s.
struct Case {
    name: &'static str,
    rows: &'static [&'static [u16]],
    steps: Option<&'static [u64]>,
    cap: usize,
    pins: &'static [u16],
    exec: Exec,
    device: HybridDevice,
    expect: (u64, u64, u64),
    tok_s: f64,
}

fn check(case: &Case) {
    let trace = one_layer(4, 1, case.rows, None);
    let trace = match case.steps {
        Some(s) => with_steps(trace, s.to_vec()),
        None => trace,
    };
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let pins = (!case.pins.is_empty()).then(|| Keep::from_layers(&view.shape(), &[case.pins.to_vec()]).expect("pins"));
    let schedule = if case.steps.is_some() { Schedule::Served } else { Schedule::PerToken };
    let dep = Deployment { pins, tier2: None, schedule };
    let (counts, cost) = both(&view, &keep, &cfg0(Policy::Lru, case.cap), &dep, case.exec, &case.device);
    assert_eq!((counts.host_runs, counts.loads, counts.copies), case.expect, "{}", case.name);
    assert!(
        (cost.tok_s - case.tok_s).abs() < 1e-9 * case.tok_s,
        "{}: tok/s {} != {}",
        case.name,
        cost.tok_s,
        case.tok_s
    );
}

#[test]
fn cost_terms_by_hand() {
    let d = dev(Overlap::Sequential);
    let conc = dev(Overlap::Concurrent);
    let per_row = |ms: f64, o: Overlap| HybridDevice { host_ms_per_row: ms, ..dev(o) };
    let cases = [
        // Per token, cap 0: every pick a host run. g = 1 ms, h = max(1 ms, 0) = 1 ms.
        // Sequential: 2 ms per token, 500 tok/s; concurrent: 1 ms, 1000 tok/s.
        Case {
            name: "all-CPU, memory bound, sequential",
            rows: &[&[0], &[1], &[2]],
            steps: None,
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: d,
            expect: (3, 0, 0),
            tok_s: 500.0,
        },
        Case {
            name: "all-CPU, memory bound, concurrent (max, not sum)",
            rows: &[&[0], &[1], &[2]],
            steps: None,
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: conc,
            expect: (3, 0, 0),
            tok_s: 1000.0,
        },
        // host_ms_per_row 2: the per-row bound (2 ms) beats the memory bound (1 ms).
        // Sequential 3 ms → 333.33 tok/s; concurrent 2 ms → 500 tok/s.
        Case {
            name: "per-row bound, sequential",
            rows: &[&[0], &[1], &[2]],
            steps: None,
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: per_row(2.0, Overlap::Sequential),
            expect: (3, 0, 0),
            tok_s: 1000.0 / 3.0,
        },
        Case {
            name: "per-row bound, concurrent",
            rows: &[&[0], &[1], &[2]],
            steps: None,
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: per_row(2.0, Overlap::Concurrent),
            expect: (3, 0, 0),
            tok_s: 500.0,
        },
        // Sync 0.5 ms per (step, layer) with a host run: 0 is pinned (no host run at tokens 0
        // and 2: 1 ms each), 1 and 2 run on the host (1 + 1 + 0.5 ms each): 7 ms for 4 tokens.
        Case {
            name: "sync only where a host run is",
            rows: &[&[0], &[1], &[0], &[2]],
            steps: None,
            cap: 0,
            pins: &[0],
            exec: Exec::Host,
            device: HybridDevice { host_sync_ms: 0.5, ..d },
            expect: (2, 0, 0),
            tok_s: 4.0 / 0.007,
        },
        // Served: step 0 = rows 0..3 (experts 0, 0, 1), step 1 = row 3 (expert 2); b = 0.8 ms.
        // Step 0: g = 3 ms (c_s = 1 ms · 3 rows), h = max(1, 2 · 0.8) + max(1, 0.8) = 2.6 ms;
        // step 1: g = 1, h = 1. Sequential: 5.6 + 2 = 7.6 ms for 4 rows.
        Case {
            name: "served, rows per host run",
            rows: &[&[0], &[0], &[1], &[2]],
            steps: Some(&[0, 3]),
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: per_row(0.8, Overlap::Sequential),
            expect: (3, 0, 0),
            tok_s: 4.0 / 0.0076,
        },
        // Concurrent: max(3, 2.6) + max(1, 1) = 4 ms.
        Case {
            name: "served, concurrent",
            rows: &[&[0], &[0], &[1], &[2]],
            steps: Some(&[0, 3]),
            cap: 0,
            pins: &[],
            exec: Exec::Host,
            device: per_row(0.8, Overlap::Concurrent),
            expect: (3, 0, 0),
            tok_s: 1000.0,
        },
        // host:2: step 0 has 3 rows, so experts 0 and 1 are loaded (g = 3 + 2 · 1 ms); step 1
        // (1 row) runs expert 2 on the host (g = 1, h = 1): 7 ms for 4 rows.
        Case {
            name: "host:R, a large step transfers",
            rows: &[&[0], &[0], &[1], &[2]],
            steps: Some(&[0, 3]),
            cap: 0,
            pins: &[],
            exec: Exec::HostBatch(2),
            device: d,
            expect: (1, 2, 0),
            tok_s: 4.0 / 0.007,
        },
        // A dynamic GPU cache (cap 2): requests 0 1 0 1 miss twice (host runs and copies), then
        // hit. A slow link (1 GB/s, τ = 10 ms) and a fast host (100 GB/s, a = 0.1 ms), compute
        // 0.1 ms: tokens 0 and 1 take max(0.2 ms, 10 ms) (the copy limits the step), tokens 2
        // and 3 take 0.1 ms: 20.2 ms for 4 tokens.
        Case {
            name: "copies limit a step",
            rows: &[&[0], &[1], &[0], &[1]],
            steps: None,
            cap: 2,
            pins: &[],
            exec: Exec::Host,
            device: HybridDevice { compute_ms: 0.1, host_gbps: 100.0, link_gbps: Some(1.0), ..d },
            expect: (2, 0, 2),
            tok_s: 4.0 / 0.0202,
        },
        // Transfer-free with a fixed step compute: compute_ms_per_step 5 replaces 1 ms · rows.
        Case {
            name: "compute_ms_per_step",
            rows: &[&[0], &[0], &[1], &[2]],
            steps: Some(&[0, 3]),
            cap: 0,
            pins: &[0, 1, 2],
            exec: Exec::Host,
            device: HybridDevice { compute_ms_per_step: Some(5.0), ..d },
            expect: (0, 0, 0),
            tok_s: 4.0 / 0.010,
        },
    ];
    for case in &cases {
        check(case);
    }
}

#[test]
fn warmup_steps_cost_nothing() {
    // Three tokens, warmup 1: only tokens 1 and 2 are priced (2 ms each, sequential).
    let trace = one_layer(4, 1, &[&[0], &[1], &[2]], None);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let cfg = ReplayConfig { warmup: 1, ..ReplayConfig::new(Policy::Lru, 0) };
    let (counts, cost) = both(&view, &keep, &cfg, &Deployment::default(), Exec::Host, &dev(Overlap::Sequential));
    assert_eq!((counts.host_runs, counts.deploy.rows), (2, 2));
    assert!(close(cost.tok_s, 500.0) && close(cost.total_s, 0.004));
    assert!(close(cost.host_s_per_row, 0.001) && close(cost.gpu_s_per_row, 0.001) && cost.link_s_per_row == 0.0);
}

#[test]
fn refusals_name_the_reason() {
    let trace = one_layer(4, 1, &[&[0], &[1]], None);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let t2 = Deployment { tier2: Some(Tier2 { policy: Policy::Lru, cap: 2 }), ..Deployment::default() };
    let err = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 1), &t2, Exec::Host).unwrap_err();
    assert!(matches!(err, CacheSimError::DeployUnsupported { what: "tier 2 with exec host", .. }), "{err}");
    // Tier 2 with transfer is today's deployment.
    assert!(replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 1), &t2, Exec::Transfer).is_ok());
    let err = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 1), &Deployment::default(), Exec::HostBatch(32));
    assert!(err.unwrap_err().to_string().contains("cap = 0"));
    // A device without a link, for a replay that copies: refused naming link_gbps.
    let (_, events) = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 1), &Deployment::default(), Exec::Host).unwrap();
    let no_link = HybridDevice { link_gbps: None, ..dev(Overlap::Sequential) };
    let err = events.cost(&no_link).unwrap_err();
    assert!(matches!(err, CacheSimError::InvalidParameter { name: "link_gbps", .. }), "{err}");
    // ...but the static all-CPU replay needs none.
    let (_, events) = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 0), &Deployment::default(), Exec::Host).unwrap();
    assert!(events.cost(&no_link).is_ok());
    for (field, d) in [
        ("host_gbps", HybridDevice { host_gbps: 0.0, ..no_link }),
        ("expert_mb", HybridDevice { expert_mb: f64::NAN, ..no_link }),
        ("host_sync_ms", HybridDevice { host_sync_ms: -1.0, ..no_link }),
        ("link_gbps", HybridDevice { link_gbps: Some(0.0), ..no_link }),
    ] {
        let err = events.cost(&d).unwrap_err();
        assert!(matches!(err, CacheSimError::InvalidParameter { name, .. } if name == field), "{field}: {err}");
    }
}

/// Every policy × λ × exec × overlap × schedule × pins × cap, fast against the reference, on a
/// pruned keep set (forced misses) with per-row host compute and sync (both bounds occur).
#[test]
fn hybrid_matrix_fast_equals_reference() {
    let mut runs = 0;
    let mut both_bounds = (false, false);
    for seed in [5, 6] {
        let trace = synth(seed, SMALL);
        let tokens = trace.view().shape().tokens;
        let trace = with_steps(trace, random_steps(seed, tokens, 9));
        let view = trace.view();
        let shape = view.shape();
        let keep_ids = random_keep(seed, 2, 12, 0.6, 5);
        let keep = Keep::from_layers(&shape, &keep_ids).expect("valid keep");
        let pin = Keep::from_layers(&shape, &[keep_ids[0][..2].to_vec(), keep_ids[1][..1].to_vec()]).expect("pins");
        for policy in Policy::ALL {
            let lambdas: &[f64] = if !policy.facts().allows_lambda() { &[0.0] } else { &[0.0, 0.09] };
            for &lambda in lambdas {
                for cap in [0, 3, 5] {
                    let cfg = ReplayConfig { lambda, warmup: 7, ..ReplayConfig::new(policy, cap) };
                    for exec in [Exec::Transfer, Exec::Host, Exec::HostBatch(3)] {
                        if matches!(exec, Exec::HostBatch(_)) && cap > 0 {
                            continue;
                        }
                        for schedule in [Schedule::PerToken, Schedule::Served, Schedule::Rebatch(4)] {
                            for pins in [None, Some(pin.clone())] {
                                for overlap in Overlap::ALL {
                                    let device =
                                        HybridDevice { host_ms_per_row: 0.6, host_sync_ms: 0.05, ..dev(overlap) };
                                    let dep = Deployment { pins: pins.clone(), tier2: None, schedule };
                                    let (counts, cost) = both(&view, &keep, &cfg, &dep, exec, &device);
                                    if exec == Exec::Host && schedule == Schedule::PerToken {
                                        // Per token n_e = 1: h = max(1, 0.6) ms = memory bound.
                                        both_bounds.0 |= counts.host_runs > 0;
                                    }
                                    if exec != Exec::Transfer && schedule != Schedule::PerToken {
                                        both_bounds.1 |= cost.host_s_per_row > 0.0;
                                    }
                                    runs += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(both_bounds.0 && both_bounds.1);
    assert!(runs > 1000, "{runs}");
}

/// With pins, cap 0 and exec host, per token, every pick that is not pinned or forced is a host
/// run; with a cache every miss that is not forced is a host run and a copy.
#[test]
fn host_runs_are_the_unpinned_unforced_picks() {
    for seed in 10..16 {
        let trace = synth(seed, SMALL);
        let view = trace.view();
        let shape = view.shape();
        let keep_ids = random_keep(seed, 2, 12, 0.7, 4);
        let keep = Keep::from_layers(&shape, &keep_ids).expect("keep");
        let n_pins = (seed as usize) % 4;
        let pin = Keep::from_layers(&shape, &[keep_ids[0][..n_pins].to_vec(), keep_ids[1][..1].to_vec()]).unwrap();
        let dep = Deployment { pins: Some(pin), ..Deployment::default() };
        let (c, _) = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 0), &dep, Exec::Host).unwrap();
        let d = &c.deploy;
        assert_eq!(c.host_runs, d.counts.picks - d.pinned_hits - d.counts.forced_misses, "seed {seed}");
        assert_eq!((c.loads, c.copies), (0, 0));
        let (c, _) = replay_hybrid(&view, &keep, &cfg0(Policy::Lfu, 4), &dep, Exec::Host).unwrap();
        let d = &c.deploy;
        assert_eq!(c.host_runs, d.counts.misses - d.counts.forced_misses);
        assert_eq!((c.copies, c.loads), (c.host_runs, 0));
        // host:1 per token transfers every non-resident pick: the transfer counts.
        let (c, _) = replay_hybrid(&view, &keep, &cfg0(Policy::Lru, 0), &dep, Exec::HostBatch(1)).unwrap();
        assert_eq!((c.host_runs, c.loads), (0, c.deploy.counts.misses - c.deploy.counts.forced_misses));
    }
}

/// Pinning more experts never lowers tok/s under concurrent overlap when every layer's host part
/// dominates, and under sequential always raises it while host runs remain (each host run costs).
#[test]
fn more_pins_never_cost_more() {
    let trace = synth(21, Synth { sequences: 1, ..SMALL });
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    for overlap in Overlap::ALL {
        let mut last = 0.0;
        for n in 0..=12usize {
            let pins: Vec<Vec<u16>> = (0..2).map(|_| (0..n as u16).collect()).collect();
            let dep = Deployment { pins: Some(Keep::from_layers(&shape, &pins).unwrap()), ..Deployment::default() };
            let (_, cost) = both(&view, &keep, &cfg0(Policy::Lru, 0), &dep, Exec::Host, &dev(overlap));
            assert!(cost.tok_s >= last, "{overlap}: {n} pins gave {} < {last}", cost.tok_s);
            last = cost.tok_s;
        }
        // Everything pinned: dense compute only, 1 ms per token.
        assert!(close(last, 1000.0), "{last}");
    }
}
