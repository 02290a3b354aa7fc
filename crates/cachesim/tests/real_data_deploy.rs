//! Deployed replay (SEMANTICS.md §9–§11) on the real traces: the ESFT translation domain (per
//! token, pins, tier 2, re-batching) and the Qwen1.5-MoE vLLM trace (served steps), fast against
//! the plain reference. Set `MOE_OFFLOAD_REAL_DATA`; without it these tests show as ignored.

mod common;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::{Keep, Policy, ReplayConfig, reference};
use common::{real_qwen as qwen, real_translation as translation, top_frequency};

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn esft_translation_deployments_fast_equal_reference() {
    let trace = translation();
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pins = Keep::from_layers(&shape, &top_frequency(&trace, 8)).expect("pins");
    let t2 = |policy| Some(Tier2 { policy, cap: 32 });
    let cases: Vec<(ReplayConfig, Deployment)> = vec![
        (ReplayConfig::new(Policy::Lru, 0), Deployment { pins: Some(pins.clone()), ..Default::default() }),
        (ReplayConfig::new(Policy::Lru, 8), Deployment { pins: Some(pins.clone()), ..Default::default() }),
        (ReplayConfig::new(Policy::InvRouter, 8), Deployment { pins: Some(pins.clone()), ..Default::default() }),
        (ReplayConfig::new(Policy::Belady, 8), Deployment { pins: Some(pins.clone()), ..Default::default() }),
        (ReplayConfig::new(Policy::Lru, 8), Deployment { tier2: t2(Policy::Lru), ..Default::default() }),
        (ReplayConfig::new(Policy::NearPickEma, 8), Deployment { tier2: t2(Policy::Belady), ..Default::default() }),
        (ReplayConfig::new(Policy::Lru, 16), Deployment { schedule: Schedule::Rebatch(8), ..Default::default() }),
        (ReplayConfig::new(Policy::Lfu, 16), Deployment { schedule: Schedule::Rebatch(32), ..Default::default() }),
    ];
    for (cfg, dep) in &cases {
        let fast = cachesim::deploy::replay(&view, &keep, cfg, dep).expect("valid");
        let slow = reference::deploy::replay(&view, &keep, cfg, dep).expect("valid");
        assert_eq!(fast, slow, "{cfg:?} {dep:?}");
        println!(
            "{} cap {} {:?}: misses/token {:.4}",
            cfg.policy,
            cfg.cap,
            dep.schedule,
            fast.counts.misses_per_token()
        );
    }
    // The one-pass curve of the unpinned stream equals the deployed replay with the pins.
    let curve = cachesim::mrc::lru_curve_pinned(&view, &keep, Some(&pins), &Default::default()).expect("valid");
    for cap in [6, 8, 16, 40] {
        let dep = Deployment { pins: Some(pins.clone()), ..Default::default() };
        let c = cachesim::deploy::replay(&view, &keep, &ReplayConfig::new(Policy::Lru, cap), &dep).expect("valid");
        assert_eq!(curve.total_misses(cap), c.counts.misses, "cap {cap}");
    }
    // B = 1 re-batching is the plain replay.
    let cfg = ReplayConfig::new(Policy::Lru, 16);
    let b1 = cachesim::deploy::replay(
        &view,
        &keep,
        &cfg,
        &Deployment { schedule: Schedule::Rebatch(1), ..Default::default() },
    )
    .expect("valid");
    assert_eq!(b1.counts, cachesim::replay(&view, &keep, &cfg).expect("valid"));
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn qwen_served_fast_equals_reference() {
    let trace = qwen();
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let served = Deployment { schedule: Schedule::Served, ..Default::default() };
    for policy in Policy::ALL {
        for cap in [8, 30] {
            let cfg = ReplayConfig::new(policy, cap);
            let fast = cachesim::deploy::replay(&view, &keep, &cfg, &served).expect("valid");
            let slow = reference::deploy::replay(&view, &keep, &cfg, &served).expect("valid");
            assert_eq!(fast, slow, "{cfg:?}");
            // 129 steps; step 0 (65 rows from token 0) is inside the warmup of 64.
            assert_eq!((fast.steps, fast.rows), (128, shape.tokens as u64 - 65));
        }
    }
    let pins = Keep::from_layers(&shape, &top_frequency(&trace, 8)).expect("pins");
    let dep = Deployment {
        pins: Some(pins),
        tier2: Some(Tier2 { policy: Policy::Lru, cap: 30 }),
        schedule: Schedule::Served,
    };
    let cfg = ReplayConfig::new(Policy::Lru, 8);
    let fast = cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect("valid");
    assert_eq!(fast, reference::deploy::replay(&view, &keep, &cfg, &dep).expect("valid"));
    assert!(fast.pinned_hits > 0 && fast.t2_hits > 0);
}
