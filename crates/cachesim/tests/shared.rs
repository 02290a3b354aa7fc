//! One cache shared by every layer (SEMANTICS.md §15.1): hand-computed cases on both replayers,
//! the fast replayer against the plain reference on synthetic traces, the shared cache against
//! per-layer caches of the same memory, and one layer's shared cache against §5's and §9–§11's
//! caches (per token, pinned, served, re-batched).

mod common;

use cachesim::deploy::{Deployment, Schedule};
use cachesim::shared_cache::{self, SharedCache, SharedCounts};
use cachesim::{CacheSimError, Keep, Policy, ReplayConfig, Semantics, reference};
use common::spec::{Spec, check_expect, list, n};
use common::{DEPLOY_SMALL, Synth, cfg0, random_keep, synth};
use trace_io::{OwnedParts, TraceData, TraceView};

/// Replays on both replayers, asserts they agree and the invariants hold, returns the counts.
fn both(view: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, shared: &SharedCache) -> SharedCounts {
    let fast = shared_cache::replay(view, keep, cfg, shared).expect("a valid shared replay");
    let slow = reference::shared::replay(view, keep, cfg, shared).expect("a valid shared replay");
    assert_eq!(fast, slow, "fast and reference disagree on {cfg:?}, C = {}", shared.cap);
    let c = &fast.deploy.counts;
    if shared.schedule == Schedule::PerToken {
        assert_eq!(c.hits + c.misses, c.picks, "{cfg:?}");
    }
    assert!(fast.layer_slots_end.iter().sum::<usize>() <= shared.cap);
    assert!(fast.layer_slot_tokens.iter().all(|&s| s <= shared.cap as u64 * c.tokens));
    fast
}

/// Pins as `l.e` pairs, comma-separated (`0.0,1.2`).
fn pin_pairs(text: &str, layers: usize) -> Vec<Vec<u16>> {
    let mut out = vec![Vec::new(); layers];
    for pair in text.split(',') {
        let (l, e) = pair.split_once('.').unwrap_or_else(|| panic!("{pair}: l.e"));
        out[l.parse::<usize>().expect("a layer")].push(e.parse().expect("an expert"));
    }
    out
}

/// Replays the trace of `spec` through one shared cache with every policy named in `expect`.
///
/// `spec`: settings `E=`, `k=`, `C=` (the shared slots), optionally `W=` (default 0), `seq`
/// (sequential semantics), `pins=l.e,...`, `steps=` (served: the first row of each step); rows
/// of every layer (` / ` between layers).
/// `expect`: `policy misses` pairs, and figures every named policy must give: layer_misses,
/// hits, pinned_hits, slots_end (per layer), slot_tokens (per layer, Σ over counted tokens).
fn check_shared(spec: &str, expect: &str) {
    let mut s = Spec::parse(spec);
    let (experts, k, cap): (usize, usize, usize) = (s.need("E"), s.need("k"), s.need("C"));
    let mut base = ReplayConfig { warmup: s.num("W").unwrap_or(0), ..cfg0(Policy::Lru, cap.max(k)) };
    if s.flag("seq") {
        base.semantics = Semantics::Sequential;
    }
    let layers = s.layers.len();
    let pins = s.take("pins").map(|v| pin_pairs(&v, layers));
    let steps: Option<Vec<u64>> = s.take("steps").map(|v| common::spec::ids(&v).into_iter().map(u64::from).collect());
    let schedule = if steps.is_some() { Schedule::Served } else { Schedule::PerToken };
    s.finish();
    let (row_ids, tokens, m) = s.ids();
    let parts = OwnedParts { ids: row_ids, step_offsets: steps, ..Default::default() };
    let trace = TraceData::new(common::meta(experts, k, layers), tokens, m, parts).expect("a valid hand-built trace");
    let view = trace.view();
    let shape = view.shape();
    let pins = pins.map(|p| Keep::from_layers(&shape, &p).expect("valid pins"));
    let shared = SharedCache { cap, pins, schedule };
    let (pairs, figures): (Vec<&str>, Vec<&str>) = expect.split_whitespace().partition(|w| !w.contains('='));
    let figures = figures.join(" ");
    for pair in pairs.chunks(2) {
        let policy: Policy = pair[0].parse().expect("a policy name");
        let misses: u64 = pair[1].parse().expect("a miss count");
        let c = both(&view, &Keep::full(&shape), &ReplayConfig { policy, ..base.clone() }, &shared);
        assert_eq!(c.deploy.counts.misses, misses, "{policy} on {spec}");
        let slots_end: Vec<u64> = c.layer_slots_end.iter().map(|&x| x as u64).collect();
        let got = [
            ("layer_misses", list(&c.deploy.counts.layer_misses)),
            ("hits", n(c.deploy.counts.hits)),
            ("pinned_hits", n(c.deploy.pinned_hits)),
            ("slots_end", list(&slots_end)),
            ("slot_tokens", list(&c.layer_slot_tokens)),
        ];
        check_expect(&format!("{policy} on {spec}"), &figures, &got);
    }
}

