//! A plain reference replayer of SEMANTICS.md §9–§11 (pins, a second tier, served steps and
//! re-batching), written from the spec for clarity, not speed, and sharing no replay code with
//! [`crate::deploy`]: `BTreeMap`s, `Vec`s, f64 priorities, the lazy decays of §5 applied once
//! per step, belady's next use looked up in each expert's list of steps. Both must give
//! identical [`DeployCounts`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use trace_io::TraceView;

use super::{Credits, Entry};
use crate::deploy::{DeployCounts, Deployment, Schedule};
use crate::{Keep, LayerCounts, Policy, ReplayConfig, ReplayCounts, Result};

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
        let lc = &layer.counts;
        counts.picks += lc.picks;
        counts.hits += lc.hits;
        counts.misses += lc.misses;
        counts.forced_misses += lc.forced_misses;
        counts.substituted += lc.substituted;
        counts.pruned_slots += lc.pruned_slots;
        counts.layer_misses.push(lc.misses);
        out.pinned_hits += layer.pinned_hits;
        match dep.tier2 {
            None => out.storage_reads += lc.misses - lc.forced_misses,
            Some(t2) => {
                let stream: Vec<(bool, Vec<u16>)> =
                    layer.stream.iter().map(|st| (st.counted, st.misses.iter().map(|&(e, _)| e).collect())).collect();
                let (hits, misses) = replay_tier2(t2.policy, t2.cap, shape.num_experts, &stream);
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
pub(super) struct Step {
    pub(super) first_position: usize,
    pub(super) tokens: Vec<usize>,
}

/// The steps of a schedule, each a list of token indices.
pub(super) fn served_steps(trace: &TraceView<'_>, schedule: Schedule) -> Vec<Step> {
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
    counts: LayerCounts,
    pinned_hits: u64,
    /// Per step: whether it is counted, its rows, and its tier-1 misses that are not forced, in
    /// order, with the rows choosing each.
    stream: Vec<StepMisses>,
}

/// One tier's cache of one layer, with the priorities of §5 / §11 step 4.
struct PlainCache {
    policy: Policy,
    cap: usize,
    entries: BTreeMap<u16, Entry>,
    clock: u64,
    /// For belady: the steps whose set holds each expert, ascending.
    uses: BTreeMap<u16, Vec<usize>>,
    /// The credits of §11 step 4, per step.
    credits: Credits,
}

impl PlainCache {
    fn new(policy: Policy, cap: usize, num_experts: usize, step_sets: &[BTreeSet<u16>]) -> PlainCache {
        let mut uses: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (s, set) in step_sets.iter().enumerate() {
            for &e in set {
                uses.entry(e).or_default().push(s);
            }
        }
        PlainCache { policy, cap, entries: BTreeMap::new(), clock: 0, uses, credits: Credits::new(num_experts) }
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
                entry.touch(e, self.clock, &mut self.credits);
            } else {
                misses.push(e);
                if self.entries.len() >= self.cap {
                    let victim = self.victim(s, &in_u, &processed);
                    self.entries.remove(&victim);
                }
                self.entries.insert(e, Entry::new(e, self.clock, &mut self.credits));
            }
            processed.insert(e);
        }
        (hits, pinned_hits, misses)
    }

    /// The victim: lowest priority outside U; else among U's processed; else any (ties: lowest id).
    /// Belady's next use is the first step after `s` whose set holds the expert.
    fn victim(&self, s: usize, in_u: &BTreeSet<u16>, processed: &BTreeSet<u16>) -> u16 {
        let next_use = |e: u16| self.uses.get(&e).and_then(|steps| steps.iter().find(|&&x| x > s)).copied();
        let lowest = |eligible: &dyn Fn(u16) -> bool| {
            super::lowest(self.policy, &self.entries, &self.credits, next_use, eligible)
        };
        lowest(&|c| !in_u.contains(&c))
            .or_else(|| lowest(&|c| processed.contains(&c)))
            .or_else(|| lowest(&|_| true))
            .expect("a full cache holds an expert")
    }
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
                .flat_map(|&t| super::kept_candidates(trace, keep, l, t).into_iter().take(k).map(|(_, e)| e))
                .collect()
        })
        .collect();
    let mut cache = PlainCache::new(cfg.policy, cfg.cap_of(l), trace.shape().num_experts, &step_sets);
    let mut out = LayerResult::default();
    for (s, step) in steps.iter().enumerate() {
        let counted = step.first_position >= cfg.warmup;
        // Every row's chosen experts, against the cache at the start of the step.
        let mut chosen_rows: Vec<Vec<u16>> = Vec::new();
        for &t in &step.tokens {
            let row = trace.row(l, t);
            let f = super::kept_candidates(trace, keep, l, t);
            let n = k.min(f.len());
            let resident = |e: u16| pins.contains(&e) || cache.entries.contains_key(&e);
            let chosen = super::select(cfg, &f, n, super::row_scores(trace, l, t), resident);
            if counted {
                super::count_row(&mut out.counts, keep, l, row, k, n, &chosen);
            }
            chosen_rows.push(chosen.into_iter().map(|(_, e)| e).collect());
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
            out.counts.hits += hits;
            out.pinned_hits += pinned_hits;
            out.counts.misses += misses.len() as u64;
        }
        let misses = misses.into_iter().map(|e| (e, tally[&e].0)).collect();
        out.stream.push(StepMisses { counted, rows: step.tokens.len(), misses });
        // §11 step 4: every row's own credits in row order, M multiplied once for the step.
        let rows: Vec<_> = step
            .tokens
            .iter()
            .map(|&t| (super::kept_candidates(trace, keep, l, t), trace.row(l, t), super::row_scores(trace, l, t)))
            .collect();
        cache.credits.credit(cfg, s, &rows);
    }
    out
}

/// Tier 2 over the stream of tier-1 misses: (hits, misses) of the counted steps.
fn replay_tier2(policy: Policy, cap: usize, num_experts: usize, stream: &[(bool, Vec<u16>)]) -> (u64, u64) {
    let sets: Vec<BTreeSet<u16>> = stream.iter().map(|(_, m)| m.iter().copied().collect()).collect();
    let mut cache = PlainCache::new(policy, cap, num_experts, &sets);
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
