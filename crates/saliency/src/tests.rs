//! Unit tests on hand-computed examples.

use std::collections::BTreeMap;

use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

use crate::*;

const NEG: f64 = f64::NEG_INFINITY;

fn meta(num_experts: u32, top_k: u32, layer_ids: Vec<u32>) -> TraceMeta {
    TraceMeta {
        model: "test".into(),
        num_experts,
        top_k,
        layer_ids,
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: "unit test".into(),
        extra: BTreeMap::new(),
    }
}

/// E = 3, k = 1, m = 2, one layer (id 7), three tokens:
/// t0 uses expert 1 (g 0.5, ‖o‖ 2), t1 uses expert 2 (0.5, 2), t2 uses expert 2 (1.0, 3).
/// Expert 0 is never used (c = 0), expert 1 once (c = 1), expert 2 twice.
fn three_expert_trace() -> TraceData {
    let parts = OwnedParts {
        ids: vec![1, 2, 2, 1, 2, 0],
        gates: Some(vec![0.5, 0.5, 1.0]),
        out_norms: Some(vec![2.0, 2.0, 3.0]),
        ..OwnedParts::default()
    };
    TraceData::new(meta(3, 1, vec![7]), 3, 2, parts).unwrap()
}

fn three_expert_stats() -> Stats {
    Stats::from_trace(&three_expert_trace().view(), "t".into(), String::new())
}

fn scores(stats: &Stats, m: Metric, cfg: &MetricConfig) -> Vec<f64> {
    metric_scores(stats, m, cfg).unwrap().remove(0)
}

/// Statistics of one layer built from counts only (plus optional reap sums).
fn count_stats(count: Vec<u64>, reap: Option<Vec<f64>>) -> Stats {
    let e = count.len() as u32;
    let tokens = count.iter().sum();
    Stats {
        meta: StatsMeta {
            model: String::new(),
            num_experts: e,
            top_k: 1,
            layer_ids: vec![3],
            source: String::new(),
            source_digest: String::new(),
        },
        layers: vec![LayerStats {
            tokens,
            count,
            gate_sum: None,
            ean_sum: None,
            reap_sum: reap,
            reap_sumsq: None,
            reap_missing: vec![],
        }],
    }
}

#[test]
fn statistics_from_trace_by_hand() {
    let s = three_expert_stats();
    assert_eq!(s.meta.layer_ids, vec![7]);
    let l = &s.layers[0];
    assert_eq!(l.tokens, 3);
    assert_eq!(l.count, vec![0, 1, 2]);
    assert_eq!(l.gate_sum.as_deref(), Some(&[0.0, 0.5, 1.5][..]));
    assert_eq!(l.ean_sum.as_deref(), Some(&[0.0, 2.0, 5.0][..]));
    assert_eq!(l.reap_sum.as_deref(), Some(&[0.0, 1.0, 4.0][..]));
    assert_eq!(l.reap_sumsq.as_deref(), Some(&[0.0, 1.0, 10.0][..]));
    assert!(check_stats(&s).iter().all(|c| c.passed), "{:?}", check_stats(&s));
}

#[test]
fn metric_scores_by_hand() {
    let s = three_expert_stats();
    let cfg = MetricConfig::default();
    assert_eq!(scores(&s, Metric::Frequency, &cfg), vec![NEG, 1.0, 2.0]);
    assert_eq!(scores(&s, Metric::GateSum, &cfg), vec![NEG, 0.5, 1.5]);
    assert_eq!(scores(&s, Metric::EanSum, &cfg), vec![NEG, 2.0, 5.0]);
    assert_eq!(scores(&s, Metric::EanMean, &cfg), vec![NEG, 2.0, 2.5]);
    assert_eq!(scores(&s, Metric::Reap, &cfg), vec![NEG, 1.0, 2.0]);
    assert_eq!(scores(&s, Metric::L2Sum, &cfg), vec![NEG, 1.0, 4.0]);
    // shrink, τ = 64. Expert 1 (c = 1): SE = mean = 1, so 0. Expert 2 (c = 2): mean 2, sample
    // variance (10 − 2·2²)/1 = 2, SE = √2/√2 = 1, score (2 − 1)·2/(2 + 64) = 1/33.
    let sh = scores(&s, Metric::Shrink, &cfg);
    assert_eq!(sh[0], NEG);
    assert_eq!(sh[1], 0.0);
    assert!((sh[2] - 1.0 / 33.0).abs() < 1e-12, "{}", sh[2]);
    // hybrid (default base l2_sum + reap): both rank experts 0 < 1 < 2, percentiles 0, 0.5, 1;
    // expert 0 (c = 0) is unusable.
    assert_eq!(scores(&s, Metric::Hybrid, &cfg), vec![NEG, 0.5, 1.0]);
}

