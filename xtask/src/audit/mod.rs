//! `cargo xtask audit`: the checks of SEMANTICS.md §8 as a report of named checks.
//!
//! Each [`Check`] has a section, a name, a status, its figures (floats rounded to 6 decimals, keys
//! sorted) and, when it fails, the first offending item. The report is asserted against an insta
//! JSON snapshot in `xtask/src/audit/snapshots/`.
//!
//! Modules: [`layering`] (crate dependencies point down), [`dir`] (audit any directory of
//! moe-offload outputs, with `locate` finding the inputs they name and verifying their hashes,
//! `recompute` recomputing statistics files, `rederive` replaying sweep rows, `crossfile`
//! checking a sweep's three files against one another and `plan` replaying plans); this module runs a whole pipeline on
//! traces and renders reports.

#[cfg(test)]
mod axes_tests;
#[cfg(test)]
mod corruption_tests;
mod crossfile;
mod derived;
pub mod dir;
#[cfg(test)]
mod fixture;
pub mod layering;
mod locate;
mod plan;
mod recompute;
mod rederive;

use std::collections::BTreeMap;

use anyhow::Result;
use cachesim::{Keep, Policy, ReplayConfig, Semantics};
use saliency::{KeepConfig, KeepMap, MetricConfig};
use serde_json::{Value, json};
use sweep::{DeviceProfile, Grid, Row, Sample, TraceInput};
use trace_io::{TraceFile, TraceView};

/// Outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The property holds.
    Pass,
    /// The property is broken: the audit fails.
    Fail,
    /// Not a failure of the tool but a fact worth a reviewer's eye (for example a λ
    /// non-monotonicity): reported, never hidden.
    Finding,
}

/// One named check.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// SEMANTICS.md §8 item, e.g. `1 statistics`.
    pub section: &'static str,
    /// Check name.
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// The figures behind it.
    pub figures: BTreeMap<String, Value>,
    /// The first offending item, when not passing.
    pub first_offending: Option<String>,
}

/// The whole audit of one subject.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// What was audited.
    pub subject: String,
    /// Checks in section order.
    pub checks: Vec<Check>,
}

pub(crate) fn round6(x: f64) -> Value {
    if x.is_finite() { json!((x * 1e6).round() / 1e6) } else { json!(x.to_string()) }
}

pub(crate) fn check(
    section: &'static str,
    name: &str,
    ok: bool,
    figures: BTreeMap<String, Value>,
    first: Option<String>,
) -> Check {
    Check {
        section,
        name: name.to_string(),
        status: if ok { Status::Pass } else { Status::Fail },
        figures,
        first_offending: first,
    }
}

/// Audits the embedded default: `data/grids/default.json` and its two traces.
pub fn default_report() -> Result<Report> {
    let root = crate::workspace_root();
    let grid = Grid::read(&root.join("data/grids/default.json"))?;
    let calib = TraceFile::open(&grid.traces.in_sample)?;
    let heldout = TraceFile::open(&grid.traces.out_of_sample)?;
    let mut report = audit_grid("embedded default (data/grids/default.json)", &grid, &calib.view(), &heldout.view())?;
    report.checks.insert(0, layering::check_edges(&layering::workspace_edges()?));
    Ok(report)
}

