//! The plain reference replayers (SEMANTICS.md §8.4), written for clarity, not speed: this file
//! replays §5 ([`replay`]) and holds what every member of the family shares (the cache entry, the
//! one priority table of §5, victim selection, the selection of step 2, the counting of step 3 and
//! the credits of step 5); [`prefetch`] adds §12/§13, [`deploy`] §9–§11 and [`hybrid`] §14.
//!
//!
//! It follows SEMANTICS.md §5 step by step for one layer at a time, single-threaded, with
//! `BTreeMap`s, `Vec`s and f64: the decays in the lazy form that §5 defines (a multiplier M,
//! credits x · M, a rescale when M exceeds 1e100) and the softmax with the project's
//! [`crate::exp::exp`]. It shares no replay code with the fast replayer ([`crate::replay`]);
//! both must produce identical [`ReplayCounts`] on every configuration.

use std::collections::{BTreeMap, BTreeSet};

use trace_io::TraceView;

use crate::{Keep, LayerCounts, Policy, ReplayConfig, ReplayCounts, Result, Semantics};

pub mod deploy;
pub mod hybrid;
pub mod prefetch;
pub mod shared;

/// Replays `trace` like [`crate::replay`], plainly and on one thread.
///
/// # Errors
/// As [`crate::replay`].
pub fn replay(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig) -> Result<ReplayCounts> {
    let shape = trace.shape();
    crate::validate(&shape, trace.parts().scores.is_some(), cfg)?;
    keep.check_shape(&shape)?;
    require_whole_rows(trace, cfg)?;
    let mut layers = Vec::new();
    for l in 0..shape.layers {
        layers.push(replay_layer(trace, keep, cfg, l));
    }
    Ok(ReplayCounts::from_layers(&shape, cfg.warmup, &layers))
}

/// Written for clarity, the references build F from whole rows: every candidate, whatever the
/// policy, so they ask for every recorded rank (and scores when λ > 0 or the policy's credits
/// read them, `PolicyFacts::needs_scores`).
fn require_whole_rows(trace: &TraceView<'_>, cfg: &ReplayConfig) -> Result<()> {
    let scores = cfg.lambda > 0.0 || cfg.policy.facts().needs_scores();
    crate::require(trace, trace_io::Reads { scores, ..trace_io::Reads::ids(usize::MAX) })
}

/// What a cache remembers about one cached expert (times are the cache's pick clock, but
/// lfru's, which is its own clock of §15.3).
struct Entry {
    /// Pick time of insertion (fifo, and lfru's ties: the earlier insertion is evicted).
    inserted_at: u64,
    /// Pick time of the last access (lru, and the tie-breaker of lfu, perfect_lfu and the
    /// near/router policies).
    last_access: u64,
    /// Accesses since insertion, including the inserting one (lfu; lfru's freq).
    accesses: u64,
    /// lfru's `last`: its clock after the expert's last access.
    lfru_last: u64,
}

impl Entry {
    /// Expert `e` inserted by a pick at pick time `clock`: an access that reaches the cache,
    /// which `credits` counts.
    fn new(e: u16, clock: u64, credits: &mut Credits) -> Entry {
        credits.accesses[usize::from(e)] += 1;
        Entry::prefetched(clock, credits)
    }

    /// An expert inserted by a prefetch load at pick time `clock` (§12): an access at that time
    /// for the policy (lfru's clock advances), but not a pick, which perfect_lfu counts (§15.2).
    fn prefetched(clock: u64, credits: &mut Credits) -> Entry {
        let lfru_last = credits.tick();
        Entry { inserted_at: clock, last_access: clock, accesses: 1, lfru_last }
    }

    /// A hit on expert `e` at pick time `clock`, which `credits` counts.
    fn touch(&mut self, e: u16, clock: u64, credits: &mut Credits) {
        self.last_access = clock;
        self.accesses += 1;
        credits.accesses[usize::from(e)] += 1;
        self.lfru_last = credits.tick();
    }
}

/// One row as the credits read it: F as (row position, expert), the whole row, its scores.
type CreditRow<'a> = (Vec<(usize, u16)>, &'a [u16], Option<&'a [f32]>);

