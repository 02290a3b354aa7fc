//! Deployed replay (SEMANTICS.md §9–§11): hand-computed cases (one table), the deployed path against the
//! plain replayer where the spec says they agree, and against the plain reference of §9–§11
//! (`reference::deploy`) over a matrix of policies, pins, tier 2, served steps and re-batching on
//! seeded random traces.

mod common;

use cachesim::deploy::{DeployCounts, Deployment, Schedule, Tier2};
use cachesim::{CacheSimError, Keep, Policy, ReplayConfig, reference};
use common::spec::{Spec, check_expect, ids, list, n};
use common::{DEPLOY_SMALL as SMALL, cfg0, one_layer, random_keep, random_steps, synth, with_steps};
use trace_io::{TraceData, TraceView};

/// Both deployed replayers, asserted equal; the counts.
fn both(view: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment) -> DeployCounts {
    let fast = cachesim::deploy::replay(view, keep, cfg, dep).expect("valid deployment");
    let slow = reference::deploy::replay(view, keep, cfg, dep).expect("valid deployment");
    assert_eq!(fast, slow, "fast and reference disagree on {cfg:?}, {dep:?}");
    fast
}

fn pins(view: &TraceView<'_>, layers: &[Vec<u16>]) -> Keep {
    Keep::from_layers(&view.shape(), layers).expect("valid pin map")
}

/// Replays the one-layer trace of `spec` deployed on both replayers and checks the figures
/// named in `expect` (the form of `common::spec`).
///
/// Settings: `E=`, `k=`, `cap=`, a policy name, and optionally `W=` (default 0), `pins=` (pinned
/// ids), `t2=POLICY:CAP`, `served` with `steps=` (step start rows), `batch=B` with `seqs=`
/// (sequence start tokens).
/// Figures: picks, hits, misses, pinned_hits, t2_hits, storage_reads, steps, rows, tokens,
/// loads_per_step, layer_pins.
fn check_deploy(spec: &str, expect: &str) {
    let mut s = Spec::parse(spec);
    let (experts, k, cap): (usize, usize, usize) = (s.need("E"), s.need("k"), s.need("cap"));
    let policy: Policy = s.word().unwrap_or_else(|| panic!("{spec}: a policy"));
    let cfg = ReplayConfig { warmup: s.num("W").unwrap_or(0), ..cfg0(policy, cap) };
    let pinned = s.take("pins").map(|v| vec![ids(&v)]);
    let tier2: Option<Tier2> = s.take("t2").map(|v| v.parse().unwrap_or_else(|e| panic!("{spec}: {e}")));
    let schedule = match (s.flag("served"), s.num("batch")) {
        (true, None) => Schedule::Served,
        (false, Some(b)) => Schedule::Rebatch(b),
        (false, None) => Schedule::PerToken,
        (true, Some(_)) => panic!("{spec}: served or batch="),
    };
    let offsets = |v: String| ids(&v).into_iter().map(u64::from).collect::<Vec<u64>>();
    let (step_offsets, seq_offsets) = (s.take("steps").map(offsets), s.take("seqs").map(offsets));
    s.finish();
    let (row_ids, tokens, m) = s.ids();
    assert_eq!(s.layers.len(), 1, "{spec}: one layer");
    let parts = trace_io::OwnedParts { ids: row_ids, step_offsets, seq_offsets, ..Default::default() };
    let trace = TraceData::new(common::meta(experts, k, 1), tokens, m, parts).expect("a valid hand-built trace");
    let view = trace.view();
    let dep = Deployment { pins: pinned.map(|p| pins(&view, &p)), tier2, schedule };
    let c = both(&view, &Keep::full(&view.shape()), &cfg, &dep);
    let layer_pins: Vec<u64> = c.layer_pins.iter().map(|&p| p as u64).collect();
    let got = [
        ("picks", n(c.counts.picks)),
        ("hits", n(c.counts.hits)),
        ("misses", n(c.counts.misses)),
        ("pinned_hits", n(c.pinned_hits)),
        ("t2_hits", n(c.t2_hits)),
        ("storage_reads", n(c.storage_reads)),
        ("steps", n(c.steps)),
        ("rows", n(c.rows)),
        ("tokens", n(c.counts.tokens)),
        ("loads_per_step", vec![c.loads_per_step()]),
        ("layer_pins", list(&layer_pins)),
    ];
    check_expect(spec, expect, &got);
}

