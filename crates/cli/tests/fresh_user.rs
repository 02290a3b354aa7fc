//! Issue 39's fresh-user list, replayed as one table: each row is a command a new user ran on an
//! input of their own (a Windows editor's byte-order mark, a count file with a layer twice, NaN in
//! numpy counts, a plan where a keep map goes, ...), and what the tool must answer: the run
//! succeeds and says a thing, or it fails with a message that names the problem. `{d}` in an
//! argument is the row's working directory, set up once by [`fixture`].

mod common;

use std::path::Path;
use std::process::Command;

/// What a row must give.
enum Expect {
    /// Exit 0, with this text on stdout or stderr.
    Ok(&'static str),
    /// A non-zero exit, with this text on stderr.
    Err(&'static str),
}

/// One command of the list: what the user did, the arguments, the answer, and a text that must
/// not appear anywhere in the output (empty: none).
struct Case {
    what: &'static str,
    args: &'static [&'static str],
    expect: Expect,
    absent: &'static str,
}

const fn case(what: &'static str, args: &'static [&'static str], expect: Expect) -> Case {
    Case { what, args, expect, absent: "" }
}

use Expect::{Err, Ok};

const CASES: &[Case] = &[
    // Text inputs written with a UTF-8 byte-order mark (Windows editors, PowerShell) are read.
    case("grid with a BOM", &["sweep", "{d}/bom-grid.json", "-o", "{d}/out-bom"], Ok("configurations x 2 traces")),
    case(
        "keep map with a BOM",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--keep", "{d}/bom-keep.json"],
        Ok("misses"),
    ),
    case(
        "count JSON with a BOM",
        &["import", "counts", "{d}/bom-counts.json", "--top-k", "2", "-o", "{d}/c1.json"],
        Ok("wrote"),
    ),
    case(
        "CSV counts with a BOM",
        &["import", "counts", "{d}/bom-counts.csv", "--top-k", "2", "-o", "{d}/c2.json"],
        Ok("wrote"),
    ),
    // Silently accepted before.
    case(
        "a layer key twice in a count JSON",
        &["import", "counts", "{d}/dup.json", "--top-k", "2", "-o", "{d}/c3.json"],
        Err("key `0`: appears twice"),
    ),
    case(
        "statistics with tokens 0 and counts",
        &["keep", "{d}/tokens0.json", "--metric", "frequency", "--k", "2", "-o", "{d}/k0.json"],
        Err("is more than the layer's tokens = 0"),
    ),
    case(
        "the same trace in and out of sample",
        &["sweep", "{d}/same-grid.json", "-o", "{d}/out-same"],
        Ok("warning: the in-sample trace"),
    ),
    case(
        "a vLLM log cut in the middle of a record",
        &["import", "vllm-routelog", "{d}/cut.jsonl", "--num-experts", "8", "-o", "{d}/cut.safetensors"],
        Err("cut.jsonl:6: not a route record"),
    ),
    // Unclear messages before.
    case(
        "NaN in .npy counts",
        &["import", "counts", "{d}/nan.npy", "--top-k", "2", "-o", "{d}/c4.json"],
        Err("NaN is not a whole number"),
    ),
    case(
        "a keep map [1,2,3]",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--keep", "{d}/list.json"],
        Err("a JSON list"),
    ),
    case("export keep-set of a plan", &["export", "keep-set", "{d}/plan.json", "-o", "{d}/ks.json"], Ok("(keep set)")),
    case(
        "a REAP file with one corpus",
        &["stats", "--reap-agg", "{d}/reap1.json", "-o", "{d}/r1.json"],
        Ok("corpus only"),
    ),
    case(
        "an empty variants list",
        &["sweep", "{d}/no-variants.json", "-o", "{d}/out-nv"],
        Err("variants: is an empty list"),
    ),
    case(
        "an empty policies list",
        &["sweep", "{d}/no-policies.json", "-o", "{d}/out-np"],
        Err("blocks[0].policies: is an empty list"),
    ),
    case("report DIR -o DIR", &["report", "{d}/out-bom", "-o", "{d}/out-bom"], Err("is a directory")),
    case(
        "counts whose layers hold different token counts",
        &["import", "counts", "{d}/uneven-counts.json", "--top-k", "1", "-o", "{d}/uneven.json"],
        Ok("warning: the layers hold different token counts (counts / top-1: layer 0: 10, layer 1: 2)"),
    ),
    case(
        "synth -o an existing directory",
        &["synth", "-o", "{d}"],
        Err("is a directory; this command writes one file"),
    ),
    case(
        "import counts -o an existing directory",
        &["import", "counts", "{d}/bom-counts.json", "--top-k", "2", "-o", "{d}"],
        Err("is a directory; this command writes one file"),
    ),
    case(
        "synth of a 640 GB trace",
        &["synth", "--layers", "100000", "--tokens", "100000", "-o", "{d}/huge.safetensors"],
        Err("about 640.0 GB, above the limit of 8 GB without --yes"),
    ),
    case(
        "replay with a cap above E",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "100"],
        Ok("note: cap 100 is more than the 32 experts of a layer"),
    ),
    case(
        "report of a directory that is not there",
        &["report", "{d}/no-such-sweep"],
        Err("no-such-sweep: no such directory"),
    ),
    case(
        "--layer-caps naming a file that is not there",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--layer-caps", "{d}/nope.json"],
        Err("nope.json\" is neither a file"),
    ),
    case(
        "plan with traces of two models",
        &[
            "plan",
            "--in-sample",
            "{d}/calib.safetensors",
            "--out-of-sample",
            "{d}/one.safetensors",
            "--budget-gb",
            "0.5",
            "-o",
            "{d}/p-two.json",
        ],
        Err("one.safetensors (E = 1"),
    ),
    Case {
        what: "the lookahead hint",
        args: &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--prefetch", "lookahead:2"],
        expect: Err("--lookahead 16"),
        absent: "M'",
    },
    // One rule for -1 and 0.
    case(
        "--batch -1",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--batch", "-1"],
        Err("-1 is not a whole number >= 1"),
    ),
    case(
        "--batch 0",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--batch", "0"],
        Err("0 is not a whole number >= 1"),
    ),
    case(
        "--k-used 0",
        &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "8", "--k-used", "0"],
        Err("0 is not a whole number >= 1"),
    ),
    case(
        "keep --k -1",
        &["keep", "{d}/stats.json", "--metric", "frequency", "--k", "-1", "-o", "{d}/k1.json"],
        Err("-1 is not a whole number >= 1"),
    ),
    // Fixed earlier in the issue, kept in the table.
    case(
        "--calib with a predictor that does not read it",
        &[
            "replay",
            "{d}/calib.safetensors",
            "--policy",
            "lru",
            "--cap",
            "8",
            "--prefetch",
            "prev_token:2",
            "--calib",
            "{d}/held.safetensors",
        ],
        Err("--calib is read only by the coact predictor"),
    ),
    case(
        "plan --pin-counts above E",
        &[
            "plan",
            "--in-sample",
            "{d}/calib.safetensors",
            "--out-of-sample",
            "{d}/held.safetensors",
            "--budget-gb",
            "0.5",
            "--pin-counts",
            "33",
            "-o",
            "{d}/p2.json",
        ],
        Err("33 is more than the 32 experts"),
    ),
    case("a grid's cap 0", &["sweep", "{d}/cap0-grid.json", "-o", "{d}/out-cap0"], Ok("configurations x 2 traces")),
    case(
        "mrc of a one-expert trace",
        &["mrc", "{d}/one.safetensors", "--warmup", "0", "-o", "{d}/one-mrc.json"],
        Ok("lru curve"),
    ),
    case("stats -o -", &["stats", "{d}/calib.safetensors", "-o", "-"], Ok("moe-offload-stats")),
    // The second fresh-user pass.
    case(
        "a profile file with a field twice",
        &[
            "replay",
            "{d}/calib.safetensors",
            "--policy",
            "lru",
            "--cap",
            "0",
            "--exec",
            "host",
            "--profile-file",
            "{d}/dup-profile.json",
        ],
        Err("dup-profile.json: key `compute_ms`: appears twice"),
    ),
    case(
        "mrc --keep plan.json, as replay reads it",
        &["mrc", "{d}/calib.safetensors", "--keep", "{d}/plan.json", "-o", "{d}/mrc-plan.json"],
        Ok("wrote"),
    ),
    case("mrc --json without -o", &["mrc", "{d}/calib.safetensors", "--json"], Ok("\"kind\": \"moe-offload-mrc\"")),
    case(
        "plan --json without -o",
        &[
            "plan",
            "--in-sample",
            "{d}/calib.safetensors",
            "--out-of-sample",
            "{d}/held.safetensors",
            "--budget-gb",
            "0.5",
            "--json",
        ],
        Ok("\"kind\": \"moe-offload-plan\""),
    ),
    Case {
        what: "mrc --caps above E, refused before the work line",
        args: &["mrc", "{d}/calib.safetensors", "--caps", "30..40", "-o", "{d}/mrc-e.json"],
        expect: Err("cap 40 is more than the E = 32 experts"),
        absent: "mrc: lru curve",
    },
    Case {
        what: "mrc --caps 0..3: cap 0 is the no-cache deployment of replay --cap 0",
        args: &["mrc", "{d}/calib.safetensors", "--caps", "0..3", "-o", "{d}/mrc-0.json"],
        expect: Err("cap 0 is below k_used = 4"),
        absent: "mrc: lru curve",
    },
    case("replay --cap 0", &["replay", "{d}/calib.safetensors", "--policy", "lru", "--cap", "0"], Ok("misses")),
    case(
        "the mrc table ends at the last cap",
        &["mrc", "{d}/calib.safetensors", "--caps", "4..31", "-o", "{d}/mrc-31.json"],
        Ok("|  31 |"),
    ),
    Case { what: "the version", args: &["--version"], expect: Ok("moe-offload 0."), absent: "0.0.0" },
];

