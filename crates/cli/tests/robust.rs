//! The run around the numbers (issue 21): whole output sets under a lock, kills and full disks that
//! leave no mix, traces that change or are not files, bounded and announced work, broken pipes,
//! and the inputs refused with a reason.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{fails, ok, run, s, synth};
use sweep::SweepOutput;
use trace_io::TEMP_PREFIX;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moe-offload"))
}

fn spawn(args: &[&str]) -> Child {
    bin().args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap()
}

/// Waits for `child` at most `secs` seconds; kills it and panics when it is still running.
fn wait_bounded(mut child: Child, secs: u64) -> (Option<i32>, String) {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(secs) {
            child.kill().unwrap();
            panic!("still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = child.wait_with_output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(TEMP_PREFIX))
        .collect()
}

/// Polls until a staging directory of process `pid` appears in `dir`.
fn wait_for_staging(dir: &Path, pid: u32) {
    let start = Instant::now();
    let prefix = format!("{TEMP_PREFIX}{pid}-");
    while !temporaries(dir).iter().any(|n| n.starts_with(&prefix)) {
        assert!(start.elapsed() < Duration::from_secs(20), "no staging directory of {pid} in {dir:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The set in `dir` is whole: the CSV and the summary are those of `results.json`'s rows.
/// Returns the grid's name.
fn whole_set(dir: &Path) -> String {
    let o = SweepOutput::read(&dir.join("results.json")).unwrap();
    assert_eq!(std::fs::read(dir.join("results.csv")).unwrap(), o.csv(), "results.csv of another run");
    assert_eq!(
        std::fs::read_to_string(dir.join("summary.md")).unwrap(),
        o.summary_markdown(),
        "summary of another run"
    );
    o.provenance.grid.name.clone()
}

/// A second grid over the embedded default traces (absolute paths): another name, one block.
fn small_grid(dir: &Path) -> PathBuf {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data").canonicalize().unwrap();
    let g = serde_json::json!({
        "name": "second grid",
        "traces": {
            "in_sample": data.join("default-calib.safetensors"),
            "out_of_sample": data.join("default-heldout.safetensors"),
        },
        "variants": ["full", "frequency@16"],
        "blocks": [{ "policies": ["lru", "lfu", "belady"], "cap": [4, 8, 12, 16] }],
    });
    let p = dir.join("second.json");
    std::fs::write(&p, g.to_string()).unwrap();
    p
}

#[test]
fn two_concurrent_sweeps_into_one_directory_one_fails_the_other_is_whole() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let first = spawn(&["sweep", "-o", s(&out)]);
    wait_for_staging(dir.path(), first.id());
    let second = run(&["sweep", s(&small_grid(dir.path())), "-o", s(&out)]);
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("is being written by another moe-offload process (pid {}", first.id())),
        "the second names the first: {err}"
    );
    let (code, err) = wait_bounded(first, 300);
    assert_eq!(code, Some(0), "{err}");
    assert!(whole_set(&out).starts_with("embedded default"));
    assert!(temporaries(dir.path()).is_empty());
}

#[test]
fn a_killed_sweep_leaves_no_mix_and_the_next_run_removes_its_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let second = small_grid(dir.path());
    // Kill points spread over the run (announcement, replay, writing), deterministic.
    for (i, delay_ms) in [30u64, 900, 250, 1400, 600, 1100, 5, 1700].into_iter().enumerate() {
        let args: Vec<&str> =
            if i % 2 == 0 { vec!["sweep", "-o", s(&out)] } else { vec!["sweep", s(&second), "-o", s(&out)] };
        let mut child = spawn(&args);
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        if out.join("results.json").exists() {
            whole_set(&out);
        } else {
            assert!(!out.join("results.csv").exists() && !out.join("summary.md").exists(), "part of a set");
        }
    }
    ok(&["sweep", s(&second), "-o", s(&out)]);
    assert_eq!(whole_set(&out), "second grid");
    assert_eq!(temporaries(dir.path()), Vec::<String>::new(), "stale temporaries left");
}

#[test]
fn ctrl_c_removes_the_staging_directory() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let child = spawn(&["sweep", "-o", s(&out)]);
    wait_for_staging(dir.path(), child.id());
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let (code, err) = wait_bounded(child, 60);
    if code == Some(0) {
        return; // the run ended before the signal arrived: nothing to check
    }
    assert_eq!(code, Some(130), "{err}");
    assert!(err.contains("interrupted: nothing written"), "{err}");
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
    assert!(!out.exists(), "the output directory this run created is left");
}

