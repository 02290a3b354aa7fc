//! Fuzzing the trace reader: hostile bytes never panic, the mapped and the in-memory opener agree,
//! every accepted trace obeys every content rule of SEMANTICS.md §1 (checked here by an
//! independent implementation), and every refusal formats as a message.
//!
//! Inputs: arbitrary bytes; arbitrary bytes behind a plausible length prefix; byte-level mutations
//! (flips, overwritten runs, truncation, a rewritten header length) and header-level mutations
//! (metadata values, dtypes, shapes, data offsets, tensors removed or added, re-serialized with a
//! correct prefix) of seed traces. The seeds: a tiny trace with every tensor, the embedded default
//! calibration trace, and, with `MOE_OFFLOAD_REAL_DATA` set, the real ESFT, vLLM and Mixtral
//! traces imported by the importers; each seed keeps its source's header (metadata, layers, E, k,
//! tensors) and its first tokens.
//!
//! Each property runs `PROPTEST_CASES` cases (default 512) per round from a fixed seed, and keeps
//! running rounds (new seeds) for `MOE_OFFLOAD_FUZZ_SECS` seconds when that is set; the number of
//! executions is printed. A long run:
//! `PROPTEST_CASES=20000 MOE_OFFLOAD_FUZZ_SECS=600 cargo test -p trace-io --release --test fuzz -- --nocapture`.

mod fuzzing;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use fuzzing::{check_rules, formatted, fuzz, real_dir};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceError, TraceFile, TraceMeta, TraceView, write_trace};

fn meta(model: &str, e: u32, k: u32, layers: Vec<u32>) -> TraceMeta {
    TraceMeta {
        model: model.into(),
        num_experts: e,
        top_k: k,
        layer_ids: layers,
        score_kind: ScoreKind::Logits,
        phase: Phase::Mixed,
        source: "proptest".into(),
        extra: BTreeMap::new(),
    }
}

/// The bytes of `data` as written by [`write_trace`].
fn bytes_of(data: &TraceData) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("seed.safetensors");
    write_trace(&p, &data.view()).unwrap();
    std::fs::read(&p).unwrap()
}

/// A valid trace with every tensor: 2 layers, 5 tokens, m = 3, k = 2, E = 6.
fn tiny() -> Vec<u8> {
    let (l, t, k) = (2, 5, 2);
    let ids: Vec<u16> = (0..l * t).flat_map(|r| [(r % 6) as u16, ((r + 1) % 6) as u16, ((r + 2) % 6) as u16]).collect();
    let scores: Vec<f32> = (0..l * t).flat_map(|_| [1.0, 0.5, -2.0]).collect();
    let parts = OwnedParts {
        ids,
        scores: Some(scores),
        gates: Some(vec![0.25; l * t * k]),
        out_norms: Some(vec![1.5; l * t * k]),
        seq_offsets: Some(vec![0, 3]),
        step_offsets: Some(vec![0, 1, 4]),
    };
    bytes_of(&TraceData::new(meta("fuzz", 6, 2, vec![3, 7]), t, 3, parts).unwrap())
}

/// The first `n` tokens of every layer of `v`, with its metadata: a small trace with the header
/// of a real one.
fn shrink<'a>(v: &TraceView<'a>, n: usize) -> Vec<u8> {
    let s = v.shape();
    let n = n.min(s.tokens);
    let take = |w: usize, get: &dyn Fn(usize) -> Option<&'a [f32]>| -> Option<Vec<f32>> {
        (0..s.layers).map(|l| get(l).map(|x| x[..n * w].to_vec())).collect::<Option<Vec<_>>>().map(|v| v.concat())
    };
    let below = |o: Option<&[u64]>| o.map(|o| o.iter().copied().filter(|&t| t < n as u64).collect::<Vec<_>>());
    let parts = OwnedParts {
        ids: (0..s.layers).flat_map(|l| v.layer_ids(l)[..n * s.candidates].to_vec()).collect(),
        scores: take(s.candidates, &|l| v.layer_scores(l)),
        gates: take(s.top_k, &|l| v.layer_gates(l)),
        out_norms: take(s.top_k, &|l| v.layer_out_norms(l)),
        seq_offsets: below(v.seq_offsets()),
        step_offsets: below(v.step_offsets()),
    };
    bytes_of(&TraceData::new(v.meta().clone(), n, s.candidates, parts).unwrap())
}

