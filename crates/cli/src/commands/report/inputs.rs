//! The report's inputs besides `results.json`: `retention --json` tables and miss-ratio curves,
//! found in the sweep directory or named on the command line, each recognised by its shape.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use saliency::Retention;

use super::ReportArgs;

/// One `retention --json` file.
pub(super) struct RetentionFile {
    pub(super) path: PathBuf,
    pub(super) rows: Vec<Retention>,
    pub(super) heldout: String,
}

/// A miss-ratio curve, reduced to what the report plots: hit rate per cap, per layer.
pub(super) struct MrcCurve {
    pub(super) label: String,
    /// (layer id, points (cap, hit rate)).
    pub(super) layers: Vec<(String, Vec<(f64, f64)>)>,
}

/// What the report reads besides the sweep: the tables and curves, every file read (the output
/// may not replace one), and the JSON files of the directory that were neither.
pub(super) struct Inputs {
    pub(super) retention: Vec<RetentionFile>,
    pub(super) mrc: Vec<MrcCurve>,
    pub(super) read: Vec<PathBuf>,
    pub(super) skipped: Vec<PathBuf>,
}

/// Reads every `*.json` of `a.dir` (but `results.json`) and the files of `--retention` and
/// `--mrc`.
///
/// # Errors
/// A directory that cannot be listed, a file that cannot be read, a `--retention` file that is no
/// retention table, a `--mrc` file that is no curve.
pub(super) fn load(a: &ReportArgs) -> Result<Inputs> {
    let mut inputs = Inputs { retention: Vec::new(), mrc: Vec::new(), read: Vec::new(), skipped: Vec::new() };
    let mut found: Vec<PathBuf> = std::fs::read_dir(&a.dir)
        .with_context(|| format!("listing {}", a.dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.file_name().is_some_and(|n| n != "results.json"))
        .collect();
    found.sort();
    for p in &found {
        match classify(p)? {
            Extra::Retention(r) => inputs.retention.push(r),
            Extra::Mrc(c) => inputs.mrc.extend(c),
            Extra::Other => inputs.skipped.push(p.clone()),
        }
    }
    for p in &a.retention {
        match classify(p)? {
            Extra::Retention(r) => inputs.retention.push(r),
            _ => anyhow::bail!(
                "{}: not a retention table; write one with `moe-offload retention MAPS... --heldout H --json > FILE`",
                p.display()
            ),
        }
    }
    for p in &a.mrc {
        match classify(p)? {
            Extra::Mrc(c) => inputs.mrc.extend(c),
            _ => anyhow::bail!(
                "{}: not a miss-ratio curve (expected per-layer `misses` from `min_cap`, or `caps` and `hit_rate`)",
                p.display()
            ),
        }
    }
    inputs.read = found.into_iter().chain(a.retention.iter().cloned()).chain(a.mrc.iter().cloned()).collect();
    Ok(inputs)
}

/// What a JSON file beside the sweep is.
enum Extra {
    Retention(RetentionFile),
    Mrc(Vec<MrcCurve>),
    Other,
}

/// Reads a JSON file and decides what it is: a `retention --json` table, a miss-ratio curve, or
/// something else.
fn classify(path: &Path) -> Result<Extra> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(Extra::Other) };
    // `retention --json`: tagged, its rows under `maps`; or a bare array of rows (older files).
    let list = if v.get("kind").and_then(|k| k.as_str()) == Some(crate::commands::json::RETENTION) {
        v.get("maps").cloned().unwrap_or_default()
    } else {
        v.clone()
    };
    if let Some(items) = list.as_array()
        && !items.is_empty()
        && items.iter().all(|i| i.get("per_layer").is_some() && i.get("label").is_some())
    {
        let rows: Vec<Retention> = serde_json::from_value(list.clone())
            .with_context(|| format!("{}: a retention table with unexpected fields", path.display()))?;
        let heldout = items[0].get("heldout").and_then(|h| h.as_str()).unwrap_or("held-out data").to_string();
        return Ok(Extra::Retention(RetentionFile { path: path.to_path_buf(), rows, heldout }));
    }
    let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
    let curves = mrc_curves(&v, &name);
    Ok(if curves.is_empty() { Extra::Other } else { Extra::Mrc(curves) })
}

/// Miss-ratio curves in any of the shapes the `mrc` command may write: a curve object (per-layer
/// `misses` from `min_cap`, with `picks_per_layer` or `tokens` × `k_used`; or per-layer `caps`
/// and `hit_rate`), a list of them, or an object holding them under `curves`.
fn mrc_curves(v: &serde_json::Value, name: &str) -> Vec<MrcCurve> {
    if let Some(list) = v.as_array() {
        return list.iter().flat_map(|c| mrc_curves(c, name)).collect();
    }
    if let Some(list) = v.get("curves") {
        return mrc_curves(list, name);
    }
    let Some(layers) = v.get("layers").and_then(|l| l.as_array()) else { return Vec::new() };
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    let picks = num(v, "picks_per_layer").or_else(|| Some(num(v, "tokens")? * num(v, "k_used")?)).filter(|p| *p > 0.0);
    let min_cap = num(v, "min_cap");
    let mut out = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let id = layer.get("layer_id").map_or_else(|| i.to_string(), |x| x.to_string());
        let floats = |k: &str| -> Option<Vec<f64>> {
            layer.get(k)?.as_array()?.iter().map(|x| x.as_f64()).collect::<Option<Vec<f64>>>()
        };
        let points: Vec<(f64, f64)> = if let (Some(caps), Some(hr)) = (floats("caps"), floats("hit_rate")) {
            caps.into_iter().zip(hr).collect()
        } else if let (Some(misses), Some(min_cap), Some(picks)) = (floats("misses"), min_cap, picks) {
            misses.iter().enumerate().map(|(c, m)| (min_cap + c as f64, 1.0 - m / picks)).collect()
        } else {
            return Vec::new();
        };
        out.push((id, points));
    }
    if out.is_empty() {
        return Vec::new();
    }
    let policy = v.get("policy").and_then(|p| p.as_str()).unwrap_or("lru");
    vec![MrcCurve { label: format!("{name}: {policy}"), layers: out }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mrc_shapes_are_read() {
        let curve = serde_json::json!({
            "policy": "lru", "k_used": 2, "min_cap": 2, "max_cap": 4, "tokens": 10, "picks_per_layer": 20,
            "layers": [{"layer_id": 3, "misses": [10, 5, 2]}]
        });
        let c = mrc_curves(&curve, "mrc");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].layers[0].0, "3");
        assert_eq!(c[0].layers[0].1, vec![(2.0, 0.5), (3.0, 0.75), (4.0, 0.9)]);
        let wrapped = serde_json::json!({"curves": [curve.clone(), curve]});
        assert_eq!(mrc_curves(&wrapped, "mrc").len(), 2);
        let alt = serde_json::json!({"layers": [{"caps": [1, 2], "hit_rate": [0.1, 0.2]}]});
        assert_eq!(mrc_curves(&alt, "x")[0].layers[0].1, vec![(1.0, 0.1), (2.0, 0.2)]);
        assert!(mrc_curves(&serde_json::json!({"rows": []}), "x").is_empty());
        assert!(mrc_curves(&serde_json::json!({"layers": [{"misses": [1]}]}), "x").is_empty());
    }
}
