//! Grid expansion, determinism across thread counts, derived fields and refusals.

use std::path::Path;

use sweep::{ConfigKey, Grid, Sample, SweepError, TraceInput, prepare};
use trace_io::TraceData;
use trace_io::synth::{SynthConfig, generate};

fn traces() -> (TraceData, TraceData) {
    let base = SynthConfig { layers: 3, experts: 16, top_k: 2, candidates: 6, model_seed: 3, ..Default::default() };
    let a = generate(&SynthConfig { tokens: 600, sequences: 3, seed: 1, ..base.clone() }).unwrap();
    let b = generate(&SynthConfig { tokens: 300, sequences: 2, seed: 2, ..base }).unwrap();
    (a, b)
}

const GRID: &str = r#"{
  "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
  "variants": ["full", "frequency@8", "l2_sum@8", "l2_sum@12"],
  "warmup": 16,
  "blocks": [
    {"policies": ["lru", "fifo", "lfu", "belady"], "cap": [2, 4, 8]},
    {"variants": ["full", "l2_sum@8"], "policies": ["lru", "near_pick"], "lambda": [0.05, 0.12], "j": [2, 3], "cap": [4]}
  ],
  "profiles": ["reference", {"name": "slow", "expert_mb": 10.0, "compute_ms": 5.0, "bandwidth_gbps": [1.0, 2.0]}]
}"#;

fn grid(text: &str) -> Grid {
    Grid::from_json(text, Path::new("/grids")).unwrap()
}

fn input<'a>(t: &'a TraceData, name: &'a str) -> TraceInput<'a> {
    TraceInput { view: t.view(), source: name, digest: "0" }
}

#[test]
fn expansion_counts_keys_and_order() {
    let (a, b) = traces();
    let g = grid(GRID);
    assert_eq!(g.traces.in_sample, Path::new("/grids/a.safetensors"));
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    // 4 variants x 4 policies x 3 caps = 48, plus 2 variants x 2 policies x 2 lambdas x 2 j = 16.
    assert_eq!(p.configs.len(), 48 + 16);
    assert_eq!(p.jobs(), 128);
    let mut sorted = p.configs.clone();
    sorted.sort();
    assert_eq!(sorted, p.configs);
    // Numeric, not lexicographic, order of caps; key text is stable.
    let lru_full: Vec<String> = p
        .configs
        .iter()
        .filter(|k| k.variant == "full" && k.policy.as_str() == "lru")
        .map(ConfigKey::to_string)
        .collect();
    assert_eq!(
        lru_full,
        [
            "full/lru/0/0/2/2",
            "full/lru/0/0/4/2",
            "full/lru/0/0/8/2",
            "full/lru/0.05/2/4/2",
            "full/lru/0.05/3/4/2",
            "full/lru/0.12/2/4/2",
            "full/lru/0.12/3/4/2"
        ]
    );
    // A block repeated in another block is not run twice.
    let mut g2 = g.clone();
    g2.blocks.push(g.blocks[0].clone());
    assert_eq!(prepare(&g2, &input(&a, "a"), &input(&b, "b")).unwrap().configs.len(), 64);
}

