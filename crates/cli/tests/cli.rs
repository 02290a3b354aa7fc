//! The `moe-offload` binary end to end: the spellings of the README, bad input, real data.

mod common;

use common::{fails, ok, ok_in, run, s, synth};

fn replay_json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap()
}

#[test]
fn synth_stats_keep_replay_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 500], &["--sequences", "2"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let st: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    for layer in st["layers"].as_array().unwrap() {
        let sum: u64 = layer["count"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
        assert_eq!(sum, 500 * 2);
    }
    let keep = dir.path().join("keep.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "8", "-o", s(&keep)]);
    let km: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&keep).unwrap()).unwrap();
    assert_eq!(km["layers"][0].as_array().unwrap().len(), 8);

    let full = replay_json(&["replay", s(&trace), "--policy", "lru", "--cap", "4", "--json"]);
    assert_eq!(full["tokens"], 500 - 64);
    assert_eq!(full["picks"], (500 - 64) * 2 * 2);
    assert_eq!(full["forced_misses"], 0);
    let picks = full["picks"].as_u64().unwrap();
    assert_eq!(full["hits"].as_u64().unwrap() + full["misses"].as_u64().unwrap(), picks);
    let hr = full["hit_rate"].as_f64().unwrap();
    assert_eq!(hr, full["hits"].as_u64().unwrap() as f64 / picks as f64);
    let pruned = replay_json(&[
        "replay",
        s(&trace),
        "--policy",
        "belady",
        "--cap",
        "4",
        "--keep",
        s(&keep),
        "--warmup",
        "0",
        "--json",
    ]);
    assert_eq!(pruned["tokens"], 500);
    let bel_full = replay_json(&["replay", s(&trace), "--policy", "belady", "--cap", "4", "--json"]);
    assert!(bel_full["misses"].as_u64() <= full["misses"].as_u64());
    // k_used below top-k.
    let k1 = replay_json(&["replay", s(&trace), "--policy", "fifo", "--cap", "4", "--k-used", "1", "--json"]);
    assert_eq!(k1["picks"], (500 - 64) * 2);
}

#[test]
fn bad_input_is_refused_with_a_clear_error_and_no_output_file() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [1, 8, 2, 3, 100], &["--sequences", "1"]);
    let bytes = std::fs::read(&trace).unwrap();

    // Truncated trace.
    let bad = dir.path().join("truncated.safetensors");
    std::fs::write(&bad, &bytes[..bytes.len() - 10]).unwrap();
    let e = fails(&["replay", s(&bad), "--policy", "lru", "--cap", "2"]);
    let (n, cut) = (bytes.len(), bytes.len() - 10);
    assert!(e.contains("truncated.safetensors: tensor `ids`: the header puts its data at file bytes"), "{e}");
    assert!(e.contains(&format!("..{n} (data_offsets ")) && e.contains(&format!("the file ends at byte {cut}")), "{e}");
    // An id >= E: `ids` is the last tensor, so the last four bytes are the last two ids (slots 1
    // and 2 of the last token); slot 1 is among the k = 2 that `stats` reads (SEMANTICS.md §1).
    let bad = dir.path().join("bad-id.safetensors");
    let mut b = bytes.clone();
    let n = b.len();
    b[n - 4..n - 2].copy_from_slice(&200u16.to_le_bytes());
    std::fs::write(&bad, &b).unwrap();
    let e = fails(&["stats", s(&bad), "-o", s(&dir.path().join("never.json"))]);
    assert!(
        e.contains("bad-id.safetensors") && e.contains("expert id 200 >= num_experts 8") && e.contains("token 99"),
        "{e}"
    );
    // cap < k_used, belady with lambda > 0.
    let e = fails(&["replay", s(&trace), "--policy", "lru", "--cap", "1"]);
    assert!(e.contains("use a cap of 2 or more"), "{e}");
    let e = fails(&["replay", s(&trace), "--policy", "belady", "--cap", "2", "--lambda", "0.1"]);
    assert!(e.contains("belady") && e.contains("lambda"), "{e}");
    let e = fails(&["replay", s(&trace), "--policy", "lruu", "--cap", "2"]);
    assert!(e.contains("lruu"), "{e}");
    // K > E: no keep map is written.
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let keep = dir.path().join("keep.json");
    let e = fails(&["keep", s(&stats), "--metric", "frequency", "--k", "9", "-o", s(&keep)]);
    assert!(e.contains('9') && e.contains('8'), "{e}");
    assert!(!keep.exists());
    // REAP without norms: a missing statistic, named.
    let e = fails(&["keep", s(&stats), "--metric", "reap", "--k", "4", "-o", s(&keep)]);
    assert!(e.contains("reap"), "{e}");
    // A grid whose trace is missing.
    let grid = dir.path().join("grid.json");
    std::fs::write(
        &grid,
        r#"{"traces": {"in_sample": "t.safetensors", "out_of_sample": "missing.safetensors"},
        "variants": ["full"], "blocks": [{"policies": ["lru"], "cap": [2]}]}"#,
    )
    .unwrap();
    let out = dir.path().join("out");
    let e = fails(&["sweep", s(&grid), "-o", s(&out)]);
    assert!(e.contains("missing.safetensors"), "{e}");
    assert!(!out.exists());
    // Nothing but the inputs and the good stats file exists: no temporary files left behind.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["bad-id.safetensors", "grid.json", "stats.json", "t.safetensors", "truncated.safetensors"]);
}

