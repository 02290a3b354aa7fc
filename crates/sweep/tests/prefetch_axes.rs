//! The prefetch axes of a grid (`prefetch`, `shuffle`, SEMANTICS.md §12, §13): expansion, keys,
//! rows equal to cachesim's prefetch replay and its timeline, a hand-computed grid, refusals.

mod common;

use std::collections::BTreeMap;

use cachesim::shuffle::Shuffled;
use cachesim::{CoactTable, Keep, PrefetchOptions, TimelineDevice};
use common::{input, traces};
use sweep::{Grid, Sample, prepare};
use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

#[test]
fn prefetch_axes_expand_and_replay_as_cachesim_does() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{
      "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
      "variants": ["full"], "warmup": 8,
      "blocks": [
        {"policies": ["lru", "lfu"], "cap": [4], "prefetch": ["none", "coact:2", "oracle:2", "prev_token:1"]},
        {"policies": ["lru", "belady"], "cap": [4], "shuffle": [null, 7]},
        {"policies": ["fifo"], "cap": [6], "lambda": [0.2], "prefetch": ["coact:3"], "shuffle": [null, 7]}
      ],
      "profiles": ["reference", "dsv2-lite-bf16"]
    }"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let (a, b) = traces(3);
    let p = match prepare(&g, &input(&a, "a"), &input(&b, "b")) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    // 2 x 4 + (2 x 2 − lru/4 already there) + 2 = 13 configurations.
    let keys: Vec<String> = p.configs.iter().map(ToString::to_string).collect();
    assert_eq!(keys.len(), 13, "{keys:?}");
    for k in [
        "full/lru/0/0/4/2",
        "full/lru/0/0/4/2/pf:coact:2",
        "full/lfu/0/0/4/2/pf:prev_token:1",
        "full/belady/0/0/4/2/shuffle:7",
        "full/fifo/0.2/0/6/2/pf:coact:3/shuffle:7",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} not in {keys:?}");
    }
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    assert_eq!(rows.len(), 26);
    assert!(rows.windows(2).all(|w| (&w[0].config, w[0].sample) < (&w[1].config, w[1].sample)));
    // coact learns from the in-sample trace.
    let table = CoactTable::learn(&a.view()).unwrap();
    let devices: Vec<TimelineDevice> = p
        .profiles
        .iter()
        .flat_map(|pr| {
            pr.bandwidth_gbps.iter().map(|&bw| TimelineDevice {
                expert_mb: pr.expert_mb,
                compute_ms: pr.compute_ms,
                bandwidth_gbps: bw,
            })
        })
        .collect();
    assert_eq!(devices.len(), 4);
    let mut with_loads = 0;
    for row in &rows {
        let trace = if row.sample == Sample::InSample { &a } else { &b };
        let pk = row.config.prefetch.unwrap_or_default();
        let shuffled = pk.shuffle.map(|s| Shuffled::new(&trace.view(), s));
        let view = shuffled.as_ref().map_or_else(|| trace.view(), Shuffled::view);
        let keep = Keep::full(&view.shape());
        let cfg = sweep::replay_config(&g, &row.config);
        let opts = PrefetchOptions { prefetch: pk.prefetch, coact: Some(&table), timeline: None };
        let (counts, timelines) = cachesim::replay_prefetch_on(&view, &keep, &cfg, &opts, &devices).unwrap();
        assert_eq!(row.counts, counts.replay, "{}", row.key);
        match (pk.prefetch, &row.prefetch) {
            (None, None) => {
                // Priced by §6, as a plain row.
                assert_eq!(row.counts, cachesim::replay(&view, &keep, &cfg).unwrap());
                assert_eq!(row.cost[0].tok_s, p.profiles[0].tok_s(row.misses_per_token, 3.9), "{}", row.key);
            }
            (Some(_), Some(f)) => {
                assert_eq!(
                    (f.prefetch_loads, f.useful, f.wasted),
                    (counts.prefetch_loads, counts.useful, counts.wasted)
                );
                assert_eq!((f.precision, f.coverage), (counts.precision_defined(), counts.coverage_defined()));
                assert_eq!(f.timeline.len(), 4);
                for ((t, c), (tl, dev)) in f.timeline.iter().zip(&row.cost).zip(timelines.iter().zip(&devices)) {
                    assert_eq!((t.tok_s, t.stall_s_per_token), (tl.tok_s, tl.stall_s_per_token), "{}", row.key);
                    assert_eq!((c.tok_s, c.bandwidth_gbps), (tl.tok_s, dev.bandwidth_gbps));
                    assert_eq!(c.ssd_mb_per_token, counts.mb_per_token(dev.expert_mb));
                }
                with_loads += usize::from(f.prefetch_loads > 0 && f.useful > 0);
            }
            (p, f) => panic!("{}: prefetch {p:?} with figures {f:?}", row.key),
        }
    }
    assert!(with_loads >= 8, "{with_loads}");
    // The shuffled order loses locality: lru misses more on both traces.
    let find = |k: &str, s: Sample| rows.iter().find(|r| r.key == k && r.sample == s).unwrap();
    for s in [Sample::InSample, Sample::OutOfSample] {
        assert!(find("full/lru/0/0/4/2/shuffle:7", s).counts.misses > find("full/lru/0/0/4/2", s).counts.misses);
    }
    // The summary leaves prefetch and shuffled rows out: one group per (variant, cap, k_used).
    let groups: Vec<(usize, usize)> = sweep::best_per_variant(&rows).iter().map(|b| (b.cap, b.k_used)).collect();
    assert_eq!(groups, [(4, 2)]);
}

