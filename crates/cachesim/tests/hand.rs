//! Hand-computed replays (derivations in the comments), checked on both replayers.

mod common;

use cachesim::{CacheSimError, Keep, Policy, ReplayConfig, ReplayCounts, Semantics, reference};
use common::spec::{Spec, check_expect, ids, list, n};
use common::{cfg0 as cfg, one_layer};
use trace_io::{OwnedParts, TraceData};

/// Replays on both replayers, asserts they agree, returns the counts.
fn check(trace: &TraceData, keep: Option<&[Vec<u16>]>, cfg: &ReplayConfig) -> ReplayCounts {
    let view = trace.view();
    let keep = match keep {
        Some(k) => Keep::from_layers(&view.shape(), k).expect("valid keep"),
        None => Keep::full(&view.shape()),
    };
    let fast = cachesim::replay(&view, &keep, cfg).expect("valid config");
    let slow = reference::replay(&view, &keep, cfg).expect("valid config");
    assert_eq!(fast, slow, "fast and reference disagree on {cfg:?}");
    assert_eq!(fast.hits + fast.misses, fast.picks);
    fast
}

/// Replays the one-layer trace of `spec` with every policy named in `expect` on both replayers
/// and checks each policy's misses and the figures named for all of them.
///
/// `spec` (the form of `common::spec`): settings `E=` experts, `k=`, `cap=`, and optionally
/// `W=` warmup (default 0), `N=`, `d=`, `j=`, `lambda=`, `keep=` (kept ids), `seq` (sequential
/// semantics), `seqs=` (sequence start tokens), `reset` (reset at sequence starts), `z=` (every
/// row's scores, comma-separated; default 0, -1, -2, ... by rank).
/// `expect`: `policy misses` pairs, and `name=value` figures every named policy must give:
/// tokens, picks, hits, forced, substituted, pruned, layer_misses, misses_per_token, hit_rate.
/// A new policy adds a column to the table below.
fn check_misses(spec: &str, expect: &str) {
    let mut s = Spec::parse(spec);
    let (experts, k): (usize, usize) = (s.need("E"), s.need("k"));
    let mut base = ReplayConfig { warmup: s.num("W").unwrap_or(0), ..cfg(Policy::Lru, s.need("cap")) };
    base.near_pick_n = s.num("N").unwrap_or(base.near_pick_n);
    base.decay = s.num("d").unwrap_or(base.decay);
    base.j = s.num("j").unwrap_or(base.j);
    base.lambda = s.num("lambda").unwrap_or(base.lambda);
    if s.flag("seq") {
        base.semantics = Semantics::Sequential;
    }
    base.reset_at_sequence = s.flag("reset");
    let keep = s.take("keep").map(|v| vec![ids(&v)]);
    let seqs: Option<Vec<u64>> = s.take("seqs").map(|v| ids(&v).into_iter().map(u64::from).collect());
    let (row_ids, tokens, m) = s.ids();
    let z: Vec<f32> = match s.take("z") {
        Some(v) => v.split(',').map(|x| x.parse().expect("a score")).collect(),
        None => (0..m).map(|r| -(r as f32)).collect(),
    };
    s.finish();
    let scores = z.repeat(tokens);
    let parts = OwnedParts { ids: row_ids, scores: Some(scores), seq_offsets: seqs, ..Default::default() };
    let trace = TraceData::new(common::meta(experts, k, 1), tokens, m, parts).expect("a valid hand-built trace");
    let (pairs, figures): (Vec<&str>, Vec<&str>) = expect.split_whitespace().partition(|w| !w.contains('='));
    let figures = figures.join(" ");
    for pair in pairs.chunks(2) {
        let policy: Policy = pair[0].parse().expect("a policy name");
        let misses: u64 = pair[1].parse().expect("a miss count");
        let c = check(&trace, keep.as_deref(), &ReplayConfig { policy, ..base.clone() });
        assert_eq!(c.misses, misses, "{policy} on {spec}");
        let got = [
            ("tokens", n(c.tokens)),
            ("picks", n(c.picks)),
            ("hits", n(c.hits)),
            ("forced", n(c.forced_misses)),
            ("substituted", n(c.substituted)),
            ("pruned", n(c.pruned_slots)),
            ("layer_misses", list(&c.layer_misses)),
            ("misses_per_token", vec![c.misses_per_token()]),
            ("hit_rate", vec![c.hit_rate()]),
        ];
        check_expect(&format!("{policy} on {spec}"), &figures, &got);
    }
}

