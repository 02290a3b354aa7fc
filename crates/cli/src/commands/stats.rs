//! `moe-offload stats`: per-(layer, expert) statistics of a trace or a REAP aggregate file
//! (SEMANTICS.md §2).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use saliency::{NonFiniteReap, ReapAggOptions, Stats};
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
            // Only when reap was dropped for its non-finite values (not for a corpus without reap).
            if a.non_finite_reap == NonFiniteReap::DropStatistic && note.starts_with("reap_sum dropped") {
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
