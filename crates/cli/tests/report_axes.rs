//! The report of a sweep with every axis (pins, cap 0, tier 2, batches, prefetch, the shuffled
//! control, a pruned map) stays legible: each section takes the rows of its own axes, every SVG
//! keeps a readable size, bar labels are distinct, and equal curves are marked, not hidden.

mod common;

use std::path::Path;

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

/// The hybrid section (SEMANTICS.md §14): one chart per profile, a curve per (residency, policy,
/// overlap) against the experts per layer on the GPU, the all-CPU floor drawn once per overlap,
/// and the plateau table; hybrid rows stay out of every other section.
#[test]
fn the_hybrid_section_plots_tok_s_against_gpu_experts() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.safetensors"), dir.path().join("b.safetensors"));
    synth(&a, [2, 16, 2, 4, 600], &["--sequences", "12", "--seed", "1"]);
    synth(&b, [2, 16, 2, 4, 500], &["--sequences", "10", "--seed", "2"]);
    let stats = dir.path().join("stats.json");
    ok(&["stats", s(&a), "-o", s(&stats)]);
    for k in [4, 8, 16] {
        let pin = dir.path().join(format!("pin{k}.json"));
        ok(&["keep", s(&stats), "--metric", "frequency", "--k", &k.to_string(), "--allow-short-layers", "-o", s(&pin)]);
    }
    let grid = dir.path().join("grid.json");
    let text = r#"{
      "traces": {"in_sample": "a.safetensors", "out_of_sample": "b.safetensors"},
      "variants": ["full"],
      "blocks": [
        {"policies": ["lru"], "cap": [4, 8]},
        {"policies": ["lru"], "cap": [0], "pin": ["pin4.json", "pin8.json", "pin16.json"],
         "exec": ["host"], "overlap": ["sequential", "concurrent"]},
        {"policies": ["lru"], "cap": [0, 4, 8], "exec": ["host"], "overlap": ["sequential", "concurrent"]}
      ],
      "profiles": [{"name": "box", "expert_mb": 10.0, "compute_ms": 20.0, "bandwidth_gbps": [5.0],
                    "host_gbps": 40.0, "host_ms_per_row": 0.0, "host_sync_ms": 0.05, "link_gbps": 25.0}]
    }"#;
    std::fs::write(&grid, text).unwrap();
    let out = dir.path().join("sweep");
    ok(&["sweep", s(&grid), "-o", s(&out)]);
    let page = dir.path().join("report.html");
    ok(&["report", s(&out), "-o", s(&page)]);
    let html = std::fs::read_to_string(&page).unwrap();
    let hybrid = section(&html, "hybrid");
    let svgs: Vec<&str> = hybrid.split("<svg").skip(1).collect();
    assert_eq!(svgs.len(), 1, "one chart: one profile, one variant, exec host");
    for (w, h) in svg_sizes(hybrid) {
        assert!(w <= 2000 && h <= 1000, "an SVG of {w} x {h}");
    }
    for name in ["pinned lru, sequential", "pinned lru, concurrent", "cache lru, sequential", "cache lru, concurrent"] {
        assert!(hybrid.contains(name), "no curve {name}: {hybrid}");
    }
    assert!(hybrid.contains("all-CPU floor, sequential") && hybrid.contains("all-CPU floor, concurrent"));
    assert!(hybrid.contains("where more GPU experts stop helping"));
    // 16 pinned of 16 experts: nothing runs on the CPU, so that is each pinned curve's best, and
    // the floor (no pins, cap 0) is its first point.
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let tok_s = |key: &str| -> f64 {
        let row = rows["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key && r["sample"] == "out_of_sample")
            .unwrap_or_else(|| panic!("no row {key}"));
        row["hybrid"]["cost"][0]["tok_s"].as_f64().unwrap()
    };
    let full = tok_s("full/lru/0/0/0/2/pin:pin16/exec:host/overlap:sequential");
    assert!((full - 50.0).abs() < 1e-9, "20 ms of GPU compute per token and nothing on the CPU: {full}");
    assert!(hybrid.contains("50.00"), "{hybrid}");
    // No hybrid key in the sections of plain, deployed or budget rows.
    for id in ["policies", "capacity", "budget", "deployments", "shift"] {
        assert!(!section(&html, id).contains("exec:host"), "section {id} shows hybrid rows");
    }
    // The deployments section names the pinned hybrid rows it leaves to the hybrid section (3 pin
    // maps x 2 overlaps), instead of saying the sweep has no deployed configurations.
    let deployments = section(&html, "deployments");
    assert!(deployments.contains("The 6 deployed configurations of this sweep"), "{deployments}");
    // A curve is never said to stop helping at a point where its table row says it still rises.
    for row in hybrid.split("<tr>").filter(|r| r.contains("no: still rising")) {
        assert!(row.contains("not within its range"), "{row}");
    }
}

