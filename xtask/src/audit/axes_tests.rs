//! `audit --dir` on a sweep with every axis: pins (and cap 0), tier 2, batches, prefetch with
//! every predictor, the shuffled control, a pruned keep map; its grid in a directory of its own,
//! naming a pin map and a calibration trace relative to it. It audits clean, and a consistent lie
//! in a row of each kind fails, naming the figure.

use std::path::Path;
use std::sync::OnceLock;

use serde_json::{Value, json};

use super::dir::{Options, audit_dir, first_failure, passed};
use super::fixture::{copy_dir, edit_json, run_sweep, trace_stats};
use super::{Report, Status};

/// ROOT/{calib,heldout}.safetensors, ROOT/grids/every.json, ROOT/grids/pins/hot8.json,
/// ROOT/grids/coact/calib-copy.safetensors; the sweep in ROOT/out/every.
struct Every {
    dir: tempfile::TempDir,
}

fn build(root: &Path) {
    let ws = crate::workspace_root();
    for (from, to) in [("default-calib", "calib"), ("default-heldout", "heldout")] {
        std::fs::copy(ws.join(format!("data/{from}.safetensors")), root.join(format!("{to}.safetensors"))).unwrap();
    }
    let grids = root.join("grids");
    std::fs::create_dir_all(grids.join("pins")).unwrap();
    std::fs::create_dir_all(grids.join("coact")).unwrap();
    std::fs::copy(root.join("calib.safetensors"), grids.join("coact/calib-copy.safetensors")).unwrap();
    let stats = trace_stats(&root.join("calib.safetensors"), "../calib.safetensors", None);
    let pins = saliency::KeepMap::build(&stats, saliency::Metric::Frequency, 8, &saliency::KeepConfig::default());
    pins.unwrap().write_json(grids.join("pins/hot8.json")).unwrap();
    let grid = json!({
        "traces": {"in_sample": "../calib.safetensors", "out_of_sample": "../heldout.safetensors"},
        "variants": ["full", "frequency@16"],
        "coact_calibration": "coact/calib-copy.safetensors",
        "blocks": [
            {"policies": ["lru", "belady"], "cap": [8], "batch": [null, 2, 1000000]},
            {"policies": ["lru"], "cap": [0], "pin": ["pins/hot8.json"]},
            {"policies": ["lru", "fifo"], "cap": [4], "pin": [null, "pins/hot8.json"], "tier2": [null, "lru:12"]},
            {"policies": ["lru"], "cap": [8], "pin": ["pins/hot8.json"], "batch": [4]},
            {"policies": ["lru"], "cap": [8],
             "prefetch": ["none", "prev_token:2", "coact:2", "oracle:2", "prev_token:0"], "shuffle": [null, 7]}
        ],
        "profiles": ["reference",
                     {"name": "box", "expert_mb": 17.3, "compute_ms": 20.0, "bandwidth_gbps": [3.9],
                      "link_gbps": 25.0, "compute_ms_per_step": 30.0}]
    });
    std::fs::write(grids.join("every.json"), serde_json::to_vec_pretty(&grid).unwrap()).unwrap();
    let g = sweep::Grid::read(&grids.join("every.json")).unwrap();
    run_sweep(&grids, &g, &root.join("out/every"));
    // Hybrid execution (§14): its rows need host fields in every profile, so a sweep of its own.
    let grid = json!({
        "traces": {"in_sample": "../calib.safetensors", "out_of_sample": "../heldout.safetensors"},
        "variants": ["full", "frequency@16"],
        "blocks": [
            {"policies": ["lru"], "cap": [0], "pin": [null, "pins/hot8.json"], "exec": ["host"],
             "overlap": ["sequential", "concurrent"]},
            {"policies": ["lru"], "cap": [4], "exec": ["host"]},
            {"policies": ["lru"], "cap": [0], "batch": [null, 4], "exec": ["host:3"]}
        ],
        "profiles": [{"name": "box", "expert_mb": 17.3, "compute_ms": 20.0, "bandwidth_gbps": [3.9, 6.8],
                      "link_gbps": 25.0, "host_gbps": 40.0, "host_ms_per_row": 0.035, "host_sync_ms": 0.05}]
    });
    std::fs::write(grids.join("hybrid.json"), serde_json::to_vec_pretty(&grid).unwrap()).unwrap();
    let g = sweep::Grid::read(&grids.join("hybrid.json")).unwrap();
    run_sweep(&grids, &g, &root.join("out/hybrid"));
}

