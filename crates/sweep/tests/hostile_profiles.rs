//! Hostile device profiles (issue #55): every field out of its range is refused by the one rule,
//! `DeviceProfile::check`, with the same message from a grid (by `prepare`, before any replay)
//! and from a profile file (`DeviceProfile::read`, what `--profile-file`, `plan` and Python read).
//! Before the rule, the grid rows below either panicked after the replays ("checked by
//! prepare", exit 101) or ran and printed meaningless figures.

mod common;

use common::{input, traces};
use sweep::{DeviceProfile, Grid, prepare};

/// A valid profile with every field; each row replaces one.
const BASE: &str = r#"{"name": "hw", "expert_mb": 2.0, "compute_ms": 10.0, "bandwidth_gbps": [3.9],
  "link_gbps": 8.0, "host_gbps": 4.0, "host_ms_per_row": 0.1, "host_sync_ms": 0.2, "gpu_gb": 8.0}"#;

/// Every hybrid axis: transfer and host, static and cached, both overlaps, host:R on batches.
const ALL: &str = r#"[
  {"policies": ["lru"], "cap": [0, 8], "exec": ["transfer", "host"], "overlap": ["sequential", "concurrent"]},
  {"policies": ["lru"], "cap": [0], "batch": [8], "exec": ["host", "host:4"]}
]"#;
/// Static placement: nothing loads or copies.
const HOST0: &str = r#"[{"policies": ["lru"], "cap": [0], "exec": ["host"]}]"#;
/// A cache filled by background copies.
const HOST8: &str = r#"[{"policies": ["lru"], "cap": [8], "exec": ["host"]}]"#;
/// No hybrid axis at all.
const TRANSFER: &str = r#"[{"policies": ["lru"], "cap": [4]}]"#;

/// `BASE` with `field` set to the JSON number `value`.
fn profile(field: &str, value: &str) -> serde_json::Value {
    let mut p: serde_json::Value = serde_json::from_str(BASE).unwrap();
    if !field.is_empty() {
        p[field] = serde_json::from_str(value).unwrap();
    }
    p
}

/// The profile with `field = value`, in a grid of `blocks` and in a profile file: `expect` is
/// `None` when both must run (the grid's rows priced with finite, positive tok/s), else a part of
/// the one message both must refuse it with (the grid before any replay).
fn check(field: &str, value: &str, blocks: &str, expect: Option<&str>) {
    let dir = tempfile::tempdir().unwrap();
    let p = profile(field, value);
    let text = format!(
        r#"{{"traces": {{"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"}},
            "variants": ["full"], "warmup": 0, "profiles": [{p}], "blocks": {blocks}}}"#
    );
    let row = format!("{field} = {value} with {blocks}");
    let (a, b) = traces(2);
    let grid = Grid::from_json(&text, dir.path()).unwrap_or_else(|e| panic!("{row}: {e}"));
    let grid = prepare(&grid, &input(&a, "a"), &input(&b, "b"));
    let mut file = p.clone();
    file.as_object_mut().unwrap().remove("name");
    let path = dir.path().join("hw.json");
    std::fs::write(&path, file.to_string()).unwrap();
    let read = DeviceProfile::read(&path);
    match (expect, grid) {
        (None, Ok(prepared)) => {
            let rows = prepared.run(&a.view(), &b.view(), &|_| {});
            assert!(!rows.is_empty(), "{row}");
            for r in &rows {
                assert!(r.cost.iter().all(|c| c.tok_s.is_finite() && c.tok_s > 0.0), "{row}: {:?}", r.cost);
            }
            read.unwrap_or_else(|e| panic!("{row}: the file is refused: {e}"));
        }
        (None, Err(e)) => panic!("{row}: refused: {e}"),
        (Some(_), Ok(_)) => panic!("{row}: the grid was accepted"),
        (Some(want), Err(e)) => {
            let (e, f) = (e.to_string(), read.err().unwrap_or_else(|| panic!("{row}: the file was accepted")));
            assert!(e.contains(want), "{row}: the grid says {e}, not {want}");
            assert!(f.to_string().contains(want), "{row}: the file says {f}, not {want}");
        }
    }
}

#[test]
fn hostile_profile_values_are_refused_by_one_rule() {
    const BW: &str = "must be a finite bandwidth of at least 1e-6 GB/s";
    let rows: &[(&str, &str, &str, Option<&str>)] = &[
        // A valid profile still runs, every axis priced.
        ("", "", ALL, None),
        ("host_gbps", "0", ALL, Some(BW)),
        ("host_gbps", "-1", ALL, Some(BW)),
        ("host_gbps", "1e-300", HOST0, Some(BW)),
        ("host_ms_per_row", "-1", ALL, Some("profile \"hw\": host_ms_per_row: -1 must be")),
        ("host_sync_ms", "-1", ALL, Some("profile \"hw\": host_sync_ms: -1 must be")),
        ("link_gbps", "0", HOST8, Some("profile \"hw\": link_gbps: 0 must be a finite bandwidth")),
        ("link_gbps", "-5", HOST0, Some("profile \"hw\": link_gbps: -5 must be a finite bandwidth")),
        ("link_gbps", "-5", TRANSFER, Some("profile \"hw\": link_gbps: -5 must be a finite bandwidth")),
        ("gpu_gb", "-1", TRANSFER, Some("profile \"hw\": gpu_gb: -1 must be finite and >= 0 GB")),
        ("compute_ms", "0", ALL, Some("profile \"hw\": compute_ms: 0 must be")),
        ("compute_ms_per_step", "-1", ALL, Some("profile \"hw\": compute_ms_per_step: -1 must be")),
        ("compute_ms_per_step", "0", ALL, Some("profile \"hw\": compute_ms_per_step: 0 must be")),
        ("expert_mb", "1.7e308", ALL, Some("profile \"hw\": expert_mb: 1.7e308 must be")),
        ("expert_mb", "1e300", HOST0, Some("must be a finite size > 0 and at most 1e6 MB")),
        ("expert_mb", "0", HOST0, Some("profile \"hw\": expert_mb: 0 must be")),
        ("host_ms_per_row", "1e300", ALL, Some("profile \"hw\": host_ms_per_row: 1e300 must be")),
        ("bandwidth_gbps", "[0]", TRANSFER, Some(BW)),
        // The ranges' edges are valid.
        ("host_gbps", "1e-6", ALL, None),
        ("expert_mb", "1e6", HOST0, None),
        ("host_ms_per_row", "0", ALL, None),
        ("gpu_gb", "0", TRANSFER, None),
    ];
    // Every row runs (a panic, as the replays' "checked by prepare" was, is a failed row), and
    // the failures are listed together.
    let failed: Vec<String> = rows
        .iter()
        .filter(|&&(field, value, blocks, expect)| {
            std::panic::catch_unwind(|| check(field, value, blocks, expect)).is_err()
        })
        .map(|(field, value, ..)| format!("{field} = {value}"))
        .collect();
    assert!(failed.is_empty(), "rows failed: {failed:?}");
}
