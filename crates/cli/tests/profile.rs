//! `moe-offload profile show`: every field of a preset or a profile file with its unit, the
//! figures derived from it, and refusals naming the profile or the field.

mod common;

use common::{fails, ok, s};

use serde_json::Value;

/// The example profiles of data/profiles/.
fn example(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/profiles").join(name)
}

#[test]
fn a_profile_file_shows_every_field_and_the_derived_times() {
    let file = example("laptop-16gb-ddr5.json");
    let v: Value = serde_json::from_str(&ok(&["profile", "show", "--file", s(&file), "--json"])).unwrap();
    assert_eq!(v["kind"], "moe-offload-profile");
    let p = &v["profile"];
    for (field, want) in [
        ("expert_mb", 17.301504),
        ("compute_ms", 12.0),
        ("link_gbps", 12.0),
        ("host_gbps", 40.0),
        ("host_ms_per_row", 0.06),
        ("host_sync_ms", 0.05),
        ("gpu_gb", 12.0),
    ] {
        assert_eq!(p[field].as_f64(), Some(want), "{field}");
    }
    assert_eq!(p["overlap"], "sequential");
    // absent optional fields are shown as null, not left out
    assert!(p["compute_ms_per_step"].is_null());
    // every field has a unit entry
    let units = v["units"].as_object().unwrap();
    assert_eq!(units.len(), p.as_object().unwrap().len());
    // 17.301504 MB / 40 GB/s = 0.4325376 ms; / 12 GB/s = 1.441792 ms; 0.4325376 / 0.06 = 7.20896 rows
    let d = &v["derived"];
    for (field, want) in
        [("host_ms_per_expert", 0.4325376), ("link_ms_per_expert", 1.441792), ("rows_memory_bound", 7.20896)]
    {
        assert!((d[field].as_f64().unwrap() - want).abs() < 1e-12, "{field}: {}", d[field]);
    }
}

#[test]
fn both_example_profiles_read_and_the_table_names_every_field() {
    for name in ["laptop-16gb-ddr5.json", "workstation-24gb-ddr5x8.json"] {
        let text = ok(&["profile", "show", "--file", s(&example(name))]);
        for field in ["expert_mb", "compute_ms", "host_gbps", "host_ms_per_row", "host_sync_ms", "overlap", "gpu_gb"] {
            assert!(text.contains(&format!("| {field} ")), "{name}: {field} missing:\n{text}");
        }
    }
    // A preset has no host fields: shown as "-", with what their absence means.
    let text = ok(&["profile", "show", "reference"]);
    assert!(text.contains("| 1.3824 "), "{text}");
    assert!(text.contains("none: exec host refused"), "{text}");
}

#[test]
fn bad_profiles_are_refused_by_name_or_field() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("hw.json");
    for (json, want) in [
        (r#"{"expert_mb": 1, "compute_ms": 1, "host_gbps": 0}"#, "profile \"hw\": host_gbps: 0 must be"),
        (r#"{"expert_mb": 1, "compute_ms": -2}"#, "compute_ms: -2 must be"),
        (r#"{"expert_mb": 1, "compute_ms": 1, "host_gpbs": 3}"#, "host_gpbs"),
        (r#"{"expert_mb": 1"#, "hw.json"),
    ] {
        std::fs::write(&f, json).unwrap();
        let err = fails(&["profile", "show", "--file", s(&f)]);
        assert!(err.contains(want), "{json}: {err}");
    }
    assert!(fails(&["profile", "show", "nope"]).contains("expected one of: dsv2-lite-bf16"));
    assert!(fails(&["profile", "show"]).contains("give a preset's name or --file FILE"));
}