#[test]
fn tau_damping() {
    let s = three_expert_stats();
    let undamped = MetricConfig { tau: 0.0, ..MetricConfig::default() };
    let sh = scores(&s, Metric::Shrink, &undamped);
    assert!((sh[2] - 1.0).abs() < 1e-12, "τ = 0 gives the bare lower bound mean − SE = 1, got {}", sh[2]);
    let heavy = MetricConfig { tau: 998.0, ..MetricConfig::default() };
    let sh = scores(&s, Metric::Shrink, &heavy);
    assert!((sh[2] - 2.0 / 1000.0).abs() < 1e-12, "{}", sh[2]);
    let bad = MetricConfig { tau: -1.0, ..MetricConfig::default() };
    assert!(matches!(metric_scores(&s, Metric::Shrink, &bad), Err(SaliencyError::Invalid { .. })));
}

#[test]
fn rank_percentile_ties_are_averaged() {
    // ascending: 1 (rank 0), then three 5s sharing ranks 1, 2, 3 -> 2; divided by E − 1 = 3.
    assert_eq!(rank_percentiles(&[5.0, 5.0, 1.0, 5.0]), vec![2.0 / 3.0, 2.0 / 3.0, 0.0, 2.0 / 3.0]);
    // −∞ (c = 0 experts) tie at the bottom; 0.0 and −0.0 tie.
    assert_eq!(rank_percentiles(&[NEG, 0.0, NEG, -0.0, 9.0]), vec![0.125, 0.625, 0.125, 0.625, 1.0]);
    assert_eq!(rank_percentiles(&[3.0]), vec![0.0]);
    assert!(rank_percentiles(&[]).is_empty());
}

#[test]
fn hybrid_with_explicit_base_and_ties() {
    // frequency [4, 4, 1, 0]; gate sums [1, 3, 3, 0].
    let mut s = count_stats(vec![4, 4, 1, 0], None);
    s.layers[0].gate_sum = Some(vec![1.0, 3.0, 3.0, 0.0]);
    let cfg = MetricConfig::default(); // no reap_sum: default base is frequency + gate_sum
    // frequency ascending ranks: expert 3 (−∞) 0, expert 2 1, experts 0/1 tie at 2.5 -> /3.
    // gate_sum: expert 3 0, expert 0 1, experts 1/2 tie at 2.5.
    let h = scores(&s, Metric::Hybrid, &cfg);
    let want = [(2.5 + 1.0) / 6.0, (2.5 + 2.5) / 6.0, (1.0 + 2.5) / 6.0];
    assert_eq!(&h[..3], &want);
    assert_eq!(h[3], NEG);
    // keep 2: expert 1 first, then 0 and 2 tie at 3.5/6 -> lower id (0) wins.
    let map = KeepMap::build(&s, Metric::Hybrid, 2, &KeepConfig::default()).unwrap();
    assert_eq!(map.layers, vec![vec![0, 1]]);
    let bad = MetricConfig { hybrid_base: Some(vec![Metric::Hybrid]), ..MetricConfig::default() };
    assert!(matches!(metric_scores(&s, Metric::Hybrid, &bad), Err(SaliencyError::Invalid { .. })));
    let none = MetricConfig { hybrid_base: Some(vec![]), ..MetricConfig::default() };
    assert!(matches!(metric_scores(&s, Metric::Hybrid, &none), Err(SaliencyError::Invalid { .. })));
    let twice =
        MetricConfig { hybrid_base: Some(vec![Metric::Frequency, Metric::Frequency]), ..MetricConfig::default() };
    let e = metric_scores(&s, Metric::Hybrid, &twice).unwrap_err();
    assert!(e.to_string().contains("frequency is given twice"), "{e}");
}

#[test]
fn keep_map_tie_order_and_short_layers() {
    let s = count_stats(vec![5, 5, 0, 5, 2], None);
    let cfg = KeepConfig::default();
    let build = |k| KeepMap::build(&s, Metric::Frequency, k, &cfg);
    assert_eq!(build(1).unwrap().layers, vec![vec![0]]);
    assert_eq!(build(2).unwrap().layers, vec![vec![0, 1]]);
    assert_eq!(build(3).unwrap().layers, vec![vec![0, 1, 3]]);
    assert_eq!(build(4).unwrap().layers, vec![vec![0, 1, 3, 4]]);
    let m = build(4).unwrap();
    assert_eq!(m.label(), "frequency@4");
    assert_eq!(m.stats_sha256, s.sha256());
    assert!(matches!(build(5), Err(SaliencyError::ShortLayer { layer_id: 3, available: 4, k: 5 })));
    assert!(matches!(build(6), Err(SaliencyError::KTooLarge { k: 6, num_experts: 5 })));
    assert!(matches!(build(0), Err(SaliencyError::Invalid { .. })));
    let allow = KeepConfig { allow_short_layers: true, ..KeepConfig::default() };
    let short = KeepMap::build(&s, Metric::Frequency, 5, &allow).unwrap();
    assert_eq!(short.layers, vec![vec![0, 1, 3, 4]]);
    assert_eq!(short.short_layers, vec![3]);
    short.validate().unwrap();
    let checks = check_keep_maps(&s, &[build(2).unwrap(), build(3).unwrap(), short], &cfg);
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
    assert!(checks.iter().any(|c| c.name == "nesting: frequency"));
}

