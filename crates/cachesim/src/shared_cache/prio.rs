//! The priorities of SEMANTICS.md §15.1, made comparable across layers, one type per policy
//! (lowest is evicted; equal keys go to the lowest layer, then the lowest expert), and the
//! dispatch that picks one outside the loop.
//!
//! - `lru`, `fifo`, `lfu`, `perfect_lfu`: the pick clock counts the picks that reach the cache
//!   over every layer in visiting order.
//! - `belady`: the next position p = t · L + i at which the pair is chosen again.
//! - `near_pick`: the last token at which the pair stood in its layer's F at rank < N, then lru.
//! - `near_pick_ema`, `inv_router`: one score per pair with §5's lazy update per layer; the
//!   priority of (l, e) is S_l[e] / M_l, then lru.
//! - `lfru`: one clock per layer (§15.3); freq / (clock_l − last + 1), compared exactly, ties:
//!   the earlier insertion (on the shared pick clock).

use std::cmp::Ordering;

use trace_io::TraceView;

use super::{SharedCache, SharedCounts};
use crate::engine::shared_cache::{SharedParams, SharedPick, SharedPrio, run_shared};
use crate::{Keep, Policy, ReplayConfig};

/// Whether `policy` has a priority of §15.1 here.
pub(crate) fn supported(policy: Policy) -> bool {
    match policy {
        Policy::Lru
        | Policy::Fifo
        | Policy::Lfu
        | Policy::PerfectLfu
        | Policy::Belady
        | Policy::NearPick
        | Policy::NearPickEma
        | Policy::InvRouter
        | Policy::Lfru => true,
        #[cfg(feature = "experimental-policy")]
        Policy::LfuFifo => false,
    }
}

/// Builds the policy's priority for every pair and runs the shared loop with it (validated).
pub(crate) fn with_prio(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, shared: &SharedCache) -> SharedCounts {
    let params = SharedParams::new(trace, cfg, shared.cap);
    let pairs = params.layers * params.num_experts;
    let pins = shared.pins.as_ref();
    let out = match cfg.policy {
        Policy::Lru => run_shared(&params, trace, keep, pins, Lru { last: vec![0; pairs] }),
        Policy::Fifo => run_shared(&params, trace, keep, pins, Fifo { inserted: vec![0; pairs] }),
        Policy::Lfu => run_shared(&params, trace, keep, pins, Lfu { last: vec![0; pairs], count: vec![0; pairs] }),
        Policy::PerfectLfu => {
            run_shared(&params, trace, keep, pins, PerfectLfu { last: vec![0; pairs], total: vec![0; pairs] })
        }
        Policy::Belady => {
            let next = next_uses(trace, keep, &params);
            run_shared(
                &params,
                trace,
                keep,
                pins,
                Belady { k: params.k_used, tokens: params.tokens, next, key: vec![0; pairs] },
            )
        }
        Policy::NearPick => run_shared(
            &params,
            trace,
            keep,
            pins,
            NearPick { e: params.num_experts, n: cfg.near_pick_n, near: vec![0; pairs], last: vec![0; pairs] },
        ),
        Policy::NearPickEma | Policy::InvRouter => {
            let decayed = Decayed {
                e: params.num_experts,
                n: cfg.near_pick_n,
                router: cfg.policy == Policy::InvRouter,
                inv_d: 1.0 / cfg.decay,
                multiplier: vec![1.0; params.layers],
                score: vec![0.0; pairs],
                last: vec![0; pairs],
                probs: vec![0.0; params.m],
            };
            run_shared(&params, trace, keep, pins, decayed)
        }
        Policy::Lfru => run_shared(
            &params,
            trace,
            keep,
            pins,
            Lfru {
                clock: vec![0; params.layers],
                freq: vec![0; pairs],
                last: vec![0; pairs],
                inserted: vec![0; pairs],
            },
        ),
        #[cfg(feature = "experimental-policy")]
        Policy::LfuFifo => unreachable!("validate refuses a policy without a shared priority"),
    };
    SharedCounts::assemble(&trace.shape(), cfg, shared, &out.layers, out.pinned_hits, out.slots_end, out.slot_tokens)
}