/// The credits of §5 step 5 (§11 step 4 per step): near_pick's last time, and the scores S with
/// the multiplier M of the lazy decay (credits x · M, a rescale when M exceeds 1e100); and what
/// a policy remembers outside the cached entries, from the accesses that reach the cache (a
/// pinned hit does not, §15.2): perfect_lfu's counts and lfru's clock. A cache reset at a
/// sequence start starts them anew.
struct Credits {
    /// near_pick: the last time (token or step) the expert stood in F at rank < N.
    near_last: BTreeMap<u16, usize>,
    /// near_pick_ema, inv_router: S[e], one per expert id.
    score: Vec<f64>,
    multiplier: f64,
    /// perfect_lfu (§15.2): every expert's picks that reached the cache since the start (or the
    /// last reset), cached or not: a count survives eviction.
    accesses: Vec<u64>,
    /// lfru (§15.3): the clock, starting at 0, one tick per access that reaches the cache.
    lfru_clock: u64,
}

impl Credits {
    /// No credits, for `num_experts` experts.
    fn new(num_experts: usize) -> Credits {
        Credits {
            near_last: BTreeMap::new(),
            score: vec![0.0; num_experts],
            multiplier: 1.0,
            accesses: vec![0; num_experts],
            lfru_clock: 0,
        }
    }

    /// An access of the cache (a hit or an insertion): lfru's clock advances; returns it.
    fn tick(&mut self) -> u64 {
        self.lfru_clock += 1;
        self.lfru_clock
    }