#[test]
fn keep_map_ties_on_scores_not_counts() {
    // reap means: [2, 2, −, 1] -> order 0, 1 (tie, id asc), 3; expert 2 has c = 0 but would
    // otherwise have the top score if it were usable.
    let s = count_stats(vec![1, 2, 0, 4], Some(vec![2.0, 4.0, 0.0, 4.0]));
    let m = KeepMap::build(&s, Metric::Reap, 1, &KeepConfig::default()).unwrap();
    assert_eq!(m.layers, vec![vec![0]]);
    let m = KeepMap::build(&s, Metric::L2Sum, 1, &KeepConfig::default()).unwrap();
    assert_eq!(m.layers, vec![vec![1]]);
}

#[test]
fn missing_statistics_are_errors() {
    let s = count_stats(vec![1, 2, 3], Some(vec![1.0, 1.0, 1.0]));
    let err = metric_scores(&s, Metric::Shrink, &MetricConfig::default()).unwrap_err();
    assert!(matches!(err, SaliencyError::MissingStatistic { statistic: "reap_sumsq", .. }), "{err}");
    assert!(err.to_string().contains("no sum of squares"), "{err}");
    for m in [Metric::GateSum, Metric::EanSum, Metric::EanMean] {
        assert!(matches!(metric_scores(&s, m, &MetricConfig::default()), Err(SaliencyError::MissingStatistic { .. })));
    }
}

#[test]
fn metric_names_round_trip() {
    for m in Metric::ALL {
        assert_eq!(m.as_str().parse::<Metric>().unwrap(), m);
        assert_eq!(m.to_string(), m.as_str());
    }
    let err = "l2".parse::<Metric>().unwrap_err();
    assert!(matches!(&err, SaliencyError::UnknownMetric { name } if name == "l2"));
    assert!(err.to_string().contains("frequency, gate_sum, ean_sum, ean_mean, reap, l2_sum, shrink, hybrid"), "{err}");
}

#[test]
fn retention_of_full_map_is_one() {
    let data = three_expert_trace();
    let s = three_expert_stats();
    let full = KeepMap::full(3, vec![7]);
    assert_eq!(full.label(), "full");
    let r = retention(&full, &s, Some(&data.view())).unwrap();
    for f in [&r.mean, &r.min] {
        assert_eq!(f.reap_retention, Some(1.0));
        assert_eq!(f.gate_retention, Some(1.0));
        assert_eq!(f.prob_retention, Some(1.0));
        assert_eq!(f.slot_replacement, 0.0);
        assert_eq!(f.zero_hit_kept, 1, "the full map keeps expert 0, unseen in the held-out trace");
    }
}

