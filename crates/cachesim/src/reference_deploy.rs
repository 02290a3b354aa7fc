//! A plain reference replayer of SEMANTICS.md §9–§11 (pins, a second tier, served steps and
//! re-batching), written from the spec for clarity, not speed, and sharing no replay code with
//! [`crate::deploy`]: `BTreeMap`s, `Vec`s, f64 priorities, the lazy decays of §5 applied once
//! per step, belady's next use looked up in each expert's list of steps. Both must give
//! identical [`DeployCounts`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use trace_io::TraceView;

use crate::deploy::{DeployCounts, Deployment, Schedule};
use crate::{Keep, Policy, ReplayConfig, ReplayCounts, Result};

/// Replays like [`crate::deploy::replay`], plainly and on one thread.
///
/// # Errors
/// As [`crate::deploy::replay`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment) -> Result<DeployCounts> {
    replay_with_misses(trace, keep, cfg, dep).map(|(counts, _)| counts)
}

/// One step of one layer as the reference saw it: whether it is counted, its rows, and its
/// tier-1 misses that are not forced, in order, each with the number of the step's rows that
/// chose it (what hybrid execution, §14, prices).
pub(crate) struct StepMisses {
    pub counted: bool,
    pub rows: usize,
    pub misses: Vec<(u16, usize)>,
}

/// [`replay`], also returning every layer's steps (`[L][steps]`).
pub(crate) fn replay_with_misses(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
) -> Result<(DeployCounts, Vec<Vec<StepMisses>>)> {
    crate::deploy::validate(trace, keep, cfg, dep)?;
    let shape = trace.shape();
    let steps = served_steps(trace, dep.schedule);
    let mut out = DeployCounts::default();
    let mut counts = ReplayCounts::default();
    let mut per_layer = Vec::new();
    for step in &steps {
        if step.first_position >= cfg.warmup {
            out.steps += 1;
            out.rows += step.tokens.len() as u64;
        }
    }
    counts.tokens = out.rows;
    for l in 0..shape.layers {
        let pins: BTreeSet<u16> = (0..shape.num_experts)
            .filter(|&e| dep.pins.as_ref().is_some_and(|p| p.is_kept(l, e)))
            .map(|e| e as u16)
            .collect();
        out.layer_pins.push(pins.len());
        let layer = replay_layer(trace, keep, cfg, &steps, &pins, l);
        counts.picks += layer.picks;
        counts.hits += layer.hits;
        counts.misses += layer.misses;
        counts.forced_misses += layer.forced_misses;
        counts.substituted += layer.substituted;
        counts.pruned_slots += layer.pruned_slots;
        counts.layer_misses.push(layer.misses);
        out.pinned_hits += layer.pinned_hits;
        match dep.tier2 {
            None => out.storage_reads += layer.misses - layer.forced_misses,
            Some(t2) => {
                let stream: Vec<(bool, Vec<u16>)> =
                    layer.stream.iter().map(|st| (st.counted, st.misses.iter().map(|&(e, _)| e).collect())).collect();
                let (hits, misses) = replay_tier2(t2.policy, t2.cap, &stream);
                out.t2_hits += hits;
                out.storage_reads += misses;
            }
        }
        per_layer.push(layer.stream);
    }
    out.counts = counts;
    Ok((out, per_layer))
}

/// One engine step: the row position of its first row in the served order, and its rows' tokens.
struct Step {
    first_position: usize,
    tokens: Vec<usize>,
}

