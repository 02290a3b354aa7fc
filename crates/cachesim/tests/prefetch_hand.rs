//! Hand-computed prefetch replays and timelines, one table (derivations in the comments),
//! checked on both replayers.

mod common;

use std::collections::BTreeMap;

use cachesim::{
    CoactTable, Keep, Policy, Predictor, Prefetch, PrefetchOptions, PrefetchReplay, ReplayConfig, Semantics,
    TimelineDevice, reference,
};
use common::cfg0 as cfg;
use common::spec::{Spec, check_expect, ids, list, n};
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
fn replay_both(view: &TraceView<'_>, cfg: &ReplayConfig, opts: &PrefetchOptions<'_>) -> PrefetchReplay {
    let keep = Keep::full(&view.shape());
    let fast = cachesim::replay_prefetch(view, &keep, cfg, opts).expect("valid");
    let slow = reference::prefetch::replay(view, &keep, cfg, opts).expect("valid");
    assert_eq!(fast.counts, slow.counts);
    fast
}

/// Replays the trace of `spec` with prefetch on both replayers and checks the figures named in
/// `expect` (the form of `common::spec`).
///
/// Settings: `E=`, `k=`, `cap=`, a policy name, and optionally `pf=PRED:B` (none: no prefetch),
/// `W=` (default 0), `seq` (sequential semantics), `reset` (reset at sequence starts),
/// `seqs=` (sequence start tokens), `la=` (lookahead rows, `;`-separated, comma-separated ids),
/// `dev=MB,MS,GBPS` (a timeline device: expert size, compute per token, bandwidth). The second
/// rows part is coact's calibration trace.
/// Figures: picks, hits, misses, loads (prefetch loads), useful, wasted, precision, coverage,
/// layer_misses, and with `dev=`: tok_s, stall_s (per token).
fn check_prefetch(spec: &str, expect: &str) {
    let mut s = Spec::parse(spec);
    let (experts, k, cap): (u32, u32, usize) = (s.need("E"), s.need("k"), s.need("cap"));
    let policy: Policy = s.word().unwrap_or_else(|| panic!("{spec}: a policy"));
    let mut config = ReplayConfig { warmup: s.num("W").unwrap_or(0), ..cfg(policy, cap) };
    if s.flag("seq") {
        config.semantics = Semantics::Sequential;
    }
    config.reset_at_sequence = s.flag("reset");
    let prefetch: Option<Prefetch> = s.take("pf").map(|p| p.parse().unwrap_or_else(|e| panic!("{spec}: {e}")));
    let seqs: Option<Vec<u64>> = s.take("seqs").map(|v| ids(&v).into_iter().map(u64::from).collect());
    let la: Option<Vec<Vec<u16>>> = s.take("la").map(|v| v.split(';').map(ids).collect());
    let dev = s.take("dev").map(|v| {
        let x: Vec<f64> = v.split(',').map(|x| x.parse().expect("a number")).collect();
        TimelineDevice { expert_mb: x[0], compute_ms: x[1], bandwidth_gbps: x[2] }
    });
    s.finish();
    let (row_ids, tokens, m) = s.ids();
    let meta = meta(experts, k, s.layers.len() as u32);
    let la_flat: Vec<u16> = la.iter().flatten().flatten().copied().collect();
    let mut parts = TraceParts { seq_offsets: seqs.as_deref(), ..parts(&row_ids) };
    if let Some(la) = &la {
        parts.lookahead_ids = Some(Lookahead { ids: &la_flat, width: la[0].len() });
    }
    let view = TraceView::new(&meta, tokens, m, parts).expect("a valid hand-built trace");
    let calib = s.second_ids();
    let table = calib.as_ref().map(|(c, ct, cm)| {
        let cv = TraceView::new(&meta, *ct, *cm, self::parts(c)).expect("a valid calibration trace");
        CoactTable::learn(&cv).expect("a validated calibration trace")
    });
    let opts = PrefetchOptions { prefetch, coact: table.as_ref(), timeline: dev };
    let r = replay_both(&view, &config, &opts);
    let c = &r.counts;
    let mut got = vec![
        ("picks", n(c.replay.picks)),
        ("hits", n(c.replay.hits)),
        ("misses", n(c.replay.misses)),
        ("loads", n(c.prefetch_loads)),
        ("useful", n(c.useful)),
        ("wasted", n(c.wasted)),
        ("precision", vec![c.precision()]),
        ("coverage", vec![c.coverage()]),
        ("layer_misses", list(&c.replay.layer_misses)),
    ];
    if let Some(t) = &r.timeline {
        got.extend([("tok_s", vec![t.tok_s]), ("stall_s", vec![t.stall_s_per_token])]);
    }
    check_expect(spec, expect, &got);
}

