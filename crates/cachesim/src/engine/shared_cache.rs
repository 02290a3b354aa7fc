//! The loop of one cache shared by every layer (SEMANTICS.md §15.1): tokens in order, each
//! visiting the traced layers in increasing layer index, §5 steps 1–3 per (t, l) and step 4
//! through one cache of C (layer, expert) slots. Generic over the priority ([`SharedPrio`],
//! chosen outside the loop and monomorphized); every buffer is allocated before the loop; no
//! `Result`, no allocation and no dynamic dispatch inside it.
//!
//! A pair is the slot index `l · E + e` (so slot order is (layer, expert) order: ties among
//! equal priorities go to the lowest slot index). The victim is found by a scan of the cached
//! slots (C of them): the keys of a credit policy move with its layer's multiplier (§15.1:
//! S_l[e] / M_l), so no order kept between misses would hold for every policy.

use std::cmp::Ordering;

use trace_io::TraceView;

use super::step_loop::{extend_f, select_cache_aware};
use crate::{Keep, LayerCounts, ReplayConfig, Semantics};

/// Not cached.
const ABSENT: u32 = u32::MAX;

/// One access of the shared cache: pair `slot` (layer index `l`), the `i`-th chosen of (token
/// `t`, layer `l`), at pick time `now` (picks that reach the cache, every layer, visiting order).
#[derive(Clone, Copy)]
pub(crate) struct SharedPick {
    pub(crate) slot: usize,
    pub(crate) l: usize,
    pub(crate) t: usize,
    pub(crate) i: usize,
    pub(crate) now: u64,
}

/// What the shared loop asks of a policy: its state over every (layer, expert) pair and its
/// priority, comparable across layers (SEMANTICS.md §15.1). Lowest key is evicted.
pub(crate) trait SharedPrio {
    /// The priority of one cached pair; equal keys fall back to the lowest slot index.
    type Key: PartialOrd + Copy;
    /// Forgets all state (the cache is emptied at a sequence start).
    fn reset(&mut self);
    /// An access that reaches the cache; `inserted`: a miss that just inserted the pair.
    fn access(&mut self, pick: SharedPick, inserted: bool);
    /// The priority of cached pair `slot` (layer index `l`) as it stands.
    fn key(&self, slot: usize, l: usize) -> Self::Key;
    /// Credits after (t, l) (§5 step 5): `f` = F (the kept candidates), `row` the whole row.
    #[inline(always)]
    fn end_row(&mut self, _t: usize, _l: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
}

/// The configuration of a shared replay, resolved against the trace.
pub(crate) struct SharedParams<'a> {
    pub(crate) layers: usize,
    pub(crate) tokens: usize,
    pub(crate) m: usize,
    pub(crate) num_experts: usize,
    pub(crate) k_used: usize,
    /// C, slots of the one cache.
    pub(crate) cap: usize,
    pub(crate) lambda: f64,
    pub(crate) j: usize,
    pub(crate) warmup: usize,
    pub(crate) sequential: bool,
    /// Tokens at which the cache and the policy state are reset (empty when resets are off).
    pub(crate) resets: &'a [u64],
}

