//! Re-deriving a sweep's rows from its inputs (`audit --dir`): the traces its provenance names,
//! verified against their recorded hashes; the in-sample statistics recomputed and compared with
//! the recorded hash; every row of the grid present once; and the rows (all, or a seeded sample)
//! replayed again by the plain reference replayer (`cachesim::reference::replay`), every count
//! compared exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Result;
use cachesim::{Keep, ReplayCounts};
use rand::SeedableRng;
use rayon::prelude::*;
use serde_json::{Value, json};
use sweep::{Sample, SweepOutput, TraceInput};
use trace_io::TraceFile;

use super::derived::close;
use super::dir::Options;
use super::locate::{Finder, Located, RecordedHash};
use super::{Check, Status, check};

const SECTION: &str = "5 sweep rows";

/// A check of this section that states a fact without failing (the `--no-replay` note).
fn finding(name: String, first: String) -> Check {
    Check { section: SECTION, name, status: Status::Finding, figures: BTreeMap::new(), first_offending: Some(first) }
}

fn fail(name: String, first: String) -> Check {
    check(SECTION, &name, false, BTreeMap::new(), Some(first))
}

/// Why an input could not be used, as the first offending item of a failed check (or, with
/// `--no-replay`, of a finding). `what` names the input (`provenance.in_sample`), `recorded` its path.
pub(super) fn missing_text(name: &str, what: &str, recorded: &str, looked: &[PathBuf], finder: &Finder) -> String {
    let looked: Vec<String> = looked.iter().map(|p| finder.show(p)).collect();
    format!("{name}: {what} {recorded} not found (looked for {})", looked.join(", "))
}

/// The re-derivation checks of one sweep output at `path` (its `results.json`), `name` as the
/// report shows it.
pub(super) fn sweep_rederive(
    name: &str,
    path: &Path,
    out: &SweepOutput,
    finder: &Finder,
    opts: &Options,
) -> Vec<Check> {
    if opts.no_replay {
        return vec![finding(
            format!("{name}: rows replayed"),
            format!("{name}: not replayed (--no-replay): its rows are checked for self-consistency only"),
        )];
    }
    let prov = &out.provenance;
    let grid_dir = prov.grid_dir.as_deref().map(Path::new);
    let mut found = Vec::new();
    let mut problems = Vec::new();
    for (which, input) in [("in_sample", &prov.in_sample), ("out_of_sample", &prov.out_of_sample)] {
        let recorded = input.digest.to_string();
        let hash = RecordedHash::parse(&recorded);
        match finder.locate_from(&input.source, path, Some(hash), grid_dir) {
            Located::Found(p) => found.push(p),
            Located::Mismatch { path: p, actual } => problems.push(format!(
                "{name}: provenance.{which}.digest is {}, but {} has {} {}: not the trace this sweep ran on",
                input.digest,
                finder.show(&p),
                hash.algorithm(),
                actual
            )),
            Located::Missing(looked) => problems.push(format!(
                "{}; give --trace-dir DIR, or --no-replay to check the rows without replaying them",
                missing_text(name, &format!("provenance.{which} trace"), &input.source, &looked, finder)
            )),
            Located::Unreadable(e) => problems.push(format!("{name}: provenance.{which}: {e}")),
        }
    }
    let inputs = format!("{name}: traces found and verified against their recorded hashes");
    if let Some(first) = problems.into_iter().next() {
        return vec![fail(inputs, first)];
    }
    let mut f = BTreeMap::new();
    f.insert("in_sample".into(), json!(finder.show(&found[0])));
    f.insert("out_of_sample".into(), json!(finder.show(&found[1])));
    let mut checks = vec![check(SECTION, &inputs, true, f, None)];
    match replay_rows(name, path, out, &found, finder, opts) {
        Ok(mut more) => checks.append(&mut more),
        Err(e) => checks.push(fail(format!("{name}: rows replayed"), format!("{name}: {e:#}"))),
    }
    checks
}