/// The hand-computed deployments (W = 0 unless given).
///
/// Pins, k = 1, E = 4, requests 0 1 1 0 with 0 pinned: cap 1: 0 pinned hit, 1 miss, 1 hit, 0
///   pinned hit. cap 0: no cache, 1 misses twice. cap 0 without pins: pure streaming, every
///   pick a miss. Pinned experts never take a slot: requests 0 1 0 1 with 0 pinned, fifo cap
///   1: 1 misses once and then hits.
/// Tier 2, k = 1, tier 1 lru cap 1 over tier 2 cap 2, requests 0 1 0 2 1. Tier 1 holds one
///   expert and misses every request (5). Tier 2 sees 0 1 0 2 1. lru: 0 miss, 1 miss, 0 hit,
///   2 miss (evicts 1, older than 0's access), 1 miss: 1 hit, 4 reads. fifo: 2 evicts 0
///   (inserted first), then 1 hits: 2 hits. lfu: at 2, counts 0:2, 1:1: evicts 1; then 1
///   misses: 1 hit. belady: at 2, next uses 0: never, 1: step 4: evicts 0; 1 hits: 2 hits.
/// Served, E = 4, k = 2, lru cap 2, steps of rows [0,1] [1,2] | [1,3] | [3,1]. Step 0: U = 1
///   (2 rows), 0, 2. 1 miss, 0 miss, 2 miss with every cached expert in U: evict the processed
///   one of lowest priority, 1 (accessed first): cache {0, 2}. Step 1: 1 miss evicts 0 (older
///   than 2), 3 miss evicts 2: {1, 3}. Step 2: two hits. With 1 pinned: step 0: 1 pinned hit,
///   0 miss, 2 miss: {0, 2}; step 1: 1 hit, 3 miss evicts 0; step 2: hits. The warmup counts
///   whole steps: W = 1 skips step 0 only (it starts at 0), W = 2 also, W = 3 steps 0 and 1.
/// Re-batching, sequences [0, 1], [2], [3]; k = 1, tokens 0 1 2 3 request 0 1 0 1 (E = 4); lru
///   cap 1. B = 2: step 0 = tokens [0, 2] (U = {0}), step 1 = tokens [1, 3] (U = {1}; slot 1's
///   sequence ended at step 0, so it takes [3] at step 1): 2 misses, 2 steps, 4 rows. B = 1 is
///   trace order: 0 1 0 1 at cap 1: 4 misses, as plain replay.
/// perfect_lfu and lfru at tier 2, the same stream 0 1 0 2 1. perfect_lfu: at 2, counts 0:2, 1:1:
///   evicts 1; 1 comes back at count 2 and evicts 2 (count 1 < 0's 2): 1 hit (0's). lfru (clock c before each access): 0
///   (f 1, last 1), 1 (f 1, last 2), 0 hit (f 2, last 3); 2 at c 3: 0 2/1, 1 1/2: evicts 1; 1 at
///   c 4: 0 2/2, 2 1/1, a tie: the earlier insertion, 0: 1 hit.
/// A pinned hit changes no policy state (SEMANTICS.md §15.2), k = 1, E = 4, cap 2, 3 pinned,
///   requests 0 0 1 3 2 1. lfru: 0 (f 1, last 1), hit (f 2, last 2); 1 (f 1, last 3); 3 pinned:
///   the clock stays at 3; 2 at c 3: 0 2/2, 1 1/1, a tie: the earlier insertion, 0, is evicted;
///   1 hits: 3 misses. (Had the pinned hit ticked the clock, c 4: 0 2/3 > 1 1/2 would evict 1,
///   which then misses: 4.) perfect_lfu: 2 evicts 1 (count 1 < 2), which misses: 4 misses (the
///   pinned expert never enters the cache, so its count could not matter).
#[test]
fn hand_computed_deployments() {
    let served = "E=4 k=2 cap=2 lru served steps=0,2,3";
    let served_rows = "0,1 1,2 1,3 3,1";
    let cases = [
        ("E=4 k=1 cap=1 lru pins=0 | 0 1 1 0", "hits=3 misses=1 pinned_hits=2 layer_pins=1 storage_reads=1"),
        ("E=4 k=1 cap=0 lru pins=0 | 0 1 1 0", "hits=2 misses=2 pinned_hits=2 layer_pins=1 storage_reads=2"),
        ("E=4 k=1 cap=0 lru | 0 1 1 0", "hits=0 misses=4 pinned_hits=0 layer_pins=0"),
        ("E=4 k=1 cap=1 fifo pins=0 | 0 1 0 1", "hits=3 misses=1 pinned_hits=2"),
        ("E=4 k=1 cap=1 lru t2=lru:2 | 0 1 0 2 1", "misses=5 t2_hits=1 storage_reads=4"),
        ("E=4 k=1 cap=1 lru t2=fifo:2 | 0 1 0 2 1", "misses=5 t2_hits=2 storage_reads=3"),
        ("E=4 k=1 cap=1 lru t2=lfu:2 | 0 1 0 2 1", "misses=5 t2_hits=1 storage_reads=4"),
        ("E=4 k=1 cap=1 lru t2=belady:2 | 0 1 0 2 1", "misses=5 t2_hits=2 storage_reads=3"),
        ("E=4 k=1 cap=1 lru t2=perfect_lfu:2 | 0 1 0 2 1", "misses=5 t2_hits=1 storage_reads=4"),
        ("E=4 k=1 cap=1 lru t2=lfru:2 | 0 1 0 2 1", "misses=5 t2_hits=1 storage_reads=4"),
        ("E=4 k=1 cap=2 lfru pins=3 | 0 0 1 3 2 1", "hits=3 misses=3 pinned_hits=1"),
        ("E=4 k=1 cap=2 perfect_lfu pins=3 | 0 0 1 3 2 1", "hits=2 misses=4 pinned_hits=1"),
        (
            &format!("{served} | {served_rows}"),
            "picks=8 hits=2 misses=5 steps=3 rows=4 tokens=4 loads_per_step=1.6666666666666667",
        ),
        (&format!("{served} pins=1 | {served_rows}"), "hits=4 misses=3 pinned_hits=3"),
        (&format!("{served} W=1 | {served_rows}"), "steps=2"),
        (&format!("{served} W=2 | {served_rows}"), "steps=2"),
        (&format!("{served} W=3 | {served_rows}"), "steps=1"),
        ("E=4 k=1 cap=1 lru batch=2 seqs=0,2,3 | 0 1 0 1", "steps=2 rows=4 hits=0 misses=2"),
        ("E=4 k=1 cap=1 lru batch=1 seqs=0,2,3 | 0 1 0 1", "steps=4 rows=4 hits=0 misses=4"),
    ];
    for (spec, expect) in cases {
        check_deploy(spec, expect);
    }
}

