//! `moe-offload report` and `moe-offload export` end to end; the report is rendered in headless
//! Chromium (run when `MOE_OFFLOAD_REQUIRE_CHROMIUM` is set, ignored otherwise).

mod common;

use common::{fails, ok, s, synth};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Set (to anything) to make the Chromium test fail instead of skipping when Chromium is missing.
const REQUIRE_CHROMIUM: &str = "MOE_OFFLOAD_REQUIRE_CHROMIUM";

/// The embedded default sweep, written to `dir/sweep`.
fn default_sweep(dir: &Path) -> PathBuf {
    let out = dir.join("sweep");
    ok(&["sweep", "--threads", "2", "-o", s(&out)]);
    out
}

/// Checks what a self-contained page must be: inline SVG, no scripts, no external resources.
fn assert_self_contained(html: &str) {
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.contains("<svg"), "no inline SVG");
    for bad in ["<script", "<link", "<img", "src=", "url(", "@import"] {
        assert!(!html.contains(bad), "the page contains {bad:?}");
    }
    let without_ns = html.replace("http://www.w3.org/2000/svg", "");
    assert!(!without_ns.contains("http://") && !without_ns.contains("https://"), "the page references the network");
}

#[test]
fn report_of_the_default_sweep_has_every_section() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = default_sweep(dir.path());
    let html_path = dir.path().join("report.html");
    let stdout = ok(&["report", s(&sweep), "-o", s(&html_path)]);
    assert!(stdout.contains("wrote"), "{stdout}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert_self_contained(&html);
    for section in
        ["id=\"summary\"", "id=\"policies\"", "id=\"capacity\"", "id=\"lambda\"", "id=\"shift\"", "id=\"retention\""]
    {
        assert!(html.contains(section), "missing {section}");
    }
    // One bar chart per cap of the default grid, λ charts for its λ > 0 block, per-layer curves.
    for title in ["cap 4 experts per layer", "cap 8 experts per layer", "cap 16 experts per layer"] {
        assert!(html.contains(title), "missing {title}");
    }
    // The summary's two out-of-sample columns have distinct titles.
    let summary = &html[html.find("id=\"summary\"").unwrap()..];
    let summary = &summary[..summary.find("</thead>").unwrap()];
    assert!(summary.contains("<th>out-of-sample (in-sample choice)</th>"), "{summary}");
    assert!(
        summary.contains("<th>out-of-sample (best)</th>") && !summary.contains("<th>out-of-sample</th>"),
        "{summary}"
    );
    assert!(html.contains("variant full, cap 8, k_used 4: misses per token vs λ"));
    assert!(html.contains("hit rate vs cache size per layer"));
    assert!(html.contains("No retention table found"));
    // The default output path is DIR/report.html.
    ok(&["report", s(&sweep)]);
    assert!(sweep.join("report.html").is_file());
}

