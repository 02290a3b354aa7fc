//! The JSON Lines importers on the real logs in `$MOE_OFFLOAD_REAL_DATA`: vLLM route logs of
//! Qwen1.5-MoE-A2.7B-Chat (`vllm-routelog-qwen15moe/`) and Mixtral-8x7B decode routing
//! (`mixtral-decode/`). Figures asserted here are the ones `docs/importers.md` quotes.

use std::path::PathBuf;

use trace_io::import::mixtral_jsonl::{MixtralJsonlOptions, import_mixtral_jsonl};
use trace_io::import::vllm_routelog::{VllmRoutelogOptions, import_vllm_routelog};
use trace_io::import::{DropReason, PROB_FLOOR};
use trace_io::{Phase, ScoreKind, TraceError, TraceFile, write_trace};

const LAYERS: [u32; 5] = [0, 8, 12, 18, 23];

fn vllm_files(real: &std::path::Path) -> Vec<PathBuf> {
    // Deliberately not in layer order: the importer sorts by the files' layer field.
    [23, 0, 12, 8, 18].iter().map(|l| real.join(format!("vllm-routelog-qwen15moe/moe_layer{l}.jsonl"))).collect()
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn vllm_routelog_five_layers_align_and_lose_their_warmup() {
    let real = real_data::dir();
    let files = vllm_files(&real);
    // The meta lines do not record num_experts: it must be given.
    let e = import_vllm_routelog(&files, &VllmRoutelogOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::Config { key: "num_experts", .. }), "{e}");

    let opts = VllmRoutelogOptions { num_experts: Some(60), ..Default::default() };
    let out = import_vllm_routelog(&files, &opts).unwrap();
    let v = out.trace.view();
    let s = v.shape();
    // 12,805 route rows per file; warm-up 8,192 + 256; then 65 + 1,406 prefill rows and decode steps.
    assert_eq!((s.layers, s.tokens, s.num_experts, s.top_k, s.candidates), (5, 4357, 60, 4, 4));
    assert_eq!(v.meta().layer_ids, LAYERS);
    assert_eq!(v.meta().model, "Qwen/Qwen1.5-MoE-A2.7B-Chat");
    assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::LogProbs, Phase::Mixed));
    let steps = v.step_offsets().unwrap();
    assert_eq!(steps.len(), 129);
    assert_eq!(&steps[..4], &[0, 65, 65 + 1406, 65 + 1406 + 25]);
    let r = &out.report;
    assert_eq!((r.files, r.records_read, r.tokens, r.layers, r.steps), (5, 5 * 12805, 4357, 5, Some(129)));
    assert_eq!(r.dropped.len(), 1);
    assert_eq!((r.dropped[0].reason, r.dropped[0].tokens, r.dropped[0].records), (DropReason::WarmUp, 8448, 5 * 8448));
    assert_eq!(r.floored_probs, 0);
    // One region of two warm-up batches, reported and recorded; one engine run, nothing to warn.
    assert!(
        r.dropped[0].detail.starts_with(
            "rows 0..8448 (lines 2-8449 of each file; engine steps 0-1): 8192 rows with one identical route, \
             then 256 rows with one identical route"
        ),
        "{}",
        r.dropped[0].detail
    );
    assert_eq!(v.meta().extra["dummy_rows"], "0..8192 identical_route,8192..8448 identical_route");
    assert_eq!(v.seq_offsets(), None);
    assert_eq!(r.sequences, None);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    assert!(v.meta().extra["gates"].ends_with("not renormalized"));
    // Decode steps shrink from 25 rows to 11 as requests finish.
    let sizes: Vec<u64> = steps.windows(2).map(|w| w[1] - w[0]).chain([s.tokens as u64 - steps[128]]).collect();
    assert_eq!((sizes[2], sizes[128]), (25, 11));
    assert!(sizes[2..].windows(2).all(|w| w[1] <= w[0]));
    // Gates are the recorded softmax probabilities (not renormalized): a top-4 row sums below 1.
    for l in 0..s.layers {
        for row in v.layer_gates(l).unwrap().chunks_exact(4) {
            let sum: f32 = row.iter().sum();
            assert!(sum > 0.0 && sum <= 1.0001, "row sum {sum}");
            assert!(row.windows(2).all(|w| w[0] >= w[1]));
        }
    }
    // Round trip.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("qwen.safetensors");
    write_trace(&p, &v).unwrap();
    let f = TraceFile::open(&p).unwrap();
    assert_eq!(f.view().parts().ids, v.parts().ids);
    assert_eq!(f.view().step_offsets(), v.step_offsets());

    // Keeping the warm-up keeps every row.
    let kept = import_vllm_routelog(&files, &VllmRoutelogOptions { keep_warmup: true, ..opts }).unwrap();
    assert_eq!(kept.trace.view().shape().tokens, 12805);
    assert_eq!(kept.trace.view().step_offsets().unwrap().len(), 131);
    assert!(kept.report.dropped.is_empty());
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn vllm_routelog_single_layer_and_a_misaligned_pair() {
    let real = real_data::dir();
    let dir = real.join("vllm-routelog-qwen15moe");
    let opts = VllmRoutelogOptions { num_experts: Some(60), ..Default::default() };
    let one = import_vllm_routelog(&[dir.join("moe_layer8.jsonl")], &opts).unwrap();
    assert_eq!(one.trace.view().meta().layer_ids, vec![8]);
    assert_eq!(one.trace.view().shape().tokens, 4357);
    // A copy of layer 0 with its last decode step cut off no longer aligns with layer 8.
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(dir.join("moe_layer0.jsonl")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let cut = tmp.path().join("moe_layer0.jsonl");
    std::fs::write(&cut, lines[..lines.len() - 11].join("\n")).unwrap();
    let e = import_vllm_routelog(&[dir.join("moe_layer8.jsonl"), cut], &opts).unwrap_err().to_string();
    assert!(e.contains("batch structure differs") && e.contains("step 130"), "{e}");
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn mixtral_decode_keeps_tokens_of_every_layer() {
    let real = real_data::dir();
    let path = real.join("mixtral-decode/gsm8k_2_routing.jsonl");
    let out = import_mixtral_jsonl(&path, &MixtralJsonlOptions::default()).unwrap();
    let v = out.trace.view();
    let s = v.shape();
    assert_eq!((s.layers, s.tokens, s.num_experts, s.top_k, s.candidates), (32, 244, 8, 2, 2));
    assert_eq!(v.meta().layer_ids, (0..32).collect::<Vec<u32>>());
    // Problem 0 keeps tokens 0..=165, problem 1 tokens 0..=77.
    assert_eq!(v.seq_offsets().unwrap(), &[0, 166]);
    assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::LogProbsRenormalized, Phase::Decode));
    let r = &out.report;
    assert_eq!((r.records_read, r.tokens, r.layers, r.sequences, r.floored_probs), (7889, 244, 32, Some(2), 0));
    let d = &r.dropped[0];
    // (0, 166), (0, 167), (1, 78): 31 + 23 + 27 records.
    assert_eq!((d.reason, d.tokens, d.records), (DropReason::IncompleteToken, 3, 81));
    assert!(d.detail.contains("0 inside a sequence"), "{}", d.detail);
    // Renormalized over the top-2: each row of gates sums to 1.
    for l in 0..s.layers {
        for row in v.layer_gates(l).unwrap().chunks_exact(2) {
            assert!((row[0] + row[1] - 1.0).abs() < 1e-5 && row[0] >= row[1]);
        }
    }
    assert!(v.parts().scores.unwrap().iter().all(|&x| x >= PROB_FLOOR.ln()));
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn mixtral_decode_without_one_layer_is_refused() {
    let real = real_data::dir();
    let text = std::fs::read_to_string(real.join("mixtral-decode/gsm8k_2_routing.jsonl")).unwrap();
    let kept: Vec<&str> = text.lines().filter(|l| !l.contains("\"layer\": 13,")).collect();
    assert!(kept.len() < text.lines().count(), "the filter must remove layer 13's records");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("no-layer-13.jsonl");
    std::fs::write(&p, kept.join("\n")).unwrap();
    let e = import_mixtral_jsonl(&p, &MixtralJsonlOptions::default()).unwrap_err();
    assert!(matches!(e, TraceError::Import { format: "mixtral-jsonl", .. }), "{e}");
    assert!(e.to_string().contains("no record for layer 13, between layers 0 and 31"), "{e}");
}