/// One layer, E = 4, k = 1, tokens 0 1 0 2, cap 1, lru, warmup 0: plain replay misses every
/// token (4 misses). `oracle:1` prefetches each token's expert: 4 loads, all useful, no demand
/// miss. Profile: 2 MB per expert at 1 GB/s (a load takes 2 ms), 4 ms compute per token.
/// Plain: 4 ms + 2 ms per token, 166.67 tok/s (§6). Oracle timeline (§13): token 0's load is
/// issued at 0 and done at 2, its layer runs 2–6; token t's load is issued when token t − 1's
/// layer starts (2, 6, 10) and is done 2 ms later, before that layer ends: layers 6–10, 10–14,
/// 14–18. 4 tokens in 18 ms = 222.22 tok/s; stall 2 ms at token 0 = 0.5 ms per token.
#[test]
fn a_hand_computed_prefetch_grid() {
    let meta = TraceMeta {
        model: "hand".into(),
        num_experts: 4,
        top_k: 1,
        layer_ids: vec![0],
        score_kind: ScoreKind::Logits,
        phase: Phase::Unknown,
        source: "sweep tests".into(),
        extra: BTreeMap::new(),
    };
    let parts = || OwnedParts {
        ids: vec![0, 1, 0, 2],
        gates: Some(vec![1.0; 4]),
        out_norms: Some(vec![1.0; 4]),
        ..Default::default()
    };
    let t = TraceData::new(meta.clone(), 4, 1, parts()).unwrap();
    let u = TraceData::new(meta, 4, 1, parts()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = r#"{
      "traces": {"in_sample": "a", "out_of_sample": "b"}, "variants": ["full"], "warmup": 0,
      "blocks": [{"policies": ["lru"], "cap": [1], "prefetch": [null, "oracle:1"]}],
      "profiles": [{"name": "hand", "expert_mb": 2, "compute_ms": 4, "bandwidth_gbps": [1]}]
    }"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let p = prepare(&g, &input(&t, "a"), &input(&u, "b")).unwrap();
    let rows = p.run(&t.view(), &u.view(), &|_| {});
    let keys: Vec<&str> = rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        ["full/lru/0/0/1/1", "full/lru/0/0/1/1", "full/lru/0/0/1/1/pf:oracle:1", "full/lru/0/0/1/1/pf:oracle:1"]
    );
    let (plain, oracle) = (&rows[1], &rows[3]);
    assert_eq!((plain.counts.misses, plain.counts.hits), (4, 0));
    assert!((plain.cost[0].tok_s - 1000.0 / 6.0).abs() < 1e-9, "{}", plain.cost[0].tok_s);
    assert_eq!(plain.cost[0].ssd_mb_per_token, 2.0);
    assert_eq!((oracle.counts.misses, oracle.counts.hits), (0, 4));
    let f = oracle.prefetch.as_ref().unwrap();
    assert_eq!((f.prefetch_loads, f.useful, f.wasted, f.precision, f.coverage), (4, 4, 0, Some(1.0), Some(1.0)));
    assert_eq!(f.loads_per_token, 1.0);
    assert_eq!(oracle.cost[0].ssd_mb_per_token, 2.0);
    assert!((f.timeline[0].tok_s - 4.0 / 0.018).abs() < 1e-9, "{}", f.timeline[0].tok_s);
    assert!((f.timeline[0].stall_s_per_token - 0.0005).abs() < 1e-12, "{}", f.timeline[0].stall_s_per_token);
    assert_eq!(oracle.cost[0].tok_s, f.timeline[0].tok_s);
    // The key round-trips through results.json.
    let json = serde_json::to_string(&oracle.config).unwrap();
    assert!(json.contains(r#""prefetch":{"prefetch":"oracle:1"}"#), "{json}");
    assert_eq!(serde_json::from_str::<sweep::ConfigKey>(&json).unwrap(), oracle.config);
}

#[test]
fn bad_prefetch_axes_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = traces(3);
    let check = |extra: &str, block: &str, needle: &str| {
        let text = format!(
            r#"{{"traces": {{"in_sample": "a", "out_of_sample": "b"}}, "variants": ["full"], {extra} "blocks": [{block}]}}"#
        );
        let g = Grid::from_json(&text, dir.path()).unwrap();
        let e = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap_err().to_string();
        assert!(e.contains(needle), "{block}: {e}");
    };
    let lru = r#""policies": ["lru"], "cap": [4]"#;
    check("", &format!("{{{lru}, \"prefetch\": [\"coact\"]}}"), "blocks[0].prefetch: coact: ");
    check("", &format!("{{{lru}, \"prefetch\": [\"coact:x\"]}}"), "PRED:B");
    check("", &format!("{{{lru}, \"prefetch\": [\"magic:2\"]}}"), "blocks[0].prefetch: magic:2");
    check("", &format!("{{{lru}, \"prefetch\": [\"oracle:2\"], \"batch\": [4]}}"), "does not combine");
    check("", &format!("{{{lru}, \"shuffle\": [3], \"tier2\": [\"lru:8\"]}}"), "blocks[0].shuffle: 3");
    check("", &format!("{{{lru}, \"prefetch\": [\"prev_token:5\"]}}"), "full/lru/0/0/4/2/pf:prev_token:5");
    check("", r#"{"policies": ["belady"], "cap": [4], "prefetch": ["oracle:1"]}"#, "full/belady/0/0/4/2/pf:oracle:1");
    check("", &format!("{{{lru}, \"prefetch\": [\"lookahead:2\"]}}"), "full/lru/0/0/4/2/pf:lookahead:2");
    check(
        r#""coact_calibration": "missing.safetensors","#,
        &format!("{{{lru}, \"prefetch\": [\"coact:2\"]}}"),
        "missing",
    );
    // Without a coact configuration the calibration trace is not read.
    let text = r#"{"traces": {"in_sample": "a", "out_of_sample": "b"}, "variants": ["full"],
        "coact_calibration": "missing.safetensors", "blocks": [{"policies": ["lru"], "cap": [4], "prefetch": ["oracle:1"]}]}"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    assert!(prepare(&g, &input(&a, "a"), &input(&b, "b")).is_ok());
}