#[test]
fn pin_outside_keep_is_refused_naming_layer_and_expert() {
    let trace = one_layer(4, 1, &[&[1], &[2]], None);
    let view = trace.view();
    let keep = Keep::from_layers(&view.shape(), &[vec![1, 2, 3]]).expect("valid keep");
    let dep = Deployment { pins: Some(pins(&view, &[vec![2, 0]])), ..Deployment::default() };
    let err = cachesim::deploy::replay(&view, &keep, &cfg0(Policy::Lru, 1), &dep).expect_err("pin 0 not kept");
    assert_eq!(err, CacheSimError::PinNotKept { layer: 0, expert: 0 });
    assert!(err.to_string().contains("expert 0 of layer index 0"), "{err}");
}

#[test]
fn unsupported_combinations_are_refused_with_the_reason() {
    let trace = one_layer(4, 1, &[&[1], &[2]], Some(&[&[0.0], &[0.0]]));
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let check = |cfg: ReplayConfig, dep: Deployment, needle: &str| {
        let err = cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect_err(needle).to_string();
        assert!(err.contains(needle), "{err}");
        let err = reference::deploy::replay(&view, &keep, &cfg, &dep).expect_err(needle).to_string();
        assert!(err.contains(needle), "{err}");
    };
    let t2 = |policy, cap| Deployment { tier2: Some(Tier2 { policy, cap }), ..Deployment::default() };
    let tier2s = if cfg!(feature = "experimental-policy") {
        "lru, fifo, lfu, belady, perfect_lfu, lfru or lfu_fifo"
    } else {
        "lru, fifo, lfu, belady, perfect_lfu or lfru"
    };
    check(cfg0(Policy::Lru, 1), t2(Policy::InvRouter, 2), &format!("tier 2 takes {tier2s}"));
    check(cfg0(Policy::Lru, 1), t2(Policy::NearPick, 2), "credit policies");
    check(cfg0(Policy::Lru, 1), t2(Policy::Lru, 0), "tier2 cap");
    let served = Deployment { schedule: Schedule::Served, ..Deployment::default() };
    check(cfg0(Policy::Lru, 1), served, "no step_offsets");
    let batch = Deployment { schedule: Schedule::Rebatch(2), ..Deployment::default() };
    check(cfg0(Policy::Lru, 1), batch, "no seq_offsets");
    let zero = Deployment { schedule: Schedule::Rebatch(0), ..Deployment::default() };
    check(cfg0(Policy::Lru, 1), zero, "batch");
    let seq = ReplayConfig { semantics: cachesim::Semantics::Sequential, ..cfg0(Policy::Lru, 1) };
    check(seq, Deployment::default(), "k-way only");
    let reset = ReplayConfig { reset_at_sequence: true, ..cfg0(Policy::Lru, 1) };
    check(reset, Deployment::default(), "reset");
    // §5's checks still apply: a cap between 0 and k_used, belady with λ > 0.
    let two = one_layer(4, 2, &[&[1, 2], &[2, 3]], None);
    let v2 = two.view();
    let err = cachesim::deploy::replay(&v2, &Keep::full(&v2.shape()), &cfg0(Policy::Lru, 1), &Deployment::default());
    assert_eq!(err, Err(CacheSimError::CapBelowKUsed { cap: 1, k_used: 2 }));
    let bel = ReplayConfig { lambda: 0.1, ..cfg0(Policy::Belady, 1) };
    check(bel, Deployment::default(), "belady needs lambda = 0");
}

