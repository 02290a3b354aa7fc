//! The scheduler behind [`crate::replay_many_traces`]: which configurations of a layer share
//! work (units), what each unit costs, and the task queue that runs them on the rayon pool.

use rayon::prelude::*;
use trace_io::{Shape, TraceView};

use crate::{Keep, LayerCounts, ReplayConfig, ReplayCounts, Result, Shares, engine, validate};

/// Configurations of one layer replayed together in one task of
/// [`crate::replay_many_traces`] (indices into `runs`): one keep set after another, those that
/// prune the layer with the same set (two or more) reading one F table, and those that share
/// the softmax (two or more) reading one softmax table.
type Unit = Vec<usize>;

/// Splits layer `l`'s configurations into units: by keep set, or, when two or more of them
/// share the softmax, all of them as one unit (they share the softmax, and F with the others of
/// their keep set).
fn layer_units(runs: &[(&Keep, &ReplayConfig)], l: usize) -> Vec<Unit> {
    let all: Vec<usize> = (0..runs.len()).collect();
    if all.iter().filter(|&&i| shares_softmax(runs[i].1)).count() >= 2 {
        return vec![all];
    }
    by_keep_set(runs, l, &all)
}

/// `members` (indices into `runs`) split by their keep set of layer `l`, in order of first
/// appearance: positions in `members`.
fn by_keep_set(runs: &[(&Keep, &ReplayConfig)], l: usize, members: &[usize]) -> Vec<Vec<usize>> {
    let mut sets: Vec<(&[bool], Vec<usize>)> = Vec::new();
    for (p, &i) in members.iter().enumerate() {
        let mask = runs[i].0.layer_mask(l);
        match sets.iter_mut().find(|(m, _)| *m == mask) {
            Some((_, set)) => set.push(p),
            None => sets.push((mask, vec![p])),
        }
    }
    sets.into_iter().map(|(_, set)| set).collect()
}

/// Whether `cfg`'s policy shares the softmax of every row with its kind ([`Shares`]).
fn shares_softmax(cfg: &ReplayConfig) -> bool {
    cfg.policy.facts().shares == Shares::Softmax
}

/// An estimate of a unit's cost on a layer of a trace of `shape`, only to order the tasks
/// (costliest first): per member, its picks (tokens × k_used) times its policy's cost per pick
/// ([`crate::PolicyFacts::cost_per_pick`]), plus 70 at λ > 0.
fn unit_cost(runs: &[(&Keep, &ReplayConfig)], unit: &Unit, shape: &Shape) -> u64 {
    unit.iter()
        .map(|&i| {
            let cfg = runs[i].1;
            let per_pick = cfg.policy.facts().cost_per_pick + if cfg.lambda > 0.0 { 70 } else { 0 };
            per_pick * (shape.tokens * cfg.k_used.unwrap_or(shape.top_k)) as u64
        })
        .sum()
}