fn every() -> Every {
    static TEMPLATE: OnceLock<tempfile::TempDir> = OnceLock::new();
    let t = TEMPLATE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        build(dir.path());
        dir
    });
    let dir = tempfile::tempdir().unwrap();
    copy_dir(t.path(), dir.path());
    // As `moe-offload sweep grids/every.json` records it: the grid's directory, absolute (this copy's).
    let grids = dir.path().join("grids").display().to_string();
    for sweep in ["every", "hybrid"] {
        let results = dir.path().join(format!("out/{sweep}/results.json"));
        edit_json(&results, |v| v["provenance"]["grid_dir"] = json!(grids));
    }
    Every { dir }
}

impl Every {
    fn results(&self) -> std::path::PathBuf {
        self.dir.path().join("out/every/results.json")
    }

    fn audit(&self) -> Report {
        audit_dir(&self.dir.path().join("out"), &Options::default()).unwrap()
    }

    /// Edits (with `edit`) the first in-sample row of the `every` sweep whose key ends with
    /// `suffix`; returns its key.
    fn lie(&self, suffix: &str, edit: impl Fn(&mut Value)) -> String {
        self.lie_in("every", suffix, edit)
    }

    /// [`Every::lie`] in the sweep `out/SWEEP`.
    fn lie_in(&self, sweep: &str, suffix: &str, edit: impl Fn(&mut Value)) -> String {
        let mut key = String::new();
        edit_json(&self.dir.path().join(format!("out/{sweep}/results.json")), |v| {
            let row = v["rows"]
                .as_array_mut()
                .unwrap()
                .iter_mut()
                .find(|r| r["key"].as_str().unwrap().ends_with(suffix) && r["sample"] == "in_sample")
                .unwrap_or_else(|| panic!("no row ending with {suffix}"));
            key = row["key"].as_str().unwrap().to_string();
            edit(row);
        });
        key
    }
}

const DERIVED: &str = "every/results.json: derived fields follow from the counts";
const REPLAYED: &str = "every/results.json: rows replayed by the reference replayer, every count equal";

fn first_of<'r>(r: &'r Report, name: &str) -> &'r str {
    let c = r.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}"));
    assert_eq!(c.status, Status::Fail, "{name}");
    c.first_offending.as_deref().unwrap()
}

#[test]
fn a_sweep_with_every_axis_audits_clean() {
    let e = every();
    // Without the grid's directory the pin map (grids/pins/hot8.json) cannot be found: by file
    // name it is nowhere near the outputs, and the working directory is not the grid's.
    edit_json(&e.results(), |v| v["provenance"].as_object_mut().unwrap().remove("grid_dir").map(drop).unwrap());
    let r = e.audit();
    let c = r.checks.iter().find(|c| c.name == "every/results.json: rows replayed").unwrap();
    assert!(c.first_offending.as_deref().unwrap().contains("pin map pins/hot8.json not found"), "{c:?}");
    let e = every();
    let r = e.audit();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let c = r.checks.iter().find(|c| c.name == REPLAYED).unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(e.results()).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(c.figures["replayed"], json!(rows.len()));
    // Every kind of row is there: cap 0, tier 2, batches, prefetch with and without loads, shuffled.
    for part in ["/0/4/pin:hot8", "/t2:lru:12", "/batch:1000000", "/pin:hot8/batch:4", "/pf:coact:2", "/shuffle:7"] {
        assert!(rows.iter().any(|r| r["key"].as_str().unwrap().contains(part)), "{part}");
    }
    // A prefetch row of the pruned map has forced misses: its cost is the timeline's, which the
    // audit re-derived, not §6's.
    let pf = rows.iter().find(|r| r["key"] == "frequency@16/lru/0/0/8/4/pf:prev_token:2").unwrap();
    assert!(pf["counts"]["forced_misses"].as_u64().unwrap() > 0);
    assert_eq!(pf["cost"][0]["tok_s"], pf["prefetch"]["timeline"][0]["tok_s"]);
    let none = rows.iter().find(|r| r["key"] == "full/lru/0/0/8/4/pf:prev_token:0").unwrap();
    assert_eq!(none["prefetch"]["precision"], Value::Null);
}

