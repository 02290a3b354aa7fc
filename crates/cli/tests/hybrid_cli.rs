//! `replay --exec host` (SEMANTICS.md §14): the JSON fields against hand-computed costs, the
//! profile file, every refusal with its reason.

mod common;

use std::path::Path;

use common::{fails, json, ok, s, synth};

/// A profile file: 10 MB experts, 2 ms dense compute per token, host 10 GB/s (1 ms per host
/// run), a 10 GB/s link (1 ms per load or copy).
fn profile_file(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("hw.json");
    let body = r#"{"expert_mb": 10, "compute_ms": 2, "host_gbps": 10, "link_gbps": 10, "gpu_gb": 8}"#;
    std::fs::write(&p, body).unwrap();
    p
}

#[test]
fn all_cpu_costs_by_hand() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 300], &[]);
    let hw = profile_file(dir.path());
    let base = ["replay", s(&trace), "--policy", "lru", "--cap", "0", "--exec", "host", "--profile-file", s(&hw)];
    let seq = json(&[&base[..], &["--json"]].concat());
    // 236 counted tokens, 2 layers, top-2: every pick a host run, nothing moves.
    assert_eq!(seq["picks"], 236 * 4);
    assert_eq!(
        (seq["host_runs"].as_u64(), seq["loads"].as_u64(), seq["copies"].as_u64()),
        (Some(944), Some(0), Some(0))
    );
    assert_eq!(seq["exec"], "host");
    let c = &seq["cost"];
    assert_eq!((c["profile"].as_str(), c["overlap"].as_str()), (Some("hw"), Some("sequential")));
    // Per token: g = 2 ms (1 ms per layer), h = 2 runs · 1 ms per layer: 6 ms, 166.67 tok/s.
    let close = |v: &serde_json::Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-9 * x.max(1.0);
    assert!(close(&c["tok_s"], 1000.0 / 6.0), "{c}");
    assert!(close(&c["host_s_per_row"], 0.004) && close(&c["gpu_s_per_row"], 0.002), "{c}");
    // Concurrent: each layer max(1 ms, 2 ms) = 2 ms: 4 ms, 250 tok/s.
    let conc = json(&[&base[..], &["--overlap", "concurrent", "--json"]].concat());
    assert!(close(&conc["cost"]["tok_s"], 250.0), "{}", conc["cost"]);
    // A per-row host cost of 3 ms beats the 1 ms memory bound: h = 6 ms per layer, 14 ms.
    let slow = json(&[&base[..], &["--host-ms-per-row", "3", "--json"]].concat());
    assert!(close(&slow["cost"]["tok_s"], 1000.0 / 14.0), "{}", slow["cost"]);
    // A step's dense compute of 4 ms replaces compute_ms · rows (SEMANTICS.md §14: c_s): 4 + 4 ms,
    // 125 tok/s. Accepted with --exec host alone, as Python's compute_ms_per_step is (api::replay).
    let step = json(&[&base[..], &["--compute-ms-per-step", "4", "--json"]].concat());
    assert!(close(&step["cost"]["tok_s"], 125.0), "{}", step["cost"]);
    // The table says the same.
    let table = ok(&base);
    assert!(
        table.contains("exec host (sequential), profile hw: host runs 944, loads 0, copies 0; 166.667 tok/s"),
        "{table}"
    );
}

#[test]
fn pins_caches_and_batches() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &["--sequences", "8"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let pin = dir.path().join("pin.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", s(&pin)]);
    let hw = profile_file(dir.path());
    let t = s(&trace);
    let run = |extra: &[&str]| {
        let base = ["replay", t, "--policy", "lru", "--profile-file", s(&hw), "--json"];
        json(&[&base[..], extra].concat())
    };
    // Static placement: every unpinned pick runs on the host.
    let p = run(&["--cap", "0", "--pin", s(&pin), "--exec", "host"]);
    let u = |k: &str| p[k].as_u64().unwrap();
    assert_eq!(u("host_runs"), u("picks") - u("pinned_hits") - u("forced_misses"));
    assert!(u("pinned_hits") > 0);
    // The all-CPU baseline is slower than pinning 4 per layer.
    let floor = run(&["--cap", "0", "--exec", "host"]);
    assert!(floor["cost"]["tok_s"].as_f64() < p["cost"]["tok_s"].as_f64());
    // A dynamic cache: the counts are the transfer replay's, every miss a host run and a copy.
    let cached = run(&["--cap", "4", "--exec", "host"]);
    let transfer = run(&["--cap", "4"]);
    for key in ["hits", "misses", "picks", "layer_misses"] {
        assert_eq!(cached[key], transfer[key], "{key}");
    }
    assert_eq!(cached["copies"], cached["misses"]);
    assert_eq!(cached["host_runs"], cached["misses"]);
    // Re-batched by 3 (8 sequences of 50): steps of 3 rows transfer, the 2-row tail runs on the host.
    let b = run(&["--cap", "0", "--batch", "3", "--exec", "host:3"]);
    let ub = |k: &str| b[k].as_u64().unwrap();
    assert!(ub("loads") > 0 && ub("host_runs") > 0, "{b}");
    assert_eq!(ub("loads") + ub("host_runs") + ub("forced_misses"), ub("misses"));
    assert_eq!(b["schedule"], "batch:3");
}

