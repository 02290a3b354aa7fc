//! `moe-offload report`: one self-contained HTML page (inline SVG, no network) of the plots and
//! tables of a sweep directory, plus the retention tables and miss-ratio curves found beside it.
//! `docs/report.md` describes every plot.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use saliency::Retention;
use sweep::{Row, Sample, SweepOutput};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A `moe-offload sweep -o DIR` output directory (holding results.json). Retention tables
    /// (`retention --json` output) and miss-ratio curves (`mrc` output) saved as *.json in it are
    /// plotted too.
    pub dir: PathBuf,
    /// The HTML file to write (default: DIR/report.html; `-` for stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// More `retention --json` files to plot (besides those found in DIR).
    #[arg(long, value_name = "FILE")]
    pub retention: Vec<PathBuf>,
    /// More miss-ratio-curve JSON files to plot (besides those found in DIR).
    #[arg(long, value_name = "FILE")]
    pub mrc: Vec<PathBuf>,
}

/// Tableau 10: distinguishable, colour-blind-friendlier than plotters' default palette.
const PALETTE: [(u8, u8, u8); 10] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (127, 127, 127),
    (188, 189, 34),
    (23, 190, 207),
];

fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// A sequential colour (viridis-like) for item `i` of `n`: for many ordered series such as layers.
fn gradient(i: usize, n: usize) -> RGBColor {
    const STOPS: [(f64, f64, f64); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    // Stop short of the last (pale yellow) stop, which is hard to see on white.
    let t = if n <= 1 { 0.0 } else { i as f64 / (n - 1) as f64 } * 0.85 * (STOPS.len() - 1) as f64;
    let k = (t.floor() as usize).min(STOPS.len() - 2);
    let f = t - k as f64;
    let (a, b) = (STOPS[k], STOPS[k + 1]);
    let mix = |x: f64, y: f64| (x + (y - x) * f).round().clamp(0.0, 255.0) as u8;
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

fn css(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

fn hex(i: usize) -> String {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// One `retention --json` file.
struct RetentionFile {
    path: PathBuf,
    rows: Vec<Retention>,
    heldout: String,
}

/// A miss-ratio curve, reduced to what the report plots: hit rate per cap, per layer.
struct MrcCurve {
    label: String,
    /// (layer id, points (cap, hit rate)).
    layers: Vec<(String, Vec<(f64, f64)>)>,
}

/// Runs `report`.
pub fn run(a: &ReportArgs) -> Result<()> {
    let results = a.dir.join("results.json");
    if !results.is_file() {
        anyhow::bail!(
            "{} has no results.json: give the output directory of a sweep (`moe-offload sweep -o {}` writes one)",
            a.dir.display(),
            a.dir.display()
        );
    }
    let sweep = SweepOutput::read(&results)?;
    let mut retention = Vec::new();
    let mut mrc = Vec::new();
    let mut skipped = Vec::new();
    let mut found: Vec<PathBuf> = std::fs::read_dir(&a.dir)
        .with_context(|| format!("listing {}", a.dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.file_name().is_some_and(|n| n != "results.json"))
        .collect();
    found.sort();
    for p in &found {
        match classify(p)? {
            Extra::Retention(r) => retention.push(r),
            Extra::Mrc(c) => mrc.extend(c),
            Extra::Other => skipped.push(p.clone()),
        }
    }
    for p in &a.retention {
        match classify(p)? {
            Extra::Retention(r) => retention.push(r),
            _ => anyhow::bail!(
                "{}: not a retention table; write one with `moe-offload retention MAPS... --heldout H --json > FILE`",
                p.display()
            ),
        }
    }
    for p in &a.mrc {
        match classify(p)? {
            Extra::Mrc(c) => mrc.extend(c),
            _ => anyhow::bail!(
                "{}: not a miss-ratio curve (expected per-layer `misses` from `min_cap`, or `caps` and `hit_rate`)",
                p.display()
            ),
        }
    }
    let output = a.output.clone().unwrap_or_else(|| a.dir.join("report.html"));
    super::refuse_overwrite(
        &output,
        [results.as_path()].into_iter().chain(found.iter().chain(&a.retention).chain(&a.mrc).map(PathBuf::as_path)),
    )?;
    let html = render(&sweep, &retention, &mrc).context("drawing the plots")?;
    super::write_output(&output, html.as_bytes())?;
    let mut out = super::human(&output);
    writeln!(
        out,
        "wrote {}: {} rows, {} retention tables, {} miss-ratio curves",
        output.display(),
        sweep.rows.len(),
        retention.len(),
        mrc.len()
    )?;
    for p in skipped {
        writeln!(out, "note: {} is neither a retention table nor a miss-ratio curve; not plotted", p.display())?;
    }
    Ok(())
}

enum Extra {
    Retention(RetentionFile),
    Mrc(Vec<MrcCurve>),
    Other,
}

/// Reads a JSON file and decides what it is: a `retention --json` table, a miss-ratio curve, or
/// something else.
fn classify(path: &Path) -> Result<Extra> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(Extra::Other) };
    if let Some(items) = v.as_array()
        && !items.is_empty()
        && items.iter().all(|i| i.get("per_layer").is_some() && i.get("label").is_some())
    {
        let rows: Vec<Retention> = serde_json::from_value(v.clone())
            .with_context(|| format!("{}: a retention table with unexpected fields", path.display()))?;
        let heldout = items[0].get("heldout").and_then(|h| h.as_str()).unwrap_or("held-out data").to_string();
        return Ok(Extra::Retention(RetentionFile { path: path.to_path_buf(), rows, heldout }));
    }
    let name = path.file_stem().unwrap_or_default().to_string_lossy().to_string();
    let curves = mrc_curves(&v, &name);
    Ok(if curves.is_empty() { Extra::Other } else { Extra::Mrc(curves) })
}

/// Miss-ratio curves in any of the shapes the `mrc` command may write: a curve object (per-layer
/// `misses` from `min_cap`, with `picks_per_layer` or `tokens` × `k_used`; or per-layer `caps`
/// and `hit_rate`), a list of them, or an object holding them under `curves`.
fn mrc_curves(v: &serde_json::Value, name: &str) -> Vec<MrcCurve> {
    if let Some(list) = v.as_array() {
        return list.iter().flat_map(|c| mrc_curves(c, name)).collect();
    }
    if let Some(list) = v.get("curves") {
        return mrc_curves(list, name);
    }
    let Some(layers) = v.get("layers").and_then(|l| l.as_array()) else { return Vec::new() };
    let num = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_f64());
    let picks = num(v, "picks_per_layer").or_else(|| Some(num(v, "tokens")? * num(v, "k_used")?)).filter(|p| *p > 0.0);
    let min_cap = num(v, "min_cap");
    let mut out = Vec::new();
    for (i, layer) in layers.iter().enumerate() {
        let id = layer.get("layer_id").map_or_else(|| i.to_string(), |x| x.to_string());
        let floats = |k: &str| -> Option<Vec<f64>> {
            layer.get(k)?.as_array()?.iter().map(|x| x.as_f64()).collect::<Option<Vec<f64>>>()
        };
        let points: Vec<(f64, f64)> = if let (Some(caps), Some(hr)) = (floats("caps"), floats("hit_rate")) {
            caps.into_iter().zip(hr).collect()
        } else if let (Some(misses), Some(min_cap), Some(picks)) = (floats("misses"), min_cap, picks) {
            misses.iter().enumerate().map(|(c, m)| (min_cap + c as f64, 1.0 - m / picks)).collect()
        } else {
            return Vec::new();
        };
        out.push((id, points));
    }
    if out.is_empty() {
        return Vec::new();
    }
    let policy = v.get("policy").and_then(|p| p.as_str()).unwrap_or("lru");
    vec![MrcCurve { label: format!("{name}: {policy}"), layers: out }]
}

/// The policy names of `rows`, in a stable order (first appearance in the sorted rows).
fn policies(rows: &[&Row]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in rows {
        let p = r.config.policy.to_string();
        if !seen.contains(&p) {
            seen.push(p);
        }
    }
    seen
}

fn variants(rows: &[&Row]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in rows {
        if !seen.contains(&r.config.variant) {
            seen.push(r.config.variant.clone());
        }
    }
    seen
}

/// A series of a plot: its name and points.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Axis settings of a line or scatter plot.
struct Axes<'a> {
    x: &'a str,
    y: &'a str,
    /// Draw lines between the points (else points only).
    lines: bool,
    /// Force the y range to [0, 1] (rates).
    unit_y: bool,
    /// Draw the diagonal y = x (in vs out of sample).
    diagonal: bool,
    /// Colour the series along a sequential scale (ordered series such as layers) instead of
    /// the categorical palette.
    sequential: bool,
}

const W: u32 = 1000;
const H: u32 = 440;

fn padded(lo: f64, hi: f64, from_zero: bool) -> (f64, f64) {
    let (lo, hi) = if from_zero { (lo.min(0.0), hi) } else { (lo, hi) };
    if (hi - lo).abs() < 1e-12 {
        return (lo - 0.5, hi + 0.5);
    }
    let pad = (hi - lo) * 0.06;
    (if from_zero && lo >= 0.0 { 0.0 } else { lo - pad }, hi + pad)
}

/// An x-y plot as an SVG string (the legend is drawn by the page, beside it).
fn xy_plot(series: &[Series], axes: &Axes<'_>) -> Result<String> {
    let all: Vec<(f64, f64)> = series.iter().flat_map(|s| s.points.iter().copied()).collect();
    let (xmin, xmax) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (ymin, ymax) = all.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    let (x0, x1) = if axes.diagonal { padded(xmin.min(ymin), xmax.max(ymax), true) } else { padded(xmin, xmax, false) };
    let (y0, y1) = if axes.unit_y {
        (padded(ymin, 1.0, false).0.max(0.0), 1.0)
    } else if axes.diagonal {
        (x0, x1)
    } else {
        padded(ymin, ymax, true)
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .margin(16)
            .margin_right(28)
            .x_label_area_size(52)
            .y_label_area_size(76)
            .build_cartesian_2d(x0..x1, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(axes.x)
            .y_desc(axes.y)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(215, 215, 215))
            .x_labels(10)
            .y_labels(8)
            .x_label_formatter(&|x| fmt_tick(*x))
            .y_label_formatter(&|y| fmt_tick(*y))
            .draw()?;
        if axes.diagonal {
            chart.draw_series(LineSeries::new([(x0, x0), (x1, x1)], RGBColor(160, 160, 160).stroke_width(1)))?;
        }
        for (i, s) in series.iter().enumerate() {
            let c = if axes.sequential { gradient(i, series.len()) } else { color(i) };
            if axes.lines {
                chart.draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))?;
            }
            // Markers only where they stay readable; dense curves (miss-ratio curves) are lines.
            if !axes.lines || s.points.len() <= 24 {
                chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 4, c.filled())))?;
            }
        }
        root.present()?;
    }
    Ok(svg)
}

