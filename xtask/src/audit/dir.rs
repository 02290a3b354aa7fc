//! `cargo xtask audit --dir DIR`: audit any directory of moe-offload outputs, re-deriving every
//! figure from the inputs they name, so that a consistent lie cannot pass.
//!
//! Every `*.json` file below `DIR` is classified by its fields: statistics (`moe-offload stats`),
//! keep maps (`moe-offload keep`), retention tables (`retention --json`), sweep results
//! (`results.json` of `moe-offload sweep`), plans (`moe-offload plan`). Then: statistics get check 1 and are recomputed from
//! the trace they name (found and hash-verified by `locate`); keep maps are reproduced from the
//! statistics file whose hash they record (check 2); retention rows are recomputed from the
//! held-out input (check 3); sweep rows are replayed again from the traces their provenance names
//! by the plain reference replayer (all rows, or `--sample N --seed S`), every count compared
//! exactly, `results.csv` and `summary.md` are compared with `results.json`, and the rows get the
//! checks of §8.5 with the device profiles from their own provenance. Without the traces the audit
//! says so and fails, unless `--no-replay` is given, which the report then states. A plan's chosen
//! configuration is replayed on both its traces and its keep map rebuilt (`plan`).
//! A `*.json` file that is not valid JSON (a truncated `results.json`; REAP aggregate inputs,
//! which hold NaN, are skipped), or that looks like one of these outputs but does not parse or
//! validate, fails a `0 inputs` check naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use saliency::{KeepConfig, KeepMap, Retention, Stats};
use serde_json::{Value, json};
use sweep::SweepOutput;

use super::locate::Finder;
use super::plan::{self, PlanFile};
use super::{Check, Report, Status, check, crossfile, recompute, rederive, sweep_checks};

/// One row of `moe-offload retention --json`: the stored figures, the keep map's file and the held-out input.
type RetentionRow = (Retention, String, String);

/// What a JSON file under the audited directory holds.
enum Output {
    Stats(Stats),
    Keep(KeepMap),
    Sweep(Box<SweepOutput>),
    /// `moe-offload retention --json`: rows with the keep map's `file` and the `heldout` input.
    Retention(Vec<RetentionRow>),
    /// `moe-offload plan -o plan.json`.
    Plan(Box<PlanFile>),
}

/// Reads one `*.json` file under the audited directory as one of our outputs: `Ok(None)` for valid
/// JSON of another kind. A file that is not valid JSON (a truncated `results.json`, say), or that
/// looks like one of our outputs by its fields but does not parse or validate, is an error naming
/// `name` (the file's path below the audited directory), which the audit reports as a failed check.
fn classify(path: &Path, name: &str) -> Result<Option<Output>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{name}: cannot read"))?;
    let v = match serde_json::from_str::<Value>(&text) {
        Ok(v) => v,
        // A REAP aggregate (an input such as core_agg.json, whose NaN values strict JSON lacks).
        Err(_) if Stats::reap_agg_summary(path).is_ok() => return Ok(None),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("{name}: not valid JSON (truncated or corrupt?), so it cannot be audited"));
        }
    };
    let parse = |what: &str| format!("{name} looks like {what} but does not parse");
    // `retention --json`: tagged with its rows under `maps`, or a bare array of rows (older files).
    let retention = match v.get("kind").and_then(Value::as_str) {
        Some("moe-offload-retention") => v.get("maps").and_then(Value::as_array),
        _ => v.as_array(),
    };
    if let Some(rows) = retention.filter(|a| a.first().is_some_and(|r| r.get("per_layer").is_some())) {
        let rows = rows
            .iter()
            .map(|r| {
                let text = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
                Ok((
                    serde_json::from_value(r.clone()).with_context(|| parse("retention"))?,
                    text("file"),
                    text("heldout"),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        return Ok(Some(Output::Retention(rows)));
    }
    if plan::looks_like_plan(&v) {
        return Ok(Some(Output::Plan(Box::new(serde_json::from_value(v).with_context(|| parse("a plan"))?))));
    }
    if v.get("provenance").is_some() && v.get("rows").is_some() {
        return Ok(Some(Output::Sweep(Box::new(serde_json::from_value(v).with_context(|| parse("sweep results"))?))));
    }
    if v.get("metric").is_some() && v.get("layers").is_some() && v.get("k").is_some() {
        return Ok(Some(Output::Keep(KeepMap::read_json(path).with_context(|| parse("a keep map"))?)));
    }
    if v.get("meta").is_some() && v.get("layers").is_some() {
        return Ok(Some(Output::Stats(Stats::read_json(path).with_context(|| parse("statistics"))?)));
    }
    Ok(None)
}

fn json_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading directory {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            json_files(&p, out)?;
        } else if p.extension().is_some_and(|x| x == "json") {
            out.push(p);
        }
    }
    Ok(())
}

/// How `audit --dir` finds and replays the inputs of the outputs it audits.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// `--trace-dir`: looked in first for every input, by file name.
    pub trace_dir: Option<PathBuf>,
    /// `--sample N`: replay N rows of each sweep (chosen with `seed`) instead of all.
    pub sample: Option<usize>,
    /// `--seed S` of the sample.
    pub seed: u64,
    /// `--no-replay`: do not look for the traces; the report states that nothing was replayed.
    pub no_replay: bool,
}