/// Statistics, row presence and the replay itself, once both traces are verified.
fn replay_rows(
    name: &str,
    path: &Path,
    out: &SweepOutput,
    traces: &[PathBuf],
    finder: &Finder,
    opts: &Options,
) -> Result<Vec<Check>> {
    let prov = &out.provenance;
    let grid_dir = prov.grid_dir.as_deref().map(Path::new);
    let calib = TraceFile::open(&traces[0])?;
    let held = TraceFile::open(&traces[1])?;
    // The grid as run: its recorded paths found again (keep-map files, per-layer caps files).
    let mut grid = prov.grid.clone();
    grid.traces.in_sample = traces[0].clone();
    grid.traces.out_of_sample = traces[1].clone();
    // Each verified against its hash in `provenance.files` when the output records one.
    let locate_plain = |what: &str, rec: &str| -> std::result::Result<PathBuf, String> {
        let recorded = prov.files.iter().enumerate().find(|(_, f)| f.source == rec);
        let digest = recorded.map(|(_, f)| f.digest.to_string());
        let hash = digest.as_deref().map(RecordedHash::parse);
        match finder.locate_from(rec, path, hash, grid_dir) {
            Located::Found(p) => Ok(p),
            Located::Mismatch { path: p, actual } => {
                let (i, sha) = recorded.map_or((0, String::new()), |(i, f)| (i, f.digest.to_string()));
                Err(format!(
                    "{name}: provenance.files[{i}].digest ({rec}) is {sha}, but {} has {actual}: not the {what} this sweep read",
                    finder.show(&p)
                ))
            }
            Located::Missing(looked) => Err(missing_text(name, what, rec, &looked, finder)),
            Located::Unreadable(e) => Err(e),
        }
    };
    let mut checks = Vec::new();
    for v in &mut grid.variants {
        if let Some(rec) = v.strip_prefix("file:").map(str::to_string) {
            match locate_plain("keep map of variant", &rec) {
                Ok(p) => *v = format!("file:{}", p.display()),
                Err(e) => return Ok(vec![fail(format!("{name}: rows replayed"), e)]),
            }
        }
    }
    for b in &mut grid.blocks {
        for caps in &mut b.layer_caps {
            match locate_plain("layer_caps file", &caps.display().to_string()) {
                Ok(p) => *caps = p,
                Err(e) => return Ok(vec![fail(format!("{name}: rows replayed"), e)]),
            }
        }
        // Pin maps and the co-activation calibration trace, recorded relative to the grid's
        // directory as the keep maps are: found again, not read from the working directory.
        for pin in b.pin.iter_mut().flatten() {
            match locate_plain("pin map", &pin.display().to_string()) {
                Ok(p) => *pin = p,
                Err(e) => return Ok(vec![fail(format!("{name}: rows replayed"), e)]),
            }
        }
    }
    if let Some(calib) = &mut grid.coact_calibration {
        match locate_plain("coact_calibration trace", &calib.display().to_string()) {
            Ok(p) => *calib = p,
            Err(e) => return Ok(vec![fail(format!("{name}: rows replayed"), e)]),
        }
    }
    // The digests as the sweep was given them (the in-sample one goes into the statistics).
    let (ins_digest, oos_digest) =
        (recorded_digest(&prov.in_sample.digest), recorded_digest(&prov.out_of_sample.digest));
    let ins = TraceInput { view: calib.view(), source: &prov.in_sample.source, digest: &ins_digest };
    let oos = TraceInput { view: held.view(), source: &prov.out_of_sample.source, digest: &oos_digest };
    let mut prepared = sweep::prepare(&grid, &ins, &oos)
        .map_err(|e| anyhow::anyhow!("the grid in its provenance does not prepare on its traces: {e}"))?;
    if let Some(shard) = out.shard {
        prepared.shard(shard)?;
    }

    // The in-sample statistics, recomputed: their hash is what provenance records.
    let stats_hash = prepared.stats.sha256();
    let ok = stats_hash == prov.stats_sha256;
    checks.push(check(
        SECTION,
        &format!("{name}: in-sample statistics recomputed from the trace"),
        ok,
        BTreeMap::from([("sha256".to_string(), json!(stats_hash))]),
        (!ok).then(|| {
            format!(
                "{name}: provenance.stats_sha256 is {}, the statistics recomputed from {} have {stats_hash}",
                prov.stats_sha256,
                finder.show(&traces[0])
            )
        }),
    ));

    // The keep maps rebuilt (or read from their files) are the ones the rows were replayed with.
    checks.push(keep_maps_as_recorded(name, out, &prepared));

    // Every row of the grid (or of its shard) present once, with the configuration its key names.
    let mut index: BTreeMap<(String, Sample), usize> = BTreeMap::new();
    let mut first = None;
    for (i, r) in out.rows.iter().enumerate() {
        if r.key != r.config.to_string() {
            first.get_or_insert_with(|| {
                format!("{name}: rows[{i}] has key {} but its configuration is {}", r.key, r.config)
            });
        }
        if index.insert((r.key.clone(), r.sample), i).is_some() {
            first.get_or_insert_with(|| format!("{name}: row {} ({}) appears twice", r.key, r.sample.as_str()));
        }
    }
    let expected: Vec<(&sweep::ConfigKey, Sample)> =
        prepared.configs.iter().flat_map(|c| [(c, Sample::InSample), (c, Sample::OutOfSample)]).collect();
    let mut present: Vec<(usize, &sweep::ConfigKey)> = Vec::new();
    for &(c, s) in &expected {
        match index.remove(&(c.to_string(), s)) {
            Some(i) => present.push((i, c)),
            None => {
                first.get_or_insert_with(|| {
                    format!(
                        "{name}: row {c} ({}) is missing: the grid in its provenance gives {} rows, results.json has {}",
                        s.as_str(),
                        expected.len(),
                        out.rows.len()
                    )
                });
            }
        }
    }
    if let Some(((key, s), _)) = index.iter().next() {
        first.get_or_insert_with(|| {
            format!("{name}: row {key} ({}) is not a configuration of the grid in its provenance", s.as_str())
        });
    }
    let mut f = BTreeMap::new();
    f.insert("expected".into(), json!(expected.len()));
    f.insert("rows".into(), json!(out.rows.len()));
    checks.push(check(SECTION, &format!("{name}: every row of the grid present, once"), first.is_none(), f, first));

    // The replay: every present row, or a seeded sample of them.
    let mut chosen: Vec<usize> = (0..present.len()).collect();
    if let Some(n) = opts.sample.filter(|&n| n < present.len()) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(opts.seed);
        chosen = rand::seq::index::sample(&mut rng, present.len(), n).into_vec();
        chosen.sort_unstable();
    }
    let shape = calib.shape();
    let keeps: BTreeMap<&str, Keep> = prepared
        .variants
        .iter()
        .map(|v| Ok((v.label.as_str(), Keep::from_layers(&shape, &v.keep.layers)?)))
        .collect::<Result<_>>()?;
    let views = [calib.view(), held.view()];
    let profiles = prov
        .grid
        .device_profiles()
        .map_err(|e| anyhow::anyhow!("the device profiles of the grid in its provenance: {e}"))?;
    let devices: Vec<cachesim::TimelineDevice> = profiles
        .iter()
        .flat_map(|p| {
            p.bandwidth_gbps.iter().map(|&bw| cachesim::TimelineDevice {
                expert_mb: p.expert_mb,
                compute_ms: p.compute_ms,
                bandwidth_gbps: bw,
            })
        })
        .collect();
    let replayed: Vec<Result<Option<String>>> = chosen
        .par_iter()
        .map(|&p| {
            let (i, c) = present[p];
            let row = &out.rows[i];
            let view = &views[usize::from(row.sample == Sample::OutOfSample)];
            let run = RowRun {
                view,
                keep: &keeps[c.variant.as_str()],
                cfg: sweep::replay_config(&prov.grid, c),
                coact: prepared.coact(),
                devices: &devices,
                profiles: &profiles,
            };
            run.difference(row, c)
        })
        .collect();
    let mut first = None;
    let mut mismatches = 0usize;
    for (&p, diff) in chosen.iter().zip(replayed) {
        let row = &out.rows[present[p].0];
        if let Some(diff) = diff? {
            mismatches += 1;
            first.get_or_insert_with(|| {
                format!("{name}: row {} ({}): {diff} by the reference replayer", row.key, row.sample.as_str())
            });
        }
    }
    let mut f = BTreeMap::new();
    f.insert("replayed".into(), json!(chosen.len()));
    f.insert("of".into(), json!(present.len()));
    if chosen.len() < present.len() {
        f.insert("seed".into(), json!(opts.seed));
    }
    f.insert("mismatches".into(), json!(mismatches));
    checks.push(check(
        SECTION,
        &format!("{name}: rows replayed by the reference replayer, every count equal"),
        first.is_none() && !chosen.is_empty(),
        f,
        first,
    ));
    Ok(checks)
}

