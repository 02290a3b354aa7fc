//! `plan --exec host` (SEMANTICS.md §14): the per-layer curves equal cachesim's replay; the plan
//! chooses on the in-sample trace and reports the held-out trace's figure of that choice; it stops
//! pinning where extra GPU experts buy no tok/s under `concurrent`, while it follows the misses
//! under `sequential`.

mod common;

use cachesim::deploy::{Deployment, Schedule};
use cachesim::hybrid::{Exec, HybridDevice, Overlap};
use cachesim::{Keep, Policy, ReplayConfig};
use sweep::plan::hybrid::{Granularity, HybridPlanRequest, layer_curves, pin_order, plan_hybrid};

fn device(overlap: Overlap) -> HybridDevice {
    // g = 10 ms / 2 layers = 5 ms; one host run 2 MB / 4 GB/s = 0.5 ms; sync 0.2 ms.
    HybridDevice {
        expert_mb: 2.0,
        compute_ms: 10.0,
        compute_ms_per_step: None,
        host_gbps: 4.0,
        host_ms_per_row: 0.1,
        host_sync_ms: 0.2,
        link_gbps: None,
        overlap,
    }
}

#[test]
fn the_curves_equal_cachesims_replay_for_every_pin_count() {
    let (a, b) = common::traces(2);
    let (va, vb) = (a.view(), b.view());
    let order = pin_order(&va, 2);
    for overlap in Overlap::ALL {
        let dev = device(overlap);
        let curves = layer_curves(&vb, &order, &dev, 2, 8);
        for n in [0, 1, 3, 8, 16] {
            let shape = vb.shape();
            let pins = Keep::from_layers(&shape, &order.iter().map(|o| o[..n].to_vec()).collect::<Vec<_>>()).unwrap();
            let dep = Deployment { pins: Some(pins), tier2: None, schedule: Schedule::PerToken };
            let cfg = ReplayConfig { warmup: 8, ..ReplayConfig::new(Policy::Lru, 0) };
            let (_, ev) = cachesim::hybrid::replay_hybrid(&vb, &Keep::full(&shape), &cfg, &dep, Exec::Host).unwrap();
            let want = ev.cost(&dev).unwrap().tok_s;
            let got = curves.tok_s(&[n, n]);
            assert!((got - want).abs() < 1e-9 * want, "{overlap} n = {n}: {got} != {want}");
        }
    }
}

