//! Hand-computed prefetch replays and one timeline, one per predictor (derivations in the
//! comments), checked on both replayers.

mod common;

use std::collections::BTreeMap;

use cachesim::{
    CoactTable, Keep, Policy, Predictor, Prefetch, PrefetchCounts, PrefetchOptions, PrefetchReplay, ReplayConfig,
    Semantics, TimelineDevice, reference,
};
use trace_io::{Lookahead, Phase, ScoreKind, TraceMeta, TraceParts, TraceView};

fn meta(num_experts: u32, top_k: u32, layers: u32) -> TraceMeta {
    TraceMeta {
        model: "hand".into(),
        num_experts,
        top_k,
        layer_ids: (0..layers).collect(),
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: "prefetch_hand".into(),
        extra: BTreeMap::new(),
    }
}

/// The tensors of a trace with ids only.
fn parts(ids: &[u16]) -> TraceParts<'_> {
    TraceParts {
        ids,
        scores: None,
        gates: None,
        out_norms: None,
        seq_offsets: None,
        step_offsets: None,
        lookahead_ids: None,
    }
}

/// Replays on both replayers, asserts they agree, returns the fast result.
fn check(view: &TraceView<'_>, cfg: &ReplayConfig, opts: &PrefetchOptions<'_>) -> PrefetchReplay {
    let keep = Keep::full(&view.shape());
    let fast = cachesim::replay_prefetch(view, &keep, cfg, opts).expect("valid");
    let slow = reference::prefetch::replay(view, &keep, cfg, opts).expect("valid");
    assert_eq!(fast.counts, slow.counts);
    fast
}

/// (picks, hits, misses, prefetch_loads, useful, wasted)
fn summary(c: &PrefetchCounts) -> (u64, u64, u64, u64, u64, u64) {
    (c.replay.picks, c.replay.hits, c.replay.misses, c.prefetch_loads, c.useful, c.wasted)
}

fn cfg(policy: Policy, cap: usize) -> ReplayConfig {
    ReplayConfig { warmup: 0, ..ReplayConfig::new(policy, cap) }
}

fn pf(predictor: Predictor, budget: usize) -> Option<Prefetch> {
    Some(Prefetch { predictor, budget })
}

/// prev_token, lru, cap 2, k 1, B 1, resets at tokens 0 and 2; rows 0 1 | 1 0.
/// t0: nothing proposed, 0 misses. t1: 0 proposed, resident; 1 misses. t2: reset (empty);
/// 1 proposed and loaded; 1 hits: useful. t3: 1 resident; 0 misses.
/// Without the reset nothing is loaded (k-way keeps the previous token's experts resident) and
/// t3 hits 0: hits 2, misses 2.
#[test]
fn prev_token_after_a_reset() {
    let m = meta(4, 1, 1);
    let ids = [0, 1, 1, 0];
    let parts = TraceParts { seq_offsets: Some(&[0, 2]), ..parts(&ids) };
    let view = TraceView::new(&m, 4, 1, parts).expect("valid");
    let opts = PrefetchOptions { prefetch: pf(Predictor::PrevToken, 1), ..Default::default() };
    let reset = ReplayConfig { reset_at_sequence: true, ..cfg(Policy::Lru, 2) };
    assert_eq!(summary(&check(&view, &reset, &opts).counts), (4, 1, 3, 1, 1, 0));
    assert_eq!(summary(&check(&view, &cfg(Policy::Lru, 2), &opts).counts), (4, 2, 2, 0, 0, 0));
}

/// prev_token, lfu, sequential, cap 2, k 2, B 2; rows [0,1] [0,1] [2,3] [2,0] (clock in @).
/// t0: 0@1 1@2 miss. t1: 0@3 1@4 hit (2 accesses each). t2: 2@5 misses, evicts 0 (2, @3);
/// 3@6 misses, evicts 2 (1 access, the lowest; sequential protects nothing). t3: proposals
/// [2, 3]: 2 loaded@7 evicting 1 (3 is a proposal); demand 2@8 hits (useful), 0@9 misses and
/// evicts 3 (1 access). Picks 8, hits 3, misses 5, one prefetch load, useful.
#[test]
fn prev_token_in_sequential_mode() {
    let m = meta(4, 2, 1);
    let ids = [0, 1, 0, 1, 2, 3, 2, 0];
    let view = TraceView::new(&m, 4, 2, parts(&ids)).expect("valid");
    let opts = PrefetchOptions { prefetch: pf(Predictor::PrevToken, 2), ..Default::default() };
    let seq = ReplayConfig { semantics: Semantics::Sequential, ..cfg(Policy::Lfu, 2) };
    assert_eq!(summary(&check(&view, &seq, &opts).counts), (8, 3, 5, 1, 1, 0));
}