/// A tmpfs of `bytes` at `dir`, unmounted on drop (`None` when mounting is not permitted).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, bytes: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", s(dir)])
            .stderr(Stdio::null())
            .status()
            .ok()?;
        status.success().then(|| Tmpfs(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_file_system_between_files_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    ok(&["sweep", "-o", s(&probe)]);
    let json = std::fs::metadata(probe.join("results.json")).unwrap().len();
    let csv = std::fs::metadata(probe.join("results.csv")).unwrap().len();
    assert!(csv > 8192, "the CSV ({csv} bytes) must not fit in the slack");
    // Room for results.json and a little more, not for results.csv too.
    let size = (json.div_ceil(4096) + 1) * 4096;
    let mnt = dir.path().join("mnt");
    let Some(_fs) = Tmpfs::mount(&mnt, size) else {
        eprintln!(
            "note: mounting a tmpfs is not permitted here (needs root): the full-disk case is covered by \
                   trace-io's injected-failure test only"
        );
        return;
    };
    let err = fails(&["sweep", "-o", s(&mnt.join("out"))]);
    assert!(err.contains("No space left on device"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[test]
fn a_trace_truncated_during_a_replay_is_a_clear_error_with_status_1() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("big.safetensors");
    synth(&trace, [8, 64, 4, 8, 100_000], &[]);
    // One replay per cap: long enough to truncate the file while it runs.
    let mut child = spawn(&["mrc", s(&trace), "--policy", "lfu", "-o", s(&dir.path().join("mrc.json"))]);
    let mut stderr = child.stderr.take().unwrap();
    let mut first = [0u8; 5];
    stderr.read_exact(&mut first).unwrap(); // "mrc: " is printed once the trace is open
    std::fs::OpenOptions::new().write(true).open(&trace).unwrap().set_len(4096).unwrap();
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(1), "{rest}");
    assert!(
        rest.contains(&format!("error: {}: the trace file changed or was truncated while in use", trace.display())),
        "{rest}"
    );
    assert!(!dir.path().join("mrc.json").exists());
}

#[test]
fn a_fifo_given_as_a_trace_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("trace.safetensors");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    for args in [vec!["inspect", s(&fifo)], vec!["stats", s(&fifo), "-o", s(&dir.path().join("st.json"))]] {
        let (code, err) = wait_bounded(spawn(&args), 30);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("a FIFO (named pipe), not a regular file"), "{args:?}: {err}");
    }
}

#[test]
fn a_fifo_given_as_a_json_or_csv_input_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let trace = d.join("t.safetensors");
    synth(&trace, [2, 8, 2, 4, 64], &[]);
    let outs = ["k.json", "sweep", "c.json", "v.safetensors"].map(|n| d.join(n));
    let out = |name: &str| outs.iter().find(|p| p.ends_with(name)).unwrap();
    let fifo = |name: &str| {
        let p = d.join(name);
        assert!(Command::new("mkfifo").arg(&p).status().unwrap().success());
        p
    };
    let (stats, keep, grid, counts, csv, log) = (
        fifo("stats.json"),
        fifo("keep.json"),
        fifo("grid.json"),
        fifo("counts.json"),
        fifo("counts.csv"),
        fifo("layer0.jsonl"),
    );
    let cases: Vec<Vec<&str>> = vec![
        vec!["keep", s(&stats), "--metric", "frequency", "--k", "2", "-o", s(out("k.json"))],
        vec!["retention", s(&keep), "--heldout", s(&trace)],
        vec!["replay", s(&trace), "--policy", "lru", "--cap", "2", "--keep", s(&keep)],
        vec!["sweep", s(&grid), "-o", s(out("sweep"))],
        vec!["import", "counts", s(&counts), "--top-k", "2", "-o", s(out("c.json"))],
        vec!["import", "counts", s(&csv), "--top-k", "2", "-o", s(out("c.json"))],
        vec!["import", "vllm-routelog", s(&log), "--num-experts", "4", "-o", s(out("v.safetensors"))],
    ];
    for args in cases {
        let (code, err) = wait_bounded(spawn(&args), 30);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains("a FIFO (named pipe), not a regular file"), "{args:?}: {err}");
    }
}

