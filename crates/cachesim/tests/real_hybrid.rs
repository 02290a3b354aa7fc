//! Hybrid execution (SEMANTICS.md §14) on the real traces: the ESFT translation domain (per
//! token and re-batched) and the Qwen1.5-MoE vLLM trace (served steps), fast against the plain
//! reference, counts exactly and costs to 1e-12, and the all-CPU property on both. Set
//! `MOE_OFFLOAD_REAL_DATA`; without it these tests show as ignored.

mod common;

use cachesim::deploy::{Deployment, Schedule};
use cachesim::hybrid::{Exec, HybridDevice, Overlap, replay_hybrid};
use cachesim::{Keep, Policy, ReplayConfig, reference};
use common::{real_qwen as qwen, real_translation as translation};
use trace_io::TraceData;

/// The `n` most frequent experts of each layer as a pin map.
fn top_frequency(trace: &TraceData, n: usize) -> Keep {
    Keep::from_layers(&trace.view().shape(), &common::top_frequency(trace, n)).expect("pins")
}

/// dsv2-lite-bf16's expert (17.30 MB) and 20 ms per token, a CPU reaching 40 GB/s on experts
/// with 0.05 ms per row and 0.02 ms of sync per layer, a 25 GB/s link.
fn device(overlap: Overlap) -> HybridDevice {
    HybridDevice {
        expert_mb: 17.301504,
        compute_ms: 20.0,
        compute_ms_per_step: None,
        host_gbps: 40.0,
        host_ms_per_row: 0.05,
        host_sync_ms: 0.02,
        link_gbps: Some(25.0),
        overlap,
    }
}

fn check(trace: &TraceData, cases: &[(ReplayConfig, Deployment, Exec)]) {
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for (cfg, dep, exec) in cases {
        let (counts, events) = replay_hybrid(&view, &keep, cfg, dep, *exec).expect("valid");
        for overlap in Overlap::ALL {
            let dev = device(overlap);
            let cost = events.cost(&dev).expect("priced");
            let (ref_counts, ref_cost) = reference::hybrid::replay(&view, &keep, cfg, dep, *exec, &dev).expect("valid");
            assert_eq!(counts, ref_counts, "{cfg:?} {exec}");
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-12 * a.abs().max(b.abs());
            assert!(close(cost.tok_s, ref_cost.tok_s) && close(cost.host_s_per_row, ref_cost.host_s_per_row));
            assert!(close(cost.gpu_s_per_row, ref_cost.gpu_s_per_row) && close(cost.total_s, ref_cost.total_s));
            assert!(
                cost.link_s_per_row == ref_cost.link_s_per_row || close(cost.link_s_per_row, ref_cost.link_s_per_row)
            );
        }
    }
}

fn all_cpu_property(trace: &TraceData, schedule: Schedule) {
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for n in [0, 8, 16, 32] {
        let dep = Deployment { pins: Some(top_frequency(trace, n)), tier2: None, schedule };
        let (c, _) = replay_hybrid(&view, &keep, &ReplayConfig::new(Policy::Lru, 0), &dep, Exec::Host).unwrap();
        let d = &c.deploy;
        assert_eq!(c.host_runs, d.counts.misses - d.counts.forced_misses, "{n} pins");
        if schedule == Schedule::PerToken {
            assert_eq!(c.host_runs, d.counts.picks - d.pinned_hits - d.counts.forced_misses, "{n} pins");
        }
        assert_eq!((c.loads, c.copies), (0, 0));
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn esft_translation_hybrid_fast_equals_reference() {
    let trace = translation();
    let pins = |n| Some(top_frequency(&trace, n));
    let dep = |n, schedule| Deployment { pins: pins(n), tier2: None, schedule };
    let cases = vec![
        (ReplayConfig::new(Policy::Lru, 0), Deployment::default(), Exec::Host),
        (ReplayConfig::new(Policy::Lru, 0), dep(16, Schedule::PerToken), Exec::Host),
        (ReplayConfig::new(Policy::Lru, 8), dep(8, Schedule::PerToken), Exec::Host),
        (ReplayConfig::new(Policy::Lfu, 16), Deployment::default(), Exec::Host),
        (ReplayConfig::new(Policy::Lru, 0), dep(8, Schedule::Rebatch(8)), Exec::HostBatch(4)),
        (ReplayConfig::new(Policy::Lru, 8), dep(8, Schedule::Rebatch(8)), Exec::Host),
    ];
    check(&trace, &cases);
    all_cpu_property(&trace, Schedule::PerToken);
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn qwen_served_hybrid_fast_equals_reference() {
    let trace = qwen();
    let served = |n| Deployment { pins: Some(top_frequency(&trace, n)), tier2: None, schedule: Schedule::Served };
    let cases = vec![
        (ReplayConfig::new(Policy::Lru, 0), served(0), Exec::Host),
        (ReplayConfig::new(Policy::Lru, 0), served(12), Exec::HostBatch(32)),
        (ReplayConfig::new(Policy::Lru, 8), served(4), Exec::Host),
        (
            ReplayConfig::new(Policy::Lru, 0),
            Deployment { pins: Some(top_frequency(&trace, 8)), ..Default::default() },
            Exec::Host,
        ),
    ];
    check(&trace, &cases);
    all_cpu_property(&trace, Schedule::Served);
    all_cpu_property(&trace, Schedule::PerToken);
}