/// oracle, lru, cap 2, k 1, B 1; rows 0 1 2 0: plain lru misses all 4; the oracle loads each
/// ahead (4 loads, all useful), no demand miss.
#[test]
fn oracle_loads_every_miss_ahead() {
    let m = meta(4, 1, 1);
    let ids = [0, 1, 2, 0];
    let view = TraceView::new(&m, 4, 1, parts(&ids)).expect("valid");
    let opts = PrefetchOptions { prefetch: pf(Predictor::Oracle, 1), ..Default::default() };
    let r = check(&view, &cfg(Policy::Lru, 2), &opts);
    assert_eq!(summary(&r.counts), (4, 4, 0, 4, 4, 0));
    assert_eq!((r.counts.precision(), r.counts.coverage()), (1.0, 1.0));
}

/// lookahead, lru, cap 2, k 1, B 1; rows 0 1 2, lookahead rows [1,2] [1,0] [3,1].
/// t0: 1 loaded@1; 0 misses@2. t1: 1 resident; hits@3 (useful). t2: 3 loaded@4 evicting 0
/// (@2); 2 misses@5 evicting 1 (@3). 3 is never used: wasted.
/// Timeline (L = 1, c = 10 ms, τ = 20 ms): t0: P(3→... ) loads 1 on [0, 20], demand 0 on
/// [20, 40], compute [40, 50]. t1: waits for 1's load (done at 20): compute [50, 60]. t2: 3's
/// prefetch issued at 50 (t1's start) on [50, 70], demand 2 issued at 60 queues behind it on
/// [70, 90], compute [90, 100]. 3 tokens in 100 ms: 30 tok/s, stall (100 − 30) / 3 ms per
/// token. Plain lru misses all 3 (2 evicts 0): 3 · 30 ms, 33.3 tok/s: the wasted load delays
/// the demand load behind it.
#[test]
fn lookahead_and_its_timeline() {
    let m = meta(4, 1, 1);
    let (ids, la) = ([0, 1, 2], [1, 2, 1, 0, 3, 1]);
    let parts = TraceParts { lookahead_ids: Some(Lookahead { ids: &la, width: 2 }), ..parts(&ids) };
    let view = TraceView::new(&m, 3, 1, parts).expect("valid");
    let dev = TimelineDevice { expert_mb: 1.0, compute_ms: 10.0, bandwidth_gbps: 0.05 };
    let opts = PrefetchOptions { prefetch: pf(Predictor::Lookahead, 1), timeline: Some(dev), ..Default::default() };
    let r = check(&view, &cfg(Policy::Lru, 2), &opts);
    assert_eq!(summary(&r.counts), (3, 1, 2, 2, 1, 1));
    assert_eq!((r.counts.precision(), r.counts.coverage()), (0.5, 1.0 / 3.0));
    let t = r.timeline.expect("asked");
    assert!((t.tok_s - 30.0).abs() < 1e-9, "{t:?}");
    assert!((t.stall_s_per_token - 0.07 / 3.0).abs() < 1e-12, "{t:?}");
    let plain = check(&view, &cfg(Policy::Lru, 2), &PrefetchOptions { timeline: Some(dev), ..Default::default() });
    assert!((plain.timeline.expect("asked").tok_s - 100.0 / 3.0).abs() < 1e-9);
    // The same at a warmup of 1: tokens 1 and 2 take 10 and 40 ms.
    let warm = ReplayConfig { warmup: 1, ..cfg(Policy::Lru, 2) };
    let t = check(&view, &warm, &opts).timeline.expect("asked");
    assert!((t.tok_s - 2.0 / 0.05).abs() < 1e-9, "{t:?}");
}

