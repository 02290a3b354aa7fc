//! `moe-offload stats`, `keep` and `retention`: statistics, keep maps and out-of-sample retention
//! (SEMANTICS.md §2-§4).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use saliency::{
    Budget, BudgetScale, KeepConfig, KeepMap, Metric, MetricConfig, NonFiniteReap, ReapAggOptions, Retention, Stats,
    retention,
};
use trace_io::{Reads, TraceFile};

#[derive(Debug, Args)]
pub struct StatsArgs {
    /// The trace (.safetensors). Omit it when reading a REAP aggregate file with --reap-agg.
    #[arg(required_unless_present = "reap_agg", conflicts_with = "reap_agg")]
    pub trace: Option<PathBuf>,
    /// A per-(layer, expert) REAP aggregate file (`core_agg.json` format) instead of a trace: its
    /// `freq` becomes `count` and its `reap` becomes `reap_sum` (no gate sums, norm sums or sums of
    /// squares). Variants: `tokens` for `tok`, `reap_mean` (means; reap_sum = reap_mean x freq) for
    /// `reap`, no reap at all (counts only), no corpus wrapper (omit --corpus).
    #[arg(long, value_name = "FILE")]
    pub reap_agg: Option<PathBuf>,
    /// The corpus of --reap-agg to load (see --list-corpora); omit it for a file without corpora.
    #[arg(long, requires = "reap_agg")]
    pub corpus: Option<String>,
    /// List the corpora of --reap-agg (tokens, layers, non-finite reap values) and exit.
    #[arg(long, requires = "reap_agg")]
    pub list_corpora: bool,
    /// The model's top-k for --reap-agg (the file does not record it). Default: inferred from the
    /// counts (sum of freq / tok, which must be the same whole number in every layer); a value the
    /// counts contradict is refused.
    #[arg(long, requires = "reap_agg")]
    pub top_k: Option<u32>,
    /// What to do with NaN/Infinity in a corpus's `reap`: `drop` the corpus's reap_sum (counts
    /// only), `mask` the affected experts (reap_sum kept, those experts marked missing: usable as
    /// held-out statistics, refused by REAP metrics), or `reject` the corpus.
    #[arg(long, default_value = "drop", requires = "reap_agg")]
    pub non_finite_reap: NonFiniteReap,
    /// Output statistics JSON (`-` for standard output; the status line then goes to stderr).
    #[arg(short, long, required_unless_present = "list_corpora")]
    pub output: Option<PathBuf>,
    /// With --list-corpora: print the corpora as JSON (kind `moe-offload-reap-corpora`).
    #[arg(long, requires = "list_corpora")]
    pub json: bool,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("size").required(true).args(["k", "budget"])))]
pub struct KeepArgs {
    /// Statistics JSON written by `moe-offload stats`.
    pub stats: PathBuf,
    /// Saliency metric: frequency, gate_sum, ean_sum, ean_mean, reap, l2_sum, shrink, hybrid.
    #[arg(long)]
    pub metric: Metric,
    /// Experts kept per layer; several comma-separated values (`--k 32,48`) write one map each.
    #[arg(long, value_delimiter = ',', conflicts_with = "budget", value_parser = crate::args::at_least_one)]
    pub k: Vec<usize>,
    /// Global budget: experts kept over all layers, a different K per layer (each layer keeps at
    /// least --floor, the rest go to the best experts of the whole model). Several comma-separated
    /// values write one map each.
    #[arg(long, value_delimiter = ',')]
    pub budget: Vec<u64>,
    /// Least experts kept per layer under --budget (default: the model's top-k, so every token can
    /// still use k experts).
    #[arg(long, requires = "budget")]
    pub floor: Option<u32>,
    /// How --budget compares experts of different layers: `share` (score / the layer's total, the
    /// default), `percentile` (rank within the layer) or `raw` (the score itself).
    #[arg(long, requires = "budget")]
    pub budget_scale: Option<BudgetScale>,
    /// τ of the `shrink` metric.
    #[arg(long, default_value_t = 64.0)]
    pub tau: f64,
    /// Base metrics of `hybrid`, comma-separated (default: l2_sum,reap when the statistics have
    /// reap_sum, else frequency,gate_sum).
    #[arg(long, value_delimiter = ',')]
    pub hybrid_base: Vec<Metric>,
    /// Allow layers with fewer than K (or --floor) experts that were ever routed (recorded in the
    /// map).
    #[arg(long)]
    pub allow_short_layers: bool,
    /// Output keep-map JSON for one map; for several (or when it is an existing directory, or
    /// ends with `/`) a directory that receives one `<label>.json` per map, e.g.
    /// `frequency@32.json`, `frequency@budget1536.json`. `-`: one map to standard output (the
    /// status line then goes to stderr).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Print the maps written as JSON (kind `moe-offload-keep-maps`: path, label, experts kept
    /// per layer) instead of one line each.
    #[arg(long)]
    pub json: bool,
}

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

