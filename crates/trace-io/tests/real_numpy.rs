//! The numpy importer on the llama.cpp Qwen3-30B-A3B routing arrays in `$MOE_OFFLOAD_REAL_DATA`
//! (`qwen3-30b-a3b-llamacpp/{code,general}.npz`, read as they are). Figures asserted here are the
//! ones `docs/importers.md` quotes.

use trace_io::import::numpy::{Layout, NumpyOptions, import_numpy};
use trace_io::summary::{SHUFFLE_SEED, validate_with_usage};
use trace_io::{Phase, ScoreKind, TraceFile, write_trace};

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn qwen3_llamacpp_arrays_import_with_their_locality() {
    let real = real_data::dir();
    let dir = tempfile::tempdir().unwrap();
    // (file, mean next-token reuse over the 48 layers, shuffled-order control) as measured. The
    // data's README says about 0.45 against about 0.19: `general` gives that; `code` reuses a
    // little more, and its shuffled control is higher (a more skewed expert popularity).
    for (name, reuse, shuffled) in [("code", 0.47413, 0.27632), ("general", 0.44612, 0.18803)] {
        let input = real.join(format!("qwen3-30b-a3b-llamacpp/{name}.npz"));
        let opts = NumpyOptions { chunk: Some(512), phase: Some(Phase::Prefill), ..Default::default() };
        let out = import_numpy(&input, &opts).unwrap();
        let v = out.trace.view();
        let s = v.shape();
        assert_eq!((s.layers, s.tokens, s.num_experts, s.top_k, s.candidates), (48, 8000, 128, 8, 8), "{name}");
        assert_eq!(v.meta().layer_ids, (0..48).collect::<Vec<u32>>());
        assert_eq!((v.meta().score_kind, v.meta().phase), (ScoreKind::None, Phase::Prefill));
        assert_eq!(v.meta().model, "Qwen3-30B-A3B-Q4_K_M");
        assert_eq!(v.meta().extra["layout"], Layout::Ltk.as_str());
        // 15 sequences of 512 tokens, the 16th of 320.
        let seqs = v.seq_offsets().unwrap();
        assert_eq!(seqs, (0..16).map(|i| i * 512).collect::<Vec<u64>>());
        let r = &out.report;
        assert_eq!((r.records_read, r.tokens, r.layers, r.sequences), (48 * 8000, 8000, 48, Some(16)));
        assert!(r.dropped.is_empty() && r.warnings.is_empty(), "{r}");
        let notes = r.notes.join("\n");
        assert!(
            notes.contains("array `experts`: <i2 [48, 8000, 8], layout ltk (axis 0 matches meta n_moe_layers = 48)"),
            "{notes}"
        );
        assert!(notes.contains("E = 128 (meta num_experts)") && notes.contains("padding: none"), "{notes}");
        assert!(notes.contains("16 sequences from --chunk 512 (sizes 320..=512 tokens)"), "{notes}");

        let path = dir.path().join(format!("{name}.safetensors"));
        write_trace(&path, &v).unwrap();
        let file = TraceFile::open(&path).unwrap();
        let (_, usage) = validate_with_usage(&file, SHUFFLE_SEED).unwrap();
        let mean = |f: fn(&trace_io::summary::LayerUsage) -> f64| usage.iter().map(f).sum::<f64>() / 48.0;
        let (got, control) = (mean(|u| u.next_token_reuse), mean(|u| u.shuffled_reuse));
        assert!((got - reuse).abs() < 5e-4 && (control - shuffled).abs() < 5e-4, "{name}: {got} {control}");
        assert!(got > 0.4 && got < 0.5 && control > 0.15 && control < 0.3, "{name}: {got} {control}");
    }
}