#[test]
fn rows_are_identical_for_one_and_two_threads_and_derived_fields_follow_the_counts() {
    let (a, b) = traces();
    let g = grid(GRID);
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let run = |threads| {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let done = std::sync::atomic::AtomicU64::new(0);
        let rows = pool.install(|| {
            p.run(&a.view(), &b.view(), &|n| {
                done.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            })
        });
        // Progress adds up to the announced work: 64 configurations x 3 layers x (600 + 300) tokens.
        assert_eq!((done.into_inner(), p.work(&a.view(), &b.view())), (64 * 3 * 900, 64 * 3 * 900));
        rows
    };
    let one = run(1);
    let two = run(2);
    assert_eq!(serde_json::to_vec(&one).unwrap(), serde_json::to_vec(&two).unwrap());
    assert_eq!(one.len(), 128);
    // Sorted by (key, sample).
    for w in one.windows(2) {
        assert!((&w[0].config, w[0].sample) < (&w[1].config, w[1].sample));
    }
    for r in &one {
        let c = &r.counts;
        assert_eq!(c.tokens, if r.sample == Sample::InSample { 600 - 16 } else { 300 - 16 });
        assert_eq!(c.picks, c.tokens * 3 * 2);
        assert_eq!(c.hits + c.misses, c.picks);
        assert_eq!(r.hit_rate, c.hits as f64 / c.picks as f64);
        assert_eq!(r.misses_per_token, c.misses as f64 / c.tokens as f64);
        // reference at 3.9 and 6.8 GB/s, then "slow" at 1 and 2 GB/s.
        assert_eq!(r.cost.len(), 4);
        let slow = &r.cost[2];
        assert_eq!((slow.profile.as_str(), slow.bandwidth_gbps), ("slow", 1.0));
        assert_eq!(slow.ssd_mb_per_token, r.misses_per_token * 10.0);
        assert_eq!(slow.tok_s, 1.0 / (0.005 + r.misses_per_token * 10.0 / 1000.0));
        // Pruned variants: cap >= E kept would mean only compulsory misses; here just check the bound
        // misses >= forced misses.
        assert!(c.misses >= c.forced_misses);
    }
    // Belady is a lower bound of every lambda = 0 policy when every token counts; counted from
    // W = 16 it may exceed one by up to the cap per layer (the caches enter the window in
    // different states; see cachesim's `belady_counted_from_warmup_is_not_a_bound`).
    for r in &one {
        if r.config.lambda == 0.0 {
            let bel = one
                .iter()
                .find(|x| {
                    x.config.policy.as_str() == "belady"
                        && x.sample == r.sample
                        && x.config.variant == r.config.variant
                        && x.config.cap == r.config.cap
                })
                .unwrap();
            for (b, o) in bel.counts.layer_misses.iter().zip(&r.counts.layer_misses) {
                assert!(*b <= o + r.config.cap as u64, "{} vs {}", bel.key, r.key);
            }
        }
    }
}

/// The sweep's default (configurations of a layer in one pass over its rows, cachesim's
/// `Sharing::Lockstep`) writes byte-identical results.json, results.csv and results-costs.csv
/// to the per-configuration path, on a grid where groups mix policies, caps, λ, j, warmups and
/// keep maps (full and pruned), with near_pick_ema and inv_router sharing their softmax.
#[test]
fn one_pass_over_the_rows_writes_the_outputs_of_one_replay_per_configuration() {
    let (a, b) = traces();
    let g = grid(
        r#"{
  "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
  "variants": ["full", "frequency@8", "l2_sum@12"],
  "warmup": 16,
  "blocks": [
    {"policies": ["lru", "fifo", "lfu", "belady", "near_pick", "near_pick_ema", "inv_router"], "cap": [2, 4, 8]},
    {"policies": ["lru", "near_pick", "near_pick_ema", "inv_router"], "lambda": [0.05, 0.12], "j": [2, 3], "cap": [4]}
  ],
  "profiles": ["reference"]
}"#,
    );
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let files = |sharing| {
        let rows = p.run_with(&a.view(), &b.view(), sharing, &|_| {});
        let out = sweep::SweepOutput { provenance: provenance(&g), shard: None, rows };
        let dir = tempfile::tempdir().unwrap();
        out.write(dir.path()).unwrap();
        ["results.json", "results.csv", "results-costs.csv"].map(|f| std::fs::read(dir.path().join(f)).unwrap())
    };
    let (one_pass, per_config) = (files(cachesim::Sharing::Lockstep), files(cachesim::Sharing::PerConfig));
    assert!(one_pass[0].len() > 10_000, "{} bytes", one_pass[0].len());
    for (name, (x, y)) in
        ["results.json", "results.csv", "results-costs.csv"].iter().zip(one_pass.iter().zip(&per_config))
    {
        assert!(x == y, "{name} differs");
    }
}