/// One row's reference replay: the trace, keep set, configuration and what prefetch rows need.
struct RowRun<'a> {
    view: &'a trace_io::TraceView<'a>,
    keep: &'a Keep,
    cfg: cachesim::ReplayConfig,
    coact: Option<&'a cachesim::CoactTable>,
    /// One per profile and bandwidth, in the order of a row's `cost`.
    devices: &'a [cachesim::TimelineDevice],
    /// The grid's device profiles, in the order of a hybrid row's `hybrid.cost`.
    profiles: &'a [sweep::DeviceProfile],
}

impl RowRun<'_> {
    /// The first figure of `row` (configuration `c`) that the reference replayer of its kind
    /// does not give: the plain one (§5), the deployed one (§9-§11: pins, cap 0, tier 2,
    /// batches), the prefetch one (§12, with the §13 timeline on every device) or the hybrid
    /// one (§14, priced on every profile).
    fn difference(&self, row: &sweep::Row, c: &sweep::ConfigKey) -> Result<Option<String>> {
        if let Some(h) = c.hybrid {
            return self.hybrid_difference(row, c, h);
        }
        if let Some(d) = &c.deploy {
            let dep = d.deployment(&self.view.shape())?;
            let got = cachesim::reference::deploy::replay(self.view, self.keep, &self.cfg, &dep)?;
            if let Some(diff) = first_difference(&row.counts, &got.counts) {
                return Ok(Some(diff));
            }
            let Some(f) = &row.deploy else { return Ok(Some("deploy figures missing".into())) };
            let pairs = [
                ("pinned_hits", f.pinned_hits, got.pinned_hits),
                ("t2_hits", f.t2_hits, got.t2_hits),
                ("storage_reads", f.storage_reads, got.storage_reads),
                ("steps", f.steps, got.steps),
                ("rows", f.rows, got.rows),
            ];
            return Ok(pairs
                .iter()
                .find(|(_, a, b)| a != b)
                .map(|(k, a, b)| format!("deploy.{k} is {a} in results.json, {b}")));
        }
        let Some(pk) = c.prefetch else {
            return Ok(first_difference(&row.counts, &cachesim::reference::replay(self.view, self.keep, &self.cfg)?));
        };
        let shuffled = pk.shuffle.map(|seed| cachesim::shuffle::Shuffled::new(self.view, seed));
        let sh = shuffled.as_ref().map(cachesim::shuffle::Shuffled::view);
        let view = sh.as_ref().unwrap_or(self.view);
        let mut opts = pk.options(self.coact);
        let replay = |opts: &cachesim::PrefetchOptions<'_>| {
            cachesim::reference::prefetch::replay(view, self.keep, &self.cfg, opts)
        };
        if pk.prefetch.is_none() {
            return Ok(first_difference(&row.counts, &replay(&opts)?.counts.replay));
        }
        let Some(f) = &row.prefetch else { return Ok(Some("prefetch figures missing".into())) };
        if f.timeline.len() != self.devices.len() {
            return Ok(Some(format!(
                "prefetch.timeline has {} entries, the profiles give {}",
                f.timeline.len(),
                self.devices.len()
            )));
        }
        for (i, (dev, t)) in self.devices.iter().zip(&f.timeline).enumerate() {
            opts.timeline = Some(*dev);
            let got = replay(&opts)?;
            if i == 0 {
                if let Some(diff) = first_difference(&row.counts, &got.counts.replay) {
                    return Ok(Some(diff));
                }
                let pairs = [
                    ("prefetch_loads", f.prefetch_loads, got.counts.prefetch_loads),
                    ("useful", f.useful, got.counts.useful),
                    ("wasted", f.wasted, got.counts.wasted),
                ];
                if let Some((k, a, b)) = pairs.iter().find(|(_, a, b)| a != b) {
                    return Ok(Some(format!("prefetch.{k} is {a} in results.json, {b}")));
                }
            }
            let tl = got.timeline.expect("asked for");
            if !close(t.tok_s, tl.tok_s) {
                return Ok(Some(format!("prefetch.timeline[{i}].tok_s is {} in results.json, {}", t.tok_s, tl.tok_s)));
            }
            if !close(t.stall_s_per_token, tl.stall_s_per_token) {
                return Ok(Some(format!(
                    "prefetch.timeline[{i}].stall_s_per_token is {} in results.json, {}",
                    t.stall_s_per_token, tl.stall_s_per_token
                )));
            }
        }
        Ok(None)
    }

    /// [`RowRun::difference`] of a hybrid row: the counts of §5/§9/§11, the §14 events and, per
    /// profile, the cost entry of `hybrid.cost`, each from `cachesim::reference::hybrid`.
    fn hybrid_difference(&self, row: &sweep::Row, c: &sweep::ConfigKey, h: sweep::HybridKey) -> Result<Option<String>> {
        let dep = c.deploy.as_ref().map(|d| d.deployment(&self.view.shape())).transpose()?.unwrap_or_default();
        let Some(f) = &row.hybrid else { return Ok(Some("hybrid figures missing".into())) };
        if f.cost.len() != self.profiles.len() {
            return Ok(Some(format!(
                "hybrid.cost has {} entries, the profiles give {}",
                f.cost.len(),
                self.profiles.len()
            )));
        }
        for (pi, (p, e)) in self.profiles.iter().zip(&f.cost).enumerate() {
            let dev = p.hybrid(h.overlap)?;
            let (got, cost) = cachesim::reference::hybrid::replay(self.view, self.keep, &self.cfg, &dep, h.exec, &dev)?;
            if pi == 0 {
                if let Some(diff) = first_difference(&row.counts, &got.deploy.counts) {
                    return Ok(Some(diff));
                }
                let pairs = [
                    ("host_runs", f.host_runs, got.host_runs),
                    ("loads", f.loads, got.loads),
                    ("copies", f.copies, got.copies),
                    ("pinned_hits", f.pinned_hits, got.deploy.pinned_hits),
                    ("steps", f.steps, got.deploy.steps),
                    ("rows", f.rows, got.deploy.rows),
                ];
                if let Some((k, a, b)) = pairs.iter().find(|(_, a, b)| a != b) {
                    return Ok(Some(format!("hybrid.{k} is {a} in results.json, {b}")));
                }
            }
            let figures = [
                ("tok_s", e.tok_s, cost.tok_s),
                ("host_s_per_row", e.host_s_per_row, cost.host_s_per_row),
                ("gpu_s_per_row", e.gpu_s_per_row, cost.gpu_s_per_row),
                ("link_s_per_row", e.link_s_per_row, cost.link_s_per_row),
            ];
            if let Some((k, a, b)) = figures.iter().find(|(_, a, b)| !close(*a, *b)) {
                return Ok(Some(format!("hybrid.cost[{pi}].{k} ({}) is {a} in results.json, {b}", p.name)));
            }
        }
        Ok(None)
    }
}

