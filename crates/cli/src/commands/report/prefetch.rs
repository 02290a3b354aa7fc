//! The report's prefetch section (SEMANTICS.md §12, §13), from the rows of a grid's `prefetch`
//! and `shuffle` axes: precision against the budget B per predictor, timeline tok/s against B,
//! and misses per token in the real against the shuffled token order.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use cachesim::{Predictor, Prefetch};
use sweep::{Row, Sample, SweepOutput};

use super::html::{figure, legend, swatches, table};
use super::svg::{Axes, Marker, Series, Style, bar_plot, color, mark_identical, policy_color, xy_plot};

/// (variant, cap, k_used, λ, j): what one chart holds fixed.
type ChartKey = (String, usize, usize, String, usize);

fn chart_key(r: &Row) -> ChartKey {
    let c = &r.config;
    (c.variant.clone(), c.cap, c.k_used, c.lambda.to_string(), c.j)
}

fn chart_title(k: &ChartKey) -> String {
    let lam = if k.3 == "0" { String::new() } else { format!(", λ {}, j {}", k.3, k.4) };
    format!("variant {}, cap {}, k_used {}{lam}", k.0, k.1, k.2)
}

/// The predictor and budget of a row in the real order, if it has one.
fn prefetch_of(r: &Row) -> Option<Prefetch> {
    r.config.prefetch.filter(|p| p.shuffle.is_none()).and_then(|p| p.prefetch)
}

/// A plain row: no prefetch, real order, no deployment, exec transfer.
fn is_plain(r: &Row) -> bool {
    r.config.prefetch.is_none() && r.config.deploy.is_none() && r.config.hybrid.is_none()
}