#[test]
fn bad_grids_are_refused_before_any_work_naming_the_key() {
    let (a, b) = traces();
    let (ia, ib) = (input(&a, "a"), input(&b, "b"));
    let with_block =
        |block: &str| grid(&GRID.replace(r#"{"policies": ["lru", "fifo", "lfu", "belady"], "cap": [2, 4, 8]}"#, block));
    let err = |g: &Grid| prepare(g, &ia, &ib).unwrap_err();

    let e = err(&with_block(r#"{"policies": ["lruu"], "cap": [4]}"#));
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "blocks[0].policies: lruu"), "{e}");
    let e = err(&with_block(r#"{"policies": ["lru"], "cap": [1]}"#));
    assert!(
        matches!(&e, SweepError::Config { key, .. } if key == "frequency@8/lru/0/0/1/2 on the in-sample trace a"),
        "{e}"
    );
    assert!(e.to_string().contains("use a cap of 2 or more"), "{e}");
    let e = err(&with_block(r#"{"policies": ["belady"], "lambda": [0.05], "cap": [4]}"#));
    assert!(matches!(&e, SweepError::Config { key, .. } if key.starts_with("frequency@8/belady/0.05/0/4/2 ")), "{e}");
    // A warmup as long as the held-out trace (300 tokens) would count nothing there.
    let e = err(&grid(&GRID.replace("\"warmup\": 16", "\"warmup\": 300")));
    assert!(e.to_string().contains("on the out-of-sample trace b: warmup = 300 tokens covers the whole trace"), "{e}");
    let e = err(&with_block(r#"{"policies": ["lru"], "cap": [8], "k_used": [7]}"#));
    assert!(e.to_string().contains("k_used = 7"), "{e}");
    let e = err(&grid(&GRID.replace("\"l2_sum@12\"", "\"l2_sum@17\"")));
    assert!(matches!(&e, SweepError::Variant { spec, .. } if spec == "l2_sum@17"), "{e}");
    assert!(e.to_string().starts_with("variant l2_sum@17: K = 17"), "{e}");
    let e = err(&grid(&GRID.replace("\"l2_sum@12\"", "\"l2_sum\"")));
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "variants: l2_sum"), "{e}");
    let e = err(&grid(&GRID.replace("\"full\", \"frequency@8\"", "\"full\", \"full\", \"frequency@8\"")));
    assert!(e.to_string().contains("duplicate variant full"), "{e}");
    // A grid without blocks has nothing to run.
    let mut empty = grid(GRID);
    empty.blocks.clear();
    let e = err(&empty);
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "blocks"), "{e}");
    // A misspelt field of a full profile is named.
    let bad_profile = GRID.replace(r#""bandwidth_gbps": [1.0, 2.0]"#, r#""bandwith_gbps": [1.0, 2.0]"#);
    let e = Grid::from_json(&bad_profile, Path::new("")).unwrap_err();
    assert!(e.to_string().contains("profile: unknown field `bandwith_gbps`"), "{e}");
    // A negative τ is named as the grid's key, not against the first variant.
    let e = Grid::from_json(&GRID.replace("\"warmup\": 16", "\"warmup\": 16, \"tau\": -1"), Path::new("")).unwrap_err();
    assert!(e.to_string().starts_with("tau: -1 is not a finite value >= 0"), "{e}");
    // An empty bandwidth list is named as such.
    let e = grid(&GRID.replace("[1.0, 2.0]", "[]")).device_profiles().unwrap_err();
    assert!(e.to_string().contains("profiles: slow: bandwidth_gbps: an empty list"), "{e}");
    // Unknown fields are refused when the grid is parsed.
    assert!(Grid::from_json(&GRID.replace("\"warmup\"", "\"warmpu\""), Path::new("")).is_err());
    // A missing grid file names the path.
    let e = Grid::read(Path::new("/nonexistent/grid.json")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/grid.json"), "{e}");
}

/// Profile names label the cost columns: a name given twice would give two `tok_s@NAME@BW`
/// columns of one title, and a full profile named like a preset would pass for it.
#[test]
fn profile_names_are_unique_and_presets_cannot_be_shadowed() {
    let (a, b) = traces();
    let with_profiles = |profiles: &str| {
        grid(&GRID.replace(
            r#""profiles": ["reference", {"name": "slow", "expert_mb": 10.0, "compute_ms": 5.0, "bandwidth_gbps": [1.0, 2.0]}]"#,
            &format!(r#""profiles": {profiles}"#),
        ))
    };
    let names = |g: &Grid| g.device_profiles().map(|ps| ps.into_iter().map(|p| p.name).collect::<Vec<_>>());
    assert_eq!(names(&grid(GRID)).unwrap(), ["reference", "slow"]);

    let twice = with_profiles(
        r#"[{"name": "a", "expert_mb": 1.0, "compute_ms": 5.0, "bandwidth_gbps": [1.0]},
            {"name": "a", "expert_mb": 2.0, "compute_ms": 5.0, "bandwidth_gbps": [1.0]}]"#,
    );
    let e = prepare(&twice, &input(&a, "a"), &input(&b, "b")).unwrap_err();
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "profiles[1]: a"), "{e}");
    assert!(e.to_string().contains("profile name `a` is also profiles[0]"), "{e}");
    let e = names(&with_profiles(r#"["dsv2-lite-bf16", "reference", "dsv2-lite-bf16"]"#)).unwrap_err();
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "profiles[2]: dsv2-lite-bf16"), "{e}");

    let shadow =
        with_profiles(r#"[{"name": "reference", "expert_mb": 2.0, "compute_ms": 5.0, "bandwidth_gbps": [1.0]}]"#);
    let e = names(&shadow).unwrap_err();
    assert!(matches!(&e, SweepError::Grid { key, .. } if key == "profiles[0]: reference"), "{e}");
    assert!(e.to_string().contains("may not take the name of the preset `reference`"), "{e}");
}

#[test]
fn shards_merge_into_the_unsharded_output() {
    use sweep::{Shard, SweepOutput};
    let (a, b) = traces();
    let g = grid(GRID);
    let provenance = provenance(&g);
    let full = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let whole =
        SweepOutput { provenance: provenance.clone(), shard: None, rows: full.run(&a.view(), &b.view(), &|_| {}) };
    let shard = |index, count| {
        let mut p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
        let shard = Shard { index, count };
        p.shard(shard).unwrap();
        SweepOutput { provenance: provenance.clone(), shard: Some(shard), rows: p.run(&a.view(), &b.view(), &|_| {}) }
    };
    // Named as `sweep merge` names them, by directory; given in any order.
    let named = |p: &SweepOutput| (format!("out/shard-{}", p.shard.unwrap().index), p.clone());
    let parts: Vec<(String, SweepOutput)> = (0..3).rev().map(|i| named(&shard(i, 3))).collect();
    assert_eq!(parts.iter().map(|(_, p)| p.rows.len()).sum::<usize>(), whole.rows.len());
    assert!(parts.iter().all(|(_, p)| !p.rows.is_empty()));
    let merged = SweepOutput::merge(parts.clone()).unwrap();
    assert_eq!(serde_json::to_vec_pretty(&merged).unwrap(), serde_json::to_vec_pretty(&whole).unwrap());
    assert_eq!(merged.csv(), whole.csv());

    // parts[0] is shard 2, parts[1] shard 1, parts[2] shard 0.
    let merge_err = |parts: Vec<(String, SweepOutput)>| SweepOutput::merge(parts).unwrap_err().to_string();
    let with = |i: usize, edit: &dyn Fn(&mut SweepOutput)| {
        let mut v = parts.clone();
        edit(&mut v[i].1);
        v
    };
    let renamed = |i: usize, name: &str| {
        let mut v = parts.clone();
        v[i].0 = name.into();
        v
    };
    let files = |sha: &str| vec![sweep::InputRef { source: "keep.json".into(), digest: trace_io::Digest::parse(sha) }];
    let check = |parts: Vec<(String, SweepOutput)>, expect: &str| {
        let e = merge_err(parts);
        assert_eq!(e, format!("cannot merge: {expect}"));
    };
    let same_as = "is not from the same grid and inputs as out/shard-2";
    let cases: Vec<(Vec<(String, SweepOutput)>, String)> = vec![
        (parts[..2].to_vec(), "shard 0/3 missing (2 outputs given)".into()),
        (parts[..1].to_vec(), "shards 0/3, 1/3 missing (1 output given)".into()),
        (
            vec![parts[0].clone(), parts[1].clone(), (parts[1].0.clone() + "-again", parts[1].1.clone())],
            "shard 1/3 given twice: out/shard-1 and out/shard-1-again".into(),
        ),
        (
            with(1, &|p| p.provenance.stats_sha256 = "different".into()),
            format!("out/shard-1 (shard 1/3) {same_as}: its in-sample statistics (SHA-256) differs: s vs different"),
        ),
        (
            with(2, &|p| p.provenance.out_of_sample.digest = trace_io::Digest::parse("1")),
            format!(
                "out/shard-0 (shard 0/3) {same_as}: its out-of-sample trace (digest) differs: sha256:0 vs sha256:1"
            ),
        ),
        (
            with(1, &|p| p.provenance.tool_version = "0.9".into()),
            format!("out/shard-1 (shard 1/3) {same_as}: its tool version differs: test vs 0.9"),
        ),
        (
            with(1, &|p| p.provenance.files = files("aa")),
            format!("out/shard-1 (shard 1/3) {same_as}: its grid also names the file keep.json"),
        ),
        (
            with(0, &|p| p.provenance.files = files("aa")),
            format!("out/shard-1 (shard 1/3) {same_as}: its grid does not name the file keep.json"),
        ),
        (
            with(1, &|p| p.provenance.grid.warmup += 1),
            format!("out/shard-1 (shard 1/3) {same_as}: its grid differs (field warmup)"),
        ),
        (
            with(2, &|p| p.provenance.in_sample.source = "elsewhere/a".into()),
            format!("out/shard-0 (shard 0/3) {same_as}: its in-sample trace path differs: a vs elsewhere/a"),
        ),
        (
            with(1, &|p| p.shard = Some(Shard { index: 1, count: 4 })),
            "out/shard-1 is shard 1/4, but out/shard-2 is a shard of 3: not the same split".into(),
        ),
        (
            vec![("whole".into(), whole.clone()), parts[0].clone()],
            "whole is not a shard output (no `shard` field: a whole or merged sweep)".into(),
        ),
        (
            vec![parts[0].clone(), parts[1].clone(), parts[2].clone(), ("whole".into(), whole.clone())],
            "whole is not a shard output (no `shard` field: a whole or merged sweep)".into(),
        ),
        (vec![], "no shard outputs given".into()),
    ];
    for (parts, expect) in cases {
        check(parts, &expect);
    }
    // The same file with different bytes: the message gives both hashes.
    let mut two = with(0, &|p| p.provenance.files = files("aa"));
    two[1].1.provenance.files = files("bb");
    two[2].1.provenance.files = files("aa");
    check(
        two,
        &format!("out/shard-1 (shard 1/3) {same_as}: its file keep.json differs (digest): sha256:aa vs sha256:bb"),
    );
    // A row of shard 1 also in shard 0 (a hand-edited or mislabelled output) is named with both.
    let mut dup = parts.clone();
    let row = dup[1].1.rows[0].clone();
    dup[2].1.rows.push(row.clone());
    check(dup, &format!("configuration {} ({}) is in both out/shard-1 and out/shard-0", row.key, row.sample.as_str()));
    // Named outputs in another order merge to the same bytes.
    let mut shuffled = renamed(0, "elsewhere/s2");
    shuffled.swap(0, 2);
    assert_eq!(SweepOutput::merge(shuffled).unwrap(), merged);
}

#[test]
fn the_reference_grid_expands_to_120_configurations() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/grids/reference.json");
    let g = Grid::read(&path).unwrap();
    let labels: Vec<(String, String)> = g.variants.iter().map(|v| (v.clone(), v.clone())).collect();
    let keys = g.expand(&labels, 10).unwrap();
    assert_eq!(keys.len(), 120);
    let per = |v: &str| keys.iter().filter(|k| k.variant == v).count();
    assert_eq!([per("full"), per("l2_sum@256"), per("hybrid@224"), per("shrink@320")], [27, 27, 2, 2]);
    assert_eq!(keys.iter().filter(|k| k.lambda > 0.0).count(), 4 * 21);
    assert!(keys.iter().all(|k| k.cap == 128 && k.k_used == 10));
    assert_eq!(g.device_profiles().unwrap()[0].expert_mb, 1.3824);
}

#[test]
fn per_layer_caps_from_files_replay_each_layer_at_its_cap() {
    let (a, b) = traces();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("uneven.json"), "[2, 5, 8]").unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"{"chosen": {"plan": {"caps": [4, 4, 3]}}}"#).unwrap();
    std::fs::write(dir.path().join("short.json"), "[2, 5]").unwrap();
    let text = GRID.replace(
        r#"{"policies": ["lru", "fifo", "lfu", "belady"], "cap": [2, 4, 8]}"#,
        r#"{"policies": ["lru", "belady"], "cap": [4], "layer_caps": ["uneven.json", "plan.json"]}"#,
    );
    let g = Grid::from_json(&text, dir.path()).unwrap();
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let keys: Vec<String> =
        p.configs.iter().filter(|k| k.variant == "full" && k.lambda == 0.0).map(ConfigKey::to_string).collect();
    assert_eq!(
        keys,
        [
            "full/belady/0/0/4/2",
            "full/belady/0/0/caps:plan/2",
            "full/belady/0/0/caps:uneven/2",
            "full/lru/0/0/4/2",
            "full/lru/0/0/caps:plan/2",
            "full/lru/0/0/caps:uneven/2"
        ]
    );
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    let keep = cachesim::Keep::full(&a.view().shape());
    let r = rows.iter().find(|r| r.key == "full/lru/0/0/caps:uneven/2" && r.sample == Sample::InSample).unwrap();
    for (l, cap) in [2, 5, 8].into_iter().enumerate() {
        let cfg = cachesim::ReplayConfig { warmup: 16, ..cachesim::ReplayConfig::new(cachesim::Policy::Lru, cap) };
        assert_eq!(r.counts.layer_misses[l], cachesim::replay(&a.view(), &keep, &cfg).unwrap().layer_misses[l]);
    }
    let out = sweep::SweepOutput { provenance: provenance(&g), shard: None, rows };
    assert!(out.summary_markdown().contains("| full | caps:uneven |"));
    // The tidy cost CSV: one line per (row, profile, bandwidth) with the wide CSV's `tok_s@` figure.
    let (long, wide) = (String::from_utf8(out.costs_csv()).unwrap(), String::from_utf8(out.csv()).unwrap());
    let split = |l: &str| l.split(',').map(str::to_string).collect::<Vec<_>>();
    let head = split(wide.lines().next().unwrap());
    assert_eq!(long.lines().count(), 1 + out.rows.iter().map(|r| r.cost.len()).sum::<usize>());
    assert!(out.rows.iter().all(|r| !r.cost.is_empty()));
    for line in long.lines().skip(1).map(split) {
        let w = wide.lines().map(split).find(|w| w[0] == line[0] && w[1] == line[1]).unwrap();
        let col = head.iter().position(|h| *h == format!("tok_s@{}@{}", line[10], line[11])).unwrap();
        assert_eq!(w[col], line[13], "{line:?}");
        assert_eq!(w[17], line[9], "misses_per_token");
    }
    // A file with the wrong number of layers is refused before any work, naming the key.
    let bad = Grid::from_json(&text.replace("plan.json", "short.json"), dir.path()).unwrap();
    let e = prepare(&bad, &input(&a, "a"), &input(&b, "b")).unwrap_err();
    assert!(e.to_string().contains("caps:short") && e.to_string().contains("layer_caps"), "{e}");
    let missing = Grid::from_json(&text.replace("plan.json", "nope.json"), dir.path()).unwrap();
    let e = prepare(&missing, &input(&a, "a"), &input(&b, "b")).unwrap_err();
    assert!(e.to_string().contains("nope.json"), "{e}");
}

/// With several k_used in a grid, the summary's variant cell names k_used (rows would collide).
#[test]
fn summary_tells_k_used_apart() {
    let md = summary_of(&grid(&GRID.replace(
        r#"{"policies": ["lru", "fifo", "lfu", "belady"], "cap": [2, 4, 8]}"#,
        r#"{"policies": ["lru"], "cap": [4], "k_used": [1, 2]}"#,
    )));
    assert!(md.contains("| full (k_used 1) | 4 |") && md.contains("| full (k_used 2) | 4 |"), "{md}");
    // One k_used: the plain variant name.
    assert!(!summary_of(&grid(GRID)).contains("k_used"));
}

/// The summary's column titles are distinct, and its header bounds Belady only against λ = 0:
/// cache-aware routing changes the requests, so a λ > 0 row may be below it.
#[test]
fn summary_titles_are_distinct_and_belady_bounds_only_lambda_0() {
    let md = summary_of(&grid(GRID));
    let mut lines = md.lines();
    let intro = lines.next().unwrap();
    assert!(!intro.contains("lower bound of every online policy"), "{intro}");
    assert!(intro.contains("a lower bound of every λ = 0 online policy when every token counts (warmup 0)"), "{intro}");
    assert!(intro.contains("Cache-aware routing (λ > 0) changes the requests, so a λ > 0 configuration can beat it"));
    let titles: Vec<&str> = lines.nth(1).unwrap().split('|').map(str::trim).filter(|t| !t.is_empty()).collect();
    assert_eq!(
        titles,
        [
            "variant",
            "cap",
            "best online in-sample",
            "in-sample",
            "out-of-sample (in-sample choice)",
            "shift",
            "best online out-of-sample",
            "out-of-sample (best)",
            "Belady in / out"
        ]
    );
}

fn summary_of(g: &Grid) -> String {
    let (a, b) = traces();
    let p = prepare(g, &input(&a, "a"), &input(&b, "b")).unwrap();
    let out = sweep::SweepOutput { provenance: provenance(g), shard: None, rows: p.run(&a.view(), &b.view(), &|_| {}) };
    out.summary_markdown()
}

/// A provenance for outputs of the test traces "a" and "b" run with `g`.
fn provenance(g: &Grid) -> sweep::Provenance {
    sweep::Provenance {
        tool_version: "test".into(),
        grid: g.clone(),
        in_sample: sweep::InputRef { source: "a".into(), digest: trace_io::Digest::parse("0") },
        out_of_sample: sweep::InputRef { source: "b".into(), digest: trace_io::Digest::parse("0") },
        stats_sha256: "s".into(),
        files: Vec::new(),
        keep_maps: Vec::new(),
        grid_dir: None,
    }
}

/// Every empty list of a block is refused naming the block and the key, as `policies: []` is,
/// rather than "give at least one block"; `overlap` and `layer_caps` (whose absence is their
/// default) are refused when the grid is parsed.
#[test]
fn empty_block_lists_name_their_key() {
    let one = |extra: &str| {
        format!(
            r#"{{"traces": {{"in_sample": "a", "out_of_sample": "b"}}, "variants": ["full"],
                "blocks": [{{"policies": ["lru"], "cap": [4]{extra}}}]}}"#
        )
    };
    let labels = [("full".to_string(), "full".to_string())];
    assert_eq!(grid(&one("")).expand(&labels, 2).unwrap().len(), 1);
    // (`exec: []` has its own message, hybrid_axes.rs.)
    for key in ["pin", "tier2", "batch", "prefetch", "shuffle"] {
        let e = grid(&one(&format!(r#", "{key}": []"#))).expand(&labels, 2).unwrap_err();
        assert!(matches!(&e, SweepError::Grid { key: k, .. } if *k == format!("blocks[0].{key}")), "{key}: {e}");
        assert!(e.to_string().contains(&format!("blocks[0].{key}: is an empty list")), "{key}: {e}");
    }
    for key in ["overlap", "layer_caps"] {
        let e = Grid::from_json(&one(&format!(r#", "{key}": []"#)), Path::new("")).unwrap_err();
        assert!(e.to_string().contains(&format!("blocks[0].{key}: is an empty list")), "{key}: {e}");
    }
}

/// A plain `cap: [0]` row is the deployed replay of §9 with nothing set: its key is written
/// without `"deploy": {}` (as every plain row's), and read back as the same key.
#[test]
fn a_plain_cap_0_key_writes_no_empty_deploy() {
    let text = r#"{"traces": {"in_sample": "a", "out_of_sample": "b"}, "variants": ["full"],
        "blocks": [{"policies": ["lru"], "cap": [0, 4]}]}"#;
    let keys = grid(text).expand(&[("full".to_string(), "full".to_string())], 2).unwrap();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0].cap, 0);
    assert_eq!(keys[0].deploy, Some(Default::default()), "cap 0 is replayed deployed");
    assert_eq!(keys[1].deploy, None);
    for key in &keys {
        let json = serde_json::to_string(key).unwrap();
        assert!(!json.contains("deploy"), "{json}");
        assert_eq!(&serde_json::from_str::<ConfigKey>(&json).unwrap(), key, "{json}");
    }
}

/// Reading another output of the tool as results names its `kind`; a malformed file or one
/// without a tag keeps serde's message (line and column).
#[test]
fn results_of_another_kind_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let check = |text: &str, expect: &str| {
        let p = dir.path().join("results.json");
        std::fs::write(&p, text).unwrap();
        let e = sweep::SweepOutput::read(&p).expect_err("not results");
        assert!(e.to_string().contains(expect), "{e}");
        e
    };
    let e = check(r#"{"kind": "moe-offload-stats", "meta": {}}"#, "a `moe-offload-stats` file, not sweep results");
    assert!(matches!(e, SweepError::NotResults { ref kind, .. } if kind == "moe-offload-stats"));
    assert!(matches!(check(r#"{"meta": {}}"#, "missing field"), SweepError::Json { .. }));
    assert!(matches!(check(r#"{"kind": "moe-offload-sweep-results""#, "EOF"), SweepError::Json { .. }));
}