/// A digest in the form a sweep hands to the statistics (`Stats::meta.source_digest`): `ALGO:HEX`,
/// or the bare hex of a SHA-256 as outputs written before the algorithm was named hold it, so that
/// the recomputed statistics hash as recorded.
fn recorded_digest(d: &trace_io::Digest) -> String {
    if d.algorithm == "sha256" { d.hex.clone() } else { d.to_string() }
}

/// The first count that differs (fields in serialization order, per-layer entries by index), as
/// `misses is 100 in results.json, 120`, or `None` when the counts are equal.
fn first_difference(recorded: &ReplayCounts, replayed: &ReplayCounts) -> Option<String> {
    let (a, b) = (serde_json::to_value(recorded).ok()?, serde_json::to_value(replayed).ok()?);
    let (Value::Object(a), Value::Object(b)) = (a, b) else { return None };
    for (k, vb) in &b {
        let va = a.get(k).unwrap_or(&Value::Null);
        match (va, vb) {
            (Value::Array(xa), Value::Array(xb)) => {
                for i in 0..xa.len().max(xb.len()) {
                    let (x, y) = (xa.get(i).unwrap_or(&Value::Null), xb.get(i).unwrap_or(&Value::Null));
                    if x != y {
                        return Some(format!("{k}[{i}] is {x} in results.json, {y}"));
                    }
                }
            }
            _ if va != vb => return Some(format!("{k} is {va} in results.json, {vb}")),
            _ => {}
        }
    }
    None
}