/// Hand-computed replays, one case per row of the table; the derivations follow, each named by
/// the comment above its rows.
///
/// first trace, near_pick_ema (d = 0.99; m = 1, so inv_router's softmax is 1 and it equals
/// near_pick_ema; near_pick's last near token is the last access, so it equals lru):
/// t2 evicts 0 (s .99 < 1); t3 evicts 1 (.99 < 1); t4 2 hits; t5 evicts 0 (s0 1.9506 < s2
/// 1.9801); t6 evicts 2 (s2 1.960299 < s1 1.960596); t7 1 hits: misses t0..t3, t5, t6 = 6.
///
/// lru_fifo_lfu_belady_differ:
///   k = 1, cap 2, requests 0 1 2 0 2 1 0 1 (t0..t7). Pick clock = t + 1.
///   lru:  t0 0 miss [0]; t1 1 miss [0,1]; t2 2 miss, evict 0 (last t0) [1,2]; t3 0 miss, evict 1
///         (t1) [2,0]; t4 2 hit; t5 1 miss, evict 0 (t3 < t4) [2,1]; t6 0 miss, evict 2 (t4 < t5)
///         [1,0]; t7 1 hit.                                                           = 6 misses
///   fifo: t2 evicts 0 (inserted t0) [1,2]; t3 evicts 1 (t1) [2,0]; t4 hit; t5 evicts 2 (t2)
///         [0,1]; t6 hit; t7 hit.                                        misses t0..t3, t5 = 5
///   lfu:  t2: counts 0:1 1:1, tie -> older access 0 evicted [1,2]; t3: 1 (1, t1) vs 2 (1, t2)
///         -> evict 1 [2,0]; t4 2 hit (count 2); t5: evict 0 (count 1) [2,1]; t6: evict 1
///         (count 1 < 2) [2,0]; t7: evict 0 (count 1) -> miss.                       = 7 misses
///   belady: t2: next use 0 -> t3, 1 -> t5: evict 1 [0,2]; t3, t4 hit; t5: 0 -> t6, 2 -> never:
///         evict 2 [0,1]; t6, t7 hit.                                      misses t0..t2, t5 = 4
///   perfect_lfu (counts since t0, kept through evictions): t2: 0 (1, t0) vs 1 (1, t1) -> evict 0
///         [1,2]; t3: 0 back at count 2; 1 (1) vs 2 (1, t2) -> evict 1 [2,0]; t4 2 hit (2); t5: 1
///         back at 2; 2 (2, t4) vs 0 (2, t3) -> evict 0 [2,1]; t6: 0 back at 3; 2 (2, t4) vs 1
///         (2, t5) -> evict 2 [1,0]; t7 1 hit (lfu, counting from insertion, evicted 1 at t6).
///                                                                 misses t0..t3, t5, t6 = 6
///   lfru (clock c = t before token t's access, last = the clock after an access; ratio
///         f / (c - last + 1)): t2 (c 2): 0 1/2, 1 1/1 -> evict 0; t3 (c 3): 1 1/2, 2 1/1 ->
///         evict 1 [2,0]; t4 2 hit (f 2, last 5); t5 (c 5): 2 2/1, 0 1/2 -> evict 0 [2,1]; t6
///         (c 6): 2 2/2, 1 1/1, a tie -> the earlier insertion, 2 (t2; 1 came at t5) [1,0]; t7 1
///         hit.                                                    misses t0..t3, t5, t6 = 6
///
/// belady_counted_from_warmup_is_not_a_bound:
///   Belady is the offline optimum of all misses from token 0. Counted from W > 0 it is not a bound:
///   it may enter the window with a worse cache than an online policy, having saved misses before
///   W that are not counted. k = 1, cap 2, requests 0 0 1 2 1 0 (t0..t5).
///   belady: t0 0 miss [0]; t1 hit; t2 1 miss [0,1]; t3 2 miss, next use 0 -> t5, 1 -> t4: evict 0
///           [1,2]; t4 1 hit; t5 0 miss.                                 misses t0, t2, t3, t5 = 4
///   lfu:    t3: counts 0:2, 1:1: evict 1 [0,2]; t4 1 miss, evict 2 (count 1 < 2) [0,1]; t5 0 hit.
///                                                                       misses t0, t2, t3, t4 = 4
///   From W = 0 both have 4 (Belady <= lfu holds); from W = 5 Belady has 1 and lfu 0.
///
/// pruned_keep_forces_misses:
///   E = 4, k = 2, m = 3, keep {0, 1} (2 and 3 pruned), cap 2, lru.
///   t0 [0,1,2]: F = [0,1], chosen 0,1 (2 cold misses); first-k {0,1} all kept: no pruned slot,
///               no substitution.
///   t1 [2,3,0]: F = [0], n = 1: 1 forced miss; first-k {2,3} both pruned (2); chosen 0 is not
///               in {2,3}: 1 substituted; 0 hit.
///   t2 [3,1,2]: F = [1]: 1 forced; first-k {3,1}: 1 pruned; 1 is among them: 0 substituted; hit.
///   t3 [2,3,1]: F = [1]: 1 forced; 2 pruned; 1 substituted; hit.
///   Totals: picks 8, hits 3, misses 2 + 3 = 5, forced 3, pruned_slots 5, substituted 2.
///
/// near_pick_keeps_recent_candidates:
///   near_pick, N = 2, k = 1, m = 3, cap 3, E = 5.
///   t0 [0,1,4]: 0 miss [0];        credits 0 -> t0, 1 -> t0
///   t1 [1,2,4]: 1 miss [0,1];      credits 1 -> t1, 2 -> t1
///   t2 [2,0,4]: 2 miss [0,1,2];    credits 2 -> t2, 0 -> t2
///   t3 [3,4,1]: 3 miss, full. lru evicts 0 (oldest access). near_pick: 0 -> t2, 1 -> t1, 2 -> t2:
///               evicts 1.
///   t4 [0,4,1]: lru: 0 misses again (5 misses in all); near_pick: 0 hits (4 misses).
///   With N = 1 only the chosen expert is credited, which orders like lru: 5 misses.
///
/// near_pick_ema_depends_on_decay:
///   near_pick_ema, N = 2, k = 1, m = 3, cap 2, E = 5.
///   t0 [1,3,4]: 1 miss [1];   t1 [3,1,4]: 3 miss [1,3];   t2 [1,3,4]: 1 hit.
///   After t2 both 1 and 3 were credited at t0, t1, t2: s1 = s3 = d(d + 1) + 1 exactly.
///   t3 [0,2,4]: 0 miss; s tie -> lru: 3 (access t1) evicted [1,0]; credits 0, 2: s0 = 1,
///               s1 = d(d(d + 1) + 1).
///   t4 [2,4,0]: 2 miss; evict min(s0, s1). d = 0.9: s1 = 2.439 > 1 -> evict 0; d = 0.1:
///               s1 = 0.111 < 1 -> evict 1.
///   t5 [1,0,4]: d = 0.9: 1 hit (4 misses); d = 0.1: 1 miss (5 misses).
///   near_pick (last credit 1 -> t2, 0 -> t3) evicts 1 at t4 like lru: 5 misses.
///
/// sequential_differs_from_k_way:
///   k = 2, m = 2, cap 2, lru.
///   t0 [0,1]: 2 misses, cache {0 (clock 1), 1 (clock 2)}.
///   t1 [2,0]: k-way: 2 misses; 0 is protected (chosen for this token), so 1 is evicted; 0 hits.
///             3 misses.
///             sequential: 2 misses and evicts the lru 0; then 0 misses and evicts 1 (clock 2 <
///             2's clock 3). 4 misses.
///
/// cache_aware_routing_reduces_misses:
///   Cache-aware routing. k = 2, m = 3, j = 0, cap 2, E = 3, lru; every row has scores
///   [0, -1, -1.5], so δ = z(F[0]) - z(F[1]) = 1 and a cached expert gains λ.
///   t0 [0,1,2]: cache empty, chosen 0, 1: 2 misses.
///   t1 [0,2,1]: λ = 0: chosen 0, 2: 2 misses, evicts 1. λ > 0.5: 1 (cached) scores -1.5 + λ > -1:
///               chosen 0, 1, both hit, 1 substituted. λ = 0.5: tie at -1, rank decides: 2.
///   t2 [0,1,2]: λ = 0: 1 misses (evicts 2). λ > 0.5: hits.
///   t3 [0,2,1]: λ = 0: 2 misses. λ > 0.5: hits, 1 substituted.
///   misses: 5 for λ <= 0.5, 2 for λ > 0.5; never increasing in λ.
///
/// reset_at_sequence_empties_caches:
///   Sequence resets: rows 0 1 0 1 with a sequence start at t2, cap 2, lru: without reset
///   2 misses; with reset the cache is emptied at t2: 4 misses.
///
/// perfect_lfu_counts_survive_eviction (SEMANTICS.md §15.2):
///   k = 1, cap 2, E = 3, requests 0 0 1 1 1 2 0 2 0 (t0..t8).
///   perfect_lfu: t0 0 miss (count 1); t1 hit (2); t2 1 miss [0,1] (1); t3, t4 hits (1: 3); t5 2
///         miss: 0 (2) vs 1 (3) -> evict 0 [1,2] (2: 1); t6 0 miss, back at count 3: 1 (3, t4) vs
///         2 (1) -> evict 2 [1,0]; t7 2 miss (2: 2): 1 (3, t4) vs 0 (3, t6), equal counts -> the
///         older access, 1 [0,2]; t8 0 hit.                       misses t0, t2, t5, t6, t7 = 5
///   lfu:  the same to t6, where 0 comes back at count 1; t7: 1 (3) vs 0 (1) -> evict 0 [1,2];
///         t8 0 miss.                                                   misses t0, t2, t5..t8 = 6
///   lru:  t5 evicts 0 (t1) [1,2]; t6 0 evicts 1 (t4) [2,0]; t7, t8 hit.              = 4 misses
///   fifo: t5 evicts 0 (inserted t0) [1,2]; t6 evicts 1 (t2) [2,0]; t7, t8 hit.       = 4 misses
///   lfru (c = t before token t's access): t0 0 (f 1, last 1); t1 hit (f 2, last 2); t2 1 (f 1,
///         last 3, inserted 3); t3, t4 hits (f 3, last 5); t5 (c 5): 0 2/4, 1 3/1 -> evict 0;
///         2 (f 1, last 6); t6 (c 6): 1 3/2, 2 1/1 -> evict 2; 0 (f 1, last 7, inserted 7); t7
///         (c 7): 1 3/3, 0 1/1: a tie, the earlier insertion is evicted: 1 (inserted 3, not the
///         lowest id 0) [0,2]; t8 0 hit.                          misses t0, t2, t5, t6, t7 = 5
///   (With ties to the lowest id, lfru would evict 0 at t7 and miss at t8: 6.)
///   With W = 7 only t7, t8 count: the counts of the warmup tokens carry over: perfect_lfu 1
///   (t7), lfu 2.
///
/// lfru_ratio_decides (SEMANTICS.md §15.3):
///   k = 1, cap 2, E = 3, requests 0 0 0 1 2 1 2 (t0..t6).
///   lfru: t0..t2 0 (f 3, last 3); t3 1 (f 1, last 4, inserted 4); t4 2 miss (c 4): 0 3/2, 1
///         1/1 -> evict 1 (3/2 > 1 exactly; an integer quotient ties them at 1, and the tie would
///         evict the earlier insertion, 0); 2 (f 1, last 5); t5 1 miss (c 5): 0 3/3, 2 1/1, a
///         tie -> the earlier insertion, 0 [2,1]; t6 2 hit.               misses t0, t3..t5 = 4
///   lru:  t4 evicts 0 (t2) [1,2]; t5, t6 hit.                                        = 3 misses
///   lfu, perfect_lfu: t4 evicts 1 (1 < 3) [0,2]; t5 1 evicts 2 (1 < 3) [0,1]; t6 2 evicts 1.
///                                                                                  = 5 misses
///
/// perfect_lfu_resets_at_sequence_starts:
///   k = 1, cap 2, E = 3, requests 0 0 0 0 1 2 1 2 0, sequences from t0 and t2.
///   Without reset: t0 0 miss, t1..t3 hits (count 4); t4 1 miss [0,1]; t5 2 evicts 1 (1) [0,2];
///         t6 1 miss, back at 2: evicts 2 (1) [0,1]; t7 2 miss (2): 0 (4) vs 1 (2) -> evict 1
///         [0,2]; t8 0 hit.                                           misses t0, t4..t7 = 5
///   With reset at t2 the cache empties and every count restarts: t2 0 miss, t3 hit (count 2);
///         t4 1 miss; t5 2 evicts 1 [0,2]; t6 1 miss, back at 2: 0 (2, t3) vs 2 (1) -> evict 2
///         [0,1]; t7 2 miss, back at 2: 0 (2, t3) vs 1 (2, t6) -> the older access, 0 [1,2]; t8
///         0 miss (3): 1 (2, t6) vs 2 (2, t7) -> evict 1.     misses t0, t2, t4..t8 = 7
///   (Had the counts survived the reset, 0 would hold 4 at t7 and stay: 6.) lfu with reset: t7
///         evicts 1 (count 1 since its insertion at t6) [0,2], t8 hits: 6.
#[test]
fn hand_computed_misses() {
    let all = "tokens=8 picks=8 forced=0 substituted=0 pruned=0";
    let pruned = "tokens=4 picks=8 hits=3 forced=3 substituted=2 pruned=5 layer_misses=5";
    for (spec, expect) in [
        // first trace; lru_fifo_lfu_belady_differ
        (
            "E=3 k=1 cap=2 | 0 1 2 0 2 1 0 1",
            &*format!(
                "lru 6 fifo 5 lfu 7 belady 4 near_pick 6 near_pick_ema 6 inv_router 6 perfect_lfu 6 lfru 6 {all}"
            ),
        ),
        // (with k = 1 there is nothing to protect: sequential gives the same counts)
        ("E=3 k=1 cap=2 seq | 0 1 2 0 2 1 0 1", "lru 6 fifo 5 lfu 7 belady 4 perfect_lfu 6 lfru 6"),
        // (warmup 3: only t3..t7 count; lru misses at t3, t5, t6)
        ("E=3 k=1 cap=2 W=3 | 0 1 2 0 2 1 0 1", "lru 3 tokens=5 picks=5 hits=2 misses_per_token=0.6 hit_rate=0.4"),
        // (cap 3 >= E: only the 3 compulsory misses)
        (
            "E=3 k=1 cap=3 | 0 1 2 0 2 1 0 1",
            "lru 3 fifo 3 lfu 3 belady 3 near_pick 3 near_pick_ema 3 inv_router 3 perfect_lfu 3 lfru 3",
        ),
        // belady_counted_from_warmup_is_not_a_bound
        ("E=3 k=1 cap=2 | 0 0 1 2 1 0", "belady 4 lfu 4"),
        ("E=3 k=1 cap=2 W=5 | 0 0 1 2 1 0", "belady 1 lfu 0"),
        // pruned_keep_forces_misses (with the full keep set: t1 chosen 2, 3 (2 misses, evicting 0
        // then 1), t2 chosen 3 (hit), 1 (miss, evicts 2: 3 is protected), t3 chosen 2 (miss,
        // evicts 1: 3 is protected), 3 (hit): 6 misses)
        (
            "E=4 k=2 cap=2 keep=0,1 | 0,1,2 2,3,0 3,1,2 2,3,1",
            &*format!("lru 5 fifo 5 lfu 5 belady 5 near_pick 5 near_pick_ema 5 {pruned}"),
        ),
        ("E=4 k=2 cap=2 | 0,1,2 2,3,0 3,1,2 2,3,1", "lru 6 forced=0 substituted=0 pruned=0"),
        // near_pick_keeps_recent_candidates (pruning expert 0 out: F of t2 is [2,4], so 0 is never
        // credited at t2, as credits read F; 0 then is never chosen either: t0 1 miss; t1 1 hit;
        // t2 2 miss; t3 3 miss; t4 4 miss: 4 misses, no forced ones)
        ("E=5 k=1 cap=3 N=2 | 0,1,4 1,2,4 2,0,4 3,4,1 0,4,1", "lru 5 near_pick 4"),
        ("E=5 k=1 cap=3 N=1 | 0,1,4 1,2,4 2,0,4 3,4,1 0,4,1", "near_pick 5"),
        (
            "E=5 k=1 cap=3 N=2 keep=1,2,3,4 | 0,1,4 1,2,4 2,0,4 3,4,1 0,4,1",
            "near_pick 4 forced=0 substituted=2 pruned=2",
        ),
        // near_pick_ema_depends_on_decay
        ("E=5 k=1 cap=2 N=2 d=0.9 | 1,3,4 3,1,4 1,3,4 0,2,4 2,4,0 1,0,4", "near_pick_ema 4 near_pick 5 lru 5"),
        ("E=5 k=1 cap=2 N=2 d=0.1 | 1,3,4 3,1,4 1,3,4 0,2,4 2,4,0 1,0,4", "near_pick_ema 5"),
        // sequential_differs_from_k_way (belady looks ahead: at t1 it evicts 1, never used again)
        // (perfect_lfu and lfru as lfu: k-way evicts 1, 0 being protected; sequential evicts 0,
        // of the older access and, for lfru, the lower ratio 1/2 against 1's 1/1)
        ("E=3 k=2 cap=2 | 0,1 2,0", "lru 3 fifo 3 lfu 3 perfect_lfu 3 lfru 3 hits=1"),
        ("E=3 k=2 cap=2 seq | 0,1 2,0", "lru 4 fifo 4 lfu 4 perfect_lfu 4 lfru 4 hits=0"),
        ("E=3 k=2 cap=2 seq | 0,1 2,0", "belady 3"),
        // cache_aware_routing_reduces_misses (j = 3 boosts every candidate: the order is
        // unchanged, as with λ = 0)
        ("E=3 k=2 cap=2 j=0 z=0,-1,-1.5 lambda=0 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 5 substituted=0"),
        ("E=3 k=2 cap=2 j=0 z=0,-1,-1.5 lambda=0.3 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 5 substituted=0"),
        ("E=3 k=2 cap=2 j=0 z=0,-1,-1.5 lambda=0.5 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 5 substituted=0"),
        ("E=3 k=2 cap=2 j=0 z=0,-1,-1.5 lambda=0.6 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 2 substituted=2"),
        ("E=3 k=2 cap=2 j=0 z=0,-1,-1.5 lambda=1 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 2 substituted=2"),
        ("E=3 k=2 cap=2 j=3 z=0,-1,-1.5 lambda=1 | 0,1,2 0,2,1 0,1,2 0,2,1", "lru 5"),
        // reset_at_sequence_empties_caches
        ("E=2 k=1 cap=2 seqs=0,2 | 0 1 0 1", "lru 2"),
        (
            "E=2 k=1 cap=2 seqs=0,2 reset | 0 1 0 1",
            "lru 4 fifo 4 lfu 4 belady 4 near_pick 4 near_pick_ema 4 perfect_lfu 4 lfru 4",
        ),
        // perfect_lfu_counts_survive_eviction
        ("E=3 k=1 cap=2 | 0 0 1 1 1 2 0 2 0", "lru 4 fifo 4 lfu 6 perfect_lfu 5 lfru 5"),
        ("E=3 k=1 cap=2 W=7 | 0 0 1 1 1 2 0 2 0", "perfect_lfu 1 lfu 2 tokens=2"),
        // lfru_ratio_decides
        ("E=3 k=1 cap=2 | 0 0 0 1 2 1 2", "lru 3 fifo 3 lfu 5 perfect_lfu 5 lfru 4"),
        // perfect_lfu_resets_at_sequence_starts
        ("E=3 k=1 cap=2 seqs=0,2 | 0 0 0 0 1 2 1 2 0", "perfect_lfu 5"),
        ("E=3 k=1 cap=2 seqs=0,2 reset | 0 0 0 0 1 2 1 2 0", "perfect_lfu 7 lfu 6"),
    ] {
        check_misses(spec, expect);
    }
}