/// Grouped bars: one group per category, one bar per series (`None`: no bar).
fn bar_plot(categories: &[String], series: &[(String, Vec<Option<f64>>)], y: &str) -> Result<String> {
    let n = categories.len();
    let ymax = series.iter().flat_map(|s| s.1.iter().flatten()).fold(0.0f64, |a, &b| a.max(b));
    let ymax = if ymax > 0.0 { ymax * 1.08 } else { 1.0 };
    let width = W.max(140 * n as u32);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, H)).into_drawing_area();
        root.fill(&WHITE)?;
        // Integer x coordinates (1000 per category) with one key point per category: exact
        // category labels whatever their number.
        let n_i = i32::try_from(n).unwrap_or(i32::MAX / 1000 - 1);
        let keys: Vec<i32> = (0..n_i).map(|i| i * 1000).collect();
        let mut chart = ChartBuilder::on(&root)
            .margin(16)
            .x_label_area_size(52)
            .y_label_area_size(76)
            .build_cartesian_2d((-500..n_i * 1000 - 500).with_key_points(keys), 0.0..ymax)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_desc("variant")
            .y_desc(y)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(215, 215, 215))
            .x_label_formatter(&|x| {
                if x % 1000 == 0 && *x >= 0 {
                    categories.get((x / 1000) as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_label_formatter(&|y| fmt_tick(*y))
            .draw()?;
        let m = i32::try_from(series.len().max(1)).unwrap_or(1);
        let bw = 840 / m;
        for (si, (_, values)) in series.iter().enumerate() {
            let c = color(si);
            let si = i32::try_from(si).unwrap_or(0);
            chart.draw_series(values.iter().enumerate().filter_map(|(ci, v)| {
                let v = (*v)?;
                let x0 = i32::try_from(ci).ok()? * 1000 - 420 + si * bw;
                Some(Rectangle::new([(x0, 0.0), (x0 + bw * 9 / 10, v)], c.filled()))
            }))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// Tick labels without float noise: at most 4 significant decimals, trailing zeros trimmed.
fn fmt_tick(x: f64) -> String {
    let s = if x.abs() >= 100.0 { format!("{x:.0}") } else { format!("{x:.3}") };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" { "0".into() } else { s }
}

fn legend(names: &[String]) -> String {
    let mut s = String::from("<div class=\"legend\">");
    for (i, n) in names.iter().enumerate() {
        let _ = write!(s, "<span><i style=\"background:{}\"></i>{}</span>", hex(i), esc(n));
    }
    s + "</div>"
}

/// A figure whose series are layers coloured along [`gradient`]: the legend is a colour bar.
fn layer_figure(title: &str, series: &[Series], x: &str, caption: &str) -> Result<String> {
    let axes = Axes { x, y: "hit rate", lines: true, unit_y: true, diagonal: false, sequential: true };
    let svg = xy_plot(series, &axes)?;
    let n = series.len();
    let stops: Vec<String> = (0..5).map(|i| css(gradient(i * n.saturating_sub(1) / 4, n))).collect();
    let (first, last) = (series.first().map_or("", |s| &s.name), series.last().map_or("", |s| &s.name));
    Ok(format!(
        "<figure><h3>{}</h3>{svg}<div class=\"legend\"><span>{}</span><span class=\"bar\" \
         style=\"background:linear-gradient(to right,{})\"></span><span>{}</span><span>({n} layers)</span></div>\
         <figcaption>{caption}</figcaption></figure>\n",
        esc(title),
        esc(first),
        stops.join(","),
        esc(last),
    ))
}

fn figure(title: &str, svg: &str, names: &[String], caption: &str) -> String {
    format!("<figure><h3>{}</h3>{}{}<figcaption>{}</figcaption></figure>\n", esc(title), svg, legend(names), caption)
}

fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table><thead><tr>");
    for h in header {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s += "</tr></thead><tbody>";
    for r in rows {
        s += "<tr>";
        for c in r {
            let _ = write!(s, "<td>{}</td>", esc(c));
        }
        s += "</tr>";
    }
    s + "</tbody></table></div>\n"
}

/// Rows of the plain configurations (λ = 0) of one sample.
fn plain(rows: &[Row], sample: Sample) -> Vec<&Row> {
    rows.iter().filter(|r| r.sample == sample && r.config.lambda == 0.0).collect()
}

/// (variant, policy, cap, k_used) groups of a set of rows, used as lookup keys.
type Key = (String, String, usize, usize);

fn by_key<'a>(rows: &[&'a Row]) -> BTreeMap<Key, &'a Row> {
    rows.iter()
        .map(|r| ((r.config.variant.clone(), r.config.policy.to_string(), r.config.cap, r.config.k_used), *r))
        .collect()
}

/// The whole page.
fn render(sweep: &SweepOutput, retention: &[RetentionFile], mrc: &[MrcCurve]) -> Result<String> {
    let p = &sweep.provenance;
    let title = if p.grid.name.is_empty() { "moe-offload sweep report".to_string() } else { p.grid.name.clone() };
    let mut body = String::new();
    let mut toc = Vec::new();
    let mut section = |id: &str, name: &str, html: String, body: &mut String| {
        toc.push(format!("<a href=\"#{id}\">{}</a>", esc(name)));
        let _ = writeln!(body, "<section id=\"{id}\"><h2>{}</h2>{html}</section>", esc(name));
    };

    // Summary table (the sweep's summary.md, as HTML).
    let best = sweep.best_per_variant();
    let f4 = |x: f64| format!("{x:.4}");
    let rows: Vec<Vec<String>> = best
        .iter()
        .map(|b| {
            vec![
                b.variant.clone(),
                b.cap.to_string(),
                b.k_used.to_string(),
                b.in_sample_best.clone(),
                f4(b.in_sample_misses_per_token),
                f4(b.chosen_out_of_sample),
                format!("{:+.4}", b.shift()),
                b.out_of_sample_best.clone(),
                f4(b.out_of_sample_misses_per_token),
                b.belady.map_or("-".into(), |(i, o)| format!("{i:.4} / {o:.4}")),
            ]
        })
        .collect();
    section(
        "summary",
        "Summary: best online policy per variant and cache size",
        format!(
            "<p>Misses per token (expert loads per token, all layers; lower is better). The best online policy \
             (Belady excluded: it is an offline oracle) is chosen on the in-sample trace; <b>out-of-sample (in-sample \
             choice)</b> is what that choice gives on the held-out trace, <b>shift</b> the difference; <b>out-of-sample \
             (best)</b> is the best online configuration on the held-out trace.</p>{}",
            table(
                &[
                    "variant",
                    "cap",
                    "k_used",
                    "best online in-sample",
                    "in-sample",
                    "out-of-sample (in-sample choice)",
                    "shift",
                    "best online out-of-sample",
                    "out-of-sample (best)",
                    "Belady in / out",
                ],
                &rows
            )
        ),
        &mut body,
    );

    // Misses per token by policy and variant, one chart per (cap, k_used), out of sample.
    let oos = plain(&sweep.rows, Sample::OutOfSample);
    let pols = policies(&oos);
    let vars = variants(&oos);
    let lookup = by_key(&oos);
    let groups: BTreeSet<(usize, usize)> = oos.iter().map(|r| (r.config.cap, r.config.k_used)).collect();
    let mut html = String::from(
        "<p>Out-of-sample misses per token at λ = 0, one bar per policy, grouped by variant (keep map). \
         Belady is the offline optimum: a lower bound of every online policy when every token counts; \
         counted after the warmup it may exceed one by up to the cap per layer.</p>",
    );
    for &(cap, k_used) in &groups {
        let series: Vec<(String, Vec<Option<f64>>)> = pols
            .iter()
            .map(|pol| {
                let v = vars
                    .iter()
                    .map(|var| lookup.get(&(var.clone(), pol.clone(), cap, k_used)).map(|r| r.misses_per_token))
                    .collect();
                (pol.clone(), v)
            })
            .collect();
        let svg = bar_plot(&vars, &series, "misses per token")?;
        html += &figure(
            &format!("cap {cap} experts per layer, k_used {k_used}"),
            &svg,
            &pols,
            "Each bar is one configuration replayed on the held-out trace.",
        );
    }
    html += &matrix_table(&sweep.rows);
    section("policies", "Misses per token by policy and variant", html, &mut body);

    // Hit rate vs cache size.
    let mut html = String::new();
    let caps: BTreeSet<usize> = oos.iter().map(|r| r.config.cap).collect();
    // The unpruned variant when the grid has it: pruning mixes forced misses into the curve.
    let first = vars.iter().find(|v| *v == "full").or(vars.first()).cloned().unwrap_or_default();
    let k_used = oos.iter().find(|r| r.config.variant == first).map_or(0, |r| r.config.k_used);
    if caps.len() >= 2 {
        let series: Vec<Series> = pols
            .iter()
            .map(|pol| Series {
                name: pol.clone(),
                points: caps
                    .iter()
                    .filter_map(|&c| {
                        lookup.get(&(first.clone(), pol.clone(), c, k_used)).map(|r| (c as f64, r.hit_rate))
                    })
                    .collect(),
            })
            .filter(|s| !s.points.is_empty())
            .collect();
        let axes = Axes {
            x: "cache size (experts per layer)",
            y: "hit rate",
            lines: true,
            unit_y: true,
            diagonal: false,
            sequential: false,
        };
        html += &figure(
            &format!("variant {first}: hit rate vs cache size, by policy (out of sample, λ = 0, k_used {k_used})"),
            &xy_plot(&series, &axes)?,
            &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
            "Hit rate = hits / picks over all layers.",
        );
    }
    let x = "cache size (experts per layer)";
    if mrc.is_empty() {
        let pol = pols.iter().find(|p| *p == "lru").or(pols.first());
        if let (true, Some(pol)) = (caps.len() >= 2, pol) {
            let rows: Vec<&Row> =
                caps.iter().filter_map(|&c| lookup.get(&(first.clone(), pol.clone(), c, k_used)).copied()).collect();
            let layers = rows.first().map_or(0, |r| r.counts.layer_misses.len());
            let series: Vec<Series> = (0..layers)
                .map(|l| Series {
                    name: format!("layer {l}"),
                    points: rows
                        .iter()
                        .map(|r| {
                            let picks = (r.counts.tokens * r.config.k_used as u64).max(1) as f64;
                            (r.config.cap as f64, 1.0 - r.counts.layer_misses[l] as f64 / picks)
                        })
                        .collect(),
                })
                .collect();
            html += &layer_figure(
                &format!("variant {first}, {pol}: hit rate vs cache size per layer (layer index in the trace)"),
                &series,
                x,
                "From the sweep's per-layer misses at the grid's caps. Save the output of <code>moe-offload mrc</code> \
                 as a .json file in the report directory (or pass <code>--mrc FILE</code>) for the curve at every \
                 cache size.",
            )?;
        }
    } else {
        for c in mrc {
            let series: Vec<Series> =
                c.layers.iter().map(|(id, pts)| Series { name: format!("layer {id}"), points: pts.clone() }).collect();
            html += &layer_figure(
                &format!("miss-ratio curve {}: hit rate vs cache size per layer", c.label),
                &series,
                x,
                "One line per layer (the layer's id in the model), from the miss-ratio curve file.",
            )?;
        }
    }
    if html.is_empty() {
        html = "<p>The grid has a single cache size and no miss-ratio curve was found: nothing to plot.</p>".into();
    }
    section("capacity", "Hit rate vs cache size", html, &mut body);

    // Misses vs λ: one chart per (variant, cap, k_used), one line per (policy, j).
    let all_oos: Vec<&Row> = sweep.rows.iter().filter(|r| r.sample == Sample::OutOfSample).collect();
    type LamKey = (String, usize, usize, String, usize);
    let mut lam: BTreeMap<LamKey, Vec<(f64, f64)>> = BTreeMap::new();
    for r in all_oos.iter().filter(|r| r.config.lambda > 0.0) {
        let c = &r.config;
        lam.entry((c.variant.clone(), c.cap, c.k_used, c.policy.to_string(), c.j))
            .or_default()
            .push((c.lambda, r.misses_per_token));
    }
    let mut html = String::new();
    if lam.is_empty() {
        html += "<p>The grid has no λ > 0 configurations (cache-aware routing): nothing to plot.</p>";
    } else {
        let charts: BTreeSet<(String, usize, usize)> = lam.keys().map(|k| (k.0.clone(), k.1, k.2)).collect();
        for (var, cap, k_used) in charts {
            let mut series = Vec::new();
            for ((_, _, _, pol, j), pts) in lam.iter().filter(|(k, _)| k.0 == var && k.1 == cap && k.2 == k_used) {
                let mut pts = pts.clone();
                if let Some(r) = lookup.get(&(var.clone(), pol.clone(), cap, k_used)) {
                    pts.push((0.0, r.misses_per_token));
                }
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                series.push(Series { name: format!("{pol} j={j}"), points: pts });
            }
            let axes = Axes {
                x: "λ (cache-aware routing strength)",
                y: "misses per token",
                lines: true,
                unit_y: false,
                diagonal: false,
                sequential: false,
            };
            html += &figure(
                &format!("variant {var}, cap {cap}, k_used {k_used}: misses per token vs λ (out of sample)"),
                &xy_plot(&series, &axes)?,
                &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "λ = 0 is plain routing (the same row for every j). Larger λ routes more picks to cached experts: \
                 fewer misses, more substituted experts (results.csv, column substituted).",
            );
        }
    }
    section("lambda", "Misses per token vs λ", html, &mut body);

    // In-sample vs out-of-sample.
    let ins: BTreeMap<&str, &Row> =
        sweep.rows.iter().filter(|r| r.sample == Sample::InSample).map(|r| (r.key.as_str(), r)).collect();
    let all_pols = policies(&all_oos);
    let series: Vec<Series> = all_pols
        .iter()
        .map(|pol| Series {
            name: pol.clone(),
            points: all_oos
                .iter()
                .filter(|r| &r.config.policy.to_string() == pol)
                .filter_map(|r| ins.get(r.key.as_str()).map(|i| (i.misses_per_token, r.misses_per_token)))
                .collect(),
        })
        .filter(|s| !s.points.is_empty())
        .collect();
    let mut html = String::new();
    if !series.is_empty() {
        let axes = Axes {
            x: "in-sample misses per token",
            y: "out-of-sample misses per token",
            lines: false,
            unit_y: false,
            diagonal: true,
            sequential: false,
        };
        html += &figure(
            "every configuration: in-sample vs out-of-sample misses per token",
            &xy_plot(&series, &axes)?,
            &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
            "Points above the grey diagonal do worse on the held-out trace than on the calibration trace.",
        );
    }
    html += &shift_table(&sweep.rows);
    section("shift", "In-sample vs out-of-sample", html, &mut body);

    // Retention vs K.
    let mut html = String::new();
    if retention.is_empty() {
        html += "<p>No retention table found. Save <code>moe-offload retention MAPS... --heldout H --json</code> \
                 output as a .json file in the report directory (or pass <code>--retention FILE</code>) to plot \
                 retention vs K per metric.</p>";
    }
    for rf in retention {
        html += &retention_section(rf)?;
    }
    section("retention", "Retention vs K", html, &mut body);

    // Provenance.
    let prov = table(
        &["field", "value"],
        &[
            vec!["tool version".into(), p.tool_version.clone()],
            vec!["grid".into(), p.grid.name.clone()],
            vec!["in-sample trace".into(), format!("{} (sha256 {})", p.in_sample.source, p.in_sample.sha256)],
            vec![
                "out-of-sample trace".into(),
                format!("{} (sha256 {})", p.out_of_sample.source, p.out_of_sample.sha256),
            ],
            vec!["in-sample statistics sha256".into(), p.stats_sha256.clone()],
            vec!["warmup tokens".into(), p.grid.warmup.to_string()],
            vec!["rows".into(), sweep.rows.len().to_string()],
            vec!["shard".into(), sweep.shard.map_or("whole run".into(), |s| format!("{}/{}", s.index, s.count))],
        ],
    );
    section("provenance", "Provenance", prov.replace("<table>", "<table class=\"kv\">"), &mut body);

    Ok(format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t}</title><style>{CSS}</style></head><body>\
         <h1>{t}</h1><p class=\"sub\">moe-offload {v} report of a sweep: {n} rows, {c} configurations × 2 traces. \
         Self-contained: no scripts, no network.</p><nav>{toc}</nav>\n{body}</body></html>\n",
        t = esc(&title),
        v = esc(&p.tool_version),
        n = sweep.rows.len(),
        c = sweep.rows.len() / 2,
        toc = toc.join(" · "),
    ))
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
    let oos: Vec<&Row> = rows.iter().filter(|r| r.sample == Sample::OutOfSample).collect();
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

/// Retention vs K per metric for one `retention --json` file, and its table.
fn retention_section(rf: &RetentionFile) -> Result<String> {
    let reap = rf.rows.iter().any(|r| r.mean.reap_retention.is_some());
    let (mass, get): (&str, fn(&saliency::RetentionFigures) -> Option<f64>) =
        if reap { ("reap_retention", |f| f.reap_retention) } else { ("gate_retention", |f| f.gate_retention) };
    let mut by_metric: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for r in &rf.rows {
        let Some((metric, k)) = r.label.split_once('@') else { continue };
        let Ok(k) = k.parse::<f64>() else { continue };
        if let Some(v) = get(&r.mean) {
            by_metric.entry(metric.to_string()).or_default().push((k, v));
        }
    }
    let mut html = String::new();
    let series: Vec<Series> = by_metric
        .into_iter()
        .map(|(name, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series { name, points }
        })
        .collect();
    if !series.is_empty() {
        let y = format!("mean {mass} over layers");
        let axes = Axes {
            x: "K (experts kept per layer)",
            y: &y,
            lines: true,
            unit_y: true,
            diagonal: false,
            sequential: false,
        };
        html += &figure(
            &format!("held out: {} ({})", rf.heldout, rf.path.display()),
            &xy_plot(&series, &axes)?,
            &series.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
            "Uniform-K maps (METRIC@K) only; budget maps and <code>full</code> are in the table.",
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

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1200px;\
color:#222;padding:0 16px}h1{font-size:26px;margin-bottom:4px}.sub{color:#555;margin-top:0}nav{margin:12px 0 24px;\
line-height:1.8}nav a{color:#1f77b4;text-decoration:none}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:40px}\
h3{font-size:16px;margin:18px 0 6px}figure{margin:12px 0 28px}figure svg{max-width:100%;height:auto;display:block}\
figcaption{color:#555;font-size:14px;margin-top:4px}.legend{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:14px;\
margin:6px 0 0 76px}.legend .bar{display:inline-block;width:220px;height:14px;border-radius:3px}.legend i{display:inline-block;width:14px;height:14px;border-radius:3px;margin-right:6px;\
vertical-align:-2px}table{border-collapse:collapse;font-size:13px;margin:8px 0 16px;font-variant-numeric:tabular-nums}\
th,td{border:1px solid #ddd;padding:4px 8px;text-align:right;white-space:nowrap}th{background:#f4f4f4}\
td:first-child,th:first-child{text-align:left}tbody tr:nth-child(even){background:#fafafa}.scroll{overflow-x:auto}.kv td,.kv th{text-align:left;white-space:normal;word-break:break-all}code{background:#f4f4f4;\
padding:1px 4px;border-radius:3px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_have_no_float_noise() {
        assert_eq!(fmt_tick(0.30000000000000004), "0.3");
        assert_eq!(fmt_tick(16.0), "16");
        assert_eq!(fmt_tick(250.0), "250");
        assert_eq!(fmt_tick(-0.0), "0");
    }

    #[test]
    fn mrc_shapes_are_read() {
        let curve = serde_json::json!({
            "policy": "lru", "k_used": 2, "min_cap": 2, "max_cap": 4, "tokens": 10, "picks_per_layer": 20,
            "layers": [{"layer_id": 3, "misses": [10, 5, 2]}]
        });
        let c = mrc_curves(&curve, "mrc");
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].layers[0].0, "3");
        assert_eq!(c[0].layers[0].1, vec![(2.0, 0.5), (3.0, 0.75), (4.0, 0.9)]);
        let wrapped = serde_json::json!({"curves": [curve.clone(), curve]});
        assert_eq!(mrc_curves(&wrapped, "mrc").len(), 2);
        let alt = serde_json::json!({"layers": [{"caps": [1, 2], "hit_rate": [0.1, 0.2]}]});
        assert_eq!(mrc_curves(&alt, "x")[0].layers[0].1, vec![(1.0, 0.1), (2.0, 0.2)]);
        assert!(mrc_curves(&serde_json::json!({"rows": []}), "x").is_empty());
        assert!(mrc_curves(&serde_json::json!({"layers": [{"misses": [1]}]}), "x").is_empty());
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(esc("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }
}
