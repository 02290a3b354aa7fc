//! The report of a sweep with every axis (pins, cap 0, tier 2, batches, prefetch, the shuffled
//! control, a pruned map) stays legible: each section takes the rows of its own axes, every SVG
//! keeps a readable size, bar labels are distinct, and equal curves are marked, not hidden.

mod common;

use common::{ok, s, synth};

/// The `(width, height)` of every `<svg` of `html`, in order.
fn svg_sizes(html: &str) -> Vec<(u32, u32)> {
    let attr = |tag: &str, name: &str| -> u32 {
        let at = tag.find(&format!(" {name}=\"")).unwrap_or_else(|| panic!("no {name} in {tag}")) + name.len() + 3;
        tag[at..].split('"').next().unwrap().trim_end_matches("px").parse().unwrap()
    };
    html.match_indices("<svg")
        .map(|(i, _)| {
            let tag = &html[i..i + html[i..].find('>').unwrap()];
            (attr(tag, "width"), attr(tag, "height"))
        })
        .collect()
}

/// The text of every `<text>` element of `svg`.
fn texts(svg: &str) -> Vec<String> {
    svg.split("<text").skip(1).filter_map(|t| Some(t[t.find('>')? + 1..t.find("</text>")?].to_string())).collect()
}

/// The inner HTML of `<section id="ID">`.
fn section<'a>(html: &'a str, id: &str) -> &'a str {
    let start = html.find(&format!("<section id=\"{id}\">")).unwrap_or_else(|| panic!("no section {id}"));
    &html[start..start + html[start..].find("</section>").unwrap()]
}

#[test]
fn a_report_of_every_axis_is_legible() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    synth(&a, [2, 16, 2, 4, 600], &["--sequences", "12", "--seed", "1"]);
    synth(&b, [2, 16, 2, 4, 500], &["--sequences", "10", "--seed", "2"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&a), "-o", s(&stats)]);
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "4", "-o", s(&dir.path().join("pin.json"))]);
    let grid = dir.path().join("grid.json");
    let text = r#"{
      "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
      "variants": ["full", "frequency@8"],
      "blocks": [
        {"policies": ["lru", "fifo"], "cap": [16], "batch": [null, 2, 4, 1000000]},
        {"policies": ["lru"], "cap": [0], "pin": ["pin.json"]},
        {"policies": ["lru", "fifo", "lfu"], "cap": [4], "pin": [null, "pin.json"], "tier2": [null, "lru:8"]},
        {"policies": ["lru", "fifo", "lfu", "near_pick"], "cap": [4, 8],
         "prefetch": ["none", "prev_token:2", "oracle:2"], "shuffle": [null, 7]}
      ],
      "profiles": ["reference"]
    }"#;
    std::fs::write(&grid, text).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&grid), "-o", s(&out)]);
    let page = dir.path().join("report.html");
    ok(&["report", s(&out), "-o", s(&page)]);
    let html = std::fs::read_to_string(&page).unwrap();
    let sizes = svg_sizes(&html);
    assert!(sizes.len() > 10, "{sizes:?}");
    for (w, h) in &sizes {
        assert!(*w <= 2000 && *h <= 1000, "an SVG of {w} x {h}: {sizes:?}");
    }
    let deploy = section(&html, "deployments");
    // No prefetch or shuffled row in the deployments section (they have their own).
    assert!(!deploy.contains("pf:") && !deploy.contains("shuffle:"));
    let bars: Vec<&str> = deploy.split("<svg").skip(1).collect();
    assert!(!bars.is_empty());
    for svg in &bars {
        let labels: Vec<String> = texts(svg).into_iter().filter(|t| t.parse::<f64>().is_err()).collect();
        let mut unique = labels.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), labels.len(), "a label drawn twice: {labels:?}");
    }
    // Cap 16 = E: lru and fifo miss alike at every B; the second curve says so and is dashed.
    assert!(deploy.contains("lru 16, full (= fifo 16, full)"), "{deploy}");
    // The prefetch section: its B = 0 point is the timeline's, so no NaN and no null figure.
    let prefetch = section(&html, "prefetch");
    assert!(prefetch.contains("tok/s on the timeline against the budget"));
    assert!(!prefetch.contains("NaN"));
}