#[test]
fn retention_by_hand() {
    let data = three_expert_trace();
    let s = three_expert_stats();
    let map = KeepMap::build(&s, Metric::Frequency, 1, &KeepConfig::default()).unwrap();
    assert_eq!(map.layers, vec![vec![2]]);
    let r = retention(&map, &s, Some(&data.view())).unwrap();
    let f = &r.per_layer[0].figures;
    assert_eq!(r.label, "frequency@1");
    assert_eq!(f.reap_retention, Some(4.0 / 5.0));
    assert_eq!(f.gate_retention, Some(1.5 / 2.0));
    assert_eq!(f.slot_replacement, 1.0 / 3.0);
    // per token: t0 loses its only slot (0), t1 and t2 keep theirs (1).
    assert!((f.prob_retention.unwrap() - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(f.zero_hit_kept, 0);
    assert_eq!(r.mean, r.min);
    // without the trace there is no per-token figure
    let r = retention(&map, &s, None).unwrap();
    assert_eq!(r.mean.prob_retention, None);
}

#[test]
fn retention_refuses_mismatched_shapes() {
    let s = three_expert_stats();
    let other_layers = KeepMap::full(3, vec![8]);
    assert!(matches!(retention(&other_layers, &s, None), Err(SaliencyError::Mismatch { .. })));
    let other_e = KeepMap::full(4, vec![7]);
    assert!(matches!(retention(&other_e, &s, None), Err(SaliencyError::Mismatch { .. })));
    // statistics that are not those of the given trace
    let mut wrong = s.clone();
    wrong.layers[0].count = vec![1, 0, 2];
    wrong.layers[0].gate_sum = None;
    wrong.layers[0].ean_sum = None;
    wrong.layers[0].reap_sum = None;
    wrong.layers[0].reap_sumsq = None;
    let data = three_expert_trace();
    let full = KeepMap::full(3, vec![7]);
    assert!(matches!(retention(&full, &wrong, Some(&data.view())), Err(SaliencyError::Mismatch { .. })));
}

#[test]
fn json_round_trips_and_validation() {
    let dir = tempfile::tempdir().unwrap();
    let s = three_expert_stats();
    let p = dir.path().join("stats.json");
    s.write_json(&p).unwrap();
    let back = Stats::read_json(&p).unwrap();
    assert_eq!(back, s);
    assert_eq!(back.sha256(), s.sha256());
    // The `kind` tag is the file's first field; the digest is of the untagged statistics, and a
    // file without the tag (written before it) reads to the same statistics.
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.starts_with("{\n  \"kind\": \"moe-offload-stats\",\n  \"meta\""), "{text}");
    std::fs::write(&p, serde_json::to_vec(&s).unwrap()).unwrap();
    assert_eq!(Stats::read_json(&p).unwrap(), s);

    let map = KeepMap::build(&s, Metric::Reap, 2, &KeepConfig::default()).unwrap();
    let mp = dir.path().join("map.json");
    map.write_json(&mp).unwrap();
    assert_eq!(KeepMap::read_json(&mp).unwrap(), map);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&mp).unwrap()).unwrap();
    assert_eq!(v.as_object().unwrap().keys().next().map(String::as_str), Some("kind"));
    assert_eq!(v["kind"], crate::KEEP_MAP_KIND);
    // A keep map read where statistics are expected is named by its tag.
    let err = Stats::read_json(&mp).unwrap_err().to_string();
    assert!(err.contains("a keep map (from `moe-offload keep`)"), "{err}");
    let checks = check_keep_maps(&back, std::slice::from_ref(&map), &KeepConfig::default());
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");

    // a keep map listing an id twice
    let mut dup = map.clone();
    dup.layers[0] = vec![1, 1];
    std::fs::write(&mp, serde_json::to_vec(&dup).unwrap()).unwrap();
    let err = KeepMap::read_json(&mp).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    assert!(err.to_string().starts_with(&format!("{}: ", mp.display())), "names the file: {err}");
    // id out of range
    let mut big = map.clone();
    big.layers[0] = vec![1, 3];
    assert!(big.validate().is_err());

    // negative statistic, named by layer
    let mut neg = s.clone();
    neg.layers[0].gate_sum.as_mut().unwrap()[1] = -0.5;
    std::fs::write(&p, serde_json::to_vec(&neg).unwrap()).unwrap();
    let err = Stats::read_json(&p).unwrap_err();
    assert!(err.to_string().contains("layer 7 gate_sum[1]"), "{err}");
    assert!(matches!(&err, SaliencyError::InFile { path, .. } if path == &p), "names the file: {err}");
    // wrong vector length
    let mut short = s.clone();
    short.layers[0].count.pop();
    assert!(matches!(short.validate(), Err(SaliencyError::Mismatch { .. })));
    // top-k above E: no routing chooses more distinct experts than there are
    let mut wide = s.clone();
    wide.meta.top_k = wide.meta.num_experts + 1;
    let err = wide.validate().unwrap_err().to_string();
    assert!(err.contains("top_k") && err.contains("is more than the"), "{err}");
    // missing file
    assert!(matches!(Stats::read_json(dir.path().join("nope.json")), Err(SaliencyError::Io { .. })));

    // a safetensors file (a trace) given as statistics or as a keep map: named as one
    let header = br#"{"__metadata__":{}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    let tp = dir.path().join("trace.safetensors");
    std::fs::write(&tp, &st).unwrap();
    let err = Stats::read_json(&tp).unwrap_err();
    assert!(matches!(err, SaliencyError::NotJson { found: "a safetensors file (a trace?)", .. }), "{err:?}");
    assert!(err.to_string().contains("moe-offload stats"), "{err}");
    let err = KeepMap::read_json(&tp).unwrap_err();
    assert!(err.to_string().contains("not a keep-map JSON"), "{err}");
    // the tool's other JSON files, given in each other's place
    let err = Stats::read_json(&mp).unwrap_err();
    assert!(matches!(err, SaliencyError::NotJson { found: "a keep map (from `moe-offload keep`)", .. }), "{err:?}");
    let err = KeepMap::read_json(&p).unwrap_err();
    assert!(err.to_string().contains("statistics JSON (from `moe-offload stats`), not a keep-map JSON"), "{err}");
    std::fs::write(&tp, r#"{"bible": {"n": 3, "tok": 10, "freq": {"0": [NaN]}}}"#).unwrap();
    assert!(Stats::read_json(&tp).unwrap_err().to_string().contains("--reap-agg"));
    // statistics with a bad field stay a JSON error with its position
    std::fs::write(&tp, r#"{"meta": 5, "layers": []}"#).unwrap();
    assert!(matches!(Stats::read_json(&tp), Err(SaliencyError::Json { .. })));
    // other binary content, and malformed text JSON (still a JSON error with its position)
    std::fs::write(&tp, [0u8, 1, 2, 3]).unwrap();
    assert!(matches!(Stats::read_json(&tp), Err(SaliencyError::NotJson { found: "a binary file", .. })));
    std::fs::write(&tp, "{\"meta\": ").unwrap();
    assert!(matches!(Stats::read_json(&tp), Err(SaliencyError::Json { .. })));
}

#[test]
fn checks_catch_tampering() {
    let s = count_stats(vec![5, 4, 0, 3, 2], Some(vec![5.0, 8.0, 0.0, 9.0, 1.0]));
    let cfg = KeepConfig::default();
    let a = KeepMap::build(&s, Metric::Reap, 2, &cfg).unwrap();
    let mut b = KeepMap::build(&s, Metric::Reap, 3, &cfg).unwrap();
    // reap means: 1, 2, −, 3, 0.5 -> K=2 keeps {1, 3}; K=3 keeps {0, 1, 3}.
    assert_eq!(a.layers, vec![vec![1, 3]]);
    assert_eq!(b.layers, vec![vec![0, 1, 3]]);
    b.layers[0] = vec![0, 2, 3];
    let checks = check_keep_maps(&s, &[a, b], &cfg);
    let failed: Vec<&str> = checks.iter().filter(|c| !c.passed).map(|c| c.name.as_str()).collect();
    assert_eq!(failed, vec!["reap@3: reproduces", "reap@3: no zero-hit expert", "nesting: reap"], "{checks:#?}");
    // statistics whose counts do not sum to tokens · k
    let mut bad = s.clone();
    bad.layers[0].tokens += 1;
    let c = check_stats(&bad);
    assert!(c[0].passed && !c[1].passed, "{c:#?}");
    assert!(c[1].detail.contains("layer 3"), "{}", c[1].detail);
}

#[test]
fn reap_agg_reader() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agg.json");
    std::fs::write(
        &p,
        r#"{"a": {"n": 1, "tok": 4, "freq": {"1": [2.0, 0.0, 2.0], "0": [1, 3, 0]}, "reap": {"0": [1.5, 2.0, 0.0], "1": [3.0, 0.0, 1.0]}},
            "b": {"n": 1, "tok": 4, "freq": {"0": [1, 3, 0]}, "reap": {"0": [NaN, 2.0, 0.0]}},
            "c NaN": {"n": 1, "freq": {"0": [1, 3, 0]}, "reap": {"0": [1.0, 2.0, 0.0]}}}"#,
    )
    .unwrap();
    assert_eq!(Stats::reap_agg_corpora(&p).unwrap(), vec!["a", "b", "c NaN"]);
    let a = Stats::from_reap_agg(&p, "a", 1).unwrap();
    assert_eq!(a.meta.layer_ids, vec![0, 1]);
    assert_eq!(a.meta.num_experts, 3);
    assert_eq!(a.layers[1].count, vec![2, 0, 2]);
    assert_eq!(a.layers[0].reap_sum.as_deref(), Some(&[1.5, 2.0, 0.0][..]));
    assert_eq!(a.layers[0].tokens, 4);
    assert!(check_stats(&a).iter().all(|c| c.passed));
    let err = metric_scores(&a, Metric::Shrink, &MetricConfig::default()).unwrap_err();
    assert!(matches!(err, SaliencyError::MissingStatistic { statistic: "reap_sumsq", .. }));

    let b = Stats::from_reap_agg(&p, "b", 1).unwrap();
    assert!(b.layers[0].reap_sum.is_none());
    assert!(b.meta.source.contains("reap_sum dropped: 1 non-finite"), "{}", b.meta.source);
    assert!(matches!(
        metric_scores(&b, Metric::Reap, &MetricConfig::default()),
        Err(SaliencyError::MissingStatistic { .. })
    ));
    let reject = ReapAggOptions { top_k: 1, non_finite_reap: NonFiniteReap::Reject };
    let err = Stats::from_reap_agg_with(&p, "b", &reject).unwrap_err();
    assert!(err.to_string().contains("layer 0 expert 0"), "{err}");

    let err = Stats::from_reap_agg(&p, "c NaN", 2).unwrap_err();
    assert!(err.to_string().contains("`tok`") && err.to_string().contains("absent"), "{err}");
    let err = Stats::from_reap_agg(&p, "zzz", 2).unwrap_err();
    assert!(err.to_string().contains("corpus `zzz`"), "{err}");
}