/// One series per (policy, predictor) of the rows of `key`: `y` against B; colour by policy,
/// marker by predictor (its place in [`Predictor::ALL`]). `zero`: the value at B = 0 from the
/// plain row of the same policy, when there is one.
fn by_budget(
    rows: &[&Row],
    key: &ChartKey,
    y: impl Fn(&Row) -> Option<f64>,
    zero: impl Fn(&Row) -> Option<f64>,
) -> Vec<Series> {
    let mut lines: BTreeMap<(String, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for r in rows.iter().filter(|r| &chart_key(r) == key) {
        if let (Some(p), Some(v)) = (prefetch_of(r), y(r)) {
            let pi = Predictor::ALL.iter().position(|&x| x == p.predictor).unwrap_or(0);
            lines.entry((r.config.policy.to_string(), pi)).or_default().push((p.budget as f64, v));
        }
    }
    let mut series: Vec<Series> = lines
        .into_iter()
        .map(|((pol, pi), mut points)| {
            if let Some(v) = rows
                .iter()
                .find(|r| is_plain(r) && &chart_key(r) == key && r.config.policy.to_string() == pol)
                .and_then(|r| zero(r))
            {
                points.push((0.0, v));
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let style = Style { color: policy_color(&pol), marker: Marker::nth(pi), dashed: false };
            Series::new(format!("{pol}, {}", Predictor::ALL[pi]), points, style)
        })
        .collect();
    mark_identical(&mut series);
    series
}

/// The timeline tok/s of a row without prefetch (SEMANTICS.md §13): with nothing prefetched a
/// token takes its compute plus its demand loads one after another, and forced misses load
/// nothing, so tok/s = 1 / (compute_ms / 1000 + (misses − forced) / tokens · expert_mb /
/// (1000 · bw)). `None` for a row without counted tokens.
fn timeline_without_prefetch(r: &Row, p: &sweep::DeviceProfile, bw: f64) -> Option<f64> {
    let c = &r.counts;
    let loads = (c.tokens > 0).then(|| (c.misses - c.forced_misses) as f64 / c.tokens as f64)?;
    Some(1.0 / (p.compute_ms / 1000.0 + loads * p.expert_mb / (1000.0 * bw)))
}

/// The section; a note when the sweep has no prefetch or shuffled rows.
pub(super) fn section(sweep: &SweepOutput) -> Result<String> {
    let oos: Vec<&Row> = sweep.rows.iter().filter(|r| r.sample == Sample::OutOfSample).collect();
    if !oos.iter().any(|r| r.config.prefetch.is_some()) {
        return Ok("<p>No prefetch or shuffled configurations in this sweep. Add <code>prefetch</code> (for example \
                   <code>[\"none\", \"coact:2\", \"coact:4\", \"oracle:4\"]</code>) or <code>shuffle</code> lists \
                   to a grid block (docs/grid-format.md, docs/prefetch.md) to see precision and tok/s against the \
                   budget, and how much of the hit rate is temporal locality.</p>"
            .into());
    }
    let mut html = String::new();
    let charts: BTreeSet<ChartKey> = oos.iter().filter(|r| prefetch_of(r).is_some()).map(|r| chart_key(r)).collect();
    let point = oos.iter().find_map(|r| r.cost.first()).map(|c| (c.profile.clone(), c.bandwidth_gbps));
    let first_profile = sweep.provenance.grid.device_profiles().ok().and_then(|p| p.into_iter().next());
    for key in &charts {
        let series = by_budget(&oos, key, |r| r.prefetch.as_ref().and_then(|p| p.precision), |_| None);
        let axes = Axes { unit_y: true, ..Axes::lines("budget B (proposals per token and layer)", "precision") };
        html += &figure(
            &format!("Precision against the budget: {} (held-out trace)", chart_title(key)),
            &xy_plot(&series, &axes)?,
            &legend(&series),
            "Precision = useful / prefetch loads (SEMANTICS.md §12): the share of the experts a predictor loaded \
             that a token then used before their eviction. Colour: policy; marker: predictor.",
        );
        if let Some((profile, bw)) = &point {
            let tok_s = |r: &Row| r.cost.first().map(|c| c.tok_s);
            // B = 0 on the timeline too, not the plain row's §6 figure (which prices forced misses).
            let zero = |r: &Row| timeline_without_prefetch(r, first_profile.as_ref()?, *bw);
            let series = by_budget(&oos, key, tok_s, zero);
            html += &figure(
                &format!("tok/s on the timeline against the budget: {} ({profile} at {bw} GB/s)", chart_title(key)),
                &xy_plot(&series, &Axes::lines("budget B (proposals per token and layer)", "tokens per second"))?,
                &legend(&series),
                "The timeline of SEMANTICS.md §13 (one compute stream, one I/O channel; prefetch loads queue ahead \
                 of the demand loads of the layer; forced misses load nothing). B = 0 is the configuration without \
                 prefetch on the same timeline: compute plus its demand loads (misses − forced misses), not the \
                 §6 figure of its row, which also prices forced misses. Colour: policy; marker: predictor.",
            );
        }
    }
    html += &shuffled(&oos)?;
    let header = ["key", "precision", "coverage", "misses/token", "loads/token", "tok/s (first profile)"];
    let rows: Vec<Vec<String>> = oos
        .iter()
        .filter_map(|r| {
            let p = r.prefetch.as_ref()?;
            Some(vec![
                r.key.clone(),
                p.precision.map_or_else(|| "-".into(), |x| format!("{x:.4}")),
                p.coverage.map_or_else(|| "-".into(), |x| format!("{x:.4}")),
                format!("{:.4}", r.misses_per_token),
                format!("{:.4}", p.loads_per_token),
                r.cost.first().map_or_else(|| "-".into(), |c| format!("{:.3}", c.tok_s)),
            ])
        })
        .collect();
    html += &table(&header, &rows);
    Ok(html)
}

/// Misses per token in the real and in the shuffled order: per chart, one group per policy, one
/// bar per order (real, then each seed).
fn shuffled(oos: &[&Row]) -> Result<String> {
    let seed_of = |r: &Row| r.config.prefetch.filter(|p| p.prefetch.is_none()).and_then(|p| p.shuffle);
    let shuffled: Vec<&Row> =
        oos.iter().copied().filter(|r| r.config.deploy.is_none() && seed_of(r).is_some()).collect();
    let mut html = String::new();
    let charts: BTreeSet<ChartKey> = shuffled.iter().map(|r| chart_key(r)).collect();
    for key in &charts {
        let in_chart = |r: &&&Row| &chart_key(r) == key;
        let seeds: BTreeSet<u64> = shuffled.iter().filter(in_chart).filter_map(|r| seed_of(r)).collect();
        let pols: Vec<String> = {
            let mut p: Vec<String> = Vec::new();
            for r in shuffled.iter().filter(in_chart) {
                let name = r.config.policy.to_string();
                if !p.contains(&name) {
                    p.push(name);
                }
            }
            p
        };
        let misses = |pol: &str, seed: Option<u64>| {
            oos.iter()
                .find(|r| {
                    &chart_key(r) == key
                        && r.config.deploy.is_none()
                        && r.config.policy.to_string() == pol
                        && match seed {
                            None => r.config.prefetch.is_none(),
                            Some(_) => seed_of(r) == seed,
                        }
                })
                .map(|r| r.misses_per_token)
        };
        let mut series = vec![("real order".to_string(), pols.iter().map(|p| misses(p, None)).collect::<Vec<_>>())];
        for &s in &seeds {
            series.push((format!("shuffled (seed {s})"), pols.iter().map(|p| misses(p, Some(s))).collect()));
        }
        let colors: Vec<_> = (0..series.len()).map(color).collect();
        let labels: Vec<String> = series.iter().map(|s| s.0.clone()).collect();
        html += &figure(
            &format!("Misses per token, real against shuffled token order: {} (held-out trace)", chart_title(key)),
            &bar_plot(&pols, &series, &colors, "policy", "misses per token")?,
            &swatches(&labels, &colors),
            "The locality control of SEMANTICS.md §12: the same replay on a token-shuffled copy of the trace (a \
             seeded permutation of the token order, the same in every layer). The gap between the bars is what \
             temporal locality gives a policy; no gap means the hit rate comes from popularity alone.",
        );
    }
    Ok(html)
}