/// A consistent lie (counts and their derived figures edited together) in a row of each kind is
/// caught by the reference replay of that kind; an inconsistent one by the derived fields,
/// naming the figure.
#[test]
fn a_lie_in_each_kind_of_row_fails_naming_the_figure() {
    let consistent = |suffix: &str, field: &str, expect: &str| {
        let e = every();
        let key = e.lie(suffix, |row| {
            let d = &mut row["deploy"];
            let x = d[field].as_u64().unwrap();
            d[field] = json!(x + 1);
        });
        let r = e.audit();
        let first = first_of(&r, REPLAYED);
        assert!(first.contains(&format!("row {key} (in_sample): {expect}")), "{first}");
    };
    consistent("/0/4/pin:hot8", "pinned_hits", "deploy.pinned_hits is ");
    consistent("/4/4/t2:lru:12", "t2_hits", "deploy.t2_hits is ");
    consistent("/batch:2", "steps", "deploy.steps is ");

    // Prefetch: a wasted load turned useful, and the precision to match: the replay names it.
    // (coact, for the oracle wastes no load.)
    let e = every();
    let key = e.lie("/pf:coact:2", |row| {
        let f = &mut row["prefetch"];
        let (u, w) = (f["useful"].as_u64().unwrap(), f["wasted"].as_u64().unwrap());
        f["useful"] = json!(u + 1);
        f["wasted"] = json!(w - 1);
        let loads = f["prefetch_loads"].as_u64().unwrap() as f64;
        f["precision"] = json!((u + 1) as f64 / loads);
        let c = f["coverage"].as_f64().unwrap();
        f["coverage"] = json!(c);
    });
    let r = e.audit();
    assert!(first_of(&r, REPLAYED).contains(&format!("row {key} (in_sample): prefetch.useful is ")));
    // (the coverage no longer follows from useful: named by the derived check)
    assert!(first_of(&r, DERIVED).contains("prefetch.coverage is "), "{}", first_of(&r, DERIVED));

    // A timeline figure, consistently in the cost and the timeline: only the replay sees it.
    let e = every();
    let key = e.lie("/pf:coact:2", |row| {
        let t = row["prefetch"]["timeline"][2]["tok_s"].as_f64().unwrap() * 1.01;
        row["prefetch"]["timeline"][2]["tok_s"] = json!(t);
        row["cost"][2]["tok_s"] = json!(t);
    });
    let r = e.audit();
    assert!(r.checks.iter().find(|c| c.name == DERIVED).is_some_and(|c| c.status == Status::Pass));
    assert!(first_of(&r, REPLAYED).contains(&format!("row {key} (in_sample): prefetch.timeline[2].tok_s is ")));

    // The derived figures of each kind, by their own model.
    let check = |suffix: &str, edit: &dyn Fn(&mut Value), expect: &str| {
        let e = every();
        let key = e.lie(suffix, edit);
        let r = e.audit();
        let first = first_of(&r, DERIVED);
        assert!(first.starts_with(&format!("{key} (in_sample): {expect}")), "{first}");
    };
    let scale = |field: &'static str, i: usize| {
        move |row: &mut Value| {
            let x = row["cost"][i][field].as_f64().unwrap();
            row["cost"][i][field] = json!(x * 1.001);
        }
    };
    check("/t2:lru:12", &scale("tok_s", 2), "cost[2].tok_s is ");
    check("/batch:4", &scale("tok_s", 0), "cost[0].tok_s is ");
    check("/pf:prev_token:2", &scale("ssd_mb_per_token", 1), "cost[1].ssd_mb_per_token is ");
    check("/pf:prev_token:0", &|row| row["prefetch"]["precision"] = json!(0.0), "prefetch.precision is Some(0.0)");
    check("/batch:2", &|row| row["deploy"]["loads_per_step"] = json!(0.5), "deploy.loads_per_step is 0.5");
}

