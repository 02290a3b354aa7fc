//! Fuzzing the importers' line parsers (ESFT text files, vLLM route logs, Mixtral JSON Lines):
//! whatever the lines, an import never panics, never hangs or allocates by a number it read, and
//! gives either a trace that obeys every content rule of SEMANTICS.md §1 or an error that names
//! the input file.
//!
//! Inputs: well-formed documents generated per format (ids, probabilities, token indexes, layers
//! and steps drawn near their limits), and, with `MOE_OFFLOAD_REAL_DATA` set, the first lines of
//! the real files; then line edits (lines deleted, repeated, swapped, cut, split, emptied, CRLF
//! endings, separators changed, a field replaced by a boundary value or another type, bytes
//! inserted). Rounds as in `fuzz.rs`:
//! `PROPTEST_CASES=5000 MOE_OFFLOAD_FUZZ_SECS=600 cargo test -p trace-io --release --test fuzz_import -- --nocapture`.

mod fuzzing;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fuzzing::{check_rules, formatted, fuzz, real_dir};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestCaseError;
use trace_io::import::esft::{EsftOptions, import_esft};
use trace_io::import::mixtral_jsonl::{MixtralJsonlOptions, import_mixtral_jsonl};
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};
use trace_io::{TraceData, TraceError};

/// Field values that sit on the parsers' boundaries, or are of another type.
const VALUES: [&str; 30] = [
    "0",
    "1",
    "7",
    "8",
    "9",
    "59",
    "60",
    "63",
    "64",
    "65535",
    "65536",
    "-1",
    "4294967295",
    "4294967296",
    "18446744073709551616",
    "1e400",
    "-0.0",
    "NaN",
    "inf",
    "0.5",
    "1.0000001",
    "1e-45",
    "",
    "\"7\"",
    "null",
    "[]",
    "{}",
    "true",
    "\"route\"",
    "\"meta\"",
];

