//! The experimental policy `lfu_fifo` (the `experimental-policy` feature, src/policy/lfu_fifo.rs):
//! a policy added as one file and one table line reaches every path. A hand-computed case on
//! both replayers, then plain, prefetch, deployed (pins, tier 2, served and re-batched steps) and
//! hybrid replay, each fast against its reference and each different from every other policy's
//! counts on some configuration, so that no path replays it silently as another policy. (The
//! differential matrices of the other test files run it too: they iterate `Policy::ALL`.)
//!
//! Run with `cargo test -p cachesim --features experimental-policy` (CI does).

#![cfg(feature = "experimental-policy")]

mod common;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::hybrid::{Exec, HybridDevice, Overlap, replay_hybrid};
use cachesim::{Keep, Policy, Predictor, Prefetch, PrefetchOptions, ReplayConfig, reference};
use common::{DEPLOY_SMALL, cfg0, one_layer, random_steps, synth, with_steps};

const EXP: Policy = Policy::LfuFifo;

#[test]
fn the_table_line_gives_name_facts_and_parsing() {
    assert_eq!(Policy::ALL.last(), Some(&EXP));
    assert_eq!(EXP.as_str(), "lfu_fifo");
    assert_eq!("lfu_fifo".parse::<Policy>(), Ok(EXP));
    assert_eq!(serde_json::to_string(&EXP).expect("serializes"), "\"lfu_fifo\"");
    let f = EXP.facts();
    assert!(f.allows_lambda() && f.allows_prefetch() && f.may_be_tier2() && !f.needs_scores());
    assert_eq!("lfu_fifo:8".parse::<Tier2>(), Ok(Tier2 { policy: EXP, cap: 8 }));
}