/// The seed traces (name, bytes).
fn seeds() -> &'static [(String, Vec<u8>)] {
    static SEEDS: OnceLock<Vec<(String, Vec<u8>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut v = vec![("tiny".to_string(), tiny())];
        let calib = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/default-calib.safetensors"))
            .expect("the embedded default trace");
        v.push(("default-calib".into(), shrink(&TraceFile::from_bytes(&calib).unwrap().view(), 7)));
        if let Some(dir) = real_dir() {
            use trace_io::import::esft::{EsftOptions, import_esft};
            use trace_io::import::mixtral_jsonl::{MixtralJsonlOptions, import_mixtral_jsonl};
            use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};
            let opts = EsftOptions { domains: vec!["translation".into()], ..Default::default() };
            let esft = import_esft(dir.join("esft-dsv2lite"), &opts).unwrap();
            v.push(("esft".into(), shrink(&esft.view(), 9)));
            let logs: Vec<PathBuf> = std::fs::read_dir(dir.join("vllm-routelog-qwen15moe"))
                .unwrap()
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
                .collect();
            let opts = VllmRoutelogOptions { num_experts: Some(60), ..Default::default() };
            let vllm = import_vllm_routelog(&logs, &opts).unwrap().trace;
            // Past the two prefill steps (65 + 1406 rows) into the decode steps.
            v.push(("vllm".into(), shrink(&vllm.view(), 1530)));
            let path = dir.join("mixtral-decode/gsm8k_2_routing.jsonl");
            let mixtral = import_mixtral_jsonl(path, &MixtralJsonlOptions::default()).unwrap().trace;
            v.push(("mixtral".into(), shrink(&mixtral.view(), 9)));
        }
        v
    })
}

/// Opens `bytes` in memory and as a mapped file; both agree; an accepted trace obeys §1.
fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    thread_local! {
        static FILE: (tempfile::TempDir, PathBuf) = {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("case.safetensors");
            (dir, p)
        };
    }
    let heap = TraceFile::from_bytes(bytes);
    let mapped = FILE.with(|(_, p)| {
        std::fs::write(p, bytes).unwrap();
        TraceFile::open(p).map_err(|e| match e {
            TraceError::File { source, .. } => *source,
            other => panic!("open did not name the file: {other}"),
        })
    });
    match (&heap, &mapped) {
        (Ok(h), Ok(m)) => {
            check_rules(&h.view())?;
            let (hv, mv) = (h.view(), m.view());
            prop_assert_eq!(hv.shape(), mv.shape());
            prop_assert_eq!(hv.parts().ids, mv.parts().ids);
            prop_assert_eq!(hv.meta(), mv.meta());
            fuzzing::accepted();
        }
        (Err(h), Err(m)) => {
            let (h, m) = (formatted(h)?, formatted(m)?);
            prop_assert_eq!(h, m, "the mapped and the in-memory opener disagree");
        }
        (h, m) => {
            return Err(TestCaseError::fail(format!(
                "in memory: {:?}, mapped: {:?}",
                h.as_ref().map(|_| "ok"),
                m.as_ref().map(|_| "ok")
            )));
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
enum ByteEdit {
    Flip { at: usize, mask: u8 },
    Overwrite { at: usize, bytes: Vec<u8> },
    Truncate { at: usize },
    HeaderLen { len: u64 },
}

fn byte_edit() -> impl Strategy<Value = ByteEdit> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(at, mask)| ByteEdit::Flip { at, mask }),
        (any::<usize>(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| ByteEdit::Overwrite { at, bytes }),
        any::<usize>().prop_map(|at| ByteEdit::Truncate { at }),
        prop_oneof![any::<u64>(), 0u64..2048].prop_map(|len| ByteEdit::HeaderLen { len }),
    ]
}

fn apply_bytes(bytes: &mut Vec<u8>, m: &ByteEdit) {
    if bytes.is_empty() {
        return;
    }
    let n = bytes.len();
    match m {
        ByteEdit::Flip { at, mask } => bytes[at % n] ^= mask,
        ByteEdit::Overwrite { at, bytes: b } => {
            for (i, &x) in b.iter().enumerate() {
                if let Some(slot) = bytes.get_mut(at % n + i) {
                    *slot = x;
                }
            }
        }
        ByteEdit::Truncate { at } => bytes.truncate(at % n),
        ByteEdit::HeaderLen { len } => {
            if n >= 8 {
                bytes[..8].copy_from_slice(&len.to_le_bytes());
            }
        }
    }
}

