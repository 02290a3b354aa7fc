//! The fixtures in `tests/data/sglang/` were written by `python/make_runtime_fixtures.py`, which runs
//! the code path of SGLang's `per_token` recorder (`_DetailSinglePassGatherer`,
//! `_DetailAccumulator.dump`) and `torch.save`; their expected values are worked out by hand from
//! the ids that script writes.

use super::*;
use crate::Phase;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/sglang").join(name)
}

fn import(name: &str) -> Result<Imported> {
    import_sglang_dump(fixture(name), &SglangDumpOptions::default())
}

/// Layer-major ids of the trace, one Vec per layer.
fn ids(t: &TraceData) -> Vec<Vec<u16>> {
    let v = t.view();
    let s = v.shape();
    (0..s.layers).map(|l| v.layer_ids(l).to_vec()).collect()
}

#[test]
fn basic_dump_two_prompts_then_decode() {
    let out = import("basic.pt").unwrap();
    let (t, r) = (&out.trace, &out.report);
    let v = t.view();
    let s = v.shape();
    assert_eq!((s.layers, s.tokens, s.top_k, s.num_experts), (2, 7, 2, 4));
    assert_eq!(t.meta().layer_ids, vec![1, 2]);
    assert_eq!(t.meta().phase, Phase::Mixed);
    assert_eq!(v.step_offsets(), Some(&[0u64, 5][..]));
    assert_eq!(v.seq_offsets(), None);
    assert_eq!(
        ids(t),
        vec![vec![0, 1, 2, 3, 1, 2, 3, 0, 0, 2, 1, 0, 2, 1], vec![3, 2, 1, 0, 0, 3, 2, 1, 1, 3, 0, 1, 3, 2],]
    );
    assert_eq!((r.records_read, r.steps, r.sequences), (21, Some(2), None));
    let text = r.to_string();
    for want in [
        "3 records (forward passes): 2 with tokens (5 prefill, 2 decode, 0 mixed tokens), 1 idle or empty",
        "k = 2 (6 trailing columns -1 in every row: SGLang's recorder keeps 8 columns)",
        "layers: 2 routed, ids 1..=2; layers 0 never routed",
        "E = 4 (`last_physical_to_logical_map`: its largest expert + 1)",
        "no EPLB redundancy",
        "requests: 2 prompts started, 0 continued (chunked prefill or a cached prefix), 2 decode tokens",
        "nothing dropped",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    assert_eq!(t.meta().extra["prefill_tokens"], "5");
    assert_eq!(t.meta().extra["decode_tokens"], "2");
}

#[test]
fn physical_slots_are_mapped_to_logical_experts() {
    let out = import("eplb.pt").unwrap();
    let t = &out.trace;
    assert_eq!((t.view().shape().num_experts, t.view().shape().tokens), (3, 3));
    // Layer 0: slot 3 is expert 0; layer 1: slot 3 is expert 2.
    assert_eq!(ids(t), vec![vec![0, 1, 0, 2, 2, 0], vec![2, 0, 1, 2, 0, 1]]);
    assert_eq!(t.meta().phase, Phase::Prefill);
    assert_eq!(t.view().seq_offsets(), Some(&[0u64][..]));
    assert!(
        out.report.to_string().contains("ids: physical slots (4 per layer for 3 logical experts"),
        "{}",
        out.report
    );
    // --num-experts below the map's experts is refused.
    let opts = SglangDumpOptions { num_experts: Some(2), model: None };
    let e = import_sglang_dump(fixture("eplb.pt"), &opts).unwrap_err().to_string();
    assert!(e.contains("--num-experts 2, but `last_physical_to_logical_map` maps slots to expert ids up to 2"), "{e}");
}

#[test]
fn padded_tokens_are_dropped_and_chunks_counted() {
    let out = import("padded.pt").unwrap();
    let (t, r) = (&out.trace, &out.report);
    assert_eq!(t.view().shape().tokens, 5);
    assert_eq!(ids(t), vec![vec![0, 1, 2, 3, 1, 2, 0, 3, 2, 0], vec![1, 0, 3, 2, 2, 1, 3, 0, 0, 2]]);
    assert_eq!(t.view().step_offsets(), Some(&[0u64, 2][..]));
    assert_eq!(t.meta().phase, Phase::Mixed);
    assert_eq!((r.dropped[0].reason, r.dropped[0].tokens, r.dropped[0].records), (DropReason::Padding, 1, 2));
    assert!(r.to_string().contains("requests: 3 prompts started, 1 continued"), "{r}");
}

#[test]
fn hostile_dumps_are_refused_naming_the_place() {
    let cases: &[(&str, &str)] = &[
        ("all_padding.pt", "every row of every layer is padding"),
        (
            "id_out_of_range.pt",
            "records[0].topk_ids_of_layer[0, 0, 1] (layer index 0, token 0, slot 1): physical slot 7 >= the map's 4 slots",
        ),
        (
            "mixed_k.pt",
            "records[0].topk_ids_of_layer[0, 1, 1] (layer index 0, token 1, slot 1): -1 among the row's 2 ids (mixed k",
        ),
        ("float_ids.pt", "records[0]: `topk_ids_of_layer`: dtype torch.float32: expected integer expert ids"),
        ("missing_topk.pt", "records[0]: no key `topk_ids_of_layer` (the record has keys"),
        ("bad_seq_lens.pt", "records[0]: `extend_seq_lens` [3] add up to 3 tokens, the pass has 2"),
        ("stat_mode.pt", "this is a `stat`-mode dump"),
    ];
    for (file, want) in cases {
        let e = import(file).unwrap_err().to_string();
        assert!(e.starts_with("sglang-dump import, ") && e.contains(file), "{file}: {e}");
        assert!(e.contains(want), "{file}: {e}");
    }
    // Keys the importer does not read are named, not refused.
    let out = import("unknown_keys.pt").unwrap();
    assert!(out.report.to_string().contains("keys not read: note, records[].rids"), "{}", out.report);
}

#[test]
fn truncated_and_foreign_files_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(fixture("basic.pt")).unwrap();
    let cut = dir.path().join("cut.pt");
    for n in (0..bytes.len()).step_by(61) {
        std::fs::write(&cut, &bytes[..n]).unwrap();
        let e = import_sglang_dump(&cut, &SglangDumpOptions::default()).unwrap_err().to_string();
        assert!(e.contains("cut.pt"), "{n}: {e}");
    }
    std::fs::write(&cut, b"{\"records\": []}").unwrap();
    let e = import_sglang_dump(&cut, &SglangDumpOptions::default()).unwrap_err().to_string();
    assert!(e.contains("not a torch.save file (a zip archive holding data.pkl)"), "{e}");
    // A damaged storage: flip bytes inside the ids' data; torch's zip holds CRCs.
    let mut bad = bytes.clone();
    let at = bad.windows(4).position(|w| w == b"\xff\xff\xff\xff").unwrap();
    bad[at] = 0;
    std::fs::write(&cut, &bad).unwrap();
    assert!(import_sglang_dump(&cut, &SglangDumpOptions::default()).is_err());
}