/// One layer, k = 1, m = 1, cap 2, no warmup; the misses of lfu_fifo and of the policies it
/// could be mistaken for, derived by hand.
///
/// A B B A C B: at C the cache holds A (2 accesses, inserted at 0) and B (2, inserted at 1).
/// lfu_fifo and fifo evict A (earlier insertion), so B hits: 3 misses; lfu and lru evict B
/// (A was accessed last), so B misses again: 4.
/// A A B C A: at C the cache holds A (2, inserted 0, last access 1) and B (1, inserted 2, last
/// access 2). lfu_fifo and lfu evict B (fewer accesses), so A hits: 3 misses; fifo and lru
/// evict A: 4.
#[test]
fn hand_computed_misses() {
    const A: u16 = 0;
    const B: u16 = 1;
    const C: u16 = 2;
    type Case = (&'static [u16], [(Policy, u64); 4]);
    let cases: [Case; 2] = [
        (&[A, B, B, A, C, B], [(EXP, 3), (Policy::Fifo, 3), (Policy::Lfu, 4), (Policy::Lru, 4)]),
        (&[A, A, B, C, A], [(EXP, 3), (Policy::Lfu, 3), (Policy::Fifo, 4), (Policy::Lru, 4)]),
    ];
    for (seq, expect) in cases {
        let rows: Vec<&[u16]> = seq.iter().map(std::slice::from_ref).collect();
        let trace = one_layer(4, 1, &rows, None);
        let view = trace.view();
        let keep = Keep::full(&view.shape());
        for (policy, misses) in expect {
            let cfg = ReplayConfig { warmup: 0, ..cfg0(policy, 2) };
            let fast = cachesim::replay(&view, &keep, &cfg).expect("valid");
            assert_eq!(fast, reference::replay(&view, &keep, &cfg).expect("valid"), "{policy} on {seq:?}");
            assert_eq!(fast.misses, misses, "{policy} on {seq:?}");
            // Served per token and deployed without parts, the deployed path gives the same.
            let dep = cachesim::deploy::replay(&view, &keep, &cfg, &Deployment::default()).expect("valid");
            assert_eq!(dep.counts, fast, "{policy} deployed on {seq:?}");
        }
    }
}

/// Every path, fast against its reference (counts; the hybrid costs are compared in
/// tests/hybrid.rs); on each path lfu_fifo's counts differ from every other policy's on at least
/// one of the configurations both ran.
#[test]
fn every_path_replays_it_as_itself() {
    let trace = synth(21, DEPLOY_SMALL);
    let tokens = trace.view().shape().tokens;
    let trace = with_steps(trace, random_steps(21, tokens, 7));
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pins = Keep::from_layers(&shape, &[vec![0, 1], vec![2]]).expect("pins");
    let deployments = [
        Deployment::default(),
        Deployment { pins: Some(pins.clone()), ..Deployment::default() },
        Deployment { tier2: Some(Tier2 { policy: EXP, cap: 4 }), ..Deployment::default() },
        Deployment { schedule: Schedule::Served, ..Deployment::default() },
        Deployment { pins: Some(pins), schedule: Schedule::Rebatch(4), ..Deployment::default() },
    ];
    let device = HybridDevice {
        expert_mb: 10.0,
        compute_ms: 1.0,
        compute_ms_per_step: None,
        host_gbps: 10.0,
        host_ms_per_row: 0.2,
        host_sync_ms: 0.05,
        link_gbps: Some(10.0),
        overlap: Overlap::ALL[0],
    };
    // Per policy, every figure of every path, in one list.
    let figures = |policy: Policy| -> [Vec<String>; 4] {
        let mut out: [Vec<String>; 4] = Default::default();
        for (cap, lambda) in [(3, 0.0), (5, 0.0), (4, 0.1)] {
            if lambda > 0.0 && !policy.facts().allows_lambda() {
                continue;
            }
            let cfg = ReplayConfig { lambda, warmup: 5, ..ReplayConfig::new(policy, cap) };
            let plain = cachesim::replay(&view, &keep, &cfg).expect("valid");
            assert_eq!(plain, reference::replay(&view, &keep, &cfg).expect("valid"), "plain {cfg:?}");
            out[0].push(format!("{plain:?}"));
            if policy.facts().allows_prefetch() {
                for predictor in
                    Predictor::ALL.into_iter().filter(|p| !p.facts().needs_calibration && !p.facts().needs_lookahead)
                {
                    let opts = PrefetchOptions {
                        prefetch: Some(Prefetch { predictor, budget: 2 }),
                        coact: None,
                        timeline: None,
                    };
                    let fast = cachesim::replay_prefetch(&view, &keep, &cfg, &opts).expect("valid");
                    let slow = reference::prefetch::replay(&view, &keep, &cfg, &opts).expect("valid");
                    assert_eq!(fast, slow, "prefetch {predictor} {cfg:?}");
                    out[1].push(format!("{fast:?}"));
                }
            }
            for dep in &deployments {
                let fast = cachesim::deploy::replay(&view, &keep, &cfg, dep).expect("valid");
                assert_eq!(fast, reference::deploy::replay(&view, &keep, &cfg, dep).expect("valid"), "{dep:?}");
                out[2].push(format!("{fast:?}"));
                if dep.tier2.is_some() {
                    continue; // §14 refuses tier 2 with host execution.
                }
                let (counts, _) = replay_hybrid(&view, &keep, &cfg, dep, Exec::Host).expect("valid");
                let (ref_counts, _) =
                    reference::hybrid::replay(&view, &keep, &cfg, dep, Exec::Host, &device).expect("valid");
                assert_eq!(counts, ref_counts, "hybrid {dep:?} {cfg:?}");
                out[3].push(format!("{counts:?}"));
            }
        }
        out
    };
    let ours = figures(EXP);
    assert!(ours.iter().all(|path| !path.is_empty()), "every path ran");
    for other in Policy::ALL.into_iter().filter(|&p| p != EXP) {
        let theirs = figures(other);
        for (path, name) in ["plain", "prefetch", "deploy", "hybrid"].into_iter().enumerate() {
            // An offline policy skips λ > 0 (the last configuration) and prefetch: compare the
            // configurations it ran, the first ones of ours.
            let n = theirs[path].len();
            if n > 0 {
                assert_ne!(theirs[path], ours[path][..n], "{name}: lfu_fifo replays as {other}");
            }
        }
    }
}