/// inv_router, k = 1, m = 3, cap 2, E = 5; scores are ln(p) with p summing to 1 per row, so the
/// softmax over the m candidates is p itself. d = 0.99.
/// t0 [0,1,2] p [.5,.25,.25]: 0 miss [0];   s0 = .5,  s1 = .25
/// t1 [1,0,2] p [.4,.35,.25]: 1 miss [0,1]; s0 = .99*.5 + .35 = .845, s1 = .99*.25 + .4 = .6475
/// t2 [3,0,4] p [.5,.4,.1]:   3 miss. lru evicts 0 (older access); inv_router evicts 1 (lower s).
/// t3 [0,3,4] p [.5,.3,.2]:   lru: 0 misses (4 misses); inv_router: 0 hits (3 misses).
#[test]
fn inv_router_keeps_probable_experts() {
    let rows: Vec<&[u16]> = vec![&[0, 1, 2], &[1, 0, 2], &[3, 0, 4], &[0, 3, 4]];
    let ln = |p: [f32; 3]| p.map(f32::ln);
    let s = [ln([0.5, 0.25, 0.25]), ln([0.4, 0.35, 0.25]), ln([0.5, 0.4, 0.1]), ln([0.5, 0.3, 0.2])];
    let scores: Vec<&[f32]> = s.iter().map(|r| r.as_slice()).collect();
    let trace = one_layer(5, 1, &rows, Some(&scores));
    assert_eq!(check(&trace, None, &cfg(Policy::Lru, 2)).misses, 4);
    assert_eq!(check(&trace, None, &cfg(Policy::InvRouter, 2)).misses, 3);
}

