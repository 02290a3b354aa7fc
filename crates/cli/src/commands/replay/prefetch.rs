//! `moe-offload replay` with prefetch (SEMANTICS.md §12), the timeline (§13) or the
//! shuffled-order control: the flags, and the replay and report they add.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::{
    CacheSimError, CoactTable, Keep, Prefetch, PrefetchOptions, PrefetchReplay, ReplayConfig, TimelineDevice,
    shuffle::Shuffled,
};
use clap::Args;
use serde_json::{Value, json};
use sweep::DeviceProfile;
use trace_io::{TraceFile, TraceView};

/// The flags `replay` takes for prefetch, the timeline and the shuffled control.
#[derive(Debug, Args)]
pub struct PrefetchArgs {
    /// Prefetch before each token's demand accesses: PRED:B with PRED one of prev_token, coact,
    /// lookahead, oracle and B the proposals per token and layer (<= cap), e.g. coact:4.
    #[arg(long, value_name = "PRED:B")]
    pub prefetch: Option<Prefetch>,
    /// Calibration trace of the coact predictor (same model layers and experts as the trace).
    #[arg(long, value_name = "TRACE")]
    pub calib: Option<PathBuf>,
    /// Also play the replay on the timeline of one compute stream and one I/O channel (adds
    /// tok_s and stall_s_per_token, with and without prefetch).
    #[arg(long)]
    pub timeline: bool,
    /// Device profile (reference, dsv2-lite-bf16, qwen15-moe-bf16, mixtral-8x7b-q4); default:
    /// the trace's model's, else reference. Prices the bytes moved and the timeline.
    #[arg(long)]
    pub profile: Option<String>,
    /// I/O bandwidth of the timeline, in GB/s (default: the profile's first, 3.9).
    #[arg(long, value_name = "GBPS", value_parser = crate::args::positive)]
    pub bandwidth: Option<f64>,
    /// Also replay a token-shuffled copy of the trace (the permutation of SEED, the same in
    /// every layer) with the same settings: the misses without temporal locality.
    #[arg(long, value_name = "SEED")]
    pub shuffle: Option<u64>,
}

impl PrefetchArgs {
    /// Whether any of these flags asks for more than a plain replay.
    pub fn active(&self) -> bool {
        self.prefetch.is_some()
            || self.timeline
            || self.shuffle.is_some()
            || self.calib.is_some()
            || self.profile.is_some()
            || self.bandwidth.is_some()
    }
}

/// Runs `replay` with the flags of [`PrefetchArgs`] on the trace `v` (already opened, with its
/// keep set and configuration).
#[allow(clippy::too_many_arguments)]
pub fn run(
    x: &PrefetchArgs,
    profile_file: Option<&std::path::Path>,
    trace: &std::path::Path,
    json: bool,
    v: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
) -> Result<()> {
    let coact_wanted = x.prefetch.is_some_and(|p| p.predictor.facts().needs_calibration);
    if x.calib.is_some() && !coact_wanted {
        bail!("--calib is read only by the coact predictor: add --prefetch coact:B, or drop --calib");
    }
    if coact_wanted && x.calib.is_none() {
        bail!("--prefetch coact:B learns its co-activation table from a calibration trace: add --calib TRACE");
    }
    let calib = x.calib.as_ref().map(|p| TraceFile::open_lazy(p).with_context(|| format!("--calib {}", p.display())));
    let calib = calib.transpose()?;
    // coact learns from the first k ids of every calibration row: validate those.
    let table = match (&calib, &x.calib) {
        (Some(c), Some(p)) => {
            let view = c
                .view_for(trace_io::Reads::ids(c.shape().top_k))
                .with_context(|| format!("--calib {}", p.display()))?;
            Some(CoactTable::learn(&view)?)
        }
        _ => None,
    };
    let profile = super::hybrid::base_profile(profile_file, x.profile.as_deref(), v)?;
    let bw = x.bandwidth.or(profile.bandwidth_gbps.first().copied()).unwrap_or(3.9);
    let device = TimelineDevice { expert_mb: profile.expert_mb, compute_ms: profile.compute_ms, bandwidth_gbps: bw };
    let timeline = x.timeline.then_some(device);
    let opts = PrefetchOptions { prefetch: x.prefetch, coact: table.as_ref(), timeline };
    let trace_name = trace.display().to_string();
    let calib_name = x.calib.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
    let explain = |e: CacheSimError| -> anyhow::Error {
        match e {
            CacheSimError::NoLookahead => anyhow::anyhow!("{trace_name}: {e}"),
            CacheSimError::CalibrationMismatch { .. } => anyhow::anyhow!("--calib {calib_name}: {e}"),
            CacheSimError::BudgetAboveCap { .. } => anyhow::anyhow!("--prefetch: {e}"),
            CacheSimError::PrefetchWithOffline { .. } => anyhow::anyhow!("--prefetch: {e}"),
            e => e.into(),
        }
    };
    let working = crate::progress::working("replay");
    let plain_opts = PrefetchOptions { prefetch: None, coact: None, timeline };
    let plain = cachesim::replay_prefetch(v, keep, cfg, &plain_opts).map_err(explain)?;
    let main = match x.prefetch {
        Some(_) => cachesim::replay_prefetch(v, keep, cfg, &opts).map_err(explain)?,
        None => plain.clone(),
    };
    let shuffled = match x.shuffle {
        Some(seed) => {
            let sh = Shuffled::new(v, seed);
            Some((seed, cachesim::replay_prefetch(&sh.view(), keep, cfg, &opts).map_err(explain)?))
        }
        None => None,
    };
    working.finish();
    let report = report(x, &main, &plain, shuffled.as_ref(), &profile, bw);
    let mut out = std::io::stdout().lock();
    if json {
        writeln!(out, "{}", crate::commands::json::tagged(crate::commands::json::REPLAY, report))?;
    } else {
        write_table(&mut out, &report)?;
    }
    Ok(())
}