#[test]
fn negative_numbers_get_range_errors_naming_the_option() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let trace = d.join("t.safetensors");
    synth(&trace, [2, 8, 2, 4, 64], &[]);
    let t = s(&trace);
    let out = d.join("out.json");
    let o = s(&out);
    // (arguments, words the error must hold); none may be clap's "unexpected argument".
    let cases: Vec<(Vec<&str>, &[&str])> = vec![
        (
            vec!["plan", "--in-sample", t, "--out-of-sample", t, "--budget-gb", "-1", "-o", o],
            &["'--budget-gb <BUDGET_GB>'", "-1 is negative"],
        ),
        (
            vec!["plan", "--in-sample", t, "--out-of-sample", t, "--budget-gb", "1", "--pinned-gb", "-0.5", "-o", o],
            &["--pinned-gb -0.5", "cannot be negative"],
        ),
        (vec!["replay", t, "--policy", "lru", "--cap", "-3"], &["'--cap <CAP>'", "--cap takes whole numbers >= 0"]),
        (
            vec!["replay", t, "--policy", "lru", "--cap", "2", "--bandwidth", "-2", "--timeline"],
            &["--bandwidth", "-2 is not > 0"],
        ),
        (
            vec!["keep", o, "--metric", "frequency", "--k", "-1,2", "-o", o],
            &["'--k <K>'", "-1 is not a whole number >= 1"],
        ),
        (vec!["synth", "--experts", "-4", "-o", o], &["'--experts <EXPERTS>'", "whole numbers >= 0"]),
    ];
    for (args, want) in cases {
        let err = fails(&args);
        assert!(!err.contains("unexpected argument"), "{args:?}: {err}");
        for w in want {
            assert!(err.contains(w), "{args:?}: want {w:?} in {err}");
        }
    }
}

#[test]
fn an_output_under_a_file_is_refused_naming_the_option_and_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let trace = d.join("t.safetensors");
    synth(&trace, [2, 8, 2, 4, 64], &[]);
    let file = d.join("a-file");
    std::fs::write(&file, "x").unwrap();
    let (under, out, t) = (file.join("sub/stats.json"), file.join("out"), file.join("t.safetensors"));
    for args in
        [vec!["stats", s(&trace), "-o", s(&under)], vec!["sweep", "-o", s(&out)], vec!["synth", "--output", s(&t)]]
    {
        let out = args.last().unwrap().to_string();
        let err = fails(&args);
        assert!(
            err.contains(&format!("-o/--output {out}: {} is a file, not a directory", file.display())),
            "{args:?}: {err}"
        );
    }
    assert!(!d.join("a-file").is_dir());
}

