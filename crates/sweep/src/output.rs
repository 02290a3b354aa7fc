//! Sweep outputs: `results.json` (rows plus provenance), `results.csv`, `summary.md`.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Grid, Result, Row, Sample, SweepError};

/// Where the inputs of a sweep came from, recorded beside its rows.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Provenance {
    /// `moe-offload` version that wrote the file.
    pub tool_version: String,
    /// The grid as run (paths resolved).
    pub grid: Grid,
    /// In-sample trace: source and SHA-256.
    pub in_sample: InputRef,
    /// Out-of-sample trace: source and SHA-256.
    pub out_of_sample: InputRef,
    /// SHA-256 of the in-sample statistics the metric variants came from.
    pub stats_sha256: String,
}

/// A reference to an input file.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct InputRef {
    /// A path, or `embedded:NAME`.
    pub source: String,
    /// Hex SHA-256 of its bytes.
    pub sha256: String,
}

/// Everything a sweep writes.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepOutput {
    /// Provenance.
    pub provenance: Provenance,
    /// Rows sorted by (key, sample).
    pub rows: Vec<Row>,
}

/// Per variant: the best configuration (fewest misses per token) in and out of sample.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct BestOf {
    /// Variant label.
    pub variant: String,
    /// Best in-sample key and its misses per token.
    pub in_sample: (String, f64),
    /// Best out-of-sample key and its misses per token.
    pub out_of_sample: (String, f64),
    /// Out-of-sample misses per token of the in-sample best key (what a user choosing on
    /// calibration data gets), and its shift from the in-sample figure.
    pub chosen_out_of_sample: f64,
}

impl SweepOutput {
    /// The per-variant best configurations, variants sorted by label. Ties: the smaller key.
    pub fn best_per_variant(&self) -> Vec<BestOf> {
        let mut by_variant: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
        for r in &self.rows {
            by_variant.entry(&r.config.variant).or_default().push(r);
        }
        by_variant
            .into_iter()
            .map(|(variant, rows)| {
                let best = |s: Sample| {
                    rows.iter()
                        .filter(|r| r.sample == s)
                        .min_by(|a, b| a.misses_per_token.total_cmp(&b.misses_per_token).then(a.config.cmp(&b.config)))
                        .map(|r| (r.key.clone(), r.misses_per_token))
                        .unwrap_or_default()
                };
                let ins = best(Sample::InSample);
                let chosen = rows
                    .iter()
                    .find(|r| r.sample == Sample::OutOfSample && r.key == ins.0)
                    .map_or(f64::NAN, |r| r.misses_per_token);
                BestOf { variant: variant.to_string(), in_sample: ins, out_of_sample: best(Sample::OutOfSample), chosen_out_of_sample: chosen }
            })
            .collect()
    }

    /// The summary as a Markdown table.
    pub fn summary_markdown(&self) -> String {
        let mut s = String::from(
            "| variant | best in-sample | misses/token | best out-of-sample | misses/token | in-sample best, out of sample | shift |\n|---|---|---:|---|---:|---:|---:|\n",
        );
        for b in self.best_per_variant() {
            let shift = b.chosen_out_of_sample - b.in_sample.1;
            s += &format!(
                "| {} | {} | {:.4} | {} | {:.4} | {:.4} | {:+.4} |\n",
                b.variant, b.in_sample.0, b.in_sample.1, b.out_of_sample.0, b.out_of_sample.1, b.chosen_out_of_sample, shift
            );
        }
        s
    }

    /// Writes `results.json`, `results.csv` and `summary.md` into `dir` (created if missing),
    /// each through a temporary file renamed into place.
    ///
    /// # Errors
    /// [`SweepError::Io`] naming the file.
    pub fn write(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|source| SweepError::Io { path: dir.into(), source })?;
        let json = serde_json::to_vec_pretty(self).expect("rows serialize");
        write_atomic(&dir.join("results.json"), &json)?;
        write_atomic(&dir.join("results.csv"), &self.csv())?;
        write_atomic(&dir.join("summary.md"), self.summary_markdown().as_bytes())
    }

    /// The rows as CSV: key fields, counts, derived fields, then `tok_s@PROFILE@BW` columns.
    pub fn csv(&self) -> Vec<u8> {
        let mut w = csv::Writer::from_writer(Vec::new());
        let mut header: Vec<String> = [
            "key", "sample", "variant", "policy", "lambda", "j", "cap", "k_used", "tokens", "picks", "hits", "misses",
            "forced_misses", "substituted", "pruned_slots", "hit_rate", "misses_per_token",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if let Some(r) = self.rows.first() {
            for c in &r.cost {
                header.push(format!("ssd_mb_per_token@{}", c.profile));
                header.push(format!("tok_s@{}@{}", c.profile, c.bandwidth_gbps));
            }
        }
        w.write_record(&header).expect("writing to a Vec cannot fail");
        for r in &self.rows {
            let c = &r.counts;
            let mut rec = vec![
                r.key.clone(),
                r.sample.as_str().to_string(),
                r.config.variant.clone(),
                r.config.policy.to_string(),
                r.config.lambda.to_string(),
                r.config.j.to_string(),
                r.config.cap.to_string(),
                r.config.k_used.to_string(),
                c.tokens.to_string(),
                c.picks.to_string(),
                c.hits.to_string(),
                c.misses.to_string(),
                c.forced_misses.to_string(),
                c.substituted.to_string(),
                c.pruned_slots.to_string(),
                r.hit_rate.to_string(),
                r.misses_per_token.to_string(),
            ];
            for cost in &r.cost {
                rec.push(cost.ssd_mb_per_token.to_string());
                rec.push(cost.tok_s.to_string());
            }
            w.write_record(&rec).expect("writing to a Vec cannot fail");
        }
        w.into_inner().expect("flushing a Vec cannot fail")
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory, renamed into place
/// ([`trace_io::write_atomic`]).
///
/// # Errors
/// [`SweepError::Io`] naming `path`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    trace_io::write_atomic(path, |w| w.write_all(bytes)).map_err(|source| SweepError::Io { path: path.into(), source })
}
