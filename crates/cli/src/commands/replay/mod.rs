//! `moe-offload replay`: one configuration on one trace.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use clap::Args;
use saliency::KeepMap;
use trace_io::TraceFile;

use inputs::{PlanSettings, check_map_fits, parse_layer_caps, read_keep, read_keep_of};

mod deploy;
mod hybrid;
pub mod inputs;
mod prefetch;

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The trace.
    pub trace: PathBuf,
    /// Cache policy (SEMANTICS.md §5).
    #[arg(long, value_parser = crate::args::policy())]
    pub policy: Policy,
    /// Cache capacity per layer, in experts (>= k_used). Optional with --layer-caps.
    #[arg(long, required_unless_present = "layer_caps")]
    pub cap: Option<usize>,
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

/// Runs `replay`.
pub fn run(a: &ReplayArgs) -> Result<()> {
    // Shapes and offsets now; the content the replay reads once the configuration is known.
    let f = TraceFile::open_lazy(&a.trace)?;
    let shape = f.shape();
    crate::commands::require_tokens(shape, &a.trace)?;
    let (map, keep) = match &a.keep {
        Some(p) => {
            let map = read_keep_of(p, a.deploy.pin.as_deref() == Some(p.as_path())).with_context(|| {
                format!(
                    "--keep {} is not a keep map (write one with `moe-offload keep STATS --metric frequency --k K -o keep.json`)",
                    p.display()
                )
            })?;
            check_map_fits(&map, f.meta(), p)?;
            let keep = Keep::from_layers(&shape, &map.layers).with_context(|| format!("keep map {}", p.display()))?;
            (Some(map), keep)
        }
        None => (None, Keep::full(&shape)),
    };
    // A plan given as both --pin and --layer-caps is replayed as its pinned plan (pins and caps).
    let pinned_plan = |s: &str| a.deploy.pin.as_deref() == Some(Path::new(s));
    let (layer_caps, made_with) =
        match a.layer_caps.as_deref().map(|s| parse_layer_caps(s, pinned_plan(s))).transpose()? {
            Some((caps, made_with)) => (Some(caps), made_with),
            None => (None, None),
        };
    if let (Some(plan), Some(path)) = (made_with, a.layer_caps.as_deref()) {
        // A plan of another model first: its other settings would only mislead.
        if let Some(n) = layer_caps.as_ref().map(Vec::len).filter(|&n| n != shape.layers) {
            bail!(
                "--layer-caps {path}: the plan has caps for {n} layers and {} has {} MoE layers: it was made for \
                 another model; plan again on traces of this one",
                a.trace.display(),
                shape.layers
            );
        }
        check_plan_settings(path, &plan, a, shape.top_k, map.as_ref())?;
    }
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
    // Credits read the router's candidates beyond the used ones (SEMANTICS.md §5); a log that
    // records only the used experts has none, and near_pick then ranks as lru does.
    let k_used = cfg.k_used_or(shape.top_k);
    if a.policy.facts().credits != cachesim::Credits::None && shape.candidates <= k_used {
        crate::progress::status!(
            "note: {} records {} candidates per token, no more than the {k_used} used: {}'s credits see no other \
             candidate (with near_pick_n >= k_used near_pick then ranks exactly as lru); a capture with more \
             candidates (python/capture_routing.py) or a smaller --k-used gives them some",
            a.trace.display(),
            shape.candidates,
            a.policy
        );
    }
    // A sweep refuses a cap above E (a typo there multiplies); one replay runs it, and says so.
    let e = shape.num_experts;
    if let Some(c) = std::iter::once(cap).chain(layer_caps.iter().flatten().copied()).find(|&c| c > e) {
        crate::progress::status!(
            "note: cap {c} is more than the {e} experts of a layer: every expert fits and the cache never evicts"
        );
    }
    let exec = a.hybrid.exec;
    if let Some(flag) = a.hybrid.stray_flag() {
        bail!("{flag} prices hybrid execution (SEMANTICS.md §14): add --exec host (or host:R), or drop {flag}");
    }
    let dep = deploy::deployment(&a.deploy, exec, f.meta(), &shape, read_keep)?;
    if exec.is_hybrid() {
        if dep.tier2.is_some() {
            bail!(
                "--tier2 with --exec {exec}: a non-resident expert is computed on the CPU from host memory, so there \
                 is no second tier to load it from (SEMANTICS.md §14); drop --tier2, or use --exec transfer"
            );
        }
        if a.extra.active() && !only_profile(&a.extra) {
            let x = &a.extra;
            let given = [
                (x.prefetch.is_some(), "--prefetch"),
                (x.calib.is_some(), "--calib"),
                (x.timeline, "--timeline"),
                (x.bandwidth.is_some(), "--bandwidth"),
                (x.shuffle.is_some(), "--shuffle"),
            ];
            let flag = given.iter().find(|g| g.0).map_or("--prefetch", |g| g.1);
            bail!(
                "{flag} with --exec {exec}: prefetch, the timeline of §13 (--bandwidth) and the shuffled control \
                 price loads to the GPU, which hybrid execution replaces by host runs (SEMANTICS.md §14); drop \
                 {flag}, or use --exec transfer"
            );
        }
    }
    let request = cachesim::Replay { keep: &keep, config: &cfg, deployment: &dep, exec };
    let plain = request.path() == cachesim::ReplayPath::Plain;
    // With a deployment, `--profile` prices the deployed replay (below); the other prefetch
    // flags do not apply to it.
    let prefetch_on = if plain { a.extra.active() } else { a.extra.active() && !only_profile(&a.extra) };
    if prefetch_on {
        if !plain {
            bail!(
                "prefetch, the timeline and the shuffled order (SEMANTICS.md §12-§13) are replayed per token with one \
                 tier and no pins: drop --pin, --tier2, --served, --batch and --cap 0, or the prefetch flags"
            );
        }
        let v = f.view_for(cachesim::replay_reads(&shape, &keep, &cfg))?;
        return prefetch::run(&a.extra, a.hybrid.profile_file.as_deref(), &a.trace, a.json, &v, &keep, &cfg);
    }
    let v = f.view_for(request.reads(&shape))?;
    let working = crate::progress::working("replay");
    let replayed = request.run(&v);
    working.finish();
    let replayed = replayed.map_err(|e| match e {
        cachesim::CacheSimError::KUsedAboveCandidates { candidates, .. } => {
            anyhow::anyhow!("{e}: use --k-used {candidates} or less")
        }
        cachesim::CacheSimError::OfflineWithLambda { .. } => {
            anyhow::anyhow!("{e}: drop --lambda, or use an online policy such as lru with --lambda")
        }
        e => e.into(),
    })?;
    let dc = replayed.deploy_counts();
    let hybrid = match replayed {
        cachesim::Replayed::Hybrid(hc, events) => Some((hc, events)),
        _ => None,
    };
    let c = &dc.counts;
    let profile = hybrid::base_profile(a.hybrid.profile_file.as_deref(), a.extra.profile.as_deref(), &v)?;
    // The hybrid counts, profile, device and cost.
    let priced = match &hybrid {
        Some((hc, events)) => {
            let mut p = profile.clone();
            let dev = hybrid::device(&a.hybrid, &mut p, a.deploy.link_gbps, a.deploy.compute_ms_per_step)?;
            let cost = hybrid::cost(events, &dev, exec)?;
            Some((hc, p, dev, cost))
        }
        None => None,
    };
    if a.reset_at_sequence && v.seq_offsets().is_none_or(|s| s.len() <= 1) {
        writeln!(
            std::io::stderr().lock(),
            "note: {} records no sequence start after token 0 (seq_offsets); --reset-at-sequence changes nothing",
            a.trace.display()
        )?;
    }
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut j = serde_json::json!({
            "kind": crate::commands::json::REPLAY,
            "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
            "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
            "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
        });
        if let (Some(j), serde_json::Value::Object(extra)) =
            (j.as_object_mut(), deploy::json_extras(&a.deploy, profile, &dep, &dc)?)
        {
            j.extend(extra);
        }
        if let (Some(j), Some((hc, p, dev, cost))) = (j.as_object_mut(), &priced)
            && let serde_json::Value::Object(h) = hybrid::json_fields(exec, hc, p, dev, cost)
        {
            j.extend(h);
        }
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
        crate::commands::align_numbers(&mut t);
        writeln!(out, "{t}")?;
        if !plain && priced.is_none() {
            writeln!(out, "{}", deploy::summary_line(&dc, &dep))?;
        }
        if let Some((hc, p, dev, cost)) = &priced {
            writeln!(out, "{}", hybrid::summary_line(exec, hc, p, dev, cost))?;
        }
    }
    Ok(())
}

