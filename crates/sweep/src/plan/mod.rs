//! Memory-budget planning: per-layer cache sizes (and the keep map) that minimize misses per token
//! within a budget of expert slots.
//!
//! Inputs are per-layer miss curves ([`cachesim::mrc::MissCurve`]) of each candidate variant on the
//! calibration trace. [`allocate`] solves, exactly, `min Σ_l misses_l(cap_l)` subject to
//! `Σ_l cap_l <= slots` and `min_cap <= cap_l <= max_cap`, by dynamic programming over layers
//! and budget (a multiple-choice knapsack): O(L · B · (max_cap − min_cap)) time, where B is the
//! number of slots beyond the minimum. A greedy allocation by marginal gain is exact only when
//! every curve is convex; real LRU curves are not always convex (the plan reports how many layers
//! are not), so the planner uses the dynamic program.
//!
//! [`search`] is the whole `moe-offload plan`: curves of every candidate variant, the allocation,
//! the uniform baseline, the choice and its verification by replay, behind a [`PlanRequest`].

pub mod hybrid;
pub mod llama;
mod pins;
mod quality;
mod search;

use cachesim::mrc::MissCurve;
pub use pins::{PinnedPlan, hot_count_list, search_pinned};
pub use quality::{Measured, QualityFloor, figure};
pub use search::{Candidate, Chosen, Evaluated, PlanOutcome, PlanRequest, miss_curve, search};

/// One layer allocation and its cost.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Allocation {
    /// Cache capacity of each layer, in experts.
    pub caps: Vec<usize>,
    /// Slots used: `Σ caps`.
    pub slots: usize,
    /// Misses summed over layers (from the curve).
    pub misses: u64,
}

/// The exact minimum-miss allocation of at most `slots` expert slots to the layers of `curve`,
/// or `None` when even `min_cap` per layer does not fit. Ties: the allocation found first by the
/// dynamic program (smaller caps in earlier layers), deterministic.
pub fn allocate(curve: &MissCurve, slots: usize) -> Option<Allocation> {
    let l_n = curve.layers.len();
    let (lo, hi) = (curve.min_cap, curve.max_cap);
    let base = lo.checked_mul(l_n)?;
    if slots < base {
        return None;
    }
    let extra_max = (hi - lo) * l_n;
    let budget = (slots - base).min(extra_max);
    // dp[b] = min misses over the layers so far using exactly b extra slots (u64::MAX = impossible).
    let mut dp = vec![u64::MAX; budget + 1];
    dp[0] = 0;
    let width = hi - lo;
    let mut choice = vec![0u16; l_n * (budget + 1)];
    for (l, layer) in curve.layers.iter().enumerate() {
        let mut next = vec![u64::MAX; budget + 1];
        for b in 0..=budget {
            let mut best = u64::MAX;
            let mut arg = 0usize;
            for x in 0..=width.min(b) {
                let prev = dp[b - x];
                if prev == u64::MAX {
                    continue;
                }
                let v = prev + layer.misses[x];
                if v < best {
                    best = v;
                    arg = x;
                }
            }
            next[b] = best;
            choice[l * (budget + 1) + b] = arg as u16;
        }
        dp = next;
    }
    // The best over every budget up to the limit (curves are non-increasing, but be exact).
    let (mut b, &misses) = dp.iter().enumerate().min_by(|a, c| a.1.cmp(c.1).then(a.0.cmp(&c.0)))?;
    let mut caps = vec![0usize; l_n];
    for l in (0..l_n).rev() {
        let x = usize::from(choice[l * (budget + 1) + b]);
        caps[l] = lo + x;
        b -= x;
    }
    let slots = caps.iter().sum();
    Some(Allocation { caps, slots, misses })
}

/// The uniform allocation: the largest common cap that fits in `slots` (at most `max_cap`),
/// lowered to the smallest common cap with the same misses (as [`allocate`] takes the fewest
/// slots at its misses: a cap past what a layer can use, such as a pruned variant's kept
/// experts, holds nothing more); `None` when `min_cap` per layer does not fit.
pub fn uniform(curve: &MissCurve, slots: usize) -> Option<Allocation> {
    let l_n = curve.layers.len().max(1);
    let mut cap = (slots / l_n).min(curve.max_cap);
    if cap < curve.min_cap {
        return None;
    }
    let total = |c: usize| (0..curve.layers.len()).map(|l| curve.layer_misses(l, c)).sum::<u64>();
    let misses = total(cap);
    while cap > curve.min_cap && total(cap - 1) == misses {
        cap -= 1;
    }
    let caps = vec![cap; curve.layers.len()];
    Some(Allocation { slots: caps.iter().sum(), caps, misses })
}

/// Misses of `caps` on another curve of the same layers (for example the held-out trace's).
pub fn evaluate(curve: &MissCurve, caps: &[usize]) -> u64 {
    caps.iter().enumerate().map(|(l, &c)| curve.layer_misses(l, c)).sum()
}

