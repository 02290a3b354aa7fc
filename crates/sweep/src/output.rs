//! Sweep outputs: `results.json` (rows plus provenance), `results.csv`, `summary.md`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Cost, Grid, Result, Row, Sample, SweepError};

/// Where the inputs of a sweep came from, recorded beside its rows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Provenance {
    /// `moe-offload` version that wrote the file.
    pub tool_version: String,
    /// The grid as run (paths resolved).
    pub grid: Grid,
    /// In-sample trace: source and digest.
    pub in_sample: InputRef,
    /// Out-of-sample trace: source and digest.
    pub out_of_sample: InputRef,
    /// SHA-256 of the in-sample statistics the metric variants came from.
    pub stats_sha256: String,
    /// The other files the grid names ([`Grid::files`]: keep maps, per-layer caps), each with its
    /// path as the grid wrote it and its SHA-256; absent from the JSON when there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<InputRef>,
    /// The keep map of every pruned variant (label and [`keep_map_sha256`]), so that the maps an
    /// audit rebuilds from the statistics, or reads from a `file:` variant's file, can be compared
    /// with the ones the rows were replayed with. Absent in outputs written before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_maps: Vec<KeepRef>,
    /// The absolute directory of the grid file, which its relative paths (traces, keep maps,
    /// caps, pin maps, the calibration trace) are relative to, so that an audit finds them from
    /// any output directory. Absent for the embedded grid and in outputs written before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grid_dir: Option<String>,
}

/// A keep map a sweep replayed: its variant label and the hash of its contents.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KeepRef {
    /// The variant's label in keys (`frequency@32`, `l2_sum@256[mymap]`).
    pub variant: String,
    /// [`keep_map_sha256`] of the map.
    pub sha256: String,
}

/// Hex SHA-256 of a keep map's canonical JSON (`serde_json::to_vec`, compact, fields in
/// declaration order): what [`Provenance::keep_maps`] records.
pub fn keep_map_sha256(map: &saliency::KeepMap) -> String {
    trace_io::sha256_hex(&serde_json::to_vec(map).expect("a keep map serializes"))
}

/// A reference to an input file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputRef {
    /// A path, or `embedded:NAME`.
    pub source: String,
    /// Digest of its bytes, named by its algorithm: `blake3:HEX` for traces, `sha256:HEX` for
    /// the other files. Written as `digest`; files written before read too: their field was
    /// `sha256` (which held BLAKE3 digests of traces), with a bare hex value for SHA-256.
    #[serde(alias = "sha256")]
    pub digest: trace_io::Digest,
}

/// Which slice of a grid a sharded run covers: configurations whose index in the sorted list is
/// congruent to `index` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// 0-based shard index, `< count`.
    pub index: usize,
    /// Number of shards.
    pub count: usize,
}

/// Everything a sweep writes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepOutput {
    /// Provenance.
    pub provenance: Provenance,
    /// The slice of the grid, for a sharded run; absent for a whole (or merged) run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
    /// Rows sorted by (key, sample).
    pub rows: Vec<Row>,
}

/// [`BestOf`] for every (variant, cap, k_used) of `rows`, sorted by them. Ties: the smaller key.
/// Rows with a deployment (pins, tier 2, batches) are left out: their memory and counts are not
/// those of a plain cache of the same cap; so are rows with prefetch or a shuffled order
/// (SEMANTICS.md §12): their misses are demand misses, or those of another token order.
pub fn best_per_variant(rows: &[Row]) -> Vec<BestOf> {
    let mut groups: BTreeMap<(&str, usize, usize, Option<&str>), Vec<&Row>> = BTreeMap::new();
    for r in
        rows.iter().filter(|r| r.config.deploy.is_none() && r.config.prefetch.is_none() && r.config.hybrid.is_none())
    {
        let named = r.config.layer_caps.as_ref().map(|c| c.name.as_str());
        groups.entry((&r.config.variant, r.config.cap, r.config.k_used, named)).or_default().push(r);
    }
    let short = |r: &Row| format!("{}/{}/{}", r.config.policy, r.config.lambda, r.config.j);
    groups
        .into_iter()
        .filter_map(|((variant, cap, k_used, named), rows)| {
            let best = |s: Sample| {
                rows.iter()
                    .filter(|r| r.sample == s && !r.config.policy.facts().offline)
                    .min_by(|a, b| a.misses_per_token.total_cmp(&b.misses_per_token).then(a.config.cmp(&b.config)))
                    .copied()
            };
            let (ins, outs) = (best(Sample::InSample)?, best(Sample::OutOfSample)?);
            let chosen = rows.iter().find(|r| r.sample == Sample::OutOfSample && r.key == ins.key)?;
            let belady = |s: Sample| {
                rows.iter().find(|r| r.sample == s && r.config.policy.facts().offline).map(|r| r.misses_per_token)
            };
            Some(BestOf {
                variant: variant.to_string(),
                cap,
                layer_caps: named.map(str::to_string),
                k_used,
                in_sample_best: short(ins),
                in_sample_misses_per_token: ins.misses_per_token,
                chosen_out_of_sample: chosen.misses_per_token,
                out_of_sample_best: short(outs),
                out_of_sample_misses_per_token: outs.misses_per_token,
                belady: belady(Sample::InSample).zip(belady(Sample::OutOfSample)),
            })
        })
        .collect()
}

