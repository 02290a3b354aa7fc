//! The plain replayer of one cache shared by every layer (SEMANTICS.md §15.1), written from the
//! text: steps in order (a token each, or §11's steps), layers in increasing index, a `BTreeMap` keyed by (layer, expert) as
//! the one cache, priorities built per pair from plain per-layer state. It shares §5's pieces with
//! [`super::replay`] (F, selection, counting) and nothing with the fast shared loop.

use std::collections::{BTreeMap, BTreeSet};

use trace_io::TraceView;

use super::deploy::{Step, served_steps};
use super::{CreditRow, Key, count_row, kept_candidates, row_scores, select, sequence_starts};
use crate::shared_cache::{SharedCache, SharedCounts};
use crate::{Keep, LayerCounts, Policy, ReplayConfig, Result, Semantics};

/// What the cache remembers about one cached pair.
struct Slot {
    /// Pick clock at insertion (fifo; lfru's ties).
    inserted_at: u64,
    /// Pick clock at the last access (lru and the tie-breaker of the others).
    last_access: u64,
    /// Accesses since insertion (lfu; lfru's freq).
    accesses: u64,
    /// lfru: its layer's clock after the pair's last access.
    lfru_last: u64,
}

/// One layer's policy state outside the cache (§15.1: "each layer's M and S as in §5").
struct LayerState {
    /// near_pick: last token the expert stood in F at rank < N.
    near_last: BTreeMap<u16, usize>,
    /// near_pick_ema, inv_router: S_l[e] and M_l.
    score: Vec<f64>,
    multiplier: f64,
    /// perfect_lfu: accesses since the start (or the last reset), surviving eviction.
    accesses: Vec<u64>,
    /// lfru: the layer's clock.
    lfru_clock: u64,
}

impl LayerState {
    fn new(num_experts: usize) -> LayerState {
        LayerState {
            near_last: BTreeMap::new(),
            score: vec![0.0; num_experts],
            multiplier: 1.0,
            accesses: vec![0; num_experts],
            lfru_clock: 0,
        }
    }
}