/// Audits every output under `dir`.
///
/// # Errors
/// An unreadable directory. A `*.json` file that is not valid JSON, or that looks like an output
/// of ours but does not parse or validate, is a failed `0 inputs` check naming the file, not an error;
/// so is every input that cannot be found or does not match its recorded hash.
pub fn audit_dir(dir: &Path, opts: &Options) -> Result<Report> {
    let finder = Finder::new(dir, opts.trace_dir.as_deref());
    let mut files = Vec::new();
    json_files(dir, &mut files)?;
    files.sort();
    let rel = |p: &Path| p.strip_prefix(dir).unwrap_or(p).display().to_string();
    let mut stats: Vec<(String, PathBuf, Stats)> = Vec::new();
    let mut maps: Vec<(String, KeepMap)> = Vec::new();
    let mut sweeps: Vec<(String, PathBuf, SweepOutput)> = Vec::new();
    let mut retentions: Vec<(PathBuf, Vec<RetentionRow>)> = Vec::new();
    let mut plans: Vec<(String, PathBuf, PlanFile)> = Vec::new();
    // Files that should be our outputs but cannot be read as one: (name, error).
    let mut bad: Vec<(String, String)> = Vec::new();
    for f in &files {
        match classify(f, &rel(f)) {
            Ok(Some(Output::Stats(s))) => stats.push((rel(f), f.clone(), s)),
            Ok(Some(Output::Keep(m))) => maps.push((rel(f), m)),
            Ok(Some(Output::Sweep(s))) => sweeps.push((rel(f), f.clone(), *s)),
            Ok(Some(Output::Retention(r))) => retentions.push((f.clone(), r)),
            Ok(Some(Output::Plan(p))) => plans.push((rel(f), f.clone(), *p)),
            Ok(None) => {}
            Err(e) => bad.push((rel(f), format!("{e:#}"))),
        }
    }
    let mut checks = Vec::new();
    let mut f = BTreeMap::new();
    f.insert("statistics".into(), json!(stats.len()));
    f.insert("keep_maps".into(), json!(maps.len()));
    f.insert("sweeps".into(), json!(sweeps.len()));
    f.insert("retention_files".into(), json!(retentions.len()));
    f.insert("plans".into(), json!(plans.len()));
    let found =
        !(stats.is_empty() && maps.is_empty() && sweeps.is_empty() && retentions.is_empty() && plans.is_empty());
    checks.push(check(
        "0 inputs",
        "outputs found",
        found,
        f,
        (!found).then(|| format!("no outputs under {}", dir.display())),
    ));
    for (name, error) in &bad {
        checks.push(check(
            "0 inputs",
            &format!("{name}: readable"),
            false,
            BTreeMap::from([("error".to_string(), json!(error))]),
            Some(error.clone()),
        ));
    }

    for (name, path, s) in &stats {
        checks.push(recompute::stats_from_trace(name, path, s, &finder, opts));
        for c in saliency::check_stats(s) {
            let mut f = BTreeMap::new();
            f.insert("detail".into(), json!(c.detail));
            checks.push(check(
                "1 statistics",
                &format!("{name}: {}", c.name),
                c.passed,
                f,
                (!c.passed).then(|| c.detail.clone()),
            ));
        }
    }

    // Keep maps grouped by the statistics they came from.
    let mut by_stats: BTreeMap<&str, Vec<&(String, KeepMap)>> = BTreeMap::new();
    for m in &maps {
        if !m.1.is_full() {
            by_stats.entry(m.1.stats_sha256.as_str()).or_default().push(m);
        }
    }
    let hashes: Vec<(String, &Stats)> = stats.iter().map(|(_, _, s)| (s.sha256(), s)).collect();
    for (hash, group) in by_stats {
        let names: Vec<&str> = group.iter().map(|(n, _)| n.as_str()).collect();
        let Some((_, s)) = hashes.iter().find(|(h, _)| h == hash) else {
            checks.push(check(
                "2 keep maps",
                &format!("statistics {hash:.12} present"),
                false,
                BTreeMap::from([("maps".to_string(), json!(names))]),
                Some(format!(
                    "{}: its statistics (sha256 {hash}) are not in the directory, so it cannot be reproduced",
                    names[0]
                )),
            ));
            continue;
        };
        let ms: Vec<KeepMap> = group.iter().map(|(_, m)| m.clone()).collect();
        for c in saliency::check_keep_maps(s, &ms, &KeepConfig::default()) {
            let mut f = BTreeMap::new();
            f.insert("detail".into(), json!(c.detail));
            // A check of one map names its file first.
            let file = group.iter().find(|(_, m)| c.name.starts_with(&format!("{}: ", m.label())));
            let first = (!c.passed).then(|| match file {
                Some((n, _)) => format!("{n}: {}", c.detail),
                None => c.detail.clone(),
            });
            checks.push(check("2 keep maps", &c.name, c.passed, f, first));
        }
    }

    for (file, rows) in &retentions {
        for (stored, map_file, heldout) in rows {
            checks.push(retention_check(dir, file, stored, map_file, heldout));
        }
    }

    for (name, path, out) in &sweeps {
        checks.extend(rederive::sweep_rederive(name, path, out, &finder, opts));
        checks.push(crossfile::agree(name, path, out));
        let profiles = match out.provenance.grid.device_profiles() {
            Ok(p) => p,
            Err(e) => {
                let msg = format!("{name}: the grid in its provenance: {e}");
                checks.push(check(
                    "5 sweep rows",
                    &format!("{name}: device profiles"),
                    false,
                    BTreeMap::new(),
                    Some(msg),
                ));
                continue;
            }
        };
        for mut c in sweep_checks(&profiles, &out.provenance.grid, &out.rows) {
            c.name = format!("{name}: {}", c.name);
            checks.push(c);
        }
    }
    for (name, path, p) in &plans {
        checks.push(plan::plan_checks(name, path, p, &finder, opts));
    }
    Ok(Report { subject: format!("directory {}", dir.display()), checks })
}