/// docs/hybrid.md's grid (`data/grids/esft-hybrid.json`) on the real ESFT logs: the rows give the
/// doc's tables, and the report marks where concurrent overlap stops paying at B = 16 (48 experts
/// per layer on the first profile, 32 on the workstation) while sequential still rises.
#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn the_shipped_hybrid_grid_on_esft() {
    let real = real_data::dir().join("esft-dsv2lite");
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("esft-work");
    std::fs::create_dir_all(dir.path().join("data/grids")).unwrap();
    let grid = dir.path().join("data/grids/esft-hybrid.json");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/grids/esft-hybrid.json");
    std::fs::copy(shipped, &grid).unwrap();
    for domain in ["intent", "translation"] {
        let out = work.join(format!("{domain}.safetensors"));
        ok(&["import", "esft", s(&real), "--domains", domain, "-o", s(&out)]);
    }
    let stats = work.join("stats.json");
    ok(&["stats", s(&work.join("intent.safetensors")), "-o", s(&stats)]);
    for k in [8, 16, 32, 48, 64] {
        let pin = work.join(format!("pin{k}.json"));
        ok(&["keep", s(&stats), "--metric", "frequency", "--k", &k.to_string(), "--allow-short-layers", "-o", s(&pin)]);
    }
    let out = work.join("hsweep");
    ok(&["sweep", s(&grid), "-o", s(&out)]);
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("results.json")).unwrap()).unwrap();
    let tok_s = |key: &str, profile: usize| -> String {
        let row = rows["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["key"] == key && r["sample"] == "out_of_sample")
            .unwrap_or_else(|| panic!("no row {key}"));
        format!("{:.2}", row["hybrid"]["cost"][profile]["tok_s"].as_f64().unwrap())
    };
    // docs/hybrid.md, "tok/s against experts pinned per layer" (per token, first profile).
    for (pins, seq, conc) in
        [("", "11.26", "14.54"), ("/pin:pin16", "15.01", "21.26"), ("/pin:pin48", "32.42", "45.59")]
    {
        let key = |o: &str| format!("full/lru/0/0/0/6{pins}/exec:host/overlap:{o}");
        assert_eq!((tok_s(&key("sequential"), 0), tok_s(&key("concurrent"), 0)), (seq.into(), conc.into()), "{pins}");
    }
    let page = dir.path().join("report.html");
    ok(&["report", s(&out), "-o", s(&page)]);
    let html = std::fs::read_to_string(&page).unwrap();
    let hybrid = section(&html, "hybrid");
    assert_eq!(hybrid.matches("<svg").count(), 4, "two profiles × (per token, batch 16)");
    assert!(hybrid.contains("pinned lru, concurrent: stops helping at 48"), "{hybrid}");
    assert!(hybrid.contains("pinned lru, concurrent: stops helping at 32"), "{hybrid}");
    assert!(!hybrid.contains("pinned lru, sequential: stops helping"), "sequential keeps rising: {hybrid}");
}