/// Runs `stats`.
pub fn stats(a: &StatsArgs) -> Result<()> {
    if let Some(o) = &a.output {
        super::refuse_overwrite(o, a.trace.iter().chain(&a.reap_agg).map(PathBuf::as_path))?;
    }
    // `-o -`: the statistics go to standard output, the lines about them to standard error.
    let mut out: Box<dyn Write> = a.output.as_deref().map_or_else(|| Box::new(std::io::stdout()), super::human);
    if let Some(agg) = &a.reap_agg {
        if a.list_corpora {
            let corpora = Stats::reap_agg_summary(agg)?;
            if a.json {
                let rows: Vec<serde_json::Value> = corpora
                    .iter()
                    .map(|c| {
                        serde_json::json!({ "corpus": c.name, "tokens": c.tokens, "layers": c.layers,
                                            "non_finite_reap": c.non_finite_reap })
                    })
                    .collect();
                let doc = serde_json::json!({ "kind": super::json::REAP_CORPORA, "file": agg.display().to_string(),
                                              "corpora": rows });
                return super::json::print(&doc);
            }
            let mut t = comfy_table::Table::new();
            t.set_header(["corpus", "tokens", "layers", "non-finite reap values"]);
            for c in corpora {
                t.add_row([
                    if c.name.is_empty() {
                        "(top level: no corpus wrapper, omit --corpus)".to_string()
                    } else {
                        c.name
                    },
                    c.tokens.map_or_else(|| "?".to_string(), |t| t.to_string()),
                    c.layers.to_string(),
                    c.non_finite_reap.to_string(),
                ]);
            }
            super::align_numbers(&mut t);
            writeln!(out, "{t}")?;
            return Ok(());
        }
        let output = a.output.as_ref().context("--output is required: pass -o stats.json")?;
        let opts = ReapAggOptions { top_k: a.top_k.unwrap_or(1), non_finite_reap: a.non_finite_reap };
        // A file without the corpus wrapper takes no --corpus; the library's error says which.
        let mut stats = Stats::from_reap_agg_corpus(agg, a.corpus.as_deref(), &opts)?;
        // Without --corpus: the top level, or the file's one corpus (named in the source).
        let only = stats.meta.source.split_once('#').map(|(_, c)| c.split(" (").next().unwrap_or(c).to_string());
        let corpus = a.corpus.clone().or(only).unwrap_or_else(|| "(top level)".to_string());
        let corpus = corpus.as_str();
        if let (Some(given), Some(counted)) = (a.top_k, stats.infer_top_k())
            && given != counted
        {
            bail!(
                "--top-k {given} disagrees with corpus {corpus} of {}: its counts sum to {counted} x tokens in every \
                     layer (SEMANTICS.md §8.1: sum of counts = tokens x k); omit --top-k or pass {counted}",
                agg.display()
            );
        }
        if a.top_k.is_none() {
            let k = stats.infer_top_k().with_context(|| {
                format!(
                    "{}: cannot infer top-k (sum of freq / tok differs between layers or is not whole); pass --top-k",
                    agg.display()
                )
            })?;
            stats.meta.top_k = k;
        }
        super::write_output(output, &stats.to_json_bytes()?)?;
        writeln!(
            out,
            "wrote {}: corpus {corpus}, {} x {} experts, top-k {}, statistics: {}",
            super::shown(output),
            super::layers(stats.layers.len()),
            stats.meta.num_experts,
            stats.meta.top_k,
            stats.present_statistics().join(", ")
        )?;
        if let Some(note) = stats.meta.source.split_once(" (").map(|(_, n)| n.trim_end_matches(')')) {
            writeln!(out, "note: {note}")?;
            if a.non_finite_reap == NonFiniteReap::DropStatistic {
                writeln!(out, "      pass --non-finite-reap mask to keep the finite reap entries for retention")?;
            }
        }
        return Ok(());
    }
    let trace = a.trace.as_ref().context("a trace or --reap-agg is required")?;
    let output = a.output.as_ref().context("--output is required: pass -o stats.json")?;
    let working = crate::progress::working("stats: validating, hashing and counting");
    // Statistics read the first k ids of each row, the gates and the norms: validated alone, while
    // the provenance digest is computed beside them.
    let f = TraceFile::open_lazy(trace)?;
    super::require_tokens(f.shape(), trace)?;
    let (view, digest) = rayon::join(|| f.view_for(Reads::stats(f.shape().top_k)), || trace_io::trace_digest(trace));
    let stats = Stats::from_trace(&view?, trace.display().to_string(), digest?);
    working.finish();
    super::write_output(output, &stats.to_json_bytes()?)?;
    writeln!(
        out,
        "wrote {}: {}, statistics: {}",
        super::shown(output),
        super::layers(stats.layers.len()),
        stats.present_statistics().join(", ")
    )?;
    Ok(())
}