#[test]
fn refusals_say_why() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [1, 8, 2, 4, 100], &[]);
    let hw = profile_file(dir.path());
    let bad_field = dir.path().join("bad.json");
    std::fs::write(&bad_field, r#"{"expert_mb": 10, "compute_ms": 2, "host_gbs": 10}"#).unwrap();
    let no_host = dir.path().join("nohost.json");
    std::fs::write(&no_host, r#"{"expert_mb": 10, "compute_ms": 2}"#).unwrap();
    let negative = dir.path().join("neg.json");
    std::fs::write(&negative, r#"{"expert_mb": 10, "compute_ms": 2, "host_gbps": -1}"#).unwrap();
    let zero = dir.path().join("zero.json");
    std::fs::write(&zero, r#"{"expert_mb": 10, "compute_ms": 0, "host_gbps": 10}"#).unwrap();
    let t = s(&trace);
    let cases: &[(&[&str], &str)] = &[
        (&["--cap", "2", "--exec", "host", "--tier2", "lru:4", "--profile-file", s(&hw)], "no second tier"),
        (
            &["--cap", "2", "--exec", "host", "--prefetch", "oracle:1", "--profile-file", s(&hw)],
            "--prefetch with --exec host",
        ),
        (&["--cap", "2", "--exec", "host:32", "--profile-file", s(&hw)], "needs cap = 0"),
        (&["--cap", "2", "--overlap", "concurrent"], "add --exec host"),
        (&["--cap", "2", "--host-gbps", "40"], "--host-gbps prices hybrid execution"),
        (&["--cap", "0", "--exec", "host"], "profile \"reference\": host_gbps: missing"),
        (&["--cap", "0", "--exec", "host", "--profile-file", s(&zero)], "compute_ms"),
        (&["--cap", "2", "--exec", "host", "--shuffle", "1", "--profile-file", s(&hw)], "--shuffle with --exec host"),
        (
            &["--cap", "2", "--exec", "host", "--semantics", "sequential", "--profile-file", s(&hw)],
            "sequential with exec host",
        ),
        (&["--cap", "0", "--exec", "host", "--profile-file", s(&no_host)], "give --host-gbps, or a --profile-file"),
        (&["--cap", "0", "--exec", "host", "--profile-file", s(&bad_field)], "unknown field `host_gbs`"),
        (&["--cap", "0", "--exec", "host", "--profile-file", s(&negative)], "host_gbps"),
        (&["--cap", "2", "--exec", "host", "--host-gbps", "40"], "give --link-gbps"),
        (&["--cap", "0", "--exec", "gpu"], "expected one of: transfer, host, host:R"),
        (&["--cap", "0", "--exec", "host", "--host-gbps", "0"], "not > 0"),
        (&["--cap", "0", "--exec", "host", "--profile", "reference", "--profile-file", s(&hw)], "cannot be used"),
    ];
    for (extra, expect) in cases {
        let args = [&["replay", t, "--policy", "lru"][..], extra].concat();
        let err = fails(&args);
        assert!(err.contains(expect), "{extra:?}: expected {expect:?} in: {err}");
    }
    // The link flag is accepted with exec host (the copies' link), and prices them.
    let out = json(&[
        "replay",
        t,
        "--policy",
        "lru",
        "--cap",
        "2",
        "--exec",
        "host",
        "--host-gbps",
        "40",
        "--link-gbps",
        "20",
        "--json",
    ]);
    assert!(out["cost"]["link_s_per_row"].as_f64().unwrap() > 0.0);
    // --exec transfer changes nothing: the same JSON as without it.
    let plain = ok(&["replay", t, "--policy", "lru", "--cap", "2", "--json"]);
    assert_eq!(ok(&["replay", t, "--policy", "lru", "--cap", "2", "--exec", "transfer", "--json"]), plain);
}

/// Hostile profile values (issue #55) through every command that reads a profile: refused by the
/// one rule (`DeviceProfile::check`) with the profile, field, value and range, exit status 1; a
/// sweep of every hybrid axis never gets to the replays (before the rule: exit 101 after them).
#[test]
fn hostile_profiles_are_refused_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (c, h) = (d.join("c.safetensors"), d.join("h.safetensors"));
    synth(&c, [2, 16, 2, 4, 200], &["--seed", "1"]);
    synth(&h, [2, 16, 2, 4, 150], &["--seed", "2"]);
    let valid = r#"{"expert_mb": 2, "compute_ms": 10, "bandwidth_gbps": [3.9], "link_gbps": 8, "host_gbps": 4,
        "host_ms_per_row": 0.1, "host_sync_ms": 0.2, "gpu_gb": 1}"#;
    let with = |field: &str, value: &str| {
        let mut p: serde_json::Value = serde_json::from_str(valid).unwrap();
        p[field] = serde_json::from_str(value).unwrap();
        p
    };
    let blocks = r#"[{"policies": ["lru"], "cap": [0, 8], "exec": ["transfer", "host"],
        "overlap": ["sequential", "concurrent"]}, {"policies": ["lru"], "cap": [0], "batch": [8], "exec": ["host:4"]}]"#;
    let (cs, hs) = (s(&c), s(&h));
    let hw = d.join("hw.json");
    let planned = d.join("plan.json");
    let plan = [
        "plan",
        "--exec",
        "host",
        "--in-sample",
        cs,
        "--out-of-sample",
        hs,
        "--profile-file",
        s(&hw),
        "-o",
        s(&planned),
    ];
    let replay = ["replay", cs, "--policy", "lru", "--cap", "0", "--exec", "host", "--profile-file", s(&hw)];
    let (grid, out) = (d.join("grid.json"), d.join("out"));
    let sweep = ["sweep", s(&grid), "-o", s(&out), "--yes"];
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("host_gbps", "0", &sweep, "profile \"hw\": host_gbps: 0 must be a finite bandwidth of at least 1e-6 GB/s"),
        ("link_gbps", "0", &sweep, "profile \"hw\": link_gbps: 0 must be"),
        ("compute_ms", "0", &sweep, "profile \"hw\": compute_ms: 0 must be finite, > 0"),
        ("expert_mb", "1.7e308", &sweep, "profile \"hw\": expert_mb: 1.7e308 must be"),
        ("expert_mb", "0", &plan, "profile \"hw\": expert_mb: 0 must be"),
        ("compute_ms", "0", &plan, "profile \"hw\": compute_ms: 0 must be"),
        ("host_gbps", "1e-300", &replay, "profile \"hw\": host_gbps: 1e-300 must be"),
        ("gpu_gb", "-1", &plan, "profile \"hw\": gpu_gb: -1 must be finite and >= 0 GB"),
    ];
    for &(field, value, args, expect) in cases {
        let p = with(field, value);
        std::fs::write(&hw, p.to_string()).unwrap();
        let mut named = p.clone();
        named["name"] = "hw".into();
        let g = format!(
            r#"{{"traces": {{"in_sample": {cs:?}, "out_of_sample": {hs:?}}}, "variants": ["full"], "warmup": 0,
                "profiles": [{named}], "blocks": {blocks}}}"#
        );
        std::fs::write(&grid, g).unwrap();
        let run = common::run(args);
        let err = String::from_utf8_lossy(&run.stderr);
        assert_eq!(run.status.code(), Some(1), "{field} = {value} {args:?}: {err}");
        assert!(err.contains(expect), "{field} = {value} {args:?}: expected {expect:?} in: {err}");
    }
    // A flag that overrides a field is named beside the profile.
    std::fs::write(&hw, valid).unwrap();
    let err = fails(&[&replay[..], &["--host-sync-ms", "1e300"]].concat());
    assert!(err.contains("host_sync_ms: 1e300 must be") && err.contains("--host-sync-ms gives it"), "{err}");
    // The valid profile runs the same grid.
    let named = with("name", "\"hw\"");
    let g = format!(
        r#"{{"traces": {{"in_sample": {cs:?}, "out_of_sample": {hs:?}}}, "variants": ["full"], "warmup": 0,
            "profiles": [{named}], "blocks": {blocks}}}"#
    );
    std::fs::write(&grid, g).unwrap();
    ok(&sweep);
}
