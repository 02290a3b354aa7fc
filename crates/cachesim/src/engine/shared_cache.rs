//! The loop of one cache shared by every layer (SEMANTICS.md §15.1): steps in order (a token
//! per step, or §11's engine steps), each visiting the traced layers in increasing layer index;
//! at each (step, layer) §5 steps 1–3 (§11 step 1) per row, then the step's set U (§11 step 2;
//! a token's chosen experts per token) through one cache of C (layer, expert) slots (§11 step 3,
//! which is §5 step 4 when U fits). Generic over the priority ([`SharedPrio`],
//! chosen outside the loop and monomorphized); every buffer is allocated before the loop; no
//! `Result`, no allocation and no dynamic dispatch inside it.
//!
//! A pair is the slot index `l · E + e` (so slot order is (layer, expert) order: ties among
//! equal priorities go to the lowest slot index). For a policy whose keys change only when their
//! own pair is accessed (lru, fifo, lfu, perfect_lfu, belady: [`SharedPrio::LOCAL_KEYS`]) the
//! cached pairs sit in a lazy min-heap of (key, slot): an access pushes the pair's new key, a
//! stale entry (the pair evicted, or its key changed since) is dropped when it surfaces, and the
//! victim is the first current entry outside the protected set; the heap is rebuilt from the
//! cached pairs when stale entries reach a bound, so it never grows past the room reserved
//! before the loop. The other policies' keys move without an access of their own (a credit
//! policy's with its layer's multiplier, S_l[e] / M_l; lfru's with its layer's clock), so their
//! victim is found by a scan of the cached slots (C of them); so is the fallback of §11 step 3
//! (every cached pair in the set) for every policy.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use trace_io::TraceView;

use super::step_loop::{extend_f, select_cache_aware};
use crate::deploy::StepPlan;
use crate::{Keep, LayerCounts, ReplayConfig, Semantics};

/// Not cached.
const ABSENT: u32 = u32::MAX;

/// One access of the shared cache: pair `slot` (layer index `l`), the `i`-th of the set of
/// (step `s`, layer `l`), at access time `now` (accesses that reach the cache, every layer,
/// visiting order).
#[derive(Clone, Copy)]
pub(crate) struct SharedPick {
    pub(crate) slot: usize,
    pub(crate) l: usize,
    pub(crate) s: usize,
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
    /// Cached pair `pick.slot` is the `pick.i`-th of the set of (step, layer) about to go through
    /// the cache (k-way only): belady's priority becomes its next use after this step (§11 step
    /// 4: "the same in the fallback"); the others keep theirs.
    #[inline(always)]
    fn enter_set(&mut self, _pick: SharedPick) {}
    /// The priority of cached pair `slot` (layer index `l`) as it stands.
    fn key(&self, slot: usize, l: usize) -> Self::Key;
    /// Whether a pair's key changes only when that pair is accessed ([`SharedPrio::access`],
    /// [`SharedPrio::enter_set`]) or at a reset: then the loop keeps the cached pairs in a lazy
    /// heap of [`SharedPrio::heap_key`] instead of scanning every cached pair on each miss.
    const LOCAL_KEYS: bool = false;
    /// [`SharedPrio::key`] as two integers, in the same order (read only when `LOCAL_KEYS`).
    #[inline(always)]
    fn heap_key(&self, _slot: usize) -> (u64, u64) {
        (0, 0)
    }
    /// Whether the policy takes credits (§5 step 5, §11 step 4); false: the loop skips them.
    const CREDITS: bool = false;
    /// Before the credits of (step `s`, layer `l`): the lazy decay's multiplier advances once.
    #[inline(always)]
    fn begin_credits(&mut self, _l: usize) {}
    /// One row's credits at (step `s`, layer `l`): `f` = F (the kept candidates), `row` the
    /// whole row and its scores.
    #[inline(always)]
    fn credit_row(&mut self, _s: usize, _l: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
    /// After the credits of (step, layer `l`): the rescale.
    #[inline(always)]
    fn end_credits(&mut self, _l: usize) {}
}

/// The configuration of a shared replay, resolved against the trace.
pub(crate) struct SharedParams<'a> {
    pub(crate) layers: usize,
    pub(crate) m: usize,
    pub(crate) num_experts: usize,
    pub(crate) k_used: usize,
    /// C, slots of the one cache.
    pub(crate) cap: usize,
    pub(crate) lambda: f64,
    pub(crate) j: usize,
    pub(crate) warmup: usize,
    pub(crate) sequential: bool,
    /// Tokens at which the cache and the policy state are reset (empty when resets are off;
    /// per token only).
    pub(crate) resets: &'a [u64],
}

