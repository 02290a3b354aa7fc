//! Every output right on every axis (issue 39): bounded work for huge batches, closed pipes,
//! outputs written as a set, `-o -`, the version, the "Next:" hint on the real data.

mod common;

use std::io::Read as _;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{fails, json, ok, ok_in, s, synth};

/// B far above the number of sequences is B = sequences: the same counts, and no memory per B
/// (the old code allocated a slot per B and grew to gigabytes).
#[test]
fn huge_batch_is_the_batch_of_every_sequence() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &["--sequences", "8"]);
    let t = s(&trace);
    let replay = |b: &str| json(&["replay", t, "--policy", "lru", "--cap", "4", "--batch", b, "--json"]);
    let eight = replay("8");
    let seven = replay("7");
    for b in ["9", "1000000000", "18446744073709551615"] {
        let huge = replay(b);
        for key in ["tokens", "picks", "hits", "misses", "steps", "rows", "layer_misses"] {
            assert_eq!(huge[key], eight[key], "batch {b}: {key}");
        }
    }
    // B = 7 < 8 sequences is another schedule: the check above can fail.
    assert_ne!(seven["steps"], eight["steps"]);
    // A grid with a huge batch: the rows equal those of B = 8.
    let grid = dir.path().join("grid.json");
    let text = format!(
        r#"{{"traces": {{"in_sample": "{t}", "out_of_sample": "{t}"}}, "variants": ["full"],
            "blocks": [{{"policies": ["lru"], "cap": [4], "batch": [8, 1000000000]}}]}}"#
    );
    std::fs::write(&grid, text).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&grid), "-o", s(&out)]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("results.json")).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let of = |suffix: &str| rows.iter().find(|r| r["key"].as_str().unwrap().ends_with(suffix)).unwrap();
    assert_eq!(of("/batch:8")["counts"], of("/batch:1000000000")["counts"]);
    assert_eq!(of("/batch:8")["counts"]["misses"], eight["misses"]);
}

/// Runs `args` with standard output a pipe whose reading end is closed before the command
/// writes: the command must end with status 0 (a closed pipe is not an error).
fn exit_on_closed_pipe(args: &[&str], cwd: &Path) -> std::process::ExitStatus {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moe-offload"))
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut err = String::new();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{args:?}: {status}: {err}");
    status
}

#[test]
fn a_closed_pipe_is_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &[]);
    let t = s(&trace);
    exit_on_closed_pipe(&["mrc", t, "-o", "m.json", "--json"], dir.path());
    exit_on_closed_pipe(&["sweep", "-o", "sw", "--json"], dir.path());
    exit_on_closed_pipe(&["replay", t, "--policy", "lru", "--cap", "4", "--json"], dir.path());
    exit_on_closed_pipe(&["inspect", t, "--json"], dir.path());
}

/// `mrc -o m.json` writes m.json and m.csv as one output: when the CSV cannot be written, the
/// JSON is not written either (the old code left m.json without m.csv).
#[test]
fn mrc_writes_its_json_and_csv_together() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &[]);
    std::fs::create_dir(dir.path().join("m.csv")).unwrap();
    let err = fails(&["mrc", s(&trace), "-o", s(&dir.path().join("m.json"))]);
    assert!(err.contains("m.csv is a directory"), "{err}");
    assert!(!dir.path().join("m.json").exists());
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|n| !n.starts_with(trace_io::TEMP_PREFIX)), "{names:?}");
    std::fs::remove_dir(dir.path().join("m.csv")).unwrap();
    ok_in(dir.path(), &["mrc", s(&trace), "-o", "m.json"]);
    assert!(dir.path().join("m.json").is_file() && dir.path().join("m.csv").is_file());
}

/// `stats -o -` and `keep -o -`: the same bytes as the file, on standard output, and the status
/// line on standard error.
#[test]
fn stats_and_keep_write_to_standard_output() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 400], &["--norms"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let stdout = ok(&["stats", s(&trace), "-o", "-"]);
    assert_eq!(stdout, std::fs::read_to_string(&stats).unwrap());
    let keep = dir.path().join("keep.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", s(&keep)]);
    let stdout = ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", "-"]);
    assert_eq!(stdout, std::fs::read_to_string(&keep).unwrap());
    // Several maps cannot share standard output.
    let err = fails(&["keep", s(&stats), "--metric", "frequency", "--k", "4,8", "-o", "-"]);
    assert!(err.contains("-o -: one keep map"), "{err}");
}

/// `--version` prints the workspace's version (not the `0.0.0` of an unversioned crate).
#[test]
fn the_version_is_the_workspace_version() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.toml")).unwrap();
    let package = manifest.split("[workspace.package]").nth(1).unwrap();
    let line = package.lines().find(|l| l.trim_start().starts_with("version")).unwrap();
    let version = line.split('"').nth(1).unwrap();
    assert_ne!(version, "0.0.0");
    let out = ok(&["--version"]);
    assert!(out.starts_with(&format!("moe-offload {version} (commit ")), "{out}");
}

/// The "Next:" command the default sweep prints runs as printed on every shipped real trace
/// (it suggested a grid whose reap variants need output norms, which no real trace has).
#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn the_next_hint_runs_on_every_real_trace() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    let out = ok_in(dir.path(), &["sweep", "-o", "default-sweep"]);
    let next = out.lines().find(|l| l.starts_with("Next:")).expect("a Next: line");
    let sweep_cmd = next.split('`').find(|c| c.starts_with("moe-offload sweep")).expect("a sweep command");
    let p = |n: &str| dir.path().join(n).display().to_string();
    let esft = real.join("esft-dsv2lite");
    ok(&["import", "esft", s(&esft), "--domains", "law", "-o", &p("law.safetensors")]);
    ok(&["import", "esft", s(&esft), "--domains", "translation", "-o", &p("translation.safetensors")]);
    let qwen = real.join("vllm-routelog-qwen15moe");
    let mut args = vec!["import".to_string(), "vllm-routelog".to_string()];
    args.extend([0, 8, 12, 18, 23].iter().map(|l| qwen.join(format!("moe_layer{l}.jsonl")).display().to_string()));
    args.extend(["--num-experts", "60", "-o", &p("qwen.safetensors")].map(String::from));
    ok(&common::refs(&args));
    let mixtral = real.join("mixtral-decode/gsm8k_2_routing.jsonl");
    ok(&["import", "mixtral-jsonl", s(&mixtral), "-o", &p("mixtral.safetensors")]);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (yours, heldout) in [("law", "translation"), ("qwen", "qwen"), ("mixtral", "mixtral")]
        .map(|(a, b)| (p(&format!("{a}.safetensors")), p(&format!("{b}.safetensors"))))
    {
        let cmd = sweep_cmd
            .replace("YOURS.safetensors", &yours)
            .replace("HELDOUT.safetensors", &heldout)
            .replace("DIR", &p(&format!("sweep-{}", Path::new(&yours).file_stem().unwrap().to_string_lossy())));
        let words: Vec<&str> = cmd.split_whitespace().skip(1).collect();
        ok_in(&repo, &words);
    }
}