/// The JSON object: the fields of a plain `replay --json` (of this replay: with prefetch its
/// `misses` are the demand misses) and the ones the flags add.
fn report(
    x: &PrefetchArgs,
    main: &PrefetchReplay,
    plain: &PrefetchReplay,
    shuffled: Option<&(u64, PrefetchReplay)>,
    profile: &DeviceProfile,
    bw: f64,
) -> Value {
    let c = &main.counts.replay;
    let mut j = json!({
        "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
        "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
        "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
        "profile": profile.name, "expert_mb": profile.expert_mb,
    });
    let o = j.as_object_mut().expect("an object");
    if let Some(pf) = x.prefetch {
        let p = &main.counts;
        let plain_misses = plain.counts.replay.misses;
        let saved = p.loads_per_miss_saved(plain_misses);
        o.extend([
            ("prefetch".into(), json!(pf.to_string())),
            ("prefetch_loads".into(), json!(p.prefetch_loads)),
            ("useful".into(), json!(p.useful)),
            ("wasted".into(), json!(p.wasted)),
            ("precision".into(), json!(p.precision_defined())),
            ("coverage".into(), json!(p.coverage_defined())),
            ("loads_per_token".into(), json!(p.loads_per_token())),
            ("mb_per_token".into(), json!(p.mb_per_token(profile.expert_mb))),
            ("plain_misses".into(), json!(plain_misses)),
            ("loads_per_miss_saved".into(), json!(saved)),
            ("mb_per_miss_saved".into(), json!(saved.map(|s| s * profile.expert_mb))),
        ]);
    }
    if let (Some(t), Some(t0)) = (main.timeline, plain.timeline) {
        o.extend([
            ("bandwidth_gbps".into(), json!(bw)),
            ("tok_s".into(), json!(t.tok_s)),
            ("stall_s_per_token".into(), json!(t.stall_s_per_token)),
            ("tok_s_no_prefetch".into(), json!(t0.tok_s)),
            ("stall_s_per_token_no_prefetch".into(), json!(t0.stall_s_per_token)),
            ("additive_tok_s".into(), json!(profile.tok_s(plain.counts.replay.misses_per_token(), bw))),
        ]);
    }
    if let Some((seed, s)) = shuffled {
        let sc = &s.counts;
        let mut sh = json!({
            "misses": sc.replay.misses, "misses_per_token": sc.replay.misses_per_token(),
            "hit_rate": sc.replay.hit_rate(),
        });
        if x.prefetch.is_some() {
            let so = sh.as_object_mut().expect("an object");
            so.insert("prefetch_loads".into(), json!(sc.prefetch_loads));
            so.insert("useful".into(), json!(sc.useful));
            so.insert("precision".into(), json!(sc.precision_defined()));
            so.insert("coverage".into(), json!(sc.coverage_defined()));
        }
        if let Some(t) = s.timeline {
            sh["tok_s"] = json!(t.tok_s);
        }
        o.insert("shuffle_seed".into(), json!(seed));
        o.insert("shuffled".into(), sh);
    }
    j
}

/// The report as tables: the counts, then one row per figure the flags add.
fn write_table(out: &mut impl Write, r: &Value) -> Result<()> {
    let mut t = comfy_table::Table::new();
    t.set_header(["tokens", "picks", "hits", "misses", "forced", "hit rate", "misses/token"]);
    t.add_row([
        r["tokens"].to_string(),
        r["picks"].to_string(),
        r["hits"].to_string(),
        r["misses"].to_string(),
        r["forced_misses"].to_string(),
        format!("{:.4}", r["hit_rate"].as_f64().unwrap_or(0.0)),
        format!("{:.4}", r["misses_per_token"].as_f64().unwrap_or(0.0)),
    ]);
    writeln!(out, "{t}")?;
    let mut t = comfy_table::Table::new();
    t.set_header(["figure", "value"]);
    let num = |v: &Value| match v.as_f64() {
        Some(f) if v.is_f64() => format!("{f:.4}"),
        _ => v.to_string(),
    };
    for key in [
        "prefetch",
        "prefetch_loads",
        "useful",
        "wasted",
        "precision",
        "coverage",
        "loads_per_token",
        "mb_per_token",
        "plain_misses",
        "loads_per_miss_saved",
        "mb_per_miss_saved",
        "bandwidth_gbps",
        "tok_s",
        "stall_s_per_token",
        "tok_s_no_prefetch",
        "stall_s_per_token_no_prefetch",
        "additive_tok_s",
        "shuffle_seed",
    ] {
        if let Some(v) = r.get(key) {
            t.add_row([key.to_string(), num(v)]);
        }
    }
    if let Some(s) = r.get("shuffled") {
        for (k, v) in s.as_object().into_iter().flatten() {
            t.add_row([format!("shuffled {k}"), num(v)]);
        }
    }
    writeln!(out, "profile {} ({} MB per expert)\n{t}", r["profile"].as_str().unwrap_or(""), r["expert_mb"])?;
    Ok(())
}