#[test]
fn report_plots_retention_tables_and_miss_ratio_curves_found_in_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let sweep = default_sweep(dir.path());
    let trace = dir.path().join("t.safetensors");
    let held = dir.path().join("h.safetensors");
    for (path, seed) in [(&trace, "1"), (&held, "2")] {
        synth(path, [3, 16, 2, 4, 800], &["--seed", seed]);
    }
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let maps = dir.path().join("maps");
    for metric in ["frequency", "gate_sum"] {
        ok(&["keep", s(&stats), "--metric", metric, "--k", "4,8,12", "-o", s(&maps)]);
    }
    let mut args = vec!["retention".to_string()];
    let mut files: Vec<PathBuf> = std::fs::read_dir(&maps).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    args.extend(files.iter().map(|p| p.display().to_string()));
    args.extend(["--heldout".into(), held.display().to_string(), "--json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    std::fs::write(sweep.join("retention.json"), ok(&args)).unwrap();
    // A miss-ratio curve in cachesim's `MissCurve` shape.
    let curve = serde_json::json!({
        "policy": "lru", "semantics": "k_way", "k_used": 2, "min_cap": 2, "max_cap": 5, "tokens": 100,
        "picks_per_layer": 200,
        "layers": [{"layer_id": 0, "misses": [90, 60, 40, 30]}, {"layer_id": 1, "misses": [80, 50, 35, 20]}]
    });
    std::fs::write(sweep.join("mrc-full.json"), curve.to_string()).unwrap();
    std::fs::write(sweep.join("notes.json"), "{\"hello\": 1}").unwrap();
    let out = dir.path().join("r.html");
    let stdout = ok(&["report", s(&sweep), "-o", s(&out)]);
    assert!(stdout.contains("1 retention tables, 1 miss-ratio curves"), "{stdout}");
    assert!(stdout.contains("notes.json is neither"), "{stdout}");
    let html = std::fs::read_to_string(&out).unwrap();
    assert_self_contained(&html);
    assert!(html.contains("miss-ratio curve mrc-full: lru"));
    assert!(html.contains("frequency@12") && html.contains("gate_sum@4"));
    assert!(html.contains("reap_retention mean") || html.contains("gate_retention mean"));
    assert!(!html.contains("No retention table found"));
}

#[test]
fn report_errors_say_how_to_fix() {
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&["report", s(dir.path())]);
    assert!(err.contains("moe-offload sweep -o"), "{err}");
    let bogus = dir.path().join("bogus.json");
    std::fs::write(&bogus, "[1, 2]").unwrap();
    let sweep = default_sweep(dir.path());
    let err = fails(&["report", s(&sweep), "--retention", s(&bogus)]);
    assert!(err.contains("--json"), "{err}");
    // The report must not replace the results it reads.
    let results = sweep.join("results.json");
    let before = std::fs::read(&results).unwrap();
    let err = fails(&["report", s(&sweep), "-o", s(&results)]);
    assert!(err.contains("is an input of this command"), "{err}");
    assert_eq!(std::fs::read(&results).unwrap(), before);
}

#[test]
fn exports_read_as_their_consumers_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 8, 2, 4, 300], &[]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let keep = dir.path().join("keep.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "5", "-o", s(&keep)]);
    let map: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&keep).unwrap()).unwrap();
    let kept = |i: usize| -> Vec<u64> { serde_json::from_value(map["layers"][i].clone()).unwrap() };

    // vLLM-Ascend: one `{"<layer>": [all experts, best first]}` per line; ratio 3/8 keeps 5.
    let jsonl = dir.path().join("experts.jsonl");
    ok(&["export", "vllm-ascend", s(&stats), "--metric", "frequency", "-o", s(&jsonl)]);
    let text = std::fs::read_to_string(&jsonl).unwrap();
    assert_eq!(text.lines().count(), 2);
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Map<String, serde_json::Value> = serde_json::from_str(line).unwrap();
        let list: Vec<u64> = serde_json::from_value(v[&map["layer_ids"][i].to_string()].clone()).unwrap();
        assert_eq!(list.len(), 8);
        let mut first: Vec<u64> = list[..5].to_vec();
        first.sort_unstable();
        assert_eq!(first, kept(i));
    }
    // `-o -` writes the same bytes to stdout, the status line to stderr.
    assert_eq!(ok(&["export", "vllm-ascend", s(&stats), "--metric", "frequency", "-o", "-"]), text);
    assert!(!dir.path().join("-").exists());

    // gguf_prune.py: int(layer) -> {"importance_score": [...]} (this trace has no norms: no reap)
    let gguf = dir.path().join("expert_stats.json");
    ok(&["export", "gguf-prune", s(&stats), "-o", s(&gguf)]);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&gguf).unwrap()).unwrap();
    for id in map["layer_ids"].as_array().unwrap() {
        let scores = v[id.to_string()]["importance_score"].as_array().unwrap();
        assert_eq!(scores.len(), 8);
        assert!(scores.iter().all(serde_json::Value::is_f64), "numbers, never null");
        assert_eq!(v[id.to_string()]["frequency"].as_array().unwrap().len(), 8);
    }

    // keep set: k, layers with their keep lists
    let set = dir.path().join("keep-set.json");
    ok(&["export", "keep-set", s(&keep), "-o", s(&set)]);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&set).unwrap()).unwrap();
    assert_eq!(v["k"], 5);
    for (i, l) in v["layers"].as_array().unwrap().iter().enumerate() {
        assert_eq!(l["layer"], map["layer_ids"][i]);
        assert_eq!(l["keep"], map["layers"][i]);
    }
    assert!(v["moe_offload_version"].as_str().unwrap().contains("(commit "));

    let err = fails(&["export", "keep-set", s(&stats), "-o", s(&set)]);
    assert!(err.contains("stats.json"), "{err}");
    let err = fails(&["export", "llama-cpp", s(&keep), "-o", s(&dir.path().join("f.txt"))]);
    assert!(err.contains("not a plan"), "{err}");
}

