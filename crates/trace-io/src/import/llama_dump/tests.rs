use std::path::{Path, PathBuf};

use super::*;

/// One recorded session: per sequence a prompt (split into ubatches) then decode steps of one
/// token; `route(seq, token, layer)` is the token's top-k.
struct Session {
    layers: Vec<u32>,
    e: usize,
    k: usize,
    ubatch: usize,
    /// (prompt tokens, decode tokens) per sequence.
    seqs: Vec<(usize, usize)>,
    seed: u64,
    /// Route only the last token of a prompt ubatch through the last layer (llama.cpp's
    /// `inp_out_ids` gather when only the last logits are requested).
    outputs_only: bool,
}

impl Session {
    /// The argsort of one token's router probabilities (descending), a permutation of 0..E from
    /// a seeded hash: what `ffn_moe_argsort-<il>` holds for the token.
    fn argsort(&self, s: usize, t: usize, l: u32) -> Vec<i32> {
        let mut x = self.seed ^ ((s as u64) << 40) ^ ((t as u64) << 16) ^ u64::from(l);
        let mut keyed: Vec<(u64, i32)> = (0..self.e as i32)
            .map(|i| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 11, i)
            })
            .collect();
        keyed.sort_unstable();
        keyed.into_iter().map(|(_, i)| i).collect()
    }

    /// The eval callback's view of `ffn_moe_topk-<il>` for one evaluation: `ggml_argsort_top_k`
    /// is a view of the argsort (`ne = [k, n_tokens]`, `nb[1] = E * 4`), so the writer reads row `t`
    /// at byte `t * nb[1]`, k ids from there (a flat copy of the view would be wrong).
    fn topk_view(&self, s: usize, tokens: &[usize], l: u32) -> Vec<Vec<i32>> {
        let argsort: Vec<i32> = tokens.iter().flat_map(|&t| self.argsort(s, t, l)).collect();
        let nb1 = self.e;
        (0..tokens.len()).map(|row| argsort[row * nb1..row * nb1 + self.k].to_vec()).collect()
    }

    /// The evaluations in order: (sequence, token indices within the sequence, prompt?).
    fn evals(&self) -> Vec<(usize, Vec<usize>, bool)> {
        let mut out = Vec::new();
        for (s, &(p, d)) in self.seqs.iter().enumerate() {
            for start in (0..p).step_by(self.ubatch) {
                out.push((s, (start..(start + self.ubatch).min(p)).collect(), true));
            }
            out.extend((p..p + d).map(|t| (s, vec![t], false)));
        }
        out
    }

    /// Tokens an evaluation routes through layer `l`.
    fn routed(&self, tokens: &[usize], prompt: bool, l: u32) -> Vec<usize> {
        if self.outputs_only && prompt && Some(&l) == self.layers.last() {
            tokens[tokens.len() - 1..].to_vec()
        } else {
            tokens.to_vec()
        }
    }

    /// The CSV as a fork's callback writes it: for each evaluation, for each MoE layer, one row per
    /// token, `pos` = token index - prompt length (negative in the prompt).
    fn csv(&self, header: bool) -> String {
        let mut out = String::new();
        if header {
            let ids: Vec<String> = (0..self.k).map(|i| format!("id{i}")).collect();
            out.push_str(&format!("pos,layer,{}\n", ids.join(",")));
        }
        for (s, tokens, prompt) in self.evals() {
            for &l in &self.layers {
                let routed = self.routed(&tokens, prompt, l);
                for (t, ids) in routed.iter().zip(self.topk_view(s, &routed, l)) {
                    let pos = *t as i64 - self.seqs[s].0 as i64;
                    let ids: Vec<String> = ids.iter().map(i32::to_string).collect();
                    out.push_str(&format!("{pos},{l},{}\n", ids.join(",")));
                }
            }
        }
        out
    }

    /// The binary stream as a fork's callback writes it: one record per evaluation and layer.
    fn bin(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (s, tokens, prompt) in self.evals() {
            for &l in &self.layers {
                let routed = self.routed(&tokens, prompt, l);
                for x in [l as i32, routed.len() as i32, self.k as i32] {
                    out.extend_from_slice(&x.to_le_bytes());
                }
                for ids in self.topk_view(s, &routed, l) {
                    out.extend(ids.iter().flat_map(|x| x.to_le_bytes()));
                }
            }
        }
        out
    }

    /// The expected trace ids of layer index `li`, tokens in order.
    fn expected(&self, li: usize) -> Vec<u16> {
        let l = self.layers[li];
        let mut out = Vec::new();
        for (s, &(p, d)) in self.seqs.iter().enumerate() {
            for t in 0..p + d {
                out.extend(self.argsort(s, t, l)[..self.k].iter().map(|&x| x as u16));
            }
        }
        out
    }
}