#[test]
fn multi_slot_trace_statistics() {
    // E = 4, k = 2, m = 3, two layers, two tokens.
    let parts = OwnedParts {
        ids: vec![0, 1, 2, 3, 0, 1, /* layer 2 */ 2, 3, 0, 2, 1, 0],
        gates: Some(vec![0.6, 0.4, 0.7, 0.3, 0.5, 0.5, 0.9, 0.1]),
        ..OwnedParts::default()
    };
    let data = TraceData::new(meta(4, 2, vec![1, 2]), 2, 3, parts).unwrap();
    let s = Stats::from_trace(&data.view(), "x".into(), "y".into());
    assert_eq!(s.layers[0].count, vec![2, 1, 0, 1]);
    assert_eq!(s.layers[1].count, vec![0, 1, 2, 1]);
    assert!(s.layers[0].reap_sum.is_none() && s.layers[0].ean_sum.is_none());
    let g = s.layers[0].gate_sum.as_ref().unwrap();
    assert!((g[0] - (0.6 + 0.3f32 as f64)).abs() < 1e-7 && (g[0] - 0.9).abs() < 1e-6);
    assert!(check_stats(&s).iter().all(|c| c.passed));
    // hybrid falls back to frequency + gate_sum without reap sums
    assert_eq!(MetricConfig::default().hybrid_base_for(&s), vec![Metric::Frequency, Metric::GateSum]);
    let full = KeepMap::full(4, vec![1, 2]);
    let r = retention(&full, &s, Some(&data.view())).unwrap();
    assert_eq!(r.mean.prob_retention, Some(1.0));
    assert_eq!(r.mean.reap_retention, None);
    assert_eq!(r.mean.zero_hit_kept, 2, "sum over layers of kept experts without held-out hits");
}

