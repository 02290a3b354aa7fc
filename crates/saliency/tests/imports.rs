//! Statistics from files other tools write: REAP aggregate variants, per-expert count files (JSON,
//! CSV, `.npy`) and llama.cpp's `expert_stats.json`. Each layout of one hand-computed example
//! must give the same statistics; each refusal must name the file, the place and what to do.

use std::path::{Path, PathBuf};

use saliency::{
    CountsOptions, ExpertStatsOptions, KeepConfig, KeepMap, Metric, MetricConfig, NonFiniteReap, ReapAggOptions,
    SaliencyError, Stats, metric_scores, retention,
};

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

const REAP2: ReapAggOptions = ReapAggOptions { top_k: 2, non_finite_reap: NonFiniteReap::DropStatistic };

#[test]
fn reap_aggregate_variants_read_means_as_means() {
    let dir = tempfile::tempdir().unwrap();
    // Sums: layer 0 freq [1, 3, 0] reap [1.5, 6.0, 0]; layer 1 freq [2, 0, 2] reap [3.0, 0, 1.0]
    // (means 1.5, 2.0 | 1.5, 0.5).
    let sums = write(
        dir.path(),
        "sums.json",
        br#"{"c": {"n": 1, "tok": 4, "freq": {"0": [1, 3, 0], "1": [2, 0, 2]}, "reap": {"0": [1.5, 6.0, 0.0], "1": [3.0, 0.0, 1.0]}}}"#,
    );
    let base = Stats::from_reap_agg_corpus(&sums, Some("c"), &REAP2).unwrap();
    assert_eq!(base.layers[0].reap_sum.as_deref(), Some(&[1.5, 6.0, 0.0][..]));
    // `tokens` and `reap_mean`, with the corpus wrapper and without; a mean of 0/0 written as NaN.
    let wrapped = write(
        dir.path(),
        "means.json",
        br#"{"c": {"tokens": 4, "freq": {"0": [1, 3, 0], "1": [2, 0, 2]}, "reap_mean": {"0": [1.5, 2.0, NaN], "1": [1.5, 0.0, 0.5]}}}"#,
    );
    let bare = write(
        dir.path(),
        "bare.json",
        br#"{"tokens": 4, "freq": {"0": [1, 3, 0], "1": [2, 0, 2]}, "reap_mean": {"0": [1.5, 2.0, 0.0], "1": [1.5, 0.0, 0.5]}}"#,
    );
    for (p, corpus) in [(&wrapped, Some("c")), (&bare, None)] {
        let s = Stats::from_reap_agg_corpus(p, corpus, &REAP2).unwrap();
        assert_eq!(s.layers, base.layers, "{}", p.display());
        assert!(s.meta.source.ends_with("(reap_sum = reap_mean x freq)"), "{}", s.meta.source);
    }
    let summary = Stats::reap_agg_summary(&bare).unwrap();
    assert_eq!((summary.len(), summary[0].name.as_str(), summary[0].tokens, summary[0].layers), (1, "", Some(4), 2));
    assert!(Stats::reap_agg_corpora(&bare).unwrap().is_empty());

    // Counts only: accepted, no reap_sum, nothing invented; its JSON has no NaN.
    let counts = write(dir.path(), "counts.json", br#"{"c": {"tok": 4, "freq": {"0": [1, 3, 0], "1": [2, 0, 2]}}}"#);
    let s = Stats::from_reap_agg_corpus(&counts, Some("c"), &REAP2).unwrap();
    assert_eq!(s.present_statistics(), ["count"]);
    assert!(s.meta.source.contains("counts only"), "{}", s.meta.source);
    let out = dir.path().join("stats.json");
    s.write_json(&out).unwrap();
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("NaN"), "{text}");
    assert_eq!(Stats::read_json(&out).unwrap(), s);
    assert!(matches!(
        metric_scores(&s, Metric::Reap, &MetricConfig::default()),
        Err(SaliencyError::MissingStatistic { statistic: "reap_sum", .. })
    ));

    // Refusals: (file text, corpus, expected words).
    let cases: [(&str, Option<&str>, &[&str]); 6] = [
        (
            r#"{"c": {"tok": 4, "freq": {"0": [1, 1]}, "reap": {"0": [1, 1]}, "reap_mean": {"0": [1, 1]}}}"#,
            Some("c"),
            &["key `reap`", "key `reap_mean` are both present"],
        ),
        (
            r#"{"c": {"tok": 4, "tokens": 3, "freq": {"0": [1, 3]}}}"#,
            Some("c"),
            &["key `tok`", "disagrees with key `tokens` 3"],
        ),
        (r#"{"tok": 4, "freq": {"0": [1, 3]}}"#, Some("c"), &["no corpora", "drop --corpus"]),
        (r#"{"a": {"tok": 4, "freq": {"0": [1, 3]}}, "b": {}}"#, None, &["name one with --corpus: a, b"]),
        (
            r#"{"c": {"tok": 4, "freq": {"0": [1, 3]}, "reap_mean": {"0": [1.0]}}}"#,
            Some("c"),
            &["key `reap_mean` layer 0", "has 1 values, expected 2"],
        ),
        (r#"{"c": {"freq": {"0": [1, 3]}}}"#, Some("c"), &["key `tok`", "no `tokens` either"]),
    ];
    for (text, corpus, want) in cases {
        let p = write(dir.path(), "bad.json", text.as_bytes());
        let e = Stats::from_reap_agg_corpus(&p, corpus, &REAP2).unwrap_err().to_string();
        assert!(e.contains("bad.json"), "{e}");
        for w in want {
            assert!(e.contains(w), "want {w:?} in {e}");
        }
    }
    // A NaN mean where freq > 0 is a missing value (the non-finite policy), not 0.
    let p = write(dir.path(), "nan.json", br#"{"tok": 4, "freq": {"0": [1, 3]}, "reap_mean": {"0": [NaN, 1.0]}}"#);
    let s = Stats::from_reap_agg_corpus(&p, None, &REAP2).unwrap();
    assert!(
        s.layers[0].reap_sum.is_none() && s.meta.source.contains("1 non-finite reap_mean values"),
        "{}",
        s.meta.source
    );
}

/// The `.npy` bytes of an array: version 1.0 header padded to 64 bytes.
fn npy(descr: &str, fortran: bool, shape: &str, data: &[u8]) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape}, }}",
        if fortran { "True" } else { "False" }
    );
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend(header);
    out.extend_from_slice(data);
    out
}

