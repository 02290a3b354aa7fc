//! Test fixture: a directory of real moe-offload outputs on the embedded default traces, laid
//! out as a user's run leaves it.
//!
//! ```text
//! ROOT/calib.safetensors, ROOT/heldout.safetensors   the default traces (copies)
//! ROOT/grid.json, ROOT/caps.json                    data/grids/default.json naming them (3 variants)
//!                                                    and a block of per-layer caps from caps.json
//! ROOT/out/stats.json, heldout-stats.json            `moe-offload stats` of each trace
//! ROOT/out/frequency@16.json, frequency@24.json      `moe-offload keep` from stats.json
//! ROOT/out/retention.json                            `moe-offload retention --json`
//! ROOT/out/sweep/results.json, .csv, summary.md      `moe-offload sweep ROOT/grid.json`
//! ROOT/out/plan.json                                 `moe-offload plan` (per-layer caps, full map)
//! ```
//!
//! The audited directory is `ROOT/out`: the traces are beside it, as in the README's ESFT run.
//! The template is built once per test binary and copied for each test.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use saliency::{KeepConfig, KeepMap, Metric, Stats};
use serde_json::{Value, json};
use sweep::{Grid, InputRef, Provenance, SweepOutput, TraceInput};
use trace_io::TraceFile;

/// One copy of the fixture.
pub struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    /// ROOT.
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// The audited directory, ROOT/out.
    pub fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// `ROOT/out/REL`.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.out().join(rel)
    }
}

/// A fresh copy of the fixture.
pub fn fixture() -> Fixture {
    static TEMPLATE: OnceLock<tempfile::TempDir> = OnceLock::new();
    let template = TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        dir
    });
    let dir = tempfile::tempdir().unwrap();
    copy_dir(template.path(), dir.path());
    Fixture { dir }
}

/// Copies the directory tree `from` into `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

fn build(root: &Path) {
    let ws = crate::workspace_root();
    for (from, to) in [("default-calib", "calib"), ("default-heldout", "heldout")] {
        std::fs::copy(ws.join(format!("data/{from}.safetensors")), root.join(format!("{to}.safetensors"))).unwrap();
    }
    let mut grid: Value =
        serde_json::from_str(&std::fs::read_to_string(ws.join("data/grids/default.json")).unwrap()).unwrap();
    grid["traces"] = json!({ "in_sample": "calib.safetensors", "out_of_sample": "heldout.safetensors" });
    // Three of the default's variants (full, a frequency map, an l2_sum map) keep every policy and
    // the lambda > 0 block while the test audits stay quick: 66 configurations, 132 rows.
    grid["variants"] = json!(["full", "frequency@16", "l2_sum@16"]);
    grid["blocks"][0]["cap"] = json!([4, 8]);
    // And per-layer caps from a file the grid names (recorded with its hash in provenance.files).
    std::fs::write(root.join("caps.json"), "[4, 6, 5, 8]\n").unwrap();
    grid["blocks"]
        .as_array_mut()
        .unwrap()
        .push(json!({ "variants": ["full"], "policies": ["lru"], "layer_caps": ["caps.json"] }));
    std::fs::write(root.join("grid.json"), serde_json::to_vec_pretty(&grid).unwrap()).unwrap();
    let out = root.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let (calib, held) = (root.join("calib.safetensors"), root.join("heldout.safetensors"));
    let stats = trace_stats(&calib, "calib.safetensors", None);
    let held_stats = trace_stats(&held, "heldout.safetensors", None);
    held_stats.write_json(out.join("heldout-stats.json")).unwrap();
    write_saliency(&out, &stats, &held_stats);
    run_sweep(root, &Grid::read(&root.join("grid.json")).unwrap(), &out.join("sweep"));
    write_plan(root, &out.join("plan.json"));
}

