//! The recorder on hand-made tensors laid out as llama.cpp lays them out.

use std::collections::BTreeMap;

use trace_io::{Phase, ScoreKind, TraceMeta};

use super::*;

/// A tensor's data: 4-byte values and the strides to read them by.
struct Fake {
    name: String,
    dtype: Dtype,
    ne: [i64; 4],
    nb: [usize; 4],
    bytes: Vec<u8>,
}

impl Fake {
    fn feed(&self, r: &mut Recorder) -> Result<()> {
        let bytes = &self.bytes;
        let mut read = |off: usize, buf: &mut [u8]| -> Result<()> {
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok(())
        };
        r.tensor(Tensor { name: &self.name, dtype: self.dtype, ne: self.ne, nb: self.nb, read: &mut read })
    }
}

/// `ffn_moe_logits-<l>`: `[E, T]`, contiguous.
fn logits(l: u32, rows: &[&[f32]]) -> Fake {
    let e = rows[0].len();
    Fake {
        name: format!("ffn_moe_logits-{l}"),
        dtype: Dtype::F32,
        ne: [e as i64, rows.len() as i64, 1, 1],
        nb: [4, 4 * e, 4 * e * rows.len(), 4 * e * rows.len()],
        bytes: rows.iter().flat_map(|r| r.iter()).flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// `ffn_moe_topk-<l>`: the first k columns of a full argsort of E ids per token (a strided view).
fn topk(l: u32, k: usize, argsort: &[&[i32]]) -> Fake {
    let e = argsort[0].len();
    Fake {
        name: format!("ffn_moe_topk-{l}"),
        dtype: Dtype::I32,
        ne: [k as i64, argsort.len() as i64, 1, 1],
        nb: [4, 4 * e, 4 * e * argsort.len(), 4 * e * argsort.len()],
        bytes: argsort.iter().flat_map(|r| r.iter()).flat_map(|v| v.to_le_bytes()).collect(),
    }
}

/// A weight stage `[1, k, T]`.
fn weights(stem: &str, l: u32, rows: &[&[f32]]) -> Fake {
    let k = rows[0].len();
    Fake {
        name: format!("{stem}-{l}"),
        dtype: Dtype::F32,
        ne: [1, k as i64, rows.len() as i64, 1],
        nb: [4, 4, 4 * k, 4 * k * rows.len()],
        bytes: rows.iter().flat_map(|r| r.iter()).flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn meta() -> TraceMeta {
    TraceMeta {
        model: "tiny".into(),
        num_experts: 0,
        top_k: 0,
        layer_ids: vec![],
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: "test".into(),
        extra: BTreeMap::new(),
    }
}

fn recorder(m: usize) -> Recorder {
    Recorder::new(RecorderConfig { num_experts: 4, top_k: 2, candidates: m }).unwrap()
}

/// Two tokens of two layers (blocks 1 and 3), E = 4, k = 2: the rows, by hand.
#[test]
fn rows_put_the_used_ids_first_then_the_rest_by_logit() {
    let mut r = recorder(3);
    r.begin_sequence();
    for f in [
        logits(1, &[&[0.5, 2.0, 1.0, -1.0], &[0.0, 0.0, 3.0, 1.0]]),
        topk(1, 2, &[&[1, 2, 0, 3], &[2, 3, 0, 1]]),
        weights("ffn_moe_weights", 1, &[&[0.6, 0.3], &[0.8, 0.1]]),
        weights("ffn_moe_weights_norm", 1, &[&[0.66, 0.34], &[0.9, 0.1]]),
        logits(3, &[&[1.0, 1.0, 0.0, 5.0], &[4.0, 3.0, 2.0, 1.0]]),
        topk(3, 2, &[&[3, 0, 1, 2], &[0, 1, 2, 3]]),
        weights("ffn_moe_weights", 3, &[&[0.5, 0.5], &[0.7, 0.3]]),
    ] {
        f.feed(&mut r).unwrap();
    }
    r.end_batch(2, Phase::Prefill).unwrap();
    let (trace, seen) = r.finish(meta()).unwrap();
    let v = trace.view();
    assert_eq!(v.meta().layer_ids, vec![1, 3]);
    assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::Logits, Phase::Prefill));
    assert_eq!(seen.candidates, 3);
    // Layer 1, token 0: used 1, 2; then 0 (0.5) before 3 (-1.0). Token 1: used 2, 3; then 0 and 1
    // tie at 0.0: the lower id.
    assert_eq!(v.row(0, 0), &[1, 2, 0]);
    assert_eq!(v.row(0, 1), &[2, 3, 0]);
    // Layer 3, token 0: used 3, 0; then 0 and 1 tie at 1.0 but 0 is used: 1.
    assert_eq!(v.row(1, 0), &[3, 0, 1]);
    assert_eq!(v.row(1, 1), &[0, 1, 2]);
    let parts = v.parts();
    assert_eq!(&parts.scores.unwrap()[..3], &[2.0, 1.0, 0.5]);
    // The last weight stage a layer shows is the gate: `_norm` for layer 1, the raw one for 3.
    assert_eq!(&parts.gates.unwrap()[..4], &[0.66, 0.34, 0.9, 0.1]);
    assert_eq!(&parts.gates.unwrap()[4..], &[0.5, 0.5, 0.7, 0.3]);
}

#[test]
fn used_ids_that_are_not_the_logits_top_k_drop_scores_and_keep_the_used_ids() {
    // A selection bias made the runtime use 0 and 3 although 1 has the higher logit.
    let mut r = recorder(4);
    r.begin_sequence();
    logits(0, &[&[1.0, 3.0, 0.0, 2.0]]).feed(&mut r).unwrap();
    topk(0, 2, &[&[0, 3, 1, 2]]).feed(&mut r).unwrap();
    weights("ffn_moe_weights", 0, &[&[0.5, 0.5]]).feed(&mut r).unwrap();
    weights("ffn_moe_probs_biased", 0, &[&[0.0; 4]]).feed(&mut r).unwrap();
    r.end_batch(1, Phase::Decode).unwrap();
    let (trace, seen) = r.finish(meta()).unwrap();
    assert_eq!((seen.disordered_rows, seen.selection_bias, seen.scores, seen.candidates), (1, true, false, 2));
    let v = trace.view();
    assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::None, Phase::Decode));
    assert_eq!(v.row(0, 0), &[0, 3]);
}