/// The steps of a schedule, each a list of token indices.
fn served_steps(trace: &TraceView<'_>, schedule: Schedule) -> Vec<Step> {
    let tokens = trace.shape().tokens;
    let cut = |offsets: &[u64]| -> Vec<Step> {
        let mut bounds: Vec<usize> = offsets.iter().map(|&o| o as usize).collect();
        bounds.push(tokens);
        bounds.windows(2).map(|w| Step { first_position: w[0], tokens: (w[0]..w[1]).collect() }).collect()
    };
    match schedule {
        Schedule::PerToken => (0..tokens).map(|t| Step { first_position: t, tokens: vec![t] }).collect(),
        Schedule::Served => cut(trace.step_offsets().expect("validated")),
        Schedule::Rebatch(b) => {
            // A queue of waiting sequences (each a queue of tokens); B slots.
            let mut waiting: VecDeque<VecDeque<usize>> =
                cut(trace.seq_offsets().expect("validated")).into_iter().map(|s| s.tokens.into()).collect();
            // Slots beyond the number of sequences never hold one: leave them out.
            let mut slots: Vec<Option<VecDeque<usize>>> =
                (0..b.min(waiting.len())).map(|_| waiting.pop_front()).collect();
            let mut steps = Vec::new();
            let mut position = 0;
            while slots.iter().any(Option::is_some) {
                let mut step = Step { first_position: position, tokens: Vec::new() };
                for slot in &mut slots {
                    if let Some(seq) = slot {
                        step.tokens.push(seq.pop_front().expect("a slot holds a non-empty sequence"));
                        if seq.is_empty() {
                            *slot = None;
                        }
                    }
                }
                position += step.tokens.len();
                steps.push(step);
                for slot in &mut slots {
                    if slot.is_none() {
                        *slot = waiting.pop_front();
                    }
                }
            }
            steps
        }
    }
}

/// What one layer's tier 1 counted, and the stream it sends to tier 2.
#[derive(Default)]
struct LayerResult {
    picks: u64,
    hits: u64,
    misses: u64,
    forced_misses: u64,
    substituted: u64,
    pruned_slots: u64,
    pinned_hits: u64,
    /// Per step: whether it is counted, its rows, and its tier-1 misses that are not forced, in
    /// order, with the rows choosing each.
    stream: Vec<StepMisses>,
}

/// A cached expert's bookkeeping.
struct Entry {
    inserted_at: u64,
    last_access: u64,
    accesses: u64,
}

/// One tier's cache of one layer, with the priorities of §5 / §11 step 4.
struct PlainCache {
    policy: Policy,
    cap: usize,
    entries: BTreeMap<u16, Entry>,
    clock: u64,
    /// For belady: the steps whose set holds each expert, ascending.
    uses: BTreeMap<u16, Vec<usize>>,
    /// near_pick: last step with the expert at rank < N in some row's F.
    near_last: BTreeMap<u16, usize>,
    /// near_pick_ema, inv_router: S[e] and the multiplier M of the lazy form.
    score: BTreeMap<u16, f64>,
    multiplier: f64,
}

impl PlainCache {
    fn new(policy: Policy, cap: usize, step_sets: &[BTreeSet<u16>]) -> PlainCache {
        let mut uses: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (s, set) in step_sets.iter().enumerate() {
            for &e in set {
                uses.entry(e).or_default().push(s);
            }
        }
        PlainCache {
            policy,
            cap,
            entries: BTreeMap::new(),
            clock: 0,
            uses,
            near_last: BTreeMap::new(),
            score: BTreeMap::new(),
            multiplier: 1.0,
        }
    }

    /// Priority of cached expert `e` at step `s` (lowest evicted), compared as a pair.
    fn priority(&self, e: u16, s: usize) -> (f64, f64) {
        let entry = &self.entries[&e];
        let last = entry.last_access as f64;
        match self.policy {
            Policy::Lru => (last, 0.0),
            Policy::Fifo => (entry.inserted_at as f64, 0.0),
            Policy::Lfu => (entry.accesses as f64, last),
            Policy::Belady => {
                let next = self.uses.get(&e).and_then(|steps| steps.iter().find(|&&x| x > s));
                (next.map_or(f64::NEG_INFINITY, |&x| -(x as f64)), 0.0)
            }
            Policy::NearPick => (self.near_last.get(&e).map_or(-1.0, |&x| x as f64), last),
            Policy::NearPickEma | Policy::InvRouter => (self.score.get(&e).copied().unwrap_or(0.0), last),
        }
    }