fn lambdas(policy: Policy) -> &'static [f64] {
    if policy.facts().allows_lambda() { &[0.0, 0.09] } else { &[0.0] }
}

/// Per token with one tier and no pins, the deployed path gives the plain replayer's counts;
/// so do served replay with one row per step and re-batching with B = 1.
#[test]
fn plain_deployments_equal_plain_replay() {
    for seed in [1, 2] {
        let trace = synth(seed, SMALL);
        let tokens = trace.view().shape().tokens;
        let trace = with_steps(trace, (0..tokens as u64).collect());
        let view = trace.view();
        let shape = view.shape();
        let pruned = Keep::from_layers(&shape, &random_keep(seed, 2, 12, 0.4, 2)).expect("valid keep");
        for keep in [Keep::full(&shape), pruned] {
            for policy in Policy::ALL {
                for &lambda in lambdas(policy) {
                    let cfg = ReplayConfig { lambda, warmup: 10, ..ReplayConfig::new(policy, 4) };
                    let plain = cachesim::replay(&view, &keep, &cfg).expect("valid");
                    for schedule in [Schedule::PerToken, Schedule::Served, Schedule::Rebatch(1)] {
                        let dep = Deployment { schedule, ..Deployment::default() };
                        let c = both(&view, &keep, &cfg, &dep);
                        assert_eq!(c.counts, plain, "{schedule:?}, {cfg:?}");
                        assert_eq!((c.steps, c.rows), (plain.tokens, plain.tokens));
                        assert_eq!(
                            (c.pinned_hits, c.t2_hits, c.storage_reads),
                            (0, 0, plain.misses - plain.forced_misses)
                        );
                    }
                }
            }
        }
    }
}

