//! `moe-offload replay`: one configuration on one trace. The flags become an
//! `api::replay::ReplayRequest`, which holds every rule; this module prints its report.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Result, bail};
use api::inputs::{CapsSource, MapSource, TraceSource};
use api::replay::{CountsReport, ReplayReport, ReplayRequest};
use cachesim::{Policy, Semantics};
use clap::Args;

use crate::args::{Flags, Spelled};

mod deploy;
mod hybrid;
mod prefetch;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Cache policy (SEMANTICS.md §5).
    #[arg(long, value_parser = crate::args::policy())]
    pub policy: Policy,
    /// Cache capacity per layer, in experts (>= k_used). Optional with --layer-caps or
    /// --shared-cap.
    #[arg(long, required_unless_present_any = ["layer_caps", "shared_cap"])]
    pub cap: Option<usize>,
    /// One cache shared by every layer, of C (layer, expert) slots, instead of --cap per layer
    /// (SEMANTICS.md §15.1: the OS page cache under mmap, MoE-Infinity's expert cache). 0, or
    /// >= k_used; may exceed E. Pins (--pin) stay outside it: memory = pins + C experts.
    #[arg(long)]
    pub shared_cap: Option<usize>,
    /// Per-layer caps, one per trace layer (comma-separated, a JSON file holding a list, or a
    /// plan written by `moe-offload plan`, whose policy, k_used, warmup and keep map must then be
    /// this replay's too), overriding --cap per layer.
    #[arg(long)]
    pub layer_caps: Option<String>,
    /// Keep map JSON, or a plan JSON (its chosen keep map); default: every expert kept.
    #[arg(long)]
    pub keep: Option<PathBuf>,
    /// Experts used per token (default: the trace's top-k).
    #[arg(long, value_parser = crate::args::at_least_one)]
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
    /// Print one JSON object (kind `moe-offload-replay`) instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Prefetch, timeline and shuffled-order control (`replay_prefetch`).
    #[command(flatten)]
    pub extra: prefetch::PrefetchArgs,
    /// Deployments: pins, a second tier, served steps, re-batching (SEMANTICS.md §9-§11).
    #[command(flatten)]
    pub deploy: deploy::DeployArgs,
    /// Hybrid execution: non-resident experts computed on the CPU (SEMANTICS.md §14).
    #[command(flatten)]
    pub hybrid: hybrid::HybridArgs,
}

impl ReplayArgs {
    /// The request the flags ask for (argument translation only: the rules are the request's).
    fn request(&self) -> Result<ReplayRequest> {
        let (x, d, h) = (&self.extra, &self.deploy, &self.hybrid);
        Ok(ReplayRequest {
            layer_caps: self.layer_caps.as_deref().map(layer_caps).transpose()?,
            shared_cap: self.shared_cap,
            keep: self.keep.clone().map(MapSource::Path),
            k_used: self.k_used,
            warmup: self.warmup,
            lambda: self.lambda,
            j: self.j,
            decay: self.decay,
            near_pick_n: self.near_pick_n,
            semantics: self.semantics,
            reset_at_sequence: self.reset_at_sequence,
            pin: d.pin.clone().map(MapSource::Path),
            tier2: d.tier2.as_deref().map(|s| api::parse("tier2", s)).transpose().flags()?,
            served: d.served,
            batch: d.batch,
            link_gbps: d.link_gbps,
            compute_ms_per_step: d.compute_ms_per_step,
            prefetch: x.prefetch,
            calib: x.calib.clone().map(TraceSource::Path),
            timeline: x.timeline,
            profile: x.profile.clone(),
            bandwidth: x.bandwidth,
            shuffle: x.shuffle,
            exec: h.exec,
            overlap: h.overlap,
            host_gbps: h.host_gbps,
            host_ms_per_row: h.host_ms_per_row,
            host_sync_ms: h.host_sync_ms,
            profile_file: h.profile_file.clone(),
            ..ReplayRequest::new(TraceSource::Path(self.trace.clone()), self.policy, self.cap)
        })
    }
}

/// `--layer-caps`: comma-separated caps, else the path of a JSON file.
fn layer_caps(s: &str) -> Result<CapsSource> {
    let parsed: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse::<usize>()).collect();
    match parsed {
        Ok(caps) => Ok(CapsSource::List(caps)),
        Err(_) if s.contains(',') && !std::path::Path::new(s).is_file() => {
            let bad = s.split(',').find(|x| x.trim().parse::<usize>().is_err()).unwrap_or(s);
            bail!("--layer-caps: {bad:?} is not a whole number (expected e.g. 8,6,16)")
        }
        Err(_) => Ok(CapsSource::File(s.into())),
    }
}

/// Runs `replay`.
pub fn run(a: &ReplayArgs) -> Result<()> {
    let resolved = a.request()?.resolve().flags()?;
    for note in resolved.notes() {
        crate::progress::status!("{}", note.render(&Flags));
    }
    let working = crate::progress::working("replay");
    let report = resolved.run();
    working.finish();
    let report = report.flags()?;
    if let ReplayReport::Counts(c) = &report {
        for note in &c.notes {
            crate::progress::status!("{}", note.render(&Flags));
        }
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", report.document())?;
        return Ok(());
    }
    match &report {
        ReplayReport::Prefetch(_) => prefetch::write_table(&mut out, &report.document())?,
        ReplayReport::Counts(c) => write_table(&mut out, c)?,
    }
    Ok(())
}

/// The counts as a table, then a line for the deployment or hybrid execution.
fn write_table(out: &mut impl Write, r: &CountsReport) -> Result<()> {
    let c = &r.counts.counts;
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
    crate::commands::align_numbers(&mut t);
    writeln!(out, "{t}")?;
    match &r.hybrid {
        Some(h) => writeln!(out, "{}", hybrid::summary_line(h, &r.profile))?,
        None if !r.plain => writeln!(out, "{}", deploy::summary_line(&r.counts, &r.deployment))?,
        None => {}
    }
    if let Some(sh) = &r.shared {
        writeln!(out, "shared cache of {} slots (SEMANTICS.md §15.1)", sh.cap)?;
        let mut t = comfy_table::Table::new();
        t.set_header(["layer", "misses", "slots at end", "mean slots"]);
        for (l, ((&misses, &end), &mean)) in
            c.layer_misses.iter().zip(&sh.layer_slots_end).zip(&sh.layer_slots_mean).enumerate()
        {
            t.add_row([l.to_string(), misses.to_string(), end.to_string(), format!("{mean:.2}")]);
        }
        crate::commands::align_numbers(&mut t);
        writeln!(out, "{t}")?;
    }
    Ok(())
}