/// Hand-computed shared replays; derivations below, each named by the comment above its rows.
///
/// cross-layer eviction: E = 4, k = 1, C = 2; layer 0 asks 0 0 0 0, layer 1 asks 1 2 3 1.
/// Visiting order t0 l0, t0 l1, t1 l0, ...; the pick clock counts every layer's picks.
///   fifo: t0 (0,0) in@1, (1,1) in@2; t1 (0,0) hit; (1,2) miss: the oldest insertion is layer 0's
///         (0,0)@1, evicted for layer 1 {(1,1)@2, (1,2)@4}; t2 (0,0) miss, evicts (1,1) {(1,2)@4,
///         (0,0)@5}; (1,3) miss evicts (1,2) {(0,0)@5, (1,3)@6}; t3 (0,0) hit; (1,1) miss evicts
///         (0,0)@5 {(1,3), (1,1)}. Layer misses 2, 4 = 6. Slots after each token (l0, l1):
///         (1,1) (0,2) (1,1) (0,2): Σ 2, 6; at the end 0, 2.
///   lru:  (0,0) is touched every token, so each layer-1 miss evicts the other layer-1 pair:
///         misses 1, 4 = 5; slots (1,1) after every token: Σ 4, 4.
///   lfu:  (0,0) counts 1, 2, 3, 4 against layer 1's 1: the same evictions as lru: 5.
///   perfect_lfu: (1,1) comes back at t3 with count 2, still below (0,0)'s 4, against (1,3)'s 1:
///         evicts (1,3): 5.
///   belady: positions p = 2t + l; (0,0) at 0, 2, 4, 6; (1,1) at 1, 7; (1,2) at 3; (1,3) at 5.
///         p3: (1,1) next 7 against (0,0) next 4: evict (1,1); p5: (1,2) never: evicted; p7: (1,3)
///         never: evicted. Misses 1, 4 = 5.
///
/// protected current layer: E = 5, k = 2, C = 3, lru; layer 0 asks [0,1] [0,1], layer 1 asks
/// [3,4] [2,4].
///   k-way: t0 (0,0)@1 (0,1)@2 (1,3)@3; (1,4) evicts (0,0)@1 {(0,1)@2, (1,3)@3, (1,4)@4}. t1 l0:
///         (0,0) miss, (0,1) protected: evicts (1,3)@3; (0,1) hit@6 {(1,4)@4, (0,0)@5, (0,1)@6}.
///         t1 l1: (1,2) miss; (1,4)@4 is the lowest but chosen at this (t, l): protected; the
///         victim is layer 0's (0,0)@5, which this very token used (earlier layers have run);
///         (1,4) hit. Misses l0 3 (0, 1, 0), l1 3 (3, 4, 2) = 6.
///   seq (nothing protected): t1 l0 (0,0) evicts (0,1)@2, which then misses and evicts (1,3)@3
///         {(1,4)@4, (0,0)@5, (0,1)@6}; t1 l1 (1,2) evicts (1,4)@4, which then misses and evicts
///         (0,0)@5. Misses l0 4, l1 4 = 8.
///
/// C = 0: nothing is cached; every unpinned pick misses. E = 4, k = 1; layer 0 asks 0 0 1, layer 1
/// asks 2 2 2; pin (0, 0): layer 0 two pinned hits and a miss, layer 1 three misses.
///
/// served steps (§11 with one cache): E = 4, k = 1, C = 2, lru, steps {t0, t1} and {t2}; layer 0
/// asks 0 1 0, layer 1 asks 2 2 3. Step 0 l0: U = [0, 1]: (0,0)@1, (0,1)@2; l1: U = [2] (two
/// rows, one load): evicts (0,0)@1. Step 1 l0: (0,0) evicts (0,1)@2; l1: (1,3) evicts (1,2)@3.
/// Misses per (step, pair): l0 3, l1 2 = 5.
/// |U| > C: one step of three rows, layer 0 asks 0 1 2, layer 1 asks 3 3 3, C = 2. l0: (0,0)@1,
/// (0,1)@2; (0,2) finds every cached pair in U: the victim is the lowest already processed,
/// (0,0)@1. l1: U = [3]: evicts (0,1)@2. Misses 3, 1; slots 1, 1 after the step of 3 rows: Σ 3, 3.
///
/// C > E: E = 2, C = 5 (above E and above L · E = 4): no eviction ever; misses are the 4 distinct
/// pairs, and every pair stays (slots 1, 1 after t0, then 2, 2: Σ 7, 7).
#[test]
fn hand_computed_shared() {
    let cross = "E=4 k=1 C=2 | 0 0 0 0 / 1 2 3 1";
    check_shared(cross, "fifo 6 layer_misses=2,4 slots_end=0,2 slot_tokens=2,6");
    check_shared(cross, "lru 5 layer_misses=1,4 slots_end=1,1 slot_tokens=4,4");
    check_shared(cross, "lfu 5 perfect_lfu 5 belady 5 layer_misses=1,4");

    check_shared("E=5 k=2 C=3 | 0,1 0,1 / 3,4 2,4", "lru 6 layer_misses=3,3 slots_end=1,2");
    check_shared("E=5 k=2 C=3 seq | 0,1 0,1 / 3,4 2,4", "lru 8 layer_misses=4,4");

    let zero = "E=4 k=1 C=0 pins=0.0 | 0 0 1 / 2 2 2";
    check_shared(zero, "lru 4 fifo 4 belady 4 layer_misses=1,3 hits=2 pinned_hits=2 slots_end=0,0 slot_tokens=0,0");
    check_shared("E=4 k=1 C=0 | 0 0 1 / 2 2 2", "lru 6 lfu 6 hits=0");

    check_shared("E=4 k=1 C=2 steps=0,2 | 0 1 0 / 2 2 3", "lru 5 layer_misses=3,2 slots_end=1,1");
    check_shared("E=4 k=1 C=2 steps=0 | 0 1 2 / 3 3 3", "lru 4 fifo 4 layer_misses=3,1 slots_end=1,1 slot_tokens=3,3");

    let above = "E=2 k=1 C=5 | 0 1 0 1 / 1 0 1 0";
    check_shared(above, "lru 4 fifo 4 lfu 4 perfect_lfu 4 belady 4 lfru 4 slots_end=2,2 slot_tokens=7,7");
}