#[test]
fn sequences_and_phases_are_counted() {
    let mut r = recorder(2);
    for seq in 0..2 {
        r.begin_sequence();
        for (n, phase) in [(3, Phase::Prefill), (1, Phase::Decode), (1, Phase::Decode)] {
            let row = [seq, 1 - seq, 2, 3];
            let arg: Vec<&[i32]> = vec![&row; n];
            topk(0, 2, &arg).feed(&mut r).unwrap();
            weights("ffn_moe_weights", 0, &vec![&[0.5f32, 0.5][..]; n]).feed(&mut r).unwrap();
            r.end_batch(n, phase).unwrap();
        }
    }
    let (trace, seen) = r.finish(meta()).unwrap();
    assert_eq!((seen.prefill_tokens, seen.decode_tokens, seen.scores), (6, 4, false));
    let v = trace.view();
    assert_eq!(v.meta().phase, Phase::Mixed);
    assert_eq!(v.seq_offsets().unwrap(), &[0, 5]);
    // Each llama_decode is an engine step: the prefill batch, then one per decode token.
    assert_eq!(v.step_offsets().unwrap(), &[0, 3, 4, 5, 8, 9]);
    assert_eq!(v.meta().extra["decode_tokens"], "4");
}

/// Each row a way a recorded tensor or row can be wrong, and the error's text.
#[test]
fn bad_tensors_and_rows_are_refused_by_name() {
    let check = |feed: &[Fake], n: usize, expect: &str| {
        let mut r = recorder(2);
        r.begin_sequence();
        let err = feed
            .iter()
            .try_for_each(|f| f.feed(&mut r))
            .and_then(|()| r.end_batch(n, Phase::Prefill))
            .expect_err(expect)
            .to_string();
        assert!(err.contains(expect), "{err} lacks {expect}");
    };
    let w = |n: usize| weights("ffn_moe_weights", 0, &vec![&[0.5f32, 0.5][..]; n]);
    // The last layer saw 1 of 2 tokens (llama.cpp's output-rows shortcut).
    check(&[topk(0, 2, &[&[0, 1, 2, 3]]), w(1)], 2, "`ffn_moe_topk-0`: 1 of the batch's 2 tokens");
    check(&[topk(0, 2, &[&[0, 4, 2, 3]]), w(1)], 1, "layer 0, token 0: the runtime used expert 4, outside 0..4");
    check(&[topk(0, 2, &[&[1, 1, 2, 3]]), w(1)], 1, "used expert 1 twice");
    check(&[topk(0, 2, &[&[0, 1, 2, 3]])], 1, "`ffn_moe_weights-0`: never reached");
    check(&[topk(0, 2, &[&[0, 1, 2, 3]]), weights("ffn_moe_weights", 0, &[&[0.5, -0.1]])], 1, "gate weight -0.1");
    let mut wrong_type = topk(0, 2, &[&[0, 1, 2, 3]]);
    wrong_type.dtype = Dtype::F32;
    check(&[wrong_type], 1, "`ffn_moe_topk-0`: element type F32, expected I32");
    check(&[logits(0, &[&[0.0; 3]])], 1, "`ffn_moe_logits-0`: extents [3, 1, 1, 1]");
}

#[test]
fn a_config_outside_its_ranges_is_refused() {
    for (e, k, m) in [(4, 0, 2), (4, 3, 2), (4, 2, 5), (70_000, 2, 2)] {
        assert!(Recorder::new(RecorderConfig { num_experts: e, top_k: k, candidates: m }).is_err(), "{e} {k} {m}");
    }
    assert!(matches!(recorder(2).finish(meta()), Err(CaptureError::Config(_))));
}