/// Replays one unit on layer `l` of `trace`: the counts of its members, in its order. `f_table`
/// is the worker's F table, rebuilt here when the unit needs one.
fn replay_unit(
    trace: &TraceView<'_>,
    l: usize,
    runs: &[(&Keep, &ReplayConfig)],
    members: &Unit,
    progress: &(dyn Fn(usize) + Sync),
    f_table: &mut engine::FTable,
    sharing: Sharing,
) -> Vec<LayerCounts> {
    let shape = trace.shape();
    let scores = trace.layer_scores(l);
    let params = |i: usize| {
        let cfg = runs[i].1;
        let mut params = engine::Params::new(&shape, cfg, trace.seq_offsets());
        params.cap = cfg.cap_of(l);
        params
    };
    let share_softmax = members.iter().filter(|&&i| shares_softmax(runs[i].1)).count() >= 2;
    let probs = scores.filter(|_| share_softmax).map(|z| engine::softmax_layer(z, shape.candidates));
    let mut counts = vec![LayerCounts::default(); members.len()];
    // One keep set after another, one F table alive at a time.
    for mut same in by_keep_set(runs, l, members) {
        let mask = runs[members[same[0]]].0.layer_mask(l);
        if sharing == Sharing::Lockstep {
            // Configurations that differ only in cap, of a policy with a one-pass curve: one pass
            // of the curve for all their caps.
            for group in curve_groups(runs, members, &same) {
                let cfg = runs[members[group[0]]].1;
                let caps: Vec<usize> = group.iter().map(|&b| runs[members[b]].1.cap_of(l)).collect();
                for (&b, c) in
                    group.iter().zip(crate::mrc::layer_counts_at_caps(trace, l, mask, probs.as_deref(), cfg, &caps))
                {
                    counts[b] = c;
                    progress(shape.tokens);
                }
                same.retain(|b| !group.contains(b));
            }
        }
        let table = (same.len() >= 2 && !mask.iter().all(|&kept| kept))
            .then(|| f_table.rebuild(trace.layer_ids(l), mask, shape.candidates));
        let input = |i: usize| engine::LayerInput {
            ids: trace.layer_ids(l),
            scores,
            keep: runs[i].0.layer_mask(l),
            probs: probs.as_deref().filter(|_| shares_softmax(runs[i].1)),
            f_table: table,
        };
        if sharing == Sharing::Lockstep && same.len() >= 2 {
            let mut group: Vec<Box<dyn engine::lockstep::Member + '_>> =
                same.iter().map(|&b| crate::policy::lockstep_member(params(members[b]), input(members[b]))).collect();
            let group_counts = engine::lockstep::run_lockstep(
                &mut group,
                shape.tokens,
                engine::lockstep::block_tokens(shape.candidates),
                progress,
            );
            for (&b, c) in same.iter().zip(group_counts) {
                counts[b] = c;
            }
            continue;
        }
        for b in same {
            let i = members[b];
            counts[b] = crate::policy::replay_layer(&params(i), &input(i));
            progress(shape.tokens);
        }
    }
    counts
}

/// The groups (positions in `members`) of `same` that one curve pass replays: the
/// configurations with a one-pass curve ([`crate::mrc::replays_by_curve`]) that differ only in
/// cap, in order of first appearance, where there are enough of them for the pass to pay
/// ([`crate::mrc::curve_pays_from`]).
fn curve_groups(runs: &[(&Keep, &ReplayConfig)], members: &[usize], same: &[usize]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for &b in same {
        let cfg = runs[members[b]].1;
        if !crate::mrc::replays_by_curve(cfg) {
            continue;
        }
        match groups.iter_mut().find(|g| crate::mrc::same_curve(runs[members[g[0]]].1, cfg)) {
            Some(g) => g.push(b),
            None => groups.push(vec![b]),
        }
    }
    groups.retain(|g| g.len() >= crate::mrc::curve_pays_from(runs[members[g[0]]].1.policy));
    groups
}

/// How [`crate::replay_many_traces_with`] runs the configurations of a layer that share a keep
/// set (their counts are the same either way).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Sharing {
    /// One pass over the layer's rows for all of them, a block of tokens at a time (each
    /// configuration's token loop resumed block after block), so the rows and the shared
    /// tables are read from the core's cache by every configuration (issue #40); and those that
    /// differ only in cap, of a policy with a one-pass curve at λ = 0
    /// ([`crate::mrc::has_one_pass`]), by one pass of that curve for all their caps.
    #[default]
    Lockstep,
    /// One configuration after another over the whole layer (the path before issue #40, kept to
    /// compare against).
    PerConfig,
}

