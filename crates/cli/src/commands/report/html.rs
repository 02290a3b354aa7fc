//! The page around the plots: escaping, legends, figures, tables and the stylesheet.

use std::fmt::Write as _;

use anyhow::Result;

use super::svg::{Axes, Series, css, gradient, xy_plot};

/// Escapes text for HTML element content and attribute values.
pub(super) fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The legend of `series`: colour, marker and (for a series drawn over an identical one) a dash.
pub(super) fn legend(series: &[Series]) -> String {
    let mut s = String::from("<div class=\"legend\">");
    for x in series {
        let dash = if x.style.dashed { " ╌" } else { "" };
        let _ = write!(
            s,
            "<span><b style=\"color:{}\">{}{dash}</b> {}</span>",
            css(x.style.color),
            x.style.marker.glyph(),
            esc(&x.name)
        );
    }
    s + "</div>"
}

/// The legend of bars: one colour swatch per name.
pub(super) fn swatches(names: &[String], colors: &[plotters::style::RGBColor]) -> String {
    let mut s = String::from("<div class=\"legend\">");
    for (n, c) in names.iter().zip(colors) {
        let _ = write!(s, "<span><i style=\"background:{}\"></i>{}</span>", css(*c), esc(n));
    }
    s + "</div>"
}

/// A figure whose series are layers coloured along [`gradient`]: the legend is a colour bar.
pub(super) fn layer_figure(title: &str, series: &[Series], axes: &Axes<'_>, caption: &str) -> Result<String> {
    let svg = xy_plot(series, axes)?;
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

/// A titled figure: the plot, its legend (HTML) and a caption (HTML).
pub(super) fn figure(title: &str, svg: &str, legend: &str, caption: &str) -> String {
    format!("<figure><h3>{}</h3>{}{}<figcaption>{}</figcaption></figure>\n", esc(title), svg, legend, caption)
}

/// A table; cells that are not figures (labels) are left-aligned, figures right-aligned.
pub(super) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = String::from("<div class=\"scroll\"><table><thead><tr>");
    for h in header {
        let _ = write!(s, "<th>{}</th>", esc(h));
    }
    s += "</tr></thead><tbody>";
    for r in rows {
        s += "<tr>";
        for c in r {
            let figure = c == "-" || c.split(" / ").all(|x| x.trim().parse::<f64>().is_ok());
            let class = if figure { "" } else { " class=\"l\"" };
            let _ = write!(s, "<td{class}>{}</td>", esc(c));
        }
        s += "</tr>";
    }
    s + "</tbody></table></div>\n"
}

/// The whole page: title, subtitle (HTML), table of contents and sections.
pub(super) fn page(title: &str, sub: &str, toc: &[String], body: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t}</title><style>{CSS}</style></head><body>\
         <h1>{t}</h1><p class=\"sub\">{sub}</p><nav>{toc}</nav>\n{body}</body></html>\n",
        t = esc(title),
        toc = toc.join(" · "),
    )
}

pub(super) const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:24px auto;max-width:1200px;\
color:#222;padding:0 16px}h1{font-size:26px;margin-bottom:4px}.sub{color:#555;margin-top:0}nav{margin:12px 0 24px;\
line-height:1.8}nav a{color:#1f77b4;text-decoration:none}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:40px}\
h3{font-size:16px;margin:18px 0 6px}figure{margin:12px 0 28px}figure svg{max-width:100%;height:auto;display:block}\
figcaption{color:#555;font-size:14px;margin-top:4px}.legend{display:flex;flex-wrap:wrap;gap:6px 18px;font-size:14px;\
margin:6px 0 0 76px}.legend .bar{display:inline-block;width:220px;height:14px;border-radius:3px}.legend i{display:inline-block;width:14px;height:14px;border-radius:3px;margin-right:6px;\
vertical-align:-2px}table{border-collapse:collapse;font-size:12px;max-width:100%;margin:8px 0 16px;font-variant-numeric:tabular-nums}\
th,td{border:1px solid #ddd;padding:3px 6px;text-align:right;white-space:nowrap}th{white-space:normal;vertical-align:bottom;min-width:3em}td.l{text-align:left}th{background:#f4f4f4}\
td:first-child,th:first-child{text-align:left}tbody tr:nth-child(even){background:#fafafa}.scroll{overflow-x:auto}.kv td,.kv th{text-align:left;white-space:normal;word-break:break-all}code{background:#f4f4f4;\
padding:1px 4px;border-radius:3px}";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_is_escaped() {
        assert_eq!(esc("a<b>&\"c\""), "a&lt;b&gt;&amp;&quot;c&quot;");
    }

    #[test]
    fn figures_align_right_and_labels_left() {
        let t = table(&["a", "b"], &[vec!["lru/0/1".into(), "0.5 / 0.25".into()], vec!["-".into(), "+0.1".into()]]);
        assert!(t.contains("<td class=\"l\">lru/0/1</td><td>0.5 / 0.25</td>"), "{t}");
        assert!(t.contains("<td>-</td><td>+0.1</td>"), "{t}");
    }
}