#[test]
fn bad_configurations_are_refused() {
    let rows: Vec<&[u16]> = vec![&[0, 1, 2], &[1, 2, 0]];
    let z: &[f32] = &[0.0, -1.0, -2.0];
    let with_scores = one_layer(4, 2, &rows, Some(&[z, z]));
    let without = one_layer(4, 2, &rows, None);
    let k2_rows: Vec<&[u16]> = vec![&[0, 1], &[1, 2]];
    let k2_z: &[f32] = &[0.0, -1.0];
    let k2 = one_layer(4, 2, &k2_rows, Some(&[k2_z, k2_z]));
    let run = |t: &TraceData, c: ReplayConfig| {
        let v = t.view();
        let fast = cachesim::replay(&v, &Keep::full(&v.shape()), &c).expect_err("must be refused");
        let slow = reference::replay(&v, &Keep::full(&v.shape()), &c).expect_err("must be refused");
        assert_eq!(fast, slow);
        fast
    };
    let e = run(&with_scores, cfg(Policy::Lru, 1));
    assert_eq!(e, CacheSimError::CapBelowKUsed { cap: 1, k_used: 2 });
    assert!(e.to_string().contains("use a cap of 2 or more"), "{e}");
    // Two tokens: a warmup of 2 would count nothing; 1 leaves one token counted.
    let e = run(&with_scores, ReplayConfig { warmup: 2, ..cfg(Policy::Lru, 2) });
    assert_eq!(e, CacheSimError::WarmupCoversTrace { warmup: 2, tokens: 2 });
    let v = with_scores.view();
    let counted = cachesim::replay(&v, &Keep::full(&v.shape()), &ReplayConfig { warmup: 1, ..cfg(Policy::Lru, 2) });
    assert_eq!(counted.expect("valid").tokens, 1);
    assert!(matches!(run(&with_scores, cfg(Policy::Lru, 0)), CacheSimError::InvalidParameter { name: "cap", .. }));
    assert_eq!(
        run(&with_scores, ReplayConfig { lambda: 0.1, ..cfg(Policy::Belady, 2) }),
        CacheSimError::OfflineWithLambda { policy: Policy::Belady, lambda: 0.1 }
    );
    assert_eq!(
        run(&with_scores, ReplayConfig { k_used: Some(4), ..cfg(Policy::Lru, 4) }),
        CacheSimError::KUsedAboveCandidates { k_used: 4, candidates: 3 }
    );
    assert!(matches!(
        run(&with_scores, ReplayConfig { k_used: Some(0), ..cfg(Policy::Lru, 4) }),
        CacheSimError::InvalidParameter { name: "k_used", .. }
    ));
    for lambda in [-0.1, f64::NAN, f64::INFINITY] {
        let e = run(&with_scores, ReplayConfig { lambda, ..cfg(Policy::Lru, 2) });
        assert!(matches!(e, CacheSimError::InvalidParameter { name: "lambda", .. }));
    }
    for decay in [0.0, -0.5, 1.5, f64::NAN, 1e-309] {
        let e = run(&with_scores, ReplayConfig { decay, ..cfg(Policy::NearPickEma, 2) });
        assert!(matches!(e, CacheSimError::InvalidParameter { name: "decay", .. }));
    }
    assert!(matches!(
        run(&without, ReplayConfig { lambda: 0.1, ..cfg(Policy::Lru, 2) }),
        CacheSimError::NeedsScores { .. }
    ));
    assert!(matches!(run(&without, cfg(Policy::InvRouter, 2)), CacheSimError::NeedsScores { .. }));
    assert_eq!(
        run(&k2, ReplayConfig { lambda: 0.1, ..cfg(Policy::Lru, 2) }),
        CacheSimError::NoRoomForRouting { k_used: 2, candidates: 2 }
    );
    // decay 1 and λ = 0 on a trace without scores are fine.
    let v = without.view();
    assert!(cachesim::replay(&v, &Keep::full(&v.shape()), &ReplayConfig { decay: 1.0, ..cfg(Policy::Lru, 2) }).is_ok());
}

