//! The report's hybrid-execution section (SEMANTICS.md §14), from the rows of a grid's `exec`
//! and `overlap` axes: tok/s against the experts per layer on the GPU, sequential against
//! concurrent, with the all-CPU baseline (no pins, cap 0) as the floor and the point where more
//! GPU experts stop helping marked.
//!
//! Experts per layer on the GPU of a row = its pinned experts (the mean over layers of the pin
//! map's per-layer sizes) + its cache size (the mean of its per-layer caps, when it has them):
//! §9's memory per layer, `|pins| + cap`. A curve holds everything else fixed: profile, variant,
//! policy, k_used, λ and j, exec, the step schedule, and how the GPU experts are held (pinned,
//! cached, or both). The floor row (no pins, cap 0) belongs to every curve of its chart.

use std::collections::BTreeMap;

use anyhow::Result;
use cachesim::hybrid::Overlap;
use sweep::{Row, Sample, SweepOutput};

use super::html::{esc, figure, legend, table};
use super::svg::{Axes, Marker, Series, Style, color, mark_identical, policy_color, xy_plot};

/// A curve's plateau: the fewest GPU experts per layer whose tok/s is within this fraction of
/// the curve's best (0.5%). The point where more GPU experts stop helping; at the curve's last
/// point when tok/s still rises there.
pub(super) const PLATEAU: f64 = 0.005;

/// How a row holds its GPU experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Residency {
    /// No pins, cap 0: every pick a host run (the floor).
    None,
    /// Pinned experts only (cap 0).
    Pins,
    /// A cache only (no pins), filled by background copies.
    Cache,
    /// Pins and a cache.
    Both,
}

impl Residency {
    fn name(self) -> &'static str {
        match self {
            Residency::None => "all-CPU",
            Residency::Pins => "pinned",
            Residency::Cache => "cache",
            Residency::Both => "pinned + cache",
        }
    }
}

/// What one chart holds fixed: (profile, variant, k_used, λ, j, exec, batch / served).
type ChartKey = (String, String, usize, String, usize, String, String);

/// What one curve of a chart holds fixed besides the chart's key: (residency, policy, overlap).
type CurveKey = (Residency, String, Overlap);

/// The pinned experts per layer (mean over layers) and the cache size per layer (mean of the
/// per-layer caps) of a row.
fn gpu_experts(r: &Row) -> (f64, f64) {
    let pins = r
        .config
        .deploy
        .as_ref()
        .and_then(|d| d.pin.as_ref())
        .map_or(0.0, |p| p.layers.iter().map(Vec::len).sum::<usize>() as f64 / p.layers.len().max(1) as f64);
    let cap = r
        .config
        .layer_caps
        .as_ref()
        .map_or(r.config.cap as f64, |c| c.caps.iter().sum::<usize>() as f64 / c.caps.len().max(1) as f64);
    (pins, cap)
}

fn residency(r: &Row) -> Residency {
    let (pins, cap) = gpu_experts(r);
    match (pins > 0.0, cap > 0.0) {
        (false, false) => Residency::None,
        (true, false) => Residency::Pins,
        (false, true) => Residency::Cache,
        (true, true) => Residency::Both,
    }
}

fn chart_key(r: &Row, profile: &str) -> Option<ChartKey> {
    let c = &r.config;
    let h = c.hybrid?;
    let schedule = c.deploy.as_ref().and_then(|d| d.batch).map_or_else(String::new, |b| format!("batch {b}"));
    Some((profile.to_string(), c.variant.clone(), c.k_used, c.lambda.to_string(), c.j, h.exec.to_string(), schedule))
}

fn chart_title(k: &ChartKey) -> String {
    let (profile, variant, k_used, lambda, j, exec, schedule) = k;
    let mut s = format!("{profile}: exec {exec}, variant {variant}, k_used {k_used}");
    if lambda != "0" {
        s += &format!(", λ {lambda}, j {j}");
    }
    if !schedule.is_empty() {
        s += &format!(", {schedule}");
    }
    s
}

