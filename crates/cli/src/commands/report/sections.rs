//! The sections of the report, one function each, over one [`Model`] of the sweep's rows.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use saliency::Retention;
use sweep::{Row, Sample, SummaryTable, SweepOutput};

use super::html::{esc, figure, layer_figure, legend, swatches, table};
use super::inputs::{MrcCurve, RetentionFile};
use super::svg::{Axes, Marker, Series, Style, bar_plot, color, gradient, mark_identical, policy_color, xy_plot};

/// The policy names of `rows`, in a stable order (first appearance in the sorted rows).
pub(super) fn policies(rows: &[&Row]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in rows {
        let p = r.config.policy.to_string();
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    seen
}

/// The variant labels of `rows`, in a stable order (first appearance).
fn variants(rows: &[&Row]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in rows {
        if !seen.contains(&r.config.variant) {
            seen.push(r.config.variant.clone());
        }
    }
    seen
}

/// Rows of the plain configurations (λ = 0, no pins, tier 2, batches, prefetch, shuffled order
/// or hybrid execution) of one sample.
fn plain(rows: &[Row], sample: Sample) -> Vec<&Row> {
    let plain = |r: &&Row| r.config.deploy.is_none() && r.config.prefetch.is_none() && r.config.hybrid.is_none();
    rows.iter().filter(|r| r.sample == sample && r.config.lambda == 0.0).filter(plain).collect()
}

/// (variant, policy, cap, k_used) groups of a set of rows, used as lookup keys.
type Key = (String, String, usize, usize);

fn by_key<'a>(rows: &[&'a Row]) -> BTreeMap<Key, &'a Row> {
    rows.iter()
        .map(|r| ((r.config.variant.clone(), r.config.policy.to_string(), r.config.cap, r.config.k_used), *r))
        .collect()
}

/// The out-of-sample λ = 0 rows of a sweep and what every plot looks them up by.
pub(super) struct Model<'a> {
    pub(super) sweep: &'a SweepOutput,
    /// Out-of-sample rows at λ = 0.
    oos: Vec<&'a Row>,
    pols: Vec<String>,
    vars: Vec<String>,
    lookup: BTreeMap<Key, &'a Row>,
    /// Plot cache sizes on a log axis (`report --log-x`).
    log_x: bool,
    /// GB of fast memory per expert slot of every layer (`layers · expert_mb / 1000`, the first
    /// device profile), and that profile's name.
    gb_per_cap: Option<(f64, String)>,
}

