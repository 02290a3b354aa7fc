//! `moe-offload export keep`: keep maps in the formats other tools read (`docs/report.md`,
//! section "Exports").

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Subcommand, ValueEnum};
use saliency::KeepMap;

/// `moe-offload export ...`.
#[derive(Debug, Subcommand)]
pub enum ExportCmd {
    /// A keep map as per-layer kept-expert lists for pruning scripts.
    #[command(
        after_help = "Examples:\n  moe-offload export keep keep.json --format reap -o keep-reap.json\n  moe-offload export keep keep.json --format llama-cpp -o keep.txt\n  moe-offload export keep keep.json --format json -o keep-lists.json"
    )]
    Keep {
        /// Keep-map JSON written by `moe-offload keep`.
        keep: PathBuf,
        /// `reap`: `{"<layer_id>": [kept ids]}` (the layout of REAP-style expert-pruning scripts);
        /// `llama-cpp`: a text listing per GGUF block `blk.<layer_id>`; `json`: kept and pruned ids
        /// per layer with the map's metadata.
        #[arg(long)]
        format: ExportFormat,
        /// Output file.
        #[arg(short, long)]
        output: PathBuf,
    },
}

/// Export formats of a keep map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ExportFormat {
    /// `{"<layer_id>": [kept ids ascending]}`.
    Reap,
    /// One tab-separated line per layer: `blk.<layer_id>`, kept count, kept ids, pruned ids.
    LlamaCpp,
    /// Metadata (with `budget: {total, floor, scale}` for a budget map, else null) plus
    /// `layers: [{layer_id, kept, pruned}]`.
    Json,
}

/// Runs `export`.
pub fn run(cmd: &ExportCmd) -> Result<()> {
    let ExportCmd::Keep { keep, format, output } = cmd;
    super::refuse_overwrite(output, [keep.as_path()])?;
    let map = KeepMap::read_json(keep)?;
    let bytes = render(&map, *format);
    trace_io::write_atomic(output, |w| w.write_all(&bytes)).with_context(|| format!("writing {}", output.display()))?;
    let kept: usize = map.layers.iter().map(Vec::len).sum();
    writeln!(
        std::io::stdout().lock(),
        "wrote {} ({}): {}, {kept} kept experts of {}",
        output.display(),
        format.to_possible_value().map_or_else(|| format!("{format:?}"), |v| v.get_name().to_string()),
        super::layers(map.layers.len()),
        map.layers.len() * map.num_experts as usize
    )?;
    Ok(())
}

fn pruned(map: &KeepMap, kept: &[u16]) -> Vec<u32> {
    (0..map.num_experts).filter(|e| kept.binary_search(&(*e as u16)).is_err()).collect()
}

fn join<T: ToString>(ids: impl IntoIterator<Item = T>) -> String {
    ids.into_iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")
}

/// The bytes of `map` in `format` (deterministic: layers in map order, ids ascending).
fn render(map: &KeepMap, format: ExportFormat) -> Vec<u8> {
    match format {
        ExportFormat::Reap => {
            let mut o = serde_json::Map::new();
            for (id, kept) in map.layer_ids.iter().zip(&map.layers) {
                o.insert(id.to_string(), kept.to_vec().into());
            }
            let mut v = serde_json::to_vec_pretty(&o).expect("a map of lists serializes");
            v.push(b'\n');
            v
        }
        ExportFormat::Json => {
            let layers: Vec<serde_json::Value> = map
                .layer_ids
                .iter()
                .zip(&map.layers)
                .map(|(id, kept)| serde_json::json!({"layer_id": id, "kept": kept, "pruned": pruned(map, kept)}))
                .collect();
            let v = serde_json::json!({
                "format": "moe-offload-keep-lists",
                "format_version": 1,
                "label": map.label(),
                "metric": map.metric,
                "k": map.k,
                "num_experts": map.num_experts,
                "stats_sha256": map.stats_sha256,
                // A budget map: its total, per-layer floor and scale (`k` is then nominal).
                "budget": map.budget,
                "layers": layers,
            });
            let mut v = serde_json::to_vec_pretty(&v).expect("JSON values serialize");
            v.push(b'\n');
            v
        }
        ExportFormat::LlamaCpp => {
            // A budget map keeps a different K per layer: give the range, not the map's nominal K.
            let (lo, hi) = map.layers.iter().map(Vec::len).fold((usize::MAX, 0), |(lo, hi), n| (lo.min(n), hi.max(n)));
            let k = if lo < hi { format!("{lo}-{hi} by layer") } else { map.k.to_string() };
            let mut s = format!(
                "# moe-offload keep map {} (metric {}, K {}, {} experts per layer)\n\
                 # one line per MoE layer: GGUF block, kept count, kept expert ids, pruned expert ids\n\
                 # (tab-separated; ids comma-separated and ascending; an empty field is an empty list)\n",
                map.label(),
                map.metric,
                k,
                map.num_experts
            );
            for (id, kept) in map.layer_ids.iter().zip(&map.layers) {
                s += &format!("blk.{id}\t{}\t{}\t{}\n", kept.len(), join(kept.iter()), join(pruned(map, kept)));
            }
            s.into_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> KeepMap {
        let mut m = KeepMap::full(4, vec![1, 3]);
        m.metric = "frequency".into();
        m.k = 2;
        m.layers = vec![vec![0, 2], vec![1, 3]];
        m
    }

    #[test]
    fn reap_is_layer_id_to_kept_ids() {
        let v: serde_json::Value = serde_json::from_slice(&render(&map(), ExportFormat::Reap)).unwrap();
        assert_eq!(v, serde_json::json!({"1": [0, 2], "3": [1, 3]}));
    }

    #[test]
    fn json_lists_kept_and_pruned() {
        let v: serde_json::Value = serde_json::from_slice(&render(&map(), ExportFormat::Json)).unwrap();
        assert_eq!(v["layers"][0], serde_json::json!({"layer_id": 1, "kept": [0, 2], "pruned": [1, 3]}));
        assert_eq!(v["num_experts"], 4);
        assert_eq!(v["label"], "frequency@2");
        assert!(v["budget"].is_null());
        // A budget map says so, with its floor and scale.
        let mut m = map();
        m.budget = Some(saliency::Budget { total: 4, floor: 1, scale: saliency::BudgetScale::Share });
        let v: serde_json::Value = serde_json::from_slice(&render(&m, ExportFormat::Json)).unwrap();
        assert_eq!(v["budget"], serde_json::json!({"total": 4, "floor": 1, "scale": "share"}));
    }

    #[test]
    fn llama_cpp_lines() {
        let s = String::from_utf8(render(&map(), ExportFormat::LlamaCpp)).unwrap();
        let lines: Vec<&str> = s.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(lines, ["blk.1\t2\t0,2\t1,3", "blk.3\t2\t1,3\t0,2"]);
        assert!(s.starts_with("# moe-offload keep map frequency@2 (metric frequency, K 2, 4 experts per layer)"));
    }

    #[test]
    fn llama_cpp_header_of_a_budget_map_gives_the_k_range() {
        let mut m = map();
        m.layers = vec![vec![0], vec![0, 1, 3]];
        let s = String::from_utf8(render(&m, ExportFormat::LlamaCpp)).unwrap();
        assert!(s.lines().next().unwrap().contains("K 1-3 by layer,"), "{s}");
    }
}
