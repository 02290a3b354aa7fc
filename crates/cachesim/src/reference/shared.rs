//! The plain replayer of one cache shared by every layer (SEMANTICS.md §15.1), written from the
//! text: tokens in order, layers in increasing index, a `BTreeMap` keyed by (layer, expert) as
//! the one cache, priorities built per pair from plain per-layer state. It shares §5's pieces with
//! [`super::replay`] (F, selection, counting) and nothing with the fast shared loop.

use std::collections::{BTreeMap, BTreeSet};

use trace_io::TraceView;

use super::{Key, count_row, kept_candidates, row_scores, select, sequence_starts};
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
    /// belady: the next position at which the pair is chosen, as of its last access.
    next_use: Option<usize>,
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
    let pinned = |l: usize, e: u16| shared.pins.as_ref().is_some_and(|p| p.is_kept(l, usize::from(e)));
    let next_uses =
        if cfg.policy == Policy::Belady { next_uses(trace, keep, k_used, &starts) } else { BTreeMap::new() };

    let mut counts = vec![LayerCounts::default(); big_l];
    let mut pinned_hits = 0;
    let mut cache: BTreeMap<(usize, u16), Slot> = BTreeMap::new();
    let mut state: Vec<LayerState> = (0..big_l).map(|_| LayerState::new(e_count)).collect();
    let mut clock: u64 = 0;
    let mut slot_tokens = vec![0u64; big_l];

    for t in 0..shape.tokens {
        if starts.contains(&t) {
            cache.clear();
            state = (0..big_l).map(|_| LayerState::new(e_count)).collect();
        }
        let counted = t >= cfg.warmup;
        for l in 0..big_l {
            let position = t * big_l + l;
            let row = trace.row(l, t);
            let z_row = row_scores(trace, l, t);
            let f = kept_candidates(trace, keep, l, t);
            let n = k_used.min(f.len());
            let chosen = select(cfg, &f, n, z_row, |e| pinned(l, e) || cache.contains_key(&(l, e)));
            if counted {
                count_row(&mut counts[l], keep, l, row, k_used, n, &chosen);
            }
            let protected: BTreeSet<(usize, u16)> = chosen.iter().map(|&(_, e)| (l, e)).collect();
            for &(_, e) in &chosen {
                if pinned(l, e) {
                    if counted {
                        counts[l].hits += 1;
                        pinned_hits += 1;
                    }
                    continue;
                }
                let next_use = next_uses.get(&(position, e)).copied().flatten();
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
                    slot.next_use = next_use;
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
                    let mut best: Option<((usize, u16), Key)> = None;
                    for (&pair, slot) in &cache {
                        if kway && protected.contains(&pair) {
                            continue;
                        }
                        let pr = priority(cfg.policy, pair, slot, &state);
                        if best.is_none_or(|(_, b)| pr.partial_cmp(&b) == Some(std::cmp::Ordering::Less)) {
                            best = Some((pair, pr));
                        }
                    }
                    let (victim, _) = best.expect("a full cache holds a pair outside the chosen set");
                    cache.remove(&victim);
                }
                clock += 1;
                state[l].lfru_clock += 1;
                state[l].accesses[usize::from(e)] += 1;
                let slot = Slot {
                    inserted_at: clock,
                    last_access: clock,
                    accesses: 1,
                    lfru_last: state[l].lfru_clock,
                    next_use,
                };
                cache.insert((l, e), slot);
            }
            credit(cfg, &mut state[l], t, &f, row, z_row);
        }
        if counted {
            for (l, s) in slot_tokens.iter_mut().enumerate() {
                *s += cache.keys().filter(|&&(cl, _)| cl == l).count() as u64;
            }
        }
    }
    let slots_end = (0..big_l).map(|l| cache.keys().filter(|&&(cl, _)| cl == l).count()).collect();
    Ok(SharedCounts::assemble(&shape, cfg, shared, &counts, pinned_hits, slots_end, slot_tokens))
}

/// §5 step 5 for layer `l` after token `t`, in the lazy form (M ← M/d, credits x · M, the
/// rescale past 1e100).
fn credit(cfg: &ReplayConfig, st: &mut LayerState, t: usize, f: &[(usize, u16)], row: &[u16], z_row: Option<&[f32]>) {
    match cfg.policy {
        Policy::NearPick => {
            for &(_, e) in f.iter().take(cfg.near_pick_n) {
                st.near_last.insert(e, t);
            }
        }
        Policy::NearPickEma => {
            st.multiplier *= 1.0 / cfg.decay;
            for &(_, e) in f.iter().take(cfg.near_pick_n) {
                st.score[usize::from(e)] += 1.0 * st.multiplier;
            }
        }
        Policy::InvRouter => {
            st.multiplier *= 1.0 / cfg.decay;
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
fn priority(policy: Policy, (l, e): (usize, u16), slot: &Slot, state: &[LayerState]) -> Key {
    let last = slot.last_access as f64;
    let st = &state[l];
    match policy {
        Policy::Lru => Key::Pair(last, 0.0),
        Policy::Fifo => Key::Pair(slot.inserted_at as f64, 0.0),
        Policy::Lfu => Key::Pair(slot.accesses as f64, last),
        Policy::PerfectLfu => Key::Pair(st.accesses[usize::from(e)] as f64, last),
        Policy::Belady => match slot.next_use {
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

/// Belady's next uses: for each position p = t · L + l and expert e chosen there (λ = 0:
/// F[0..n]), the next position at which (l, e) is chosen again (`None`: never, or not before the
/// next sequence start when resets are on).
fn next_uses(
    trace: &TraceView<'_>,
    keep: &Keep,
    k_used: usize,
    starts: &BTreeSet<usize>,
) -> BTreeMap<(usize, u16), Option<usize>> {
    let shape = trace.shape();
    let big_l = shape.layers;
    let mut uses: BTreeMap<(usize, u16), Vec<usize>> = BTreeMap::new();
    for t in 0..shape.tokens {
        for l in 0..big_l {
            for (_, e) in kept_candidates(trace, keep, l, t).into_iter().take(k_used) {
                uses.entry((l, e)).or_default().push(t * big_l + l);
            }
        }
    }
    let mut result = BTreeMap::new();
    for (&(_, e), positions) in &uses {
        for (i, &p) in positions.iter().enumerate() {
            let t = p / big_l;
            let next = positions.get(i + 1).copied().filter(|&q| !starts.range(t + 1..=q / big_l).any(|_| true));
            result.insert((p, e), next);
        }
    }
    result
}