/// Every policy with pins, cap 0, tier 2 (each tier-2 policy), served steps of up to 12 rows
/// (whose union often exceeds the cap) and re-batching: fast = reference.
#[test]
fn deployed_matrix_fast_equals_reference() {
    let mut union_over_cap = false;
    let mut runs = 0;
    for seed in [3, 4] {
        let trace = synth(seed, SMALL);
        let tokens = trace.view().shape().tokens;
        let trace = with_steps(trace, random_steps(seed, tokens, 12));
        let view = trace.view();
        let shape = view.shape();
        let keep_ids = random_keep(seed, 2, 12, 0.6, 5);
        let keep = Keep::from_layers(&shape, &keep_ids).expect("valid keep");
        // Pins: the first 2 kept experts of layer 0, 1 of layer 1 (per-layer sizes).
        let pin = Keep::from_layers(&shape, &[keep_ids[0][..2].to_vec(), keep_ids[1][..1].to_vec()]).expect("pins");
        // The policies that may serve as tier 2, from their facts (lru, fifo, lfu, belady).
        let tier2_policies: Vec<Policy> = Policy::ALL.into_iter().filter(|p| p.facts().may_be_tier2()).collect();
        assert!(!tier2_policies.is_empty());
        for policy in Policy::ALL {
            for &lambda in lambdas(policy) {
                for cap in [0, 3, 5] {
                    let cfg = ReplayConfig { lambda, warmup: 7, ..ReplayConfig::new(policy, cap) };
                    for schedule in [Schedule::PerToken, Schedule::Served, Schedule::Rebatch(3)] {
                        for pinned in [None, Some(pin.clone())] {
                            for tier2 in
                                [None, Some(Tier2 { policy: tier2_policies[runs % tier2_policies.len()], cap: 4 })]
                            {
                                let dep = Deployment { pins: pinned.clone(), tier2, schedule };
                                let c = both(&view, &keep, &cfg, &dep);
                                if let Some(t2) = tier2 {
                                    // Every tier-1 miss that is not forced goes to tier 2.
                                    assert_eq!(
                                        c.t2_hits + c.storage_reads,
                                        c.counts.misses - c.counts.forced_misses,
                                        "{t2:?}"
                                    );
                                }
                                if schedule == Schedule::Served && cap > 0 && c.counts.picks > 0 {
                                    union_over_cap |= c.counts.hits + c.counts.misses < c.counts.picks;
                                }
                                runs += 1;
                            }
                        }
                    }
                }
            }
        }
        // Belady at both tiers bounds lru at both tiers.
        for schedule in [Schedule::PerToken, Schedule::Served] {
            let t2 = |p| Some(Tier2 { policy: p, cap: 4 });
            let opt = both(
                &view,
                &keep,
                &cfg0(Policy::Belady, 3),
                &Deployment { tier2: t2(Policy::Belady), schedule, ..Default::default() },
            );
            let lru = both(
                &view,
                &keep,
                &cfg0(Policy::Lru, 3),
                &Deployment { tier2: t2(Policy::Lru), schedule, ..Default::default() },
            );
            assert!(opt.counts.misses <= lru.counts.misses);
        }
    }
    assert!(union_over_cap, "no served step shared a load");
    assert!(runs > 500);
}