    /// §11 step 3 for one step's ordered set `u`: returns (hits, pinned hits, the misses in order).
    fn run_step(&mut self, u: &[u16], s: usize, pins: &BTreeSet<u16>) -> (u64, u64, Vec<u16>) {
        let in_u: BTreeSet<u16> = u.iter().copied().collect();
        let mut processed: BTreeSet<u16> = BTreeSet::new();
        let (mut hits, mut pinned_hits, mut misses) = (0, 0, Vec::new());
        for &e in u {
            self.clock += 1;
            if pins.contains(&e) {
                hits += 1;
                pinned_hits += 1;
            } else if self.cap == 0 {
                misses.push(e);
            } else if let Some(entry) = self.entries.get_mut(&e) {
                hits += 1;
                entry.last_access = self.clock;
                entry.accesses += 1;
            } else {
                misses.push(e);
                if self.entries.len() >= self.cap {
                    let victim = self.victim(s, &in_u, &processed);
                    self.entries.remove(&victim);
                }
                self.entries.insert(e, Entry { inserted_at: self.clock, last_access: self.clock, accesses: 1 });
            }
            processed.insert(e);
        }
        (hits, pinned_hits, misses)
    }

    /// The victim: lowest priority outside U; else among U's processed; else any (ties: lowest id).
    fn victim(&self, s: usize, in_u: &BTreeSet<u16>, processed: &BTreeSet<u16>) -> u16 {
        let lowest = |filter: &dyn Fn(u16) -> bool| -> Option<u16> {
            let mut best: Option<(u16, (f64, f64))> = None;
            for &c in self.entries.keys() {
                if !filter(c) {
                    continue;
                }
                let pr = self.priority(c, s);
                if best.is_none_or(|(_, b)| pr.partial_cmp(&b) == Some(std::cmp::Ordering::Less)) {
                    best = Some((c, pr));
                }
            }
            best.map(|(c, _)| c)
        };
        lowest(&|c| !in_u.contains(&c))
            .or_else(|| lowest(&|c| processed.contains(&c)))
            .or_else(|| lowest(&|_| true))
            .expect("a full cache holds an expert")
    }
}

/// Row `t` of layer `l`: F as (row position, expert), its first n.
fn kept_candidates(trace: &TraceView<'_>, keep: &Keep, l: usize, t: usize) -> Vec<(usize, u16)> {
    trace
        .row(l, t)
        .iter()
        .enumerate()
        .filter(|&(_, &e)| keep.is_kept(l, usize::from(e)))
        .map(|(i, &e)| (i, e))
        .collect()
}

fn replay_layer(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    steps: &[Step],
    pins: &BTreeSet<u16>,
    l: usize,
) -> LayerResult {
    let k = cfg.k_used_or(trace.shape().top_k);
    // The λ = 0 step sets, for belady (which requires λ = 0).
    let step_sets: Vec<BTreeSet<u16>> = steps
        .iter()
        .map(|st| {
            st.tokens
                .iter()
                .flat_map(|&t| kept_candidates(trace, keep, l, t).into_iter().take(k).map(|(_, e)| e))
                .collect()
        })
        .collect();
    let mut cache = PlainCache::new(cfg.policy, cfg.cap_of(l), &step_sets);
    let mut out = LayerResult::default();
    for (s, step) in steps.iter().enumerate() {
        let counted = step.first_position >= cfg.warmup;
        // Every row's chosen experts, against the cache at the start of the step.
        let mut chosen_rows: Vec<Vec<u16>> = Vec::new();
        for &t in &step.tokens {
            let row = trace.row(l, t);
            let f = kept_candidates(trace, keep, l, t);
            let n = k.min(f.len());
            let chosen: Vec<u16> = if cfg.lambda == 0.0 {
                f[..n].iter().map(|&(_, e)| e).collect()
            } else {
                let z_row = &trace.layer_scores(l).expect("validated")[t * row.len()..(t + 1) * row.len()];
                let z = |i: usize| f64::from(z_row[i]);
                let delta = if n <= 1 { 0.0 } else { z(f[0].0) - z(f[n - 1].0) };
                let mut ranked: Vec<(f64, usize, u16)> = f
                    .iter()
                    .enumerate()
                    .map(|(r, &(i, e))| {
                        let resident = pins.contains(&e) || cache.entries.contains_key(&e);
                        (if r < cfg.j || resident { z(i) + cfg.lambda * delta } else { z(i) }, r, e)
                    })
                    .collect();
                ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("finite").then(a.1.cmp(&b.1)));
                ranked[..n].iter().map(|&(_, _, e)| e).collect()
            };
            if counted {
                let first = &row[..k];
                out.picks += k as u64;
                out.misses += (k - n) as u64;
                out.forced_misses += (k - n) as u64;
                out.substituted += chosen.iter().filter(|e| !first.contains(e)).count() as u64;
                out.pruned_slots += first.iter().filter(|&&e| !keep.is_kept(l, usize::from(e))).count() as u64;
            }
            chosen_rows.push(chosen);
        }
        // U: distinct chosen experts by (rows choosing it desc, first appearance).
        let mut tally: BTreeMap<u16, (usize, usize)> = BTreeMap::new();
        let mut appearance = 0;
        for chosen in &chosen_rows {
            for &e in chosen {
                tally.entry(e).or_insert((0, appearance)).0 += 1;
                appearance += 1;
            }
        }
        let mut u: Vec<(usize, usize, u16)> = tally.iter().map(|(&e, &(c, first))| (c, first, e)).collect();
        u.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let u: Vec<u16> = u.into_iter().map(|(_, _, e)| e).collect();
        let (hits, pinned_hits, misses) = cache.run_step(&u, s, pins);
        if counted {
            out.hits += hits;
            out.pinned_hits += pinned_hits;
            out.misses += misses.len() as u64;
        }
        let misses = misses.into_iter().map(|e| (e, tally[&e].0)).collect();
        out.stream.push(StepMisses { counted, rows: step.tokens.len(), misses });
        credit_step(&mut cache, trace, keep, cfg, l, s, &step.tokens);
    }
    out
}

