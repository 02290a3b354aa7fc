//! `moe-offload retention`: out-of-sample retention of keep maps on a held-out trace or
//! statistics (SEMANTICS.md §4).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use saliency::{KeepMap, Retention, Stats, retention};
use trace_io::TraceFile;

#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// Keep-map JSON files, one table row each; the word `full` adds the unpruned map.
    #[arg(required = true)]
    pub keep: Vec<PathBuf>,
    /// Held-out data: a trace (.safetensors; gives prob_retention too) or a statistics JSON of
    /// `moe-offload stats` (detected by extension, else by content).
    #[arg(long)]
    pub heldout: PathBuf,
    /// Print JSON instead of a table: kind `moe-offload-retention`, the held-out input and
    /// `maps`, one object per map with every layer.
    #[arg(long)]
    pub json: bool,
    /// In the table, also print every layer of every map.
    #[arg(long, conflicts_with = "json")]
    pub per_layer: bool,
}

/// Held-out data as given on the command line.
enum Heldout {
    Trace(Box<TraceFile>),
    Stats(Stats),
}

fn open_heldout(path: &Path) -> Result<Heldout> {
    let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
    let is_json = match ext {
        "safetensors" => false,
        "json" => true,
        _ => {
            // A safetensors file starts with an 8-byte header length; a JSON file with `{`.
            let mut head = [0u8; 1];
            let n = trace_io::open_regular_file(path)
                .and_then(|mut f| std::io::Read::read(&mut f, &mut head))
                .with_context(|| format!("reading {}", path.display()))?;
            n == 1 && (head[0] == b'{' || head[0].is_ascii_whitespace())
        }
    };
    Ok(if is_json {
        Heldout::Stats(Stats::read_json(path).with_context(|| {
            format!(
                "held-out statistics {} (--heldout takes a trace or the output of `moe-offload stats TRACE -o FILE`)",
                path.display()
            )
        })?)
    } else {
        Heldout::Trace(Box::new(TraceFile::open(path).with_context(|| format!("held-out trace {}", path.display()))?))
    })
}

/// Runs `retention`.
pub fn retention_cmd(a: &RetentionArgs) -> Result<()> {
    let heldout = open_heldout(&a.heldout)?;
    let (stats, trace) = match &heldout {
        Heldout::Trace(f) => {
            let view = f.view();
            super::require_tokens(view.shape(), &a.heldout)?;
            (Stats::from_trace(&view, a.heldout.display().to_string(), String::new()), Some(view))
        }
        Heldout::Stats(s) => (s.clone(), None),
    };
    let mut results: Vec<(String, Retention)> = Vec::with_capacity(a.keep.len());
    for path in &a.keep {
        let map = if path.as_os_str() == "full" {
            KeepMap::full(stats.meta.num_experts, stats.meta.layer_ids.clone())
        } else {
            KeepMap::read_json(path)?
        };
        let r = retention(&map, &stats, trace.as_ref())
            .with_context(|| format!("retention of {} on {}", path.display(), a.heldout.display()))?;
        results.push((path.display().to_string(), r));
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(file, r)| {
                let mut v = serde_json::to_value(r).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("file".into(), file.clone().into());
                    o.insert("heldout".into(), a.heldout.display().to_string().into());
                }
                v
            })
            .collect();
        let doc = serde_json::json!({
            "kind": super::json::RETENTION, "heldout": a.heldout.display().to_string(), "maps": rows,
        });
        return super::json::print(&doc);
    }
    let path = a.heldout.display().to_string();
    let source = &stats.meta.source;
    if *source == path || source.is_empty() {
        writeln!(out, "held-out: {path} ({} layers)", stats.layers.len())?;
    } else {
        writeln!(out, "held-out: {path} ({} layers, source: {source})", stats.layers.len())?;
    }
    let fmt = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{x:.4}"));
    let reap = results.iter().any(|(_, r)| r.mean.reap_retention.is_some());
    let (mass_name, mass): (&str, fn(&saliency::RetentionFigures) -> Option<f64>) =
        if reap { ("reap_retention", |f| f.reap_retention) } else { ("gate_retention", |f| f.gate_retention) };
    let mut t = comfy_table::Table::new();
    t.set_header(vec![
        "map".to_string(),
        "kept/layer".to_string(),
        format!("{mass_name} mean"),
        format!("{mass_name} min"),
        "slot_replacement mean".to_string(),
        "slot_replacement max".to_string(),
        "prob_retention mean".to_string(),
        "prob_retention min".to_string(),
        "kept, 0 held-out hits".to_string(),
    ]);
    for (_, r) in &results {
        let kept: Vec<usize> = r.per_layer.iter().map(|l| l.kept).collect();
        let (lo, hi) = (kept.iter().min().copied().unwrap_or(0), kept.iter().max().copied().unwrap_or(0));
        t.add_row(vec![
            r.label.clone(),
            if lo == hi { lo.to_string() } else { format!("{lo}..{hi}") },
            fmt(mass(&r.mean)),
            fmt(mass(&r.min)),
            format!("{:.4}", r.mean.slot_replacement),
            format!("{:.4}", r.max_slot_replacement),
            fmt(r.mean.prob_retention),
            fmt(r.min.prob_retention),
            r.mean.zero_hit_kept.to_string(),
        ]);
    }
    super::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    if let Some((_, r)) = results.iter().find(|(_, r)| r.mean.reap_excluded_experts > 0) {
        let slots: u64 = stats.layers.iter().map(|l| l.tokens * u64::from(stats.meta.top_k)).sum();
        writeln!(
            out,
            "note: reap_retention leaves out {} (layer, expert) entries with unknown REAP mass ({} of {slots} held-out slots, {:.2}%)",
            r.mean.reap_excluded_experts,
            r.mean.reap_excluded_slots,
            100.0 * r.mean.reap_excluded_slots as f64 / slots.max(1) as f64
        )?;
    }
    writeln!(out, "slot_replacement: lower is better, so its worst layer is the max (the min is in --json).")?;
    if a.per_layer {
        for (_, r) in &results {
            let mut t = comfy_table::Table::new();
            t.set_header(vec![
                "layer".to_string(),
                "kept".to_string(),
                mass_name.to_string(),
                "slot_replacement".to_string(),
                "prob_retention".to_string(),
                "kept, 0 held-out hits".to_string(),
            ]);
            for l in &r.per_layer {
                t.add_row(vec![
                    l.layer_id.to_string(),
                    l.kept.to_string(),
                    fmt(mass(&l.figures)),
                    format!("{:.4}", l.figures.slot_replacement),
                    fmt(l.figures.prob_retention),
                    l.figures.zero_hit_kept.to_string(),
                ]);
            }
            super::align_numbers(&mut t);
            writeln!(out, "{}\n{t}", r.label)?;
        }
    }
    Ok(())
}