/// The `kind` tag of `results.json` (its first field), so that a reader (pandas, a script) can tell
/// the file from the other JSON outputs. Ignored when reading.
pub const RESULTS_KIND: &str = "moe-offload-sweep-results";

/// `results.json`: the output with its `kind` tag first.
#[derive(serde::Serialize)]
struct Tagged<'a> {
    kind: &'static str,
    #[serde(flatten)]
    out: &'a SweepOutput,
}

impl SweepOutput {
    /// Reads a `results.json` written by [`SweepOutput::write`].
    ///
    /// # Errors
    /// [`SweepError::Io`] or [`SweepError::Json`] naming the file; [`SweepError::NotResults`]
    /// naming its `kind` when it is another moe-offload output that does not parse as results.
    pub fn read(path: &Path) -> Result<SweepOutput> {
        let bytes = trace_io::read_text(path).map_err(|source| SweepError::Io { path: path.into(), source })?;
        serde_json::from_slice(&bytes).map_err(|source| {
            // Another output of this tool (statistics, a keep map, a plan) says what it is.
            #[derive(serde::Deserialize)]
            struct Kind {
                kind: Option<String>,
            }
            match serde_json::from_slice::<Kind>(&bytes) {
                Ok(Kind { kind: Some(kind) }) if kind != RESULTS_KIND => {
                    SweepError::NotResults { path: path.into(), kind }
                }
                _ => SweepError::Json { path: path.into(), source },
            }
        })
    }
}

/// Per (variant, cap, k_used): the best online configuration (fewest misses per token, Belady
/// excluded since it is an oracle) in and out of sample, and Belady's misses (the offline optimum
/// for λ = 0 routing; a λ > 0 configuration changes the requests and can have fewer).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BestOf {
    /// Variant label.
    pub variant: String,
    /// Cache capacity (with `layer_caps`, the largest per-layer cap).
    pub cap: usize,
    /// Name of the per-layer caps file, when the configuration has one.
    pub layer_caps: Option<String>,
    /// Experts used per token.
    pub k_used: usize,
    /// Best online configuration in sample: `policy/lambda/j`.
    pub in_sample_best: String,
    /// Its misses per token in sample.
    pub in_sample_misses_per_token: f64,
    /// The same configuration's misses per token out of sample (what a user choosing on
    /// calibration data gets).
    pub chosen_out_of_sample: f64,
    /// Best online configuration out of sample.
    pub out_of_sample_best: String,
    /// Its misses per token.
    pub out_of_sample_misses_per_token: f64,
    /// Belady's misses per token in and out of sample, when the grid has it.
    pub belady: Option<(f64, f64)>,
}

impl BestOf {
    /// `chosen_out_of_sample − in_sample_misses_per_token`.
    pub fn shift(&self) -> f64 {
        self.chosen_out_of_sample - self.in_sample_misses_per_token
    }
}

impl SweepOutput {
    /// [`BestOf`] for every (variant, cap, k_used) of the rows ([`best_per_variant`]).
    pub fn best_per_variant(&self) -> Vec<BestOf> {
        best_per_variant(&self.rows)
    }

    /// The summary as Markdown (`summary.md`): [`SUMMARY_INTRO`](crate::SUMMARY_INTRO), then
    /// the [`SummaryTable`](crate::SummaryTable) of the rows.
    pub fn summary_markdown(&self) -> String {
        format!("{}\n\n{}", crate::SUMMARY_INTRO, crate::SummaryTable::of(self).markdown())
    }