#[test]
fn default_sweep_writes_sorted_results() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("sweep");
    let stdout = ok(&["sweep", "-o", s(&out), "--threads", "1"]);
    assert!(stdout.contains("| full | 8 |"), "{stdout}");
    // The newcomer's path: which data, the conclusion, the next commands.
    assert!(stdout.starts_with("Data: the embedded synthetic default"), "{stdout}");
    assert!(
        stdout.contains("In short: choosing on the in-sample trace, the fewest misses out of sample are "),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("Next: `moe-offload report {} -o report.html`", out.display())), "{stdout}");
    let one = std::fs::read(out.join("results.json")).unwrap();
    let out2 = dir.path().join("sweep2");
    ok(&["sweep", "-o", s(&out2), "--threads", "2"]);
    assert_eq!(one, std::fs::read(out2.join("results.json")).unwrap());
    assert_eq!(std::fs::read(out.join("results.csv")).unwrap(), std::fs::read(out2.join("results.csv")).unwrap());
    let v: serde_json::Value = serde_json::from_slice(&one).unwrap();
    assert_eq!(v["provenance"]["in_sample"]["source"], "embedded:data/default-calib.safetensors");
    assert!(!v["rows"].as_array().unwrap().is_empty());
    // CSV columns are unique: one SSD column per profile, one tok/s column per bandwidth
    // (`reference` has two bandwidths, the grid's laptop profile one).
    let csv = String::from_utf8(std::fs::read(out.join("results.csv")).unwrap()).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let costs: Vec<&str> = header.iter().copied().filter(|h| h.contains('@')).collect();
    assert_eq!(
        costs,
        [
            "ssd_mb_per_token@reference",
            "tok_s@reference@3.9",
            "tok_s@reference@6.8",
            "ssd_mb_per_token@laptop-17mb",
            "tok_s@laptop-17mb@3.9"
        ]
    );
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_esft_translation_end_to_end() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("translation.safetensors");
    let esft = real.join("esft-dsv2lite");
    let msg = ok(&["import", "esft", s(&esft), "--domains", "translation", "-o", s(&trace)]);
    assert!(msg.contains("26 layers x 8251 tokens, 64 experts, top-6"), "{msg}");
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let st: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&stats).unwrap()).unwrap();
    for layer in st["layers"].as_array().unwrap() {
        let sum: u64 = layer["count"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
        assert_eq!(sum, 8251 * 6);
    }
    let keep = dir.path().join("keep.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "32", "-o", s(&keep)]);
    for cap in ["8", "16", "32"] {
        let misses = |policy: &str| {
            replay_json(&["replay", s(&trace), "--policy", policy, "--cap", cap, "--keep", s(&keep), "--json"])["misses"]
                .as_u64()
                .unwrap()
        };
        let bel = misses("belady");
        for p in ["lru", "fifo", "lfu", "near_pick", "near_pick_ema", "inv_router"] {
            assert!(bel <= misses(p), "cap {cap}: belady {bel} > {p}");
        }
    }
    // Every policy is optimal when the cache holds every kept expert: only compulsory and forced misses.
    let full_cap =
        |p: &str| replay_json(&["replay", s(&trace), "--policy", p, "--cap", "64", "--json"])["hits"].clone();
    assert_eq!(full_cap("lru"), full_cap("belady"));
    assert_eq!(full_cap("fifo"), full_cap("lfu"));
}

#[test]
fn sharded_sweep_merges_to_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    ok(&["sweep", "-o", s(&whole)]);
    let mut shards = Vec::new();
    for i in 0..3 {
        let d = dir.path().join(format!("shard-{i}"));
        ok(&["sweep", "--shard", &format!("{i}/3"), "-o", s(&d)]);
        shards.push(d);
    }
    let merged = dir.path().join("merged");
    let mut args = vec!["sweep", "merge"];
    args.extend(shards.iter().map(|d| s(d)));
    args.extend(["-o", s(&merged)]);
    ok(&args);
    for f in ["results.json", "results.csv", "summary.md"] {
        assert_eq!(std::fs::read(whole.join(f)).unwrap(), std::fs::read(merged.join(f)).unwrap(), "{f}");
    }
    let e = fails(&["sweep", "--shard", "3/3"]);
    assert!(e.contains("need 0 <= I < N"), "{e}");
    // An unsharded output among the shards is refused, naming its directory; so is a missing shard.
    let e = fails(&["sweep", "merge", s(&shards[0]), s(&shards[1]), s(&whole), "-o", s(&dir.path().join("m"))]);
    assert!(e.contains(&format!("{} is not a shard output", whole.display())), "{e}");
    let e = fails(&["sweep", "merge", s(&shards[0]), s(&shards[2]), "-o", s(&dir.path().join("m"))]);
    assert!(e.contains("cannot merge: shard 1/3 missing (2 outputs given)"), "{e}");
    assert!(!dir.path().join("m").exists());
}