/// The one-pass LRU curve of the unpinned stream equals a deployed replay with the pins at every
/// cap from k_used to E.
#[test]
fn pinned_lru_curve_equals_deployed_replay_at_every_cap() {
    use cachesim::mrc::{CurveConfig, lru_curve_pinned};
    let trace = synth(9, SMALL);
    let view = trace.view();
    let shape = view.shape();
    let keep_ids = random_keep(9, 2, 12, 0.6, 5);
    for keep in [Keep::full(&shape), Keep::from_layers(&shape, &keep_ids).expect("valid keep")] {
        let pin = Keep::from_layers(&shape, &[keep_ids[0][..2].to_vec(), keep_ids[1][..3].to_vec()]).expect("pins");
        for k_used in [3, 2] {
            let cc = CurveConfig { k_used: Some(k_used), warmup: 11, ..CurveConfig::default() };
            let curve = lru_curve_pinned(&view, &keep, Some(&pin), &cc).expect("valid");
            let dep = Deployment { pins: Some(pin.clone()), ..Deployment::default() };
            for cap in k_used..=12 {
                let cfg = ReplayConfig { k_used: Some(k_used), warmup: 11, ..ReplayConfig::new(Policy::Lru, cap) };
                let c = both(&view, &keep, &cfg, &dep);
                for l in 0..2 {
                    assert_eq!(curve.layer_misses(l, cap), c.counts.layer_misses[l], "cap {cap}, layer {l}");
                }
            }
        }
    }
    // Sequential semantics has no pinned curve here.
    let cc = CurveConfig { semantics: cachesim::Semantics::Sequential, ..CurveConfig::default() };
    let pin = Keep::from_layers(&shape, &[vec![0], vec![0]]).expect("pins");
    assert!(lru_curve_pinned(&view, &Keep::full(&shape), Some(&pin), &cc).is_err());
}

/// The policies whose keys change outside accesses (the level's heap, issue #40) on a longer
/// trace, with decays at which the lazy scores rescale often (M > 1e100 after 67 steps at
/// d = 0.03, 333 at d = 0.5) and underflow into ties: fast = reference, with pins, served steps
/// and re-batching, at caps from k_used to past E's half.
#[test]
fn heap_policies_with_rescales_fast_equal_reference() {
    let s = common::Synth { tokens: 900, ..SMALL };
    let mut runs = 0;
    for seed in [5, 6] {
        let trace = synth(seed, s);
        let trace = with_steps(trace, random_steps(seed, s.tokens, 6));
        let view = trace.view();
        let shape = view.shape();
        let keep_ids = random_keep(seed, 2, 12, 0.8, 6);
        let keep = Keep::from_layers(&shape, &keep_ids).expect("valid keep");
        let pin = Keep::from_layers(&shape, &[keep_ids[0][..1].to_vec(), keep_ids[1][..2].to_vec()]).expect("pins");
        for policy in [Policy::Belady, Policy::NearPick, Policy::NearPickEma, Policy::InvRouter] {
            for decay in [0.99, 0.5, 0.03] {
                for cap in [3, 4, 7] {
                    let cfg = ReplayConfig { decay, near_pick_n: 2, warmup: 5, ..ReplayConfig::new(policy, cap) };
                    for schedule in [Schedule::PerToken, Schedule::Served, Schedule::Rebatch(4)] {
                        for pinned in [None, Some(pin.clone())] {
                            let tier2 = (runs % 3 == 0).then_some(Tier2 { policy: Policy::Belady, cap: 5 });
                            both(&view, &keep, &cfg, &Deployment { pins: pinned, tier2, schedule });
                            runs += 1;
                        }
                    }
                }
            }
        }
    }
    assert_eq!(runs, 2 * 4 * 3 * 3 * 3 * 2);
}