/// Audits the real ESFT routing (DeepSeek-V2-Lite): calibrate on intent+law+summary, hold out
/// translation, with `data/grids/esft-translation.json`'s variants and a reduced policy block.
pub fn esft_report(real: &std::path::Path) -> Result<Report> {
    use trace_io::import::esft::{EsftOptions, import_esft};
    let dir = real.join("esft-dsv2lite");
    let domains = |d: &[&str]| EsftOptions { domains: d.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let calib = import_esft(&dir, &domains(&["intent", "law", "summary"]))?;
    let heldout = import_esft(&dir, &domains(&["translation"]))?;
    let mut grid = Grid::read(&crate::workspace_root().join("data/grids/esft-translation.json"))?;
    // The whole grid is in the README; the audit replays every policy at two caps, plus a k_used = 4
    // block where cache-aware routing has room (m = k = 6 in these logs).
    let every_policy: Vec<&str> = cachesim::Policy::ALL.map(cachesim::Policy::as_str).to_vec();
    grid.blocks = serde_json::from_value(json!([
        { "policies": every_policy, "cap": [8, 16] },
        { "variants": ["full", "frequency@48"], "policies": ["lru", "inv_router"], "lambda": [0.05, 0.12], "j": [2], "cap": [8], "k_used": [4] }
    ]))?;
    audit_grid("real ESFT DeepSeek-V2-Lite: intent+law+summary -> translation", &grid, &calib.view(), &heldout.view())
}

/// Runs the whole pipeline of a grid on two traces and audits every stage.
pub fn audit_grid(subject: &str, grid: &Grid, calib: &TraceView<'_>, heldout: &TraceView<'_>) -> Result<Report> {
    let ins = TraceInput { view: *calib, source: "in_sample", digest: "" };
    let oos = TraceInput { view: *heldout, source: "out_of_sample", digest: "" };
    let prepared = sweep::prepare(grid, &ins, &oos)?;
    let mut checks = Vec::new();

    // 1. Statistics.
    let stats = &prepared.stats;
    for c in saliency::check_stats(stats) {
        let mut f = BTreeMap::new();
        f.insert("detail".into(), json!(c.detail));
        checks.push(check("1 statistics", &c.name, c.passed, f, (!c.passed).then(|| c.detail.clone())));
    }

    // 2. Keep maps.
    let maps: Vec<KeepMap> = prepared.variants.iter().filter(|v| !v.keep.is_full()).map(|v| v.keep.clone()).collect();
    let keep_cfg = KeepConfig { metric: MetricConfig { tau: grid.tau, ..Default::default() }, ..Default::default() };
    for c in saliency::check_keep_maps(stats, &maps, &keep_cfg) {
        let mut f = BTreeMap::new();
        f.insert("detail".into(), json!(c.detail));
        checks.push(check("2 keep maps", &c.name, c.passed, f, (!c.passed).then(|| c.detail.clone())));
    }

    // 3. Retention of every keep map on the held-out trace, recomputed.
    let held_stats = saliency::Stats::from_trace(heldout, "out_of_sample".into(), String::new());
    let mut ret_rows = Vec::new();
    for m in &maps {
        let r = saliency::retention(m, &held_stats, Some(heldout))?;
        let c = saliency::check_retention(&r, m, &held_stats, Some(heldout));
        let f = &r.mean;
        ret_rows.push(json!({
            "map": m.label(),
            "reap_retention_mean": f.reap_retention.map(round6), "reap_retention_min": r.min.reap_retention.map(round6),
            "gate_retention_mean": f.gate_retention.map(round6),
            "slot_replacement_mean": round6(f.slot_replacement), "slot_replacement_max": round6(r.max_slot_replacement),
            "prob_retention_mean": f.prob_retention.map(round6),
            "kept_with_zero_heldout_hits": f.zero_hit_kept,
        }));
        if !c.passed {
            checks.push(check("3 retention", &c.name, false, BTreeMap::new(), Some(c.detail)));
        }
    }
    let n = ret_rows.len();
    checks.push(check(
        "3 retention",
        "recomputed from the held-out trace within 1e-4",
        true,
        BTreeMap::from([("maps".to_string(), json!(n)), ("retention".to_string(), json!(ret_rows))]),
        None,
    ));

    // 4. Optimized vs reference replayer on a matrix.
    checks.push(differential(heldout, &prepared.variants.iter().map(|v| &v.keep).collect::<Vec<_>>()));

    // 5. Sweep rows.
    let rows = prepared.run(calib, heldout, &|_| {});
    checks.extend(sweep_checks(&prepared.profiles, grid, &rows));

    // 6. Bad configurations refused before any work.
    checks.push(refusals(grid, &ins, &oos));

    Ok(Report { subject: subject.to_string(), checks })
}

fn differential(trace: &TraceView<'_>, maps: &[&KeepMap]) -> Check {
    let shape = trace.shape();
    let k = shape.top_k;
    let mut n = 0usize;
    let mut first = None;
    let has_room = shape.candidates > k - 1;
    for map in maps {
        let keep = Keep::from_layers(&shape, &map.layers).expect("keep maps of this grid fit the trace");
        for policy in Policy::ALL {
            for lambda in [0.0, 0.09] {
                if lambda > 0.0 && (!policy.facts().allows_lambda() || !has_room) {
                    continue;
                }
                for semantics in [Semantics::KWay, Semantics::Sequential] {
                    for (cap, k_used) in [(k, k), (2 * k, k), (k, k - 1)] {
                        let cfg = ReplayConfig {
                            k_used: Some(k_used),
                            lambda,
                            j: 2,
                            semantics,
                            ..ReplayConfig::new(policy, cap)
                        };
                        if cachesim::validate(&shape, trace.parts().scores.is_some(), &cfg).is_err() {
                            continue;
                        }
                        let fast = cachesim::replay(trace, &keep, &cfg).expect("validated");
                        let slow = cachesim::reference::replay(trace, &keep, &cfg).expect("validated");
                        n += 1;
                        if fast != slow && first.is_none() {
                            first = Some(format!(
                                "{}/{policy}/lambda={lambda}/{semantics}/cap={cap}/k_used={k_used}: fast misses {} vs reference {}",
                                map.label(),
                                fast.misses,
                                slow.misses
                            ));
                        }
                    }
                }
            }
        }
    }
    let mut f = BTreeMap::new();
    f.insert("configurations".into(), json!(n));
    check("4 replayer", "optimized equals reference", first.is_none() && n > 0, f, first)
}

/// The checks of SEMANTICS §8.5 on sweep rows computed with `profiles` from `grid` (its warmup W
/// and caps decide how far Belady may exceed an online policy).
pub fn sweep_checks(profiles: &[DeviceProfile], grid: &Grid, rows: &[Row]) -> Vec<Check> {
    let warmup = grid.warmup;
    let mut out = Vec::new();
    // Derived fields follow from the counts, each row kind by its cost model (§6, §10, §11, §12-§13).
    let mut first = None;
    for r in rows {
        if let Some(problem) = derived::row_problem(profiles, r) {
            first.get_or_insert(problem);
        }
    }
    let mut f = BTreeMap::new();
    f.insert("rows".into(), json!(rows.len()));
    out.push(check("5 sweep rows", "derived fields follow from the counts", first.is_none(), f, first));

    // Belady <= every λ = 0 online policy, per (sample, variant, cap, k_used). Exact only when every
    // token counts (W = 0): counted from W > 0 the caches enter the window in different states, and
    // Belady may exceed an online policy by up to the layer's cap (cachesim's `hand.rs` has a case).
    // Beyond that slack, on any layer, it is a failure; above the online policy within it, on any
    // layer, a finding (the figure counts such pairs).
    let mut first_fail = None;
    let mut first_finding = None;
    let (mut pairs, mut above) = (0, 0);
    for b in rows.iter().filter(|r| r.config.policy.facts().offline) {
        let b_cfg = sweep::replay_config(grid, &b.config);
        for r in rows.iter().filter(|r| {
            !r.config.policy.facts().offline
                && r.config.lambda == 0.0
                && r.sample == b.sample
                && r.config.variant == b.config.variant
                && r.config.cap == b.config.cap
                && r.config.layer_caps == b.config.layer_caps
                && r.config.deploy == b.config.deploy
                && r.config.prefetch == b.config.prefetch
                && r.config.k_used == b.config.k_used
        }) {
            pairs += 1;
            // The first layer beyond the slack (a failure), else the first above the online policy.
            let (mut beyond, mut within) = (None, None);
            for (l, (&bl, &rl)) in b.counts.layer_misses.iter().zip(&r.counts.layer_misses).enumerate() {
                let slack = if warmup == 0 { 0 } else { b_cfg.cap_of(l) as u64 };
                if bl > rl + slack {
                    beyond.get_or_insert((l, bl, rl, slack));
                } else if bl > rl {
                    within.get_or_insert((l, bl, rl, slack));
                }
            }
            let text = |(l, bl, rl, slack): (usize, u64, u64, u64)| {
                let why = match (warmup, bl > rl + slack) {
                    (0, _) => "W = 0: every token counts, no slack".to_string(),
                    (_, true) => format!("beyond the slack of warmup {warmup} (the layer's cap, {slack})"),
                    (_, false) => format!("within the slack of warmup {warmup} (the layer's cap, {slack})"),
                };
                format!(
                    "{} ({}) on layer {l}: {bl} misses > {rl} of {}, {why}; in all {} and {}",
                    b.key,
                    b.sample.as_str(),
                    r.key,
                    b.counts.misses,
                    r.counts.misses
                )
            };
            if let Some(x) = beyond {
                first_fail.get_or_insert_with(|| text(x));
            } else if let Some(x) = within {
                above += 1;
                first_finding.get_or_insert_with(|| text(x));
            }
        }
    }
    let mut f = BTreeMap::new();
    f.insert("pairs".into(), json!(pairs));
    f.insert("above_online_within_warmup_slack".into(), json!(above));
    out.push(Check {
        section: "5 sweep rows",
        name: "belady is a lower bound".into(),
        status: match (&first_fail, &first_finding) {
            (Some(_), _) => Status::Fail,
            (None, Some(_)) => Status::Finding,
            (None, None) => Status::Pass,
        },
        figures: f,
        first_offending: first_fail.or(first_finding),
    });

    // Misses non-increasing in λ per (sample, variant, policy, j, cap, k_used): a finding, not a failure.
    let mut groups: BTreeMap<String, Vec<&Row>> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.config.lambda > 0.0) {
        let c = &r.config;
        groups
            .entry(format!(
                "{}/{}/{}/j={}/cap={}{}/k={}{}",
                r.sample.as_str(),
                c.variant,
                c.policy,
                c.j,
                c.cap,
                c.layer_caps.as_ref().map_or_else(String::new, |n| format!(" caps:{}", n.name)),
                c.k_used,
                c.prefetch.map_or_else(String::new, |p| p.suffix())
            ))
            .or_default()
            .push(r);
    }
    let mut violations = Vec::new();
    for (g, mut rs) in groups {
        // λ = 0 rows share the group regardless of j.
        let c0 = &rs[0].config;
        if let Some(zero) = rows.iter().find(|r| {
            r.config.lambda == 0.0
                && r.sample == rs[0].sample
                && r.config.variant == c0.variant
                && r.config.policy == c0.policy
                && r.config.cap == c0.cap
                && r.config.layer_caps == c0.layer_caps
                && r.config.deploy == c0.deploy
                && r.config.prefetch == c0.prefetch
                && r.config.k_used == c0.k_used
        }) {
            rs.push(zero);
        }
        rs.sort_by(|a, b| a.config.lambda.total_cmp(&b.config.lambda));
        for w in rs.windows(2) {
            if w[1].counts.misses > w[0].counts.misses {
                violations.push(format!(
                    "{g}: misses {} at lambda {} > {} at lambda {}",
                    w[1].counts.misses, w[1].config.lambda, w[0].counts.misses, w[0].config.lambda
                ));
            }
        }
    }
    let mut f = BTreeMap::new();
    f.insert("violations".into(), json!(violations.len()));
    out.push(Check {
        section: "5 sweep rows",
        name: "misses non-increasing in lambda".into(),
        status: if violations.is_empty() { Status::Pass } else { Status::Finding },
        figures: f,
        first_offending: violations.first().cloned(),
    });

    // Same configuration keys in and out of sample.
    let keys = |s: Sample| rows.iter().filter(|r| r.sample == s).map(|r| r.key.clone()).collect::<Vec<_>>();
    let (a, b) = (keys(Sample::InSample), keys(Sample::OutOfSample));
    let first = a.iter().zip(&b).find(|(x, y)| x != y).map(|(x, y)| format!("{x} vs {y}"));
    let mut f = BTreeMap::new();
    f.insert("keys".into(), json!(a.len()));
    out.push(check("5 sweep rows", "in- and out-of-sample keys identical", a == b, f, first));

    // Headline figures for the reviewer: per (variant, cap), the best online policy in and out of sample.
    let best: Vec<Value> = sweep::best_per_variant(rows)
        .into_iter()
        .map(|b| {
            json!({"variant": b.variant, "cap": b.cap, "k_used": b.k_used,
                   "best_in_sample": b.in_sample_best, "in_sample_misses_per_token": round6(b.in_sample_misses_per_token),
                   "chosen_out_of_sample": round6(b.chosen_out_of_sample), "shift": round6(b.shift()),
                   "best_out_of_sample": b.out_of_sample_best,
                   "out_of_sample_misses_per_token": round6(b.out_of_sample_misses_per_token)})
        })
        .collect();
    let f = BTreeMap::from([("best".to_string(), json!(best))]);
    out.push(Check {
        section: "5 sweep rows",
        name: "best online policy per variant and cap".into(),
        status: Status::Pass,
        figures: f,
        first_offending: None,
    });
    out
}

