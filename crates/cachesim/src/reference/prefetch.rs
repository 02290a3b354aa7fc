//! A plain reference replayer for prefetch and the timeline (SEMANTICS.md §12, §13), written
//! for clarity from the text, not from the fast code ([`crate::replay_prefetch`]).
//!
//! One layer after another in layer order (coact reads the previous layer's chosen experts of
//! this very replay), single-threaded, with `BTreeMap`s, `Vec`s and f64. Prefetched experts are
//! tracked explicitly (a map from expert to "made at a counted token", removed at the first
//! demand access and at every eviction); the timeline is a plain queue of loads in f64 seconds.
//! Counts must equal the fast replayer's exactly; timeline figures agree to rounding (the fast
//! one keeps times exactly as sums of compute steps and loads).

use std::collections::{BTreeMap, BTreeSet};

use trace_io::TraceView;

use super::{Credits, Entry};
use crate::{
    Keep, LayerCounts, Predictor, PrefetchCounts, PrefetchOptions, PrefetchReplay, ReplayConfig, ReplayCounts, Result,
    Semantics, Timeline,
};

/// Replays like [`crate::replay_prefetch`], plainly and on one thread.
///
/// # Errors
/// As [`crate::replay_prefetch`].
pub fn replay(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    opts: &PrefetchOptions<'_>,
) -> Result<PrefetchReplay> {
    let shape = trace.shape();
    crate::validate(&shape, trace.parts().scores.is_some(), cfg)?;
    keep.check_shape(&shape)?;
    crate::validate_prefetch(trace, cfg, opts)?;
    super::require_whole_rows(trace, cfg)?;
    let mut layers = Vec::new();
    let mut logs: Vec<Vec<TokenLog>> = Vec::new();
    let (mut prefetch_loads, mut useful) = (0, 0);
    for l in 0..shape.layers {
        let prev_chosen = logs.last().map(|log: &Vec<TokenLog>| log.iter().map(|x| x.chosen.clone()).collect());
        let (counts, loads, use_, log) = replay_layer(trace, keep, cfg, opts, l, prev_chosen);
        layers.push(counts);
        prefetch_loads += loads;
        useful += use_;
        logs.push(log);
    }
    let replay = ReplayCounts::from_layers(&shape, cfg.warmup, &layers);
    let counts = PrefetchCounts { replay, prefetch_loads, useful, wasted: prefetch_loads - useful };
    let timeline = opts.timeline.map(|dev| play(&logs, shape.num_experts, cfg.warmup, dev.compute_ms, dev.load_s()));
    Ok(PrefetchReplay { counts, timeline })
}

/// What one (token, layer) loaded and chose, for the timeline.
#[derive(Debug, Clone, Default)]
struct TokenLog {
    prefetched: Vec<u16>,
    demand: Vec<u16>,
    chosen: Vec<u16>,
}

type LayerResult = (LayerCounts, u64, u64, Vec<TokenLog>);