/// Replays like [`crate::shared_cache::replay`], plainly and on one thread.
///
/// # Errors
/// As [`crate::shared_cache::replay`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, shared: &SharedCache) -> Result<SharedCounts> {
    crate::shared_cache::validate(trace, keep, cfg, shared)?;
    super::require_whole_rows(trace, cfg)?;
    let shape = trace.shape();
    let (big_l, e_count) = (shape.layers, shape.num_experts);
    let k_used = cfg.k_used_or(shape.top_k);
    let starts = sequence_starts(trace, cfg);
    let steps = served_steps(trace, shared.schedule);
    let pinned = |l: usize, e: u16| shared.pins.as_ref().is_some_and(|p| p.is_kept(l, usize::from(e)));
    let uses = if cfg.policy == Policy::Belady { uses(trace, keep, k_used, &steps) } else { BTreeMap::new() };
    let sequential = cfg.semantics == Semantics::Sequential;

    let mut counts = vec![LayerCounts::default(); big_l];
    let mut pinned_hits = 0;
    let mut cache: BTreeMap<(usize, u16), Slot> = BTreeMap::new();
    let mut state: Vec<LayerState> = (0..big_l).map(|_| LayerState::new(e_count)).collect();
    let mut clock: u64 = 0;
    let mut slot_tokens = vec![0u64; big_l];
    let (mut steps_counted, mut rows_counted) = (0, 0);

    for (s, step) in steps.iter().enumerate() {
        if starts.contains(&step.tokens[0]) {
            cache.clear();
            state = (0..big_l).map(|_| LayerState::new(e_count)).collect();
        }
        let counted = step.first_position >= cfg.warmup;
        if counted {
            steps_counted += 1;
            rows_counted += step.tokens.len() as u64;
        }
        for l in 0..big_l {
            let position = s * big_l + l;
            // §11 step 1 (§5 steps 1-3) for every row, against the cache at the start.
            let mut chosen_rows = Vec::new();
            for &t in &step.tokens {
                let row = trace.row(l, t);
                let f = kept_candidates(trace, keep, l, t);
                let n = k_used.min(f.len());
                let resident = |e: u16| pinned(l, e) || cache.contains_key(&(l, e));
                let chosen = select(cfg, &f, n, row_scores(trace, l, t), resident);
                if counted {
                    count_row(&mut counts[l], keep, l, row, k_used, n, &chosen);
                }
                chosen_rows.push(chosen.into_iter().map(|(_, e)| e).collect::<Vec<u16>>());
            }
            let u = step_set(&chosen_rows);
            // §11 step 3 with the one cache: this (step, layer)'s set is protected.
            let protected: BTreeSet<(usize, u16)> = u.iter().map(|&e| (l, e)).collect();
            let mut processed: BTreeSet<(usize, u16)> = BTreeSet::new();
            for &e in &u {
                if pinned(l, e) {
                    if counted {
                        counts[l].hits += 1;
                        pinned_hits += 1;
                    }
                    continue;
                }
                processed.insert((l, e));
                if let Some(slot) = cache.get_mut(&(l, e)) {
                    if counted {
                        counts[l].hits += 1;
                    }
                    clock += 1;
                    state[l].lfru_clock += 1;
                    state[l].accesses[usize::from(e)] += 1;
                    slot.last_access = clock;
                    slot.accesses += 1;
                    slot.lfru_last = state[l].lfru_clock;
                    continue;
                }
                if counted {
                    counts[l].misses += 1;
                }
                if shared.cap == 0 {
                    continue;
                }
                if cache.len() >= shared.cap {
                    let kway = cfg.semantics == Semantics::KWay;
                    let lowest = |eligible: &dyn Fn(&(usize, u16)) -> bool| {
                        let mut best: Option<((usize, u16), Key)> = None;
                        for (&pair, slot) in &cache {
                            if !eligible(&pair) {
                                continue;
                            }
                            // Belady: the next position after this one whose set holds the pair
                            // (in sequential mode a pair of this set still to come is needed now).
                            let next = if sequential && protected.contains(&pair) && !processed.contains(&pair) {
                                Some(position)
                            } else {
                                next_use(&uses, &starts, pair, (position, step.tokens[0]))
                            };
                            let pr = priority(cfg.policy, pair, slot, &state, next);
                            if best.is_none_or(|(_, b)| pr.partial_cmp(&b) == Some(std::cmp::Ordering::Less)) {
                                best = Some((pair, pr));
                            }
                        }
                        best.map(|(pair, _)| pair)
                    };
                    // Outside the set; else done in this step; else any (which then misses).
                    let victim = lowest(&|p| !(kway && protected.contains(p)))
                        .or_else(|| lowest(&|p| processed.contains(p)))
                        .or_else(|| lowest(&|_| true))
                        .expect("a full cache holds a pair");
                    cache.remove(&victim);
                }
                clock += 1;
                state[l].lfru_clock += 1;
                state[l].accesses[usize::from(e)] += 1;
                let slot = Slot { inserted_at: clock, last_access: clock, accesses: 1, lfru_last: state[l].lfru_clock };
                cache.insert((l, e), slot);
            }
            // §11 step 4: M multiplied once, then every row's own credits in row order.
            let rows: Vec<CreditRow<'_>> = step
                .tokens
                .iter()
                .map(|&t| (kept_candidates(trace, keep, l, t), trace.row(l, t), row_scores(trace, l, t)))
                .collect();
            credit(cfg, &mut state[l], s, &rows);
        }
        if counted {
            for (l, acc) in slot_tokens.iter_mut().enumerate() {
                *acc += cache.keys().filter(|&&(cl, _)| cl == l).count() as u64 * step.tokens.len() as u64;
            }
        }
    }
    let slots_end = (0..big_l).map(|l| cache.keys().filter(|&&(cl, _)| cl == l).count()).collect();
    let mut out = SharedCounts::assemble(&shape, cfg, shared, &counts, pinned_hits, slots_end, slot_tokens);
    (out.deploy.counts.tokens, out.deploy.steps, out.deploy.rows) = (rows_counted, steps_counted, rows_counted);
    Ok(out)
}

/// §11 step 2: the distinct chosen experts of a step's rows by (rows choosing it desc, first
/// appearance in row order then rank order); one row's chosen experts as they are.
fn step_set(chosen_rows: &[Vec<u16>]) -> Vec<u16> {
    let mut tally: BTreeMap<u16, (usize, usize)> = BTreeMap::new();
    let mut appearance = 0;
    for chosen in chosen_rows {
        for &e in chosen {
            tally.entry(e).or_insert((0, appearance)).0 += 1;
            appearance += 1;
        }
    }
    let mut u: Vec<(usize, usize, u16)> = tally.iter().map(|(&e, &(c, first))| (c, first, e)).collect();
    u.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    u.into_iter().map(|(_, _, e)| e).collect()
}

