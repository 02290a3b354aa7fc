//! The deployment axes of a grid (`pin`, `tier2`, `batch`, SEMANTICS.md §9–§11): expansion, keys,
//! rows equal to cachesim's deployed replay, refusals.

mod common;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::{Keep, Policy};
use common::{input, traces};
use sweep::{Grid, Sample, prepare};

#[test]
fn deployment_axes_expand_and_replay_as_cachesim_does() {
    let dir = tempfile::tempdir().unwrap();
    // Per-layer sizes: 3 pinned in layer 0, 1 in layer 1.
    let pin = serde_json::json!({
        "metric": "frequency", "k": 3, "num_experts": 16, "layer_ids": [0, 1],
        "layers": [[0, 1, 2], [5]], "stats_sha256": "0", "short_layers": [1]
    });
    std::fs::write(dir.path().join("hot.json"), pin.to_string()).unwrap();
    let text = r#"{
      "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
      "variants": ["full"], "warmup": 8,
      "blocks": [
        {"policies": ["lru"], "cap": [2, 4]},
        {"policies": ["lru", "belady"], "cap": [0, 4], "pin": ["hot.json"]},
        {"policies": ["fifo"], "cap": [2], "tier2": [null, "lru:8"], "batch": [null, 1, 4]}
      ]
    }"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let (a, b) = traces(2);
    let p = match prepare(&g, &input(&a, "a"), &input(&b, "b")) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    };
    // 2 + 2 x 2 + 2 x 3 = 12 configurations.
    let keys: Vec<String> = p.configs.iter().map(ToString::to_string).collect();
    assert_eq!(keys.len(), 12, "{keys:?}");
    for k in [
        "full/lru/0/0/2/2",
        "full/lru/0/0/0/2/pin:hot",
        "full/fifo/0/0/2/2/t2:lru:8/batch:4",
        "full/fifo/0/0/2/2/batch:1",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} not in {keys:?}");
    }
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    assert_eq!(rows.len(), 24);
    // Sorted by key, in-sample first, whatever the mix of plain and deployed.
    assert!(rows.windows(2).all(|w| (&w[0].config, w[0].sample) < (&w[1].config, w[1].sample)));
    for row in &rows {
        let trace = if row.sample == Sample::InSample { &a } else { &b };
        let view = trace.view();
        let shape = view.shape();
        let cfg = sweep::replay_config(&g, &row.config);
        let keep = Keep::full(&shape);
        match &row.config.deploy {
            None => {
                assert!(row.deploy.is_none());
                assert_eq!(row.counts, cachesim::replay(&view, &keep, &cfg).unwrap());
            }
            Some(d) => {
                let dep = Deployment {
                    pins: d.pin.as_ref().map(|p| Keep::from_layers(&shape, &p.layers).unwrap()),
                    tier2: d.tier2,
                    schedule: d.batch.map_or(Schedule::PerToken, Schedule::Rebatch),
                };
                let c = cachesim::deploy::replay(&view, &keep, &cfg, &dep).unwrap();
                assert_eq!(row.counts, c.counts, "{}", row.key);
                let fig = row.deploy.as_ref().unwrap();
                assert_eq!(
                    (fig.pinned_hits, fig.t2_hits, fig.storage_reads, fig.steps),
                    (c.pinned_hits, c.t2_hits, c.storage_reads, c.steps)
                );
                if d.tier2 == Some(Tier2 { policy: Policy::Lru, cap: 8 }) {
                    assert_eq!(fig.t2_hits + fig.storage_reads, c.counts.misses - c.counts.forced_misses);
                }
            }
        }
    }
    // B = 1 re-batching gives the plain row's counts.
    let find = |k: &str, s: Sample| rows.iter().find(|r| r.key == k && r.sample == s).unwrap();
    for s in [Sample::InSample, Sample::OutOfSample] {
        assert_eq!(find("full/fifo/0/0/2/2/batch:1", s).counts, find("full/fifo/0/0/2/2", s).counts);
    }
    // Pins replace misses: pinned + LRU 4 misses less than LRU 4 alone.
    let pinned = find("full/lru/0/0/4/2/pin:hot", Sample::OutOfSample);
    assert!(pinned.counts.misses < find("full/lru/0/0/4/2", Sample::OutOfSample).counts.misses);
    assert!(pinned.deploy.as_ref().unwrap().pinned_hits > 0);
}

#[test]
fn bad_deployment_axes_are_refused_naming_the_block() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = traces(2);
    let check = |block: &str, needle: &str| {
        let text = format!(
            r#"{{"traces": {{"in_sample": "a", "out_of_sample": "b"}}, "variants": ["full"], "blocks": [{block}]}}"#
        );
        let g = Grid::from_json(&text, dir.path()).unwrap();
        let e = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap_err().to_string();
        assert!(e.contains(needle), "{block}: {e}");
    };
    check(r#"{"policies": ["lru"], "cap": [2], "tier2": ["lru"]}"#, "blocks[0].tier2: lru: expected POLICY:CAP");
    let tier2s = if cfg!(feature = "experimental-policy") {
        "lru, fifo, lfu, belady, perfect_lfu, lfru or lfu_fifo"
    } else {
        "lru, fifo, lfu, belady, perfect_lfu or lfru"
    };
    check(r#"{"policies": ["lru"], "cap": [2], "tier2": ["inv_router:8"]}"#, &format!("tier 2 takes {tier2s}"));
    check(r#"{"policies": ["lru"], "cap": [2], "pin": ["missing.json"]}"#, "blocks[0].pin");
    check(r#"{"policies": ["lru"], "cap": [2], "batch": [0]}"#, "batch = 0");
}
