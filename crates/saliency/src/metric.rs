//! Saliency metrics: per-(layer, expert) scores, higher = more worth keeping (SEMANTICS.md §2).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::invalid;
use crate::{Result, SaliencyError, Stats};

/// A saliency metric (SEMANTICS.md §2). Spelled in files and on the command line as
/// [`Metric::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Metric {
    /// `frequency` = c, the count of used slots routed to the expert.
    Frequency,
    /// `gate_sum` = Σg, router-weighted frequency. Needs `gate_sum`.
    GateSum,
    /// `ean_sum` = Σ‖o‖. Needs `ean_sum`.
    EanSum,
    /// `ean_mean` = Σ‖o‖ / c. Needs `ean_sum`.
    EanMean,
    /// `reap` = Σ g·‖o‖ / c, the REAP criterion. Needs `reap_sum`.
    Reap,
    /// `l2_sum` = Σ g·‖o‖, REAP mass. Needs `reap_sum`.
    L2Sum,
    /// `shrink` = (mean − SE) · c/(c+τ), a damped lower confidence bound of `reap`.
    /// Needs `reap_sum` and `reap_sumsq`.
    Shrink,
    /// `hybrid` = mean of the rank-percentiles of base metrics ([`MetricConfig::hybrid_base`]).
    Hybrid,
}

impl Metric {
    /// Every metric, in declaration order.
    pub const ALL: [Metric; 8] = [
        Metric::Frequency,
        Metric::GateSum,
        Metric::EanSum,
        Metric::EanMean,
        Metric::Reap,
        Metric::L2Sum,
        Metric::Shrink,
        Metric::Hybrid,
    ];

