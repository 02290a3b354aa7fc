//! The hybrid-execution axes of a grid (`exec`, `overlap`, SEMANTICS.md §14): expansion, keys,
//! rows equal to cachesim's `replay_hybrid` priced by `HybridEvents::cost`, a hand-computed
//! all-CPU grid, refusals naming the block, configuration or profile.

mod common;

use cachesim::Keep;
use cachesim::deploy::{Deployment, Schedule};
use cachesim::hybrid::Overlap;
use common::{input, traces};
use sweep::{Grid, Sample, prepare};

/// Two full profiles with the §14 fields: memory-bound host runs (2 MB at 4 GB/s = 0.5 ms >
/// 0.1 ms per row) and compute-bound ones (1 ms per row > 0.5 ms).
const PROFILES: &str = r#"[
  {"name": "mem", "expert_mb": 2.0, "compute_ms": 10.0, "bandwidth_gbps": [3.9, 6.8], "link_gbps": 8.0,
   "host_gbps": 4.0, "host_ms_per_row": 0.1, "host_sync_ms": 0.2},
  {"name": "cpu", "expert_mb": 2.0, "compute_ms": 10.0, "bandwidth_gbps": [3.9], "link_gbps": 8.0,
   "host_gbps": 4.0, "host_ms_per_row": 1.0, "host_sync_ms": 0.2, "overlap": "concurrent"}
]"#;

fn grid(blocks: &str, dir: &std::path::Path) -> Grid {
    let text = format!(
        r#"{{"traces": {{"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"}},
            "variants": ["full"], "warmup": 0, "profiles": {PROFILES}, "blocks": {blocks}}}"#
    );
    Grid::from_json(&text, dir).unwrap()
}

#[test]
fn hybrid_rows_equal_cachesim_replay_hybrid_and_cost() {
    let dir = tempfile::tempdir().unwrap();
    let pin = serde_json::json!({
        "metric": "frequency", "k": 3, "num_experts": 16, "layer_ids": [0, 1],
        "layers": [[0, 1, 2], [5]], "stats_sha256": "0", "short_layers": [1]
    });
    std::fs::write(dir.path().join("hot.json"), pin.to_string()).unwrap();
    let g = grid(
        r#"[
        {"policies": ["lru"], "cap": [4], "exec": ["transfer", "host"], "overlap": ["sequential", "concurrent"]},
        {"policies": ["lru"], "cap": [0], "exec": ["host"], "overlap": ["sequential", "concurrent"]},
        {"policies": ["lfu"], "cap": [0], "pin": ["hot.json"], "batch": [null, 8], "exec": ["host", "host:4"]}
      ]"#,
        dir.path(),
    );
    let (a, b) = traces(2);
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap_or_else(|e| panic!("{e}"));
    let keys: Vec<String> = p.configs.iter().map(ToString::to_string).collect();
    // (transfer + host x 2 overlaps) + 2 overlaps + 2 batches x 2 execs = 9
    assert_eq!(keys.len(), 9, "{keys:?}");
    for k in [
        // transfer keys are those of a grid without the axes
        "full/lru/0/0/4/2",
        "full/lru/0/0/0/2/exec:host/overlap:concurrent",
        "full/lru/0/0/4/2/exec:host/overlap:sequential",
        "full/lfu/0/0/0/2/pin:hot/batch:8/exec:host:4",
        "full/lfu/0/0/0/2/pin:hot/exec:host",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} not in {keys:?}");
    }
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    assert_eq!(rows.len(), 18);
    assert!(rows.windows(2).all(|w| (&w[0].config, w[0].sample) < (&w[1].config, w[1].sample)));
    let profiles = g.device_profiles().unwrap();
    let mut hybrid = 0;
    for row in &rows {
        let Some(h) = row.config.hybrid else {
            assert!(row.hybrid.is_none());
            continue;
        };
        hybrid += 1;
        let trace = if row.sample == Sample::InSample { &a } else { &b };
        let view = trace.view();
        let shape = view.shape();
        let d = row.config.deploy.clone().unwrap_or_default();
        let dep = Deployment {
            pins: d.pin.as_ref().map(|p| Keep::from_layers(&shape, &p.layers).unwrap()),
            tier2: None,
            schedule: d.batch.map_or(Schedule::PerToken, Schedule::Rebatch),
        };
        let cfg = sweep::replay_config(&g, &row.config);
        let (c, ev) = cachesim::hybrid::replay_hybrid(&view, &Keep::full(&shape), &cfg, &dep, h.exec).unwrap();
        let fig = row.hybrid.as_ref().unwrap();
        assert_eq!(row.counts, c.deploy.counts, "{}", row.key);
        assert_eq!((fig.host_runs, fig.loads, fig.copies), (c.host_runs, c.loads, c.copies), "{}", row.key);
        assert_eq!((fig.pinned_hits, fig.rows), (c.deploy.pinned_hits, c.deploy.rows));
        assert_eq!(fig.cost.len(), 2);
        for (entry, prof) in fig.cost.iter().zip(&profiles) {
            let want = ev.cost(&prof.hybrid(h.overlap).unwrap()).unwrap();
            assert_eq!(entry.profile, prof.name);
            assert_eq!(entry.overlap, h.overlap.or(prof.overlap).unwrap_or_default(), "{}", row.key);
            assert_eq!(
                (entry.tok_s, entry.host_s_per_row, entry.gpu_s_per_row, entry.link_s_per_row),
                (want.tok_s, want.host_s_per_row, want.gpu_s_per_row, want.link_s_per_row),
                "{} {}",
                row.key,
                prof.name
            );
        }
        // the §6-shaped cost list: one entry per profile and bandwidth, §14's tok/s, no SSD reads
        assert_eq!(row.cost.len(), 3);
        assert!(row.cost.iter().all(|x| x.ssd_mb_per_token == 0.0));
        assert_eq!(row.cost[2].tok_s, fig.cost[1].tok_s);
        // with cap 0 a host run is every pick that is neither pinned nor forced (host only)
        if cfg.cap == 0 && h.exec == cachesim::hybrid::Exec::Host {
            assert_eq!(
                c.host_runs,
                row.counts.hits + row.counts.misses - c.deploy.pinned_hits - row.counts.forced_misses
            );
        }
    }
    assert_eq!(hybrid, 16);
}