/// Whether `--profile` is the only prefetch-section flag given.
fn only_profile(e: &prefetch::PrefetchArgs) -> bool {
    e.profile.is_some()
        && e.prefetch.is_none()
        && !e.timeline
        && e.shuffle.is_none()
        && e.calib.is_none()
        && e.bandwidth.is_none()
}

/// Refuses to replay a plan's caps under settings other than the plan's own: the figures would
/// silently differ from the ones the plan printed. Compares the plan's recorded policy, k_used,
/// warmup and keep map (`map`: this replay's, `None` for every expert kept; `top_k`: the trace's,
/// the default k_used), and the settings `plan` leaves at their defaults; names each difference
/// and the flag that restores the plan's.
fn check_plan_settings(
    path: &str,
    plan: &PlanSettings,
    a: &ReplayArgs,
    top_k: usize,
    map: Option<&KeepMap>,
) -> Result<()> {
    let mut diffs = Vec::new();
    let mut flags = Vec::new();
    let mut differs = |diff: String, flag: String| {
        diffs.push(diff);
        flags.push(flag);
    };
    let policy = a.policy.to_string();
    if plan.policy != policy {
        differs(format!("policy {} (here {policy})", plan.policy), format!("--policy {}", plan.policy));
    }
    let k_used = a.k_used.unwrap_or(top_k);
    if let Some(k) = plan.k_used.filter(|&k| k != k_used) {
        differs(format!("k_used {k} (here {k_used})"), format!("--k-used {k}"));
    }
    if let Some(w) = plan.warmup.filter(|&w| w != a.warmup) {
        differs(format!("warmup {w} (here {})", a.warmup), format!("--warmup {w}"));
    }
    let variant = map.map_or_else(|| "full".to_string(), KeepMap::label);
    let other_map = match (&plan.keep_layers, map) {
        (Some(p), Some(m)) => *p != m.layers,
        _ => plan.variant != variant,
    };
    if other_map {
        // A plan written before plans recorded their keep map names it only.
        let flag = match plan.keep_layers {
            Some(_) => format!("--keep {path}"),
            None => format!("--keep with the keep map {}", plan.variant),
        };
        differs(format!("keep map {} (here {variant})", plan.variant), flag);
    }
    // `plan` replays with the defaults of everything else.
    let d = ReplayConfig::new(a.policy, 1);
    if a.lambda != d.lambda {
        differs(format!("lambda {} (here {})", d.lambda, a.lambda), format!("--lambda {}", d.lambda));
    }
    if a.decay != d.decay {
        differs(format!("decay {} (here {})", d.decay, a.decay), format!("--decay {}", d.decay));
    }
    if a.near_pick_n != d.near_pick_n {
        let (n, here) = (d.near_pick_n, a.near_pick_n);
        differs(format!("near_pick_n {n} (here {here})"), format!("--near-pick-n {n}"));
    }
    if a.semantics != d.semantics {
        let (sem, here) = (d.semantics, a.semantics);
        differs(format!("semantics {sem} (here {here})"), format!("--semantics {sem}"));
    }
    if a.reset_at_sequence {
        differs("no reset at sequence starts (here one)".into(), "(and drop --reset-at-sequence)".into());
    }
    if diffs.is_empty() {
        return Ok(());
    }
    bail!(
        "--layer-caps {path} is a plan made with {}: its caps replayed otherwise would not give the plan's figures. \
         To verify the plan add {}; to replay its caps under other settings, give them as a list (--layer-caps 8,6,...)",
        diffs.join(", "),
        flags.join(" ")
    )
}
