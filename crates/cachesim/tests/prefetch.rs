//! Prefetch and the timeline (SEMANTICS.md §12, §13): the fast replayer against the plain
//! reference on every policy with every predictor, the oracle bound, and the timeline without
//! prefetch against §6's additive figure.

mod common;

use cachesim::{
    CoactTable, Keep, Policy, Predictor, Prefetch, PrefetchOptions, PrefetchReplay, ReplayConfig, Semantics,
    TimelineDevice, reference,
};
use common::{Synth, synth};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use trace_io::{Lookahead, TraceData, TraceMeta, TraceParts, TraceView};

/// A trace's tensors with a synthetic `lookahead_ids`: per (layer, token) the row's first
/// `width` ids with two of its first `width + 2` swapped at random (a noisy pre-gating signal).
struct WithLookahead {
    meta: TraceMeta,
    tokens: usize,
    m: usize,
    ids: Vec<u16>,
    scores: Option<Vec<f32>>,
    seq_offsets: Option<Vec<u64>>,
    lookahead: Vec<u16>,
    width: usize,
}

impl WithLookahead {
    fn new(trace: &TraceData, width: usize, seed: u64) -> WithLookahead {
        let v = trace.view();
        let s = v.shape();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut lookahead = Vec::new();
        for l in 0..s.layers {
            for t in 0..s.tokens {
                let mut row = v.row(l, t).to_vec();
                let reach = (width + 2).min(s.candidates);
                let (a, b) = (rng.random_range(0..reach), rng.random_range(0..reach));
                row.swap(a, b);
                lookahead.extend_from_slice(&row[..width]);
            }
        }
        WithLookahead {
            meta: v.meta().clone(),
            tokens: s.tokens,
            m: s.candidates,
            ids: v.parts().ids.to_vec(),
            scores: v.parts().scores.map(<[f32]>::to_vec),
            seq_offsets: v.seq_offsets().map(<[u64]>::to_vec),
            lookahead,
            width,
        }
    }

    fn view(&self) -> TraceView<'_> {
        let parts = TraceParts {
            ids: &self.ids,
            scores: self.scores.as_deref(),
            gates: None,
            out_norms: None,
            seq_offsets: self.seq_offsets.as_deref(),
            step_offsets: None,
            lookahead_ids: Some(Lookahead { ids: &self.lookahead, width: self.width }),
        };
        TraceView::new(&self.meta, self.tokens, self.m, parts).expect("a valid trace with lookahead")
    }
}

const DEV: TimelineDevice = TimelineDevice { expert_mb: 17.301504, compute_ms: 20.0, bandwidth_gbps: 3.9 };

/// Replays on both replayers, asserts equal counts and timelines (to 1e-9 relative), returns the
/// fast one.
fn both(view: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, opts: &PrefetchOptions<'_>) -> PrefetchReplay {
    let fast = cachesim::replay_prefetch(view, keep, cfg, opts).expect("valid");
    let slow = reference::prefetch::replay(view, keep, cfg, opts).expect("valid");
    assert_eq!(fast.counts, slow.counts, "{cfg:?} {:?}", opts.prefetch);
    match (fast.timeline, slow.timeline) {
        (Some(a), Some(b)) => {
            let close = |x: f64, y: f64| (x - y).abs() <= 1e-9 * x.abs().max(y.abs()).max(1e-12);
            assert!(close(a.tok_s, b.tok_s), "{a:?} vs {b:?} {cfg:?} {:?}", opts.prefetch);
            assert!(close(a.stall_s_per_token, b.stall_s_per_token), "{a:?} vs {b:?} {cfg:?} {:?}", opts.prefetch);
        }
        (None, None) => {}
        other => panic!("timeline present in one replayer only: {other:?}"),
    }
    let c = &fast.counts;
    assert_eq!(c.replay.hits + c.replay.misses, c.replay.picks);
    assert_eq!(c.useful + c.wasted, c.prefetch_loads);
    fast
}

/// Every policy (but belady) with every predictor and without, on full and pruned keep sets,
/// at λ = 0 and λ > 0, k-way and sequential, with warmup, resets and small and large budgets.
#[test]
fn fast_equals_reference_on_every_policy_and_predictor() {
    let s = Synth {
        layers: 3,
        tokens: 260,
        num_experts: 24,
        top_k: 3,
        candidates: 8,
        reuse: 0.4,
        sequences: 3,
        with_scores: true,
    };
    let trace = synth(7, s);
    let calib = synth(8, s);
    let table = CoactTable::learn(&calib.view()).expect("a validated calibration trace");
    let la = WithLookahead::new(&trace, 5, 3);
    let view = la.view();
    let shape = view.shape();
    let full = Keep::full(&shape);
    let pruned = Keep::from_layers(&shape, &common::random_keep(5, s.layers, s.num_experts, 0.6, 8)).expect("keep");
    let mut predictors: Vec<Option<Prefetch>> = vec![None];
    for predictor in Predictor::ALL {
        for budget in [1, 3, 5] {
            predictors.push(Some(Prefetch { predictor, budget }));
        }
    }
    let mut nonzero = 0;
    for policy in Policy::ALL.into_iter().filter(|p| p.facts().allows_prefetch()) {
        for (keep, lambda, semantics, warmup, reset, cap) in [
            (&full, 0.0, Semantics::KWay, 0, false, 6),
            (&pruned, 0.0, Semantics::KWay, 10, true, 5),
            (&full, 0.3, Semantics::KWay, 5, false, 7),
            (&pruned, 0.2, Semantics::Sequential, 0, false, 6),
            (&full, 0.0, Semantics::Sequential, 3, true, 5),
        ] {
            let cfg = ReplayConfig {
                lambda,
                j: 1,
                semantics,
                warmup,
                reset_at_sequence: reset,
                near_pick_n: 4,
                decay: 0.9,
                ..ReplayConfig::new(policy, cap)
            };
            for &prefetch in &predictors {
                let opts = PrefetchOptions { prefetch, coact: Some(&table), timeline: Some(DEV) };
                let r = both(&view, keep, &cfg, &opts);
                nonzero += usize::from(r.counts.useful > 0 && r.counts.wasted > 0);
            }
        }
    }
    // The cases exercise both outcomes of a prefetch.
    assert!(nonzero > 100, "{nonzero}");
}