fn replay_layer(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    opts: &PrefetchOptions<'_>,
    l: usize,
    prev_layer_chosen: Option<Vec<Vec<u16>>>,
) -> LayerResult {
    let shape = trace.shape();
    let num_experts = shape.num_experts;
    let k_used = cfg.k_used_or(shape.top_k);
    let cap = cfg.cap_of(l);
    let kway = cfg.semantics == Semantics::KWay;
    let sequence_starts = super::sequence_starts(trace, cfg);
    let mut counts = LayerCounts::default();
    let (mut prefetch_loads, mut useful) = (0u64, 0u64);
    let mut log: Vec<TokenLog> = Vec::new();
    let mut cache: BTreeMap<u16, Entry> = BTreeMap::new();
    // Prefetched experts not yet accessed by demand: expert -> made at a counted token.
    let mut prefetched: BTreeMap<u16, bool> = BTreeMap::new();
    let mut credits = Credits::new(num_experts);
    let mut clock: u64 = 0;
    // The cached expert of lowest priority outside `exclude` (validate_prefetch() refuses belady).
    let victim = |cache: &BTreeMap<u16, Entry>, credits: &Credits, exclude: &BTreeSet<u16>| -> u16 {
        super::lowest(cfg.policy, cache, credits, |_| None, |c| !exclude.contains(&c))
            .expect("a full cache holds an expert outside the protected set")
    };

    for t in 0..shape.tokens {
        if sequence_starts.contains(&t) {
            cache.clear();
            prefetched.clear();
            credits = Credits::new(num_experts);
        }
        let counted = t >= cfg.warmup;
        let row = trace.row(l, t);
        let z_row = super::row_scores(trace, l, t);
        let f = super::kept_candidates(trace, keep, l, t);
        let n = k_used.min(f.len());
        let mut entry = TokenLog::default();

        // Prefetch: the proposals, then the loads of the non-resident ones.
        if let Some(pf) = opts.prefetch {
            let b = pf.budget;
            let previous_token = || -> Vec<u16> { if t == 0 { Vec::new() } else { log[t - 1].chosen.clone() } };
            let list: Vec<u16> = match pf.predictor {
                Predictor::PrevToken => previous_token(),
                Predictor::Coact => match &prev_layer_chosen {
                    None => previous_token(),
                    Some(prev) => {
                        let table = opts.coact.expect("validated");
                        let mut scored: Vec<(u64, u16)> = (0..num_experts)
                            .map(|b| (prev[t].iter().map(|&a| u64::from(table.get(l, a.into(), b))).sum(), b as u16))
                            .filter(|&(s, _)| s > 0)
                            .collect();
                        scored.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
                        scored.into_iter().map(|(_, e)| e).collect()
                    }
                },
                Predictor::Lookahead => trace.lookahead_row(l, t).expect("validated").to_vec(),
                Predictor::Oracle => f[..n].iter().map(|&(_, e)| e).collect(),
            };
            let proposals: Vec<u16> = list.into_iter().take(b).filter(|&e| keep.is_kept(l, e.into())).collect();
            for &e in &proposals {
                if cache.contains_key(&e) {
                    continue;
                }
                clock += 1;
                if cache.len() >= cap {
                    let exclude: BTreeSet<u16> = proposals.iter().copied().collect();
                    let v = victim(&cache, &credits, &exclude);
                    cache.remove(&v);
                    prefetched.remove(&v);
                }
                cache.insert(e, Entry::prefetched(clock, &mut credits));
                prefetched.insert(e, counted);
                entry.prefetched.push(e);
                if counted {
                    prefetch_loads += 1;
                }
            }
        }

        // Step 2: selection (prefetched experts are resident).
        let chosen = super::select(cfg, &f, n, z_row, |e| cache.contains_key(&e));
        if counted {
            super::count_row(&mut counts, keep, l, row, k_used, n, &chosen);
        }

        // Step 4: demand accesses.
        let chosen_set: BTreeSet<u16> = if kway { chosen.iter().map(|&(_, e)| e).collect() } else { BTreeSet::new() };
        for &(_, e) in &chosen {
            clock += 1;
            if let Some(en) = cache.get_mut(&e) {
                if counted {
                    counts.hits += 1;
                }
                en.touch(e, clock, &mut credits);
                if prefetched.remove(&e) == Some(true) {
                    useful += 1;
                }
            } else {
                if counted {
                    counts.misses += 1;
                }
                if cache.len() >= cap {
                    let v = victim(&cache, &credits, &chosen_set);
                    cache.remove(&v);
                    prefetched.remove(&v);
                }
                cache.insert(e, Entry::new(e, clock, &mut credits));
                entry.demand.push(e);
            }
        }
        entry.chosen = chosen.iter().map(|&(_, e)| e).collect();
        log.push(entry);

        // Step 5: credits.
        credits.credit(cfg, t, &[(f, row, z_row)]);
    }
    (counts, prefetch_loads, useful, log)
}

/// The timeline of SEMANTICS.md §13, plainly: every load on one FIFO channel in f64 seconds.
fn play(logs: &[Vec<TokenLog>], num_experts: usize, warmup: usize, compute_ms: f64, tau: f64) -> Timeline {
    let layers = logs.len();
    let tokens = logs[0].len();
    let c = compute_ms / (1000.0 * layers as f64);
    let mut done = vec![vec![0.0f64; num_experts]; layers];
    let (mut channel, mut prev_start, mut prev_end) = (0.0f64, 0.0f64, 0.0f64);
    let mut total = 0.0;
    for t in 0..tokens {
        let token_begin = prev_end;
        for (l, layer_log) in logs.iter().enumerate() {
            let x = &layer_log[t];
            for &e in &x.prefetched {
                channel = channel.max(prev_start) + tau;
                done[l][usize::from(e)] = channel;
            }
            for &e in &x.demand {
                channel = channel.max(prev_end) + tau;
                done[l][usize::from(e)] = channel;
            }
            let start = x.chosen.iter().fold(prev_end, |s, &e| s.max(done[l][usize::from(e)]));
            prev_start = start;
            prev_end = start + c;
        }
        if t >= warmup {
            total += prev_end - token_begin;
        }
    }
    let counted = (tokens - warmup) as f64;
    Timeline { tok_s: counted / total, stall_s_per_token: (total - counted * compute_ms / 1000.0) / counted }
}