/// Recomputes one stored retention row (§8.3). Paths in the row are tried as written, then
/// relative to the retention file's directory and to the audited directory.
fn retention_check(dir: &Path, file: &Path, stored: &Retention, map_file: &str, heldout: &str) -> Check {
    let name = format!("{}: {} on {heldout}", file.strip_prefix(dir).unwrap_or(file).display(), stored.label);
    let find = |p: &str| -> Option<PathBuf> {
        let p = Path::new(p);
        [p.to_path_buf(), file.parent().unwrap_or(dir).join(p), dir.join(p)].into_iter().find(|c| c.is_file())
    };
    let recompute = || -> Result<saliency::KeepCheck> {
        let map = if map_file == "full" {
            None
        } else {
            Some(KeepMap::read_json(find(map_file).with_context(|| format!("keep map {map_file} not found"))?)?)
        };
        let held = find(heldout).with_context(|| format!("held-out input {heldout} not found"))?;
        let (stats, trace_file) = if held.extension().is_some_and(|e| e == "safetensors") {
            let f = trace_io::TraceFile::open(&held)?;
            (Stats::from_trace(&f.view(), String::new(), String::new()), Some(f))
        } else {
            (Stats::read_json(&held)?, None)
        };
        let map = map.unwrap_or_else(|| KeepMap::full(stats.meta.num_experts, stats.meta.layer_ids.clone()));
        let view = trace_file.as_ref().map(|f| f.view());
        Ok(saliency::check_retention(stored, &map, &stats, view.as_ref()))
    };
    match recompute() {
        Ok(c) => check(
            "3 retention",
            &name,
            c.passed,
            BTreeMap::from([("detail".to_string(), json!(c.detail))]),
            (!c.passed).then_some(c.detail),
        ),
        Err(e) => check("3 retention", &name, false, BTreeMap::new(), Some(format!("cannot recompute: {e:#}"))),
    }
}

/// True when no check failed.
pub fn passed(r: &Report) -> bool {
    r.checks.iter().all(|c| c.status != Status::Fail)
}

/// The first failing check.
#[cfg(test)]
pub fn first_failure(r: &Report) -> Option<&Check> {
    r.checks.iter().find(|c| c.status == Status::Fail)
}

#[cfg(test)]
#[path = "dir_tests.rs"]
mod tests;
