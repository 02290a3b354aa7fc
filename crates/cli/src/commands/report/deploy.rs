//! The report's deployments section (SEMANTICS.md §9–§11): misses per token against the batch
//! size B, and the pinned / cached / tiered configurations side by side, from the rows of a
//! grid's `pin`, `tier2` and `batch` axes.

use std::collections::BTreeMap;

use anyhow::Result;
use sweep::{Row, Sample, SweepOutput};

use super::html::{figure, legend, swatches, table};
use super::svg::{Axes, Marker, Series, Style, bar_plot, color, mark_identical, policy_color, xy_plot};

/// (variant, policy, cap, k_used, pin, tier2) of a row: what a batch curve holds fixed.
type CurveKey = (String, String, usize, usize, String, String);

fn curve_key(r: &Row) -> CurveKey {
    let d = r.config.deploy.as_ref();
    (
        r.config.variant.clone(),
        r.config.policy.to_string(),
        r.config.cap,
        r.config.k_used,
        d.and_then(|d| d.pin.as_ref()).map_or_else(String::new, |p| format!("pin:{}", p.name)),
        d.and_then(|d| d.tier2).map_or_else(String::new, |t| format!("t2:{}:{}", t.policy, t.cap)),
    )
}

/// The deployment of a row in words: `LRU 16`, `pin:hot8 + lru 8`, `lru 8 / t2:lru:32`.
fn deployment_name(r: &Row) -> String {
    let (_, pol, cap, _, pin, t2) = curve_key(r);
    let mut s = if pin.is_empty() { format!("{pol} {cap}") } else { format!("{pin} + {pol} {cap}") };
    if !t2.is_empty() {
        s += &format!(" over {t2}");
    }
    s
}