#[test]
fn keep_sets_are_checked() {
    let rows: Vec<&[u16]> = vec![&[0], &[1]];
    let trace = one_layer(4, 1, &rows, None);
    let shape = trace.view().shape();
    assert_eq!(
        Keep::from_layers(&shape, &[vec![0], vec![1]]),
        Err(CacheSimError::KeepMismatch {
            expected_layers: 1,
            actual_layers: 2,
            expected_experts: 4,
            actual_experts: 4
        })
    );
    assert_eq!(
        Keep::from_layers(&shape, &[vec![0, 4]]),
        Err(CacheSimError::KeepIdOutOfRange { layer: 0, id: 4, num_experts: 4 })
    );
    let keep = Keep::from_layers(&shape, &[vec![3, 1, 1]]).expect("valid");
    assert!(keep.is_kept(0, 1) && keep.is_kept(0, 3) && !keep.is_kept(0, 0) && !keep.is_kept(0, 9));
    assert_eq!(keep.kept_count(0), 2);
    // A keep set of another trace's shape is refused by replay.
    let other = one_layer(5, 1, &rows, None);
    let e = cachesim::replay(&trace.view(), &Keep::full(&other.view().shape()), &cfg(Policy::Lru, 1));
    assert!(matches!(e, Err(CacheSimError::KeepMismatch { .. })));
}