fn refusals(grid: &Grid, ins: &TraceInput<'_>, oos: &TraceInput<'_>) -> Check {
    let shape = ins.view.shape();
    let e = shape.num_experts;
    let k = shape.top_k;
    let m = shape.candidates;
    let block = |policy: &str, lambda: f64, cap: usize, k_used: Option<usize>| sweep::Block {
        variants: Some(vec!["full".into()]),
        policies: vec![policy.into()],
        lambda: vec![lambda],
        j: vec![2],
        cap: vec![cap],
        layer_caps: Vec::new(),
        k_used: vec![k_used],
        pin: vec![None],
        tier2: vec![None],
        batch: vec![None],
        prefetch: vec![None],
        shuffle: vec![None],
        exec: vec![cachesim::hybrid::Exec::Transfer],
        overlap: Vec::new(),
    };
    let cases: Vec<(&str, &str, Grid)> = vec![
        ("cap < k_used", "is below k_used", Grid { blocks: vec![block("lru", 0.0, k - 1, None)], ..grid.clone() }),
        (
            "belady with lambda > 0",
            "needs lambda = 0",
            Grid { blocks: vec![block("belady", 0.05, k, None)], ..grid.clone() },
        ),
        (
            "K > E",
            "is larger than the",
            Grid {
                variants: vec!["full".into(), format!("frequency@{}", e + 1)],
                blocks: vec![block("lru", 0.0, k, None)],
                ..grid.clone()
            },
        ),
        (
            "k_used > m",
            "candidates recorded per row",
            Grid { blocks: vec![block("lru", 0.0, m + 1, Some(m + 1))], ..grid.clone() },
        ),
        ("unknown policy", "unknown policy", Grid { blocks: vec![block("lruu", 0.0, k, None)], ..grid.clone() }),
    ];
    let mut f = BTreeMap::new();
    let mut first = None;
    for (name, want, g) in cases {
        match sweep::prepare(&g, ins, oos) {
            Ok(_) => {
                first.get_or_insert_with(|| format!("{name}: accepted"));
                f.insert(name.to_string(), json!("accepted"));
            }
            Err(err) => {
                let msg = err.to_string();
                if !msg.contains(want) {
                    first.get_or_insert_with(|| format!("{name}: refused for another reason: {msg}"));
                }
                f.insert(name.to_string(), json!(format!("refused: {msg}")));
            }
        }
    }
    check("6 bad configuration", "refused before any work", first.is_none(), f, first)
}