/// The keep-map file a grid names is hashed into each shard's provenance (named as the grid wrote
/// it): shards that read different copies of it are refused, naming the file and the shard.
#[test]
fn shards_that_read_different_keep_map_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    synth(&root.join("c.safetensors"), [2, 16, 2, 4, 300], &["--seed", "1"]);
    synth(&root.join("h.safetensors"), [2, 16, 2, 4, 200], &["--seed", "2"]);
    ok_in(root, &["stats", "c.safetensors", "-o", "stats.json"]);
    let grid = r#"{"traces": {"in_sample": "c.safetensors", "out_of_sample": "h.safetensors"},
        "variants": ["full", "file:keep.json"], "warmup": 8,
        "blocks": [{"policies": ["lru", "belady"], "cap": [2, 4]}]}"#;
    std::fs::write(root.join("grid.json"), grid).unwrap();
    let shard = |i: usize, k: &str, out: &str| {
        ok_in(root, &["keep", "stats.json", "--metric", "frequency", "--k", k, "-o", "keep.json"]);
        ok_in(root, &["sweep", "grid.json", "--shard", &format!("{i}/2"), "-o", out]);
    };
    shard(0, "8", "s0");
    shard(1, "8", "s1");
    let results: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(root.join("s0/results.json")).unwrap()).unwrap();
    let sha = trace_io::sha256_file(root.join("keep.json")).unwrap();
    assert_eq!(
        results["provenance"]["files"],
        serde_json::json!([{"source": "keep.json", "digest": format!("sha256:{sha}")}])
    );
    ok_in(root, &["sweep", "merge", "s0", "s1", "-o", "merged"]);
    shard(1, "12", "s1b");
    let out = run(&["sweep", "merge", s(&root.join("s0")), s(&root.join("s1b")), "-o", s(&root.join("m"))]);
    let e = String::from_utf8_lossy(&out.stderr);
    let other = trace_io::sha256_file(root.join("keep.json")).unwrap();
    let expect = format!(
        "cannot merge: {} (shard 1/2) is not from the same grid and inputs as {}: its file keep.json differs (digest): sha256:{sha} vs sha256:{other}",
        root.join("s1b").display(),
        root.join("s0").display()
    );
    assert!(!out.status.success() && e.contains(&expect), "{e}");
}