#[derive(Debug, Clone)]
enum LineEdit {
    Delete(usize),
    Duplicate(usize),
    Swap(usize, usize),
    Cut(usize, usize),
    Split(usize, usize),
    Blank(usize),
    Crlf(usize),
    Separator(usize, char, char),
    Field(usize, usize, &'static str),
    Insert(usize, usize, String),
}

fn line_edit() -> impl Strategy<Value = LineEdit> {
    let i = any::<usize>();
    prop_oneof![
        i.prop_map(LineEdit::Delete),
        i.prop_map(LineEdit::Duplicate),
        (i, i).prop_map(|(a, b)| LineEdit::Swap(a, b)),
        (i, i).prop_map(|(a, b)| LineEdit::Cut(a, b)),
        (i, i).prop_map(|(a, b)| LineEdit::Split(a, b)),
        i.prop_map(LineEdit::Blank),
        i.prop_map(LineEdit::Crlf),
        (i, prop::sample::select(vec!['\t', ',', ':', ' ']), prop::sample::select(vec!['\t', ' ', ';', ',']))
            .prop_map(|(l, a, b)| LineEdit::Separator(l, a, b)),
        (i, i, prop::sample::select(VALUES.to_vec())).prop_map(|(l, f, v)| LineEdit::Field(l, f, v)),
        (i, i, "\\PC{0,6}|[\\t\\[\\]{},:\"]{1,3}").prop_map(|(l, at, s)| LineEdit::Insert(l, at, s)),
    ]
}

/// The byte ranges of the fields of `line`: maximal runs of number, name or quote characters.
fn fields(line: &str) -> Vec<(usize, usize)> {
    let word = |c: char| c.is_ascii_alphanumeric() || "._+-\"".contains(c);
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices() {
        match (word(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                out.push((s, i));
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        out.push((s, line.len()));
    }
    out
}

/// The nearest char boundary of `s` at or below `at % (len + 1)`.
fn boundary(s: &str, at: usize) -> usize {
    let mut i = at % (s.len() + 1);
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn apply(lines: &mut Vec<String>, e: &LineEdit) {
    if lines.is_empty() {
        return;
    }
    let n = lines.len();
    match e {
        LineEdit::Delete(i) => drop(lines.remove(i % n)),
        LineEdit::Duplicate(i) => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        LineEdit::Swap(a, b) => lines.swap(a % n, b % n),
        LineEdit::Cut(i, at) => {
            let l = &mut lines[i % n];
            let at = boundary(l, *at);
            l.truncate(at);
        }
        LineEdit::Split(i, at) => {
            let l = &mut lines[i % n];
            let at = boundary(l, *at);
            let tail = l.split_off(at);
            lines.insert(i % n + 1, tail);
        }
        LineEdit::Blank(i) => lines[i % n].clear(),
        LineEdit::Crlf(i) => lines[i % n].push('\r'),
        LineEdit::Separator(i, a, b) => lines[i % n] = lines[i % n].replace(*a, &b.to_string()),
        LineEdit::Field(i, f, v) => {
            let l = &mut lines[i % n];
            let fs = fields(l);
            if !fs.is_empty() {
                let (s, e) = fs[f % fs.len()];
                l.replace_range(s..e, v);
            }
        }
        LineEdit::Insert(i, at, s) => {
            let l = &mut lines[i % n];
            let at = boundary(l, *at);
            l.insert_str(at, s);
        }
    }
}

fn write_lines(path: &Path, lines: &[String]) {
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

/// The outcome of one import: a trace obeying §1, or an error naming one of `files`.
fn judge(result: Result<TraceData, TraceError>, files: &[PathBuf]) -> Result<(), TestCaseError> {
    match result {
        Ok(t) => {
            check_rules(&t.view())?;
            fuzzing::accepted();
        }
        Err(e) => {
            let text = formatted(&e)?;
            let named = files.iter().any(|f| {
                text.contains(&f.display().to_string())
                    || f.file_name().is_some_and(|n| text.contains(&*n.to_string_lossy()))
                    || f.parent().is_some_and(|d| text.contains(&d.display().to_string()))
            });
            // A configuration error is about the options (E not given), not a file.
            let options = matches!(e, TraceError::Config { .. });
            prop_assert!(named || options, "the error names no input file: {text}");
        }
    }
    Ok(())
}

/// A temporary directory per thread, emptied for each case.
fn scratch() -> PathBuf {
    thread_local! {
        static DIR: tempfile::TempDir = tempfile::tempdir().unwrap();
    }
    let d = DIR.with(|d| d.path().join("case"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn prob() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec!["0.0", "0.0000", "0.0001", "0.25", "0.5", "1.0", "0.3333"]).prop_map(str::to_string),
        (0.0f64..1.0).prop_map(|p| format!("{p:.4}")),
    ]
}

/// Two expert ids of a row for E = 8: distinct, the second sometimes 8 (out of range).
fn pair() -> impl Strategy<Value = (u16, u16)> {
    (0u16..8, 0u16..8).prop_map(|(a, d)| (a, (a + 1 + d) % 9))
}

/// ESFT: per layer file, lines of `ids \t ... \t\t probs \t ...` (k = 2, E = 8): (layers, lines).
fn esft_doc() -> impl Strategy<Value = Vec<(u32, Vec<String>)>> {
    let seq = prop::collection::vec((pair(), prob(), prob()).prop_map(|((a, b), p, q)| (a, b, p, q)), 1..5);
    let lines = prop::collection::vec(seq, 1..4);
    (prop::collection::vec(lines, 1..3), 1u32..4).prop_map(|(files, first)| {
        files
            .into_iter()
            .enumerate()
            .map(|(i, seqs)| {
                let text = seqs
                    .into_iter()
                    .map(|rows| {
                        let ids: Vec<String> = rows.iter().flat_map(|r| [r.0.to_string(), r.1.to_string()]).collect();
                        let ps: Vec<String> = rows.iter().flat_map(|r| [r.2.clone(), r.3.clone()]).collect();
                        format!("{}\t\t{}", ids.join("\t"), ps.join("\t"))
                    })
                    .collect();
                (first + i as u32, text)
            })
            .collect()
    })
}

/// vLLM: per layer file, a meta line then route lines in steps (`token_idx` restarting at 0).
fn vllm_doc() -> impl Strategy<Value = Vec<(u32, Vec<String>)>> {
    let step = prop::collection::vec((pair(), prob(), prob()).prop_map(|((a, b), p, q)| (a, b, p, q)), 1..4);
    (prop::collection::vec(step, 1..5), prop::sample::subsequence(vec![0u32, 3, 8, 23], 1..3), any::<bool>())
        .prop_map(|(steps, layers, with_e)| {
            layers
                .iter()
                .map(|&layer| {
                    let e = if with_e { r#", "num_experts": 8"# } else { "" };
                    let mut lines = vec![format!(
                        r#"{{"type": "meta", "model_id": "fuzz/model", "vllm_version": "0", "layers_logged": [{layer}], "top_k": 2{e}}}"#
                    )];
                    for rows in &steps {
                        for (t, r) in rows.iter().enumerate() {
                            lines.push(format!(
                                r#"{{"type": "route", "req_id": "r1", "token_idx": {t}, "layer": {layer}, "topk_ids": [{}, {}], "topk_weights": [{}, {}]}}"#,
                                r.0, r.1, r.2, r.3
                            ));
                        }
                    }
                    (layer, lines)
                })
                .collect()
        })
}

/// Mixtral: records grouped by problem and layer, `token_idx` counting per (problem, layer).
fn mixtral_doc() -> impl Strategy<Value = Vec<String>> {
    let tokens = prop::collection::vec((pair(), prob()).prop_map(|((a, b), p)| (a, b, p)), 1..5);
    (prop::collection::vec(tokens, 1..3), 1u32..4).prop_map(|(problems, layers)| {
        let mut lines = Vec::new();
        for (p, toks) in problems.iter().enumerate() {
            for layer in 0..layers {
                for (t, r) in toks.iter().enumerate() {
                    let g: f64 = r.2.parse().unwrap_or(0.5);
                    lines.push(format!(
                        r#"{{"dataset": "gsm8k", "problem_id": {p}, "layer": {layer}, "experts": [{}, {}], "gating_probs": [{}, {}], "token_idx": {t}}}"#,
                        r.0,
                        r.1,
                        g,
                        1.0 - g
                    ));
                }
            }
        }
        lines
    })
}

/// First lines of the real files, by format (empty without real data).
struct RealSeeds {
    /// ESFT: the first two sequences of layers 1 and 2 of `translation` (E = 64, k = 6).
    esft: Vec<(u32, Vec<String>)>,
    /// vLLM: per layer file, the meta line and route lines from the first prefill step.
    vllm: Vec<(u32, Vec<String>)>,
    /// Mixtral: problem 0, layers 0 and 1, the first 12 tokens.
    mixtral: Vec<String>,
}

fn real_seeds() -> &'static RealSeeds {
    static SEEDS: OnceLock<RealSeeds> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let empty = RealSeeds { esft: vec![], vllm: vec![], mixtral: vec![] };
        let Some(dir) = real_dir() else { return empty };
        let read = |p: PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let scores = dir.join("esft-dsv2lite/results/expert_scores/translation");
        let esft = [1u32, 2]
            .iter()
            .map(|&l| {
                (l, read(scores.join(format!("expert_weights_{l}.txt"))).lines().take(2).map(String::from).collect())
            })
            .collect();
        let logs = dir.join("vllm-routelog-qwen15moe");
        let vllm = [0u32, 8]
            .iter()
            .map(|&l| {
                let text = read(logs.join(format!("moe_layer{l}.jsonl")));
                let all: Vec<&str> = text.lines().collect();
                // Line 0 is the meta line; then 8,192 + 256 warm-up rows, then the first prefill step.
                let mut lines = vec![all[0].to_string()];
                lines.extend(all[1 + 8192 + 256..1 + 8192 + 256 + 30].iter().map(|s| s.to_string()));
                (l, lines)
            })
            .collect();
        let routing = read(dir.join("mixtral-decode/gsm8k_2_routing.jsonl"));
        let mixtral = routing
            .lines()
            .filter(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                v["problem_id"] == 0 && v["layer"].as_u64().unwrap() < 2 && v["token_idx"].as_u64().unwrap() < 12
            })
            .map(String::from)
            .collect();
        RealSeeds { esft, vllm, mixtral }
    })
}

/// Applies `edits` to the lines of one of `files` (chosen by `which`).
fn edit_files(files: &mut [(u32, Vec<String>)], which: usize, edits: &[LineEdit]) {
    if files.is_empty() {
        return;
    }
    let n = files.len();
    for e in edits {
        apply(&mut files[which % n].1, e);
    }
}

/// Writes the ESFT layer files of domain `dom` and imports it.
fn esft_import(files: &[(u32, Vec<String>)], e: u32, k: u32) -> (Result<TraceData, TraceError>, Vec<PathBuf>) {
    let root = scratch();
    let d = root.join("dom");
    std::fs::create_dir_all(&d).unwrap();
    let mut paths = Vec::new();
    for (layer, lines) in files {
        let p = d.join(format!("expert_weights_{layer}.txt"));
        write_lines(&p, lines);
        paths.push(p);
    }
    paths.push(d);
    let opts = EsftOptions { domains: vec!["dom".into()], num_experts: e, top_k: k, ..Default::default() };
    (import_esft(&root, &opts), paths)
}

/// Writes the route logs and imports them.
fn vllm_import(files: &[(u32, Vec<String>)], e: Option<u32>) -> (Result<TraceData, TraceError>, Vec<PathBuf>) {
    let root = scratch();
    let paths: Vec<PathBuf> = files
        .iter()
        .map(|(layer, lines)| {
            let p = root.join(format!("moe_layer{layer}.jsonl"));
            write_lines(&p, lines);
            p
        })
        .collect();
    let opts = VllmRoutelogOptions { num_experts: e, ..Default::default() };
    (import_vllm_routelog(&paths, &opts).map(|i| i.trace), paths)
}

/// Writes the Mixtral records and imports them.
fn mixtral_import(lines: &[String]) -> (Result<TraceData, TraceError>, Vec<PathBuf>) {
    let p = scratch().join("routing.jsonl");
    write_lines(&p, lines);
    (import_mixtral_jsonl(&p, &MixtralJsonlOptions::default()).map(|i| i.trace), vec![p])
}

fn esft_case(
    mut files: Vec<(u32, Vec<String>)>,
    which: usize,
    edits: &[LineEdit],
    e: u32,
    k: u32,
) -> Result<(), TestCaseError> {
    edit_files(&mut files, which, edits);
    let (r, paths) = esft_import(&files, e, k);
    judge(r, &paths)
}

fn vllm_case(
    mut files: Vec<(u32, Vec<String>)>,
    which: usize,
    edits: &[LineEdit],
    e: Option<u32>,
) -> Result<(), TestCaseError> {
    edit_files(&mut files, which, edits);
    let (r, paths) = vllm_import(&files, e);
    judge(r, &paths)
}

fn mixtral_case(mut lines: Vec<String>, edits: &[LineEdit]) -> Result<(), TestCaseError> {
    for e in edits {
        apply(&mut lines, e);
    }
    let (r, paths) = mixtral_import(&lines);
    judge(r, &paths)
}

fn edits() -> impl Strategy<Value = Vec<LineEdit>> {
    prop::collection::vec(line_edit(), 0..5)
}

#[test]
fn the_unedited_documents_import() {
    // The documents the cases start from import, so the fuzz starts on the parsers' accepting paths.
    let esft = vec![
        (1, vec!["0\t1\t2\t3\t\t0.5\t0.25\t0.2\t0.1".to_string()]),
        (2, vec!["4\t5\t6\t7\t\t0.5\t0.25\t0.2\t0.1".to_string()]),
    ];
    let t = esft_import(&esft, 8, 2).0.unwrap();
    assert_eq!((t.view().shape().layers, t.view().shape().tokens), (2, 2));
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for _ in 0..20 {
        let doc = vllm_doc().new_tree(&mut runner).unwrap().current();
        let v = vllm_import(&doc, Some(8)).0;
        // Generated ids may repeat within a row (a refusal); a row of distinct ids imports.
        if let Ok(t) = v {
            check_rules(&t.view()).unwrap();
        }
    }
}

/// The documents cut from the real files (the seeds of the real-data cases) import.
#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn the_real_seed_documents_import() {
    let r = real_seeds();
    assert!(!r.esft.is_empty(), "{} is set, so the seeds are read", real_data::ENV);
    let t = esft_import(&r.esft, 64, 6).0.unwrap();
    assert_eq!(t.view().shape().layers, 2);
    let t = vllm_import(&r.vllm, Some(60)).0.unwrap();
    assert_eq!((t.view().shape().layers, t.view().shape().tokens), (2, 30));
    let t = mixtral_import(&r.mixtral).0.unwrap();
    assert_eq!((t.view().shape().layers, t.view().shape().tokens), (2, 12));
}

#[test]
fn esft_lines() {
    fuzz("esft_lines", (esft_doc(), any::<usize>(), edits()), |(files, which, edits)| {
        esft_case(files, which, &edits, 8, 2)
    });
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn esft_real_lines() {
    assert!(!real_seeds().esft.is_empty(), "no ESFT seed lines under MOE_OFFLOAD_REAL_DATA");
    fuzz("esft_real_lines", (any::<usize>(), prop::collection::vec(line_edit(), 1..5)), |(which, edits)| {
        esft_case(real_seeds().esft.clone(), which, &edits, 64, 6)
    });
}

#[test]
fn vllm_lines() {
    let s = (vllm_doc(), any::<usize>(), edits(), prop::option::of(prop::sample::select(vec![8u32, 9, 1, 65536])));
    fuzz("vllm_lines", s, |(files, which, edits, e)| vllm_case(files, which, &edits, e));
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn vllm_real_lines() {
    assert!(!real_seeds().vllm.is_empty(), "no vLLM seed lines under MOE_OFFLOAD_REAL_DATA");
    fuzz("vllm_real_lines", (any::<usize>(), prop::collection::vec(line_edit(), 1..5)), |(which, edits)| {
        vllm_case(real_seeds().vllm.clone(), which, &edits, Some(60))
    });
}

#[test]
fn mixtral_lines() {
    fuzz("mixtral_lines", (mixtral_doc(), edits()), |(lines, edits)| mixtral_case(lines, &edits));
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn mixtral_real_lines() {
    assert!(!real_seeds().mixtral.is_empty(), "no Mixtral seed lines under MOE_OFFLOAD_REAL_DATA");
    fuzz("mixtral_real_lines", prop::collection::vec(line_edit(), 1..5), |edits| {
        mixtral_case(real_seeds().mixtral.clone(), &edits)
    });
}