/// Values that sit on the boundaries the reader checks.
fn interesting_number() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        (0u64..70).prop_map(serde_json::Value::from),
        prop::sample::select(vec![255u64, 256, 4096, 65_535, 65_536, 65_537, 1 << 31, 1 << 32, u64::MAX / 2, u64::MAX])
            .prop_map(serde_json::Value::from),
        (-3i64..0).prop_map(serde_json::Value::from),
        Just(serde_json::json!(1.5)),
        Just(serde_json::json!("7")),
        Just(serde_json::Value::Null),
    ]
}

fn metadata_value() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u64..70).prop_map(|n| n.to_string()),
        prop::sample::select(vec![
            "0",
            "1",
            "2",
            "65536",
            "65537",
            "-1",
            "4294967296",
            "[]",
            "[0]",
            "[0,0]",
            "[1,2,3]",
            "[3,7]",
            "[0,1]",
            "[4294967296]",
            "logits",
            "log_probs",
            "log_probs_renormalized",
            "none",
            "prefill",
            "decode",
            "mixed",
            "unknown",
            "moe-offload-trace",
            "2",
            "",
            " 1",
            "1 ",
            "NaN",
            "{}",
        ])
        .prop_map(str::to_string),
        "\\PC{0,12}",
    ]
}

#[derive(Debug, Clone)]
enum HeaderEdit {
    SetMeta { key: usize, value: String },
    RemoveMeta { key: usize },
    Dtype { tensor: usize, dtype: &'static str },
    ShapeDim { tensor: usize, dim: usize, value: serde_json::Value },
    ShapeLen { tensor: usize, len: usize },
    Offset { tensor: usize, end: bool, delta: i64 },
    Remove { tensor: usize },
    Add { name: &'static str, dtype: &'static str, shape: Vec<u64>, offsets: (u64, u64) },
    Rename { tensor: usize, name: &'static str },
}

const META_KEYS: [&str; 11] = [
    "format",
    "format_version",
    "model",
    "num_experts",
    "top_k",
    "layer_ids",
    "score_kind",
    "phase",
    "source",
    "domains",
    "floored_probs",
];
const NAMES: [&str; 8] =
    ["ids", "scores", "gates", "out_norms", "seq_offsets", "step_offsets", "extra", "__metadata__"];
const DTYPES: [&str; 10] = ["U16", "F32", "U64", "F16", "BF16", "I16", "U8", "BOOL", "F64", "X"];

fn header_edit() -> impl Strategy<Value = HeaderEdit> {
    let dtype = prop::sample::select(DTYPES.to_vec());
    let name = prop::sample::select(NAMES.to_vec());
    prop_oneof![
        (any::<usize>(), metadata_value()).prop_map(|(key, value)| HeaderEdit::SetMeta { key, value }),
        any::<usize>().prop_map(|key| HeaderEdit::RemoveMeta { key }),
        (any::<usize>(), dtype.clone()).prop_map(|(tensor, dtype)| HeaderEdit::Dtype { tensor, dtype }),
        (any::<usize>(), any::<usize>(), interesting_number()).prop_map(|(tensor, dim, value)| HeaderEdit::ShapeDim {
            tensor,
            dim,
            value
        }),
        (any::<usize>(), 0usize..5).prop_map(|(tensor, len)| HeaderEdit::ShapeLen { tensor, len }),
        (any::<usize>(), any::<bool>(), prop_oneof![-16i64..16, any::<i64>()])
            .prop_map(|(tensor, end, delta)| HeaderEdit::Offset { tensor, end, delta }),
        any::<usize>().prop_map(|tensor| HeaderEdit::Remove { tensor }),
        (name.clone(), dtype, prop::collection::vec(0u64..20, 0..4), (0u64..600, 0u64..600))
            .prop_map(|(name, dtype, shape, offsets)| HeaderEdit::Add { name, dtype, shape, offsets }),
        (any::<usize>(), name).prop_map(|(tensor, name)| HeaderEdit::Rename { tensor, name }),
    ]
}

/// Applies header edits to a trace's JSON header and re-serializes it with a correct length
/// prefix and padding, before the unchanged data section. `None` when the seed has no readable header.
fn apply_header(bytes: &[u8], edits: &[HeaderEdit]) -> Option<Vec<u8>> {
    let n = usize::try_from(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?)).ok()?;
    let header = bytes.get(8..8 + n)?;
    let data = &bytes[8 + n..];
    let mut map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(header).ok()?;
    for e in edits {
        let tensors: Vec<String> = map.keys().filter(|k| *k != "__metadata__").cloned().collect();
        let pick = |i: usize| (!tensors.is_empty()).then(|| tensors[i % tensors.len()].clone());
        match e {
            HeaderEdit::SetMeta { key, value } => {
                if let Some(md) = map.get_mut("__metadata__").and_then(|m| m.as_object_mut()) {
                    md.insert(META_KEYS[key % META_KEYS.len()].into(), value.clone().into());
                }
            }
            HeaderEdit::RemoveMeta { key } => {
                if let Some(md) = map.get_mut("__metadata__").and_then(|m| m.as_object_mut()) {
                    md.remove(META_KEYS[key % META_KEYS.len()]);
                }
            }
            HeaderEdit::Dtype { tensor, dtype } => {
                if let Some(t) = pick(*tensor) {
                    map[&t]["dtype"] = (*dtype).into();
                }
            }
            HeaderEdit::ShapeDim { tensor, dim, value } => {
                if let Some(t) = pick(*tensor)
                    && let Some(shape) = map[&t]["shape"].as_array_mut()
                    && !shape.is_empty()
                {
                    let i = dim % shape.len();
                    shape[i] = value.clone();
                }
            }
            HeaderEdit::ShapeLen { tensor, len } => {
                if let Some(t) = pick(*tensor)
                    && let Some(shape) = map[&t]["shape"].as_array_mut()
                {
                    shape.resize(*len, serde_json::json!(1));
                }
            }
            HeaderEdit::Offset { tensor, end, delta } => {
                if let Some(t) = pick(*tensor)
                    && let Some(offs) = map[&t]["data_offsets"].as_array_mut()
                    && offs.len() == 2
                {
                    let i = usize::from(*end);
                    let v = offs[i].as_u64().unwrap_or(0).wrapping_add_signed(*delta);
                    offs[i] = v.into();
                }
            }
            HeaderEdit::Remove { tensor } => {
                if let Some(t) = pick(*tensor) {
                    map.remove(&t);
                }
            }
            HeaderEdit::Add { name, dtype, shape, offsets } => {
                map.insert(
                    (*name).into(),
                    serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offsets.0, offsets.1]}),
                );
            }
            HeaderEdit::Rename { tensor, name } => {
                if let Some(t) = pick(*tensor)
                    && let Some(v) = map.remove(&t)
                {
                    map.insert((*name).into(), v);
                }
            }
        }
    }
    let mut h = serde_json::to_vec(&map).ok()?;
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    Some(out)
}

