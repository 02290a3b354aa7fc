//! The report's memory-budget section: tok/s against the fast memory a configuration takes, one
//! plot per device profile of the sweep, and per memory the best online configuration.
//!
//! Memory of a configuration = Σ over layers of (cache size + pinned experts) × the profile's
//! expert size (SEMANTICS.md §9: memory per layer = |pins| + cap): the per-layer caps when the
//! configuration has them, else the cap in every layer. Configurations with a second tier (two
//! kinds of memory) or re-batching (tok/s per step, not per token) are left out.

use std::collections::BTreeMap;

use anyhow::Result;
use sweep::{DeviceProfile, Row, Sample, SweepOutput};

use super::html::{esc, figure, legend, table};
use super::svg::{Axes, Series, Style, mark_identical, policy_color, xy_plot};

/// Expert slots of fast memory a row's configuration takes over all layers: per layer its cache
/// size plus its pinned experts. `None` for a configuration with a second tier or re-batching,
/// or with prefetch or a shuffled order (SEMANTICS.md §12: priced by the timeline, or not a
/// deployable order), or with hybrid execution (§14: priced by its own model, in the hybrid
/// section).
pub(super) fn slots(r: &Row) -> Option<usize> {
    let d = r.config.deploy.as_ref();
    if d.is_some_and(|d| d.tier2.is_some() || d.batch.is_some())
        || r.config.prefetch.is_some()
        || r.config.hybrid.is_some()
    {
        return None;
    }
    let layers = r.counts.layer_misses.len();
    let caps = r.config.layer_caps.as_ref().map_or(r.config.cap * layers, |c| c.caps.iter().sum());
    let pins: usize = d.and_then(|d| d.pin.as_ref()).map_or(0, |p| p.layers.iter().map(Vec::len).sum());
    Some(caps + pins)
}

/// GB of `slots` experts of `profile` (10^9 bytes; `expert_mb` is in 10^6 bytes).
pub(super) fn gb(slots: usize, profile: &DeviceProfile) -> f64 {
    slots as f64 * profile.expert_mb / 1000.0
}

/// A row's tok/s at the `b`-th bandwidth of profile `name` (its cost entries in grid order).
fn tok_s(r: &Row, name: &str, b: usize) -> Option<f64> {
    r.cost.iter().filter(|c| c.profile == name).nth(b).map(|c| c.tok_s)
}

/// The section: per profile, the plot of the best tok/s per policy at each memory, and the table
/// of the best online configuration at each memory.
pub(super) fn section(sweep: &SweepOutput) -> Result<String> {
    let profiles = sweep.provenance.grid.device_profiles().unwrap_or_default();
    let oos: Vec<(&Row, usize)> =
        sweep.rows.iter().filter(|r| r.sample == Sample::OutOfSample).filter_map(|r| Some((r, slots(r)?))).collect();
    if oos.is_empty() || profiles.is_empty() {
        return Ok("<p>No configuration with a cost: nothing to plot.</p>".into());
    }
    let mut html = String::from(
        "<p>Out of sample, every configuration (any variant, λ, j, pins): fast memory = Σ over layers of (cache \
         size + pinned experts) × the profile's expert size; tok/s from the cost model (SEMANTICS.md §6). One line \
         per policy through its best configuration at each memory (one colour per policy, as on every plot); the \
         table names the best online configuration (Belady excluded: an offline oracle) at each memory.</p>",
    );
    for p in &profiles {
        let Some(bw) = p.bandwidth_gbps.first() else { continue };
        // Per (policy, slots): the row of most tok/s at the first bandwidth (ties: the first key).
        let mut best: BTreeMap<(usize, usize), (f64, &Row)> = BTreeMap::new();
        let policy_index = |r: &Row| cachesim::Policy::ALL.iter().position(|x| *x == r.config.policy).unwrap_or(0);
        for &(r, n) in &oos {
            let Some(t) = tok_s(r, &p.name, 0) else { continue };
            let e = best.entry((policy_index(r), n)).or_insert((t, r));
            if t > e.0 {
                *e = (t, r);
            }
        }
        if best.is_empty() {
            continue;
        }
        let mut by_policy: BTreeMap<usize, Vec<(f64, f64)>> = BTreeMap::new();
        for (&(pi, n), &(t, _)) in &best {
            by_policy.entry(pi).or_default().push((gb(n, p), t));
        }
        let mut series: Vec<Series> = by_policy
            .into_iter()
            .map(|(pi, points)| {
                let name = cachesim::Policy::ALL[pi].as_str();
                Series::new(name, points, Style::of(policy_color(name)))
            })
            .collect();
        mark_identical(&mut series);
        let x = format!("fast memory for experts, GB (cache + pins, all layers; {} MB per expert)", p.expert_mb);
        let y = format!("tok/s at {bw} GB/s ({})", p.name);
        html += &figure(
            &format!("{}: tok/s vs memory budget, best configuration per policy (out of sample)", p.name),
            &xy_plot(&series, &Axes::lines(&x, &y))?,
            &legend(&series),
            "Each point is the policy's configuration of most tok/s among those taking that memory. A series equal \
             to an earlier one is dashed with hollow markers and named <i>(= …)</i>.",
        );
        html += &best_table(&best, p);
    }
    Ok(html)
}

/// Per memory, the online configuration of most tok/s at the first bandwidth, and its tok/s at
/// every bandwidth of the profile.
fn best_table(best: &BTreeMap<(usize, usize), (f64, &Row)>, p: &DeviceProfile) -> String {
    let mut online: BTreeMap<usize, (f64, &Row)> = BTreeMap::new();
    for (&(_, n), &(t, r)) in best.iter().filter(|(_, (_, r))| !r.config.policy.facts().offline) {
        let e = online.entry(n).or_insert((t, r));
        if t > e.0 || (t == e.0 && r.key < e.1.key) {
            *e = (t, r);
        }
    }
    let heads: Vec<String> = p.bandwidth_gbps.iter().map(|b| format!("tok/s at {b} GB/s")).collect();
    let mut header = vec!["fast memory, GB", "expert slots", "best online configuration", "misses/token"];
    header.extend(heads.iter().map(String::as_str));
    let rows: Vec<Vec<String>> = online
        .iter()
        .map(|(&n, &(_, r))| {
            let mut row =
                vec![format!("{:.4}", gb(n, p)), n.to_string(), r.key.clone(), format!("{:.4}", r.misses_per_token)];
            row.extend(
                (0..p.bandwidth_gbps.len()).map(|b| tok_s(r, &p.name, b).map_or("-".into(), |t| format!("{t:.2}"))),
            );
            row
        })
        .collect();
    format!("<h3>{}: best online configuration per memory</h3>{}", esc(&p.name), table(&header, &rows))
}