#[test]
fn count_files_of_every_layout_give_the_same_statistics() {
    let dir = tempfile::tempdir().unwrap();
    // Two layers x 3 experts, top-2: layer 0 counts [2, 2, 0] (2 tokens), layer 1 [1, 2, 3] (3 tokens);
    // no expert is counted more often than its layer has tokens.
    let counts = [[2u64, 2, 0], [1, 2, 3]];
    let c_i64: Vec<u8> = counts.iter().flatten().flat_map(|&c| (c as i64).to_le_bytes()).collect();
    let f_f64: Vec<u8> =
        (0..3).flat_map(|x| (0..2).map(move |l| counts[l][x])).flat_map(|c| (c as f64).to_le_bytes()).collect();
    let k2 = CountsOptions { top_k: Some(2), ..Default::default() };
    let ids = |v: &[u32]| CountsOptions { top_k: Some(2), layer_ids: Some(v.to_vec()), ..Default::default() };
    // (file name, bytes, options, layer ids expected).
    let cases: Vec<(&str, Vec<u8>, CountsOptions, [u32; 2])> = vec![
        ("dict.json", br#"{"4": [2, 2, 0], "9": [1, 2, 3.0]}"#.to_vec(), k2.clone(), [4, 9]),
        (
            "names.json",
            br#"{"model.layers.9.mlp": [1, 2, 3], "model.layers.4.mlp": [2, 2, 0]}"#.to_vec(),
            k2.clone(),
            [4, 9],
        ),
        ("index.json", br#"{"0": [2, 2, 0], "1": [1, 2, 3]}"#.to_vec(), ids(&[4, 9]), [4, 9]),
        (
            "arrays.json",
            br#"{"layers": [4, 9], "counts": [[2, 2, 0], [1, 2, 3]], "top_k": 2}"#.to_vec(),
            CountsOptions::default(),
            [4, 9],
        ),
        ("rows.json", br#"{"counts": [[2, 2, 0], [1, 2, 3]]}"#.to_vec(), k2.clone(), [0, 1]),
        ("header.csv", b"expert,layer,count\n0,4,2\n1,4,2\n0,9,1\n1,9,2\n2,9,3\n".to_vec(), k2.clone(), [4, 9]),
        (
            "plain.tsv",
            b"# layer expert count\n4\t0\t2\n4\t1\t2\n4\t2\t0\n9\t0\t1\n9\t1\t2\n9\t2\t3\n".to_vec(),
            k2.clone(),
            [4, 9],
        ),
        ("c.npy", npy("<i8", false, "(2, 3)", &c_i64), ids(&[4, 9]), [4, 9]),
        ("f.npy", npy("<f8", true, "(2, 3)", &f_f64), k2.clone(), [0, 1]),
    ];
    for (name, bytes, opts, want_ids) in cases {
        let p = write(dir.path(), name, &bytes);
        let s = Stats::from_counts_file(&p, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(s.meta.layer_ids, want_ids, "{name}");
        assert_eq!((s.meta.num_experts, s.meta.top_k), (3, 2), "{name}");
        let got: Vec<(u64, Vec<u64>)> = s.layers.iter().map(|l| (l.tokens, l.count.clone())).collect();
        assert_eq!(got, [(2, vec![2, 2, 0]), (3, vec![1, 2, 3])], "{name}");
        assert_eq!(s.present_statistics(), ["count"], "{name}");
    }

    // What such statistics are good for: frequency keep maps and retention; REAP is an error.
    let p = dir.path().join("dict.json");
    let s = Stats::from_counts_file(&p, &k2).unwrap();
    let map = KeepMap::build(&s, Metric::Frequency, 2, &KeepConfig::default()).unwrap();
    assert_eq!(map.layers, [vec![0, 1], vec![1, 2]]);
    let r = retention(&map, &s, None).unwrap();
    // Layer 0 keeps all 4 slots; layer 1 loses expert 0's 1 slot of 6.
    assert_eq!(r.per_layer[1].figures.slot_replacement, 1.0 / 6.0);
    assert_eq!((r.mean.reap_retention, r.mean.gate_retention), (None, None));
    let e = KeepMap::build(&s, Metric::Reap, 2, &KeepConfig::default()).unwrap_err();
    assert!(matches!(e, SaliencyError::MissingStatistic { statistic: "reap_sum", .. }), "{e}");
    // Round trip through the statistics file.
    let out = dir.path().join("stats.json");
    s.write_json(&out).unwrap();
    assert_eq!(Stats::read_json(&out).unwrap(), s);
}

#[test]
fn count_file_refusals_name_the_place_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let k2 = CountsOptions { top_k: Some(2), ..Default::default() };
    let cases: [(&str, &[u8], CountsOptions, &[&str]); 20] = [
        (
            "a.json",
            br#"{"0": [3, 1, 0]}"#,
            CountsOptions::default(),
            &["a.json", "does not record top-k: pass --top-k"],
        ),
        (
            "b.json",
            br#"{"0": [3, 1, 1]}"#,
            k2.clone(),
            &["b.json: layer 0", "counts sum to 5, not a multiple of top-k 2"],
        ),
        ("c.json", br#"{"0": [3, 1.5, 0]}"#, k2.clone(), &["c.json: key `0` expert 1", "1.5 is not a whole number"]),
        (
            "d.json",
            br#"{"0": [3, 1], "1": [1, 2, 3]}"#,
            k2.clone(),
            &["d.json: key `1`", "has 3 experts, key `0` has 2"],
        ),
        ("e.json", br#"{"router": [3, 1]}"#, k2.clone(), &["e.json: key `router`", "is not a layer"]),
        (
            "f.json",
            br#"{"4": [1, 1], "9": [1, 1]}"#,
            CountsOptions { layer_ids: Some(vec![1, 2]), ..k2.clone() },
            &["not the indices 0..2", "drop --layer-ids"],
        ),
        (
            "g.json",
            br#"{"0": [1, 1], "1": [1, 1]}"#,
            CountsOptions { layer_ids: Some(vec![1]), ..k2.clone() },
            &["1 ids given", "has 2 layers"],
        ),
        (
            "h.csv",
            b"layer,expert,count\n0,0,2\n0,1,2\n0,0,1\n",
            k2.clone(),
            &["h.csv:4", "layer 0 expert 0 again (first at line 2)"],
        ),
        (
            "i.csv",
            b"layer,expert,count\n0,0,2\n0,x,2\n",
            k2.clone(),
            &["i.csv:3: field `expert`", "`x` is not a whole number"],
        ),
        ("j.npy", &[0x93, b'N', b'U'], k2.clone(), &["j.npy", "not a readable .npy file"]),
        // 10 picks of top-2 routing are 5 tokens: expert 0 cannot be chosen 10 times.
        (
            "n.json",
            br#"{"0": [10, 0, 0, 0]}"#,
            k2.clone(),
            &["n.json: layer 0 expert 0: count 10 is more than the layer's 5 tokens (sum of counts 10 / top-k 2)"],
        ),
        // The same in a CSV whose layer ids are given: the message names the model's id.
        (
            "n.csv",
            b"layer,expert,count\n0,0,1\n0,1,1\n1,0,1\n1,2,3\n",
            CountsOptions { layer_ids: Some(vec![5, 7]), ..k2.clone() },
            &["n.csv: layer 7 expert 2: count 3 is more than the layer's 2 tokens"],
        ),
        // Counts whose sum passes 2^64: the true sum, not the wrapped one.
        (
            "p.json",
            br#"{"0": [18446744073709551615, 18446744073709551615]}"#,
            k2.clone(),
            &["p.json: layer 0", "counts sum to 36893488147419103230, which exceeds 2^64 - 1"],
        ),
        // A whole number too large for a count is called that, not "not a whole number".
        ("q.json", br#"{"0": [3e22, 1]}"#, k2.clone(), &["q.json: key `0` expert 0", "is too large for a count"]),
        // A layer key "-1" is no layer 1.
        ("r.json", br#"{"-1": [1, 1], "1": [1, 1]}"#, k2.clone(), &["r.json: key `-1`", "-1 is not a layer id"]),
        // A header-less CSV after comment lines: the lines are counted from the top of the file.
        (
            "s.csv",
            b"# from a profiler\n# layer, expert, count\n0,0,2\n0,x,2\n",
            k2.clone(),
            &["s.csv:4: field `expert`"],
        ),
        ("t.csv", b"# one comment\n0,y,2\n", k2.clone(), &["t.csv:2: field `expert`"]),
        // A matrix of counts (np.savetxt) without a header: 4 fields, not (layer, expert, count).
        ("u.csv", b"0,1,4,4\n1,0,2,2\n", k2.clone(), &["u.csv:1: 4 fields: a CSV without a header holds rows"]),
        // Experts counted from 1: expert 0 would be invented; --num-experts confirms instead.
        (
            "v.csv",
            b"layer,expert,count\n0,1,3\n0,2,1\n1,1,2\n1,2,2\n",
            k2.clone(),
            &["v.csv: expert 0 appears in no layer (ids 1..=2)", "give --num-experts 3 to confirm"],
        ),
        // Top-5 of 4 experts: no routing chooses 5 distinct experts of 4.
        (
            "o.json",
            br#"{"0": [5, 5, 5, 5]}"#,
            CountsOptions { top_k: Some(5), ..Default::default() },
            &["o.json: top-k", "5 is more than the 4 experts per layer"],
        ),
    ];
    for (name, bytes, opts, want) in cases {
        let p = write(dir.path(), name, bytes);
        let e = Stats::from_counts_file(&p, &opts).unwrap_err().to_string();
        for w in want {
            assert!(e.contains(w), "{name}: want {w:?} in {e}");
        }
    }
    // The refusal is typed, with the place and the value as fields.
    let p = dir.path().join("n.json");
    let e = Stats::from_counts_file(&p, &k2).unwrap_err();
    assert!(
        matches!(&e, SaliencyError::CountAboveTokens { path, layer_id: 0, expert: 0, count: 10, tokens: 5, .. } if *path == p),
        "{e:?}"
    );
    let p = write(dir.path(), "k.csv", b"layer,hits\n0,1\n");
    let e = Stats::from_counts_file(&p, &k2).unwrap_err().to_string();
    assert!(e.contains("k.csv:1") && e.contains("expected columns named layer, expert and count"), "{e}");
    let p = write(dir.path(), "l.npy", &npy("<i8", false, "(3,)", &[0; 24]));
    let e = Stats::from_counts_file(&p, &k2).unwrap_err().to_string();
    assert!(e.contains("l.npy") && e.contains("array of shape [3]: expected [layers, experts]"), "{e}");
    let p = write(dir.path(), "m.npy", &npy("<i8", false, "(1, 2)", &[0xff; 16]));
    let e = Stats::from_counts_file(&p, &k2).unwrap_err().to_string();
    assert!(e.contains("m.npy: row 0 (layer index 0) expert 0") && e.contains("-1 is not a whole number"), "{e}");
}

/// An `expert_stats.json` as llama.cpp's `llama-expert-profile` writes it: layers keyed by index,
/// means per expert, 0 where an expert was never routed to. Two layers, E = 4 (the last expert
/// unused: the profiler's --n-experts above the model's 3), top-2, 3 tokens each (no expert
/// counted more often than that).
const EXPERT_STATS: &str = r#"{
  "1": {
    "total_tokens": 3,
    "activation_counts": [3, 0, 3, 0],
    "activation_frequency": [1, 0, 1, 0],
    "avg_gate_weight": [0.25, 0, 0.5, 0],
    "ean_mean": [2, 0, 1.5, 0],
    "reap": [0.5, 0, 0.75, 0],
    "never_activated": 2
  },
  "2": {
    "total_tokens": 3,
    "activation_counts": [1, 2, 3, 0],
    "activation_frequency": [0.333333, 0.666667, 1, 0],
    "avg_gate_weight": [0.5, 0.25, 0.125, 0],
    "ean_mean": [4, 1, 2, 0],
    "reap": [2, 0.25, 0.25, 0],
    "never_activated": 1
  }
}
"#;

#[test]
fn llama_expert_stats_give_all_four_sums() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "expert_stats.json", EXPERT_STATS.as_bytes());
    let s = Stats::from_llama_expert_stats(&p, &ExpertStatsOptions::default()).unwrap();
    assert_eq!((s.meta.layer_ids.clone(), s.meta.num_experts, s.meta.top_k), (vec![1, 2], 4, 2));
    let l = &s.layers[0];
    assert_eq!((l.tokens, l.count.clone()), (3, vec![3, 0, 3, 0]));
    assert_eq!(l.gate_sum.as_deref(), Some(&[0.75, 0.0, 1.5, 0.0][..]));
    assert_eq!(l.ean_sum.as_deref(), Some(&[6.0, 0.0, 4.5, 0.0][..]));
    assert_eq!(l.reap_sum.as_deref(), Some(&[1.5, 0.0, 2.25, 0.0][..]));
    assert_eq!(s.layers[1].reap_sum.as_deref(), Some(&[2.0, 0.5, 0.75, 0.0][..]));
    assert_eq!(s.present_statistics(), ["count", "gate_sum", "ean_sum", "reap_sum"]);
    // REAP (the mean) ranks as the file's `reap` column: layer 2 keeps experts 0 and 1 (2, 0.25 vs 0.25: id order).
    let map = KeepMap::build(&s, Metric::Reap, 2, &KeepConfig::default()).unwrap();
    assert_eq!(map.layers[1], [0, 1]);
    assert!(matches!(
        KeepMap::build(&s, Metric::Shrink, 2, &KeepConfig::default()),
        Err(SaliencyError::MissingStatistic { statistic: "reap_sumsq", .. })
    ));
    // `import counts` detects the format and reads the same.
    assert_eq!(Stats::from_counts_file(&p, &CountsOptions::default()).unwrap(), s);
    // The model's E = 3 cuts the profiler's unused fourth expert; layer ids by index.
    let cut = ExpertStatsOptions { num_experts: Some(3), layer_ids: None, top_k: Some(2) };
    let s3 = Stats::from_llama_expert_stats(&p, &cut).unwrap();
    assert_eq!((s3.meta.num_experts, s3.layers[1].count.clone()), (3, vec![1, 2, 3]));

    let cases: [(ExpertStatsOptions, &str); 3] = [
        (
            ExpertStatsOptions { num_experts: Some(2), ..Default::default() },
            "layer `1` expert 2: routed to 3 times, but --num-experts is 2",
        ),
        (ExpertStatsOptions { top_k: Some(3), ..Default::default() }, "--top-k: 3 disagrees with"),
        (ExpertStatsOptions { layer_ids: Some(vec![5, 6]), ..Default::default() }, "not the indices 0..2"),
    ];
    for (opts, want) in cases {
        let e = Stats::from_llama_expert_stats(&p, &opts).unwrap_err().to_string();
        assert!(e.contains(want), "want {want:?} in {e}");
    }
    let bad = write(dir.path(), "bad.json", EXPERT_STATS.replace("\"reap\": [2,", "\"reap\": [-2,").as_bytes());
    let e = Stats::from_llama_expert_stats(&bad, &ExpertStatsOptions::default()).unwrap_err().to_string();
    assert!(e.contains("bad.json: layer `2` field `reap` expert 0") && e.contains("not a finite mean >= 0"), "{e}");
    let uneven = write(
        dir.path(),
        "uneven.json",
        EXPERT_STATS
            .replace(
                "\"total_tokens\": 3,\n    \"activation_counts\": [1",
                "\"total_tokens\": 4,\n    \"activation_counts\": [1",
            )
            .as_bytes(),
    );
    let e = Stats::from_llama_expert_stats(&uneven, &ExpertStatsOptions::default()).unwrap_err().to_string();
    assert!(e.contains("cannot infer top-k") && e.contains("pass --top-k"), "{e}");
    // An expert routed to more often than the layer has tokens: no top-k routing gives that.
    let over = write(
        dir.path(),
        "over.json",
        EXPERT_STATS.replace("\"activation_counts\": [1, 2, 3, 0]", "\"activation_counts\": [0, 2, 4, 0]").as_bytes(),
    );
    let e = Stats::from_llama_expert_stats(&over, &ExpertStatsOptions::default()).unwrap_err();
    assert!(matches!(e, SaliencyError::CountAboveTokens { layer_id: 2, expert: 2, count: 4, tokens: 3, .. }), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("over.json: layer 2 expert 2: count 4 is more than the layer's 3 tokens (its total_tokens)"),
        "{e}"
    );
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn real_reap_aggregate_rewritten_as_means_reads_the_same() {
    let real = real_data::dir();
    let path = real.join("reap-agg-dsv4/core_agg.json");
    let opts = ReapAggOptions { top_k: 6, non_finite_reap: NonFiniteReap::DropStatistic };
    let gita = Stats::from_reap_agg_corpus(&path, Some("gita"), &opts).unwrap();
    let text = std::fs::read_to_string(&path).unwrap().replace("NaN", "null");
    let root: serde_json::Value = serde_json::from_str(&text).unwrap();
    let c = &root["gita"];
    // The variant: no wrapper, `tokens`, and `reap_mean` = reap / freq (0 where freq is 0).
    let mut means = serde_json::Map::new();
    for (layer, reap) in c["reap"].as_object().unwrap() {
        let freq = c["freq"][layer].as_array().unwrap();
        let m: Vec<f64> = reap
            .as_array()
            .unwrap()
            .iter()
            .zip(freq)
            .map(|(r, f)| {
                let f = f.as_f64().unwrap();
                if f == 0.0 { 0.0 } else { r.as_f64().unwrap() / f }
            })
            .collect();
        means.insert(layer.clone(), serde_json::json!(m));
    }
    let variant = serde_json::json!({"tokens": c["tok"], "freq": c["freq"], "reap_mean": means});
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "gita-means.json", variant.to_string().as_bytes());
    let s = Stats::from_reap_agg_corpus(&p, None, &opts).unwrap();
    assert_eq!(s.meta.layer_ids, gita.meta.layer_ids);
    for (a, b) in s.layers.iter().zip(&gita.layers) {
        assert_eq!((a.tokens, &a.count), (b.tokens, &b.count));
        for (x, y) in a.reap_sum.as_ref().unwrap().iter().zip(b.reap_sum.as_ref().unwrap()) {
            assert!((x - y).abs() <= 1e-12 * y.abs().max(1.0), "{x} vs {y}");
        }
    }
}