#[test]
fn names_round_trip() {
    for p in Policy::ALL {
        assert_eq!(p.to_string().parse::<Policy>(), Ok(p));
        assert_eq!(serde_json::to_string(&p).expect("serializes"), format!("\"{p}\""));
    }
    let names: Vec<String> = Policy::ALL.iter().map(ToString::to_string).collect();
    let mut expected =
        vec!["lru", "fifo", "lfu", "belady", "near_pick", "near_pick_ema", "inv_router", "perfect_lfu", "lfru"];
    if cfg!(feature = "experimental-policy") {
        expected.push("lfu_fifo");
    }
    assert_eq!(names, expected);
    assert!("LRU".parse::<Policy>().is_err());
    for s in [Semantics::KWay, Semantics::Sequential] {
        assert_eq!(s.to_string().parse::<Semantics>(), Ok(s));
        assert_eq!(serde_json::to_string(&s).expect("serializes"), format!("\"{s}\""));
    }
    assert_eq!(Semantics::default(), Semantics::KWay);
    let c = ReplayConfig::new(Policy::Lru, 16);
    assert_eq!((c.k_used, c.lambda, c.warmup, c.decay, c.near_pick_n), (None, 0.0, 64, 0.99, 48));
    let counts = ReplayCounts { tokens: 2, picks: 4, hits: 1, misses: 3, layer_misses: vec![3], ..Default::default() };
    let json = serde_json::to_string(&counts).expect("serializes");
    assert_eq!(serde_json::from_str::<ReplayCounts>(&json).expect("parses"), counts);
    assert_eq!(ReplayCounts::default().hit_rate(), 0.0);
    assert_eq!(ReplayCounts::default().misses_per_token(), 0.0);
}