/// §5 step 5 / §11 step 4 for one layer at time `time` (token or step): M ← M/d once, every
/// row's credits x · M in order, then the rescale past 1e100.
fn credit(cfg: &ReplayConfig, st: &mut LayerState, time: usize, rows: &[CreditRow<'_>]) {
    match cfg.policy {
        Policy::NearPick => {
            for (f, _, _) in rows {
                for &(_, e) in f.iter().take(cfg.near_pick_n) {
                    st.near_last.insert(e, time);
                }
            }
        }
        Policy::NearPickEma => {
            st.multiplier *= 1.0 / cfg.decay;
            for (f, _, _) in rows {
                for &(_, e) in f.iter().take(cfg.near_pick_n) {
                    st.score[usize::from(e)] += 1.0 * st.multiplier;
                }
            }
        }
        Policy::InvRouter => {
            st.multiplier *= 1.0 / cfg.decay;
            for &(_, row, z_row) in rows {
                let z_row = z_row.expect("validate() guarantees scores for inv_router");
                let max = z_row.iter().fold(f64::NEG_INFINITY, |a, &z| a.max(f64::from(z)));
                let weights: Vec<f64> = z_row.iter().map(|&z| crate::exp::exp(f64::from(z) - max)).collect();
                let mut sum = 0.0;
                for &w in &weights {
                    sum += w;
                }
                for (i, &e) in row.iter().enumerate() {
                    st.score[usize::from(e)] += weights[i] / sum * st.multiplier;
                }
            }
        }
        _ => {}
    }
    if st.multiplier > 1e100 {
        for s in st.score.iter_mut() {
            *s /= st.multiplier;
        }
        st.multiplier = 1.0;
    }
}

/// The priority of cached pair (l, e) by §15.1 (lowest is evicted; the caller's scan in
/// (layer, expert) order breaks ties).
fn priority(policy: Policy, (l, e): (usize, u16), slot: &Slot, state: &[LayerState], next_use: Option<usize>) -> Key {
    let last = slot.last_access as f64;
    let st = &state[l];
    match policy {
        Policy::Lru => Key::Pair(last, 0.0),
        Policy::Fifo => Key::Pair(slot.inserted_at as f64, 0.0),
        Policy::Lfu => Key::Pair(slot.accesses as f64, last),
        Policy::PerfectLfu => Key::Pair(st.accesses[usize::from(e)] as f64, last),
        Policy::Belady => match next_use {
            Some(p) => Key::Pair(-(p as f64), 0.0),
            None => Key::Pair(f64::NEG_INFINITY, 0.0),
        },
        Policy::NearPick => Key::Pair(st.near_last.get(&e).map_or(-1.0, |&t| t as f64), last),
        Policy::NearPickEma | Policy::InvRouter => Key::Pair(st.score[usize::from(e)] / st.multiplier, last),
        Policy::Lfru => {
            Key::Ratio { num: slot.accesses, den: st.lfru_clock - slot.lfru_last + 1, inserted: slot.inserted_at }
        }
        #[cfg(feature = "experimental-policy")]
        Policy::LfuFifo => unreachable!("validate refuses lfu_fifo with a shared cache"),
    }
}

/// Belady's uses: for each pair (l, e), the positions p = s · L + l of the (step, layer)s whose set
/// holds it (λ = 0: every row's F[0..n], §11 step 2), with the first token of each step.
fn uses(
    trace: &TraceView<'_>,
    keep: &Keep,
    k_used: usize,
    steps: &[Step],
) -> BTreeMap<(usize, u16), Vec<(usize, usize)>> {
    let big_l = trace.shape().layers;
    let mut uses: BTreeMap<(usize, u16), Vec<(usize, usize)>> = BTreeMap::new();
    for (s, step) in steps.iter().enumerate() {
        for l in 0..big_l {
            let rows: Vec<Vec<u16>> = step
                .tokens
                .iter()
                .map(|&t| kept_candidates(trace, keep, l, t).into_iter().take(k_used).map(|(_, e)| e).collect())
                .collect();
            for e in step_set(&rows) {
                uses.entry((l, e)).or_default().push((s * big_l + l, step.tokens[0]));
            }
        }
    }
    uses
}

/// The first position after `position` (of a step whose first token is `token`) whose set holds
/// `pair` (`None`: never, or not before the next sequence start when resets are on; resets are
/// per token, so a step is then a token).
fn next_use(
    uses: &BTreeMap<(usize, u16), Vec<(usize, usize)>>,
    starts: &BTreeSet<usize>,
    pair: (usize, u16),
    (position, token): (usize, usize),
) -> Option<usize> {
    let list = uses.get(&pair)?;
    let &(q, u) = list.get(list.partition_point(|&(q, _)| q <= position))?;
    // A later layer of the same step has u = token: no sequence start lies between.
    if u > token && starts.range(token + 1..=u).next().is_some() { None } else { Some(q) }
}