/// Refusals: 0 < C < k_used, per-layer caps, a pin the keep set drops.
#[test]
fn shared_refusals() {
    let trace = synth(3, DEPLOY_SMALL);
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let cfg = cfg0(Policy::Lru, 3);
    let err = shared_cache::replay(&view, &keep, &cfg, &SharedCache { cap: 2, pins: None, ..SharedCache::default() })
        .unwrap_err();
    assert!(matches!(err, CacheSimError::CapBelowKUsed { cap: 2, k_used: 3 }), "{err}");
    let per_layer = ReplayConfig { layer_caps: Some(vec![3, 3]), ..cfg.clone() };
    let err =
        shared_cache::replay(&view, &keep, &per_layer, &SharedCache { cap: 6, pins: None, ..SharedCache::default() })
            .unwrap_err();
    assert!(matches!(err, CacheSimError::SharedUnsupported { what: "layer_caps", .. }), "{err}");
    let pruned = Keep::from_layers(&shape, &[vec![0, 1, 2, 3], (0..12).collect()]).expect("keep");
    let pins = Keep::from_layers(&shape, &[vec![5], vec![]]).expect("pins");
    let err =
        shared_cache::replay(&view, &pruned, &cfg, &SharedCache { cap: 6, pins: Some(pins), ..SharedCache::default() })
            .unwrap_err();
    assert!(matches!(err, CacheSimError::PinNotKept { layer: 0, expert: 5 }), "{err}");
}