/// A grid with relative paths gives the same results.json from any working directory (paths are
/// recorded as the grid wrote them), so shards started in different directories merge into the
/// bytes of an unsharded run; shards of different inputs are refused, naming what differs.
#[test]
fn sweep_provenance_does_not_depend_on_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let g = root.join("g");
    std::fs::create_dir(&g).unwrap();
    synth(&root.join("c.safetensors"), [2, 16, 2, 4, 400], &["--seed", "1"]);
    synth(&root.join("h.safetensors"), [2, 16, 2, 4, 200], &["--seed", "2"]);
    let grid = r#"{"traces": {"in_sample": "../c.safetensors", "out_of_sample": "../h.safetensors"},
        "variants": ["full", "frequency@8"], "warmup": 8,
        "blocks": [{"policies": ["lru", "belady", "near_pick"], "cap": [2, 4]}]}"#;
    std::fs::write(g.join("grid.json"), grid).unwrap();
    ok_in(root, &["sweep", "g/grid.json", "-o", "whole-a"]);
    ok_in(&g, &["sweep", "grid.json", "-o", "../whole-b"]);
    let results = |d: &str| std::fs::read_to_string(root.join(d).join("results.json")).unwrap();
    assert_eq!(results("whole-a"), results("whole-b"));
    assert!(results("whole-a").contains(r#""in_sample": "../c.safetensors""#));
    ok_in(root, &["sweep", "g/grid.json", "--shard", "0/2", "-o", "s0"]);
    ok_in(&g, &["sweep", "grid.json", "--shard", "1/2", "-o", "../s1"]);
    ok_in(root, &["sweep", "merge", "s0", "s1", "-o", "merged"]);
    assert_eq!(results("whole-a"), results("merged"));
    // A shard of another held-out trace is refused, naming what differs.
    synth(&root.join("h2.safetensors"), [2, 16, 2, 4, 200], &["--seed", "3"]);
    ok_in(&g, &["sweep", "grid.json", "--shard", "1/2", "--out-of-sample", "../h2.safetensors", "-o", "../s1b"]);
    let out = run(&["sweep", "merge", s(&root.join("s0")), s(&root.join("s1b")), "-o", s(&root.join("m2"))]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && e.contains("out-of-sample trace (digest)"), "{e}");
}

/// `--reset-at-sequence` on a trace of one sequence says it changes nothing (on stderr; the JSON
/// on stdout is the plain replay's).
#[test]
fn reset_at_sequence_without_sequences_is_noted() {
    let dir = tempfile::tempdir().unwrap();
    let t = dir.path().join("one.safetensors");
    synth(&t, [2, 16, 2, 4, 300], &["--sequences", "1"]);
    let base = ["replay", s(&t), "--policy", "lru", "--cap", "4", "--json"];
    let out = run(&[&base[..], &["--reset-at-sequence"]].concat());
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reset-at-sequence changes nothing"));
    assert_eq!(String::from_utf8(out.stdout).unwrap(), ok(&base));
}

/// A comma-separated flag that names a value twice is refused before any work.
#[test]
fn repeated_list_values_are_refused() {
    let e =
        fails(&["import", "esft", "/nonexistent", "--domains", "law,translation,law", "-o", "/tmp/never.safetensors"]);
    assert!(e.contains("--domains: law is given twice (value 3 of 3)"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let (t, st) = (dir.path().join("t.safetensors"), dir.path().join("stats.json"));
    synth(&t, [2, 16, 2, 4, 300], &[]);
    ok(&["stats", s(&t), "-o", s(&st)]);
    let out = dir.path().join("maps");
    let e = fails(&["keep", s(&st), "--metric", "frequency", "--k", "8,4,8", "-o", s(&out)]);
    assert!(e.contains("--k: 8 is given twice (value 3 of 3)"), "{e}");
    assert!(!out.exists());
}

/// The policy names in `--help` come from cachesim's table: every flag that takes a policy
/// lists `Policy::ALL` as its possible values, `--tier2` the policies whose facts allow it,
/// and `mrc --policy` each policy once, under one pass or one replay per cap as its facts say.
#[test]
fn help_lists_the_policy_table() {
    let flat = |args: &[&str]| ok(args).split_whitespace().collect::<Vec<_>>().join(" ");
    let all = cachesim::Policy::ALL.map(cachesim::Policy::as_str).join(", ");
    for cmd in ["replay", "mrc", "plan"] {
        let help = flat(&[cmd, "--help"]);
        assert!(help.contains(&format!("[possible values: {all}]")), "{cmd}: {help}");
    }
    let tier2: Vec<&str> =
        cachesim::Policy::ALL.into_iter().filter(|p| p.facts().may_be_tier2()).map(|p| p.as_str()).collect();
    let (last, rest) = tier2.split_last().unwrap();
    let help = flat(&["replay", "--help"]);
    assert!(help.contains(&format!("POLICY:CAP ({} or {last}; CAP >= k_used)", rest.join(", "))), "{help}");
    let help = flat(&["mrc", "--help"]);
    let said = help.split("--policy <POLICY> ").nth(1).unwrap().split(" [default").next().unwrap();
    for p in cachesim::Policy::ALL {
        let one_pass = cachesim::mrc::has_one_pass(p, cachesim::Semantics::KWay);
        let (before, after) = said.split_once(", one replay per cap for ").unwrap();
        let listed = if one_pass { before } else { after };
        assert!(listed.split([' ', ',', '(', ')']).any(|w| w == p.as_str()), "{p} in {said:?}");
    }
    // A name outside the table is refused with the table's names.
    let err = fails(&["replay", "x.safetensors", "--policy", "nope", "--cap", "4"]);
    assert!(
        err.split_whitespace().collect::<Vec<_>>().join(" ").contains(&format!("[possible values: {all}]")),
        "{err}"
    );
}

/// A log that records only the used experts gives the candidate credits nothing to read: replay
/// says so for the policies with credits (from their facts), and not otherwise.
#[test]
fn credits_without_extra_candidates_are_noted() {
    let dir = tempfile::tempdir().unwrap();
    let (only_used, more) = (dir.path().join("k.safetensors"), dir.path().join("m.safetensors"));
    synth(&only_used, [2, 16, 4, 4, 300], &[]);
    synth(&more, [2, 16, 4, 8, 300], &[]);
    let stderr = |t: &std::path::Path, policy: &str| {
        let out = run(&["replay", s(t), "--policy", policy, "--cap", "6"]);
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for p in cachesim::Policy::ALL {
        let noted = stderr(&only_used, p.as_str()).contains("no more than the 4 used");
        assert_eq!(noted, p.facts().credits != cachesim::Credits::None, "{p}");
        assert!(!stderr(&more, p.as_str()).contains("no more than"), "{p}");
    }
}