/// `lru`: the time of the last access.
struct Lru {
    last: Vec<u64>,
}

impl SharedPrio for Lru {
    type Key = u64;
    fn reset(&mut self) {}
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.last[pick.slot] = pick.now;
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> u64 {
        self.last[slot]
    }
}

/// `fifo`: the time of insertion.
struct Fifo {
    inserted: Vec<u64>,
}

impl SharedPrio for Fifo {
    type Key = u64;
    fn reset(&mut self) {}
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, inserted: bool) {
        if inserted {
            self.inserted[pick.slot] = pick.now;
        }
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> u64 {
        self.inserted[slot]
    }
}

/// `lfu`: (accesses since insertion, time of the last access).
struct Lfu {
    last: Vec<u64>,
    count: Vec<u64>,
}

impl SharedPrio for Lfu {
    type Key = (u64, u64);
    fn reset(&mut self) {}
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, inserted: bool) {
        let s = pick.slot;
        self.count[s] = if inserted { 1 } else { self.count[s] + 1 };
        self.last[s] = pick.now;
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> (u64, u64) {
        (self.count[slot], self.last[slot])
    }
}

/// `perfect_lfu` (§15.2): (accesses since the start, time of the last access); a count survives
/// eviction.
struct PerfectLfu {
    last: Vec<u64>,
    total: Vec<u64>,
}

