//! `sweep merge`: the outputs of every shard of one sweep (`sweep --shard I/N`) joined into the
//! output of the unsharded run, after checking that they belong together.

use crate::{InputRef, Provenance, Result, Row, Shard, SweepError, SweepOutput};

impl SweepOutput {
    /// Joins the outputs of every shard of one sweep into the output of the unsharded run
    /// (byte-identical once written). Each output comes with the name errors give it (its
    /// directory, say); the order does not matter.
    ///
    /// The shards must come from the same grid and inputs: the same tool version, SHA-256 of both
    /// traces, of the in-sample statistics and of every other file the grid names
    /// ([`Provenance::files`]), the same grid and the same trace paths as the grid wrote them.
    /// Every index `0..N` must be present once, and no configuration may appear twice.
    ///
    /// # Errors
    /// [`SweepError::Merge`] naming the shard: an output that is not a shard, of another shard
    /// count, given twice, or whose provenance differs from the first one's (saying what differs,
    /// with both values); a missing index; a configuration found in two outputs.
    pub fn merge(parts: Vec<(String, SweepOutput)>) -> Result<SweepOutput> {
        let bad = |reason: String| Err(SweepError::Merge { reason });
        let Some((first_name, first)) = parts.first() else { return bad("no shard outputs given".into()) };
        let Some(Shard { count, .. }) = first.shard else {
            return bad(format!("{first_name} is not a shard output (no `shard` field: a whole or merged sweep)"));
        };
        let mut seen: Vec<Option<&str>> = vec![None; count];
        for (name, p) in &parts {
            let Some(sh) = p.shard else {
                return bad(format!("{name} is not a shard output (no `shard` field: a whole or merged sweep)"));
            };
            if sh.count != count || sh.index >= count {
                return bad(format!(
                    "{name} is shard {}/{}, but {first_name} is a shard of {count}: not the same split",
                    sh.index, sh.count
                ));
            }
            if let Some(earlier) = seen[sh.index].replace(name) {
                return bad(format!("shard {}/{count} given twice: {earlier} and {name}", sh.index));
            }
            if let Some(what) = difference(&first.provenance, &p.provenance) {
                return bad(format!(
                    "{name} (shard {}/{count}) is not from the same grid and inputs as {first_name}: {what}",
                    sh.index
                ));
            }
        }
        let missing: Vec<String> =
            seen.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(i, _)| format!("{i}/{count}")).collect();
        if !missing.is_empty() {
            let plural = |n: usize| if n == 1 { "" } else { "s" };
            let (m, n) = (missing.len(), parts.len());
            return bad(format!("shard{} {} missing ({n} output{} given)", plural(m), missing.join(", "), plural(n)));
        }
        let provenance = first.provenance.clone();
        let names: Vec<String> = parts.iter().map(|(n, _)| n.clone()).collect();
        let mut rows: Vec<(Row, usize)> =
            parts.into_iter().enumerate().flat_map(|(i, (_, p))| p.rows.into_iter().map(move |r| (r, i))).collect();
        rows.sort_by(|(a, _), (b, _)| a.config.cmp(&b.config).then(a.sample.cmp(&b.sample)));
        if let Some(w) = rows.windows(2).find(|w| w[0].0.config == w[1].0.config && w[0].0.sample == w[1].0.sample) {
            let (r, a, b) = (&w[0].0, &names[w[0].1], &names[w[1].1]);
            return bad(format!("configuration {} ({}) is in both {a} and {b}", r.key, r.sample.as_str()));
        }
        Ok(SweepOutput { provenance, shard: None, rows: rows.into_iter().map(|(r, _)| r).collect() })
    }
}

/// The first way `b` differs from `a`, as `its WHAT differs: A vs B`; `None` when they agree.
/// Hashes before paths: a trace given with `--in-sample` shows as its digest (`blake3:HEX`).
fn difference(a: &Provenance, b: &Provenance) -> Option<String> {
    let differs = |what: &str, x: &str, y: &str| (x != y).then(|| format!("its {what} differs: {x} vs {y}"));
    let sha = |what: &str, x: &InputRef, y: &InputRef| {
        differs(&format!("{what} (digest)"), &x.digest.to_string(), &y.digest.to_string())
    };
    differs("tool version", &a.tool_version, &b.tool_version)
        .or_else(|| sha("in-sample trace", &a.in_sample, &b.in_sample))
        .or_else(|| sha("out-of-sample trace", &a.out_of_sample, &b.out_of_sample))
        .or_else(|| differs("in-sample statistics (SHA-256)", &a.stats_sha256, &b.stats_sha256))
        .or_else(|| files_difference(&a.files, &b.files))
        .or_else(|| (a.grid != b.grid).then(|| format!("its grid differs ({})", grid_fields(a, b))))
        .or_else(|| differs("in-sample trace path", &a.in_sample.source, &b.in_sample.source))
        .or_else(|| differs("out-of-sample trace path", &a.out_of_sample.source, &b.out_of_sample.source))
}

/// The first file named by one grid that the other lacks or holds with another SHA-256.
fn files_difference(a: &[InputRef], b: &[InputRef]) -> Option<String> {
    let find = |list: &[InputRef], source: &str| list.iter().find(|f| f.source == source).map(|f| f.digest.clone());
    for f in a {
        match find(b, &f.source) {
            None => return Some(format!("its grid does not name the file {}", f.source)),
            Some(d) if d != f.digest => {
                return Some(format!("its file {} differs (digest): {} vs {d}", f.source, f.digest));
            }
            Some(_) => {}
        }
    }
    b.iter().find(|f| find(a, &f.source).is_none()).map(|f| format!("its grid also names the file {}", f.source))
}

/// The top-level grid fields whose values differ, for the message (`variants`, `blocks`, ...).
fn grid_fields(a: &Provenance, b: &Provenance) -> String {
    let (Ok(serde_json::Value::Object(x)), Ok(serde_json::Value::Object(y))) =
        (serde_json::to_value(&a.grid), serde_json::to_value(&b.grid))
    else {
        return "its JSON differs".into();
    };
    let keys: Vec<&str> = x.iter().filter(|(k, v)| y.get(*k) != Some(v)).map(|(k, _)| k.as_str()).collect();
    format!("field{} {}", if keys.len() == 1 { "" } else { "s" }, keys.join(", "))
}