fn session() -> Session {
    Session { layers: vec![1, 2, 3], e: 8, k: 2, ubatch: 4, seqs: vec![(6, 3), (3, 2)], seed: 7, outputs_only: false }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn opts(e: u32) -> LlamaDumpOptions {
    LlamaDumpOptions { num_experts: e, model: None }
}

#[test]
fn csv_as_the_callback_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = session();
    for header in [true, false] {
        let p = write(dir.path(), "r.csv", s.csv(header).as_bytes());
        let out = import_llama_csv(&p, &opts(8)).unwrap();
        let v = out.trace.view();
        let sh = v.shape();
        assert_eq!((sh.layers, sh.tokens, sh.top_k, sh.candidates, sh.num_experts), (3, 14, 2, 2, 8));
        for li in 0..3 {
            assert_eq!(v.layer_ids(li), &s.expected(li)[..], "layer index {li}");
        }
        assert_eq!(v.meta().layer_ids, vec![1, 2, 3]);
        assert_eq!((v.meta().phase, v.meta().score_kind), (Phase::Mixed, ScoreKind::None));
        assert_eq!(v.seq_offsets().unwrap(), &[0, 9]);
        assert_eq!(v.step_offsets(), None);
        assert_eq!((v.meta().extra["prefill_tokens"].as_str(), v.meta().extra["decode_tokens"].as_str()), ("9", "5"));
        let r = &out.report;
        assert_eq!((r.records_read, r.sequences, r.steps), (42, Some(2), None));
        assert!(r.dropped.is_empty() && r.warnings.is_empty(), "{r}");
        let notes = r.notes.join("\n");
        let h = if header { "header line present" } else { "no header line" };
        assert!(notes.contains(&format!("{h}; positions -6..=2")), "{notes}");
        assert!(notes.contains("3 MoE layers: ids 1, 2, 3") && notes.contains("9 prefill, 5 decode"), "{notes}");
    }
}

#[test]
fn bin_as_the_callback_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = session();
    let p = write(dir.path(), "r.bin", &s.bin());
    let out = import_llama_bin(&p, &opts(8)).unwrap();
    let v = out.trace.view();
    assert_eq!((v.shape().layers, v.shape().tokens, v.shape().top_k), (3, 14, 2));
    for li in 0..3 {
        assert_eq!(v.layer_ids(li), &s.expected(li)[..], "layer index {li}");
    }
    // Ubatches: 4 + 2 prompt tokens, 3 decode steps; 3 prompt tokens, 2 decode steps.
    assert_eq!(v.step_offsets().unwrap(), &[0, 4, 6, 7, 8, 9, 12, 13]);
    assert_eq!(v.seq_offsets().unwrap(), &[0, 9]);
    assert_eq!(v.meta().phase, Phase::Mixed);
    let r = &out.report;
    assert_eq!((r.records_read, r.sequences, r.steps), (24, Some(2), Some(8)));
    let notes = r.notes.join("\n");
    assert!(
        notes.contains("24 records in 8 ubatches (a ubatch starts at each record of layer 1): 3 of more"),
        "{notes}"
    );
    assert!(notes.contains("(2..=4 tokens, prefill), 5 of one token (decode); 2 sequences"), "{notes}");
}