/// Without prefetch the counts are those of `replay`, and the timeline is §6's additive
/// figure, bit for bit: 1 / (compute_ms / 1000 + misses_per_token · expert_mb / (1000 · bw)).
#[test]
fn no_prefetch_is_plain_replay_and_the_additive_model() {
    let s = Synth {
        layers: 4,
        tokens: 500,
        num_experts: 32,
        top_k: 4,
        candidates: 8,
        reuse: 0.3,
        sequences: 1,
        with_scores: true,
    };
    let trace = synth(11, s);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for policy in Policy::ALL {
        for (cap, warmup, bw) in [(4, 0, 3.9), (9, 64, 6.8), (16, 499, 0.5)] {
            let cfg = ReplayConfig { warmup, ..ReplayConfig::new(policy, cap) };
            let dev = TimelineDevice { bandwidth_gbps: bw, ..DEV };
            let opts = PrefetchOptions { timeline: Some(dev), ..Default::default() };
            let r = cachesim::replay_prefetch(&view, &keep, &cfg, &opts).expect("valid");
            let plain = cachesim::replay(&view, &keep, &cfg).expect("valid");
            assert_eq!(r.counts.replay, plain);
            assert_eq!((r.counts.prefetch_loads, r.counts.useful), (0, 0));
            let t = r.timeline.expect("asked");
            let additive = 1.0 / (dev.compute_ms / 1000.0 + plain.misses_per_token() * dev.expert_mb / (1000.0 * bw));
            assert_eq!(t.tok_s, additive, "{policy} cap {cap}");
            let stall = plain.misses_per_token() * dev.expert_mb / (1000.0 * bw);
            assert_eq!(t.stall_s_per_token, stall);
            if policy.facts().allows_prefetch() {
                both(&view, &keep, &cfg, &opts);
            }
        }
    }
}

/// `oracle` with B = k_used (λ = 0, k-way, no forced misses): no demand miss, as many
/// prefetch loads as plain replay has misses (its loads moved ahead), none wasted; the
/// timeline never gets slower than the additive one. Not lfru's loads: its clock advances at
/// every insert (SEMANTICS.md §15.3), a prefetch load too, and its freq counts the load and the
/// demand hit, so its ratios, and then its victims, differ from the plain replay's; it still has
/// no demand miss and wastes no load.
#[test]
fn oracle_at_k_used_moves_every_miss_ahead() {
    let s = Synth {
        layers: 3,
        tokens: 400,
        num_experts: 32,
        top_k: 4,
        candidates: 8,
        reuse: 0.3,
        sequences: 2,
        with_scores: true,
    };
    let trace = synth(21, s);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for policy in Policy::ALL.into_iter().filter(|p| p.facts().allows_prefetch()) {
        for (cap, warmup, reset) in [(4, 0, false), (7, 30, true), (12, 5, false)] {
            let cfg = ReplayConfig { warmup, reset_at_sequence: reset, ..ReplayConfig::new(policy, cap) };
            let plain = cachesim::replay(&view, &keep, &cfg).expect("valid");
            let opts = PrefetchOptions {
                prefetch: Some(Prefetch { predictor: Predictor::Oracle, budget: 4 }),
                timeline: Some(DEV),
                ..Default::default()
            };
            let r = both(&view, &keep, &cfg, &opts);
            assert_eq!(r.counts.replay.misses, 0, "{policy} cap {cap}");
            assert_eq!((r.counts.useful, r.counts.wasted), (r.counts.prefetch_loads, 0));
            assert_eq!(r.counts.precision(), 1.0);
            assert_eq!(r.counts.coverage(), 1.0);
            if policy == Policy::Lfru {
                continue;
            }
            assert_eq!(r.counts.prefetch_loads, plain.misses, "{policy} cap {cap}");
            let additive = 1.0 / (DEV.compute_ms / 1000.0 + plain.misses_per_token() * DEV.expert_mb / 3900.0);
            assert!(r.timeline.expect("asked").tok_s >= additive * (1.0 - 1e-12));
        }
    }
}

/// `PRED:B` parsing: the spellings, and an error for each way it goes wrong.
#[test]
fn prefetch_specs_parse_and_say_what_is_wrong() {
    use cachesim::{ParsePrefetchError, Predictor, Prefetch};
    let check = common::check_parse::<Prefetch>;
    for p in Predictor::ALL {
        check(&format!("{p}:4"), Ok(Prefetch { predictor: p, budget: 4 }));
        check(&format!("{p}: 0"), Ok(Prefetch { predictor: p, budget: 0 }));
        check(p.as_str(), Err(&format!("\"{p}\" has no budget: expected PRED:B, e.g. {p}:4")));
    }
    let names = Predictor::ALL.map(Predictor::as_str).join(", ");
    check("foo:3", Err(&format!("unknown predictor \"foo\"; expected one of: {names}")));
    check("foo", Err(&format!("unknown predictor \"foo\"; expected one of: {names}")));
    check("oracle:-1", Err("budget \"-1\" of \"oracle:-1\" is not a whole number >= 0"));
    check("coact:", Err("budget \"\" of \"coact:\""));
    assert!(matches!("coact".parse::<Prefetch>(), Err(ParsePrefetchError::NoBudget { .. })));
}
