//! The derived fields of a sweep row (SEMANTICS.md §8.5), each row kind with its own cost model,
//! written from the text, not from the sweep's code:
//! - plain rows (and shuffled rows without a predictor): §6, `misses / tokens` per token;
//! - deployed rows (pins, cap 0, tier 2, batches): §6 extended by §10 (tier 2) and §11 (steps);
//! - prefetch rows: bytes moved as §12 counts them (misses − forced misses + prefetch loads) and
//!   the §13 timeline's tok/s, which the row also lists under `prefetch.timeline` (the timeline
//!   itself is re-derived by the reference replay, `rederive`).
//!
//! A failure names the row and the figure: `frequency@16/lru/0/0/8/4/batch:4 (in_sample):
//! cost[1].tok_s is 50.1, §11 gives 48.7`.

use sweep::{DeviceProfile, Row};

/// Relative tolerance of the floating-point figures (they are recomputed in another order).
const REL: f64 = 1e-9;

/// Equal to rounding: the fast code sums in its own order, the reference in f64.
pub(super) fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= REL * a.abs().max(b.abs()).max(1e-12)
}

/// One figure compared: `Err` naming it when `got` is not `want`.
fn figure(name: &str, got: f64, want: f64, model: &str) -> Result<(), String> {
    if close(got, want) { Ok(()) } else { Err(format!("{name} is {got}, {model} gives {want}")) }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// The first derived figure of `r` that does not follow from its counts, with `profiles` the
/// device profiles of its sweep (one cost entry per profile and bandwidth, in order).
pub fn row_problem(profiles: &[DeviceProfile], r: &Row) -> Option<String> {
    check_row(profiles, r).err().map(|e| format!("{} ({}): {e}", r.key, r.sample.as_str()))
}

fn check_row(profiles: &[DeviceProfile], r: &Row) -> Result<(), String> {
    let c = &r.counts;
    let served = r.config.deploy.as_ref().is_some_and(|d| d.batch.is_some());
    figure("hit_rate", r.hit_rate, ratio(c.hits, c.picks), "hits / picks")?;
    figure("misses_per_token", r.misses_per_token, ratio(c.misses, c.tokens), "misses / tokens")?;
    // Per token every pick is a hit or a miss; served, one load serves every row of a step.
    if !served && c.hits + c.misses != c.picks {
        return Err(format!("hits + misses = {} but picks = {}", c.hits + c.misses, c.picks));
    }
    if served && c.hits + c.misses > c.picks {
        return Err(format!("hits + misses = {} exceed picks = {} (§11)", c.hits + c.misses, c.picks));
    }
    let points: Vec<(&DeviceProfile, f64)> =
        profiles.iter().flat_map(|p| p.bandwidth_gbps.iter().map(move |b| (p, *b))).collect();
    if r.cost.len() != points.len() {
        return Err(format!("{} cost entries, the profiles give {}", r.cost.len(), points.len()));
    }
    for (i, (cost, &(p, bw))) in r.cost.iter().zip(&points).enumerate() {
        if cost.profile != p.name || cost.bandwidth_gbps != bw {
            return Err(format!(
                "cost[{i}] is {}@{}, the profiles give {}@{bw}",
                cost.profile, cost.bandwidth_gbps, p.name
            ));
        }
        let (ssd, tok_s, model) = expected_cost(r, p, bw, i)?;
        figure(&format!("cost[{i}].ssd_mb_per_token"), cost.ssd_mb_per_token, ssd, model)?;
        figure(&format!("cost[{i}].tok_s"), cost.tok_s, tok_s, model)?;
    }
    if let Some(h) = &r.hybrid {
        if h.cost.len() != profiles.len() {
            return Err(format!("hybrid.cost has {} entries, the profiles give {}", h.cost.len(), profiles.len()));
        }
        if h.rows != c.tokens {
            return Err(format!("hybrid.rows is {}, counts.tokens {}", h.rows, c.tokens));
        }
        if h.pinned_hits > c.hits {
            return Err(format!("hybrid.pinned_hits {} exceed hits {}", h.pinned_hits, c.hits));
        }
        // §14: every miss that is not forced is a host run or a load.
        if h.host_runs + h.loads != c.misses - c.forced_misses {
            return Err(format!(
                "hybrid.host_runs + loads = {} but misses - forced_misses = {} (§14)",
                h.host_runs + h.loads,
                c.misses - c.forced_misses
            ));
        }
    }
    if let Some(d) = &r.deploy {
        figure("deploy.loads_per_step", d.loads_per_step, ratio(c.misses, d.steps), "misses / steps")?;
        if d.rows != c.tokens {
            return Err(format!("deploy.rows is {}, counts.tokens {}", d.rows, c.tokens));
        }
        if d.pinned_hits > c.hits {
            return Err(format!("deploy.pinned_hits {} exceed hits {}", d.pinned_hits, c.hits));
        }
    }
    if let Some(f) = &r.prefetch {
        if f.wasted + f.useful != f.prefetch_loads {
            return Err(format!("useful + wasted = {} but prefetch_loads = {}", f.useful + f.wasted, f.prefetch_loads));
        }
        let demand = c.misses - c.forced_misses;
        let defined = |got: Option<f64>, num: u64, den: u64, name: &str| match (got, den) {
            (None, 0) => Ok(()),
            (Some(g), d) if d > 0 => figure(&format!("prefetch.{name}"), g, num as f64 / d as f64, "§12"),
            (g, d) => Err(format!("prefetch.{name} is {g:?} with a denominator of {d} (null exactly when 0/0)")),
        };
        defined(f.precision, f.useful, f.prefetch_loads, "precision")?;
        defined(f.coverage, f.useful, f.useful + demand, "coverage")?;
        figure("prefetch.loads_per_token", f.loads_per_token, ratio(demand + f.prefetch_loads, c.tokens), "§12")?;
    }
    Ok(())
}

/// What cost entry `i` (profile `p` at `bw`) of `r` must hold: (ssd_mb_per_token, tok_s, the
/// model's name).
fn expected_cost(r: &Row, p: &DeviceProfile, bw: f64, i: usize) -> Result<(f64, f64, &'static str), String> {
    let c = &r.counts;
    let mb = p.expert_mb;
    if let Some(h) = &r.hybrid {
        // §14: nothing is read from storage (non-resident experts live in host memory); every
        // bandwidth of a profile gives the profile's hybrid tok/s.
        let e = h
            .cost
            .iter()
            .find(|e| e.profile == p.name)
            .ok_or_else(|| format!("hybrid.cost has no entry for profile {}", p.name))?;
        return Ok((0.0, e.tok_s, "§14"));
    }
    if let Some(f) = &r.prefetch {
        // §12's bytes moved (forced misses load nothing, §13) and the timeline's tok/s.
        let moved = ratio(c.misses - c.forced_misses + f.prefetch_loads, c.tokens) * mb;
        let t = f.timeline.get(i).ok_or_else(|| format!("prefetch.timeline has no entry {i}"))?;
        if t.profile != p.name || t.bandwidth_gbps != bw {
            return Err(format!(
                "prefetch.timeline[{i}] is {}@{}, the profiles give {}@{bw}",
                t.profile, t.bandwidth_gbps, p.name
            ));
        }
        return Ok((moved, t.tok_s, "the §13 timeline"));
    }
    let Some(key) = r.config.deploy.as_ref() else {
        let mpt = ratio(c.misses, c.tokens);
        return Ok((mpt * mb, 1.0 / (p.compute_ms / 1000.0 + mpt * mb / (1000.0 * bw)), "§6"));
    };
    let d = r.deploy.as_ref().ok_or("a deployed configuration without its deploy figures")?;
    let seconds = |n: u64, gbps: f64| n as f64 * mb / (1000.0 * gbps);
    let link = |n: u64| p.link_gbps.map_or(0.0, |g| seconds(n, g));
    // §10: tier-2 hits over the link, storage reads from the SSD (and over the link, when given);
    // one tier: every miss from the SSD, as §6.
    let (transfer, reads, model) = match key.tier2 {
        Some(_) => (link(d.t2_hits) + seconds(d.storage_reads, bw) + link(d.storage_reads), d.storage_reads, "§10"),
        None => (seconds(c.misses, bw), c.misses, "§6"),
    };
    let rows = d.rows.max(1) as f64;
    let ssd = reads as f64 / rows * mb;
    if key.batch.is_some() {
        // §11: Σ step times = steps · compute per step + transfer; tok/s = rows / that.
        let step = p.compute_ms_per_step.unwrap_or(p.compute_ms) / 1000.0;
        let total = d.steps as f64 * step + transfer;
        Ok((ssd, if total > 0.0 { d.rows as f64 / total } else { 0.0 }, "§11"))
    } else {
        Ok((ssd, 1.0 / (p.compute_ms / 1000.0 + transfer / rows), model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sweep::{Cost, Sample};

    /// A plain row of 10 tokens, 40 picks, 30 hits, 10 misses on the reference profile at 3.9 GB/s.
    fn plain_row() -> Row {
        let p = DeviceProfile::reference();
        let mut counts = cachesim::ReplayCounts { tokens: 10, picks: 40, hits: 30, misses: 10, ..Default::default() };
        counts.layer_misses = vec![10];
        let cost = p
            .bandwidth_gbps
            .iter()
            .map(|&bw| Cost {
                profile: p.name.clone(),
                bandwidth_gbps: bw,
                ssd_mb_per_token: p.expert_mb,
                tok_s: 1.0 / (0.012 + p.expert_mb / (1000.0 * bw)),
            })
            .collect();
        let config: sweep::ConfigKey = serde_json::from_value(serde_json::json!({
            "variant": "full", "policy": "lru", "lambda": 0.0, "j": 0, "cap": 4, "k_used": 4
        }))
        .unwrap();
        Row {
            key: config.to_string(),
            sample: Sample::InSample,
            config,
            counts,
            hit_rate: 0.75,
            misses_per_token: 1.0,
            cost,
            deploy: None,
            prefetch: None,
            hybrid: None,
        }
    }

    #[test]
    fn each_figure_is_named() {
        let profiles = [DeviceProfile::reference()];
        let check = |edit: &dyn Fn(&mut Row), expect: Option<&str>| {
            let mut r = plain_row();
            edit(&mut r);
            let got = row_problem(&profiles, &r);
            match expect {
                None => assert_eq!(got, None),
                Some(e) => assert!(got.as_deref().is_some_and(|g| g.contains(e)), "{got:?} lacks {e}"),
            }
        };
        check(&|_| {}, None);
        check(&|r| r.hit_rate = 0.5, Some("hit_rate is 0.5"));
        check(&|r| r.cost[1].tok_s *= 1.01, Some("cost[1].tok_s"));
        check(&|r| r.cost[0].ssd_mb_per_token = 0.0, Some("cost[0].ssd_mb_per_token is 0, §6"));
        check(&|r| r.counts.hits = 29, Some("hit_rate"));
        check(&|r| r.cost.pop().map(|_| ()).unwrap_or(()), Some("1 cost entries, the profiles give 2"));
    }
}