#[test]
fn a_random_routing_in_both_formats_imports_to_the_same_ids() {
    let dir = tempfile::tempdir().unwrap();
    for seed in 1..6u64 {
        let s = Session {
            layers: vec![3, 5, 6, 9],
            e: 16 + seed as usize,
            k: 1 + seed as usize % 4,
            ubatch: 2 + seed as usize,
            seqs: vec![(7, 4), (2 + seed as usize, 3), (5, 1)],
            seed,
            outputs_only: false,
        };
        let e = s.e as u32;
        let a = import_llama_csv(write(dir.path(), "r.csv", s.csv(seed % 2 == 0).as_bytes()), &opts(e)).unwrap();
        let b = import_llama_bin(write(dir.path(), "r.bin", &s.bin()), &opts(e)).unwrap();
        let (a, b) = (a.trace.view(), b.trace.view());
        assert_eq!(a.shape(), b.shape(), "seed {seed}");
        for li in 0..4 {
            assert_eq!(a.layer_ids(li), b.layer_ids(li), "seed {seed}, layer index {li}");
            assert_eq!(a.layer_ids(li), &s.expected(li)[..], "seed {seed}, layer index {li}");
        }
        assert_eq!(a.seq_offsets(), b.seq_offsets(), "seed {seed}");
        assert_eq!((a.meta().layer_ids.clone(), a.meta().phase), (b.meta().layer_ids.clone(), b.meta().phase));
    }
}

#[test]
fn prompt_tokens_the_last_layer_skipped_are_dropped_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let s = Session { outputs_only: true, ..session() };
    let a = import_llama_csv(write(dir.path(), "r.csv", s.csv(true).as_bytes()), &opts(8)).unwrap();
    let b = import_llama_bin(write(dir.path(), "r.bin", &s.bin()), &opts(8)).unwrap();
    for out in [a, b] {
        // Of each prompt ubatch (4 + 2, then 3 tokens) only the last token passed layer 3.
        let r = &out.report;
        assert_eq!(r.tokens, 3 + 5, "{r}");
        assert_eq!((r.dropped[0].reason, r.dropped[0].tokens), (DropReason::IncompleteToken, 6));
        assert!(r.dropped[0].detail.contains("layer 3: 6"), "{r}");
        assert!(r.warnings[0].contains("only the last layer (3) misses tokens"), "{r}");
        assert_eq!(out.trace.view().seq_offsets().unwrap(), &[0, 5]);
    }
}

#[test]
fn csv_duplicate_rows_are_dropped_and_restarts_split_sequences() {
    let dir = tempfile::tempdir().unwrap();
    // A prompt-only sequence, the same prompt again (same length), a shorter one after a decode
    // step, and a duplicated row.
    let text = "-2,0,1,2\n-1,0,2,3\n-2,1,0,1\n-1,1,0,1\n-1,1,0,1\n\
                -2,0,3,2\n-1,0,2,1\n-2,1,1,0\n-1,1,1,0\n0,0,1,3\n0,1,0,3\n\
                -1,0,0,1\n-1,1,0,2\n";
    let out = import_llama_csv(write(dir.path(), "r.csv", text.as_bytes()), &opts(4)).unwrap();
    let v = out.trace.view();
    assert_eq!(v.seq_offsets().unwrap(), &[0, 2, 5]);
    assert_eq!(v.layer_ids(0), &[1, 2, 2, 3, 3, 2, 2, 1, 1, 3, 0, 1]);
    let d = &out.report.dropped[0];
    assert_eq!((d.reason, d.records, d.tokens), (DropReason::Duplicate, 1, 0));
    assert!(d.detail.contains("line 5"), "{}", d.detail);
}