/// The report as Markdown: a verdict per section, then each check.
pub fn markdown(r: &Report) -> String {
    let mut s = format!("# Audit: {}\n\n", r.subject);
    let mut sections: Vec<&str> = r.checks.iter().map(|c| c.section).collect();
    sections.dedup();
    for sec in sections {
        let cs: Vec<&Check> = r.checks.iter().filter(|c| c.section == sec).collect();
        let verdict = if cs.iter().any(|c| c.status == Status::Fail) { "FAIL" } else { "PASS" };
        s += &format!("## §8.{sec}: {verdict}\n\n");
        for c in cs {
            let st = match c.status {
                Status::Pass => "pass",
                Status::Fail => "FAIL",
                Status::Finding => "finding",
            };
            s += &format!("- [{st}] {}", c.name);
            if let Some(o) = &c.first_offending {
                s += &format!(": first offending: {o}");
            }
            let figs: Vec<String> =
                c.figures.iter().filter(|(k, _)| k.as_str() != "detail").map(|(k, v)| format!("{k} = {v}")).collect();
            if let Some(Value::String(d)) = c.figures.get("detail") {
                s += &format!(" — {d}");
            }
            if !figs.is_empty() && !c.figures.contains_key("best") && !c.figures.contains_key("retention") {
                s += &format!(" ({})", figs.join(", "));
            }
            s += "\n";
            if let Some(Value::Array(rows)) = c.figures.get("retention") {
                s += "\n  | map | reap retention mean / min | gate retention mean | slot replacement mean / max | prob retention mean | kept, 0 held-out hits |\n  |---|---:|---:|---:|---:|---:|\n";
                for r in rows {
                    s += &format!(
                        "  | {} | {} / {} | {} | {} / {} | {} | {} |\n",
                        r["map"].as_str().unwrap_or_default(),
                        r["reap_retention_mean"],
                        r["reap_retention_min"],
                        r["gate_retention_mean"],
                        r["slot_replacement_mean"],
                        r["slot_replacement_max"],
                        r["prob_retention_mean"],
                        r["kept_with_zero_heldout_hits"]
                    );
                }
            }
            if let Some(Value::Array(best)) = c.figures.get("best") {
                s += "\n  | variant | cap | k_used | best in-sample | misses/token | out of sample | shift | best out-of-sample | misses/token |\n  |---|---:|---:|---|---:|---:|---:|---|---:|\n";
                for b in best {
                    s += &format!(
                        "  | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                        b["variant"].as_str().unwrap_or_default(),
                        b["cap"],
                        b["k_used"],
                        b["best_in_sample"].as_str().unwrap_or_default(),
                        b["in_sample_misses_per_token"],
                        b["chosen_out_of_sample"],
                        b["shift"],
                        b["best_out_of_sample"].as_str().unwrap_or_default(),
                        b["out_of_sample_misses_per_token"]
                    );
                }
            }
        }
        s += "\n";
    }
    s
}

/// Asserts the report against `xtask/src/snapshots/xtask__audit__NAME.snap`.
pub fn assert_snapshot(name: &str, report: &Report) {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_suffix(name);
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| insta::assert_json_snapshot!("audit", report));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cargo test` runs the audit too: every check passes on the embedded default and the report
    /// matches the snapshot.
    #[test]
    fn default_audit_passes_and_matches_snapshot() {
        let r = default_report().unwrap();
        for c in &r.checks {
            assert_ne!(c.status, Status::Fail, "{}: {:?}", c.name, c.first_offending);
        }
        assert_snapshot("default", &r);
    }
}