#[test]
fn concurrent_stops_pinning_where_the_host_part_drops_below_the_gpu_part() {
    // top-2 of 16 experts per layer: with m host runs h = 0.5 m + 0.2 ms against g = 5 ms, so
    // under concurrent every step already has h <= g (at most 1.2 ms): no pin buys time and the
    // plan pins nothing, whatever the budget. Under sequential every pin that removes a host run
    // buys time: the plan fills the budget with the most frequent experts.
    let (a, b) = common::traces(2);
    let (va, vb) = (a.view(), b.view());
    let req = |overlap, budget| HybridPlanRequest {
        in_sample: &va,
        out_of_sample: &vb,
        device: device(overlap),
        gpu_budget_gb: budget,
        kv_gb: 0.004,
        k_used: 2,
        warmup: 8,
        granularity: Granularity::Expert,
    };
    let c = plan_hybrid(&req(Overlap::Concurrent, 1.0)).unwrap();
    assert_eq!(c.counts, [0, 0]);
    assert_eq!(c.tok_s, c.baseline_tok_s);
    // 0.004 GB of KV + 8 experts of 2 MB = 0.02 GB: 8 pins in all, spread by the misses they save.
    let s = plan_hybrid(&req(Overlap::Sequential, 0.02)).unwrap();
    assert_eq!(s.counts.iter().sum::<usize>(), 8, "{:?}", s.counts);
    assert!(s.tok_s > s.baseline_tok_s);
    assert!((s.gpu_gb - 0.02).abs() < 1e-12);
    // The choice is the best of every split of 8 pins on the in-sample trace, and its reported
    // figure is the held-out trace's for that choice.
    let order = pin_order(&va, 2);
    let dev = device(Overlap::Sequential);
    let (inside, held_out) = (layer_curves(&va, &order, &dev, 2, 8), layer_curves(&vb, &order, &dev, 2, 8));
    for n0 in 0..=8 {
        let t = inside.tok_s(&[n0, 8 - n0]);
        assert!(t <= s.in_sample_tok_s * (1.0 + 1e-12), "{n0} + {}: {t} > {}", 8 - n0, s.in_sample_tok_s);
    }
    assert_eq!(s.in_sample_tok_s, inside.tok_s(&s.counts));
    assert_eq!(s.tok_s, held_out.tok_s(&s.counts));
    assert_eq!(s.baseline_tok_s, held_out.tok_s(&[0, 0]));
    // The whole model fits: sequential pins every expert the in-sample trace picks (each removes
    // host runs) and stops there; one pin fewer in any layer costs in-sample tok/s.
    let all = plan_hybrid(&req(Overlap::Sequential, 1.0)).unwrap();
    assert_eq!(all.in_sample_tok_s, inside.tok_s(&[16, 16]));
    for l in 0..2 {
        let mut fewer = all.counts.clone();
        fewer[l] -= 1;
        assert!(inside.tok_s(&fewer) < all.in_sample_tok_s, "layer {l}: {:?}", all.counts);
        // and the unpinned experts are never picked in sample: pinning them buys nothing there
        let picked: std::collections::BTreeSet<u16> =
            va.layer_ids(l).chunks(4).skip(8).flat_map(|r| r[..2].to_vec()).collect();
        assert!(order[l][all.counts[l]..].iter().all(|e| !picked.contains(e)), "layer {l}");
    }
}

#[test]
fn a_compute_bound_gpu_part_makes_concurrent_stop_part_way() {
    // Host runs of 3 ms (host_ms_per_row 3 ms > 0.5 ms of memory): with m runs h = 3 m + 0.2 ms against g = 5 ms, so a step needs m <= 1 to be GPU bound. Pins help until
    // most steps have at most one host run, then stop: fewer pins than sequential at a large budget.
    let (a, b) = common::traces(2);
    let (va, vb) = (a.view(), b.view());
    let mut dev = device(Overlap::Concurrent);
    dev.host_ms_per_row = 3.0;
    let mk = |dev: HybridDevice| HybridPlanRequest {
        in_sample: &va,
        out_of_sample: &vb,
        device: dev,
        gpu_budget_gb: 1.0,
        kv_gb: 0.0,
        k_used: 2,
        warmup: 8,
        granularity: Granularity::Expert,
    };
    let c = plan_hybrid(&mk(dev)).unwrap();
    let s = plan_hybrid(&mk(HybridDevice { overlap: Overlap::Sequential, ..dev })).unwrap();
    assert!(c.counts.iter().sum::<usize>() < s.counts.iter().sum::<usize>(), "{:?} {:?}", c.counts, s.counts);
    // every further expert in any layer buys nothing in sample: one more pin leaves tok/s unchanged
    let order = pin_order(&va, 2);
    let curves = layer_curves(&va, &order, &dev, 2, 8);
    for l in 0..2 {
        let mut more = c.counts.clone();
        if more[l] < 16 {
            more[l] += 1;
            assert_eq!(curves.tok_s(&more), c.in_sample_tok_s, "layer {l}: {:?}", c.counts);
        }
    }
    assert_eq!(c.in_sample_tok_s, curves.tok_s(&[16, 16]));
    // per layer: each layer all or nothing
    let per_layer = plan_hybrid(&HybridPlanRequest { granularity: Granularity::Layer, ..mk(dev) }).unwrap();
    assert!(per_layer.counts.iter().all(|&n| n == 0 || n == 16), "{:?}", per_layer.counts);
}
