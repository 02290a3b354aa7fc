//! Plan files (`moe-offload plan -o plan.json`) re-derived (`audit --dir`): the chosen keep map
//! rebuilt from the in-sample trace's statistics, and the chosen configuration (variant, per-layer
//! caps, policy, k_used, warmup) replayed on both traces by the plain reference replayer, its
//! misses per token compared exactly with the plan's prediction and its recorded replay.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cachesim::{Keep, Policy, ReplayConfig};
use saliency::{KeepConfig, KeepMap, Stats};
use serde_json::{Value, json};
use trace_io::TraceFile;

use super::dir::Options;
use super::locate::{Finder, Located};
use super::{Check, Status, check};

const SECTION: &str = "5 plans";

/// The fields of a plan file the audit re-derives.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PlanFile {
    policy: Policy,
    k_used: usize,
    warmup: usize,
    in_sample: String,
    out_of_sample: String,
    chosen: Chosen,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Chosen {
    variant: String,
    keep_map: Option<KeepMap>,
    plan: Evaluated,
    replayed: Option<Replayed>,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Evaluated {
    caps: Vec<usize>,
    slots: usize,
    in_sample_misses_per_token: f64,
    out_of_sample_misses_per_token: f64,
}

#[derive(Debug, Clone, serde::Deserialize)]
struct Replayed {
    in_sample_misses_per_token: f64,
    out_of_sample_misses_per_token: f64,
}

/// True when `v` has the fields of a plan file.
pub fn looks_like_plan(v: &Value) -> bool {
    v.get("chosen").is_some_and(|c| c.get("plan").is_some()) && v.get("candidates").is_some()
}

/// The checks of one plan file at `path`, `name` as shown.
pub(super) fn plan_checks(name: &str, path: &Path, plan: &PlanFile, finder: &Finder, opts: &Options) -> Check {
    let title = format!("{name}: chosen configuration replayed by the reference replayer");
    if opts.no_replay {
        let first = format!("{name}: not replayed (--no-replay)");
        return Check {
            section: SECTION,
            name: title,
            status: Status::Finding,
            figures: BTreeMap::new(),
            first_offending: Some(first),
        };
    }
    let mut traces: Vec<PathBuf> = Vec::new();
    for (what, rec) in [("in_sample", &plan.in_sample), ("out_of_sample", &plan.out_of_sample)] {
        match finder.locate(rec, path, None) {
            Located::Found(p) => traces.push(p),
            Located::Missing(looked) => {
                let text = super::rederive::missing_text(name, &format!("{what} trace"), rec, &looked, finder);
                let first = format!("{text}; give --trace-dir DIR, or --no-replay to audit without the traces");
                return check(SECTION, &title, false, BTreeMap::new(), Some(first));
            }
            // No hash is recorded, so nothing can mismatch; `Unreadable` is the only other case.
            Located::Mismatch { path: p, .. } => traces.push(p),
            Located::Unreadable(e) => return check(SECTION, &title, false, BTreeMap::new(), Some(e)),
        }
    }
    match replay(name, plan, &traces) {
        Ok((first, figures)) => {
            let mut f = figures;
            f.insert("in_sample".into(), json!(finder.show(&traces[0])));
            f.insert("out_of_sample".into(), json!(finder.show(&traces[1])));
            check(SECTION, &title, first.is_none(), f, first)
        }
        Err(e) => check(SECTION, &title, false, BTreeMap::new(), Some(format!("{name}: {e:#}"))),
    }
}

/// Replays the chosen configuration: the first figure that differs, and the replayed figures.
fn replay(name: &str, plan: &PlanFile, traces: &[PathBuf]) -> Result<(Option<String>, BTreeMap<String, Value>)> {
    let calib = TraceFile::open(&traces[0])?;
    let held = TraceFile::open(&traces[1])?;
    let c = &plan.chosen;
    let shape = calib.shape();
    let meta = calib.meta();
    // The plan builds its candidates from statistics recorded with the in-sample path as given and
    // no hash, as this does.
    let stats = Stats::from_trace(&calib.view(), plan.in_sample.clone(), String::new());
    let rebuilt = sweep::variant_keep_map(&c.variant, &stats, &KeepConfig::default(), meta).ok();
    let mut first = None;
    let map = match (&c.keep_map, rebuilt) {
        (Some(recorded), Some(rebuilt)) => {
            if *recorded != rebuilt {
                first = Some(format!(
                    "{name}: chosen.keep_map is not the {} map rebuilt from the statistics of {}",
                    c.variant, plan.in_sample
                ));
            }
            recorded.clone()
        }
        (Some(recorded), None) => recorded.clone(),
        (None, Some(rebuilt)) => rebuilt,
        (None, None) => anyhow::bail!("chosen.variant {} cannot be rebuilt and no keep map is recorded", c.variant),
    };
    let keep = Keep::from_layers(&shape, &map.layers).context("chosen.keep_map")?;
    let cfg = ReplayConfig {
        k_used: Some(plan.k_used),
        warmup: plan.warmup,
        layer_caps: Some(c.plan.caps.clone()),
        ..ReplayConfig::new(plan.policy, c.plan.caps.iter().copied().min().unwrap_or(1))
    };
    let ins = cachesim::reference::replay(&calib.view(), &keep, &cfg)?.misses_per_token();
    let outs = cachesim::reference::replay(&held.view(), &keep, &cfg)?.misses_per_token();
    let slots: usize = c.plan.caps.iter().sum();
    let mut claims = vec![
        ("chosen.plan.in_sample_misses_per_token", c.plan.in_sample_misses_per_token, ins),
        ("chosen.plan.out_of_sample_misses_per_token", c.plan.out_of_sample_misses_per_token, outs),
    ];
    if let Some(r) = &c.replayed {
        claims.push(("chosen.replayed.in_sample_misses_per_token", r.in_sample_misses_per_token, ins));
        claims.push(("chosen.replayed.out_of_sample_misses_per_token", r.out_of_sample_misses_per_token, outs));
    }
    if first.is_none() && c.plan.slots != slots {
        first = Some(format!("{name}: chosen.plan.slots is {}, its caps sum to {slots}", c.plan.slots));
    }
    if let Some((what, claimed, got)) = claims.iter().find(|(_, claimed, got)| claimed != got) {
        first.get_or_insert_with(|| {
            format!("{name}: {what} is {claimed} in the plan, the reference replay of its configuration gives {got}")
        });
    }
    let f = BTreeMap::from([
        ("in_sample_misses_per_token".to_string(), super::round6(ins)),
        ("out_of_sample_misses_per_token".to_string(), super::round6(outs)),
    ]);
    Ok((first, f))
}