#[test]
fn the_all_cpu_grid_matches_a_hand_computed_step_time() {
    let dir = tempfile::tempdir().unwrap();
    let g = grid(
        r#"[{"policies": ["lru"], "cap": [0], "exec": ["host"], "overlap": ["sequential", "concurrent"]}]"#,
        dir.path(),
    );
    let (a, b) = traces(2);
    let p = prepare(&g, &input(&a, "a"), &input(&b, "b")).unwrap_or_else(|e| panic!("{e}"));
    let rows = p.run(&a.view(), &b.view(), &|_| {});
    // 2 layers, top-2, no pins, cap 0: every pick a host run, one row per step.
    // Profile "mem": a run costs max(2 / 4000 s, 1 x 0.1 ms) = 0.5 ms; h = 2 x 0.5 + 0.2 = 1.2 ms;
    //   g = 10 ms / 2 = 5 ms per layer. Sequential 10 + 2 x 1.2 = 12.4 ms; concurrent 2 x max(5, 1.2) = 10 ms.
    // Profile "cpu": a run costs max(0.5, 1.0) = 1 ms; h = 2.2 ms. Sequential 14.4 ms; concurrent 10 ms.
    let want = |o: Overlap| match o {
        Overlap::Sequential => [(1.0 / 0.0124, 0.0024), (1.0 / 0.0144, 0.0044)],
        Overlap::Concurrent => [(1.0 / 0.010, 0.0024), (1.0 / 0.010, 0.0044)],
    };
    assert_eq!(rows.len(), 4);
    for row in &rows {
        let tokens = if row.sample == Sample::InSample { 400 } else { 300 };
        let fig = row.hybrid.as_ref().unwrap();
        assert_eq!((fig.host_runs, fig.loads, fig.copies, fig.rows), (tokens * 2 * 2, 0, 0, tokens));
        for (entry, (tok_s, host_s)) in fig.cost.iter().zip(want(row.config.hybrid.unwrap().overlap.unwrap())) {
            assert!(
                (entry.tok_s - tok_s).abs() < 1e-9 * tok_s,
                "{} {}: {} != {tok_s}",
                row.key,
                entry.profile,
                entry.tok_s
            );
            assert!((entry.host_s_per_row - host_s).abs() < 1e-12, "{}: {}", row.key, entry.host_s_per_row);
            assert!((entry.gpu_s_per_row - 0.010).abs() < 1e-12);
            assert_eq!(entry.link_s_per_row, 0.0);
        }
    }
}

#[test]
fn bad_hybrid_axes_are_refused_naming_the_block_config_or_profile() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = traces(2);
    for (blocks, needle) in [
        (r#"[{"policies": ["lru"], "cap": [4], "tier2": ["lru:8"], "exec": ["host"]}]"#, "blocks[0].exec: host"),
        (r#"[{"policies": ["lru"], "cap": [4], "prefetch": ["coact:2"], "exec": ["host"]}]"#, "blocks[0].exec: host"),
        (r#"[{"policies": ["lru"], "cap": [4], "exec": []}]"#, "blocks[0].exec: []"),
        (r#"[{"policies": ["lru"], "cap": [4], "exec": ["host:32"]}]"#, "full/lru/0/0/4/2/exec:host:32"),
    ] {
        let g = grid(blocks, dir.path());
        let e = match prepare(&g, &input(&a, "a"), &input(&b, "b")) {
            Ok(_) => panic!("{blocks} accepted"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(needle), "{blocks}: {e}");
    }
    // A preset has no host_gbps.
    let text = r#"{"traces": {"in_sample": "a", "out_of_sample": "b"}, "variants": ["full"],
        "profiles": ["reference"], "blocks": [{"policies": ["lru"], "cap": [0], "exec": ["host"]}]}"#;
    let g = Grid::from_json(text, dir.path()).unwrap();
    let e = prepare(&g, &input(&a, "a"), &input(&b, "b")).err().unwrap().to_string();
    assert!(e.contains("full/lru/0/0/0/2/exec:host with profile \"reference\"") && e.contains("host_gbps"), "{e}");
    // An unknown exec is a JSON error.
    let bad = r#"{"traces": {"in_sample": "a", "out_of_sample": "b"}, "blocks": [{"policies": ["lru"], "cap": [0], "exec": ["gpu"]}]}"#;
    assert!(Grid::from_json(bad, dir.path()).is_err());
}