/// `cachesim::Replay` picks the loop from what is asked (plain: per token, one tier, no pins,
/// cap > 0, transfers; hybrid: `exec` host; else deployed) and gives that loop's counts.
#[test]
fn a_replay_request_picks_its_loop() {
    use cachesim::hybrid::Exec;
    use cachesim::{Replay, ReplayPath, Replayed};
    let trace = synth(5, SMALL);
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pin = pins(&view, &vec![vec![0]; shape.layers]);
    let t2 = Some(Tier2 { policy: Policy::Lru, cap: 6 });
    let cases = [
        (4, Deployment::default(), Exec::Transfer, ReplayPath::Plain),
        (0, Deployment::default(), Exec::Transfer, ReplayPath::Deployed),
        (4, Deployment { pins: Some(pin.clone()), ..Deployment::default() }, Exec::Transfer, ReplayPath::Deployed),
        (4, Deployment { tier2: t2, ..Deployment::default() }, Exec::Transfer, ReplayPath::Deployed),
        (
            4,
            Deployment { schedule: Schedule::Rebatch(3), ..Deployment::default() },
            Exec::Transfer,
            ReplayPath::Deployed,
        ),
        (4, Deployment::default(), Exec::Host, ReplayPath::Hybrid),
        (0, Deployment { pins: Some(pin), ..Deployment::default() }, Exec::Host, ReplayPath::Hybrid),
    ];
    for (cap, dep, exec, path) in cases {
        let cfg = cfg0(Policy::Lfu, cap);
        let request = Replay { keep: &keep, config: &cfg, deployment: &dep, exec };
        assert_eq!(request.path(), path, "{cap} {dep:?} {exec}");
        let got = request.run(&view).expect("valid request");
        let deployed = cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect("valid");
        assert_eq!(got.deploy_counts(), deployed, "{path:?}");
        match (got, path) {
            (Replayed::Plain(c), ReplayPath::Plain) => {
                assert_eq!(c, cachesim::replay(&view, &keep, &cfg).expect("valid"));
                assert_eq!(request.reads(&shape), cachesim::replay_reads(&shape, &keep, &cfg));
            }
            (Replayed::Deployed(_), ReplayPath::Deployed) => {}
            (Replayed::Hybrid(c, events), ReplayPath::Hybrid) => {
                let direct = cachesim::hybrid::replay_hybrid(&view, &keep, &cfg, &dep, exec).expect("valid");
                assert_eq!((c, events), direct);
            }
            (got, path) => panic!("{path:?} gave {got:?}"),
        }
    }
}

/// `POLICY:CAP` parsing: the spellings, and errors that say what tier 2 takes (from the facts).
#[test]
fn tier2_parses_and_its_errors_name_what_tier2_takes() {
    let allowed: Vec<&str> = Policy::ALL.into_iter().filter(|p| p.facts().may_be_tier2()).map(Policy::as_str).collect();
    let (last, rest) = allowed.split_last().expect("a tier-2 policy");
    let takes = format!("tier 2 takes {} or {last}", rest.join(", "));
    let check = common::check_parse::<Tier2>;
    check("lru:32", Ok(Tier2 { policy: Policy::Lru, cap: 32 }));
    check("belady:6", Ok(Tier2 { policy: Policy::Belady, cap: 6 }));
    // A credit policy parses; validate() refuses it at tier 2 (Tier2Policy).
    check("inv_router:8", Ok(Tier2 { policy: Policy::InvRouter, cap: 8 }));
    check("foo:24", Err(&format!("unknown policy \"foo\"; {takes}")));
    check("lru", Err("expected POLICY:CAP"));
    check("lru:x", Err("\"x\" is not a whole number of experts"));
    assert_eq!(Tier2::allowed_policies(), takes.trim_start_matches("tier 2 takes "));
}