#[test]
fn a_huge_grid_is_refused_without_yes() {
    let dir = tempfile::tempdir().unwrap();
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data").canonicalize().unwrap();
    let lambdas: Vec<f64> = (0..101).map(|i| f64::from(i) / 100.0).collect();
    let js: Vec<usize> = (0..100).collect();
    let g = serde_json::json!({
        "name": "huge",
        "traces": { "in_sample": data.join("default-calib.safetensors"),
                    "out_of_sample": data.join("default-heldout.safetensors") },
        "variants": ["full"],
        "blocks": [{ "policies": ["lru"], "lambda": lambdas, "j": js, "cap": [8] }],
    });
    let grid = dir.path().join("huge.json");
    std::fs::write(&grid, g.to_string()).unwrap();
    let out = dir.path().join("out");
    let start = Instant::now();
    let err = fails(&["sweep", s(&grid), "-o", s(&out)]);
    assert!(err.contains("the grid expands to 10100 configurations"), "{err}");
    assert!(err.contains("--yes"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(!out.exists(), "the refused run left its output directory");
}

#[test]
fn a_sweep_announces_its_plan_and_reports_progress_in_plain_lines() {
    let dir = tempfile::tempdir().unwrap();
    let out = bin()
        .args(["sweep", "-o", s(&dir.path().join("out"))])
        .env("MOE_OFFLOAD_PROGRESS_SECS", "0.05")
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let first = err.lines().next().unwrap();
    assert!(first.starts_with("sweep: 192 configurations x 2 traces = 384 replays (3932160 token-layers"), "{first}");
    assert!(first.contains("estimated"), "{first}");
    let progress: Vec<&str> = err.lines().filter(|l| l.contains("of 3932160 token-layers), ")).collect();
    assert!(!progress.is_empty(), "no plain progress line: {err}");
    assert!(progress.iter().all(|l| l.starts_with("sweep: ") && l.contains("% (")), "{progress:?}");
}

#[test]
fn mrc_states_its_complexity_and_refuses_an_exploding_curve_without_yes() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("wide.safetensors");
    synth(&trace, [1, 65_536, 2, 2, 1], &["--sequences", "1"]);
    let mrc = dir.path().join("mrc.json");
    let start = Instant::now();
    let err = fails(&["mrc", s(&trace), "--policy", "fifo", "--warmup", "0", "-o", s(&mrc)]);
    assert!(start.elapsed() < Duration::from_secs(30));
    assert!(err.contains("fifo curve of caps 2..=65536 by one replay per cap: 65535 caps x 1 layer"), "{err}");
    assert!(err.contains("above the limit") && err.contains("--yes"), "{err}");
    assert!(!mrc.exists());
    // The one-pass lru curve of the same trace is cheap and runs.
    let err = String::from_utf8_lossy(&run(&["mrc", s(&trace), "--warmup", "0", "-o", s(&mrc)]).stderr).into_owned();
    assert!(err.contains("lru curve of caps 2..=65536 in one pass"), "{err}");
    // belady's too (its priority stack), for any range of caps inside k_used..E.
    let args = ["mrc", s(&trace), "--policy", "belady", "--caps", "3..9", "--warmup", "0", "-o", s(&mrc)];
    let err = String::from_utf8_lossy(&run(&args).stderr).into_owned();
    assert!(err.contains("belady curve of caps 3..=9 in one pass"), "{err}");
}

#[test]
fn a_closed_stdout_ends_quietly_with_status_0() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [40, 16, 2, 4, 200], &["--sequences", "2"]);
    // (completions: clap_complete panicked on a closed pipe before its script was buffered.)
    let commands: [&[&str]; 3] = [&["inspect", s(&trace), "--json"], &["completions", "bash"], &["completions", "zsh"]];
    for (args, closed_stderr) in commands.iter().flat_map(|a| [(a, false), (a, true)]) {
        let mut child = bin()
            .args(*args)
            .stdout(Stdio::piped())
            .stderr(if closed_stderr { Stdio::piped() } else { Stdio::inherit() })
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `| head -0`
        drop(child.stderr.take()); // `2>&1 | head -0`
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}, closed stderr too: {closed_stderr}");
    }
}

