//! The report's plots as inline SVG (plotters): the encodings shared by every plot (one colour
//! per policy, a marker or a dash per λ, j or variant), x-y plots and grouped bars.

use std::collections::BTreeSet;

use anyhow::Result;
use plotters::coord::combinators::BindKeyPoints;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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

/// Colour `i` of the categorical palette.
pub(super) fn color(i: usize) -> RGBColor {
    let (r, g, b) = PALETTE[i % PALETTE.len()];
    RGBColor(r, g, b)
}

/// The colour of a policy, the same in every plot: its place in `cachesim::Policy::ALL` (a name
/// not there, from a newer or older results file, takes grey).
pub(super) fn policy_color(name: &str) -> RGBColor {
    color(cachesim::Policy::ALL.iter().position(|p| p.as_str() == name).unwrap_or(cachesim::Policy::ALL.len()))
}

/// A sequential colour (viridis-like) for item `i` of `n`: for many ordered series such as layers.
pub(super) fn gradient(i: usize, n: usize) -> RGBColor {
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

/// A CSS colour.
pub(super) fn css(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// The marker of a series: the second encoding (λ, j or variant) after the colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    Circle,
    Triangle,
    Square,
    Cross,
}

impl Marker {
    /// Marker `i` (cycling).
    pub(super) fn nth(i: usize) -> Marker {
        [Marker::Circle, Marker::Triangle, Marker::Square, Marker::Cross][i % 4]
    }

    /// The marker as a legend glyph.
    pub(super) fn glyph(self) -> &'static str {
        match self {
            Marker::Circle => "●",
            Marker::Triangle => "▲",
            Marker::Square => "■",
            Marker::Cross => "✕",
        }
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Style {
    pub(super) color: RGBColor,
    pub(super) marker: Marker,
    /// Dashed line and hollow, larger markers: a series drawn over an identical one.
    pub(super) dashed: bool,
}

impl Style {
    /// A solid series of `color` with circles.
    pub(super) fn of(color: RGBColor) -> Style {
        Style { color, marker: Marker::Circle, dashed: false }
    }
}

/// A series of a plot: its name, points, style and, for a band, the lower edge at each x.
pub(super) struct Series {
    pub(super) name: String,
    pub(super) points: Vec<(f64, f64)>,
    pub(super) style: Style,
    /// The band's lower edge (same x as `points`), shaded up to the line.
    pub(super) band: Option<Vec<(f64, f64)>>,
}

impl Series {
    /// A series without a band.
    pub(super) fn new(name: impl Into<String>, points: Vec<(f64, f64)>, style: Style) -> Series {
        Series { name: name.into(), points, style, band: None }
    }
}

/// Marks every series whose points equal an earlier one's: its name says which
/// (`fifo (= lru)`) and it is drawn dashed with hollow markers, so that neither hides the other.
pub(super) fn mark_identical(series: &mut [Series]) {
    for i in 1..series.len() {
        if let Some(j) = (0..i).find(|&j| series[j].points == series[i].points && !series[j].points.is_empty()) {
            let first = series[j].name.clone();
            series[i].name = format!("{} (= {first})", series[i].name);
            series[i].style.dashed = true;
        }
    }
}

/// Axis settings of a line or scatter plot.
pub(super) struct Axes<'a> {
    pub(super) x: &'a str,
    pub(super) y: &'a str,
    /// Draw lines between the points (else points only).
    pub(super) lines: bool,
    /// Force the y range to [0, 1] (rates).
    pub(super) unit_y: bool,
    /// Draw the diagonal y = x (in vs out of sample).
    pub(super) diagonal: bool,
    /// A base-2 logarithmic x axis (x > 0), ticks at powers of two.
    pub(super) log_x: bool,
    /// A second x axis on top: its label and the factor from x to it (cache size to GB).
    pub(super) top_x: Option<(&'a str, f64)>,
}

impl Axes<'_> {
    /// Linear axes, lines, y from 0.
    pub(super) fn lines<'a>(x: &'a str, y: &'a str) -> Axes<'a> {
        Axes { x, y, lines: true, unit_y: false, diagonal: false, log_x: false, top_x: None }
    }
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
pub(super) fn xy_plot(series: &[Series], axes: &Axes<'_>) -> Result<String> {
    // On a log axis the plot's x is log2(x); the tick labels give x back.
    let to_x = |x: f64| if axes.log_x { x.max(f64::MIN_POSITIVE).log2() } else { x };
    let from_x = |x: f64| if axes.log_x { x.exp2() } else { x };
    let all: Vec<(f64, f64)> = series
        .iter()
        .flat_map(|s| s.points.iter().chain(s.band.iter().flatten()).map(|&(x, y)| (to_x(x), y)))
        .collect();
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
    // Labels on a log axis only at integer log2 (powers of two); enough ticks to land on them.
    let tick = |x: f64| {
        if !axes.log_x {
            fmt_tick(x)
        } else if (x - x.round()).abs() < 1e-9 {
            fmt_tick(x.round().exp2())
        } else {
            String::new()
        }
    };
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, H)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder.margin(16).margin_right(28).x_label_area_size(52).y_label_area_size(76);
        if axes.top_x.is_some() {
            builder.margin_top(64);
        }
        let mut chart = builder.build_cartesian_2d(x0..x1, y0..y1)?;
        chart
            .configure_mesh()
            .x_desc(axes.x)
            .y_desc(axes.y)
            .axis_desc_style(("sans-serif", 16))
            .label_style(("sans-serif", 14))
            .light_line_style(RGBColor(238, 238, 238))
            .bold_line_style(RGBColor(215, 215, 215))
            .x_labels(if axes.log_x { 40 } else { 10 })
            .y_labels(8)
            .x_label_formatter(&|x| tick(*x))
            .y_label_formatter(&|y| fmt_tick(*y))
            .draw()?;
        // The second x axis on top (cache size in GB): a label above each x of the data.
        if let Some((label, factor)) = axes.top_x {
            let xs: BTreeSet<u64> = all.iter().map(|p| p.0.to_bits()).collect();
            let style = ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
            for x in xs.into_iter().map(f64::from_bits) {
                let (px, py) = chart.backend_coord(&(x, y1));
                root.draw(&PathElement::new([(px, py), (px, py - 5)], BLACK))?;
                root.draw(&Text::new(fmt_tick(from_x(x) * factor), (px, py - 7), style.clone()))?;
            }
            let (left, top) = chart.backend_coord(&(x0, y1));
            let (right, _) = chart.backend_coord(&(x1, y1));
            let desc = ("sans-serif", 16).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Bottom));
            root.draw(&Text::new(label.to_string(), ((left + right) / 2, top - 26), desc))?;
        }
        if axes.diagonal {
            chart.draw_series(LineSeries::new([(x0, x0), (x1, x1)], RGBColor(160, 160, 160).stroke_width(1)))?;
        }
        for s in series {
            let c = s.style.color;
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (to_x(x), y)).collect();
            if let Some(band) = &s.band {
                let lower = band.iter().map(|&(x, y)| (to_x(x), y));
                let outline: Vec<(f64, f64)> = pts.iter().copied().chain(lower.rev()).collect();
                chart.draw_series(std::iter::once(Polygon::new(outline, c.mix(0.18).filled())))?;
            }
            if axes.lines {
                if s.style.dashed {
                    chart.draw_series(DashedLineSeries::new(pts.iter().copied(), 8, 6, c.stroke_width(2)))?;
                } else {
                    chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?;
                }
            }
            // Markers only where they stay readable; dense curves (miss-ratio curves) are lines.
            if !axes.lines || pts.len() <= 24 {
                // Hollow and larger when the series is drawn over an identical one.
                let (size, paint) = if s.style.dashed { (7, c.stroke_width(2)) } else { (4, c.filled()) };
                match s.style.marker {
                    Marker::Circle => {
                        chart.draw_series(pts.iter().map(|&p| Circle::new(p, size, paint)))?;
                    }
                    Marker::Triangle => {
                        chart.draw_series(pts.iter().map(|&p| TriangleMarker::new(p, size + 1, paint)))?;
                    }
                    Marker::Square => {
                        let r = [(-size, -size), (size, size)];
                        chart.draw_series(pts.iter().map(|&p| EmptyElement::at(p) + Rectangle::new(r, paint)))?;
                    }
                    Marker::Cross => {
                        chart.draw_series(pts.iter().map(|&p| Cross::new(p, size + 1, c.stroke_width(2))))?;
                    }
                }
            }
        }
        root.present()?;
    }
    Ok(svg)
}