    /// The metric's name (`frequency`, `gate_sum`, `ean_sum`, `ean_mean`, `reap`, `l2_sum`,
    /// `shrink`, `hybrid`).
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Frequency => "frequency",
            Metric::GateSum => "gate_sum",
            Metric::EanSum => "ean_sum",
            Metric::EanMean => "ean_mean",
            Metric::Reap => "reap",
            Metric::L2Sum => "l2_sum",
            Metric::Shrink => "shrink",
            Metric::Hybrid => "hybrid",
        }
    }

    /// The names of [`Metric::ALL`].
    pub fn names() -> Vec<&'static str> {
        Metric::ALL.iter().map(|m| m.as_str()).collect()
    }

    /// The statistics the metric reads besides `count` (for `hybrid`: none of its own; its base
    /// metrics' requirements apply).
    pub fn required_statistics(self) -> &'static [&'static str] {
        match self {
            Metric::Frequency | Metric::Hybrid => &[],
            Metric::GateSum => &["gate_sum"],
            Metric::EanSum | Metric::EanMean => &["ean_sum"],
            Metric::Reap | Metric::L2Sum => &["reap_sum"],
            Metric::Shrink => &["reap_sum", "reap_sumsq"],
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Metric {
    type Err = SaliencyError;

    /// Parses a metric name.
    ///
    /// # Errors
    /// [`SaliencyError::UnknownMetric`], whose message lists the valid names.
    fn from_str(s: &str) -> Result<Metric> {
        Metric::ALL
            .into_iter()
            .find(|m| m.as_str() == s)
            .ok_or_else(|| SaliencyError::UnknownMetric { name: s.to_string() })
    }
}

/// Parameters of the metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricConfig {
    /// τ of `shrink` (default 64): the damping factor is c/(c+τ). Must be finite and >= 0.
    pub tau: f64,
    /// Base metrics of `hybrid`. `None` = the default: `l2_sum` and `reap` when the statistics hold
    /// `reap_sum`, else `frequency` and `gate_sum` (SEMANTICS.md §2 names the first pair; the
    /// second is our fallback for traces without output norms). Must be non-empty and must not
    /// contain `hybrid`.
    pub hybrid_base: Option<Vec<Metric>>,
}

impl Default for MetricConfig {
    fn default() -> MetricConfig {
        MetricConfig { tau: 64.0, hybrid_base: None }
    }
}

impl MetricConfig {
    /// The base metrics `hybrid` uses for these statistics.
    pub fn hybrid_base_for(&self, stats: &Stats) -> Vec<Metric> {
        match &self.hybrid_base {
            Some(b) => b.clone(),
            None if stats.layers.iter().all(|l| l.reap_sum.is_some()) => {
                vec![Metric::L2Sum, Metric::Reap]
            }
            None => vec![Metric::Frequency, Metric::GateSum],
        }
    }
}

/// Scores of `metric` for every (layer, expert): `[L][E]`, layer order of `stats.layers`,
/// higher = more worth keeping (formulas in SEMANTICS.md §2 and on each [`Metric`] variant).
/// Every expert with c = 0 scores `f64::NEG_INFINITY` (unusable), whatever the metric.
///
/// `shrink`: mean = reap_sum / c; SE = sd / √c with the sample sd
/// √((Σx² − c·mean²)/(c − 1)) (clamped at 0 against rounding) for c >= 2, SE = mean for c = 1;
/// score = (mean − SE) · c/(c+τ). It may be negative.
///
/// `hybrid`: per layer, each base metric's scores are turned into [`rank_percentiles`] over all
/// E experts (c = 0 experts, at −∞, tie for the lowest ranks; this shifts every usable expert's
/// percentile by the same amount in every base metric, so it does not change the order among
/// usable experts), then averaged over the base metrics.
///
/// # Errors
/// A validation error of [`Stats::validate`]; [`SaliencyError::MissingStatistic`] when the metric
/// (or a hybrid base metric) needs a statistic the stats lack; [`SaliencyError::Invalid`] for a
/// bad τ or hybrid base list.
pub fn metric_scores(stats: &Stats, metric: Metric, cfg: &MetricConfig) -> Result<Vec<Vec<f64>>> {
    stats.validate()?;
    if !cfg.tau.is_finite() || cfg.tau < 0.0 {
        return Err(invalid("tau", format!("{} is not a finite value >= 0", cfg.tau)));
    }
    if metric == Metric::Hybrid {
        let base = cfg.hybrid_base_for(stats);
        if base.is_empty() {
            return Err(invalid("hybrid_base", "empty: hybrid needs at least one base metric"));
        }
        if base.contains(&Metric::Hybrid) {
            return Err(invalid("hybrid_base", "hybrid cannot be its own base metric"));
        }
        // A base given twice would weigh it double without a word.
        if let Some(b) = base.iter().enumerate().find_map(|(i, b)| base[..i].contains(b).then_some(b)) {
            return Err(invalid("hybrid_base", format!("{b} is given twice: give each base metric once")));
        }
        let mut per_base = Vec::with_capacity(base.len());
        for &b in &base {
            per_base.push(scores_plain(stats, b, cfg)?);
        }
        let n = base.len() as f64;
        let out = (0..stats.layers.len())
            .map(|l| {
                let mut acc = vec![0.0; stats.num_experts()];
                for scores in &per_base {
                    for (a, p) in acc.iter_mut().zip(rank_percentiles(&scores[l])) {
                        *a += p;
                    }
                }
                acc.iter()
                    .zip(&stats.layers[l].count)
                    .map(|(&a, &c)| if c == 0 { f64::NEG_INFINITY } else { a / n })
                    .collect()
            })
            .collect();
        return Ok(out);
    }
    scores_plain(stats, metric, cfg)
}

/// Scores of a non-hybrid metric (stats already validated).
fn scores_plain(stats: &Stats, metric: Metric, cfg: &MetricConfig) -> Result<Vec<Vec<f64>>> {
    for &s in metric.required_statistics() {
        stats.require(metric.as_str(), s)?;
    }
    let missing = |statistic| SaliencyError::MissingStatistic { metric: metric.as_str().to_string(), statistic };
    let mut out = Vec::with_capacity(stats.layers.len());
    for layer in &stats.layers {
        let count = &layer.count;
        let usable = |c: u64, v: f64| if c == 0 { f64::NEG_INFINITY } else { v };
        let from = |v: &Option<Vec<f64>>, name, per_hit: bool| -> Result<Vec<f64>> {
            let v = v.as_ref().ok_or_else(|| missing(name))?;
            Ok(v.iter().zip(count).map(|(&s, &c)| usable(c, if per_hit { s / c as f64 } else { s })).collect())
        };
        let scores = match metric {
            Metric::Frequency => count.iter().map(|&c| usable(c, c as f64)).collect(),
            Metric::GateSum => from(&layer.gate_sum, "gate_sum", false)?,
            Metric::EanSum => from(&layer.ean_sum, "ean_sum", false)?,
            Metric::EanMean => from(&layer.ean_sum, "ean_sum", true)?,
            Metric::Reap => from(&layer.reap_sum, "reap_sum", true)?,
            Metric::L2Sum => from(&layer.reap_sum, "reap_sum", false)?,
            Metric::Shrink => {
                let sum = layer.reap_sum.as_ref().ok_or_else(|| missing("reap_sum"))?;
                let sumsq = layer.reap_sumsq.as_ref().ok_or_else(|| missing("reap_sumsq"))?;
                count.iter().zip(sum).zip(sumsq).map(|((&c, &s), &q)| usable(c, shrink(c, s, q, cfg.tau))).collect()
            }
            Metric::Hybrid => return Err(invalid("metric", "hybrid has no plain scores")),
        };
        out.push(scores);
    }
    Ok(out)
}

/// `shrink` for one expert with c >= 1 (SEMANTICS.md §2).
fn shrink(c: u64, sum: f64, sumsq: f64, tau: f64) -> f64 {
    let n = c as f64;
    let mean = sum / n;
    let se = if c >= 2 {
        let var = ((sumsq - sum * mean) / (n - 1.0)).max(0.0);
        var.sqrt() / n.sqrt()
    } else {
        mean
    };
    (mean - se) * n / (n + tau)
}

/// Compares two scores as numbers: equal values (including 0.0 and −0.0) tie; otherwise the
/// IEEE total order (so the comparison never panics).
pub(crate) fn cmp_score(a: f64, b: f64) -> Ordering {
    if a == b { Ordering::Equal } else { a.total_cmp(&b) }
}

/// Rank-percentiles of `scores` (SEMANTICS.md §2): the ascending rank (0 = lowest; equal scores
/// get the average of the ranks they span) divided by (n − 1), so values lie in [0, 1]. For n = 1
/// the single percentile is 0 (the formula is 0/0). −∞ entries rank lowest like any other value.
pub fn rank_percentiles(scores: &[f64]) -> Vec<f64> {
    let n = scores.len();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| cmp_score(scores[a], scores[b]));
    let denom = if n > 1 { (n - 1) as f64 } else { 1.0 };
    let mut out = vec![0.0; n];
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && cmp_score(scores[order[j]], scores[order[i]]) == Ordering::Equal {
            j += 1;
        }
        let rank = (i + j - 1) as f64 / 2.0;
        for &x in &order[i..j] {
            out[x] = rank / denom;
        }
        i = j;
    }
    out
}