impl<'a> Model<'a> {
    /// The model of `sweep`'s rows.
    pub(super) fn new(sweep: &'a SweepOutput, log_x: bool) -> Model<'a> {
        let oos = plain(&sweep.rows, Sample::OutOfSample);
        let layers = sweep.rows.first().map_or(0, |r| r.counts.layer_misses.len());
        let gb_per_cap = sweep
            .provenance
            .grid
            .device_profiles()
            .ok()
            .and_then(|p| p.into_iter().next())
            .map(|p| (layers as f64 * p.expert_mb / 1000.0, p.name));
        Model { pols: policies(&oos), vars: variants(&oos), lookup: by_key(&oos), oos, sweep, log_x, gb_per_cap }
    }

    /// The unpruned variant when the grid has it (pruning mixes forced misses into a curve), and
    /// its `k_used`.
    fn first_variant(&self) -> (String, usize) {
        let first = self.vars.iter().find(|v| *v == "full").or(self.vars.first()).cloned().unwrap_or_default();
        let k_used = self.oos.iter().find(|r| r.config.variant == first).map_or(0, |r| r.config.k_used);
        (first, k_used)
    }

    /// One series per (variant, policy) for `vars` at `k_used` over the grid's caps: `y` of each
    /// row, coloured by policy, marked by variant.
    fn by_cap(
        &self,
        vars: &[String],
        k_used: usize,
        x: impl Fn(&Row) -> f64,
        y: impl Fn(&Row) -> Option<f64>,
    ) -> Vec<Series> {
        let caps: BTreeSet<usize> = self.oos.iter().map(|r| r.config.cap).collect();
        let mut series = Vec::new();
        for (vi, var) in vars.iter().enumerate() {
            for pol in &self.pols {
                let points: Vec<(f64, f64)> = caps
                    .iter()
                    .filter_map(|&c| self.lookup.get(&(var.clone(), pol.clone(), c, k_used)))
                    .filter_map(|r| Some((x(r), y(r)?)))
                    .collect();
                if !points.is_empty() {
                    let style = Style { color: policy_color(pol), marker: Marker::nth(vi), dashed: false };
                    let name = if vars.len() > 1 { format!("{pol}, {var}") } else { pol.clone() };
                    series.push(Series::new(name, points, style));
                }
            }
        }
        mark_identical(&mut series);
        series
    }
}

/// The summary section: the same table as `summary.md` ([`SummaryTable`]).
pub(super) fn summary(m: &Model<'_>) -> String {
    let t = SummaryTable::of(m.sweep);
    let header: Vec<&str> = t.columns.iter().map(|c| c.name).collect();
    format!(
        "<p>Misses per token (expert loads per token, all layers; lower is better); configurations as \
         policy/λ/j. The best online policy (Belady excluded: it is an offline oracle) is chosen on the in-sample \
         trace; <b>out-of-sample (in-sample choice)</b> is what that choice gives on the held-out trace, \
         <b>shift</b> the difference; <b>out-of-sample (best)</b> is the best online configuration on the \
         held-out trace. The same table is the sweep's <code>summary.md</code>.</p>{}",
        table(&header, &t.rows)
    )
}

/// Misses per token by policy and variant: one bar chart per (cap, k_used), out of sample, and
/// the matrix of every figure.
pub(super) fn policies_section(m: &Model<'_>) -> Result<String> {
    let groups: BTreeSet<(usize, usize)> = m.oos.iter().map(|r| (r.config.cap, r.config.k_used)).collect();
    let mut html = String::from(
        "<p>Out-of-sample misses per token at λ = 0, one bar per policy (one colour per policy on every plot of \
         this page), grouped by variant (keep map). Belady is the offline optimum: a lower bound of every online \
         policy when every token counts; counted after the warmup it may exceed one by up to the cap per layer.</p>",
    );
    let colors: Vec<_> = m.pols.iter().map(|p| policy_color(p)).collect();
    for &(cap, k_used) in &groups {
        let series: Vec<(String, Vec<Option<f64>>)> = m
            .pols
            .iter()
            .map(|pol| {
                let v = m
                    .vars
                    .iter()
                    .map(|var| m.lookup.get(&(var.clone(), pol.clone(), cap, k_used)).map(|r| r.misses_per_token))
                    .collect();
                (pol.clone(), v)
            })
            .collect();
        html += &figure(
            &format!("cap {cap} experts per layer, k_used {k_used}"),
            &bar_plot(&m.vars, &series, &colors, "variant", "misses per token")?,
            &swatches(&m.pols, &colors),
            "Each bar is one configuration replayed on the held-out trace.",
        );
    }
    html += &matrix_table(&m.sweep.rows);
    Ok(html)
}

/// Miss ratio and tok/s against cache size and memory, and the per-layer hit-rate curves.
pub(super) fn capacity(m: &Model<'_>, mrc: &[MrcCurve]) -> Result<String> {
    let mut html = String::new();
    let caps: BTreeSet<usize> = m.oos.iter().map(|r| r.config.cap).collect();
    let (first, k_used) = m.first_variant();
    // The unpruned variant and, marked apart, the one pruned variant of a grid that has two.
    let vars: Vec<String> = if m.vars.len() == 2 { m.vars.clone() } else { vec![first.clone()] };
    let x = "cache size (experts per layer)";
    if caps.len() >= 2 {
        let series = m.by_cap(&vars, k_used, |r| r.config.cap as f64, |r| Some(1.0 - r.hit_rate));
        let gb = m.gb_per_cap.as_ref().map(|(f, p)| (format!("fast memory for the cache, GB ({p})"), *f));
        let axes = Axes {
            log_x: m.log_x,
            top_x: gb.as_ref().map(|(l, f)| (l.as_str(), *f)),
            unit_y: true,
            ..Axes::lines(x, "miss ratio (misses / picks)")
        };
        html += &figure(
            &format!(
                "variant {}: miss ratio vs cache size, by policy (out of sample, λ = 0, k_used {k_used})",
                vars.join(", ")
            ),
            &xy_plot(&series, &axes)?,
            &legend(&series),
            "Miss ratio = misses / picks over all layers (1 − hit rate); a pruned variant's curve includes the \
             misses its keep map forces. Top axis: the cache's memory at the first device profile's expert size. \
             <code>report --log-x</code> draws the cache size on a log scale. A series equal to an earlier one is \
             dashed with hollow markers and named <i>(= …)</i>.",
        );
        if let Some((f, profile)) = &m.gb_per_cap {
            let tok = |r: &Row| r.cost.first().map(|c| c.tok_s);
            let series = m.by_cap(&vars, k_used, |r| r.config.cap as f64 * f, tok);
            let bw = m.oos.first().and_then(|r| r.cost.first()).map_or(0.0, |c| c.bandwidth_gbps);
            if !series.is_empty() {
                let y = format!("tok/s at {bw} GB/s ({profile})");
                html += &figure(
                    &format!(
                        "variant {}: tok/s vs memory budget, by policy (out of sample, λ = 0, k_used {k_used})",
                        vars.join(", ")
                    ),
                    &xy_plot(&series, &Axes::lines("memory budget for the expert cache, GB", &y))?,
                    &legend(&series),
                    "Memory = cap × layers × expert size of the profile; tok/s from the cost model (SEMANTICS.md §6) at \
                     the grid's first profile and bandwidth.",
                );
            }
        }
    }
    let layer_axes = Axes { unit_y: true, log_x: m.log_x, ..Axes::lines(x, "hit rate") };
    if mrc.is_empty() {
        let pol = m.pols.iter().find(|p| *p == "lru").or(m.pols.first());
        if let (true, Some(pol)) = (caps.len() >= 2, pol) {
            let rows: Vec<&Row> =
                caps.iter().filter_map(|&c| m.lookup.get(&(first.clone(), pol.clone(), c, k_used)).copied()).collect();
            let layers = rows.first().map_or(0, |r| r.counts.layer_misses.len());
            let series: Vec<Series> = (0..layers)
                .map(|l| {
                    let points = rows
                        .iter()
                        .map(|r| {
                            let picks = (r.counts.tokens * r.config.k_used as u64).max(1) as f64;
                            (r.config.cap as f64, 1.0 - r.counts.layer_misses[l] as f64 / picks)
                        })
                        .collect();
                    Series::new(format!("layer {l}"), points, Style::of(gradient(l, layers)))
                })
                .collect();
            html += &layer_figure(
                &format!("variant {first}, {pol}: hit rate vs cache size per layer (layer index in the trace)"),
                &series,
                &layer_axes,
                "From the sweep's per-layer misses at the grid's caps. Save the output of <code>moe-offload mrc</code> \
                 as a .json file in the report directory (or pass <code>--mrc FILE</code>) for the curve at every \
                 cache size.",
            )?;
        }
    } else {
        for c in mrc {
            let n = c.layers.len();
            let series: Vec<Series> = c
                .layers
                .iter()
                .enumerate()
                .map(|(i, (id, pts))| Series::new(format!("layer {id}"), pts.clone(), Style::of(gradient(i, n))))
                .collect();
            html += &layer_figure(
                &format!("miss-ratio curve {}: hit rate vs cache size per layer", c.label),
                &series,
                &layer_axes,
                "One line per layer (the layer's id in the model), from the miss-ratio curve file.",
            )?;
        }
    }
    if html.is_empty() {
        html = "<p>The grid has a single cache size and no miss-ratio curve was found: nothing to plot.</p>".into();
    }
    Ok(html)
}

/// Misses vs λ: one chart per (variant, cap, k_used), one line per (policy, j): colour by policy,
/// marker by j.
pub(super) fn lambda(m: &Model<'_>) -> Result<String> {
    type LamKey = (String, usize, usize, String, usize);
    let mut lam: BTreeMap<LamKey, Vec<(f64, f64)>> = BTreeMap::new();
    let all_oos = m.sweep.rows.iter().filter(|r| r.sample == Sample::OutOfSample);
    for r in all_oos.filter(|r| r.config.lambda > 0.0 && r.config.prefetch.is_none() && r.config.hybrid.is_none()) {
        let c = &r.config;
        lam.entry((c.variant.clone(), c.cap, c.k_used, c.policy.to_string(), c.j))
            .or_default()
            .push((c.lambda, r.misses_per_token));
    }
    if lam.is_empty() {
        return Ok("<p>The grid has no λ > 0 configurations (cache-aware routing): nothing to plot.</p>".into());
    }
    let js: Vec<usize> = lam.keys().map(|k| k.4).collect::<BTreeSet<_>>().into_iter().collect();
    let mut html = String::new();
    let charts: BTreeSet<(String, usize, usize)> = lam.keys().map(|k| (k.0.clone(), k.1, k.2)).collect();
    for (var, cap, k_used) in charts {
        let mut series = Vec::new();
        for ((_, _, _, pol, j), pts) in lam.iter().filter(|(k, _)| k.0 == var && k.1 == cap && k.2 == k_used) {
            let mut pts = pts.clone();
            if let Some(r) = m.lookup.get(&(var.clone(), pol.clone(), cap, k_used)) {
                pts.push((0.0, r.misses_per_token));
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let marker = Marker::nth(js.iter().position(|x| x == j).unwrap_or(0));
            let style = Style { color: policy_color(pol), marker, dashed: false };
            series.push(Series::new(format!("{pol} j={j}"), pts, style));
        }
        mark_identical(&mut series);
        html += &figure(
            &format!("variant {var}, cap {cap}, k_used {k_used}: misses per token vs λ (out of sample)"),
            &xy_plot(&series, &Axes::lines("λ (cache-aware routing strength)", "misses per token"))?,
            &legend(&series),
            "Colour: policy; marker: j. λ = 0 is plain routing (the same row for every j). Larger λ routes more \
             picks to cached experts: fewer misses, more substituted experts (results.csv, column substituted). A \
             series equal to an earlier one is dashed with hollow markers and named <i>(= …)</i>.",
        );
    }
    Ok(html)
}

/// In-sample vs out-of-sample: every configuration as a point, and the per-policy table.
pub(super) fn shift(m: &Model<'_>) -> Result<String> {
    let rows = &m.sweep.rows;
    let ins: BTreeMap<&str, &Row> =
        rows.iter().filter(|r| r.sample == Sample::InSample).map(|r| (r.key.as_str(), r)).collect();
    // Hybrid rows count exactly the misses of their `exec transfer` twins (§14): not twice here.
    let all_oos: Vec<&Row> =
        rows.iter().filter(|r| r.sample == Sample::OutOfSample && r.config.hybrid.is_none()).collect();
    let series: Vec<Series> = policies(&all_oos)
        .iter()
        .map(|pol| {
            let points = all_oos
                .iter()
                .filter(|r| &r.config.policy.to_string() == pol)
                .filter_map(|r| ins.get(r.key.as_str()).map(|i| (i.misses_per_token, r.misses_per_token)))
                .collect();
            Series::new(pol.clone(), points, Style::of(policy_color(pol)))
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let mut html = String::new();
    if !series.is_empty() {
        let axes = Axes {
            lines: false,
            diagonal: true,
            ..Axes::lines("in-sample misses per token", "out-of-sample misses per token")
        };
        html += &figure(
            "every configuration: in-sample vs out-of-sample misses per token",
            &xy_plot(&series, &axes)?,
            &legend(&series),
            "Points above the grey diagonal do worse on the held-out trace than on the calibration trace.",
        );
    }
    html += &shift_table(rows);
    Ok(html)
}

/// The provenance table.
pub(super) fn provenance(sweep: &SweepOutput) -> String {
    let p = &sweep.provenance;
    let prov = table(
        &["field", "value"],
        &[
            vec!["tool version".into(), p.tool_version.clone()],
            vec!["grid".into(), p.grid.name.clone()],
            vec!["in-sample trace".into(), format!("{} ({})", p.in_sample.source, p.in_sample.digest)],
            vec!["out-of-sample trace".into(), format!("{} ({})", p.out_of_sample.source, p.out_of_sample.digest)],
            vec!["in-sample statistics sha256".into(), p.stats_sha256.clone()],
            vec!["warmup tokens".into(), p.grid.warmup.to_string()],
            vec!["rows".into(), sweep.rows.len().to_string()],
            vec!["shard".into(), sweep.shard.map_or("whole run".into(), |s| format!("{}/{}", s.index, s.count))],
        ],
    );
    prov.replace("<table>", "<table class=\"kv\">")
}

/// Out-of-sample matrix: per (variant, cap, k_used) a row, per policy misses per token / hit
/// rate / tok/s (first profile and bandwidth), like the README's table.
fn matrix_table(rows: &[Row]) -> String {
    let oos = plain(rows, Sample::OutOfSample);
    let pols = policies(&oos);
    let lookup = by_key(&oos);
    let cost_name = oos
        .first()
        .and_then(|r| r.cost.first())
        .map(|c| format!("tok/s at {} GB/s ({})", c.bandwidth_gbps, c.profile))
        .unwrap_or_else(|| "tok/s".into());
    let mut groups: Vec<(String, usize, usize)> = Vec::new();
    for r in &oos {
        let g = (r.config.variant.clone(), r.config.cap, r.config.k_used);
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    let body: Vec<Vec<String>> = groups
        .iter()
        .map(|(v, cap, k)| {
            let mut row = vec![v.clone(), cap.to_string(), k.to_string()];
            for p in &pols {
                row.push(lookup.get(&(v.clone(), p.clone(), *cap, *k)).map_or("-".into(), |r| {
                    let tok = r.cost.first().map_or("-".into(), |c| format!("{:.2}", c.tok_s));
                    format!("{:.2} / {:.3} / {tok}", r.misses_per_token, r.hit_rate)
                }));
            }
            row
        })
        .collect();
    let mut header: Vec<&str> = vec!["variant", "cap", "k_used"];
    header.extend(pols.iter().map(String::as_str));
    format!("<h3>Out of sample, λ = 0: misses per token / hit rate / {}</h3>{}", esc(&cost_name), table(&header, &body))
}

/// Per policy (λ = 0), the mean over configurations of in-sample and out-of-sample misses per
/// token and the mean shift.
fn shift_table(rows: &[Row]) -> String {
    let ins: BTreeMap<&str, &Row> =
        rows.iter().filter(|r| r.sample == Sample::InSample).map(|r| (r.key.as_str(), r)).collect();
    let oos: Vec<&Row> = rows.iter().filter(|r| r.sample == Sample::OutOfSample && r.config.hybrid.is_none()).collect();
    let mut per: BTreeMap<String, (f64, f64, f64, usize)> = BTreeMap::new();
    for r in &oos {
        if let Some(i) = ins.get(r.key.as_str()) {
            let e = per.entry(r.config.policy.to_string()).or_insert((0.0, 0.0, f64::NEG_INFINITY, 0));
            e.0 += i.misses_per_token;
            e.1 += r.misses_per_token;
            e.2 = e.2.max(r.misses_per_token - i.misses_per_token);
            e.3 += 1;
        }
    }
    let body: Vec<Vec<String>> = per
        .iter()
        .map(|(p, (i, o, m, n))| {
            let n = *n as f64;
            vec![
                p.clone(),
                format!("{}", n as usize),
                format!("{:.4}", i / n),
                format!("{:.4}", o / n),
                format!("{:+.4}", (o - i) / n),
                format!("{m:+.4}"),
            ]
        })
        .collect();
    format!(
        "<h3>Per policy, every configuration (λ ≥ 0)</h3>{}",
        table(
            &["policy", "configurations", "mean in-sample", "mean out-of-sample", "mean shift", "largest shift"],
            &body
        )
    )
}

/// Retention vs K per metric for one `retention --json` file (the mean over layers as a line,
/// shaded down to the per-layer minimum), and its table.
pub(super) fn retention(rf: &RetentionFile) -> Result<String> {
    let reap = rf.rows.iter().any(|r| r.mean.reap_retention.is_some());
    let (mass, get): (&str, fn(&saliency::RetentionFigures) -> Option<f64>) =
        if reap { ("reap_retention", |f| f.reap_retention) } else { ("gate_retention", |f| f.gate_retention) };
    let mut by_metric: BTreeMap<String, Vec<(f64, f64, f64)>> = BTreeMap::new();
    for r in &rf.rows {
        let Some((metric, k)) = r.label.split_once('@') else { continue };
        let Ok(k) = k.parse::<f64>() else { continue };
        if let (Some(mean), Some(min)) = (get(&r.mean), get(&r.min)) {
            by_metric.entry(metric.to_string()).or_default().push((k, mean, min));
        }
    }
    let mut html = String::new();
    let series: Vec<Series> = by_metric
        .into_iter()
        .enumerate()
        .map(|(i, (name, mut points))| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut s = Series::new(name, points.iter().map(|p| (p.0, p.1)).collect(), Style::of(color(i)));
            s.band = Some(points.iter().map(|p| (p.0, p.2)).collect());
            s
        })
        .collect();
    if !series.is_empty() {
        let y = format!("{mass} over layers: mean, band to the minimum");
        let axes = Axes { unit_y: true, ..Axes::lines("K (experts kept per layer)", &y) };
        html += &figure(
            &format!("held out: {} ({})", rf.heldout, rf.path.display()),
            &xy_plot(&series, &axes)?,
            &legend(&series),
            "Line: the mean over layers; shaded band: down to the layer with the lowest retention. Uniform-K maps \
             (METRIC@K) only; budget maps and <code>full</code> are in the table.",
        );
    }
    let fmt = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |x| format!("{x:.4}"));
    // Table order: metric, then K numerically (budget maps and `full` after the numeric ones).
    let mut ordered: Vec<&Retention> = rf.rows.iter().collect();
    ordered.sort_by_key(|r| {
        let (m, k) = r.label.split_once('@').unwrap_or((r.label.as_str(), ""));
        (m.to_string(), k.parse::<u64>().unwrap_or(u64::MAX), k.to_string())
    });
    let rows: Vec<Vec<String>> = ordered
        .iter()
        .map(|r| {
            vec![
                r.label.clone(),
                fmt(get(&r.mean)),
                fmt(get(&r.min)),
                format!("{:.4}", r.mean.slot_replacement),
                format!("{:.4}", r.max_slot_replacement),
                fmt(r.mean.prob_retention),
                fmt(r.min.prob_retention),
                r.mean.zero_hit_kept.to_string(),
            ]
        })
        .collect();
    let h1 = format!("{mass} mean");
    let h2 = format!("{mass} min");
    html += &table(
        &[
            "map",
            &h1,
            &h2,
            "slot_replacement mean",
            "slot_replacement max",
            "prob_retention mean",
            "prob_retention min",
            "kept, 0 held-out hits",
        ],
        &rows,
    );
    Ok(html)
}