/// The inputs of the table, in `d`.
fn fixture(d: &Path) {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::copy(ws.join("data/default-calib.safetensors"), d.join("calib.safetensors")).unwrap();
    std::fs::copy(ws.join("data/default-heldout.safetensors"), d.join("held.safetensors")).unwrap();
    std::fs::copy(ws.join("data/default-heldout.safetensors"), d.join("held-copy.safetensors")).unwrap();
    let run = |args: &[&str]| common::ok_in(d, args);
    run(&["stats", "calib.safetensors", "-o", "stats.json"]);
    run(&["keep", "stats.json", "--metric", "frequency", "--k", "16", "-o", "keep16.json"]);
    let plan = ["--in-sample", "calib.safetensors", "--out-of-sample", "held.safetensors", "--budget-gb", "0.5"];
    run(&[&["plan"], &plan[..], &["-o", "plan.json"]].concat());
    common::synth(&d.join("one.safetensors"), [1, 1, 1, 1, 64], &["--sequences", "1", "--dead-experts", "0"]);

    let bom = |name: &str, text: &[u8]| std::fs::write(d.join(name), [&b"\xEF\xBB\xBF"[..], text].concat()).unwrap();
    let write = |name: &str, text: &str| std::fs::write(d.join(name), text).unwrap();
    let grid = |traces: (&str, &str), variants: &str, policies: &str, cap: &str| {
        format!(
            r#"{{"traces": {{"in_sample": "{}", "out_of_sample": "{}"}}, "variants": {variants}, "warmup": 8,
               "blocks": [{{"policies": {policies}, "cap": {cap}}}]}}"#,
            traces.0, traces.1
        )
    };
    let two = ("calib.safetensors", "held.safetensors");
    bom("bom-grid.json", grid(two, r#"["full"]"#, r#"["lru"]"#, "[8]").as_bytes());
    bom("bom-keep.json", &std::fs::read(d.join("keep16.json")).unwrap());
    bom("bom-counts.json", br#"{"0": [1, 2, 3, 4], "1": [4, 3, 2, 1]}"#);
    std::fs::write(d.join("uneven-counts.json"), r#"{"0": [3, 2, 5, 0], "1": [1, 1, 0, 0]}"#).unwrap();
    bom("bom-counts.csv", b"layer,expert,count\n0,0,2\n0,1,2\n");
    write("dup.json", r#"{"0": [1, 2, 3, 4], "0": [4, 3, 2, 1]}"#);
    write("same-grid.json", &grid(("held.safetensors", "held-copy.safetensors"), r#"["full"]"#, r#"["lru"]"#, "[8]"));
    write("no-variants.json", &grid(two, "[]", r#"["lru"]"#, "[8]"));
    write("no-policies.json", &grid(two, r#"["full"]"#, "[]", "[8]"));
    write("cap0-grid.json", &grid(two, r#"["full"]"#, r#"["lru"]"#, "[0, 8]"));
    write("list.json", "[1, 2, 3]\n");
    write(
        "dup-profile.json",
        r#"{"expert_mb": 1.0, "compute_ms": 20, "bandwidth_gbps": [3.9], "host_gbps": 50, "compute_ms": 5}"#,
    );
    write("reap1.json", r#"{"only": {"tok": 4, "freq": {"0": [4, 2, 2, 0], "1": [3, 3, 1, 1]}}}"#);
    let mut stats: serde_json::Value = serde_json::from_slice(&std::fs::read(d.join("stats.json")).unwrap()).unwrap();
    stats["layers"][0]["tokens"] = 0.into();
    write("tokens0.json", &stats.to_string());
    // numpy's .npy v1.0: magic, version, header length, a header padded to 64 bytes, f8 values.
    let header = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 4), }";
    let pad = 64 - (10 + header.len() + 1) % 64;
    let header = format!("{header}{}\n", " ".repeat(pad));
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    npy.extend((header.len() as u16).to_le_bytes());
    npy.extend(header.as_bytes());
    for v in [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, f64::NAN, 1.0f64] {
        npy.extend(v.to_le_bytes());
    }
    std::fs::write(d.join("nan.npy"), npy).unwrap();
    // A vLLM route log: the meta line, four records, and a fifth cut in the middle.
    let mut log = String::from(r#"{"type": "meta", "model_id": "m", "layers_logged": [0], "top_k": 2}"#);
    for (t, ids) in [[1, 2], [3, 4], [5, 6], [7, 0]].iter().enumerate() {
        log += &format!(
            "\n{{\"type\": \"route\", \"req_id\": \"r1\", \"token_idx\": {t}, \"layer\": 0, \"topk_ids\": {ids:?}, \"topk_weights\": [0.6, 0.4]}}"
        );
    }
    log += "\n{\"type\": \"route\", \"req_id\": \"r1\", \"token_idx\": 4, \"layer\": 0, \"topk_ids\": [1, ";
    write("cut.jsonl", &log);
}

#[test]
fn the_fresh_user_list_of_issue_39() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fixture(d);
    let mut failures = Vec::new();
    for c in CASES {
        let args: Vec<String> = c.args.iter().map(|a| a.replace("{d}", common::s(d))).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_moe-offload")).args(&args).current_dir(d).output().unwrap();
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let problem = match c.expect {
            Ok(text) if !out.status.success() => Some(format!("failed, expected success with {text:?}")),
            Ok(text) if !stdout.contains(text) && !stderr.contains(text) => Some(format!("no {text:?} in the output")),
            Err(_) if out.status.success() => Some("succeeded, expected a refusal".to_string()),
            Err(text) if !stderr.contains(text) => Some(format!("no {text:?} in the message")),
            _ if !c.absent.is_empty() && (stdout.contains(c.absent) || stderr.contains(c.absent)) => {
                Some(format!("{:?} in the output", c.absent))
            }
            _ => None,
        };
        if let Some(p) = problem {
            failures.push(format!("{}: {p}\n  stdout: {}\n  stderr: {}", c.what, stdout.trim(), stderr.trim()));
        }
    }
    assert!(failures.is_empty(), "{} of {} rows:\n{}", failures.len(), CASES.len(), failures.join("\n"));
}