/// A budget of 0 prefetches nothing: precision is 0/0, which a row writes as `null`, as
/// `replay --json` does (not `0.0`, which would read as "every prefetch wasted").
#[test]
fn precision_of_no_prefetch_is_null_as_in_replay() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = traces(3);
    let text = r#"{"traces": {"in_sample": "a", "out_of_sample": "b"}, "variants": ["full"],
        "blocks": [{"policies": ["lru"], "cap": [4], "prefetch": ["oracle:0", "oracle:2"]}]}"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    let check = |key: &str, loads: bool| {
        let mut n = 0;
        for r in rows.iter().filter(|r| r.key == key) {
            let f = r.prefetch.as_ref().unwrap();
            assert_eq!(f.prefetch_loads > 0, loads, "{key}");
            let expect = loads.then(|| f.useful as f64 / f.prefetch_loads as f64);
            assert_eq!(f.precision, expect, "{key}");
            let v = serde_json::to_value(f).unwrap();
            assert_eq!(v["precision"].is_null(), !loads, "{key}: {v}");
            n += 1;
        }
        assert_eq!(n, 2, "{key}: one row per trace");
    };
    check("full/lru/0/0/4/2/pf:oracle:0", false);
    check("full/lru/0/0/4/2/pf:oracle:2", true);
}