/// Number of layers whose curve is not convex (some marginal gain larger than the previous one):
/// where a greedy allocation could be suboptimal.
pub fn non_convex_layers(curve: &MissCurve) -> usize {
    curve
        .layers
        .iter()
        .filter(|l| {
            let gains: Vec<i128> = l.misses.windows(2).map(|w| i128::from(w[0]) - i128::from(w[1])).collect();
            gains.windows(2).any(|g| g[1] > g[0])
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use cachesim::mrc::LayerCurve;
    use cachesim::{Policy, Semantics};

    fn curve(layers: Vec<Vec<u64>>, min_cap: usize) -> MissCurve {
        let max_cap = min_cap + layers[0].len() - 1;
        MissCurve {
            policy: Policy::Lru,
            semantics: Semantics::KWay,
            k_used: min_cap,
            min_cap,
            max_cap,
            tokens: 100,
            picks_per_layer: 100 * min_cap as u64,
            layers: layers
                .into_iter()
                .enumerate()
                .map(|(i, misses)| LayerCurve { layer_id: i as u32, misses })
                .collect(),
        }
    }

    /// Brute force over every allocation.
    fn brute(c: &MissCurve, slots: usize) -> u64 {
        let w = c.max_cap - c.min_cap + 1;
        let mut best = u64::MAX;
        let n = w.pow(c.layers.len() as u32);
        for code in 0..n {
            let mut caps = Vec::new();
            let mut x = code;
            for _ in 0..c.layers.len() {
                caps.push(c.min_cap + x % w);
                x /= w;
            }
            if caps.iter().sum::<usize>() <= slots {
                best = best.min(evaluate(c, &caps));
            }
        }
        best
    }

    #[test]
    fn dynamic_program_is_exact_where_greedy_is_not() {
        // Layer 0 is not convex: nothing from its first extra slot, everything from the second.
        // Layer 1 gains 30 from its first extra slot. With 2 extra slots, greedy (largest next
        // marginal gain) takes layer 1 twice (gains 30, 10) and ends at 100 + 60 = 160; the optimum
        // gives both slots to layer 0: 0 + 100 = 100.
        let c = curve(vec![vec![100, 100, 0], vec![100, 70, 60]], 2);
        let a = allocate(&c, 6).unwrap();
        assert_eq!((a.caps.clone(), a.misses, a.slots), (vec![4, 2], 100, 6));
        assert_eq!(brute(&c, 6), 100);
        assert_eq!(non_convex_layers(&c), 1);
        let u = uniform(&c, 6).unwrap();
        assert_eq!((u.caps, u.misses), (vec![3, 3], 170));
        assert!(allocate(&c, 3).is_none());
        assert_eq!(allocate(&c, 100).unwrap().misses, 60);
        // A budget past every cap: both plans hold the top cap, 8 slots, not the budget's 100.
        let u = uniform(&c, 100).unwrap();
        assert_eq!((u.caps, u.misses, u.slots), (vec![4, 4], 60, 8));
        assert_eq!(allocate(&c, 100).unwrap().slots, 8);
    }

    /// A pruned variant keeping K experts per layer: its curve is flat from cap K on, and the
    /// uniform plan never holds more than K slots per layer.
    #[test]
    fn uniform_caps_stop_where_the_curve_is_flat() {
        let check = |layers: Vec<Vec<u64>>, min_cap: usize, slots: usize, expect: Option<(usize, u64)>| {
            let c = curve(layers.clone(), min_cap);
            let got = uniform(&c, slots).map(|u| (u.caps[0], u.misses));
            assert_eq!(got, expect, "{layers:?} from cap {min_cap}, {slots} slots");
        };
        // Caps 2..=6, flat from cap 4 in both layers.
        check(vec![vec![50, 20, 5, 5, 5], vec![40, 30, 9, 9, 9]], 2, 12, Some((4, 14)));
        check(vec![vec![50, 20, 5, 5, 5], vec![40, 30, 9, 9, 9]], 2, 6, Some((3, 50)));
        // One layer still gains at the top: the cap stays.
        check(vec![vec![50, 20, 5, 5, 5], vec![40, 30, 9, 9, 8]], 2, 12, Some((6, 13)));
        // Flat everywhere: min_cap.
        check(vec![vec![7, 7, 7], vec![3, 3, 3]], 2, 8, Some((2, 10)));
        check(vec![vec![7, 7, 7], vec![3, 3, 3]], 2, 3, None);
    }

    #[test]
    fn matches_brute_force_on_random_curves() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..200 {
            let layers: Vec<Vec<u64>> = (0..3)
                .map(|_| {
                    let mut v: Vec<u64> = (0..5).map(|_| rng.random_range(0..50)).collect();
                    v.sort_unstable_by(|a, b| b.cmp(a));
                    v
                })
                .collect();
            let c = curve(layers, 1);
            for slots in 3..=15 {
                assert_eq!(allocate(&c, slots).unwrap().misses, brute(&c, slots), "{c:?} {slots}");
            }
        }
    }
}
