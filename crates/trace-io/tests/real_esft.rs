//! The ESFT importer on the real DeepSeek-V2-Lite routing in `$MOE_OFFLOAD_REAL_DATA/esft-dsv2lite`.

use trace_io::import::esft::{EsftOptions, import_esft};
use trace_io::{TraceFile, write_trace};

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn translation_imports_with_the_documented_shape() {
    let real = real_data::dir();
    let opts = EsftOptions { domains: vec!["translation".into()], ..Default::default() };
    let t = import_esft(real.join("esft-dsv2lite"), &opts).unwrap();
    let v = t.view();
    let s = v.shape();
    assert_eq!((s.tokens, s.layers, s.num_experts, s.top_k, s.candidates), (8251, 26, 64, 6, 6));
    assert_eq!(v.meta().layer_ids, (1..=26).collect::<Vec<u32>>());
    assert_eq!(v.seq_offsets().unwrap().len(), 40);
    // Probabilities of one row are in descending order, and a row sums to roughly 0.3-0.45 or more.
    let g = v.layer_gates(0).unwrap();
    for row in g.chunks_exact(6) {
        assert!(row.windows(2).all(|w| w[0] >= w[1]));
        let sum: f32 = row.iter().sum();
        assert!((0.05..=1.0001).contains(&sum), "row sum {sum}");
    }
    // Round trip through the file format.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("translation.safetensors");
    write_trace(&p, &v).unwrap();
    let f = TraceFile::open(&p).unwrap();
    assert_eq!(f.view().parts().ids, v.parts().ids);
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn all_four_domains_concatenate_in_order() {
    let real = real_data::dir();
    let t = import_esft(real.join("esft-dsv2lite"), &EsftOptions::default()).unwrap();
    let v = t.view();
    assert_eq!(v.shape().tokens, 8222 + 8327 + 8479 + 8251);
    assert_eq!(v.seq_offsets().unwrap().len(), 127 + 33 + 13 + 40);
    assert_eq!(v.meta().extra["domain_tokens"], "intent:8222,law:8327,summary:8479,translation:8251");
    let floored: u64 = v.meta().extra["floored_probs"].parse().unwrap();
    // The data README counts 99 zero probabilities in the whole release.
    assert_eq!(floored, 99);
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn a_deleted_layer_file_is_refused_not_skipped() {
    let real = real_data::dir();
    // A copy of the translation domain without layer 7 (the real data is never modified).
    let src = real.join("esft-dsv2lite/results/expert_scores/translation");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("translation");
    std::fs::create_dir(&copy).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "expert_weights_7.txt" {
            std::fs::copy(entry.path(), copy.join(entry.file_name())).unwrap();
        }
    }
    let opts = EsftOptions { domains: vec!["translation".into()], ..Default::default() };
    let e = import_esft(dir.path(), &opts).unwrap_err().to_string();
    assert!(e.contains("no layer file for layer 7 (expert_weights_7.txt), between layers 1 and 26"), "{e}");
    // Layer 0 (dense, never logged) is not a gap: the complete copy imports with layers 1..26.
    std::fs::copy(src.join("expert_weights_7.txt"), copy.join("expert_weights_7.txt")).unwrap();
    let t = import_esft(dir.path(), &opts).unwrap();
    assert_eq!(t.view().meta().layer_ids, (1..=26).collect::<Vec<u32>>());
}