    /// The files of a sweep output: `results.json`, `results.csv`, `results-costs.csv` (the cost
    /// columns in long form), `summary.md`.
    pub const FILES: [&'static str; 4] = ["results.json", "results.csv", "results-costs.csv", "summary.md"];

    /// Writes the [`FILES`](Self::FILES) into `dir` (created if missing) as one output set
    /// ([`trace_io::OutputSet`]): `dir` ends up with all four of this run or
    /// keeps its previous contents, never a mix.
    ///
    /// # Errors
    /// [`SweepError::Io`] naming the directory, around the lock (another writer) or a write.
    pub fn write(&self, dir: &Path) -> Result<()> {
        let set = trace_io::OutputSet::begin(dir).map_err(|source| SweepError::Io { path: dir.into(), source })?;
        self.write_set(set)
    }

    /// [`SweepOutput::write`] into an output set begun (and locked) by the caller, for example
    /// before the sweep ran, so that a second writer fails before any work. Commits the set.
    ///
    /// # Errors
    /// [`SweepError::Io`] naming the set's directory.
    pub fn write_set(&self, mut set: trace_io::OutputSet) -> Result<()> {
        let dir = set.target().to_path_buf();
        let io = |source| SweepError::Io { path: dir.clone(), source };
        let json = serde_json::to_vec_pretty(&Tagged { kind: RESULTS_KIND, out: self }).expect("rows serialize");
        let [results, csv, costs, summary] = Self::FILES;
        set.write(results, |w| w.write_all(&json)).map_err(io)?;
        set.write(csv, |w| w.write_all(&self.csv())).map_err(io)?;
        set.write(costs, |w| w.write_all(&self.costs_csv())).map_err(io)?;
        set.write(summary, |w| w.write_all(self.summary_markdown().as_bytes())).map_err(io)?;
        set.commit().map_err(io)
    }

    /// The rows as CSV: key fields, counts, derived fields, then per profile one
    /// `ssd_mb_per_token@PROFILE` column (it does not depend on the bandwidth) and one
    /// `tok_s@PROFILE@BW` column per bandwidth.
    pub fn csv(&self) -> Vec<u8> {
        // Flexible: rows read back from a results.json whose cost lists differ in length (an edited
        // file the audit is checking) are written as they are instead of panicking.
        let mut w = csv::WriterBuilder::new().flexible(true).from_writer(Vec::new());
        let mut header: Vec<String> = KEY_COLUMNS
            .iter()
            .chain(&[
                "tokens",
                "picks",
                "hits",
                "misses",
                "forced_misses",
                "substituted",
                "pruned_slots",
                "hit_rate",
                "misses_per_token",
            ])
            .map(|s| s.to_string())
            .collect();
        // Costs come grouped by profile, bandwidths in order: the SSD column opens each group.
        let opens_profile = |cost: &[Cost], i: usize| i == 0 || cost[i - 1].profile != cost[i].profile;
        if let Some(r) = self.rows.first() {
            for (i, c) in r.cost.iter().enumerate() {
                if opens_profile(&r.cost, i) {
                    header.push(format!("ssd_mb_per_token@{}", c.profile));
                }
                header.push(format!("tok_s@{}@{}", c.profile, c.bandwidth_gbps));
            }
        }
        w.write_record(&header).expect("writing to a Vec cannot fail");
        for r in &self.rows {
            let c = &r.counts;
            let mut rec = key_fields(r).to_vec();
            rec.extend([
                c.tokens.to_string(),
                c.picks.to_string(),
                c.hits.to_string(),
                c.misses.to_string(),
                c.forced_misses.to_string(),
                c.substituted.to_string(),
                c.pruned_slots.to_string(),
                r.hit_rate.to_string(),
                r.misses_per_token.to_string(),
            ]);
            for (i, cost) in r.cost.iter().enumerate() {
                if opens_profile(&r.cost, i) {
                    rec.push(cost.ssd_mb_per_token.to_string());
                }
                rec.push(cost.tok_s.to_string());
            }
            w.write_record(&rec).expect("writing to a Vec cannot fail");
        }
        w.into_inner().expect("flushing a Vec cannot fail")
    }

    /// The costs in long (tidy) form: one line per (row, profile, bandwidth) with the row's key
    /// fields and misses per token, then `profile`, `bandwidth_gbps`, `ssd_mb_per_token`, `tok_s`
    /// (the same figures as the `@` columns of [`SweepOutput::csv`]).
    pub fn costs_csv(&self) -> Vec<u8> {
        let mut w = csv::Writer::from_writer(Vec::new());
        let header =
            KEY_COLUMNS.iter().chain(&["misses_per_token", "profile", "bandwidth_gbps", "ssd_mb_per_token", "tok_s"]);
        w.write_record(header).expect("writing to a Vec cannot fail");
        for r in &self.rows {
            for cost in &r.cost {
                w.write_record(key_fields(r).into_iter().chain([
                    r.misses_per_token.to_string(),
                    cost.profile.clone(),
                    cost.bandwidth_gbps.to_string(),
                    cost.ssd_mb_per_token.to_string(),
                    cost.tok_s.to_string(),
                ]))
                .expect("writing to a Vec cannot fail");
            }
        }
        w.into_inner().expect("flushing a Vec cannot fail")
    }
}

/// The columns that identify a row in both CSVs ([`SweepOutput::csv`], [`SweepOutput::costs_csv`]).
const KEY_COLUMNS: [&str; 9] = ["key", "sample", "variant", "policy", "lambda", "j", "cap", "layer_caps", "k_used"];

/// A row's values of [`KEY_COLUMNS`].
fn key_fields(r: &Row) -> [String; 9] {
    [
        r.key.clone(),
        r.sample.as_str().to_string(),
        r.config.variant.clone(),
        r.config.policy.to_string(),
        r.config.lambda.to_string(),
        r.config.j.to_string(),
        r.config.cap.to_string(),
        r.config.layer_caps.as_ref().map_or_else(String::new, |c| c.name.clone()),
        r.config.k_used.to_string(),
    ]
}

/// Writes `bytes` to `path` through a temporary file in the same directory, renamed into place
/// ([`trace_io::write_atomic`]).
///
/// # Errors
/// [`SweepError::Io`] naming `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    trace_io::write_atomic(path, |w| w.write_all(bytes)).map_err(|source| SweepError::Io { path: path.into(), source })
}
