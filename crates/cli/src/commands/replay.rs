//! `moe-offload replay`: one configuration on one trace.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use clap::Args;
use saliency::KeepMap;
use trace_io::{TraceFile, TraceView};

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Cache policy: lru, fifo, lfu, belady, near_pick, near_pick_ema, inv_router.
    #[arg(long)]
    pub policy: Policy,
    /// Cache capacity per layer, in experts (>= k_used). Optional with --layer-caps.
    #[arg(long, required_unless_present = "layer_caps")]
    pub cap: Option<usize>,
    /// Per-layer caps, one per trace layer (comma-separated, or a JSON file such as a plan's
    /// `chosen.plan.caps` list), overriding --cap per layer.
    #[arg(long)]
    pub layer_caps: Option<String>,
    /// Keep map JSON (default: every expert kept).
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long)]
    pub k_used: Option<usize>,
    /// Warmup tokens not counted (policy state still evolves through them). Belady is a lower
    /// bound of every online policy only with `--warmup 0`; counted from a warmup it may exceed
    /// one by up to the cap per layer.
    #[arg(long, default_value_t = 64)]
    pub warmup: usize,
    /// λ of cache-aware routing (0 = the model's own routing).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub lambda: f64,
    /// j: ranks boosted by cache-aware routing regardless of the cache.
    #[arg(long, default_value_t = 0)]
    pub j: usize,
    /// Decay d of near_pick_ema and inv_router.
    #[arg(long, default_value_t = 0.99)]
    pub decay: f64,
    /// N of near_pick and near_pick_ema.
    #[arg(long, default_value_t = 48)]
    pub near_pick_n: usize,
    /// Residency semantics: k-way (default) or sequential.
    #[arg(long, default_value = "k-way")]
    pub semantics: Semantics,
    /// Empty every cache at each sequence start.
    #[arg(long)]
    pub reset_at_sequence: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `replay`.
pub fn run(a: &ReplayArgs) -> Result<()> {
    let f = TraceFile::open(&a.trace)?;
    let v = f.view();
    let shape = v.shape();
    let keep = match &a.keep {
        Some(p) => {
            let map = KeepMap::read_json(p).with_context(|| {
                format!(
                    "--keep {} is not a keep map (write one with `moe-offload keep STATS --metric frequency --k K -o keep.json`)",
                    p.display()
                )
            })?;
            check_map_fits(&map, &v, p)?;
            Keep::from_layers(&shape, &map.layers).with_context(|| format!("keep map {}", p.display()))?
        }
        None => Keep::full(&shape),
    };
    let layer_caps = a.layer_caps.as_deref().map(parse_layer_caps).transpose()?;
    // With per-layer caps and no --cap, the base cap is the smallest of them (validated likewise).
    let cap = a.cap.or_else(|| layer_caps.as_ref().and_then(|c| c.iter().copied().min())).unwrap_or(0);
    let cfg = ReplayConfig {
        k_used: a.k_used,
        warmup: a.warmup,
        lambda: a.lambda,
        j: a.j,
        decay: a.decay,
        near_pick_n: a.near_pick_n,
        semantics: a.semantics,
        reset_at_sequence: a.reset_at_sequence,
        layer_caps: layer_caps.clone(),
        ..ReplayConfig::new(a.policy, cap)
    };
    let c = cachesim::replay(&v, &keep, &cfg).map_err(|e| match e {
        cachesim::CacheSimError::KUsedAboveCandidates { candidates, .. } => {
            anyhow::anyhow!("{e}: use --k-used {candidates} or less")
        }
        cachesim::CacheSimError::BeladyWithLambda { .. } => {
            anyhow::anyhow!("{e}: drop --lambda, or use an online policy such as lru with --lambda")
        }
        e => e.into(),
    })?;
    if a.reset_at_sequence && v.seq_offsets().is_none_or(|s| s.len() <= 1) {
        writeln!(
            std::io::stderr().lock(),
            "note: {} records no sequence start after token 0 (seq_offsets); --reset-at-sequence changes nothing",
            a.trace.display()
        )?;
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let j = serde_json::json!({
            "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
            "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
            "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
        });
        writeln!(out, "{j}")?;
    } else {
        let mut t = comfy_table::Table::new();
        t.set_header(["tokens", "picks", "hits", "misses", "forced", "hit rate", "misses/token"]);
        t.add_row([
            c.tokens.to_string(),
            c.picks.to_string(),
            c.hits.to_string(),
            c.misses.to_string(),
            c.forced_misses.to_string(),
            format!("{:.4}", c.hit_rate()),
            format!("{:.4}", c.misses_per_token()),
        ]);
        writeln!(out, "{t}")?;
    }
    Ok(())
}

/// Refuses a keep map made for another model shape.
pub fn check_map_fits(map: &KeepMap, v: &TraceView<'_>, path: &Path) -> Result<()> {
    let m = v.meta();
    if map.num_experts != m.num_experts || map.layer_ids != m.layer_ids {
        bail!(
            "keep map {} is for E = {} and layers {:?}; the trace has E = {} and layers {:?}: build the map from \
             statistics of a trace of the same model (`moe-offload stats` then `moe-offload keep`)",
            path.display(),
            map.num_experts,
            map.layer_ids,
            m.num_experts,
            m.layer_ids
        );
    }
    Ok(())
}

/// `8,6,16` or a JSON file holding a list, or a plan JSON (`chosen.plan.caps`).
fn parse_layer_caps(s: &str) -> Result<Vec<usize>> {
    if std::path::Path::new(s).is_file() {
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(s)?).with_context(|| format!("reading {s}"))?;
        let list = if v.is_array() { &v } else { &v["chosen"]["plan"]["caps"] };
        return serde_json::from_value(list.clone())
            .with_context(|| format!("{s}: expected a JSON list of caps or a plan written by `moe-offload plan`"));
    }
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<usize>()
                .with_context(|| format!("--layer-caps: {x:?} is not a whole number (expected e.g. 8,6,16)"))
        })
        .collect()
}