/// [`crate::replay_many_traces_with`].
pub(crate) fn replay_many_traces(
    traces: &[TraceView<'_>],
    runs: &[(&Keep, &ReplayConfig)],
    sharing: Sharing,
    progress: &(dyn Fn(usize) + Sync),
) -> Result<Vec<Vec<ReplayCounts>>> {
    for trace in traces {
        let shape = trace.shape();
        for (keep, cfg) in runs {
            validate(&shape, trace.parts().scores.is_some(), cfg)?;
            keep.check_shape(&shape)?;
            crate::require(trace, crate::replay_reads(&shape, keep, cfg))?;
        }
    }
    // Every (trace, layer, unit), then a queue of them: the longest trace first, layer by layer
    // (a layer's ids and scores stay in cache while its units run), the costliest unit of a layer
    // first; the short trace's tasks come last and fill the end. Each task's counts depend only
    // on its inputs, so the order and the thread count change nothing but the time.
    let mut tasks: Vec<(usize, usize, Unit, u64)> = Vec::new();
    for (t, trace) in traces.iter().enumerate() {
        let shape = trace.shape();
        for l in 0..shape.layers {
            for unit in layer_units(runs, l) {
                let cost = unit_cost(runs, &unit, &shape);
                tasks.push((t, l, unit, cost));
            }
        }
    }
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| {
        let (t, l, _, cost) = &tasks[i];
        (std::cmp::Reverse(traces[*t].shape().tokens), *t, *l, std::cmp::Reverse(*cost))
    });
    // `par_bridge` hands the items out in order as threads become free; each worker keeps one F
    // table whose buffers serve all its tasks.
    let done: Vec<(usize, Vec<LayerCounts>)> = order
        .into_iter()
        .par_bridge()
        .map_init(engine::FTable::default, |f_table, i| {
            let (t, l, unit, _) = &tasks[i];
            (i, replay_unit(&traces[*t], *l, runs, unit, progress, f_table, sharing))
        })
        .collect();
    let mut per_trace: Vec<Vec<Vec<LayerCounts>>> =
        traces.iter().map(|trace| vec![vec![LayerCounts::default(); trace.shape().layers]; runs.len()]).collect();
    for (i, counts) in done {
        let (t, l, unit, _) = &tasks[i];
        for (&run, c) in unit.iter().zip(counts) {
            per_trace[*t][run][*l] = c;
        }
    }
    Ok(traces
        .iter()
        .zip(per_trace)
        .map(|(trace, per_run)| {
            let shape = trace.shape();
            runs.iter()
                .zip(per_run)
                .map(|((_, cfg), layers)| ReplayCounts::from_layers(&shape, cfg.warmup, &layers))
                .collect()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Policy, Semantics, reference, replay};

    /// Configurations that differ only in cap, replayed by one pass of their curve (every policy
    /// with one, caps from k_used to above E, per-layer caps, duplicates of one cap), give the
    /// counts of `replay` and of the reference replayer; the others beside them are replayed.
    #[test]
    fn configurations_of_one_curve_equal_replay() {
        let synth = trace_io::synth::SynthConfig {
            layers: 2,
            experts: 16,
            top_k: 3,
            candidates: 7,
            tokens: 260,
            sequences: 3,
            ..Default::default()
        };
        let trace = trace_io::synth::generate(&synth).expect("a valid synthetic trace");
        let view = trace.view();
        let shape = view.shape();
        let full = Keep::full(&shape);
        let pruned = Keep::from_layers(&shape, &[(0..16).step_by(2).chain([1, 3]).collect(), (4..16).collect()])
            .expect("a valid keep set");
        let mut cfgs = Vec::new();
        for policy in Policy::ALL {
            for (k_used, warmup, reset, decay) in [(None, 0, false, 0.99), (Some(2), 5, true, 0.03)] {
                let base = ReplayConfig {
                    k_used,
                    warmup,
                    reset_at_sequence: reset,
                    decay,
                    near_pick_n: 4,
                    j: 0,
                    ..ReplayConfig::new(policy, 3)
                };
                for cap in [3, 4, 7, 16, 20] {
                    cfgs.push(ReplayConfig { cap, ..base.clone() });
                }
                cfgs.push(ReplayConfig { cap: 4, j: 3, ..base.clone() });
                cfgs.push(ReplayConfig { layer_caps: Some(vec![5, 9]), ..base.clone() });
                if policy.facts().allows_lambda() {
                    cfgs.push(ReplayConfig { lambda: 0.2, cap: 4, ..base.clone() });
                }
                cfgs.push(ReplayConfig { semantics: Semantics::Sequential, cap: 5, ..base.clone() });
            }
        }
        let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().flat_map(|c| [(&full, c), (&pruned, c)]).collect();
        assert!(
            curve_groups(&runs, &(0..runs.len()).collect::<Vec<_>>(), &(0..runs.len()).collect::<Vec<_>>()).len() >= 10
        );
        let many = replay_many_traces(&[view], &runs, Sharing::Lockstep, &|_| {}).expect("valid configs");
        for ((keep, cfg), got) in runs.iter().zip(&many[0]) {
            assert_eq!(got, &replay(&view, keep, cfg).expect("valid config"), "{cfg:?}");
            assert_eq!(got, &reference::replay(&view, keep, cfg).expect("valid config"), "{cfg:?}");
        }
    }

    /// Configurations replayed together (inv_router ones reading one softmax table, pruned ones
    /// one F table) give the counts of `replay` and of the reference replayer, with caps, λ, j,
    /// k_used, warmups, resets, semantics and decays that differ. Two traces of different
    /// lengths go through one task queue.
    #[test]
    fn configurations_together_equal_replay() {
        let synth = trace_io::synth::SynthConfig {
            layers: 2,
            experts: 16,
            top_k: 3,
            candidates: 7,
            tokens: 300,
            sequences: 4,
            ..Default::default()
        };
        let trace = trace_io::synth::generate(&synth).expect("a valid synthetic trace");
        let short = trace_io::synth::generate(&trace_io::synth::SynthConfig { tokens: 180, seed: 9, ..synth })
            .expect("a valid synthetic trace");
        let view = trace.view();
        let shape = view.shape();
        let full = Keep::full(&shape);
        let pruned = Keep::from_layers(&shape, &[(0..16).step_by(2).chain([1, 3]).collect(), (4..16).collect()])
            .expect("a valid keep set");
        let mut cfgs = Vec::new();
        for policy in [Policy::NearPickEma, Policy::InvRouter] {
            for (cap, lambda, j, k_used, warmup, reset) in [
                (4, 0.0, 0, None, 0, false),
                (4, 0.12, 2, None, 5, false),
                (6, 0.5, 1, Some(2), 0, false),
                (5, 0.0, 0, None, 3, true),
                (3, 0.3, 2, None, 0, true),
            ] {
                cfgs.push(ReplayConfig {
                    lambda,
                    j,
                    k_used,
                    warmup,
                    reset_at_sequence: reset,
                    near_pick_n: 4,
                    ..ReplayConfig::new(policy, cap)
                });
            }
            cfgs.push(ReplayConfig {
                semantics: Semantics::Sequential,
                lambda: 0.2,
                j: 1,
                ..ReplayConfig::new(policy, 4)
            });
            cfgs.push(ReplayConfig { decay: 0.9, ..ReplayConfig::new(policy, 4) });
        }
        let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().flat_map(|c| [(&full, c), (&pruned, c)]).collect();
        let views = [view, short.view()];
        for sharing in [Sharing::Lockstep, Sharing::PerConfig] {
            let steps = std::sync::atomic::AtomicUsize::new(0);
            let many = replay_many_traces(&views, &runs, sharing, &|tokens| {
                steps.fetch_add(tokens, std::sync::atomic::Ordering::Relaxed);
            })
            .expect("valid configs");
            assert_eq!(steps.into_inner(), runs.len() * shape.layers * (300 + 180));
            assert_eq!(many.len(), 2);
            for (view, many) in views.iter().zip(&many) {
                for ((keep, cfg), got) in runs.iter().zip(many) {
                    assert!(got.misses > 0 && got.hits > 0, "{cfg:?}");
                    assert_eq!(got, &replay(view, keep, cfg).expect("valid config"), "{sharing:?} {cfg:?}");
                    let expect = reference::replay(view, keep, cfg).expect("valid config");
                    assert_eq!(got, &expect, "{sharing:?} {cfg:?}");
                }
            }
        }
    }
}
