//! `cargo xtask audit --dir DIR`: audit any directory of moe-offload outputs.
//!
//! Every `*.json` file below `DIR` is classified by its fields: statistics (`moe-offload stats`),
//! keep maps (`moe-offload keep`), sweep results (`results.json` of `moe-offload sweep`). Then:
//! statistics get check 1; keep maps are reproduced from the statistics file whose hash they record
//! (check 2); sweep rows get the checks of §8.5, with the device profiles from their own provenance.
//! A `*.json` file that is not valid JSON (a truncated `results.json`; REAP aggregate inputs,
//! which hold NaN, are skipped), or that looks like one of these outputs but does not parse or
//! validate, fails a `0 inputs` check naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use saliency::{KeepConfig, KeepMap, Retention, Stats};
use serde_json::{Value, json};
use sweep::SweepOutput;

use super::{Check, Report, Status, check, sweep_checks};

/// One row of `moe-offload retention --json`: the stored figures, the keep map's file and the held-out input.
type RetentionRow = (Retention, String, String);

/// What a JSON file under the audited directory holds.
enum Output {
    Stats(Stats),
    Keep(KeepMap),
    Sweep(Box<SweepOutput>),
    /// `moe-offload retention --json`: rows with the keep map's `file` and the `heldout` input.
    Retention(Vec<RetentionRow>),
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
    if let Some(rows) = v.as_array().filter(|a| a.first().is_some_and(|r| r.get("per_layer").is_some())) {
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

/// Audits every output under `dir`.
///
/// # Errors
/// An unreadable directory. A `*.json` file that is not valid JSON, or that looks like an output
/// of ours but does not parse or validate, is a failed `0 inputs` check naming the file, not an error.
pub fn audit_dir(dir: &Path) -> Result<Report> {
    let mut files = Vec::new();
    json_files(dir, &mut files)?;
    files.sort();
    let rel = |p: &Path| p.strip_prefix(dir).unwrap_or(p).display().to_string();
    let mut stats: Vec<(String, Stats)> = Vec::new();
    let mut maps: Vec<(String, KeepMap)> = Vec::new();
    let mut sweeps: Vec<(String, SweepOutput)> = Vec::new();
    let mut retentions: Vec<(PathBuf, Vec<RetentionRow>)> = Vec::new();
    // Files that should be our outputs but cannot be read as one: (name, error).
    let mut bad: Vec<(String, String)> = Vec::new();
    for f in &files {
        match classify(f, &rel(f)) {
            Ok(Some(Output::Stats(s))) => stats.push((rel(f), s)),
            Ok(Some(Output::Keep(m))) => maps.push((rel(f), m)),
            Ok(Some(Output::Sweep(s))) => sweeps.push((rel(f), *s)),
            Ok(Some(Output::Retention(r))) => retentions.push((f.clone(), r)),
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
    let found = !(stats.is_empty() && maps.is_empty() && sweeps.is_empty() && retentions.is_empty());
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

    for (name, s) in &stats {
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
    let hashes: Vec<(String, &Stats)> = stats.iter().map(|(_, s)| (s.sha256(), s)).collect();
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
            checks.push(check("2 keep maps", &c.name, c.passed, f, (!c.passed).then(|| c.detail.clone())));
        }
    }

    for (file, rows) in &retentions {
        for (stored, map_file, heldout) in rows {
            checks.push(retention_check(dir, file, stored, map_file, heldout));
        }
    }

    for (name, out) in &sweeps {
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
mod tests {
    use super::*;
    use saliency::{Metric, Stats};
    use sweep::{InputRef, Provenance, TraceInput};
    use trace_io::TraceFile;

    /// Writes statistics, two nested keep maps and a sweep of the default grid into a directory.
    fn outputs() -> tempfile::TempDir {
        let root = crate::workspace_root();
        let grid = sweep::Grid::read(&root.join("data/grids/default.json")).unwrap();
        let calib = TraceFile::open(&grid.traces.in_sample).unwrap();
        let heldout = TraceFile::open(&grid.traces.out_of_sample).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stats = Stats::from_trace(&calib.view(), "calib".into(), "0".into());
        stats.write_json(dir.path().join("stats.json")).unwrap();
        let held_stats = Stats::from_trace(&heldout.view(), "heldout".into(), "0".into());
        held_stats.write_json(dir.path().join("heldout-stats.json")).unwrap();
        let mut rows = Vec::new();
        for k in [16, 24] {
            let m = KeepMap::build(&stats, Metric::Frequency, k, &KeepConfig::default()).unwrap();
            m.write_json(dir.path().join(format!("frequency@{k}.json"))).unwrap();
            let r = saliency::retention(&m, &held_stats, None).unwrap();
            let mut v = serde_json::to_value(&r).unwrap();
            v["file"] = json!(format!("frequency@{k}.json"));
            v["heldout"] = json!("heldout-stats.json");
            rows.push(v);
        }
        std::fs::write(dir.path().join("retention.json"), serde_json::to_vec_pretty(&rows).unwrap()).unwrap();
        let (ins, oos) = (
            TraceInput { view: calib.view(), source: "calib", sha256: "0" },
            TraceInput { view: heldout.view(), source: "heldout", sha256: "0" },
        );
        let p = sweep::prepare(&grid, &ins, &oos).unwrap();
        let out = SweepOutput {
            provenance: Provenance {
                tool_version: "test".into(),
                grid: grid.clone(),
                in_sample: InputRef { source: "calib".into(), sha256: "0".into() },
                out_of_sample: InputRef { source: "heldout".into(), sha256: "0".into() },
                stats_sha256: p.stats.sha256(),
                files: Vec::new(),
            },
            shard: None,
            rows: p.run(&calib.view(), &heldout.view(), &|_| {}),
        };
        out.write(&dir.path().join("sweep")).unwrap();
        dir
    }

    fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    }

    #[test]
    fn clean_outputs_pass() {
        let dir = outputs();
        let r = audit_dir(dir.path()).unwrap();
        assert!(passed(&r), "{:?}", first_failure(&r));
        assert_eq!(r.checks[0].figures["keep_maps"], json!(2));
        assert_eq!(r.checks[0].figures["sweeps"], json!(1));
        assert_eq!(r.checks[0].figures["retention_files"], json!(1));
        assert_eq!(r.checks.iter().filter(|c| c.section == "3 retention" && c.status == Status::Pass).count(), 2);
        assert!(r.checks.iter().any(|c| c.name == "nesting: frequency" && c.status == Status::Pass));
    }

    /// The failing `0 inputs` check of `name`, with its first offending item.
    fn unreadable<'r>(r: &'r Report, name: &str) -> &'r str {
        let c = r.checks.iter().find(|c| c.name == format!("{name}: readable")).expect("a check for the file");
        assert_eq!((c.section, c.status), ("0 inputs", Status::Fail));
        c.first_offending.as_deref().unwrap()
    }

    #[test]
    fn a_truncated_results_json_fails_naming_the_file() {
        let dir = outputs();
        let path = dir.path().join("sweep/results.json");
        let text = std::fs::read(&path).unwrap();
        std::fs::write(&path, &text[..300]).unwrap();
        let r = audit_dir(dir.path()).unwrap();
        assert!(!passed(&r));
        let e = unreadable(&r, "sweep/results.json");
        assert!(e.starts_with("sweep/results.json: not valid JSON") && e.contains("EOF while parsing"), "{e}");
        // The other outputs are still audited; the sweep is not counted.
        assert_eq!(r.checks[0].figures["sweeps"], json!(0));
        assert_eq!(r.checks[0].figures["keep_maps"], json!(2));
        assert!(r.checks.iter().any(|c| c.name == "nesting: frequency" && c.status == Status::Pass));
    }

    #[test]
    fn a_reap_aggregate_beside_the_outputs_is_skipped() {
        let dir = outputs();
        let before = audit_dir(dir.path()).unwrap();
        // Not strict JSON (NaN), and not one of our outputs: an input, skipped as before.
        std::fs::write(
            dir.path().join("core_agg.json"),
            r#"{"a": {"n": 1, "tok": 2, "freq": {"0": [1, 3]}, "reap": {"0": [NaN, 2.0]}}}"#,
        )
        .unwrap();
        let after = audit_dir(dir.path()).unwrap();
        assert!(passed(&after));
        assert_eq!(after.checks.len(), before.checks.len());
        // The same bytes cut short are neither: a failed check.
        std::fs::write(dir.path().join("core_agg.json"), r#"{"a": {"n": 1, "tok": 2, "freq": {"0": [1, 3]}, "re"#)
            .unwrap();
        assert!(unreadable(&audit_dir(dir.path()).unwrap(), "core_agg.json").contains("not valid JSON"));
    }

    #[test]
    fn a_keep_map_with_a_duplicated_id_fails_naming_the_file() {
        let dir = outputs();
        edit_json(&dir.path().join("frequency@24.json"), |v| {
            let layer1 = v["layers"][1].as_array_mut().unwrap();
            layer1[1] = layer1[0].clone();
        });
        let r = audit_dir(dir.path()).unwrap();
        assert!(!passed(&r));
        let e = unreadable(&r, "frequency@24.json");
        assert!(e.starts_with("frequency@24.json looks like a keep map but does not parse: "), "{e}");
        assert!(e.contains("is listed twice"), "{e}");
        assert_eq!(r.checks[0].figures["keep_maps"], json!(1));
    }

    /// A sweep whose recorded grid no longer validates (two profiles of one name) is a failed
    /// check naming the file, not an abort.
    #[test]
    fn a_sweep_with_invalid_recorded_profiles_fails_naming_the_file() {
        let dir = outputs();
        edit_json(&dir.path().join("sweep/results.json"), |v| {
            let p = v["provenance"]["grid"]["profiles"].as_array_mut().unwrap();
            p.push(p[0].clone());
        });
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert_eq!((c.section, c.name.as_str()), ("5 sweep rows", "sweep/results.json: device profiles"));
        let e = c.first_offending.as_deref().unwrap();
        assert!(e.starts_with("sweep/results.json: the grid in its provenance: grid: profiles[2]: reference"), "{e}");
    }

    #[test]
    fn a_changed_keep_map_id_is_named() {
        let dir = outputs();
        let path = dir.path().join("frequency@16.json");
        edit_json(&path, |v| {
            let layer0 = v["layers"][0].as_array_mut().unwrap();
            let kept: Vec<u64> = layer0.iter().map(|x| x.as_u64().unwrap()).collect();
            let unused = (0..32).find(|e| !kept.contains(e)).unwrap();
            layer0[0] = json!(unused);
            layer0.sort_by_key(|x| x.as_u64());
        });
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert_eq!(c.name, "frequency@16: reproduces");
        assert!(c.first_offending.as_deref().unwrap().contains("layer"), "{:?}", c.first_offending);
    }

    #[test]
    fn a_changed_sweep_count_or_tok_s_is_named() {
        let dir = outputs();
        let path = dir.path().join("sweep/results.json");
        let key = |v: &Value, i: usize| v["rows"][i]["key"].as_str().unwrap().to_string();
        let mut k0 = String::new();
        edit_json(&path, |v| {
            k0 = key(v, 0);
            let m = v["rows"][0]["counts"]["misses"].as_u64().unwrap();
            v["rows"][0]["counts"]["misses"] = json!(m + 1);
        });
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert_eq!(c.name, "sweep/results.json: derived fields follow from the counts");
        assert_eq!(c.first_offending.as_deref(), Some(format!("{k0} (in_sample)").as_str()));

        let dir = outputs();
        let path = dir.path().join("sweep/results.json");
        let mut k5 = String::new();
        edit_json(&path, |v| {
            k5 = key(v, 5);
            let t = v["rows"][5]["cost"][1]["tok_s"].as_f64().unwrap();
            v["rows"][5]["cost"][1]["tok_s"] = json!(t * 1.001);
        });
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert_eq!(c.name, "sweep/results.json: derived fields follow from the counts");
        assert!(c.first_offending.as_deref().unwrap().starts_with(&k5), "{:?}", c.first_offending);
    }

    #[test]
    fn a_changed_retention_value_is_named() {
        let dir = outputs();
        let path = dir.path().join("retention.json");
        edit_json(&path, |v| {
            let x = v[1]["per_layer"][2]["figures"]["slot_replacement"].as_f64().unwrap();
            v[1]["per_layer"][2]["figures"]["slot_replacement"] = json!(x + 0.001);
        });
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert_eq!(c.name, "retention.json: frequency@24 on heldout-stats.json");
        let detail = c.first_offending.as_deref().unwrap();
        assert!(detail.contains("slot_replacement") && detail.contains("layer"), "{detail}");
    }

    #[test]
    fn a_keep_map_without_its_statistics_fails() {
        let dir = outputs();
        std::fs::remove_file(dir.path().join("stats.json")).unwrap();
        let r = audit_dir(dir.path()).unwrap();
        let c = first_failure(&r).expect("the audit fails");
        assert!(c.first_offending.as_deref().unwrap().contains("cannot be reproduced"), "{:?}", c.first_offending);
    }

    /// Belady above an online policy: within the cap per layer after a warmup it is a finding (the
    /// caches enter the window in different states); beyond it, or with W = 0, a failure. With
    /// per-layer caps the slack is the layer's own cap.
    #[test]
    fn belady_above_online_is_a_finding_within_the_warmup_slack_and_a_failure_beyond() {
        let dir = outputs();
        let text = std::fs::read_to_string(dir.path().join("sweep/results.json")).unwrap();
        let out: SweepOutput = serde_json::from_str(&text).unwrap();
        let profiles = out.provenance.grid.device_profiles().unwrap();
        let status = |rows: &[sweep::Row], warmup| {
            let grid = sweep::Grid { warmup, ..out.provenance.grid.clone() };
            let checks = sweep_checks(&profiles, &grid, rows);
            let c = checks.into_iter().find(|c| c.name == "belady is a lower bound").unwrap();
            (
                c.status,
                c.figures["above_online_within_warmup_slack"].as_u64().unwrap(),
                c.first_offending.unwrap_or_default(),
            )
        };
        assert_eq!(status(&out.rows, 64).0, Status::Pass);
        // Raise layer 0 of full/belady at cap 8 (in sample) to `extra` above the online policy with
        // the fewest misses on that layer (λ = 0, same variant, cap and k_used).
        let b = out.rows.iter().position(|r| r.key == "full/belady/0/0/8/4").unwrap();
        let online = (0..out.rows.len())
            .filter(|&i| {
                let r = &out.rows[i];
                r.key.starts_with("full/") && r.key.ends_with("/0/0/8/4") && r.sample == out.rows[b].sample && i != b
            })
            .min_by_key(|&i| out.rows[i].counts.layer_misses[0])
            .unwrap();
        let raised = |rows: &[sweep::Row], extra: u64| {
            let mut rows = rows.to_vec();
            let target = rows[online].counts.layer_misses[0] + extra;
            let c = &mut rows[b].counts;
            c.misses = c.misses + target - c.layer_misses[0];
            c.layer_misses[0] = target;
            rows
        };
        let (st, above, first) = status(&raised(&out.rows, 1), 64);
        assert!(st == Status::Finding && above >= 1, "{st:?} {above} {first}");
        assert!(
            first.contains(" on layer 0: ") && first.contains("within the slack of warmup 64 (the layer's cap, 8)"),
            "{first}"
        );
        let (st, _, first) = status(&raised(&out.rows, 1), 0);
        assert_eq!(st, Status::Fail, "{first}");
        assert!(first.contains("W = 0: every token counts, no slack"), "{first}");
        let (st, _, first) = status(&raised(&out.rows, 9), 64);
        assert_eq!(st, Status::Fail, "{first}");
        assert!(first.contains("beyond the slack of warmup 64 (the layer's cap, 8)"), "{first}");
        // Per-layer caps (layer 0 at 2): 3 above is beyond that layer's slack though within 8.
        let mut rows = out.rows.clone();
        let caps = sweep::NamedCaps { name: "plan".into(), caps: vec![2, 8, 8, 8] };
        for i in [b, online] {
            rows[i].config.layer_caps = Some(caps.clone());
        }
        let (st, _, first) = status(&raised(&rows, 3), 64);
        assert_eq!(st, Status::Fail, "{first}");
        assert!(first.contains("beyond the slack of warmup 64 (the layer's cap, 2)"), "{first}");
        assert_eq!(status(&raised(&rows, 2), 64).0, Status::Finding);
    }
}