/// A plan file as `moe-offload plan --in-sample calib.safetensors --out-of-sample
/// heldout.safetensors --budget-gb ... --variants full -o out/plan.json` run from ROOT writes it:
/// the full map with per-layer caps 4, 6, 5, 8, LRU, k_used 4, warmup 64; the figures from the
/// optimized replayer (the plan's own verification).
fn write_plan(root: &Path, dest: &Path) {
    let (calib, held) = (
        TraceFile::open(root.join("calib.safetensors")).unwrap(),
        TraceFile::open(root.join("heldout.safetensors")).unwrap(),
    );
    let meta = calib.meta();
    let map = KeepMap::full(meta.num_experts, meta.layer_ids.clone());
    let keep = cachesim::Keep::full(&calib.shape());
    let caps = vec![4, 6, 5, 8];
    let cfg = cachesim::ReplayConfig {
        k_used: Some(4),
        warmup: 64,
        layer_caps: Some(caps.clone()),
        ..cachesim::ReplayConfig::new(cachesim::Policy::Lru, 4)
    };
    let ins = cachesim::replay(&calib.view(), &keep, &cfg).unwrap().misses_per_token();
    let outs = cachesim::replay(&held.view(), &keep, &cfg).unwrap().misses_per_token();
    let plan = json!({ "caps": caps, "slots": 23, "memory_gb": 0.1, "in_sample_misses_per_token": ins,
                       "out_of_sample_misses_per_token": outs, "in_sample_tok_s": [], "out_of_sample_tok_s": [] });
    let v = json!({
        "budget_gb": 0.1, "pinned_gb": 0.0, "profile": sweep::DeviceProfile::preset("reference").unwrap(), "slots": 23,
        "policy": "lru", "k_used": 4, "warmup": 64, "in_sample": "calib.safetensors", "out_of_sample": "heldout.safetensors",
        "chosen": { "variant": "full", "keep_map": map, "plan": plan,
                    "replayed": { "in_sample_misses_per_token": ins, "out_of_sample_misses_per_token": outs } },
        "uniform_best": null, "candidates": [],
    });
    std::fs::write(dest, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// `moe-offload stats TRACE` run from ROOT (`source` as the user typed it); `from` reads the
/// figures from another trace than the one named (a lie).
pub fn trace_stats(trace: &Path, source: &str, from: Option<&Path>) -> Stats {
    let f = TraceFile::open(from.unwrap_or(trace)).unwrap();
    Stats::from_trace(&f.view(), source.into(), trace_io::sha256_file(trace).unwrap())
}

/// stats.json, the two frequency keep maps built from it, and retention.json of both maps on
/// the held-out statistics.
pub fn write_saliency(out: &Path, stats: &Stats, held_stats: &Stats) {
    stats.write_json(out.join("stats.json")).unwrap();
    let mut rows = Vec::new();
    for k in [16, 24] {
        let m = KeepMap::build(stats, Metric::Frequency, k, &KeepConfig::default()).unwrap();
        m.write_json(out.join(format!("frequency@{k}.json"))).unwrap();
        let r = saliency::retention(&m, held_stats, None).unwrap();
        let mut v = serde_json::to_value(&r).unwrap();
        v["file"] = json!(format!("frequency@{k}.json"));
        v["heldout"] = json!("heldout-stats.json");
        rows.push(v);
    }
    let doc = json!({ "kind": "moe-offload-retention", "heldout": "heldout-stats.json", "maps": rows });
    std::fs::write(out.join("retention.json"), serde_json::to_vec_pretty(&doc).unwrap()).unwrap();
}

/// What `moe-offload sweep ROOT/grid.json -o DEST` writes (`grid` read from ROOT, its paths
/// resolved there): provenance with the paths relative to ROOT and the traces' SHA-256.
pub fn run_sweep(root: &Path, grid: &Grid, dest: &Path) {
    let recorded = grid.relative_to(root);
    // Not recorded: the fixture is copied for each test, and the template's directory would still
    // hold the inputs a test removes or edits (outputs written before `grid_dir` existed lack it).
    let grid_dir = None;
    let (cf, hf) =
        (TraceFile::open(&grid.traces.in_sample).unwrap(), TraceFile::open(&grid.traces.out_of_sample).unwrap());
    let (cs, hs) = (
        trace_io::sha256_file(&grid.traces.in_sample).unwrap(),
        trace_io::sha256_file(&grid.traces.out_of_sample).unwrap(),
    );
    let (csrc, hsrc) =
        (recorded.traces.in_sample.display().to_string(), recorded.traces.out_of_sample.display().to_string());
    let ins = TraceInput { view: cf.view(), source: &csrc, digest: &cs };
    let oos = TraceInput { view: hf.view(), source: &hsrc, digest: &hs };
    let p = sweep::prepare(grid, &ins, &oos).unwrap();
    let files = grid
        .files()
        .iter()
        .zip(recorded.files())
        .map(|(path, written)| InputRef {
            source: written.display().to_string(),
            digest: trace_io::Digest::sha256(trace_io::sha256_file(path).unwrap()),
        })
        .collect();
    let out = SweepOutput {
        provenance: Provenance {
            tool_version: "test".into(),
            grid: recorded.clone(),
            in_sample: InputRef { source: csrc.clone(), digest: trace_io::Digest::parse(&cs) },
            out_of_sample: InputRef { source: hsrc.clone(), digest: trace_io::Digest::parse(&hs) },
            stats_sha256: p.stats.sha256(),
            files,
            keep_maps: p.keep_maps(),
            grid_dir,
        },
        shard: None,
        rows: p.run(&cf.view(), &hf.view(), &|_| {}),
    };
    out.write(dest).unwrap();
}

/// Reads, edits and rewrites a JSON file.
pub fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}
