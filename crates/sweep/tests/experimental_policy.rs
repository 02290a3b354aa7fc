//! cachesim's experimental policy `lfu_fifo` (the `experimental-policy` feature) in a grid: the
//! name parses in `policies` and in `tier2`, and its plain, prefetch and deployed rows are the
//! figures of cachesim's reference replayers, different from lfu's and fifo's.
//!
//! Run with `cargo test -p sweep --features experimental-policy` (CI does).

#![cfg(feature = "experimental-policy")]

mod common;

use cachesim::{Keep, PrefetchOptions, reference};
use common::{input, traces};
use sweep::{Grid, Sample, prepare};

#[test]
fn a_grid_runs_the_experimental_policy_on_every_path() {
    let dir = tempfile::tempdir().unwrap();
    let pin = serde_json::json!({
        "metric": "frequency", "k": 2, "num_experts": 16, "layer_ids": [0, 1],
        "layers": [[0, 1], [5]], "stats_sha256": "0", "short_layers": [1]
    });
    std::fs::write(dir.path().join("hot.json"), pin.to_string()).unwrap();
    let text = r#"{
      "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
      "variants": ["full"], "warmup": 8,
      "blocks": [
        {"policies": ["lfu_fifo", "lfu", "fifo"], "cap": [3, 5], "prefetch": ["none", "prev_token:1"]},
        {"policies": ["lfu_fifo"], "cap": [3], "pin": [null, "hot.json"], "tier2": [null, "lfu_fifo:6"],
         "batch": [null, 4]}
      ]
    }"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let (a, b) = traces(2);
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap_or_else(|e| panic!("{e}"));
    let keys: Vec<String> = p.configs.iter().map(ToString::to_string).collect();
    // 3 x 2 x 2 + (2 x 2 x 2 − the plain lfu_fifo/3 already there) = 19 configurations.
    assert_eq!(keys.len(), 19, "{keys:?}");
    for k in ["full/lfu_fifo/0/0/3/2/pf:prev_token:1", "full/lfu_fifo/0/0/3/2/pin:hot/t2:lfu_fifo:6/batch:4"] {
        assert!(keys.contains(&k.to_string()), "{k} not in {keys:?}");
    }
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    assert_eq!(rows.len(), 38);
    let mut paths = [0; 3];
    for row in &rows {
        let trace = if row.sample == Sample::InSample { &a } else { &b };
        let view = trace.view();
        let shape = view.shape();
        let keep = Keep::full(&shape);
        let cfg = sweep::replay_config(&g, &row.config);
        let prefetch = row.config.prefetch.and_then(|pk| pk.prefetch);
        match (&row.config.deploy, prefetch) {
            (None, None) => {
                assert_eq!(row.counts, reference::replay(&view, &keep, &cfg).unwrap(), "{}", row.key);
                paths[0] += 1;
            }
            (None, Some(pf)) => {
                let opts = PrefetchOptions { prefetch: Some(pf), coact: None, timeline: None };
                let r = reference::prefetch::replay(&view, &keep, &cfg, &opts).unwrap();
                assert_eq!(row.counts, r.counts.replay, "{}", row.key);
                let f = row.prefetch.as_ref().unwrap();
                assert_eq!((f.useful, f.wasted), (r.counts.useful, r.counts.wasted), "{}", row.key);
                paths[1] += 1;
            }
            (Some(d), _) => {
                // The key's deployment (its mapping is tested in tests/deploy_axes.rs).
                let dep = d.deployment(&shape).unwrap();
                let c = reference::deploy::replay(&view, &keep, &cfg, &dep).unwrap();
                assert_eq!(row.counts, c.counts, "{}", row.key);
                let fig = row.deploy.as_ref().unwrap();
                assert_eq!(
                    (fig.pinned_hits, fig.t2_hits, fig.storage_reads),
                    (c.pinned_hits, c.t2_hits, c.storage_reads)
                );
                paths[2] += 1;
            }
        }
    }
    assert!(paths.iter().all(|&n| n > 0), "{paths:?}");
    // Not replayed as another policy: its rows of the first block (2 caps x 2 prefetch x 2
    // samples, in key order) differ from lfu's and fifo's somewhere.
    let misses = |name: &str| -> Vec<u64> {
        let first_block = rows.iter().filter(|r| r.config.deploy.is_none() && r.config.policy.as_str() == name);
        first_block.map(|r| r.counts.misses).collect()
    };
    let ours = misses("lfu_fifo");
    assert_eq!(ours.len(), 8);
    for other in ["lfu", "fifo"] {
        assert_ne!(misses(other), ours, "lfu_fifo replays as {other}");
    }
}