const HYBRID_DERIVED: &str = "hybrid/results.json: derived fields follow from the counts";
const HYBRID_REPLAYED: &str = "hybrid/results.json: rows replayed by the reference replayer, every count equal";

/// Hybrid rows (§14: host, host:R, pins, cap 0 and a cache, re-batched, both overlaps) audit
/// clean; a consistent lie in their events or their tok/s is caught by the reference hybrid
/// replay, an inconsistent one by the derived fields, each naming the figure.
#[test]
fn hybrid_rows_audit_clean_and_a_lie_names_its_figure() {
    let e = every();
    let r = e.audit();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let v: Value =
        serde_json::from_str(&std::fs::read_to_string(e.dir.path().join("out/hybrid/results.json")).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let c = r.checks.iter().find(|c| c.name == HYBRID_REPLAYED).unwrap();
    assert_eq!(c.figures["replayed"], json!(rows.len()));
    for part in ["/0/4/exec:host/overlap:concurrent", "/pin:hot8/exec:host/overlap:sequential", "/4/4/exec:host"] {
        assert!(rows.iter().any(|r| r["key"].as_str().unwrap().ends_with(part)), "{part}");
    }
    assert!(rows.iter().any(|r| r["key"].as_str().unwrap().contains("/batch:4/exec:host:3")));

    // One host run moved to a load: host_runs + loads still equal the misses, only the replay sees it.
    let e = every();
    let key = e.lie_in("hybrid", "/pin:hot8/exec:host/overlap:sequential", |row| {
        let h = &mut row["hybrid"];
        let (runs, loads) = (h["host_runs"].as_u64().unwrap(), h["loads"].as_u64().unwrap());
        h["host_runs"] = json!(runs - 1);
        h["loads"] = json!(loads + 1);
    });
    let r = e.audit();
    assert!(r.checks.iter().find(|c| c.name == HYBRID_DERIVED).is_some_and(|c| c.status == Status::Pass));
    let first = first_of(&r, HYBRID_REPLAYED);
    assert!(first.contains(&format!("row {key} (in_sample): hybrid.host_runs is ")), "{first}");

    // tok/s raised consistently in the cost entries and hybrid.cost: the replay names it.
    let e = every();
    let key = e.lie_in("hybrid", "/4/4/exec:host", |row| {
        let t = row["hybrid"]["cost"][0]["tok_s"].as_f64().unwrap() * 1.01;
        row["hybrid"]["cost"][0]["tok_s"] = json!(t);
        row["cost"][0]["tok_s"] = json!(t);
        row["cost"][1]["tok_s"] = json!(t);
    });
    let r = e.audit();
    assert!(r.checks.iter().find(|c| c.name == HYBRID_DERIVED).is_some_and(|c| c.status == Status::Pass));
    let first = first_of(&r, HYBRID_REPLAYED);
    assert!(first.contains(&format!("row {key} (in_sample): hybrid.cost[0].tok_s (box) is ")), "{first}");

    // Inconsistent: a cost entry that is not the profile's hybrid tok/s, or host runs that are
    // not the misses.
    let e = every();
    let key = e.lie_in("hybrid", "/batch:4/exec:host:3", |row| {
        let t = row["cost"][1]["tok_s"].as_f64().unwrap();
        row["cost"][1]["tok_s"] = json!(t * 1.001);
    });
    let first = first_of(&e.audit(), HYBRID_DERIVED).to_string();
    assert!(first.starts_with(&format!("{key} (in_sample): cost[1].tok_s is ")), "{first}");
    let e = every();
    let key = e.lie_in("hybrid", "/0/4/exec:host/overlap:concurrent", |row| {
        let runs = row["hybrid"]["host_runs"].as_u64().unwrap();
        row["hybrid"]["host_runs"] = json!(runs + 1);
    });
    let first = first_of(&e.audit(), HYBRID_DERIVED).to_string();
    assert!(first.starts_with(&format!("{key} (in_sample): hybrid.host_runs + loads = ")), "{first}");
}