#[test]
fn a_zero_token_trace_is_refused_by_every_command_that_computes_a_figure() {
    use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};
    let dir = tempfile::tempdir().unwrap();
    let meta = TraceMeta {
        model: "empty".into(),
        num_experts: 8,
        top_k: 2,
        layer_ids: vec![0, 1],
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: "test".into(),
        extra: Default::default(),
    };
    let parts =
        OwnedParts { ids: vec![], scores: None, gates: None, out_norms: None, seq_offsets: None, step_offsets: None };
    let empty = dir.path().join("empty.safetensors");
    trace_io::write_trace(&empty, &TraceData::new(meta, 0, 2, parts).unwrap().view()).unwrap();
    let good = dir.path().join("good.safetensors");
    synth(&good, [2, 8, 2, 2, 300], &["--sequences", "1"]);
    let o = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    let (st, mrc, plan) = (o("st.json"), o("mrc.json"), o("plan.json"));
    let e = s(&empty);
    let cases: Vec<Vec<&str>> = vec![
        vec!["inspect", e],
        vec!["stats", e, "-o", &st],
        vec!["replay", e, "--policy", "lru", "--cap", "4"],
        vec!["mrc", e, "-o", &mrc],
        vec![
            "plan",
            "--in-sample",
            s(&good),
            "--out-of-sample",
            e,
            "--variants",
            "full",
            "--budget-gb",
            "1",
            "-o",
            &plan,
        ],
    ];
    for args in cases {
        let err = fails(&args);
        assert!(err.contains(&format!("{e} has no tokens (2 layers x 0 tokens)")), "{args:?}: {err}");
        assert!(!err.contains("NaN"), "{err}");
    }
}

/// A grid over the embedded default traces with `block` and, when given, `profiles`.
fn grid_with(dir: &Path, block: serde_json::Value, profiles: Option<serde_json::Value>) -> PathBuf {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data").canonicalize().unwrap();
    let mut g = serde_json::json!({
        "name": "refused",
        "traces": { "in_sample": data.join("default-calib.safetensors"),
                    "out_of_sample": data.join("default-heldout.safetensors") },
        "variants": ["full"],
        "blocks": [block],
    });
    if let Some(p) = profiles {
        g["profiles"] = p;
    }
    let p = dir.join("grid.json");
    std::fs::write(&p, g.to_string()).unwrap();
    p
}

#[test]
fn silent_acceptances_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // The default traces: E = 32, m = 8.
    for (block, profiles, want) in [
        (
            serde_json::json!({"policies": ["lru"], "lambda": [0.1], "j": [9], "cap": [8]}),
            None,
            "j = 9 is more than the 8 candidates per row",
        ),
        (serde_json::json!({"policies": ["lru"], "cap": [33]}), None, "cap 33 is more than the 32 experts of a layer"),
        (
            serde_json::json!({"policies": ["lru"], "cap": [8]}),
            Some(serde_json::json!([])),
            "profiles: []: an empty list",
        ),
    ] {
        let grid = grid_with(dir.path(), block, profiles);
        let err = fails(&["sweep", s(&grid), "-o", s(&out)]);
        assert!(err.contains(want), "{want}: {err}");
    }
    // The boundary values run.
    let grid =
        grid_with(dir.path(), serde_json::json!({"policies": ["lru"], "lambda": [0.1], "j": [8], "cap": [32]}), None);
    ok(&["sweep", s(&grid), "-o", s(&out)]);
}

#[test]
fn merge_refuses_an_output_that_is_one_of_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("shard-0"), dir.path().join("shard-1"));
    ok(&["sweep", "--shard", "0/2", "-o", s(&a)]);
    ok(&["sweep", "--shard", "1/2", "-o", s(&b)]);
    let before = std::fs::read(a.join("results.json")).unwrap();
    let err = fails(&["sweep", "merge", s(&a), s(&b), "-o", s(&a)]);
    assert!(err.contains("is output 0 of this merge (one of its shards)"), "{err}");
    assert_eq!(std::fs::read(a.join("results.json")).unwrap(), before);
    let merged = dir.path().join("merged");
    ok(&["sweep", "merge", s(&a), s(&b), "-o", s(&merged)]);
    whole_set(&merged);
}

#[test]
fn a_killed_synth_leaves_a_visible_temporary_that_the_next_run_removes() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("big.safetensors");
    let mut child = spawn(&["synth", "--layers", "16", "--tokens", "400000", "--threads", "1", "-o", s(&out)]);
    let start = Instant::now();
    while temporaries(dir.path()).is_empty() {
        assert!(start.elapsed() < Duration::from_secs(60), "no temporary appeared");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = temporaries(dir.path());
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with("-big.safetensors"), "the temporary names its target: {left:?}");
    assert!(!out.exists());
    synth(&out, [2, 8, 2, 2, 100], &["--sequences", "1"]);
    assert_eq!(temporaries(dir.path()), Vec::<String>::new());
}

