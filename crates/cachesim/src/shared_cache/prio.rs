//! The priorities of SEMANTICS.md §15.1, made comparable across layers, one type per policy
//! (lowest is evicted; equal keys go to the lowest layer, then the lowest expert), and the
//! dispatch that picks one outside the loop.
//!
//! - `lru`, `fifo`, `lfu`, `perfect_lfu`: the pick clock counts the picks that reach the cache
//!   over every layer in visiting order.
//! - `belady`: the next position p = t · L + i at which the pair is chosen again.
//! - `near_pick`: the last token (step, §11) at which the pair stood in its layer's F at rank < N, then lru.
//! - `near_pick_ema`, `inv_router`: one score per pair with §5's lazy update per layer; the
//!   priority of (l, e) is S_l[e] / M_l, then lru.
//! - `lfru`: one clock per layer (§15.3); freq / (clock_l − last + 1), compared exactly, ties:
//!   the earlier insertion (on the shared pick clock).

use std::cmp::Ordering;

use trace_io::TraceView;

use super::{SharedCache, SharedCounts};
use crate::deploy::StepPlan;
use crate::engine::shared_cache::{SetBuilder, SharedParams, SharedPick, SharedPrio, run_shared};
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
    let plan = StepPlan::new(trace, shared.schedule);
    let plan = &plan;
    let pairs = params.layers * params.num_experts;
    let pins = shared.pins.as_ref();
    let out = match cfg.policy {
        Policy::Lru => run_shared(&params, trace, keep, pins, plan, Lru { last: vec![0; pairs] }),
        Policy::Fifo => run_shared(&params, trace, keep, pins, plan, Fifo { inserted: vec![0; pairs] }),
        Policy::Lfu => {
            run_shared(&params, trace, keep, pins, plan, Lfu { last: vec![0; pairs], count: vec![0; pairs] })
        }
        Policy::PerfectLfu => {
            run_shared(&params, trace, keep, pins, plan, PerfectLfu { last: vec![0; pairs], total: vec![0; pairs] })
        }
        Policy::Belady => {
            let (next, off) = next_uses(trace, keep, &params, plan);
            let steps = plan.steps() + 1;
            run_shared(&params, trace, keep, pins, plan, Belady { steps, off, next, key: vec![0; pairs] })
        }
        Policy::NearPick => run_shared(
            &params,
            trace,
            keep,
            pins,
            plan,
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
            run_shared(&params, trace, keep, pins, plan, decayed)
        }
        Policy::Lfru => run_shared(
            &params,
            trace,
            keep,
            pins,
            plan,
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
    let mut counts = SharedCounts::assemble(
        &trace.shape(),
        cfg,
        shared,
        &out.layers,
        out.pinned_hits,
        out.slots_end,
        out.slot_tokens,
    );
    let (steps, rows) = plan.counted(cfg.warmup);
    (counts.deploy.counts.tokens, counts.deploy.steps, counts.deploy.rows) = (rows, steps, rows);
    counts
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
    const LOCAL_KEYS: bool = true;
    #[inline(always)]
    fn heap_key(&self, slot: usize) -> (u64, u64) {
        (self.last[slot], 0)
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
    const LOCAL_KEYS: bool = true;
    #[inline(always)]
    fn heap_key(&self, slot: usize) -> (u64, u64) {
        (self.inserted[slot], 0)
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
    const LOCAL_KEYS: bool = true;
    #[inline(always)]
    fn heap_key(&self, slot: usize) -> (u64, u64) {
        (self.count[slot], self.last[slot])
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
    const LOCAL_KEYS: bool = true;
    #[inline(always)]
    fn heap_key(&self, slot: usize) -> (u64, u64) {
        (self.total[slot], self.last[slot])
    }
    #[inline(always)]
    fn key(&self, slot: usize, _l: usize) -> (u64, u64) {
        (self.total[slot], self.last[slot])
    }
}

/// Never chosen again (before the next reset).
const NEVER: u64 = u64::MAX;

/// For every entry of every (step, layer)'s set U of the λ = 0 selection (§11 step 2; per token
/// the chosen experts), the next position p = s · L + l at which its pair is in a set again, or
/// [`NEVER`]; with resets (per token), never past the current sequence. Returns the next uses,
/// layer after layer and step after step, and the offset of each (layer, step)'s set,
/// `[L · (steps + 1)]`.
fn next_uses(trace: &TraceView<'_>, keep: &Keep, params: &SharedParams<'_>, plan: &StepPlan) -> (Vec<u64>, Vec<usize>) {
    let (big_l, k, m, steps) = (params.layers, params.k_used, params.m, plan.steps());
    let widest = (0..steps).map(|s| plan.starts[s + 1] - plan.starts[s]).max().unwrap_or(0);
    let mut u = SetBuilder::new(params.num_experts, widest * k);
    let (mut sets, mut off) = (Vec::new(), Vec::with_capacity(big_l * (steps + 1)));
    let mut chosen = Vec::with_capacity(k);
    for l in 0..big_l {
        let (ids, mask) = (trace.layer_ids(l), keep.layer_mask(l));
        for s in 0..steps {
            off.push(sets.len());
            u.begin();
            for p in plan.starts[s]..plan.starts[s + 1] {
                let t = plan.token(p);
                chosen.clear();
                chosen.extend(ids[t * m..(t + 1) * m].iter().copied().filter(|&e| mask[usize::from(e)]).take(k));
                u.add(&chosen);
            }
            u.finish(plan.starts[s + 1] - plan.starts[s] == 1);
            sets.extend_from_slice(&u.set);
        }
        off.push(sets.len());
    }
    let mut next = vec![NEVER; sets.len()];
    let mut upcoming = vec![NEVER; params.num_experts];
    for l in 0..big_l {
        upcoming.fill(NEVER);
        let mut ri = params.resets.len();
        for s in (0..steps).rev() {
            let (a, b) = (off[l * (steps + 1) + s], off[l * (steps + 1) + s + 1]);
            for i in a..b {
                next[i] = upcoming[usize::from(sets[i])];
            }
            for &e in &sets[a..b] {
                upcoming[usize::from(e)] = (s * big_l + l) as u64;
            }
            let t = plan.token(plan.starts[s]) as u64;
            while ri > 0 && params.resets[ri - 1] >= t {
                if params.resets[ri - 1] == t {
                    upcoming.fill(NEVER);
                }
                ri -= 1;
            }
        }
    }
    (next, off)
}

/// `belady`: the next position at which the pair is chosen again, as of its last access,
/// negated (stored as `NEVER − next`, so never again is 0, the lowest).
struct Belady {
    /// Steps + 1: the stride of `off` per layer.
    steps: usize,
    off: Vec<usize>,
    next: Vec<u64>,
    key: Vec<u64>,
}

impl SharedPrio for Belady {
    type Key = u64;
    fn reset(&mut self) {}
    #[inline(always)]
    fn access(&mut self, pick: SharedPick, _inserted: bool) {
        self.key[pick.slot] = NEVER - self.next[self.off[pick.l * self.steps + pick.s] + pick.i];
    }
    #[inline(always)]
    fn enter_set(&mut self, pick: SharedPick) {
        self.access(pick, false);
    }
    const LOCAL_KEYS: bool = true;
    #[inline(always)]
    fn heap_key(&self, slot: usize) -> (u64, u64) {
        (self.key[slot], 0)
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
    const CREDITS: bool = true;
    #[inline(always)]
    fn credit_row(&mut self, s: usize, l: usize, f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {
        for &e in f.iter().take(self.n) {
            self.near[l * self.e + usize::from(e)] = s as u64 + 1;
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
    const CREDITS: bool = true;
    #[inline(always)]
    fn begin_credits(&mut self, l: usize) {
        self.multiplier[l] *= self.inv_d;
    }
    fn credit_row(&mut self, _s: usize, l: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>) {
        let base = l * self.e;
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
    }
    fn end_credits(&mut self, l: usize) {
        let (base, mult) = (l * self.e, self.multiplier[l]);
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