/// The plateau of a curve sorted by x: the first point within [`PLATEAU`] of the curve's best
/// tok/s, and whether tok/s still rises after it (the plateau is the last point).
pub(super) fn plateau(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let best = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    points.iter().copied().find(|p| p.1 >= best * (1.0 - PLATEAU))
}

/// The section; a note when the sweep has no hybrid rows.
pub(super) fn section(sweep: &SweepOutput) -> Result<String> {
    let oos: Vec<&Row> = sweep
        .rows
        .iter()
        .filter(|r| r.sample == Sample::OutOfSample && r.config.hybrid.is_some() && r.hybrid.is_some())
        .collect();
    if oos.is_empty() {
        return Ok("<p>No hybrid-execution configurations in this sweep. Add <code>\"exec\": [\"host\"]</code> (and \
                   <code>\"overlap\": [\"sequential\", \"concurrent\"]</code>) to a grid block with <code>pin</code> \
                   maps of growing size and <code>cap: [0]</code> (docs/hybrid.md, docs/grid-format.md) to see tok/s \
                   against the experts per layer on the GPU.</p>"
            .into());
    }
    // Per chart, per curve: (experts per layer on the GPU, tok/s); the floor rows per overlap.
    let mut charts: BTreeMap<ChartKey, BTreeMap<CurveKey, Vec<(f64, f64)>>> = BTreeMap::new();
    let mut floors: BTreeMap<ChartKey, BTreeMap<Overlap, f64>> = BTreeMap::new();
    for r in &oos {
        let (pins, cap) = gpu_experts(r);
        let res = residency(r);
        for e in &r.hybrid.as_ref().expect("filtered").cost {
            let Some(ck) = chart_key(r, &e.profile) else { continue };
            if res == Residency::None {
                floors.entry(ck.clone()).or_default().insert(e.overlap, e.tok_s);
            }
            let curve = (res, r.config.policy.to_string(), e.overlap);
            charts.entry(ck).or_default().entry(curve).or_default().push((pins + cap, e.tok_s));
        }
    }
    let mut html = String::from(
        "<p>Out of sample, every configuration with <code>exec</code> host (SEMANTICS.md §14: a chosen expert not \
         resident on the GPU is computed on the CPU from host memory). x: the experts per layer on the GPU, pinned \
         (the mean of the pin map's layer sizes) plus cached (the cap); y: tok/s of the §14 cost on the chart's \
         profile. Colour: how the GPU experts are held (pinned, cached, both) when a chart has one policy, else \
         one colour per policy as on every plot; circles for <b>sequential</b> overlap (the CPU part of \
         a layer, then its GPU part: llama.cpp), triangles for <b>concurrent</b> (both at once: kTransformers). The \
         grey dashed lines are the all-CPU floor (no pins, cap 0), one per overlap. A cross marks where more GPU \
         experts stop helping: the fewest experts per layer within 0.5% of the curve's best tok/s (none on a \
         curve still rising at its last point; the table says which).</p>",
    );
    for (ck, curves) in &charts {
        let floor = floors.get(ck);
        let (mut lines, mut marks, mut stops) = (Vec::new(), Vec::new(), Vec::new());
        let mut xmax: f64 = 0.0;
        // One policy (the usual case: a policy does nothing at cap 0): colour by residency, so
        // that pinned and cached curves differ; several: one colour per policy, as everywhere.
        let one_policy = curves.keys().map(|k| &k.1).collect::<std::collections::BTreeSet<_>>().len() == 1;
        let colour = |res: Residency, pol: &str| if one_policy { color(res as usize) } else { policy_color(pol) };
        for ((res, pol, overlap), points) in curves {
            if *res == Residency::None && curves.keys().any(|k| k.0 != Residency::None) {
                continue; // drawn as the floor and as the first point of every other curve
            }
            let floor_t = floor.and_then(|f| f.get(overlap)).copied();
            let mut points = points.clone();
            if let Some(f) = floor_t.filter(|_| *res != Residency::None) {
                points.push((0.0, f));
            }
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            points.dedup_by(|a, b| a.0 == b.0);
            xmax = points.iter().map(|p| p.0).fold(xmax, f64::max);
            let marker = if *overlap == Overlap::Concurrent { Marker::Triangle } else { Marker::Circle };
            let name = format!("{} {pol}, {overlap}", res.name());
            if let Some(stop) = plateau(&points) {
                let best = points.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
                let rising = points.last().is_some_and(|p| p.0 == stop.0) && points.len() > 1;
                // A curve still rising at its last point has not stopped helping: no point to name.
                let (at, there) = if rising {
                    (format!("not within its range (still rising at {})", fmt_x(stop.0)), "-".into())
                } else {
                    (fmt_x(stop.0), format!("{:.2}", stop.1))
                };
                stops.push(vec![
                    name.clone(),
                    floor_t.map_or("-".into(), |f| format!("{f:.2}")),
                    format!("{best:.2}"),
                    at,
                    there,
                    if rising { "no: still rising at the last point".into() } else { "yes".into() },
                ]);
                if !rising {
                    let style = Style { color: colour(*res, pol), marker: Marker::Cross, dashed: false };
                    let label = format!("{name}: stops helping at {}", fmt_x(stop.0));
                    marks.push(Series::new(label, vec![stop], style));
                }
            }
            lines.push(Series::new(name, points, Style { color: colour(*res, pol), marker, dashed: false }));
        }
        // Equal curves (policies that behave alike at cap 0) are named and dashed, not hidden.
        mark_identical(&mut lines);
        let mut drawn = lines;
        drawn.append(&mut marks);
        if let Some(f) = floor {
            for (overlap, &t) in f {
                let style = Style {
                    color: color(7),
                    marker: Marker::nth(usize::from(*overlap == Overlap::Concurrent)),
                    dashed: true,
                };
                drawn.push(Series::new(
                    format!("all-CPU floor, {overlap}: {t:.2} tok/s"),
                    vec![(0.0, t), (xmax, t)],
                    style,
                ));
            }
        }
        html += &figure(
            &format!("tok/s against experts per layer on the GPU ({})", chart_title(ck)),
            &xy_plot(
                &drawn,
                &Axes::lines("experts per layer on the GPU (pinned + cached)", "tok/s (SEMANTICS.md §14)"),
            )?,
            &legend(&drawn),
            "Held-out trace. Under concurrent overlap a layer's step costs the longer of its CPU and GPU parts, so \
             once the CPU part is the shorter one more GPU experts buy nothing; under sequential every host run \
             adds its time.",
        );
        html += &format!("<h3>{}: where more GPU experts stop helping</h3>", esc(&chart_title(ck)));
        let header =
            ["curve", "floor tok/s", "best tok/s", "stops helping at (experts/layer)", "tok/s there", "plateau"];
        html += &table(&header, &stops);
    }
    Ok(html)
}

/// Experts per layer as printed: an integer when it is one, else two decimals.
fn fmt_x(x: f64) -> String {
    if x.fract() == 0.0 { format!("{x:.0}") } else { format!("{x:.2}") }
}

#[cfg(test)]
mod tests {
    use super::plateau;

    /// (points, expected plateau): the first point within 0.5% of the best.
    #[test]
    fn plateau_is_the_first_point_near_the_best() {
        let check =
            |points: &[(f64, f64)], expect: Option<(f64, f64)>| assert_eq!(plateau(points), expect, "{points:?}");
        // Qwen concurrent (docs/hybrid.md): 239.7 is within 0.5% of 240.0, 237.7 is not.
        check(
            &[(0.0, 231.0), (8.0, 237.7), (16.0, 239.7), (32.0, 240.0), (48.0, 240.0), (60.0, 240.0)],
            Some((16.0, 239.7)),
        );
        // ESFT sequential: still rising at the last point.
        check(&[(0.0, 11.26), (16.0, 15.01), (64.0, 50.0)], Some((64.0, 50.0)));
        // A flat curve stops at its first point.
        check(&[(0.0, 5.0), (8.0, 5.0)], Some((0.0, 5.0)));
        check(&[], None);
    }
}