    /// One time step's credits: M multiplied once by 1/d, then every row's own credits in order,
    /// then the rescale. Each row is (F as (row position, expert), the whole row, its scores).
    fn credit(&mut self, cfg: &ReplayConfig, time: usize, rows: &[CreditRow<'_>]) {
        match cfg.policy {
            Policy::NearPick => {
                for (f, _, _) in rows {
                    for &(_, e) in f.iter().take(cfg.near_pick_n) {
                        self.near_last.insert(e, time);
                    }
                }
            }
            Policy::NearPickEma => {
                self.multiplier *= 1.0 / cfg.decay;
                for (f, _, _) in rows {
                    for &(_, e) in f.iter().take(cfg.near_pick_n) {
                        self.score[usize::from(e)] += 1.0 * self.multiplier;
                    }
                }
            }
            Policy::InvRouter => {
                self.multiplier *= 1.0 / cfg.decay;
                for &(_, row, z_row) in rows {
                    let z_row = z_row.expect("validate() guarantees scores for inv_router");
                    let max = z_row.iter().fold(f64::NEG_INFINITY, |a, &z| a.max(f64::from(z)));
                    let weights: Vec<f64> = z_row.iter().map(|&z| crate::exp::exp(f64::from(z) - max)).collect();
                    let mut sum = 0.0;
                    for &w in &weights {
                        sum += w;
                    }
                    for (i, &e) in row.iter().enumerate() {
                        let p = weights[i] / sum;
                        self.score[usize::from(e)] += p * self.multiplier;
                    }
                }
            }
            Policy::Lru | Policy::Fifo | Policy::Lfu | Policy::Belady | Policy::PerfectLfu | Policy::Lfru => {}
            #[cfg(feature = "experimental-policy")]
            Policy::LfuFifo => {}
        }
        if self.multiplier > 1e100 {
            for s in self.score.iter_mut() {
                *s /= self.multiplier;
            }
            self.multiplier = 1.0;
        }
    }
}

/// A priority of the table (lowest is evicted).
#[derive(Debug, Clone, Copy)]
enum Key {
    /// A pair, compared lexicographically.
    Pair(f64, f64),
    /// lfru's num / den, compared exactly (cross-multiplied), then its time of insertion.
    Ratio { num: u64, den: u64, inserted: u64 },
}

impl PartialEq for Key {
    fn eq(&self, other: &Key) -> bool {
        self.partial_cmp(other) == Some(std::cmp::Ordering::Equal)
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Key) -> Option<std::cmp::Ordering> {
        match (*self, *other) {
            (Key::Pair(a0, a1), Key::Pair(b0, b1)) => (a0, a1).partial_cmp(&(b0, b1)),
            (Key::Ratio { num: an, den: ad, inserted: ai }, Key::Ratio { num: bn, den: bd, inserted: bi }) => {
                let (left, right) = (u128::from(an) * u128::from(bd), u128::from(bn) * u128::from(ad));
                Some(left.cmp(&right).then(ai.cmp(&bi)))
            }
            _ => None,
        }
    }
}

/// The one priority table of §5 and §15 (lowest is evicted). `next_use` is belady's next time
/// the expert is used (`None`: never).
fn priority(policy: Policy, e: u16, entry: &Entry, credits: &Credits, next_use: Option<usize>) -> Key {
    let last = entry.last_access as f64;
    match policy {
        Policy::Lru => Key::Pair(last, 0.0),
        Policy::Fifo => Key::Pair(entry.inserted_at as f64, 0.0),
        Policy::Lfu => Key::Pair(entry.accesses as f64, last),
        Policy::Belady => match next_use {
            Some(t) => Key::Pair(-(t as f64), 0.0),
            None => Key::Pair(f64::NEG_INFINITY, 0.0),
        },
        Policy::NearPick => Key::Pair(credits.near_last.get(&e).map_or(-1.0, |&t| t as f64), last),
        Policy::NearPickEma | Policy::InvRouter => Key::Pair(credits.score[usize::from(e)], last),
        // (accesses since the start of the trace, time of last access).
        Policy::PerfectLfu => Key::Pair(credits.accesses[usize::from(e)] as f64, last),
        // freq / (clock − last + 1), the clock as it stands; ties: the earlier insertion.
        Policy::Lfru => Key::Ratio {
            num: entry.accesses,
            den: credits.lfru_clock - entry.lfru_last + 1,
            inserted: entry.inserted_at,
        },
        #[cfg(feature = "experimental-policy")]
        Policy::LfuFifo => Key::Pair(entry.accesses as f64, entry.inserted_at as f64),
    }
}

/// The cached expert of lowest priority among those `eligible` accepts, `None` if none is. The
/// map iterates in id order and only a strictly lower priority replaces the candidate, so ties
/// go to the lowest id.
fn lowest(
    policy: Policy,
    cache: &BTreeMap<u16, Entry>,
    credits: &Credits,
    next_use: impl Fn(u16) -> Option<usize>,
    eligible: impl Fn(u16) -> bool,
) -> Option<u16> {
    let mut best: Option<(u16, Key)> = None;
    for (&c, entry) in cache {
        if !eligible(c) {
            continue;
        }
        let pr = priority(policy, c, entry, credits, next_use(c));
        if best.is_none_or(|(_, b)| pr.partial_cmp(&b) == Some(std::cmp::Ordering::Less)) {
            best = Some((c, pr));
        }
    }
    best.map(|(c, _)| c)
}

/// Step 1: F, the kept candidates of row `t` of layer `l` in order, as (row position, expert).
fn kept_candidates(trace: &TraceView<'_>, keep: &Keep, l: usize, t: usize) -> Vec<(usize, u16)> {
    trace
        .row(l, t)
        .iter()
        .enumerate()
        .filter(|&(_, &e)| keep.is_kept(l, usize::from(e)))
        .map(|(i, &e)| (i, e))
        .collect()
}

/// The recorded scores of row `t` of layer `l`, if the trace has scores.
fn row_scores<'a>(trace: &TraceView<'a>, l: usize, t: usize) -> Option<&'a [f32]> {
    let m = trace.row(l, t).len();
    trace.layer_scores(l).map(|s| &s[t * m..(t + 1) * m])
}

/// Step 2: the first n of F when λ = 0; else F ranked by score, boosted by λ · Δ at rank < J or
/// when `resident`, ties by rank, its first n.
fn select(
    cfg: &ReplayConfig,
    f: &[(usize, u16)],
    n: usize,
    z_row: Option<&[f32]>,
    resident: impl Fn(u16) -> bool,
) -> Vec<(usize, u16)> {
    if cfg.lambda == 0.0 {
        return f[..n].to_vec();
    }
    let z_row = z_row.expect("validate() guarantees scores when lambda > 0");
    let z = |i: usize| f64::from(z_row[i]);
    let delta = if n <= 1 { 0.0 } else { z(f[0].0) - z(f[n - 1].0) };
    let mut ranked: Vec<(f64, usize, usize, u16)> = Vec::new(); // (score, rank, position, expert)
    for (r, &(i, e)) in f.iter().enumerate() {
        let boosted = r < cfg.j || resident(e);
        let s = if boosted { z(i) + cfg.lambda * delta } else { z(i) };
        ranked.push((s, r, i, e));
    }
    ranked.sort_by(|a, b| b.0.partial_cmp(&a.0).expect("finite scores").then(a.1.cmp(&b.1)));
    ranked[..n].iter().map(|&(_, _, i, e)| (i, e)).collect()
}