impl<'a> SharedParams<'a> {
    pub(crate) fn new(trace: &TraceView<'a>, cfg: &ReplayConfig, cap: usize) -> SharedParams<'a> {
        let shape = trace.shape();
        SharedParams {
            layers: shape.layers,
            tokens: shape.tokens,
            m: shape.candidates,
            num_experts: shape.num_experts,
            k_used: cfg.k_used_or(shape.top_k),
            cap,
            lambda: cfg.lambda,
            j: cfg.j,
            warmup: cfg.warmup,
            sequential: cfg.semantics == Semantics::Sequential,
            resets: if cfg.reset_at_sequence { trace.seq_offsets().unwrap_or(&[]) } else { &[] },
        }
    }
}

/// What the loop gives: per-layer counts `[L]`, pinned hits, slots held at the end `[L]` and
/// their sum over counted tokens `[L]`.
pub(crate) struct SharedOut {
    pub(crate) layers: Vec<LayerCounts>,
    pub(crate) pinned_hits: u64,
    pub(crate) slots_end: Vec<usize>,
    pub(crate) slot_tokens: Vec<u64>,
}

/// The whole shared replay with priority `prio`.
#[inline(never)]
pub(crate) fn run_shared<P: SharedPrio>(
    params: &SharedParams<'_>,
    trace: &TraceView<'_>,
    keep: &Keep,
    pins: Option<&Keep>,
    mut prio: P,
) -> SharedOut {
    let (big_l, e_count, m, k, cap) = (params.layers, params.num_experts, params.m, params.k_used, params.cap);
    let pairs = big_l * e_count;
    // The cached slots (unordered) and each pair's entry among them.
    let mut cached: Vec<u32> = Vec::with_capacity(cap.min(pairs));
    let mut pos: Vec<u32> = vec![ABSENT; pairs];
    // marks[slot] == stamp: chosen at the current (t, l) (k-way protection).
    let mut marks: Vec<u64> = vec![0; pairs];
    let mut held = vec![0usize; big_l];
    let mut slot_tokens = vec![0u64; big_l];
    let mut counts = vec![LayerCounts::default(); big_l];
    let mut pinned_hits = 0u64;
    let keep_all: Vec<bool> = (0..big_l).map(|l| keep.layer_mask(l).iter().all(|&x| x)).collect();
    let (mut f_ids, mut f_pos) = (vec![0u16; m], vec![0u16; m]);
    let mut chosen_buf: Vec<(u16, u32)> = Vec::with_capacity(k);
    let mut chosen_ids: Vec<u16> = Vec::with_capacity(k);
    let mut pending: Vec<u32> = Vec::with_capacity(m);
    let cache_aware = params.lambda > 0.0;
    let (mut now, mut ri) = (0u64, 0usize);

    for t in 0..params.tokens {
        if ri < params.resets.len() && params.resets[ri] == t as u64 {
            for &s in &cached {
                pos[s as usize] = ABSENT;
            }
            cached.clear();
            held.fill(0);
            prio.reset();
            ri += 1;
        }
        let counted = t >= params.warmup;
        for l in 0..big_l {
            let row = &trace.layer_ids(l)[t * m..(t + 1) * m];
            let row_scores = trace.layer_scores(l).map(|s| &s[t * m..(t + 1) * m]);
            let mask = keep.layer_mask(l);
            let pinned = pins.map(|p| p.layer_mask(l));
            let base = l * e_count;

            // Step 1: F (whole), n, the pruned slots among the row's first k_used.
            let (f, f_p, pruned): (&[u16], Option<&[u16]>, usize) = if keep_all[l] {
                (row, None, 0)
            } else {
                let (mut f_len, mut scanned) = (0, 0);
                extend_f(row, mask, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, m, m);
                let pruned = row[..k].iter().filter(|&&e| !mask[usize::from(e)]).count();
                (&f_ids[..f_len], Some(&f_pos[..f_len]), pruned)
            };
            let n = k.min(f.len());

            // Step 2: selection (λ > 0: a pair is resident when cached or pinned in l).
            let (chosen, substituted): (&[u16], usize) = match row_scores {
                Some(z) if cache_aware && n > 0 => {
                    let at = |r: usize| f_p.map_or(r, |p| usize::from(p[r]));
                    let bonus =
                        if n <= 1 { 0.0 } else { params.lambda * (f64::from(z[at(0)]) - f64::from(z[at(n - 1)])) };
                    chosen_buf.clear();
                    select_cache_aware(
                        f,
                        at,
                        z,
                        n,
                        bonus,
                        params.j,
                        |e| pinned.is_some_and(|p| p[e]) || pos[base + e] != ABSENT,
                        &mut pending,
                        &mut chosen_buf,
                    );
                    chosen_ids.clear();
                    chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                    (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
                }
                _ => (&f[..n], n - (k - pruned)),
            };

            // Step 3.
            if counted {
                counts[l].add_selection(k, n, pruned, substituted);
            }

            // Step 4 through the one cache; only this (t, l)'s chosen pairs are protected.
            let stamp = (t * big_l + l) as u64 + 1;
            if !params.sequential {
                for &e in chosen {
                    marks[base + usize::from(e)] = stamp;
                }
            }
            let (mut hits, mut misses, mut pin_hits) = (0u64, 0u64, 0u64);
            for (i, &e) in chosen.iter().enumerate() {
                let e = usize::from(e);
                if pinned.is_some_and(|p| p[e]) {
                    pin_hits += 1;
                    continue;
                }
                let slot = base + e;
                if pos[slot] != ABSENT {
                    now += 1;
                    prio.access(SharedPick { slot, l, t, i, now }, false);
                    hits += 1;
                    continue;
                }
                misses += 1;
                if cap == 0 {
                    continue;
                }
                if cached.len() >= cap {
                    let v = victim(&prio, &cached, &marks, stamp, e_count);
                    let vp = pos[v] as usize;
                    cached.swap_remove(vp);
                    if let Some(&moved) = cached.get(vp) {
                        pos[moved as usize] = vp as u32;
                    }
                    pos[v] = ABSENT;
                    held[v / e_count] -= 1;
                }
                pos[slot] = cached.len() as u32;
                cached.push(slot as u32);
                held[l] += 1;
                now += 1;
                prio.access(SharedPick { slot, l, t, i, now }, true);
            }
            if counted {
                counts[l].hits += hits + pin_hits;
                counts[l].misses += misses;
                pinned_hits += pin_hits;
            }

            // Step 5: credits.
            prio.end_row(t, l, f, row, row_scores);
        }
        if counted {
            for (s, &h) in slot_tokens.iter_mut().zip(&held) {
                *s += h as u64;
            }
        }
    }
    SharedOut { layers: counts, pinned_hits, slots_end: held, slot_tokens }
}

/// The cached pair of lowest priority not chosen at the current (t, l) (`marks[slot] ==
/// stamp`), ties: lowest slot index, i.e. lowest layer then lowest expert. The cache is full
/// and holds more than the protected pairs (C >= k_used).
#[inline(always)]
fn victim<P: SharedPrio>(prio: &P, cached: &[u32], marks: &[u64], stamp: u64, e_count: usize) -> usize {
    let mut best: Option<(P::Key, usize)> = None;
    for &s in cached {
        let s = s as usize;
        if marks[s] == stamp {
            continue;
        }
        let key = prio.key(s, s / e_count);
        let better = match best {
            None => true,
            Some((b, bs)) => match key.partial_cmp(&b) {
                Some(Ordering::Less) => true,
                Some(Ordering::Equal) => s < bs,
                _ => false,
            },
        };
        if better {
            best = Some((key, s));
        }
    }
    best.map_or(usize::MAX, |(_, s)| s)
}