/// The keep maps of the prepared grid against `provenance.keep_maps` (outputs written before it
/// existed record none: the maps are then rebuilt, not compared, and the check says so).
fn keep_maps_as_recorded(name: &str, out: &SweepOutput, prepared: &sweep::Prepared) -> Check {
    let title = format!("{name}: keep maps rebuilt as recorded");
    let recorded = &out.provenance.keep_maps;
    if recorded.is_empty() {
        let detail = "no keep-map hashes in provenance (an older output): rebuilt from the statistics, not compared";
        return check(SECTION, &title, true, BTreeMap::from([("detail".to_string(), json!(detail))]), None);
    }
    let rebuilt = prepared.keep_maps();
    let mut first = None;
    for (i, r) in recorded.iter().enumerate() {
        let how = |v: &str| {
            let spec = prepared.variants.iter().find(|x| x.label == v).map_or("", |x| x.spec.as_str());
            if spec.starts_with("file:") { "read from its file" } else { "rebuilt from the recomputed statistics" }
        };
        match rebuilt.iter().find(|b| b.variant == r.variant) {
            Some(b) if b.sha256 != r.sha256 => first.get_or_insert_with(|| {
                format!(
                    "{name}: provenance.keep_maps[{i}] ({}) has sha256 {}, the map {} has {}",
                    r.variant,
                    r.sha256,
                    how(&r.variant),
                    b.sha256
                )
            }),
            Some(_) => continue,
            None => first.get_or_insert_with(|| {
                format!("{name}: provenance.keep_maps[{i}] ({}) is not a pruned variant of the grid", r.variant)
            }),
        };
    }
    if let Some(b) = rebuilt.iter().find(|b| !recorded.iter().any(|r| r.variant == b.variant)) {
        first.get_or_insert_with(|| format!("{name}: variant {} has no entry in provenance.keep_maps", b.variant));
    }
    let f = BTreeMap::from([("maps".to_string(), json!(recorded.len()))]);
    check(SECTION, &title, first.is_none(), f, first)
}
