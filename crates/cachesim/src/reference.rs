//! A plain reference replayer (SEMANTICS.md §8.4), written for clarity, not speed.
//!
//! It follows SEMANTICS.md §5 step by step for one layer at a time, single-threaded, with
//! `BTreeMap`s, `Vec`s and f64: the decays in the lazy form that §5 defines (a multiplier M,
//! credits x · M, a rescale when M exceeds 1e100) and the softmax with the project's
//! [`crate::exp::exp`]. It shares no replay code with the fast replayer ([`crate::replay`]);
//! both must produce identical [`ReplayCounts`] on every configuration.

use std::collections::{BTreeMap, BTreeSet};

use trace_io::TraceView;

use crate::{Keep, LayerCounts, Policy, ReplayConfig, ReplayCounts, Result, Semantics};

/// Replays `trace` like [`crate::replay`], plainly and on one thread.
///
/// # Errors
/// As [`crate::replay`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig) -> Result<ReplayCounts> {
    let shape = trace.shape();
    crate::validate(&shape, trace.parts().scores.is_some(), cfg)?;
    keep.check_shape(&shape)?;
    // Written for clarity, it builds F from whole rows: every candidate, whatever the policy.
    let scores = cfg.lambda > 0.0 || cfg.policy == Policy::InvRouter;
    crate::require(trace, trace_io::Reads { scores, ..trace_io::Reads::ids(usize::MAX) })?;
    let mut layers = Vec::new();
    for l in 0..shape.layers {
        layers.push(replay_layer(trace, keep, cfg, l));
    }
    Ok(ReplayCounts::from_layers(&shape, cfg.warmup, &layers))
}

/// What the cache remembers about one cached expert.
struct Entry {
    /// Pick time of insertion (fifo).
    inserted_at: u64,
    /// Pick time of the last access (lru, and the tie-breaker of lfu and the near/router policies).
    last_access: u64,
    /// Accesses since insertion, including the inserting one (lfu).
    accesses: u64,
    /// Next token at which the expert is chosen again, `None` = never (belady).
    next_use: Option<usize>,
}

