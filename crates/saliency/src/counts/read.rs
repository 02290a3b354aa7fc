//! Parsers of the count-file layouts into [`RawCounts`]; every error names the file and the
//! line, key, layer or expert, and says what was expected.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use super::RawCounts;
use crate::Result;
use crate::error::invalid;

/// A whole number >= 0 (an integer, or a float with no fraction, as numpy's `tolist()` writes).
pub(crate) fn whole(v: &Value) -> Option<u64> {
    if let Some(n) = v.as_u64() {
        return Some(n);
    }
    let f = v.as_f64()?;
    (f.is_finite() && f >= 0.0 && f.fract() == 0.0 && f < 9.007_199_254_740_992e15).then_some(f as u64)
}

/// Why `v`, not a [`whole`] number, is no count: a whole number too large to be read exactly
/// (a float at or above 2^53, such as `3e22`), or not a whole number >= 0.
fn not_a_count(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if f.is_finite() && f >= 0.0 && f.fract() == 0.0 => format!(
            "{v} is too large for a count: whole numbers are read up to 2^64 - 1 when written as integers and below \
             2^53 = 9007199254740992 when written as floats (above it a float is not exact)"
        ),
        _ => format!("{v} is not a whole number >= 0"),
    }
}

/// The layer id in a key: the key itself when it is a number, else the one number in it
/// (`model.layers.3.mlp` gives 3); `None` for no number or several, and for a key that is a
/// number but no layer id (`-1`, `2.5`, `1e3`: the digits in it are not its value).
pub(crate) fn layer_key(key: &str) -> Option<u32> {
    if let Ok(n) = key.trim().parse() {
        return Some(n);
    }
    if key.trim().parse::<f64>().is_ok() {
        return None;
    }
    let runs: Vec<&str> = key.split(|c: char| !c.is_ascii_digit()).filter(|s| !s.is_empty()).collect();
    match runs.as_slice() {
        [one] => one.parse().ok(),
        _ => None,
    }
}

/// An array of counts at `what` (for messages).
fn count_vec(v: &Value, what: &str) -> Result<Vec<u64>> {
    let arr =
        v.as_array().ok_or_else(|| invalid(what, format!("{} is not an array of per-expert counts", short(v))))?;
    arr.iter()
        .enumerate()
        .map(|(x, c)| whole(c).ok_or_else(|| invalid(format!("{what} expert {x}"), not_a_count(c))))
        .collect()
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 40 { format!("{}...", &s[..s.char_indices().nth(40).map_or(s.len(), |(i, _)| i)]) } else { s }
}

/// Sorts by key, refusing a key twice and vectors of different lengths.
fn finish(
    path: &Path,
    mut layers: Vec<(u32, Vec<u64>, String)>,
    note: Option<String>,
    top_k: Option<u32>,
) -> Result<RawCounts> {
    if layers.is_empty() {
        return Err(invalid(path.display().to_string(), "holds no layer"));
    }
    layers.sort_by_key(|(k, _, _)| *k);
    if let Some(w) = layers.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(invalid(
            format!("{}: {}", path.display(), w[1].2),
            format!("layer {} again (also {}): each layer once", w[1].0, w[0].2),
        ));
    }
    let e = layers[0].1.len();
    if e == 0 {
        return Err(invalid(format!("{}: {}", path.display(), layers[0].2), "has no experts"));
    }
    if let Some((_, v, what)) = layers.iter().find(|(_, v, _)| v.len() != e) {
        return Err(invalid(
            format!("{}: {what}", path.display()),
            format!("has {} experts, {} has {e}: every layer needs one count per expert", v.len(), layers[0].2),
        ));
    }
    Ok(RawCounts { layers: layers.into_iter().map(|(k, v, _)| (k, v)).collect(), top_k, note })
}