impl SharedPrio for PerfectLfu {
    type Key = (u64, u64);
    fn reset(&mut self) {
        self.total.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.total[pick.slot] += 1;
        self.last[pick.slot] = pick.now;
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> (u64, u64) {
        (self.total[slot], self.last[slot])
    }
}

/// Never chosen again (before the next reset).
const NEVER: u64 = u64::MAX;

/// For every pick of the λ = 0 selection, `[L, T, k_used]` (only the first n of each row are
/// set), the next position p = t · L + l at which its pair is chosen again, or [`NEVER`]; with
/// resets, never past the current sequence.
fn next_uses(trace: &TraceView<'_>, keep: &Keep, params: &SharedParams<'_>) -> Vec<u64> {
    let (big_l, tokens, k, m) = (params.layers, params.tokens, params.k_used, params.m);
    let mut next = vec![NEVER; big_l * tokens * k];
    let mut upcoming = vec![NEVER; params.num_experts];
    let mut chosen = Vec::with_capacity(k);
    for l in 0..big_l {
        upcoming.fill(NEVER);
        let (ids, mask) = (trace.layer_ids(l), keep.layer_mask(l));
        let mut ri = params.resets.len();
        for t in (0..tokens).rev() {
            chosen.clear();
            chosen.extend(ids[t * m..(t + 1) * m].iter().copied().filter(|&e| mask[usize::from(e)]).take(k));
            for (i, &e) in chosen.iter().enumerate() {
                next[(l * tokens + t) * k + i] = upcoming[usize::from(e)];
            }
            for &e in &chosen {
                upcoming[usize::from(e)] = (t * big_l + l) as u64;
            }
            while ri > 0 && params.resets[ri - 1] >= t as u64 {
                if params.resets[ri - 1] == t as u64 {
                    upcoming.fill(NEVER);
                }
                ri -= 1;
            }
        }
    }
    next
}

/// `belady`: the next position at which the pair is chosen again, as of its last access,
/// negated (stored as `NEVER − next`, so never again is 0, the lowest).
struct Belady {
    k: usize,
    tokens: usize,
    next: Vec<u64>,
    key: Vec<u64>,
}

impl SharedPrio for Belady {
    type Key = u64;
    fn reset(&mut self) {}
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.key[pick.slot] = NEVER - self.next[(pick.l * self.tokens + pick.t) * self.k + pick.i];
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> u64 {
        self.key[slot]
    }
}

/// `near_pick`: (last token + 1 at which the pair stood in F at rank < N, 0 never; then lru).
struct NearPick {
    e: usize,
    n: usize,
    near: Vec<u64>,
    last: Vec<u64>,
}

impl SharedPrio for NearPick {
    type Key = (u64, u64);
    fn reset(&mut self) {
        self.near.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.last[pick.slot] = pick.now;
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> (u64, u64) {
        (self.near[slot], self.last[slot])
    }
    #[inline(always)]
    fn end_row(&mut self, t: usize, l: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        for &e in f.iter().take(self.n) {
            self.near[l * self.e + usize::from(e)] = t as u64 + 1;
        }
    }
}

/// `near_pick_ema` and `inv_router`: S per pair and M per layer (§5's lazy form); the priority is
/// (S_l[e] / M_l, then lru).
struct Decayed {
    e: usize,
    n: usize,
    /// inv_router (softmax credits over the whole row); else near_pick_ema (1 per rank < N of F).
    router: bool,
    inv_d: f64,
    multiplier: Vec<f64>,
    score: Vec<f64>,
    last: Vec<u64>,
    /// The softmax of one row, `[m]`.
    probs: Vec<f64>,
}

impl SharedPrio for Decayed {
    type Key = (f64, u64);
    fn reset(&mut self) {
        self.multiplier.fill(1.0);
        self.score.fill(0.0);
    }
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.last[pick.slot] = pick.now;
    }
    #[inline(always)]
    fn key(&self, slot: usize, l: usize) -> (f64, u64) {
        (self.score[slot] / self.multiplier[l], self.last[slot])
    }
    fn end_row(&mut self, _t: usize, l: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        let base = l * self.e;
        self.multiplier[l] *= self.inv_d;
        let mult = self.multiplier[l];
        if self.router {
            let z = scores.expect("validate guarantees scores for inv_router");
            crate::policy::softmax_row(z, &mut self.probs);
            for (&e, &p) in row.iter().zip(&self.probs) {
                self.score[base + usize::from(e)] += p * mult;
            }
        } else {
            for &e in f.iter().take(self.n) {
                self.score[base + usize::from(e)] += mult;
            }
        }
        if mult > 1e100 {
            for s in &mut self.score[base..base + self.e] {
                *s /= mult;
            }
            self.multiplier[l] = 1.0;
        }
    }
}

/// lfru's key: freq / (clock − last + 1), compared cross-multiplied, then the insertion time.
#[derive(Clone, Copy)]
struct Ratio {
    num: u64,
    den: u64,
    inserted: u64,
}

impl PartialEq for Ratio {
    fn eq(&self, other: &Ratio) -> bool {
        self.partial_cmp(other) == Some(Ordering::Equal)
    }
}

impl PartialOrd for Ratio {
    fn partial_cmp(&self, other: &Ratio) -> Option<Ordering> {
        let (a, b) = (u128::from(self.num) * u128::from(other.den), u128::from(other.num) * u128::from(self.den));
        Some(a.cmp(&b).then(self.inserted.cmp(&other.inserted)))
    }
}

/// `lfru` (§15.3) with one clock per layer.
struct Lfru {
    clock: Vec<u64>,
    freq: Vec<u64>,
    last: Vec<u64>,
    inserted: Vec<u64>,
}

impl SharedPrio for Lfru {
    type Key = Ratio;
    fn reset(&mut self) {
        self.clock.fill(0);
    }
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, inserted: bool) {
        let s = pick.slot;
        self.clock[pick.l] += 1;
        if inserted {
            self.freq[s] = 1;
            self.inserted[s] = pick.now;
        } else {
            self.freq[s] += 1;
        }
        self.last[s] = self.clock[pick.l];
    }
    #[inline(always)]
    fn key(&self, slot: usize, l: usize) -> Ratio {
        Ratio { num: self.freq[slot], den: self.clock[l] - self.last[slot] + 1, inserted: self.inserted[slot] }
    }
}