#[test]
fn version_names_the_commit_and_completions_are_scripts() {
    let v = ok(&["--version"]);
    assert!(v.starts_with("moe-offload ") && v.contains(" (commit "), "{v}");
    let bash = ok(&["completions", "bash"]);
    assert!(
        bash.contains("_moe__offload()") && bash.contains("complete -F _moe__offload") && bash.contains("vllm-ascend"),
        "{}",
        &bash[..200.min(bash.len())]
    );
    let zsh = ok(&["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef moe-offload"), "{}", &zsh[..100.min(zsh.len())]);
    let err = fails(&["completions", "tcsh"]);
    assert!(err.contains("invalid value 'tcsh'"), "{err}");
}

/// The Chromium binary on PATH, if any.
fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |d| d.join(name)))
        .find(|p| p.is_file())
}

#[test]
#[cfg_attr(not(chromium), ignore = "set MOE_OFFLOAD_REQUIRE_CHROMIUM=1 to run (needs chromium on PATH)")]
fn report_renders_in_headless_chromium() {
    let Some(chrome) = chromium() else {
        panic!("{REQUIRE_CHROMIUM} is set but chromium is not on PATH (apt-get install -y chromium)")
    };
    let dir = tempfile::tempdir().unwrap();
    let sweep = default_sweep(dir.path());
    let html = dir.path().join("report.html");
    ok(&["report", s(&sweep), "-o", s(&html)]);
    let png_path = dir.path().join("out.png");
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(&chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            &format!("--user-data-dir={}", s(profile.path())),
            &format!("--screenshot={}", s(&png_path)),
            "--window-size=1400,3000",
            &format!("file://{}", s(&html)),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish the screenshot within 120 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "chromium exited with {status}");
    let bytes = std::fs::read(&png_path).expect("chromium wrote the screenshot");
    assert!(bytes.len() > 20_000, "screenshot is only {} bytes", bytes.len());
    let decoder = png::Decoder::new(std::io::Cursor::new(&bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert_eq!((info.width, info.height), (1400, 3000));
    let px = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let first = &pixels[..px];
    let differing = pixels.chunks_exact(px).filter(|p| p[..3] != first[..3]).count();
    let total = (info.width * info.height) as usize;
    assert!(differing * 50 > total, "the page is (almost) one colour: {differing} of {total} pixels differ");
    let mut colors = std::collections::HashSet::new();
    for p in pixels.chunks_exact(px).step_by(7) {
        colors.insert((p[0], p[1], p[2]));
    }
    assert!(colors.len() >= 16, "only {} colours on the page: the plots did not render", colors.len());
}

/// The subcommand names listed in a `--help` text.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_command_help_shows_an_example() {
    let mut todo: Vec<Vec<String>> = subcommands(&ok(&["--help"])).into_iter().map(|c| vec![c]).collect();
    assert!(todo.len() >= 10, "{todo:?}");
    let mut checked = 0;
    while let Some(cmd) = todo.pop() {
        let mut args: Vec<&str> = cmd.iter().map(String::as_str).collect();
        args.push("--help");
        let help = ok(&args);
        assert!(help.contains("Example"), "`moe-offload {}` has no example in its help", cmd.join(" "));
        for sub in subcommands(&help) {
            let mut c = cmd.clone();
            c.push(sub);
            todo.push(c);
        }
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} commands checked");
}
