//! Properties over random statistics: keep maps of one metric nest across K (SEMANTICS.md §3);
//! budget maps spend exactly their total, respect the floor, equal the uniform map layer by layer
//! at each layer's K, and nest across totals.

use proptest::prelude::*;
use saliency::{Budget, BudgetScale, KeepConfig, KeepMap, LayerStats, Metric, Stats, StatsMeta, check_keep_maps};

/// Random consistent statistics: per expert a count (often 0, small values to force ties) and,
/// for c > 0, per-slot values x = g·‖o‖ in a few discrete levels, from which every sum follows.
fn arb_stats() -> impl Strategy<Value = Stats> {
    (2usize..12, 1usize..4).prop_flat_map(|(e, layers)| {
        let expert = (0u64..5, proptest::collection::vec(0u8..4, 0..6), 0u8..4, 0u8..4);
        proptest::collection::vec(proptest::collection::vec(expert, e), layers).prop_map(move |ls| {
            let layers: Vec<LayerStats> = ls
                .into_iter()
                .map(|experts| {
                    let mut l = LayerStats {
                        tokens: 0,
                        count: vec![],
                        gate_sum: Some(vec![]),
                        ean_sum: Some(vec![]),
                        reap_sum: Some(vec![]),
                        reap_sumsq: Some(vec![]),
                        reap_missing: vec![],
                    };
                    for (c, xs, g, o) in experts {
                        let c = if c == 0 { 0 } else { c + xs.len() as u64 };
                        let (mut s, mut sq) = (0.0, 0.0);
                        if c > 0 {
                            for i in 0..c as usize {
                                let x = f64::from(*xs.get(i).unwrap_or(&1)) * 0.5;
                                s += x;
                                sq += x * x;
                            }
                        }
                        let on = |v: f64| if c > 0 { v } else { 0.0 };
                        l.count.push(c);
                        l.gate_sum.as_mut().unwrap().push(on(f64::from(g) * c as f64 * 0.25));
                        l.ean_sum.as_mut().unwrap().push(on(f64::from(o) * c as f64));
                        l.reap_sum.as_mut().unwrap().push(s);
                        l.reap_sumsq.as_mut().unwrap().push(sq);
                    }
                    l.tokens = l.count.iter().sum();
                    l
                })
                .collect();
            Stats {
                meta: StatsMeta {
                    model: "prop".into(),
                    num_experts: e as u32,
                    top_k: 1,
                    layer_ids: (0..layers.len() as u32).map(|i| i * 2 + 1).collect(),
                    source: String::new(),
                    source_digest: String::new(),
                },
                layers,
            }
        })
    })
}

proptest! {
    #[test]
    fn maps_nest_across_k(stats in arb_stats(), k1 in 1usize..12, k2 in 1usize..12) {
        let e = stats.meta.num_experts as usize;
        let (k1, k2) = (k1.min(k2).min(e), k1.max(k2).min(e));
        let cfg = KeepConfig { allow_short_layers: true, ..KeepConfig::default() };
        for metric in Metric::ALL {
            let a = KeepMap::build(&stats, metric, k1, &cfg).unwrap();
            let b = KeepMap::build(&stats, metric, k2, &cfg).unwrap();
            for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
                prop_assert!(x.iter().all(|id| y.contains(id)), "{metric} layer {l}: {x:?} not within {y:?}");
                prop_assert!(x.iter().all(|&id| stats.layers[l].count[usize::from(id)] > 0));
                let usable = stats.layers[l].count.iter().filter(|&&c| c > 0).count();
                prop_assert_eq!(x.len(), k1.min(usable));
            }
            let checks = check_keep_maps(&stats, &[a, b], &cfg);
            prop_assert!(checks.iter().all(|c| c.passed), "{:#?}", checks);
        }
    }
}

proptest! {
    #[test]
    fn budget_maps_spend_the_total_respect_the_floor_and_nest(
        stats in arb_stats(),
        floor in 1u32..3,
        t1 in 0usize..40,
        t2 in 0usize..40,
    ) {
        let cfg = KeepConfig { allow_short_layers: true, ..KeepConfig::default() };
        let usable: Vec<usize> =
            stats.layers.iter().map(|l| l.count.iter().filter(|&&c| c > 0).count()).collect();
        let base: usize = usable.iter().map(|&u| u.min(floor as usize)).sum();
        let room: usize = usable.iter().sum::<usize>() - base;
        // two totals in [base, base + room]
        let (lo, hi) = (base + t1.min(t2) % (room + 1), base + t1.max(t2) % (room + 1));
        let (lo, hi) = (lo.min(hi).max(1), lo.max(hi).max(1));
        prop_assume!(base + room >= 1, "no expert has calibration hits");
        for metric in Metric::ALL {
            for scale in BudgetScale::ALL {
                let b = |total: usize| Budget { total: total as u64, floor, scale };
                let small = KeepMap::build_budget(&stats, metric, &b(lo), &cfg).unwrap();
                let big = KeepMap::build_budget(&stats, metric, &b(hi), &cfg).unwrap();
                for m in [&small, &big] {
                    m.validate().unwrap();
                    prop_assert_eq!(m.total_kept() as u64, m.budget.unwrap().total);
                    for (l, ids) in m.layers.iter().enumerate() {
                        prop_assert!(ids.len() >= usable[l].min(floor as usize), "floor broken in layer {}", l);
                        prop_assert!(ids.iter().all(|&x| stats.layers[l].count[usize::from(x)] > 0));
                        // each layer is the uniform map's layer at that layer's K
                        let k = ids.len().max(1);
                        let u = KeepMap::build(&stats, metric, k, &cfg).unwrap();
                        prop_assert_eq!(&u.layers[l], ids, "{} {} layer {}", metric, scale, l);
                    }
                }
                for (l, (x, y)) in small.layers.iter().zip(&big.layers).enumerate() {
                    prop_assert!(x.iter().all(|id| y.contains(id)), "{metric} {scale} layer {l}: {x:?} not within {y:?}");
                }
                let checks = check_keep_maps(&stats, &[small, big], &cfg);
                prop_assert!(checks.iter().all(|c| c.passed), "{:#?}", checks);
            }
        }
    }
}
