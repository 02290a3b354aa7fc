//! `plan --quality`: reading the measured quality `python/eval_pruned.py` writes (kind
//! `moe-offload-quality`, docs/quality.md) and the plan's table of misses against measured KL.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use sweep::plan::{Candidate, Measured, QualityFloor};

/// The `kind` of a quality document.
pub const QUALITY_KIND: &str = "moe-offload-quality";

/// The floor of `--quality FILES --max-kl X --max-ppl-increase Y`.
///
/// # Errors
/// A file that is not a quality document (naming the file and key), two files of one keep map,
/// a limit without measurements, or a limit that is not a number >= 0.
pub fn read_floor(paths: &[PathBuf], max_kl: Option<f64>, max_ppl_increase: Option<f64>) -> Result<QualityFloor> {
    for (flag, v) in [("--max-kl", max_kl), ("--max-ppl-increase", max_ppl_increase)] {
        if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            bail!("{flag} {v}: a limit must be a finite number >= 0");
        }
    }
    if paths.is_empty() && (max_kl.is_some() || max_ppl_increase.is_some()) {
        bail!("--max-kl and --max-ppl-increase need measured quality: --quality q1.json q2.json ...");
    }
    let mut measured: Vec<Measured> = Vec::new();
    for p in paths {
        let bytes = std::fs::read(p).with_context(|| format!("--quality {}", p.display()))?;
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).with_context(|| format!("--quality {}: not JSON", p.display()))?;
        let kind = v.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        if kind != QUALITY_KIND {
            bail!(
                "--quality {}: kind {kind:?} is not {QUALITY_KIND:?} (write one with python/eval_pruned.py, docs/quality.md)",
                p.display()
            );
        }
        let num = |key: &str| {
            v.get(key)
                .and_then(|x| x.as_f64())
                .with_context(|| format!("--quality {}: no number under {key:?}", p.display()))
        };
        let sha = v
            .pointer("/keep_map/sha256")
            .and_then(|x| x.as_str())
            .with_context(|| format!("--quality {}: no string under \"keep_map.sha256\"", p.display()))?;
        let keep = |key: &str| {
            v.pointer(&format!("/keep_map/{key}"))
                .cloned()
                .with_context(|| format!("--quality {}: no \"keep_map.{key}\"", p.display()))
        };
        let bad = |key: &str, e: serde_json::Error| anyhow::anyhow!("--quality {}: keep_map.{key}: {e}", p.display());
        let m = Measured {
            source: p.display().to_string(),
            keep_sha256: sha.to_string(),
            num_experts: serde_json::from_value(keep("num_experts")?).map_err(|e| bad("num_experts", e))?,
            layer_ids: serde_json::from_value(keep("layer_ids")?).map_err(|e| bad("layer_ids", e))?,
            layers: serde_json::from_value(keep("layers")?).map_err(|e| bad("layers", e))?,
            mode: v.get("mode").and_then(|x| x.as_str()).unwrap_or("replace").to_string(),
            kl: num("kl")?,
            ppl_increase: num("ppl_increase")?,
        };
        if let Some(prev) = measured.iter().find(|x| (&x.layer_ids, &x.layers) == (&m.layer_ids, &m.layers)) {
            bail!(
                "--quality {} and {} measure the same keep map: give one, the floor could not tell which counts",
                prev.source,
                m.source
            );
        }
        measured.push(m);
    }
    Ok(QualityFloor { measured, max_kl, max_ppl_increase })
}

/// The table of the plan's candidates with a measured quality: misses per token against measured
/// KL and perplexity increase.
pub fn write_table(out: &mut dyn Write, candidates: &[Candidate]) -> Result<()> {
    let mut t = comfy_table::Table::new();
    t.set_header(["variant", "measured KL", "ppl increase", "misses/token in", "misses/token out", "note"]);
    for c in candidates {
        let Some(kl) = c.measured_kl else { continue };
        let mpt =
            |f: fn(&sweep::plan::Evaluated) -> f64| c.per_layer.as_ref().map_or("-".into(), |e| format!("{:.4}", f(e)));
        t.add_row([
            c.variant.clone(),
            sweep::plan::figure(kl),
            c.measured_ppl_increase.map_or("-".into(), sweep::plan::figure),
            mpt(|e| e.in_sample_misses_per_token),
            mpt(|e| e.out_of_sample_misses_per_token),
            c.excluded.clone().unwrap_or_default(),
        ]);
    }
    crate::commands::align_numbers(&mut t);
    writeln!(out, "measured quality (--quality) against the per-layer plan's misses:\n{t}")?;
    Ok(())
}