#[test]
fn the_seeds_open_and_obey_the_rules() {
    let seeds = seeds();
    assert!(seeds.len() >= 2);
    for (name, bytes) in seeds {
        let f = TraceFile::from_bytes(bytes).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        check_rules(&f.view()).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        check(bytes).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
    assert_eq!(TraceFile::from_bytes(&seeds[0].1).unwrap().view().shape().tokens, 5);
}

#[test]
fn arbitrary_bytes_never_panic() {
    fuzz("arbitrary_bytes", prop::collection::vec(any::<u8>(), 0..512), |b| check(&b));
}

#[test]
fn arbitrary_headers_never_panic() {
    let s = ("\\PC{0,200}", prop::collection::vec(any::<u8>(), 0..64));
    fuzz("arbitrary_headers", s, |(header, data)| {
        let mut b = (header.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(header.as_bytes());
        b.extend_from_slice(&data);
        check(&b)
    });
}

#[test]
fn byte_mutations_of_the_seeds_are_refused_or_obey_the_rules() {
    let seeds = seeds();
    fuzz("byte_mutations", (0..seeds.len(), prop::collection::vec(byte_edit(), 1..6)), |(s, edits)| {
        let mut b = seeds[s].1.clone();
        for e in &edits {
            apply_bytes(&mut b, e);
        }
        check(&b)
    });
}

#[test]
fn header_mutations_of_the_seeds_are_refused_or_obey_the_rules() {
    let seeds = seeds();
    fuzz("header_mutations", (0..seeds.len(), prop::collection::vec(header_edit(), 1..5)), |(s, edits)| {
        let b = apply_header(&seeds[s].1, &edits).expect("the seeds have a readable header");
        check(&b)
    });
}

#[test]
fn single_header_bytes_of_the_seeds() {
    // Mutations aimed at the JSON header, where the parser's branches are.
    let seeds = seeds();
    fuzz("header_bytes", (0..seeds.len(), any::<usize>(), any::<u8>()), |(s, at, byte)| {
        let mut b = seeds[s].1.clone();
        let header_len = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
        b[8 + at % header_len] = byte;
        check(&b)
    });
}