/// Two layers (ids 0 and 1), E = 4, k = 1: layer 0 counts [10, 5, 3, 2] (20 tokens), layer 1
/// counts [19, 1, 0, 0] (20 tokens). Frequency shares: layer 0 [.5, .25, .15, .1], layer 1
/// [.95, .05, −, −].
fn budget_stats() -> Stats {
    let layer = |count: Vec<u64>| LayerStats {
        tokens: count.iter().sum(),
        count,
        gate_sum: None,
        ean_sum: None,
        reap_sum: None,
        reap_sumsq: None,
        reap_missing: vec![],
    };
    Stats {
        meta: StatsMeta {
            model: String::new(),
            num_experts: 4,
            top_k: 1,
            layer_ids: vec![0, 1],
            source: String::new(),
            source_digest: String::new(),
        },
        layers: vec![layer(vec![10, 5, 3, 2]), layer(vec![19, 1, 0, 0])],
    }
}

#[test]
fn budget_maps_by_hand() {
    let s = budget_stats();
    let cfg = KeepConfig::default();
    let build =
        |total, floor, scale| KeepMap::build_budget(&s, Metric::Frequency, &Budget { total, floor, scale }, &cfg);
    // floor 1 keeps expert 0 in both layers; the 2 remaining places go to the largest shares
    // beyond the floors: layer 0's .25 and .15 (layer 1's .05 is last).
    let m = build(4, 1, BudgetScale::Share).unwrap();
    assert_eq!(m.layers, vec![vec![0, 1, 2], vec![0]]);
    assert_eq!((m.k, m.total_kept()), (3, 4));
    assert_eq!(m.label(), "frequency@budget4");
    m.validate().unwrap();
    assert_eq!(build(5, 1, BudgetScale::Share).unwrap().layers, vec![vec![0, 1, 2, 3], vec![0]]);
    assert_eq!(build(6, 1, BudgetScale::Share).unwrap().layers, vec![vec![0, 1, 2, 3], vec![0, 1]]);
    // the floor is respected even where another layer's shares are larger
    assert_eq!(build(4, 2, BudgetScale::Share).unwrap().layers, vec![vec![0, 1], vec![0, 1]]);
    // percentile among usable experts: layer 0 [1, 2/3, 1/3, 0], layer 1 [1, 0]. At total 5 the
    // two 0s tie (layer 0's expert 3, layer 1's expert 1): the lower layer index wins.
    let p = build(5, 1, BudgetScale::Percentile).unwrap();
    assert_eq!(p.layers, vec![vec![0, 1, 2, 3], vec![0]]);
    assert_eq!(p.label(), "frequency@budget5:percentile");
    // raw counts: 5, 3, 2 in layer 0 beat 1 in layer 1
    assert_eq!(build(4, 1, BudgetScale::Raw).unwrap().layers, vec![vec![0, 1, 2], vec![0]]);
    // impossible budgets and floors
    let err = build(1, 1, BudgetScale::Share).unwrap_err();
    assert!(err.to_string().contains("below the 2 experts"), "{err}");
    let err = build(7, 1, BudgetScale::Share).unwrap_err();
    assert!(err.to_string().contains("above the 6 experts with calibration hits"), "{err}");
    assert!(matches!(build(4, 0, BudgetScale::Share), Err(SaliencyError::Invalid { .. })));
    assert!(matches!(
        build(6, 3, BudgetScale::Share),
        Err(SaliencyError::ShortLayer { layer_id: 1, available: 2, k: 3 })
    ));
    let allow = KeepConfig { allow_short_layers: true, ..KeepConfig::default() };
    let short =
        KeepMap::build_budget(&s, Metric::Frequency, &Budget { total: 5, floor: 3, scale: BudgetScale::Share }, &allow)
            .unwrap();
    assert_eq!(short.layers, vec![vec![0, 1, 2], vec![0, 1]]);
    assert_eq!(short.short_layers, vec![1]);
    short.validate().unwrap();

    // the checks rebuild budget maps from their recorded budget and check nesting across totals
    let maps: Vec<KeepMap> = (4..=6).map(|t| build(t, 1, BudgetScale::Share).unwrap()).collect();
    let mut all = maps.clone();
    all.push(KeepMap::build(&s, Metric::Frequency, 2, &cfg).unwrap());
    let checks = check_keep_maps(&s, &all, &cfg);
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
    assert!(checks.iter().any(|c| c.name == "nesting: frequency budget (share, floor 1)"), "{checks:#?}");
    // tampering: a budget map whose total disagrees with its layers, or that does not reproduce
    let mut bad = maps[0].clone();
    bad.budget = Some(Budget { total: 5, ..bad.budget.unwrap() });
    assert!(bad.validate().unwrap_err().to_string().contains("budget total"));
    let mut moved = maps[0].clone();
    moved.layers = vec![vec![0, 1], vec![0, 1]];
    let checks = check_keep_maps(&s, &[moved], &cfg);
    assert!(checks.iter().any(|c| c.name == "frequency@budget4: reproduces" && !c.passed), "{checks:#?}");
}