impl<'a> SharedParams<'a> {
    pub(crate) fn new(trace: &TraceView<'a>, cfg: &ReplayConfig, cap: usize) -> SharedParams<'a> {
        let shape = trace.shape();
        SharedParams {
            layers: shape.layers,
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
/// their sum over counted rows `[L]`.
pub(crate) struct SharedOut {
    pub(crate) layers: Vec<LayerCounts>,
    pub(crate) pinned_hits: u64,
    pub(crate) slots_end: Vec<usize>,
    pub(crate) slot_tokens: Vec<u64>,
}

/// The distinct experts of a step's chosen sets in §11 step 2's order: (rows choosing it desc,
/// first appearance in row order then rank order). `count` and `first` are `[E]` scratch,
/// `mark` `[E]` with `stamp` new for this step; `out` receives U. No allocation once `out` has
/// room for rows · k_used.
pub(crate) struct SetBuilder {
    count: Vec<u32>,
    first: Vec<u32>,
    mark: Vec<u64>,
    stamp: u64,
    pub(crate) set: Vec<u16>,
}

impl SetBuilder {
    pub(crate) fn new(num_experts: usize, room: usize) -> SetBuilder {
        SetBuilder {
            count: vec![0; num_experts],
            first: vec![0; num_experts],
            mark: vec![0; num_experts],
            stamp: 0,
            set: Vec::with_capacity(room),
        }
    }

    /// Starts a new step.
    #[inline(always)]
    pub(crate) fn begin(&mut self) {
        self.stamp += 1;
        self.set.clear();
    }

    /// Adds one row's chosen experts, in processing order.
    #[inline(always)]
    pub(crate) fn add(&mut self, chosen: &[u16]) {
        for &e16 in chosen {
            let e = usize::from(e16);
            if self.mark[e] != self.stamp {
                self.mark[e] = self.stamp;
                self.count[e] = 0;
                self.first[e] = self.set.len() as u32;
                self.set.push(e16);
            }
            self.count[e] += 1;
        }
    }

    /// Orders U (after the step's last row): rows choosing it desc, first appearance.
    #[inline(always)]
    pub(crate) fn finish(&mut self, one_row: bool) {
        if !one_row {
            let (count, first) = (&self.count, &self.first);
            self.set.sort_unstable_by_key(|&e| (std::cmp::Reverse(count[usize::from(e)]), first[usize::from(e)]));
        }
    }
}

/// The rows of step `s` of `plan` (row positions).
#[inline(always)]
fn rows(plan: &StepPlan, s: usize) -> std::ops::Range<usize> {
    plan.starts[s]..plan.starts[s + 1]
}

/// The whole shared replay with priority `prio`, over the steps of `plan`.
#[inline(never)]
pub(crate) fn run_shared<P: SharedPrio>(
    params: &SharedParams<'_>,
    trace: &TraceView<'_>,
    keep: &Keep,
    pins: Option<&Keep>,
    plan: &StepPlan,
    mut prio: P,
) -> SharedOut {
    let (big_l, e_count, m, k, cap) = (params.layers, params.num_experts, params.m, params.k_used, params.cap);
    let pairs = big_l * e_count;
    // The cached slots (unordered) and each pair's entry among them.
    let mut cached: Vec<u32> = Vec::with_capacity(cap.min(pairs));
    let mut pos: Vec<u32> = vec![ABSENT; pairs];
    // marks[slot] == stamp: in the current (step, layer)'s set (protected, k-way);
    // done[slot] == stamp: already processed in it (§11 step 3's fallback).
    let mut marks: Vec<u64> = vec![0; pairs];
    let mut done: Vec<u64> = vec![0; pairs];
    let mut held = vec![0usize; big_l];
    let mut slot_tokens = vec![0u64; big_l];
    let mut counts = vec![LayerCounts::default(); big_l];
    let mut pinned_hits = 0u64;
    let keep_all: Vec<bool> = (0..big_l).map(|l| keep.layer_mask(l).iter().all(|&x| x)).collect();
    let (mut f_ids, mut f_pos) = (vec![0u16; m], vec![0u16; m]);
    let mut chosen_buf: Vec<(u16, u32)> = Vec::with_capacity(k);
    let mut chosen_ids: Vec<u16> = Vec::with_capacity(k);
    let mut pending: Vec<u32> = Vec::with_capacity(m);
    let widest = (0..plan.steps()).map(|s| rows(plan, s).len()).max().unwrap_or(0);
    let mut u = SetBuilder::new(e_count, widest * k);
    let cache_aware = params.lambda > 0.0;
    let (mut now, mut ri, mut stamp) = (0u64, 0usize, 0u64);
    // LOCAL_KEYS policies: the lazy heap of (key, slot) and the protected entries set aside
    // while a victim is sought; rebuilt from the cached pairs when it reaches `heap_room`.
    let heap_room = if P::LOCAL_KEYS { 4 * cap.min(pairs) + 64 } else { 0 };
    let mut heap: BinaryHeap<Reverse<(u64, u64, u32)>> = BinaryHeap::with_capacity(heap_room + 1);
    let mut aside: Vec<Reverse<(u64, u64, u32)>> = Vec::with_capacity(if P::LOCAL_KEYS { widest * k + 1 } else { 0 });

    for s in 0..plan.steps() {
        let step_rows = rows(plan, s);
        // Resets are per token only (validated): a step is a token.
        let t0 = plan.token(step_rows.start);
        if ri < params.resets.len() && params.resets[ri] == t0 as u64 {
            for &c in &cached {
                pos[c as usize] = ABSENT;
            }
            cached.clear();
            heap.clear();
            held.fill(0);
            prio.reset();
            ri += 1;
        }
        let counted = step_rows.start >= params.warmup;
        let one_row = step_rows.len() == 1;
        for l in 0..big_l {
            let mask = keep.layer_mask(l);
            let pinned = pins.map(|p| p.layer_mask(l));
            let base = l * e_count;
            let (ids, scores) = (trace.layer_ids(l), trace.layer_scores(l));
            u.begin();
            for p in step_rows.clone() {
                let t = plan.token(p);
                let row = &ids[t * m..(t + 1) * m];
                let row_scores = scores.map(|z| &z[t * m..(t + 1) * m]);

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

                // Step 2: selection (λ > 0: a pair is resident when cached at the start of the
                // (step, layer) or pinned in l).
                let (chosen, substituted): (&[u16], usize) = match row_scores {
                    Some(z) if cache_aware && n > 0 => {
                        let at = |r: usize| f_p.map_or(r, |q| usize::from(q[r]));
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
                            |e| pinned.is_some_and(|q| q[e]) || pos[base + e] != ABSENT,
                            &mut pending,
                            &mut chosen_buf,
                        );
                        chosen_ids.clear();
                        chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                        (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
                    }
                    _ => (&f[..n], n - (k - pruned)),
                };
                if counted {
                    counts[l].add_selection(k, n, pruned, substituted);
                }
                u.add(chosen);
            }
            u.finish(one_row);

            // Step 3 through the one cache; only this (step, layer)'s set is protected.
            stamp += 1;
            if !params.sequential {
                for (i, &e) in u.set.iter().enumerate() {
                    let slot = base + usize::from(e);
                    marks[slot] = stamp;
                    if pos[slot] != ABSENT {
                        prio.enter_set(SharedPick { slot, l, s, i, now });
                        if P::LOCAL_KEYS {
                            push_key(&prio, &mut heap, &pos, &cached, heap_room, slot);
                        }
                    }
                }
            }
            let (mut hits, mut misses, mut pin_hits) = (0u64, 0u64, 0u64);
            for (i, &e) in u.set.iter().enumerate() {
                let e = usize::from(e);
                if pinned.is_some_and(|q| q[e]) {
                    pin_hits += 1;
                    continue;
                }
                let slot = base + e;
                done[slot] = stamp;
                if pos[slot] != ABSENT {
                    now += 1;
                    prio.access(SharedPick { slot, l, s, i, now }, false);
                    if P::LOCAL_KEYS {
                        push_key(&prio, &mut heap, &pos, &cached, heap_room, slot);
                    }
                    hits += 1;
                    continue;
                }
                misses += 1;
                if cap == 0 {
                    continue;
                }
                if cached.len() >= cap {
                    let v = if P::LOCAL_KEYS {
                        heap_victim(&prio, &mut heap, &mut aside, &pos, &marks, stamp)
                            .unwrap_or_else(|| victim(&prio, &cached, &marks, &done, stamp, e_count))
                    } else {
                        victim(&prio, &cached, &marks, &done, stamp, e_count)
                    };
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
                prio.access(SharedPick { slot, l, s, i, now }, true);
                if P::LOCAL_KEYS {
                    push_key(&prio, &mut heap, &pos, &cached, heap_room, slot);
                }
            }
            if counted {
                counts[l].hits += hits + pin_hits;
                counts[l].misses += misses;
                pinned_hits += pin_hits;
            }

            // Credits: once per (step, layer), every row's own in row order.
            if P::CREDITS {
                prio.begin_credits(l);
                for p in step_rows.clone() {
                    let t = plan.token(p);
                    let row = &ids[t * m..(t + 1) * m];
                    let f: &[u16] = if keep_all[l] {
                        row
                    } else {
                        let (mut f_len, mut scanned) = (0, 0);
                        extend_f(row, mask, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, m, m);
                        &f_ids[..f_len]
                    };
                    prio.credit_row(s, l, f, row, scores.map(|z| &z[t * m..(t + 1) * m]));
                }
                prio.end_credits(l);
            }
        }
        if counted {
            let weight = step_rows.len() as u64;
            for (acc, &h) in slot_tokens.iter_mut().zip(&held) {
                *acc += h as u64 * weight;
            }
        }
    }
    SharedOut { layers: counts, pinned_hits, slots_end: held, slot_tokens }
}

/// Pushes cached pair `slot`'s current key; first rebuilds the heap from the cached pairs when it
/// is full of stale entries (so it never grows past `room`).
#[inline(always)]
fn push_key<P: SharedPrio>(
    prio: &P,
    heap: &mut BinaryHeap<Reverse<(u64, u64, u32)>>,
    pos: &[u32],
    cached: &[u32],
    room: usize,
    slot: usize,
) {
    if heap.len() >= room {
        heap.clear();
        for &c in cached {
            if c as usize != slot {
                let (a, b) = prio.heap_key(c as usize);
                heap.push(Reverse((a, b, c)));
            }
        }
    }
    debug_assert!(pos[slot] != ABSENT);
    let (a, b) = prio.heap_key(slot);
    heap.push(Reverse((a, b, slot as u32)));
}

/// The victim of §5 step 4 from the lazy heap: the current entry of lowest (key, slot) outside
/// the current (step, layer)'s set. Stale entries (evicted pairs, old keys) are dropped; the
/// protected entries met on the way are put back. `None` when every cached pair is protected
/// (§11 step 3's fallback, left to [`victim`]). The popped victim leaves the heap.
#[inline(always)]
fn heap_victim<P: SharedPrio>(
    prio: &P,
    heap: &mut BinaryHeap<Reverse<(u64, u64, u32)>>,
    aside: &mut Vec<Reverse<(u64, u64, u32)>>,
    pos: &[u32],
    marks: &[u64],
    stamp: u64,
) -> Option<usize> {
    let mut found = None;
    while let Some(entry) = heap.pop() {
        let Reverse((a, b, c)) = entry;
        let c = c as usize;
        if pos[c] == ABSENT || prio.heap_key(c) != (a, b) {
            continue; // stale
        }
        if marks[c] == stamp {
            aside.push(entry);
            continue;
        }
        found = Some(c);
        break;
    }
    for e in aside.drain(..) {
        heap.push(e);
    }
    found
}

/// The victim of §11 step 3 (§5 step 4 when the set fits) in the one cache: the cached pair of
/// lowest priority outside the current (step, layer)'s set (`marks[slot] == stamp`); when every
/// cached pair is in it, the lowest of those already processed (`done[slot] == stamp`); when
/// none is, the lowest of all. Ties: lowest slot index (lowest layer, then expert). The cache is
/// full (C >= 1).
#[inline(always)]
fn victim<P: SharedPrio>(prio: &P, cached: &[u32], marks: &[u64], done: &[u64], stamp: u64, e_count: usize) -> usize {
    lowest(prio, cached, e_count, |c| marks[c] != stamp)
        .or_else(|| lowest(prio, cached, e_count, |c| done[c] == stamp))
        .or_else(|| lowest(prio, cached, e_count, |_| true))
        .unwrap_or(usize::MAX)
}

/// The cached pair of lowest priority that `eligible` accepts (ties: lowest slot index).
#[inline(always)]
fn lowest<P: SharedPrio>(prio: &P, cached: &[u32], e_count: usize, eligible: impl Fn(usize) -> bool) -> Option<usize> {
    let mut best: Option<(P::Key, usize)> = None;
    for &c in cached {
        let c = c as usize;
        if !eligible(c) {
            continue;
        }
        let key = prio.key(c, c / e_count);
        let better = match best {
            None => true,
            Some((b, bs)) => match key.partial_cmp(&b) {
                Some(Ordering::Less) => true,
                Some(Ordering::Equal) => c < bs,
                _ => false,
            },
        };
        if better {
            best = Some((key, c));
        }
    }
    best.map(|(_, c)| c)
}