/// The two JSON layouts.
pub(super) fn json(path: &Path, value: &Value) -> Result<RawCounts> {
    let file = path.display().to_string();
    let obj = value.as_object().ok_or_else(|| {
        invalid(
            &file,
            "the top level is not an object: expected {layer: [counts]} or {\"layers\": [...], \"counts\": [[...]]}",
        )
    })?;
    let top_k = match obj.get("top_k") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|k| u32::try_from(k).ok())
                .ok_or_else(|| invalid(format!("{file}: key `top_k`"), format!("{v} is not a whole number")))?,
        ),
    };
    if let Some(counts) = obj.get("counts") {
        let rows = counts.as_array().ok_or_else(|| {
            invalid(format!("{file}: key `counts`"), "is not an array of layers (one array of per-expert counts each)")
        })?;
        let ids: Vec<u32> = match obj.get("layers") {
            None | Some(Value::Null) => (0..rows.len() as u32).collect(),
            Some(v) => {
                let a = v
                    .as_array()
                    .ok_or_else(|| invalid(format!("{file}: key `layers`"), "is not an array of layer ids"))?;
                a.iter()
                    .enumerate()
                    .map(|(i, x)| {
                        x.as_u64().and_then(|x| u32::try_from(x).ok()).ok_or_else(|| {
                            invalid(
                                format!("{file}: key `layers` entry {i}"),
                                format!("{x} is not a layer id (a whole number)"),
                            )
                        })
                    })
                    .collect::<Result<_>>()?
            }
        };
        if ids.len() != rows.len() {
            return Err(invalid(
                format!("{file}: key `layers`"),
                format!("has {} ids but `counts` has {} layers: one id per row of counts", ids.len(), rows.len()),
            ));
        }
        let mut layers = Vec::with_capacity(rows.len());
        for (i, (id, row)) in ids.iter().zip(rows).enumerate() {
            let what = format!("key `counts` row {i} (layer {id})");
            layers.push((*id, count_vec(row, &format!("{file}: {what}"))?, what));
        }
        return finish(path, layers, None, top_k);
    }
    let mut layers = Vec::with_capacity(obj.len());
    let mut named = false;
    for (key, v) in obj {
        if key == "top_k" {
            continue;
        }
        let id = layer_key(key).ok_or_else(|| {
            if key.trim().parse::<f64>().is_ok() {
                return invalid(
                    format!("{file}: key `{key}`"),
                    format!("{} is not a layer id: layer ids are whole numbers >= 0", key.trim()),
                );
            }
            invalid(
                format!("{file}: key `{key}`"),
                "is not a layer: expected {layer: [counts]} with keys that are layer ids (or names with one number, \
                 such as model.layers.3.mlp), or {\"layers\": [...], \"counts\": [[...]]}",
            )
        })?;
        named |= key.trim().parse::<u32>().is_err();
        let what = format!("key `{key}`");
        layers.push((id, count_vec(v, &format!("{file}: {what}"))?, what));
    }
    let note = named.then(|| "layer ids taken from the number in each key".to_string());
    finish(path, layers, note, top_k)
}

/// Column positions of (layer, expert, count) from a header, if the first record is one.
fn header_columns(rec: &csv::StringRecord) -> Option<Result<[usize; 3]>> {
    if rec.iter().next().is_some_and(|f| f.trim().parse::<f64>().is_ok()) {
        return None;
    }
    let find = |names: &[&str]| rec.iter().position(|f| names.contains(&f.trim().to_ascii_lowercase().as_str()));
    let cols = [
        find(&["layer", "layer_id", "layer_idx"]),
        find(&["expert", "expert_id", "expert_idx"]),
        find(&["count", "counts", "freq", "frequency", "hits", "activations"]),
    ];
    Some(match cols {
        [Some(l), Some(e), Some(c)] => Ok([l, e, c]),
        _ => Err(invalid(
            "header",
            format!(
                "columns {:?}: expected columns named layer, expert and count (or layer_id, expert_id, freq, hits)",
                rec.iter().collect::<Vec<_>>()
            ),
        )),
    })
}

/// The 1-based line of the first record of a CSV text: the first line that is neither a `#`
/// comment nor empty (the lines the csv reader skips).
fn first_record_line(bytes: &[u8]) -> u64 {
    let skipped =
        bytes.split(|&b| b == b'\n').take_while(|l| l.first() == Some(&b'#') || l.is_empty() || *l == b"\r").count();
    skipped as u64 + 1
}

