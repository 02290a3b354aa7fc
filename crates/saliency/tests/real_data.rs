//! Tests on the real REAP aggregate file (`reap-agg-dsv4/core_agg.json`, 43 layers x 256 experts,
//! top-6) under `$MOE_OFFLOAD_REAL_DATA`. Ignored when the variable is unset.

use std::path::PathBuf;

use saliency::{
    Budget, KeepConfig, KeepMap, Metric, MetricConfig, NonFiniteReap, ReapAggOptions, SaliencyError, Stats,
    check_keep_maps, check_stats, metric_scores, retention,
};

/// The REAP aggregate file.
fn agg() -> PathBuf {
    real_data::dir().join("reap-agg-dsv4/core_agg.json")
}

const TOP_K: u32 = 6;

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn bible_statistics_load_and_counts_sum_to_six_per_token() {
    let path = agg();
    let corpora = Stats::reap_agg_corpora(&path).unwrap();
    assert_eq!(corpora, ["bible", "quran", "tao", "gita", "dhamma", "bofm", "analects", "upanishads"]);
    let bible = Stats::from_reap_agg(&path, "bible", TOP_K).unwrap();
    assert_eq!(bible.meta.num_experts, 256);
    assert_eq!(bible.meta.layer_ids, (0..43).collect::<Vec<u32>>());
    assert_eq!(bible.layers[0].tokens, 1_045_776);
    assert!(bible.layers[0].reap_sum.is_some());
    // README: "a layer sums to 6 x tok". Holds in every layer of every corpus.
    for corpus in &corpora {
        let s = Stats::from_reap_agg(&path, corpus, TOP_K).unwrap();
        let checks = check_stats(&s);
        assert!(checks.iter().all(|c| c.passed), "{corpus}: {checks:#?}");
        for l in &s.layers {
            assert_eq!(l.count.iter().sum::<u64>(), 6 * l.tokens, "{corpus}");
        }
    }
    // the file has no sum of squares: shrink is refused
    let err = metric_scores(&bible, Metric::Shrink, &MetricConfig::default()).unwrap_err();
    assert!(matches!(err, SaliencyError::MissingStatistic { statistic: "reap_sumsq", .. }), "{err}");
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn quran_and_bofm_reap_hold_nan() {
    let path = agg();
    // quran and bofm hold bare NaN in `reap` for experts with hits: by default the statistic is
    // dropped (counts stay), and the strict policy refuses the corpus.
    for (corpus, n) in [("quran", 335), ("bofm", 349)] {
        let s = Stats::from_reap_agg(&path, corpus, TOP_K).unwrap();
        assert!(s.layers.iter().all(|l| l.reap_sum.is_none()));
        assert!(s.meta.source.contains(&format!("reap_sum dropped: {n} non-finite")), "{}", s.meta.source);
        let strict = ReapAggOptions { top_k: TOP_K, non_finite_reap: NonFiniteReap::Reject };
        assert!(Stats::from_reap_agg_with(&path, corpus, &strict).is_err());
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn bible_keep_maps_build_nest_and_retain_out_of_sample() {
    let path = agg();
    let bible = Stats::from_reap_agg(&path, "bible", TOP_K).unwrap();
    // Some bible layers have experts with zero hits (at most 7 per layer), so 250+ would be short;
    // 128 and 160 are not.
    let cfg = KeepConfig::default();
    let mut maps = Vec::new();
    for metric in [Metric::Reap, Metric::L2Sum, Metric::Frequency, Metric::Hybrid] {
        for k in [128, 160] {
            let m = KeepMap::build(&bible, metric, k, &cfg).unwrap();
            assert!(m.short_layers.is_empty());
            maps.push(m);
        }
    }
    let checks = check_keep_maps(&bible, &maps, &cfg);
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
    for metric in ["reap", "l2_sum", "frequency", "hybrid"] {
        assert!(checks.iter().any(|c| c.name == format!("nesting: {metric}")));
    }

    // quran: counts only (its reap holds NaN) -> slot-based figures
    let quran = Stats::from_reap_agg(&path, "quran", TOP_K).unwrap();
    // tao, gita, analects...: clean reap sums -> REAP retention
    let gita = Stats::from_reap_agg(&path, "gita", TOP_K).unwrap();
    for m in &maps {
        let r = retention(m, &quran, None).unwrap();
        let slot_kept = 1.0 - r.mean.slot_replacement;
        assert!(slot_kept > 0.0 && slot_kept <= 1.0, "{}: {slot_kept}", m.label());
        assert!(r.min.slot_replacement >= 0.0 && r.max_slot_replacement < 1.0);
        assert_eq!(r.mean.reap_retention, None);
        let r = retention(m, &gita, None).unwrap();
        let (mean, min) = (r.mean.reap_retention.unwrap(), r.min.reap_retention.unwrap());
        assert!(min > 0.0 && min <= mean && mean <= 1.0, "{}: {min} {mean}", m.label());
    }
    // the full map retains everything
    let full = KeepMap::full(256, bible.meta.layer_ids.clone());
    let r = retention(&full, &gita, None).unwrap();
    assert_eq!(r.min.reap_retention, Some(1.0));
    assert_eq!(r.mean.slot_replacement, 0.0);
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn masked_heldout_retention_and_budget_maps_on_bible() {
    let path = agg();
    let bible = Stats::from_reap_agg(&path, "bible", TOP_K).unwrap();
    let mask = ReapAggOptions { top_k: TOP_K, non_finite_reap: NonFiniteReap::MaskExperts };
    let cfg = KeepConfig::default();
    for (corpus, n) in [("quran", 335), ("bofm", 349)] {
        let held = Stats::from_reap_agg_with(&path, corpus, &mask).unwrap();
        assert_eq!(held.reap_missing_total(), n);
        assert_eq!(held.infer_top_k(), Some(TOP_K));
        let mut mean = std::collections::BTreeMap::new();
        for metric in [Metric::Reap, Metric::L2Sum, Metric::Frequency, Metric::Hybrid] {
            let m = KeepMap::build(&bible, metric, 128, &cfg).unwrap();
            let r = retention(&m, &held, None).unwrap();
            assert_eq!(r.mean.reap_excluded_experts, n as u64);
            assert!(saliency::check_retention(&r, &m, &held, None).passed);
            mean.insert(metric.as_str(), r.mean.reap_retention.unwrap());
        }
        // the finding of docs/saliency.md: l2_sum retains the most REAP mass out of sample
        let best = mean.iter().max_by(|a, b| a.1.total_cmp(b.1)).unwrap();
        assert_eq!(*best.0, "l2_sum", "{corpus}: {mean:?}");
    }
    // budget maps: exact totals, floor 6, nesting, and a mean in-sample l2_sum retention at least
    // that of the uniform map with the same number of experts (share is greedy-optimal for it)
    let totals = [43 * 128, 43 * 160];
    let maps: Vec<KeepMap> = totals
        .iter()
        .map(|&t| KeepMap::build_budget(&bible, Metric::L2Sum, &Budget::new(&bible, Metric::L2Sum, t), &cfg).unwrap())
        .collect();
    let checks = check_keep_maps(&bible, &maps, &cfg);
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
    for (m, k) in maps.iter().zip([128, 160]) {
        assert!(m.layers.iter().all(|l| l.len() >= 6));
        let uniform = KeepMap::build(&bible, Metric::L2Sum, k, &cfg).unwrap();
        let (b, u) = (retention(m, &bible, None).unwrap(), retention(&uniform, &bible, None).unwrap());
        assert!(b.mean.reap_retention.unwrap() >= u.mean.reap_retention.unwrap() - 1e-12);
    }
}