/// §11 step 4: the credits of one step, every row's own in row order, M multiplied once.
fn credit_step(
    cache: &mut PlainCache,
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    l: usize,
    s: usize,
    tokens: &[usize],
) {
    match cfg.policy {
        Policy::NearPick => {
            for &t in tokens {
                for (_, e) in kept_candidates(trace, keep, l, t).into_iter().take(cfg.near_pick_n) {
                    cache.near_last.insert(e, s);
                }
            }
        }
        Policy::NearPickEma | Policy::InvRouter => {
            cache.multiplier *= 1.0 / cfg.decay;
            let m = cache.multiplier;
            for &t in tokens {
                let row = trace.row(l, t);
                if cfg.policy == Policy::NearPickEma {
                    for (_, e) in kept_candidates(trace, keep, l, t).into_iter().take(cfg.near_pick_n) {
                        *cache.score.entry(e).or_insert(0.0) += 1.0 * m;
                    }
                } else {
                    let z = &trace.layer_scores(l).expect("validated")[t * row.len()..(t + 1) * row.len()];
                    let max = z.iter().fold(f64::NEG_INFINITY, |a, &x| a.max(f64::from(x)));
                    let w: Vec<f64> = z.iter().map(|&x| crate::exp::exp(f64::from(x) - max)).collect();
                    let mut sum = 0.0;
                    for &x in &w {
                        sum += x;
                    }
                    for (i, &e) in row.iter().enumerate() {
                        *cache.score.entry(e).or_insert(0.0) += w[i] / sum * m;
                    }
                }
            }
            if cache.multiplier > 1e100 {
                for v in cache.score.values_mut() {
                    *v /= cache.multiplier;
                }
                cache.multiplier = 1.0;
            }
        }
        Policy::Lru | Policy::Fifo | Policy::Lfu | Policy::Belady => {}
    }
}

/// Tier 2 over the stream of tier-1 misses: (hits, misses) of the counted steps.
fn replay_tier2(policy: Policy, cap: usize, stream: &[(bool, Vec<u16>)]) -> (u64, u64) {
    let sets: Vec<BTreeSet<u16>> = stream.iter().map(|(_, m)| m.iter().copied().collect()).collect();
    let mut cache = PlainCache::new(policy, cap, &sets);
    let (mut hits, mut misses) = (0, 0);
    for (s, (counted, requests)) in stream.iter().enumerate() {
        let (h, _, m) = cache.run_step(requests, s, &BTreeSet::new());
        if *counted {
            hits += h;
            misses += m.len() as u64;
        }
    }
    (hits, misses)
}