/// The section; a note when the sweep has no deployed rows.
pub(super) fn section(sweep: &SweepOutput) -> Result<String> {
    // Rows of this section's axes only: no prefetch or shuffled order (the prefetch section's),
    // no hybrid execution (the hybrid section's), no per-layer caps (their memory is not one cap),
    // λ = 0.
    let oos: Vec<&Row> = sweep
        .rows
        .iter()
        .filter(|r| {
            r.sample == Sample::OutOfSample
                && r.config.lambda == 0.0
                && r.config.prefetch.is_none()
                && r.config.hybrid.is_none()
                && r.config.layer_caps.is_none()
        })
        .collect();
    if !oos.iter().any(|r| r.config.deploy.is_some()) {
        let hybrid = sweep
            .rows
            .iter()
            .filter(|r| r.sample == Sample::OutOfSample && r.config.hybrid.is_some() && r.config.deploy.is_some())
            .count();
        if hybrid > 0 {
            return Ok(format!(
                "<p>The {hybrid} deployed configurations of this sweep (held-out trace) all run hybrid execution \
                 (<code>exec</code> host, SEMANTICS.md §14): their misses are host runs, not loads, so they are \
                 drawn in the hybrid-execution section, not here.</p>"
            ));
        }
        return Ok("<p>No deployed configurations in this sweep. Add <code>pin</code>, <code>tier2</code> or \
                   <code>batch</code> lists to a grid block (docs/grid-format.md, docs/deployments.md) to compare \
                   pinned, cached and tiered memory and to see misses per token against the batch size.</p>"
            .into());
    }
    let mut html = String::new();
    // Misses per token against B: one curve per (variant, policy, cap, k_used, pin, tier2); B = 1
    // for the per-token row.
    let mut curves: BTreeMap<CurveKey, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &oos {
        let b = r.config.deploy.as_ref().and_then(|d| d.batch);
        if b.is_some()
            || oos
                .iter()
                .any(|o| curve_key(o) == curve_key(r) && o.config.deploy.as_ref().and_then(|d| d.batch).is_some())
        {
            curves.entry(curve_key(r)).or_default().push((b.unwrap_or(1) as f64, r.misses_per_token));
        }
    }
    if !curves.is_empty() {
        let mut series: Vec<Series> = curves
            .into_iter()
            .enumerate()
            .map(|(i, (k, mut points))| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                points.dedup_by(|a, b| a.0 == b.0);
                let (var, pol, cap, _, pin, t2) = k;
                let name = [format!("{pol} {cap}"), pin, t2, var]
                    .into_iter()
                    .filter(|s| !s.is_empty())
                    .collect::<Vec<_>>()
                    .join(", ");
                let style = Style { color: policy_color(&pol), marker: Marker::nth(i), dashed: false };
                Series::new(name, points, style)
            })
            .collect();
        // Equal curves (a policy that behaves as another here) are named and dashed, not hidden.
        mark_identical(&mut series);
        let axes = Axes { log_x: true, ..Axes::lines("batch size B (requests served at once)", "misses per token") };
        html += &figure(
            "Misses per token against the batch size B (held-out trace)",
            &xy_plot(&series, &axes)?,
            &legend(&series),
            "Re-batching (SEMANTICS.md §11): B slots take the trace's sequences; one load serves every row of a \
             step. B = 1 is the per-token replay.",
        );
    }
    // Pinned / cached / tiered side by side, per total memory (pins + cap) and k_used.
    let per_token: Vec<&Row> =
        oos.iter().copied().filter(|r| r.config.deploy.as_ref().is_none_or(|d| d.batch.is_none())).collect();
    // Per (memory, k_used, variant): a variant's rows side by side (a chart of every variant's
    // rows grew to thousands of pixels, its bars' labels alike).
    let mut groups: BTreeMap<(usize, usize, String), Vec<&Row>> = BTreeMap::new();
    for r in &per_token {
        let pins = r
            .config
            .deploy
            .as_ref()
            .and_then(|d| d.pin.as_ref())
            .map_or(0, |p| p.layers.iter().map(Vec::len).max().unwrap_or(0));
        groups.entry((pins + r.config.cap, r.config.k_used, r.config.variant.clone())).or_default().push(r);
    }
    for ((memory, k_used, variant), rows) in &mut groups {
        // The deployed rows and, beside them, the plain caches of their policies: the
        // configurations a deployment is compared with, not every plain row of the grid.
        let deployed: Vec<String> =
            rows.iter().filter(|r| r.config.deploy.is_some()).map(|r| r.config.policy.to_string()).collect();
        if deployed.is_empty() {
            continue;
        }
        rows.retain(|r| deployed.contains(&r.config.policy.to_string()));
        let parts = rows.len().div_ceil(MAX_BARS);
        for (part, rows) in rows.chunks(MAX_BARS).enumerate() {
            let title = if parts > 1 {
                format!(
                    "Pinned, cached and tiered at {memory} experts of fast memory per layer (variant {variant}, \
                     k_used {k_used}; part {} of {parts})",
                    part + 1
                )
            } else {
                format!(
                    "Pinned, cached and tiered at {memory} experts of fast memory per layer (variant {variant}, \
                     k_used {k_used})"
                )
            };
            html += &bars(&title, rows)?;
        }
    }
    let header = ["key", "misses/token", "pinned hits/token", "tier-2 hits/token", "storage reads/token", "loads/step"];
    let rows: Vec<Vec<String>> = oos
        .iter()
        .filter_map(|r| {
            let d = r.deploy.as_ref()?;
            let t = r.counts.tokens.max(1) as f64;
            Some(vec![
                r.key.clone(),
                format!("{:.4}", r.misses_per_token),
                format!("{:.4}", d.pinned_hits as f64 / t),
                format!("{:.4}", d.t2_hits as f64 / t),
                format!("{:.4}", d.storage_reads as f64 / t),
                format!("{:.2}", d.loads_per_step),
            ])
        })
        .collect();
    html += &table(&header, &rows);
    Ok(html)
}

/// Most bars in one chart (each 140 px wide): more rows of a group go to further charts.
const MAX_BARS: usize = 12;

/// One bar chart of `rows` (a variant's rows at one memory): misses and storage reads per token.
fn bars(title: &str, rows: &[&Row]) -> Result<String> {
    let names: Vec<String> = rows.iter().map(|r| deployment_name(r)).collect();
    let measures = [
        ("misses per token", rows.iter().map(|r| Some(r.misses_per_token)).collect::<Vec<_>>()),
        (
            "storage reads per token",
            rows.iter()
                .map(|r| {
                    let reads = r
                        .config
                        .deploy
                        .as_ref()
                        .map_or(r.counts.misses, |_| r.deploy.as_ref().map_or(0, |d| d.storage_reads));
                    Some(reads as f64 / r.counts.tokens.max(1) as f64)
                })
                .collect(),
        ),
    ];
    let series: Vec<(String, Vec<Option<f64>>)> = measures.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
    let colors = [color(0), color(1)];
    let labels: Vec<String> = series.iter().map(|s| s.0.clone()).collect();
    Ok(figure(
        title,
        &bar_plot(&names, &series, &colors, "deployment", "per token")?,
        &swatches(&labels, &colors),
        "Held-out trace. Memory per layer = pins (the largest layer's) + cap; a tier 2 adds slower memory \
         whose hits are not storage reads.",
    ))
}