/// Grouped bars: one group per category, one bar per series (`None`: no bar), series coloured
/// by `colors`.
pub(super) fn bar_plot(
    categories: &[String],
    series: &[(String, Vec<Option<f64>>)],
    colors: &[RGBColor],
    x: &str,
    y: &str,
) -> Result<String> {
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
            .x_desc(x)
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
            let c = colors.get(si).copied().unwrap_or_else(|| color(si));
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
pub(super) fn fmt_tick(x: f64) -> String {
    let s = if x.abs() >= 100.0 { format!("{x:.0}") } else { format!("{x:.3}") };
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
    if s == "-0" { "0".into() } else { s }
}

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
    fn a_policy_has_one_colour_everywhere() {
        assert_eq!(policy_color("lru"), color(0));
        assert_ne!(policy_color("lru"), policy_color("lfu"));
        assert_eq!(
            policy_color("belady"),
            color(cachesim::Policy::ALL.iter().position(|p| p.as_str() == "belady").unwrap())
        );
    }

    #[test]
    fn identical_series_are_named_and_dashed_not_hidden() {
        let pts = vec![(1.0, 0.5), (2.0, 0.7)];
        let mut s = vec![
            Series::new("lru", pts.clone(), Style::of(color(0))),
            Series::new("lfu", vec![(1.0, 0.4)], Style::of(color(1))),
            Series::new("fifo", pts, Style::of(color(2))),
        ];
        mark_identical(&mut s);
        assert_eq!([s[0].name.as_str(), s[1].name.as_str(), s[2].name.as_str()], ["lru", "lfu", "fifo (= lru)"]);
        assert_eq!([s[0].style.dashed, s[1].style.dashed, s[2].style.dashed], [false, false, true]);
    }
}