fn replay_layer(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, l: usize) -> LayerCounts {
    let shape = trace.shape();
    let num_experts = shape.num_experts;
    let k_used = cfg.k_used_or(shape.top_k);
    let sequence_starts: BTreeSet<usize> = match (cfg.reset_at_sequence, trace.seq_offsets()) {
        (true, Some(offsets)) => offsets.iter().map(|&o| o as usize).collect(),
        _ => BTreeSet::new(),
    };

    // Belady needs the future: the λ = 0 selections of every token, and for each (token, chosen
    // expert) the next token at which that expert is chosen again.
    let next_use: Vec<BTreeMap<u16, Option<usize>>> = if cfg.policy == Policy::Belady {
        belady_next_uses(trace, keep, l, k_used, &sequence_starts)
    } else {
        Vec::new()
    };

    let mut counts = LayerCounts::default();
    let mut cache: BTreeMap<u16, Entry> = BTreeMap::new();
    let mut near_last: BTreeMap<u16, usize> = BTreeMap::new();
    // The lazy decay of §5: multiplier M, stored scores S, 1/d computed once.
    let mut multiplier: f64 = 1.0;
    let mut score: Vec<f64> = vec![0.0; num_experts];
    let inverse_decay = 1.0 / cfg.decay;
    let mut clock: u64 = 0;

    for t in 0..shape.tokens {
        if sequence_starts.contains(&t) {
            cache.clear();
            near_last.clear();
            multiplier = 1.0;
            score = vec![0.0; num_experts];
        }
        let row = trace.row(l, t);
        let row_scores: Option<&[f32]> = trace.layer_scores(l).map(|s| &s[t * row.len()..(t + 1) * row.len()]);

        // Step 1: F = kept candidates in order, with their position in the row; n.
        let f: Vec<(usize, u16)> =
            row.iter().enumerate().filter(|&(_, &e)| keep.is_kept(l, usize::from(e))).map(|(i, &e)| (i, e)).collect();
        let n = k_used.min(f.len());

        // Step 2: selection.
        let chosen: Vec<(usize, u16)> = if cfg.lambda == 0.0 {
            f[..n].to_vec()
        } else {
            let z_row = row_scores.expect("validate() guarantees scores when lambda > 0");
            let z = |i: usize| f64::from(z_row[i]);
            let delta = if n <= 1 { 0.0 } else { z(f[0].0) - z(f[n - 1].0) };
            let mut ranked: Vec<(f64, usize, usize, u16)> = Vec::new(); // (score, rank, position, expert)
            for (r, &(i, e)) in f.iter().enumerate() {
                let boosted = r < cfg.j || cache.contains_key(&e);
                let s = if boosted { z(i) + cfg.lambda * delta } else { z(i) };
                ranked.push((s, r, i, e));
            }
            ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("finite scores").then(a.1.cmp(&b.1)));
            ranked[..n].iter().map(|&(_, _, i, e)| (i, e)).collect()
        };

        // Step 3: counting, from token W on.
        let counted = t >= cfg.warmup;
        if counted {
            counts.picks += k_used as u64;
            counts.misses += (k_used - n) as u64;
            counts.forced_misses += (k_used - n) as u64;
            let first: Vec<u16> = row[..k_used].to_vec();
            counts.substituted += chosen.iter().filter(|(_, e)| !first.contains(e)).count() as u64;
            counts.pruned_slots += first.iter().filter(|&&e| !keep.is_kept(l, usize::from(e))).count() as u64;
        }

        // Step 4: residency, chosen experts in order.
        let chosen_set: BTreeSet<u16> = chosen.iter().map(|&(_, e)| e).collect();
        for &(_, e) in &chosen {
            clock += 1;
            let next = next_use.get(t).and_then(|m| m.get(&e).copied()).flatten();
            if let Some(entry) = cache.get_mut(&e) {
                if counted {
                    counts.hits += 1;
                }
                entry.last_access = clock;
                entry.accesses += 1;
                entry.next_use = next;
            } else {
                if counted {
                    counts.misses += 1;
                }
                if cache.len() >= cfg.cap_of(l) {
                    // Lowest priority among the cached experts, skipping this token's chosen set
                    // in k-way mode; the BTreeMap iterates in id order and only a strictly lower
                    // priority replaces the candidate, so ties go to the lowest id.
                    let mut victim: Option<(u16, (f64, f64))> = None;
                    for (&c, entry) in &cache {
                        if cfg.semantics == Semantics::KWay && chosen_set.contains(&c) {
                            continue;
                        }
                        let pr = priority(cfg.policy, c, entry, &near_last, &score);
                        let lower = match victim {
                            None => true,
                            Some((_, best)) => pr.partial_cmp(&best) == Some(std::cmp::Ordering::Less),
                        };
                        if lower {
                            victim = Some((c, pr));
                        }
                    }
                    let (v, _) = victim.expect("a full cache holds an expert outside the chosen set");
                    cache.remove(&v);
                }
                cache.insert(e, Entry { inserted_at: clock, last_access: clock, accesses: 1, next_use: next });
            }
        }

        // Step 5: policy credits for the token.
        match cfg.policy {
            Policy::NearPick => {
                for &(_, e) in f.iter().take(cfg.near_pick_n) {
                    near_last.insert(e, t);
                }
            }
            Policy::NearPickEma => {
                multiplier *= inverse_decay;
                for &(_, e) in f.iter().take(cfg.near_pick_n) {
                    score[usize::from(e)] += 1.0 * multiplier;
                }
            }
            Policy::InvRouter => {
                multiplier *= inverse_decay;
                let z_row = row_scores.expect("validate() guarantees scores for inv_router");
                let max = z_row.iter().fold(f64::NEG_INFINITY, |a, &z| a.max(f64::from(z)));
                let weights: Vec<f64> = z_row.iter().map(|&z| crate::exp::exp(f64::from(z) - max)).collect();
                let mut sum = 0.0;
                for &w in &weights {
                    sum += w;
                }
                for (i, &e) in row.iter().enumerate() {
                    let p = weights[i] / sum;
                    score[usize::from(e)] += p * multiplier;
                }
            }
            Policy::Lru | Policy::Fifo | Policy::Lfu | Policy::Belady => {}
        }
        if multiplier > 1e100 {
            for s in score.iter_mut() {
                *s /= multiplier;
            }
            multiplier = 1.0;
        }
    }
    counts
}

/// Priority of cached expert `e` (lowest is evicted), as a pair compared lexicographically.
fn priority(policy: Policy, e: u16, entry: &Entry, near_last: &BTreeMap<u16, usize>, score: &[f64]) -> (f64, f64) {
    let last = entry.last_access as f64;
    match policy {
        Policy::Lru => (last, 0.0),
        Policy::Fifo => (entry.inserted_at as f64, 0.0),
        Policy::Lfu => (entry.accesses as f64, last),
        Policy::Belady => match entry.next_use {
            Some(t) => (-(t as f64), 0.0),
            None => (f64::NEG_INFINITY, 0.0),
        },
        Policy::NearPick => (near_last.get(&e).map_or(-1.0, |&t| t as f64), last),
        Policy::NearPickEma | Policy::InvRouter => (score[usize::from(e)], last),
    }
}

/// For every token t, the map from each expert chosen at t (λ = 0 selection) to the next token
/// at which it is chosen again (`None`: never, or not before the next sequence start when resets
/// are on).
fn belady_next_uses(
    trace: &TraceView<'_>,
    keep: &Keep,
    l: usize,
    k_used: usize,
    sequence_starts: &BTreeSet<usize>,
) -> Vec<BTreeMap<u16, Option<usize>>> {
    let tokens = trace.shape().tokens;
    let chosen: Vec<Vec<u16>> = (0..tokens)
        .map(|t| trace.row(l, t).iter().copied().filter(|&e| keep.is_kept(l, usize::from(e))).take(k_used).collect())
        .collect();
    let mut result = vec![BTreeMap::new(); tokens];
    let mut upcoming: BTreeMap<u16, usize> = BTreeMap::new();
    for t in (0..tokens).rev() {
        for &e in &chosen[t] {
            result[t].insert(e, upcoming.get(&e).copied());
        }
        for &e in &chosen[t] {
            upcoming.insert(e, t);
        }
        if sequence_starts.contains(&t) {
            upcoming.clear();
        }
    }
    result
}