#[test]
fn budget_defaults_and_json() {
    let s = budget_stats();
    assert_eq!(Budget::new(&s, Metric::Frequency, 9), Budget { total: 9, floor: 1, scale: BudgetScale::Share });
    assert_eq!(BudgetScale::default_for(Metric::Shrink), BudgetScale::Share);
    assert_eq!("percentile".parse::<BudgetScale>().unwrap(), BudgetScale::Percentile);
    assert!("rank".parse::<BudgetScale>().is_err());
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.json");
    let m =
        KeepMap::build_budget(&s, Metric::Frequency, &Budget::new(&s, Metric::Frequency, 5), &KeepConfig::default())
            .unwrap();
    m.write_json(&p).unwrap();
    assert_eq!(KeepMap::read_json(&p).unwrap(), m);
    // uniform maps carry no `budget` key, so their files are unchanged
    let u = KeepMap::build(&s, Metric::Frequency, 1, &KeepConfig::default()).unwrap();
    assert!(!serde_json::to_string(&u).unwrap().contains("budget"));
    // share needs non-negative scores. shrink is >= 0 on statistics from data (mean − SE < 0
    // needs Σx² > (Σx)²), so only inconsistent statistics (Σx² = 5 > (Σx)² = 4) make it fail.
    let mut neg = three_expert_stats();
    neg.layers[0].reap_sum = Some(vec![0.0, 1.0, 2.0]);
    neg.layers[0].reap_sumsq = Some(vec![0.0, 1.0, 5.0]);
    let b = Budget { total: 2, floor: 1, scale: BudgetScale::Share };
    let shrink = metric_scores(&neg, Metric::Shrink, &MetricConfig::default()).unwrap();
    assert!(shrink[0][2] < 0.0, "{shrink:?}");
    let err = KeepMap::build_budget(&neg, Metric::Shrink, &b, &KeepConfig::default()).unwrap_err();
    assert!(err.to_string().contains("use percentile"), "{err}");
}

#[test]
fn share_takes_a_map_of_rounding_residues_as_zero() {
    // Two hits of reap 0 and x per expert: shrink = min(0, x) = 0 mathematically, but for this x
    // the rounding leaves -3.4e-18 in every expert, so the map has no scale of its own.
    let x = 1.4794383149448345;
    let mut s = count_stats(vec![2, 2, 2], Some(vec![x; 3]));
    s.layers[0].reap_sumsq = Some(vec![x * x; 3]);
    let shrink = metric_scores(&s, Metric::Shrink, &MetricConfig::default()).unwrap();
    assert!(shrink[0].iter().all(|&v| v < 0.0 && v > -1e-17), "{shrink:?}");
    let b = Budget { total: 2, floor: 1, scale: BudgetScale::Share };
    let map = KeepMap::build_budget(&s, Metric::Shrink, &b, &KeepConfig::default()).unwrap();
    assert_eq!(map.layers, vec![vec![0, 1]]);
}

#[test]
fn build_many_matches_single_builds() {
    let s = count_stats(vec![5, 5, 0, 5, 2], None);
    let cfg = KeepConfig::default();
    let many = KeepMap::build_many(&s, Metric::Frequency, &[3, 1, 4], &cfg).unwrap();
    for (m, k) in many.iter().zip([3, 1, 4]) {
        assert_eq!(m, &KeepMap::build(&s, Metric::Frequency, k, &cfg).unwrap());
    }
    assert!(matches!(KeepMap::build_many(&s, Metric::Frequency, &[], &cfg), Err(SaliencyError::Invalid { .. })));
    assert!(matches!(KeepMap::build_many(&s, Metric::Frequency, &[1, 9], &cfg), Err(SaliencyError::KTooLarge { .. })));
    assert!(matches!(KeepMap::build_many(&s, Metric::Frequency, &[1, 5], &cfg), Err(SaliencyError::ShortLayer { .. })));
}