#[test]
fn hostile_csv_is_refused_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let check = |input: &str, expect: &str| {
        let p = write(dir.path(), "h.csv", input.as_bytes());
        let e = import_llama_csv(&p, &opts(4)).unwrap_err().to_string();
        assert!(e.contains("h.csv") && e.contains(expect), "{input:?}: {e}");
    };
    check("", "no rows: the file is empty");
    check("\n\n", "no rows: the file is empty");
    check("pos,layer,id0\n", "a header line and no rows");
    check("pos,layer\n", "h.csv:1: header");
    check("-1,0,1,2\n-1,0,1,x\n", "h.csv:2: field 4 (id1) \"x\" is not an integer");
    check("a,0,1\n", "h.csv:1: field 1 (pos) \"a\" is not an integer");
    check("-1,0.5,1\n", "h.csv:1: field 2 (layer)");
    check("-1,-3,1\n", "h.csv:1: layer -3 is not a layer index");
    check("-1,0\n", "h.csv:1: no expert ids");
    check("-1\n", "h.csv:1: \"-1\": expected pos,layer");
    check("-1,0,1,2\n-1,1,1,2,3\n", "h.csv:2: 3 ids, but the first row has 2: k changes within the file (mixed k)");
    check("pos,layer,id0,id1\n-1,0,1\n", "h.csv:2: 1 ids, but the header has 2");
    check("-1,0,1,4\n", "h.csv:1: slot 1: expert id 4 is not in 0..4 (--num-experts 4): is --num-experts right?");
    check("-1,0,-1,2\n", "h.csv:1: slot 0: expert id -1 is not in 0..4");
    check("-1,0,2,2\n", "h.csv:1: slot 1: expert id 2 repeated");
    check("0,0,1,2\n0,1,1,2\n0,1,1,3\n", "h.csv:3: layer 1 recorded twice for the token at position 0 (line 2");
    check("-2,0,1,2\n-1,0,1,2\n-2,1,1,2\n-2,1,0,2\n", "h.csv:4: layer 1 recorded twice");
    check("-1,0,1,2\n0,1,1,2\n", "no token was routed by every one of the 2 layers seen (0, 1)");
    let e = import_llama_csv(write(dir.path(), "z.csv", b"-1,0,1\n"), &opts(0)).unwrap_err().to_string();
    assert!(e.contains("--num-experts 0"), "{e}");
}

/// One binary record.
fn rec(layer: i32, n: i32, k: i32, ids: &[i32]) -> Vec<u8> {
    [layer, n, k].iter().chain(ids).flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn hostile_bin_is_refused_with_file_and_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let check = |input: Vec<u8>, expect: &str| {
        let p = write(dir.path(), "h.bin", &input);
        let e = import_llama_bin(&p, &opts(4)).unwrap_err().to_string();
        assert!(e.contains("h.bin") && e.contains(expect), "{expect}: {e}");
    };
    let good = rec(0, 2, 2, &[0, 1, 2, 3]);
    let cat = |parts: &[&[u8]]| parts.concat();
    check(Vec::new(), "no records: the file is empty");
    check(good[..7].to_vec(), "record 0 at byte 0: truncated record: 7 bytes left, a record header is 12");
    check(good[..20].to_vec(), "record 0 at byte 0: truncated record: 2 tokens x k 2 need 16 bytes of ids, 8 left");
    check(cat(&[&good, &good[..3]]), "record 1 at byte 28: truncated record: 3 bytes left");
    check(rec(0, -1, 2, &[]), "record 0 at byte 0: n_tokens -1, k 2: both must be positive");
    check(rec(0, 1, -2, &[]), "n_tokens 1, k -2: both must be positive");
    check(rec(0, 1, 0, &[]), "n_tokens 1, k 0");
    check(rec(-1, 1, 1, &[0]), "record 0 at byte 0: layer -1 is negative");
    check(rec(0, i32::MAX, i32::MAX, &[]), "truncated record: 2147483647 tokens x k 2147483647 need");
    check(
        cat(&[&good, &rec(1, 2, 3, &[0, 1, 2, 0, 1, 2])]),
        "record 1 at byte 28: k = 3, but the first record has k = 2",
    );
    check(
        cat(&[&good, &rec(1, 2, 2, &[0, 1, 2, 4])]),
        "record 1 at byte 28: layer 1, token 1 (id at byte 52): slot 1: expert id 4 is not in 0..4",
    );
    check(rec(0, 1, 2, &[-5, 1]), "token 0 (id at byte 12): slot 0: expert id -5 is not in 0..4");
    check(rec(0, 1, 2, &[1, 1]), "slot 1: expert id 1 repeated");
    check(
        cat(&[&good, &rec(1, 2, 2, &[0, 1, 2, 3]), &rec(1, 2, 2, &[0, 1, 2, 3])]),
        "record 2 at byte 56: layer 1 recorded twice in the ubatch that starts at byte 0 (the first at byte 28)",
    );
    check(
        cat(&[&good, &rec(1, 3, 2, &[0, 1, 2, 3, 0, 1])]),
        "record 1 at byte 28: layer 1: 3 tokens, more than its ubatch's 2",
    );
    let e = import_llama_bin(write(dir.path(), "z.bin", &good), &opts(0)).unwrap_err().to_string();
    assert!(e.contains("--num-experts 0"), "{e}");
}
