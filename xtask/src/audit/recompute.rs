//! Statistics files recomputed from the trace they name (`audit --dir`, §8.1): the trace found
//! and verified against `meta.source_digest`, `Stats::from_trace` run again, and every figure
//! compared exactly with the file's (the same code sums in the same order, and JSON round-trips
//! f64 exactly), the first difference named by layer, statistic and expert.

use std::collections::BTreeMap;
use std::path::Path;

use saliency::Stats;
use serde_json::json;

use super::dir::Options;
use super::locate::{Finder, Located, RecordedHash};
use super::{Check, Status, check};

const SECTION: &str = "1 statistics";

/// The trace a statistics file came from, when it came from one: its `meta.source` without the
/// note `moe-offload stats` may append in parentheses.
fn trace_source(s: &Stats) -> Option<&str> {
    let src = s.meta.source.split_once(" (").map_or(s.meta.source.as_str(), |(p, _)| p);
    (src.ends_with(".safetensors") || src.starts_with("embedded:")).then_some(src)
}

/// The check of one statistics file at `path`, `name` as shown.
pub(super) fn stats_from_trace(name: &str, path: &Path, stats: &Stats, finder: &Finder, opts: &Options) -> Check {
    let title = format!("{name}: recomputed from its trace");
    let Some(source) = trace_source(stats) else {
        let detail = format!("from {:?}, not a trace: not recomputed", stats.meta.source);
        return check(SECTION, &title, true, BTreeMap::from([("detail".to_string(), json!(detail))]), None);
    };
    let sha = &stats.meta.source_digest;
    let fail = |first: String| check(SECTION, &title, false, BTreeMap::new(), Some(first));
    let hash = RecordedHash::parse(sha);
    let trace = match finder.locate(source, path, Some(hash)) {
        Located::Found(p) => p,
        Located::Missing(looked) => {
            let text = super::rederive::missing_text(name, "meta.source trace", source, &looked, finder);
            if opts.no_replay {
                return Check {
                    section: SECTION,
                    name: title,
                    status: Status::Finding,
                    figures: BTreeMap::new(),
                    first_offending: Some(format!("{text}: not recomputed (--no-replay)")),
                };
            }
            return fail(format!("{text}; give --trace-dir DIR, or --no-replay to audit without the traces"));
        }
        Located::Mismatch { path: p, actual } => {
            return fail(format!(
                "{name}: meta.source_digest is {sha}, but {} has {} {actual}: not the trace these statistics came from",
                finder.show(&p),
                hash.algorithm()
            ));
        }
        Located::Unreadable(e) => return fail(format!("{name}: {e}")),
    };
    let file = match trace_io::TraceFile::open(&trace) {
        Ok(f) => f,
        Err(e) => return fail(format!("{name}: its trace {}: {e}", finder.show(&trace))),
    };
    let again = Stats::from_trace(&file.view(), stats.meta.source.clone(), sha.clone());
    let first = first_difference(stats, &again).map(|(what, file, again)| {
        format!("{name}: {what} is {file} in the file, {again} recomputed from {}", finder.show(&trace))
    });
    let f = BTreeMap::from([("trace".to_string(), json!(finder.show(&trace)))]);
    check(SECTION, &title, first.is_none(), f, first)
}

/// The first figure of `file` that differs from `again`: what it is (`layer 3 count[7]`), its
/// value in the file and recomputed.
fn first_difference(file: &Stats, again: &Stats) -> Option<(String, String, String)> {
    let (m, n) = (&file.meta, &again.meta);
    if m.model != n.model {
        return Some(("model".into(), format!("{:?}", m.model), format!("{:?}", n.model)));
    }
    if (m.num_experts, m.top_k) != (n.num_experts, n.top_k) || m.layer_ids != n.layer_ids {
        let shape =
            |m: &saliency::StatsMeta| format!("E = {}, top_k {}, layers {:?}", m.num_experts, m.top_k, m.layer_ids);
        return Some(("the shape".into(), shape(m), shape(n)));
    }
    for ((a, b), id) in file.layers.iter().zip(&again.layers).zip(&m.layer_ids) {
        if a.tokens != b.tokens {
            return Some((format!("layer {id} tokens"), a.tokens.to_string(), b.tokens.to_string()));
        }
        if let Some(e) = (0..a.count.len()).find(|&e| a.count[e] != b.count[e]) {
            return Some((format!("layer {id} count[{e}]"), a.count[e].to_string(), b.count[e].to_string()));
        }
        let optional = [
            ("gate_sum", &a.gate_sum, &b.gate_sum),
            ("ean_sum", &a.ean_sum, &b.ean_sum),
            ("reap_sum", &a.reap_sum, &b.reap_sum),
            ("reap_sumsq", &a.reap_sumsq, &b.reap_sumsq),
        ];
        for (stat, x, y) in optional {
            match (x, y) {
                (Some(x), Some(y)) => {
                    if let Some(e) = (0..x.len()).find(|&e| x[e] != y[e]) {
                        return Some((format!("layer {id} {stat}[{e}]"), x[e].to_string(), y[e].to_string()));
                    }
                }
                (None, None) => {}
                _ => {
                    let has = |v: &Option<Vec<f64>>| if v.is_some() { "present" } else { "absent" };
                    return Some((format!("layer {id} {stat}"), has(x).into(), has(y).into()));
                }
            }
        }
        if a.reap_missing != b.reap_missing {
            return Some((
                format!("layer {id} reap_missing"),
                format!("{:?}", a.reap_missing),
                format!("{:?}", b.reap_missing),
            ));
        }
    }
    None
}