const SMALL: Synth = Synth { layers: 3, tokens: 120, num_experts: 10, top_k: 2, candidates: 5, ..DEPLOY_SMALL };

/// The fast replayer equals the reference over every policy with a shared priority, caps from 0
/// to above L · E, λ 0 and > 0, full and pruned keep sets, sequential semantics, resets at
/// sequence starts, pins and a warmup.
#[test]
fn shared_differential() {
    let shared_policies: Vec<Policy> = Policy::ALL.iter().copied().filter(|&p| p.as_str() != "lfu_fifo").collect();
    for (seed, shape) in [(1, SMALL), (2, DEPLOY_SMALL)] {
        let trace = common::with_steps(synth(seed, shape), common::random_steps(seed, shape.tokens, 5));
        let view = trace.view();
        let s = view.shape();
        let k = s.top_k;
        let pruned = Keep::from_layers(&s, &random_keep(seed, s.layers, s.num_experts, 0.7, k + 1)).expect("keep");
        let pins: Vec<Vec<u16>> = (0..s.layers).map(|l| if l % 2 == 0 { vec![0] } else { vec![] }).collect();
        let pins = Keep::from_layers(&s, &pins).expect("pins");
        for &policy in &shared_policies {
            for cap in [0, k, k + 1, 7, 2 * s.num_experts, s.layers * s.num_experts + 3] {
                for variant in 0..9 {
                    let mut cfg = ReplayConfig { warmup: 10, ..cfg0(policy, cap.max(k)) };
                    let mut keep = Keep::full(&s);
                    let mut shared = SharedCache { cap, pins: None, ..SharedCache::default() };
                    match variant {
                        0 => {}
                        1 => keep = pruned.clone(),
                        2 if policy.facts().allows_lambda() => cfg.lambda = 0.1,
                        3 => cfg.semantics = Semantics::Sequential,
                        4 => cfg.reset_at_sequence = true,
                        5 => {
                            keep = if pruned.is_kept(0, 0) && pruned.is_kept(2, 0) { pruned.clone() } else { keep };
                            shared.pins = Some(pins.clone());
                        }
                        6 => shared.schedule = Schedule::Rebatch(3),
                        7 => shared.schedule = Schedule::Served,
                        8 if policy.facts().allows_lambda() => {
                            (shared.schedule, shared.pins, cfg.lambda) = (Schedule::Served, Some(pins.clone()), 0.1);
                        }
                        _ => continue,
                    }
                    both(&view, &keep, &cfg, &shared);
                }
            }
        }
    }
}

/// With one layer the shared cache is §5's cache of C experts (and §9's with pins): the counts
/// equal the plain and deployed replayers', for every policy.
#[test]
fn one_layer_shared_is_the_per_layer_cache() {
    let one = Synth { layers: 1, tokens: 300, sequences: 9, ..SMALL };
    let trace = common::with_steps(synth(7, one), common::random_steps(7, 300, 6));
    let view = trace.view();
    let s = view.shape();
    let keep = Keep::full(&s);
    for &policy in Policy::ALL.iter().filter(|p| p.as_str() != "lfu_fifo") {
        for cap in [2, 3, 6] {
            let cfg = ReplayConfig { warmup: 5, ..cfg0(policy, cap) };
            let shared = both(&view, &keep, &cfg, &SharedCache { cap, pins: None, ..SharedCache::default() });
            let plain = cachesim::replay(&view, &keep, &cfg).expect("plain");
            assert_eq!(shared.deploy.counts, plain, "{policy} cap {cap}");
            let pins = Keep::from_layers(&s, &[vec![1]]).expect("pins");
            let dep = Deployment { pins: Some(pins.clone()), ..Deployment::default() };
            let deployed = cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect("deployed");
            let shared =
                both(&view, &keep, &cfg, &SharedCache { cap, pins: Some(pins.clone()), ..SharedCache::default() });
            assert_eq!(shared.deploy, deployed, "{policy} cap {cap} pinned");
            for schedule in [Schedule::Served, Schedule::Rebatch(4)] {
                let dep = Deployment { pins: Some(pins.clone()), schedule, ..Deployment::default() };
                let deployed = cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect("deployed");
                let shared = both(&view, &keep, &cfg, &SharedCache { cap, pins: Some(pins.clone()), schedule });
                assert_eq!(shared.deploy, deployed, "{policy} cap {cap} {schedule:?}");
            }
        }
    }
}