/// coact, lru, cap 1, k 1, B 1, two layers. Calibration: layer 0 rows 0 0 1, layer 1 rows
/// 2 2 0, so Q_1[0][2] = 2, Q_1[1][0] = 1. Replay: layer 0 rows 0 1 0 (prev_token: nothing
/// loaded, 3 misses), layer 1 rows 2 1 2. Layer 1: t0: 0 chosen below, 2 proposed and loaded,
/// hit (useful). t1: 1 below → 0 proposed, loaded evicting 2; 1 misses evicting 0 (wasted).
/// t2: 0 below → 2 loaded evicting 1; hit (useful).
#[test]
fn coact_from_a_calibration_trace() {
    let m = meta(3, 1, 2);
    let calib_ids = [0, 0, 1, 2, 2, 0];
    let calib = TraceView::new(&m, 3, 1, parts(&calib_ids)).expect("valid");
    let table = CoactTable::learn(&calib).expect("a validated calibration trace");
    assert_eq!((table.get(1, 0, 2), table.get(1, 1, 0), table.get(1, 0, 0)), (2, 1, 0));
    let ids = [0, 1, 0, 2, 1, 2];
    let view = TraceView::new(&m, 3, 1, parts(&ids)).expect("valid");
    let opts = PrefetchOptions { prefetch: pf(Predictor::Coact, 1), coact: Some(&table), ..Default::default() };
    let r = check(&view, &cfg(Policy::Lru, 1), &opts);
    assert_eq!(summary(&r.counts), (6, 2, 4, 3, 2, 1));
    assert_eq!(r.counts.replay.layer_misses, [3, 1]);
}

/// Refusals before any work: belady, B > cap, lookahead without lookahead_ids, coact without a
/// table or with one of another shape.
#[test]
fn bad_prefetch_configurations_are_refused() {
    use cachesim::CacheSimError as E;
    let m = meta(3, 1, 2);
    let ids = [0, 1, 0, 2, 1, 2];
    let view = TraceView::new(&m, 3, 1, parts(&ids)).expect("valid");
    let keep = Keep::full(&view.shape());
    let other_meta = meta(4, 1, 2);
    let other_ids = [0, 1, 0, 2, 1, 3];
    let other = TraceView::new(&other_meta, 3, 1, parts(&other_ids)).unwrap();
    let other_table = CoactTable::learn(&other).expect("a validated calibration trace");
    let err = |c: &ReplayConfig, p: Option<Prefetch>, t: Option<&CoactTable>| {
        let opts = PrefetchOptions { prefetch: p, coact: t, ..Default::default() };
        cachesim::replay_prefetch(&view, &keep, c, &opts).expect_err("refused")
    };
    assert_eq!(
        err(&cfg(Policy::Belady, 2), pf(Predictor::Oracle, 1), None),
        E::PrefetchWithOffline { policy: Policy::Belady }
    );
    assert_eq!(
        err(&cfg(Policy::Lru, 2), pf(Predictor::Oracle, 3), None),
        E::BudgetAboveCap { budget: 3, cap: 2, layer: 0 }
    );
    assert_eq!(err(&cfg(Policy::Lru, 2), pf(Predictor::Lookahead, 1), None), E::NoLookahead);
    assert_eq!(err(&cfg(Policy::Lru, 2), pf(Predictor::Coact, 1), None), E::CoactNeedsCalibration);
    assert!(matches!(
        err(&cfg(Policy::Lru, 2), pf(Predictor::Coact, 1), Some(&other_table)),
        E::CalibrationMismatch { what: "experts per layer (E)", .. }
    ));
    let bad_dev = TimelineDevice { expert_mb: 1.0, compute_ms: 1.0, bandwidth_gbps: 0.0 };
    let opts = PrefetchOptions { timeline: Some(bad_dev), ..Default::default() };
    assert!(matches!(
        cachesim::replay_prefetch(&view, &keep, &cfg(Policy::Lru, 2), &opts),
        Err(E::InvalidParameter { name: "bandwidth_gbps", .. })
    ));
}

/// The shuffled copy permutes tokens, the same permutation in every layer, reproducibly.
#[test]
fn shuffle_permutes_tokens_alike_in_every_layer() {
    let m = meta(8, 1, 2);
    let ids: Vec<u16> = (0..8).chain((0..8).map(|e| 7 - e)).collect();
    let view = TraceView::new(&m, 8, 1, parts(&ids)).expect("valid");
    let a = cachesim::shuffle::Shuffled::new(&view, 3);
    let b = cachesim::shuffle::Shuffled::new(&view, 3);
    let c = cachesim::shuffle::Shuffled::new(&view, 4);
    assert_eq!(a.order(), b.order());
    assert_ne!(a.order(), c.order());
    let mut sorted = a.order().to_vec();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..8).collect::<Vec<_>>());
    assert_ne!(a.order(), (0..8).collect::<Vec<_>>());
    let v = a.view();
    for (t, &orig) in a.order().iter().enumerate() {
        assert_eq!(v.row(0, t), [orig as u16]);
        assert_eq!(v.row(1, t), [7 - orig as u16]);
    }
}