#[test]
fn masked_reap_aggregate_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agg.json");
    std::fs::write(
        &p,
        r#"{"b": {"n": 1, "tok": 4, "freq": {"0": [1, 3, 0], "1": [2, 1, 1]}, "reap": {"0": [NaN, 2.0, 0.0], "1": [1.0, Infinity, 3.0]}}}"#,
    )
    .unwrap();
    let opts = ReapAggOptions { top_k: 1, non_finite_reap: NonFiniteReap::MaskExperts };
    let b = Stats::from_reap_agg_with(&p, "b", &opts).unwrap();
    assert_eq!(b.layers[0].reap_missing, vec![0]);
    assert_eq!(b.layers[1].reap_missing, vec![1]);
    assert_eq!(b.layers[0].reap_sum.as_deref(), Some(&[0.0, 2.0, 0.0][..]));
    assert_eq!(b.reap_missing_total(), 2);
    assert!(b.meta.source.contains("reap_sum masked: 2 non-finite reap values"), "{}", b.meta.source);
    assert!(b.meta.source.contains("2 slots"), "{}", b.meta.source);
    assert_eq!(b.infer_top_k(), Some(1));
    // ranking by reap is refused; frequency is fine
    let err = metric_scores(&b, Metric::L2Sum, &MetricConfig::default()).unwrap_err();
    assert!(matches!(err, SaliencyError::PartialStatistic { missing: 2, layer_id: 0, expert: 0, .. }), "{err}");
    assert!(metric_scores(&b, Metric::Frequency, &MetricConfig::default()).is_ok());
    // retention over the known entries: layer 0 keeps {1}: 2 / 2 = 1; layer 1 keeps {0}: 1 / 4
    let mut map = KeepMap::full(3, vec![0, 1]);
    map.metric = "frequency".into();
    map.k = 1;
    map.layers = vec![vec![1], vec![0]];
    let r = retention(&map, &b, None).unwrap();
    assert_eq!(r.per_layer[0].figures.reap_retention, Some(1.0));
    assert_eq!(r.per_layer[1].figures.reap_retention, Some(0.25));
    assert_eq!(r.per_layer[0].figures.reap_excluded_slots, 1);
    assert_eq!(r.per_layer[1].figures.reap_excluded_slots, 1);
    assert_eq!((r.mean.reap_excluded_experts, r.mean.reap_excluded_slots), (2, 2));
    assert_eq!(r.mean.reap_retention, Some(0.625));
    assert_eq!(r.per_layer[0].figures.slot_replacement, 0.25, "other figures use every expert");
    // the masked statistics round-trip through JSON; complete statistics carry no `reap_missing`
    let sp = dir.path().join("b.json");
    b.write_json(&sp).unwrap();
    assert_eq!(Stats::read_json(&sp).unwrap(), b);
    assert!(!serde_json::to_string(&three_expert_stats()).unwrap().contains("reap_missing"));
    // validation of the mask
    let mut bad = b.clone();
    bad.layers[0].reap_sum.as_mut().unwrap()[0] = 1.0;
    assert!(bad.validate().unwrap_err().to_string().contains("reap_missing"));
    let mut bad = b.clone();
    bad.layers[1].reap_missing = vec![2, 1];
    assert!(bad.validate().is_err());
    assert_eq!("mask".parse::<NonFiniteReap>().unwrap(), NonFiniteReap::MaskExperts);
    let corpora = Stats::reap_agg_summary(&p).unwrap();
    assert_eq!((corpora[0].name.as_str(), corpora[0].tokens, corpora[0].non_finite_reap), ("b", Some(4), 2));
}

#[test]
fn infer_top_k_from_counts() {
    assert_eq!(count_stats(vec![3, 0, 2], None).infer_top_k(), Some(1));
    let mut s = budget_stats();
    s.layers[0].tokens = 10; // 20 slots over 10 tokens: k = 2, but layer 1 says 1
    assert_eq!(s.infer_top_k(), None);
    s.layers[1].tokens = 10;
    assert_eq!(s.infer_top_k(), Some(2));
    s.layers[1].tokens = 8; // 20 / 8 is not whole
    assert_eq!(s.infer_top_k(), None);
}

#[test]
fn retention_check_recomputes_to_tolerance() {
    let data = three_expert_trace();
    let s = three_expert_stats();
    let map = KeepMap::build(&s, Metric::Frequency, 1, &KeepConfig::default()).unwrap();
    let stored = retention(&map, &s, Some(&data.view())).unwrap();
    let c = check_retention(&stored, &map, &s, Some(&data.view()));
    assert!(c.passed, "{c:?}");
    assert_eq!(c.name, "frequency@1: retention reproduces");
    let mut close = stored.clone();
    close.per_layer[0].figures.slot_replacement += 5e-5;
    assert!(check_retention(&close, &map, &s, Some(&data.view())).passed);
    let mut off = stored.clone();
    off.per_layer[0].figures.reap_retention = Some(0.8 + 2e-4);
    let c = check_retention(&off, &map, &s, Some(&data.view()));
    assert!(!c.passed && c.detail.contains("layer 7 reap_retention"), "{c:?}");
    // stored with the trace, recomputed without it: prob_retention present vs absent
    let c = check_retention(&stored, &map, &s, None);
    assert!(!c.passed && c.detail.contains("prob_retention"), "{c:?}");
    let mut counted = stored.clone();
    counted.mean.zero_hit_kept = 3;
    assert!(!check_retention(&counted, &map, &s, Some(&data.view())).passed);
}