/// `-o -` where the output cannot go to standard output (a trace, several files): refused with
/// the reason, no file named `-` left behind; where it can (`plan`, `export`, `report`, `stats`,
/// one `keep` map), it goes to stdout (tests of those commands).
#[test]
fn dash_output_is_refused_where_stdout_cannot_take_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 8, 2, 4, 60], &[]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let log = dir.path().join("r.jsonl");
    std::fs::write(&log, "{}\n").unwrap();
    let t = s(&trace);
    let synth_args = ["synth", "--layers", "2", "--experts", "8", "--top-k", "2", "--candidates", "4", "--tokens", "9"];
    // `stats -o -` and `keep -o -` (one map) write to stdout since 0.13 (tests/outputs.rs).
    let cases: [(&[&str], &str); 6] = [
        (&synth_args, "memory-mapped"),
        (&["keep", s(&stats), "--metric", "frequency", "--k", "2,4"], "several are written to files: give -o DIR/"),
        (&["keep", s(&stats), "--metric", "frequency", "--k", "2", "--json"], "drop --json"),
        (&["mrc", t], "--json prints the JSON"),
        (&["import", "counts", s(&stats), "--top-k", "2"], "written to a file"),
        (&["import", "mixtral-jsonl", s(&log)], "memory-mapped"),
    ];
    for (args, why) in cases {
        let mut a = args.to_vec();
        a.extend(["-o", "-"]);
        let out = Command::new(env!("CARGO_BIN_EXE_moe-offload")).args(&a).current_dir(dir.path()).output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && e.contains("-o -:") && e.contains(why), "{a:?}: {e}");
        assert!(!dir.path().join("-").exists(), "{a:?} wrote a file named -");
    }
}

/// A compressed input is named as such with the command that undoes it, by every reader (it was
/// "invalid utf-8 sequence", "not a CSV row" or "header too large"): traces, grids, statistics,
/// count files and routing logs, for each format's magic number.
#[test]
fn compressed_inputs_are_named_with_how_to_decompress() {
    let dir = tempfile::tempdir().unwrap();
    let [out, keep, counts, trace] = ["out", "k.json", "c.json", "t.safetensors"].map(|n| dir.path().join(n));
    let formats: [(&str, &[u8], &str); 4] = [
        (
            "gz",
            &[0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 3],
            "gzip-compressed data: decompress it first (`gunzip -k FILE`)",
        ),
        ("zst", &[0x28, 0xb5, 0x2f, 0xfd, 0x24, 0x00], "zstd-compressed data: decompress it first (`zstd -d FILE`)"),
        ("xz", &[0xfd, b'7', b'z', b'X', b'Z', 0, 0, 4], "xz-compressed data: decompress it first (`unxz -k FILE`)"),
        ("bz2", b"BZh91AY&SY\x00\x00", "bzip2-compressed data: decompress it first (`bunzip2 -k FILE`)"),
    ];
    for (ext, magic, expect) in formats {
        let f = dir.path().join(format!("input.{ext}"));
        let mut bytes = magic.to_vec();
        bytes.extend([7u8; 64]);
        std::fs::write(&f, bytes).unwrap();
        let p = s(&f);
        let commands: [&[&str]; 6] = [
            &["replay", p, "--policy", "lru", "--cap", "4"],
            &["inspect", p],
            &["sweep", p, "-o", s(&out)],
            &["keep", p, "--metric", "frequency", "--k", "2", "-o", s(&keep)],
            &["import", "counts", p, "--top-k", "2", "-o", s(&counts)],
            &["import", "vllm-routelog", p, "--num-experts", "8", "-o", s(&trace)],
        ];
        for args in commands {
            let e = fails(args);
            assert!(e.contains(p) && e.contains(expect), "{args:?}: {e}");
        }
    }
    assert!([out, keep, counts, trace].iter().all(|p| !p.exists()), "an output was written");
}