/// Step 3 for one counted row: picks, forced misses, substitutions and pruned slots (the hits
/// and the other misses are counted at step 4).
fn count_row(
    counts: &mut LayerCounts,
    keep: &Keep,
    l: usize,
    row: &[u16],
    k_used: usize,
    n: usize,
    chosen: &[(usize, u16)],
) {
    counts.picks += k_used as u64;
    counts.misses += (k_used - n) as u64;
    counts.forced_misses += (k_used - n) as u64;
    let first = &row[..k_used];
    counts.substituted += chosen.iter().filter(|(_, e)| !first.contains(e)).count() as u64;
    counts.pruned_slots += first.iter().filter(|&&e| !keep.is_kept(l, usize::from(e))).count() as u64;
}

/// The recorded sequence starts when caches reset there, else none.
fn sequence_starts(trace: &TraceView<'_>, cfg: &ReplayConfig) -> BTreeSet<usize> {
    match (cfg.reset_at_sequence, trace.seq_offsets()) {
        (true, Some(offsets)) => offsets.iter().map(|&o| o as usize).collect(),
        _ => BTreeSet::new(),
    }
}

fn replay_layer(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, l: usize) -> LayerCounts {
    let shape = trace.shape();
    let k_used = cfg.k_used_or(shape.top_k);
    let sequence_starts = sequence_starts(trace, cfg);

    // Belady needs the future: the λ = 0 selections of every token, and for each (token, chosen
    // expert) the next token at which that expert is chosen again.
    let next_uses: Vec<BTreeMap<u16, Option<usize>>> = if cfg.policy == Policy::Belady {
        belady_next_uses(trace, keep, l, k_used, &sequence_starts)
    } else {
        Vec::new()
    };

    let mut counts = LayerCounts::default();
    let mut cache: BTreeMap<u16, Entry> = BTreeMap::new();
    // Belady: each cached expert's next use, as of its last access.
    let mut next_use: BTreeMap<u16, Option<usize>> = BTreeMap::new();
    let mut credits = Credits::new(shape.num_experts);
    let mut clock: u64 = 0;

    for t in 0..shape.tokens {
        if sequence_starts.contains(&t) {
            cache.clear();
            credits = Credits::new(shape.num_experts);
        }
        let row = trace.row(l, t);
        let z_row = row_scores(trace, l, t);
        let f = kept_candidates(trace, keep, l, t);
        let n = k_used.min(f.len());
        let chosen = select(cfg, &f, n, z_row, |e| cache.contains_key(&e));
        let counted = t >= cfg.warmup;
        if counted {
            count_row(&mut counts, keep, l, row, k_used, n, &chosen);
        }

        // Step 4: residency, chosen experts in order.
        let chosen_set: BTreeSet<u16> = chosen.iter().map(|&(_, e)| e).collect();
        for &(_, e) in &chosen {
            clock += 1;
            next_use.insert(e, next_uses.get(t).and_then(|m| m.get(&e).copied()).flatten());
            if let Some(entry) = cache.get_mut(&e) {
                if counted {
                    counts.hits += 1;
                }
                entry.touch(e, clock, &mut credits);
            } else {
                if counted {
                    counts.misses += 1;
                }
                if cache.len() >= cfg.cap_of(l) {
                    // Skipping this token's chosen set in k-way mode.
                    let kway = cfg.semantics == Semantics::KWay;
                    let v =
                        lowest(cfg.policy, &cache, &credits, |c| next_use[&c], |c| !(kway && chosen_set.contains(&c)))
                            .expect("a full cache holds an expert outside the chosen set");
                    cache.remove(&v);
                }
                cache.insert(e, Entry::new(e, clock, &mut credits));
            }
        }

        // Step 5: policy credits for the token.
        credits.credit(cfg, t, &[(f, row, z_row)]);
    }
    counts
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