/// Runs `keep`.
pub fn keep(a: &KeepArgs) -> Result<()> {
    let to_stdout = super::is_stdout(&a.output);
    if to_stdout && (a.k.len() + a.budget.len() > 1 || a.json) {
        bail!(
            "-o -: one keep map goes to standard output, several are written to files (give -o DIR/), and --json \
             lists maps written to files: drop --json, or give one --k or --budget"
        );
    }
    super::refuse_overwrite(&a.output, [a.stats.as_path()])?;
    let stats = Stats::read_json(&a.stats)?;
    let cfg = KeepConfig {
        metric: MetricConfig { tau: a.tau, hybrid_base: (!a.hybrid_base.is_empty()).then(|| a.hybrid_base.clone()) },
        allow_short_layers: a.allow_short_layers,
    };
    if !a.hybrid_base.is_empty() && a.metric != Metric::Hybrid {
        bail!("--hybrid-base applies to --metric hybrid only: drop --hybrid-base or use --metric hybrid");
    }
    super::no_repeats("k", &a.k)?;
    super::no_repeats("budget", &a.budget)?;
    if a.budget.is_empty() && (a.floor.is_some() || a.budget_scale.is_some()) {
        bail!("--floor and --budget-scale apply to --budget maps only: drop them, or use --budget instead of --k");
    }
    let mut maps = if a.budget.is_empty() {
        KeepMap::build_many(&stats, a.metric, &a.k, &cfg).map_err(keep_hint)?
    } else {
        let mut maps = Vec::with_capacity(a.budget.len());
        for &total in &a.budget {
            let mut b = Budget::new(&stats, a.metric, total);
            if let Some(f) = a.floor {
                b.floor = f;
            }
            if let Some(s) = a.budget_scale {
                b.scale = s;
            }
            maps.push(KeepMap::build_budget(&stats, a.metric, &b, &cfg).map_err(keep_hint)?);
        }
        maps
    };
    // Every map is built before any file is written: a failing K leaves no partial output.
    let mut out = super::human(&a.output);
    // A path written as a directory (`maps/`) is one too, existing or not.
    let dir_like = a.output.as_os_str().to_string_lossy().ends_with(std::path::is_separator);
    let into_dir = !to_stdout && (maps.len() > 1 || a.output.is_dir() || dir_like);
    // Several maps are one output set: the directory gets all of them or none.
    let set = if into_dir {
        let set = trace_io::OutputSet::begin(&a.output)
            .with_context(|| format!("cannot write the output directory {}", a.output.display()))?;
        for map in &maps {
            map.write_json(set.staging().join(format!("{}.json", map.label())))?;
        }
        Some(set)
    } else {
        None
    };
    if let Some(set) = set {
        set.commit().with_context(|| format!("writing {}", a.output.display()))?;
    }
    let mut written = Vec::with_capacity(maps.len());
    for map in &mut maps {
        let path = if into_dir { a.output.join(format!("{}.json", map.label())) } else { a.output.clone() };
        if !into_dir {
            super::write_output(&path, &map.to_json_bytes()?)?;
        }
        let sizes: Vec<usize> = map.layers.iter().map(Vec::len).collect();
        let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
        if a.json {
            written.push(serde_json::json!({
                "path": path.display().to_string(), "label": map.label(), "metric": map.metric,
                "layer_ids": map.layer_ids, "kept_per_layer": sizes, "total_kept": map.total_kept(),
                "short_layers": map.short_layers,
            }));
            continue;
        }
        write!(out, "wrote {}: {} ({}", super::shown(&path), map.label(), super::layers(map.layers.len()))?;
        if map.budget.is_some() {
            write!(out, ", {} experts, per-layer K {lo}..={hi}", map.total_kept())?;
        }
        if !map.short_layers.is_empty() {
            write!(out, ", short layers {:?}", map.short_layers)?;
        }
        writeln!(out, ")")?;
    }
    if a.json {
        return super::json::print(&serde_json::json!({ "kind": super::json::KEEP_MAPS, "maps": written }));
    }
    Ok(())
}

/// Adds the fix to a keep-map error that does not state one.
fn keep_hint(e: saliency::SaliencyError) -> anyhow::Error {
    use saliency::SaliencyError as E;
    let hint = match &e {
        E::KTooLarge { num_experts, .. } => format!("use --k {num_experts} or less"),
        E::MissingStatistic { .. } => "use a metric these statistics support (frequency or gate_sum need no output \
            norms), or record output norms (python/capture_routing.py does)"
            .to_string(),
        E::ShortLayer { .. } => "pass --allow-short-layers, or use a smaller --k".to_string(),
        E::PartialStatistic { .. } => {
            "rank with statistics whose reap_sum is complete (--non-finite-reap drop keeps frequency)".to_string()
        }
        _ => return e.into(),
    };
    anyhow::anyhow!("{e}: {hint}")
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
