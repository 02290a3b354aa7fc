//! `cargo xtask gen-bench-traces`: the seed-scale pair of synthetic traces (the original study's
//! shape: 48 layers x 512 experts, top-10 of 64 candidates, with output norms), written outside the
//! repository: 131,072 calibration tokens and 8,192 held-out tokens, one model, two token streams.
//! `data/grids/reference.json` points at them.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Result;
use trace_io::synth::SynthConfig;

/// The model shared by both traces: the study's shape, the routing model's fitted defaults, 8
/// never-routed (layer, expert) pairs of 24,576 as in the study.
pub fn model() -> SynthConfig {
    SynthConfig {
        layers: 48,
        experts: 512,
        top_k: 10,
        candidates: 64,
        norms: true,
        dead_experts: 8,
        model_seed: 2024,
        ..SynthConfig::default()
    }
}

/// The calibration trace: 131,072 tokens in 512 sequences of 256.
pub fn calib_config() -> SynthConfig {
    SynthConfig { tokens: 131_072, sequences: 512, seed: 11, ..model() }
}

/// The held-out trace: 8,192 tokens in 32 sequences of 256, another token stream.
pub fn heldout_config() -> SynthConfig {
    SynthConfig { tokens: 8192, sequences: 32, seed: 12, ..model() }
}

/// The default output directory: `target/bench-traces` of the workspace.
pub fn default_dir() -> PathBuf {
    crate::workspace_root().join("target").join("bench-traces")
}

/// Writes `seed-calib.safetensors` and `seed-heldout.safetensors` into `out` (created if needed).
pub fn run(out: Option<&Path>) -> Result<()> {
    let dir = out.map_or_else(default_dir, Path::to_path_buf);
    std::fs::create_dir_all(&dir)?;
    for (name, cfg) in [("seed-calib", calib_config()), ("seed-heldout", heldout_config())] {
        let path = dir.join(format!("{name}.safetensors"));
        let start = Instant::now();
        let done = std::sync::atomic::AtomicUsize::new(0);
        let progress = |_layer: usize| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            if n.is_multiple_of(12) {
                println!("  {name}: {n}/{} layers ({:.1} s)", cfg.layers, start.elapsed().as_secs_f64());
            }
        };
        trace_io::synth::write(&path, &cfg, 0, &progress)?;
        let bytes = std::fs::metadata(&path)?.len();
        println!(
            "wrote {}: {} x {} tokens, {} experts, top-{} of {}, {:.2} GB in {:.1} s",
            path.display(),
            cfg.layers,
            cfg.tokens,
            cfg.experts,
            cfg.top_k,
            cfg.candidates,
            bytes as f64 / 1e9,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
