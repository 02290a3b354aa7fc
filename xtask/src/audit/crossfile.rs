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
                let rows = got.len().saturating_sub(1);
                return Some(format!("ends after {rows} rows: row {} of results.json is not in it", label(w)));
            }
            (Some(g), None) => return Some(format!("has a row {} that results.json does not have", label(g))),
            (None, None) => break,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `check(file, from_json, expected)`: the difference named, `None` when they agree.
    fn check(diff: fn(&str, &str) -> Option<String>, file: &str, want: &str, expected: Option<&str>) {
        assert_eq!(diff(file, want).as_deref(), expected, "{file:?} vs {want:?}");
    }

    #[test]
    fn csv_differences_are_named_by_row_and_column() {
        let want = "key,sample,misses\na,in_sample,5\na,out_of_sample,7\n";
        for (file, expected) in [
            (want, None),
            (
                "key,sample,misses\na,in_sample,5\na,out_of_sample,8\n",
                Some("row a (out_of_sample), column misses: 8 in the file, 7 from results.json"),
            ),
            (
                "key,sample,misses\na,in_sample,5\n",
                Some("ends after 1 rows: row a (out_of_sample) of results.json is not in it"),
            ),
            (
                "key,sample,misses\na,in_sample,5\na,out_of_sample,7\nb,in_sample,1\n",
                Some("has a row b (in_sample) that results.json does not have"),
            ),
            (
                "key,sample,misses\na,out_of_sample,7\na,in_sample,5\n",
                Some("row 1 is a (out_of_sample), results.json's row 1 is a (in_sample)"),
            ),
            (
                "key,sample,hits\na,in_sample,5\na,out_of_sample,7\n",
                Some("header, column 3: \"hits\" in the file, \"misses\" from results.json"),
            ),
            (
                "key,sample,misses\na,in_sample\na,out_of_sample,7\n",
                Some("row a (in_sample), column misses: (none) in the file, 5 from results.json"),
            ),
        ] {
            check(csv_difference, file, want, expected);
        }
    }

    #[test]
    fn summary_differences_name_the_cell() {
        let want = "intro\n\n| variant | cap | best |\n|---|---:|---|\n| full | 8 | 1.5 |\n";
        for (file, expected) in [
            (want, None),
            (
                "intro\n\n| variant | cap | best |\n|---|---:|---|\n| full | 8 | 1.4 |\n",
                Some("line 5 (variant full, cap 8), column `best`: 1.4 in the file, 1.5 from results.json"),
            ),
            (
                "intra\n\n| variant | cap | best |\n|---|---:|---|\n| full | 8 | 1.5 |\n",
                Some("line 1: \"intra\" in the file, \"intro\" from results.json"),
            ),
            (
                "intro\n\n| variant | cap | best |\n|---|---:|---|\n",
                Some("line 5: \"\" in the file, \"| full | 8 | 1.5 |\" from results.json"),
            ),
        ] {
            check(summary_difference, file, want, expected);
        }
    }
}