/// The hand-computed cases. Pick clocks are written @n.
///
/// 1, 2: prev_token, lru, cap 2, k 1, B 1, sequences at tokens 0 and 2; rows 0 1 | 1 0.
///   With `reset`: t0 nothing proposed, 0 misses. t1: 0 proposed, resident; 1 misses. t2: reset
///   (empty); 1 proposed and loaded; 1 hits: useful. t3: 1 resident; 0 misses.
///   Without it nothing is loaded (k-way keeps the previous token's experts resident) and t3
///   hits 0: hits 2, misses 2.
/// 3: prev_token, lfu, sequential, cap 2, k 2, B 2; rows [0,1] [0,1] [2,3] [2,0].
///   t0: 0@1 1@2 miss. t1: 0@3 1@4 hit (2 accesses each). t2: 2@5 misses, evicts 0 (2, @3);
///   3@6 misses, evicts 2 (1 access, the lowest; sequential protects nothing). t3: proposals
///   [2, 3]: 2 loaded@7 evicting 1 (3 is a proposal); demand 2@8 hits (useful), 0@9 misses and
///   evicts 3 (1 access). Picks 8, hits 3, misses 5, one prefetch load, useful.
/// 4: oracle, lru, cap 2, k 1, B 1; rows 0 1 2 0: plain lru misses all 4; the oracle loads each
///   ahead (4 loads, all useful), no demand miss.
/// 5-8: lookahead, lru, cap 2, k 1, B 1; rows 0 1 2, lookahead rows [1,2] [1,0] [3,1].
///   t0: 1 loaded@1; 0 misses@2. t1: 1 resident; hits@3 (useful). t2: 3 loaded@4 evicting 0
///   (@2); 2 misses@5 evicting 1 (@3). 3 is never used: wasted.
///   Timeline (L = 1, c = 10 ms, τ = 1 MB / 0.05 GB/s = 20 ms): t0 loads 1 on [0, 20], demand 0
///   on [20, 40], compute [40, 50]. t1 waits for 1's load (done at 20): compute [50, 60]. t2:
///   3's prefetch issued at 50 (t1's start) on [50, 70], demand 2 issued at 60 queues behind it
///   on [70, 90], compute [90, 100]. 3 tokens in 100 ms: 30 tok/s, stall (100 − 30) / 3 ms per
///   token. Plain lru misses all 3 (2 evicts 0): 3 · 30 ms, 33.3 tok/s: the wasted load delays
///   the demand load behind it. At W = 1 tokens 1 and 2 take 10 and 40 ms: 40 tok/s.
/// 9: coact, lru, cap 1, k 1, B 1, two layers. Calibration: layer 0 rows 0 0 1, layer 1 rows
///   2 2 0, so Q_1[0][2] = 2, Q_1[1][0] = 1. Replay: layer 0 rows 0 1 0 (nothing loaded, 3
///   misses), layer 1 rows 2 1 2. Layer 1: t0: 0 chosen below, 2 proposed and loaded, hit
///   (useful). t1: 1 below → 0 proposed, loaded evicting 2; 1 misses evicting 0 (wasted). t2:
///   0 below → 2 loaded evicting 1; hit (useful).
#[test]
fn hand_computed_prefetch() {
    let la = "la=1,2;1,0;3,1";
    let dev = "dev=1,10,0.05";
    let cases = [
        (
            "E=4 k=1 cap=2 lru pf=prev_token:1 seqs=0,2 reset | 0 1 1 0",
            "picks=4 hits=1 misses=3 loads=1 useful=1 wasted=0",
        ),
        ("E=4 k=1 cap=2 lru pf=prev_token:1 seqs=0,2 | 0 1 1 0", "picks=4 hits=2 misses=2 loads=0 useful=0 wasted=0"),
        (
            "E=4 k=2 cap=2 lfu seq pf=prev_token:2 | 0,1 0,1 2,3 2,0",
            "picks=8 hits=3 misses=5 loads=1 useful=1 wasted=0",
        ),
        ("E=4 k=1 cap=2 lru pf=oracle:1 | 0 1 2 0", "picks=4 hits=4 misses=0 loads=4 useful=4 precision=1 coverage=1"),
        (
            &format!("E=4 k=1 cap=2 lru pf=lookahead:1 {la} | 0 1 2"),
            "picks=3 hits=1 misses=2 loads=2 useful=1 wasted=1",
        ),
        (
            &format!("E=4 k=1 cap=2 lru pf=lookahead:1 {la} {dev} | 0 1 2"),
            "precision=0.5 coverage=0.3333333333333333 tok_s=30 stall_s=0.023333333333333334",
        ),
        (&format!("E=4 k=1 cap=2 lru {dev} | 0 1 2"), "misses=3 loads=0 tok_s=33.333333333333336"),
        (&format!("E=4 k=1 cap=2 lru W=1 pf=lookahead:1 {la} {dev} | 0 1 2"), "tok_s=40"),
        (
            "E=3 k=1 cap=1 lru pf=coact:1 | 0 1 0 / 2 1 2 | 0 0 1 / 2 2 0",
            "picks=6 hits=2 misses=4 loads=3 useful=2 wasted=1 layer_misses=3,1",
        ),
    ];
    for (spec, expect) in cases {
        check_prefetch(spec, expect);
    }
}

/// coact's table counts co-activations of adjacent layers: calibration layer 0 rows 0 0 1,
/// layer 1 rows 2 2 0 give Q_1[0][2] = 2, Q_1[1][0] = 1, Q_1[0][0] = 0.
#[test]
fn coact_table_counts_adjacent_layers() {
    let m = meta(3, 1, 2);
    let calib_ids = [0, 0, 1, 2, 2, 0];
    let calib = TraceView::new(&m, 3, 1, parts(&calib_ids)).expect("valid");
    let table = CoactTable::learn(&calib).expect("a validated calibration trace");
    assert_eq!((table.get(1, 0, 2), table.get(1, 1, 0), table.get(1, 0, 0)), (2, 1, 0));
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
    let pf = |predictor, budget| Some(Prefetch { predictor, budget });
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
