//! `results.json`, `results.csv` and `summary.md` of one sweep checked against one another: the CSV
//! and the summary `results.json`'s rows give (sweep's own writers) compared with the files beside
//! it, cell by cell, the first difference named by file, row and column.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::json;
use sweep::SweepOutput;

use super::{Check, check};

/// The check of the two files beside `results` (the path of `results.json`), `name` as shown.
pub(super) fn agree(name: &str, results: &Path, out: &SweepOutput) -> Check {
    let dir = results.parent().unwrap_or(Path::new(""));
    let shown = |f: &str| Path::new(name).with_file_name(f).display().to_string();
    let mut first = None;
    let mut f = BTreeMap::new();
    for (file, want, compare) in [
        ("results.csv", out.csv(), csv_difference as fn(&str, &str) -> Option<String>),
        ("summary.md", out.summary_markdown().into_bytes(), summary_difference),
    ] {
        let shown = shown(file);
        let got = match std::fs::read(dir.join(file)) {
            Ok(b) => b,
            Err(e) => {
                first.get_or_insert_with(|| format!("{shown}: cannot be read beside results.json: {e}"));
                continue;
            }
        };
        f.insert(file.to_string(), json!(got == want));
        if got != want {
            let (got, want) = (String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
            let diff = compare(&got, &want).unwrap_or_else(|| "differs in its bytes".into());
            first.get_or_insert_with(|| format!("{shown} {diff}"));
        }
    }
    check(
        "5 sweep rows",
        &format!("{name}: results.csv and summary.md agree with results.json"),
        first.is_none(),
        f,
        first,
    )
}

/// The first differing cell of two CSV texts (`got` from the file, `want` from results.json).
fn csv_difference(got: &str, want: &str) -> Option<String> {
    let read = |t: &str| -> Vec<Vec<String>> {
        csv::ReaderBuilder::new()
            .has_headers(false)
            .flexible(true)
            .from_reader(t.as_bytes())
            .records()
            .map(|r| r.map(|r| r.iter().map(str::to_string).collect()).unwrap_or_default())
            .collect()
    };
    let (got, want) = (read(got), read(want));
    let header = want.first().cloned().unwrap_or_default();
    let label = |r: &[String]| format!("{} ({})", r.first().map_or("", |s| s), r.get(1).map_or("", |s| s));
    for i in 0..got.len().max(want.len()) {
        let (g, w) = match (got.get(i), want.get(i)) {
            (Some(g), Some(w)) => (g, w),
            (None, Some(w)) => {
                return Some(format!(
                    "ends after {} rows: row {} of results.json is not in it",
                    got.len() - 1,
                    label(w)
                ));
            }
            (Some(g), None) => return Some(format!("has a row {} that results.json does not have", label(g))),
            (None, None) => unreachable!("i < max of the lengths"),
        };
        if i == 0 {
            if g != w {
                let c = (0..g.len().max(w.len())).find(|&c| g.get(c) != w.get(c)).unwrap_or(0);
                return Some(format!(
                    "header, column {}: {:?} in the file, {:?} from results.json",
                    c + 1,
                    g.get(c).map_or("", |s| s),
                    w.get(c).map_or("", |s| s)
                ));
            }
            continue;
        }
        if g.get(..2) != w.get(..2) {
            return Some(format!("row {i} is {}, results.json's row {i} is {}", label(g), label(w)));
        }
        if let Some(c) = (0..g.len().max(w.len())).find(|&c| g.get(c) != w.get(c)) {
            return Some(format!(
                "row {}, column {}: {} in the file, {} from results.json",
                label(w),
                header.get(c).map_or("?", |s| s),
                g.get(c).map_or("(none)", |s| s),
                w.get(c).map_or("(none)", |s| s)
            ));
        }
    }
    None
}

/// The first differing line of two summaries; in a table row, the cell and its column header.
fn summary_difference(got: &str, want: &str) -> Option<String> {
    let cells =
        |l: &str| -> Vec<String> { l.trim().trim_matches('|').split('|').map(|c| c.trim().to_string()).collect() };
    let (g, w): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    let mut header: Vec<String> = Vec::new();
    for i in 0..g.len().max(w.len()) {
        let (gl, wl) = (g.get(i).copied().unwrap_or(""), w.get(i).copied().unwrap_or(""));
        if wl.starts_with("| variant") {
            header = cells(wl);
        }
        if gl == wl {
            continue;
        }
        if gl.starts_with('|') && wl.starts_with('|') && !header.is_empty() {
            let (gc, wc) = (cells(gl), cells(wl));
            if let Some(c) = (0..gc.len().max(wc.len())).find(|&c| gc.get(c) != wc.get(c)) {
                let cap = wc.get(1).map_or("", |s| s);
                return Some(format!(
                    "line {} (variant {}, cap {cap}), column `{}`: {} in the file, {} from results.json",
                    i + 1,
                    wc.first().map_or("", |s| s),
                    header.get(c).map_or("?", |s| s),
                    gc.get(c).map_or("(none)", |s| s),
                    wc.get(c).map_or("(none)", |s| s)
                ));
            }
        }
        return Some(format!("line {}: {gl:?} in the file, {wl:?} from results.json", i + 1));
    }
    None
}