/// `layer, expert, count` rows.
pub(super) fn csv(path: &Path, bytes: &[u8], num_experts: Option<u32>) -> Result<RawCounts> {
    let file = path.display().to_string();
    let tab = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("tsv"))
        || bytes.split(|&b| b == b'\n').next().is_some_and(|l| l.contains(&b'\t') && !l.contains(&b','));
    let mut r = csv::ReaderBuilder::new()
        .has_headers(false)
        .delimiter(if tab { b'\t' } else { b',' })
        .trim(csv::Trim::All)
        .comment(Some(b'#'))
        .from_reader(bytes);
    let mut cols = [0, 1, 2];
    let mut cells: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    let mut first = true;
    let mut headered = false;
    // The csv reader numbers the first record as if the comment lines before it were not there
    // (its later records are numbered from the top of the file): that line is counted here.
    let first_line = first_record_line(bytes);
    for rec in r.records() {
        let rec = rec.map_err(|e| {
            let line = if first { first_line } else { e.position().map_or(0, csv::Position::line) };
            invalid(format!("{file}:{line}"), format!("not a CSV row: {e}"))
        })?;
        let line = if first { first_line } else { rec.position().map_or(0, csv::Position::line) };
        if first {
            first = false;
            if let Some(h) = header_columns(&rec) {
                cols = h.map_err(|e| match e {
                    crate::SaliencyError::Invalid { reason, .. } => invalid(format!("{file}:{line}"), reason),
                    other => other,
                })?;
                headered = true;
                continue;
            }
        }
        // Without a header, a row is exactly (layer, expert, count): a wider row (a matrix of
        // counts, one row per layer, or an index column) would be read wrongly in its first three.
        if !headered && rec.len() != 3 {
            return Err(invalid(
                format!("{file}:{line}"),
                format!(
                    "{} fields: a CSV without a header holds rows `layer, expert, count` (3 fields); name the columns \
                     in a header line (`layer,expert,count`), or give a matrix of counts (one row per layer) as .npy \
                     or JSON",
                    rec.len()
                ),
            ));
        }
        let field = |i: usize, name: &str| -> Result<&str> {
            rec.get(cols[i]).ok_or_else(|| {
                invalid(format!("{file}:{line}"), format!("{} fields, no `{name}` (column {})", rec.len(), cols[i] + 1))
            })
        };
        let int = |i: usize, name: &str| -> Result<u64> {
            let f = field(i, name)?;
            let v: Value = serde_json::from_str(f).unwrap_or(Value::Null);
            whole(&v).ok_or_else(|| {
                invalid(format!("{file}:{line}: field `{name}`"), format!("`{f}` is not a whole number >= 0"))
            })
        };
        let layer = int(0, "layer")?;
        let expert = int(1, "expert")?;
        let count = int(2, "count")?;
        let layer = u32::try_from(layer).map_err(|_| invalid(format!("{file}:{line}: field `layer`"), "too large"))?;
        let expert =
            u32::try_from(expert).map_err(|_| invalid(format!("{file}:{line}: field `expert`"), "too large"))?;
        if let Some(n) = num_experts
            && expert >= n
        {
            return Err(invalid(
                format!("{file}:{line}: field `expert`"),
                format!("{expert} >= --num-experts {n}: correct --num-experts or the file"),
            ));
        }
        if let Some((_, prev)) = cells.insert((layer, expert), (count, line)) {
            return Err(invalid(
                format!("{file}:{line}"),
                format!("layer {layer} expert {expert} again (first at line {prev}): each pair once"),
            ));
        }
    }
    if cells.is_empty() {
        return Err(invalid(&file, "holds no `layer, expert, count` row"));
    }
    // Ids counted from 1 would give an expert 0 that is never counted and one expert too many:
    // without --num-experts to say how many there are, that is refused rather than guessed.
    if num_experts.is_none() && !cells.keys().any(|&(_, x)| x == 0) {
        let top = cells.keys().map(|&(_, x)| x).max().unwrap_or(0);
        return Err(invalid(
            &file,
            format!(
                "expert 0 appears in no layer (ids {}..={top}): if the file counts experts from 1, subtract 1 from \
                 its expert column; if expert 0 is really never routed, give --num-experts {} to confirm",
                cells.keys().map(|&(_, x)| x).min().unwrap_or(0),
                top + 1
            ),
        ));
    }
    let e = cells.keys().map(|&(_, x)| x as usize + 1).max().unwrap_or(0).max(num_experts.unwrap_or(0) as usize);
    let mut layers: Vec<(u32, Vec<u64>, String)> = Vec::new();
    for (&(layer, expert), &(count, _)) in &cells {
        if layers.last().is_none_or(|l| l.0 != layer) {
            layers.push((layer, vec![0; e], format!("layer {layer}")));
        }
        if let Some(l) = layers.last_mut() {
            l.1[expert as usize] = count;
        }
    }
    finish(path, layers, None, None)
}