/// A trace of `layers[l][t]` single picks (k = 1, m = 1).
fn k1(num_experts: usize, layers: &[Vec<u16>]) -> TraceData {
    let tokens = layers[0].len();
    let ids = layers.iter().flatten().copied().collect();
    let parts = OwnedParts { ids, ..Default::default() };
    TraceData::new(common::meta(num_experts, 1, layers.len()), tokens, 1, parts).expect("valid trace")
}

/// Misses of per-layer caches of `cap` and of one shared cache of L · cap.
fn per_layer_and_shared(trace: &TraceData, policy: Policy, cap: usize) -> (u64, u64) {
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let cfg = cfg0(policy, cap);
    let per_layer = cachesim::replay(&view, &keep, &cfg).expect("per layer").misses;
    let shared = SharedCache { cap: view.shape().layers * cap, pins: None, ..SharedCache::default() };
    (per_layer, both(&view, &keep, &cfg, &shared).deploy.counts.misses)
}

/// Where layers differ in reuse the shared cache wins: layer 0 cycles over 3 experts (a cap of 2
/// misses every pick) while layer 1 needs one; one cache of 4 slots gives layer 0 its 3. Where one
/// layer's bursts evict another's working set it loses: layer 0 alternates 0 and 1 (a cap of 2
/// holds them), layer 1 streams a new expert every token, and one fifo cache of 4 lets the
/// stream's insertions push layer 0's pairs out.
#[test]
fn shared_cache_wins_and_loses() {
    let tokens = 60;
    let cycling: Vec<u16> = (0..tokens).map(|t| (t % 3) as u16).collect();
    let steady = vec![9u16; tokens];
    let differ = k1(64, &[cycling, steady]);
    for policy in [Policy::Lru, Policy::Fifo, Policy::Lfu, Policy::Belady] {
        let (per_layer, shared) = per_layer_and_shared(&differ, policy, 2);
        assert!(shared < per_layer, "{policy}: shared {shared} should beat per-layer {per_layer}");
    }
    let (per_layer, shared) = per_layer_and_shared(&differ, Policy::Lru, 2);
    assert_eq!((per_layer, shared), (tokens as u64 + 1, 4));

    let alternating: Vec<u16> = (0..tokens).map(|t| (t % 2) as u16).collect();
    let stream: Vec<u16> = (0..tokens).map(|t| 2 + t as u16).collect();
    let burst = k1(64, &[alternating, stream]);
    let (per_layer, shared) = per_layer_and_shared(&burst, Policy::Fifo, 2);
    assert!(shared > per_layer, "fifo: shared {shared} should lose to per-layer {per_layer}");
    assert_eq!(per_layer, 2 + tokens as u64);
}

/// Belady on one shared cache of L · cap slots never misses more than on per-layer caps of cap,
/// counted from token 0: the per-layer split is one of the shared cache's allocations, and
/// Belady is optimal on one cache.
#[test]
fn shared_belady_bounds_per_layer_belady() {
    for seed in 0..4 {
        let trace = synth(seed, SMALL);
        for cap in [2, 3, 5] {
            let (per_layer, shared) = per_layer_and_shared(&trace, Policy::Belady, cap);
            assert!(shared <= per_layer, "seed {seed} cap {cap}: shared {shared} > per-layer {per_layer}");
        }
    }
}