/// An `[L, E]` NumPy array.
pub(super) fn npy(path: &Path, bytes: &[u8]) -> Result<RawCounts> {
    let file = path.display().to_string();
    let bad = |e: std::io::Error| invalid(&file, format!("not a readable .npy file: {e}"));
    let f = npyz::NpyFile::new(bytes).map_err(bad)?;
    let shape = f.shape().to_vec();
    let [l, e] = shape[..] else {
        return Err(invalid(&file, format!("array of shape {shape:?}: expected [layers, experts]")));
    };
    let fortran = f.order() == npyz::Order::Fortran;
    let npyz::DType::Plain(ts) = f.dtype() else {
        return Err(invalid(&file, format!("dtype {}: expected integers or floats", f.dtype().descr())));
    };
    use npyz::TypeChar;
    let size = ts.size_field();
    // JSON has no NaN or infinity (`Value::from` makes them null): kept as their names for the
    // message.
    let to_value = |v: f64| if v.is_finite() { Value::from(v) } else { Value::String(v.to_string()) };
    let values: Vec<Value> = match (ts.type_char(), size) {
        (TypeChar::Int, 1) => f.into_vec::<i8>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Int, 2) => f.into_vec::<i16>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Int, 4) => f.into_vec::<i32>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Int, 8) => f.into_vec::<i64>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Uint, 1) => f.into_vec::<u8>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Uint, 2) => f.into_vec::<u16>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Uint, 4) => f.into_vec::<u32>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Uint, 8) => f.into_vec::<u64>().map_err(bad)?.into_iter().map(Value::from).collect(),
        (TypeChar::Float, 4) => f.into_vec::<f32>().map_err(bad)?.into_iter().map(|v| to_value(f64::from(v))).collect(),
        (TypeChar::Float, 8) => f.into_vec::<f64>().map_err(bad)?.into_iter().map(to_value).collect(),
        _ => return Err(invalid(&file, format!("dtype {ts}: expected integers or floats (i1-i8, u1-u8, f4, f8)"))),
    };
    let (l, e) = (l as usize, e as usize);
    let mut layers = Vec::with_capacity(l);
    for li in 0..l {
        let mut row = Vec::with_capacity(e);
        for x in 0..e {
            let v = &values[if fortran { x * l + li } else { li * e + x }];
            row.push(whole(v).ok_or_else(|| {
                invalid(
                    format!("{file}: row {li} (layer index {li}) expert {x}"),
                    format!("{} is not a whole number >= 0", v.as_str().map_or_else(|| v.to_string(), str::to_string)),
                )
            })?);
        }
        layers.push((li as u32, row, format!("row {li}")));
    }
    finish(path, layers, Some("rows are layer indices".to_string()), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_keys_are_ids_or_the_one_number_in_a_name() {
        let cases = [
            ("3", Some(3)),
            (" 12 ", Some(12)),
            ("model.layers.7.mlp", Some(7)),
            ("layer_26", Some(26)),
            ("blocks.3.experts.1", None),
            ("-1", None),
            (" -12", None),
            ("2.5", None),
            ("1e3", None),
            ("layer-1", Some(1)),
            ("router", None),
        ];
        for (key, want) in cases {
            assert_eq!(layer_key(key), want, "{key}");
        }
    }

    #[test]
    fn the_first_csv_record_is_numbered_after_comments_and_empty_lines() {
        let cases: [(&[u8], u64); 4] = [
            (b"0,0,2\n", 1),
            (b"# c\n0,0,2\n", 2),
            (b"# c\n\n# d\r\n\r\n0,0,2\n", 5),
            (b"layer,expert,count\n# c\n0,0,2\n", 1),
        ];
        for (text, want) in cases {
            assert_eq!(first_record_line(text), want, "{:?}", String::from_utf8_lossy(text));
        }
    }

    #[test]
    fn whole_numbers_only() {
        let cases = [("3", Some(3)), ("24415.0", Some(24415)), ("2.5", None), ("-1", None), ("\"3\"", None)];
        for (text, want) in cases {
            assert_eq!(whole(&serde_json::from_str(text).unwrap()), want, "{text}");
        }
    }
}
