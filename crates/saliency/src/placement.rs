//! kTransformers' GPU expert placements as pin maps (SEMANTICS.md §9).
//!
//! kTransformers (with SGLang) keeps `N` experts of the whole model on the GPU and chooses them
//! once at start-up with one of four strategies (`--kt-expert-placement-strategy`). The rules
//! here follow its source: `python/sglang/srt/layers/moe/kt_utils.py` of `kvcache-ai/sglang`
//! (`generate_uniform_masks`, `generate_front_loading_masks`, `generate_random_masks`,
//! `_init_kt_gpu_experts_masks`) and `kt-kernel/python/experts_base.py` of
//! `kvcache-ai/ktransformers` (`generate_gpu_experts_masks`, the `frequency` strategy). The layers
//! are the statistics' layers in order (kTransformers' MoE layers; its dense layers are not
//! traced). Where kTransformers clamps a total above L·E this module refuses it, so a placement
//! always holds exactly N experts.

use serde::{Deserialize, Serialize};

use crate::error::invalid;
use crate::{KeepMap, Result, SaliencyError, Stats};

/// kTransformers' default seed of the `random` placement (`generate_random_masks(..., seed=42)`).
pub const DEFAULT_PLACEMENT_SEED: u32 = 42;

/// One of kTransformers' GPU expert placements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// `uniform` (`generate_uniform_masks`): ⌊N/L⌋ experts per layer, ids 0.. in order; the first
    /// N mod L layers get one more.
    Uniform,
    /// `front-loading` (`generate_front_loading_masks`): layer by layer from the first, ids 0..
    /// in order, min(remaining, E) per layer until N are placed.
    Front,
    /// `random` (`generate_random_masks`): the (layer, expert) pairs in layer-major order
    /// (index l·E + e), permuted by torch's CPU `randperm` under `manual_seed(seed)`; the first N
    /// of the permutation. A larger N takes a longer prefix of the same permutation.
    Random,
    /// `frequency` (`generate_gpu_experts_masks`): one top-N over all (layer, expert) pairs by
    /// activation count, so the count per layer varies. kTransformers calls `torch.topk(...,
    /// sorted=False)`, whose order among equal counts is unspecified; here ties go to the lower
    /// layer, then the lower expert id. Experts never routed count 0 and are placed last, as in
    /// kTransformers.
    Frequency,
}

impl Placement {
    /// Every placement.
    pub const ALL: [Placement; 4] = [Placement::Uniform, Placement::Front, Placement::Random, Placement::Frequency];

    /// `uniform`, `front`, `random` or `frequency`.
    pub fn as_str(self) -> &'static str {
        match self {
            Placement::Uniform => "uniform",
            Placement::Front => "front",
            Placement::Random => "random",
            Placement::Frequency => "frequency",
        }
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Placement {
    type Err = SaliencyError;

    /// Parses `uniform`, `front` (or kTransformers' `front-loading`), `random` or `frequency`.
    ///
    /// # Errors
    /// [`SaliencyError::Invalid`] naming the valid spellings.
    fn from_str(s: &str) -> Result<Placement> {
        if s == "front-loading" {
            return Ok(Placement::Front);
        }
        Placement::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| invalid("placement", format!("`{s}`; expected uniform, front, random or frequency")))
    }
}

/// How a pin map was placed, recorded in [`KeepMap::placement`]: the placement, N, and for
/// `random` the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementRecord {
    /// The placement.
    pub placement: Placement,
    /// N, experts placed over all layers.
    pub total: u64,
    /// The seed of `random` (absent for the others).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u32>,
}

/// Per layer, the expert ids (ascending) of `placement` with N = `total` over `layers` layers of
/// `num_experts` experts. `counts` (`[L][E]`) is read by `frequency` only; `seed` by `random`
/// only.
///
/// # Errors
/// [`SaliencyError::Invalid`] for N = 0, N > L·E, E above 65536, or `frequency` without counts
/// of shape `[L][E]`.
pub fn placement_layers(
    placement: Placement,
    layers: usize,
    num_experts: usize,
    total: u64,
    seed: u32,
    counts: Option<&[Vec<u64>]>,
) -> Result<Vec<Vec<u16>>> {
    let all = layers.saturating_mul(num_experts);
    let n = usize::try_from(total).unwrap_or(usize::MAX);
    if n == 0 {
        return Err(invalid("placement budget", "N must be at least 1"));
    }
    if n > all {
        return Err(invalid(
            "placement budget",
            format!("N = {total} is above the {all} experts of {layers} layers of {num_experts}"),
        ));
    }
    if num_experts > usize::from(u16::MAX) + 1 {
        return Err(invalid("num_experts", format!("{num_experts} experts do not fit u16 ids")));
    }
    let mut out = vec![Vec::new(); layers];
    match placement {
        Placement::Uniform => {
            let (per, extra) = (n / layers, n % layers);
            for (l, ids) in out.iter_mut().enumerate() {
                let take = (per + usize::from(l < extra)).min(num_experts);
                ids.extend((0..take).map(|e| e as u16));
            }
        }
        Placement::Front => {
            let mut left = n;
            for ids in &mut out {
                let take = left.min(num_experts);
                ids.extend((0..take).map(|e| e as u16));
                left -= take;
            }
        }
        Placement::Random => {
            for &i in &torch_randperm(all, seed)[..n] {
                out[i / num_experts].push((i % num_experts) as u16);
            }
        }
        Placement::Frequency => {
            let counts = counts.ok_or_else(|| invalid("placement", "frequency needs activation counts"))?;
            if counts.len() != layers || counts.iter().any(|c| c.len() != num_experts) {
                return Err(invalid("placement", format!("frequency needs counts of shape [{layers}][{num_experts}]")));
            }
            let mut flat: Vec<usize> = (0..all).collect();
            // Count descending; ties: lower flat index = lower layer, then lower expert id.
            flat.sort_by(|&a, &b| {
                counts[b / num_experts][b % num_experts].cmp(&counts[a / num_experts][a % num_experts]).then(a.cmp(&b))
            });
            for &i in &flat[..n] {
                out[i / num_experts].push((i % num_experts) as u16);
            }
        }
    }
    for ids in &mut out {
        ids.sort_unstable();
    }
    Ok(out)
}

impl KeepMap {
    /// The pin map of `placement` with N = `total` experts over the layers of `stats` (see
    /// [`Placement`] for each rule and [`placement_layers`]). `uniform`, `front` and `random` read
    /// only the statistics' shape (L, E); `frequency` reads their counts. `seed` applies to
    /// `random` only (default [`DEFAULT_PLACEMENT_SEED`], kTransformers' own).
    ///
    /// The map has a different size per layer, possibly 0; `k` is the largest. It is a pin map
    /// for `replay --pin`, not a keep map to prune with: a layer with 0 entries pins nothing.
    ///
    /// # Errors
    /// As [`placement_layers`]; [`SaliencyError::Invalid`] for a seed given to another placement.
    pub fn place(stats: &Stats, placement: Placement, total: u64, seed: Option<u32>) -> Result<KeepMap> {
        if seed.is_some() && placement != Placement::Random {
            return Err(invalid("seed", format!("applies to the random placement only, not {placement}")));
        }
        let seed = (placement == Placement::Random).then(|| seed.unwrap_or(DEFAULT_PLACEMENT_SEED));
        let counts: Vec<Vec<u64>> = stats.layers.iter().map(|l| l.count.clone()).collect();
        let layers = placement_layers(
            placement,
            stats.layers.len(),
            stats.num_experts(),
            total,
            seed.unwrap_or(0),
            Some(&counts),
        )?;
        let k = layers.iter().map(Vec::len).max().unwrap_or(0);
        let map = KeepMap {
            metric: placement.as_str().to_string(),
            k: k as u32,
            num_experts: stats.meta.num_experts,
            layer_ids: stats.meta.layer_ids.clone(),
            layers,
            stats_sha256: if placement == Placement::Frequency { stats.sha256() } else { String::new() },
            short_layers: Vec::new(),
            budget: None,
            placement: Some(PlacementRecord { placement, total, seed }),
        };
        map.validate()?;
        Ok(map)
    }
}

/// torch's CPU `randperm(n, generator=g)` after `g.manual_seed(seed)` (ATen `randperm_cpu`, the
/// branch for n < 2³²/20): the identity, then for i in 0..n−1 swap r[i] with r[i + z], z =
/// `mt19937()` mod (n − i). kTransformers draws its `random` placement this way.
pub(crate) fn torch_randperm(n: usize, seed: u32) -> Vec<usize> {
    let mut r: Vec<usize> = (0..n).collect();
    let mut mt = Mt19937::new(seed);
    for i in 0..n.saturating_sub(1) {
        let z = (u64::from(mt.next_u32()) % (n - i) as u64) as usize;
        r.swap(i, i + z);
    }
    r
}

/// The 32-bit Mersenne Twister (std::mt19937; torch's CPU generator).
pub(crate) struct Mt19937 {
    state: [u32; 624],
    index: usize,
}

impl Mt19937 {
    pub(crate) fn new(seed: u32) -> Mt19937 {
        let mut state = [0u32; 624];
        state[0] = seed;
        for j in 1..624 {
            state[j] = 1_812_433_253u32.wrapping_mul(state[j - 1] ^ (state[j - 1] >> 30)).wrapping_add(j as u32);
        }
        Mt19937 { state, index: 624 }
    }

    pub(crate) fn next_u32(&mut self) -> u32 {
        if self.index >= 624 {
            for i in 0..624 {
                let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % 624] & 0x7fff_ffff);
                let mut v = self.state[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.state[i] = v;
            }
            self.index = 0;
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LayerStats, StatsMeta};
    use proptest::prelude::*;

    /// Statistics of `counts.len()` layers (ids 10, 11, ...) of E = `counts[0].len()` experts.
    fn stats(counts: Vec<Vec<u64>>) -> Stats {
        let e = counts[0].len() as u32;
        Stats {
            meta: StatsMeta {
                model: String::new(),
                num_experts: e,
                top_k: 1,
                layer_ids: (10..10 + counts.len() as u32).collect(),
                source: String::new(),
                source_digest: String::new(),
            },
            layers: counts
                .into_iter()
                .map(|count| LayerStats {
                    tokens: count.iter().sum(),
                    count,
                    gate_sum: None,
                    ean_sum: None,
                    reap_sum: None,
                    reap_sumsq: None,
                    reap_missing: vec![],
                })
                .collect(),
        }
    }

    /// One line per hand-computed case: L = 3, E = 4, `counts`, placement, N → layers.
    fn check(placement: Placement, total: u64, counts: &[[u64; 4]; 3], expect: &[&[u16]]) {
        let s = stats(counts.iter().map(|c| c.to_vec()).collect());
        let map = KeepMap::place(&s, placement, total, None).unwrap();
        let expect: Vec<Vec<u16>> = expect.iter().map(|l| l.to_vec()).collect();
        assert_eq!(map.layers, expect, "{placement} N = {total}");
        assert_eq!(map.total_kept() as u64, total);
        let back: KeepMap = serde_json::from_slice(&map.to_json_bytes().unwrap()).unwrap();
        assert_eq!(back, map);
    }

    const FLAT: [[u64; 4]; 3] = [[1; 4]; 3];
    const COUNTS: [[u64; 4]; 3] = [[9, 0, 3, 3], [2, 7, 7, 0], [3, 1, 0, 8]];

    #[test]
    fn placements_by_hand() {
        // uniform: 5 = 1·3 + 2, the first 2 layers one more.
        check(Placement::Uniform, 5, &FLAT, &[&[0, 1], &[0, 1], &[0]]);
        check(Placement::Uniform, 2, &FLAT, &[&[0], &[0], &[]]);
        check(Placement::Uniform, 12, &FLAT, &[&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1, 2, 3]]);
        // front-loading: every expert of layer 0, then layer 1 from id 0.
        check(Placement::Front, 5, &FLAT, &[&[0, 1, 2, 3], &[0], &[]]);
        check(Placement::Front, 3, &FLAT, &[&[0, 1, 2], &[], &[]]);
        // frequency, one top-N over all layers: 9 (l0 e0), 8 (l2 e3), 7 (l1 e1), 7 (l1 e2),
        // then 3 four times: l0 e2 and l0 e3 (lower layer) before l2 e0.
        check(Placement::Frequency, 5, &COUNTS, &[&[0, 2], &[1, 2], &[3]]);
        check(Placement::Frequency, 6, &COUNTS, &[&[0, 2, 3], &[1, 2], &[3]]);
        check(Placement::Frequency, 7, &COUNTS, &[&[0, 2, 3], &[1, 2], &[0, 3]]);
        // Zero counts come last, lower layer first: N = 11 leaves out the last zero (l2 e2).
        check(Placement::Frequency, 11, &COUNTS, &[&[0, 1, 2, 3], &[0, 1, 2, 3], &[0, 1, 3]]);
        // random, seed 42: the permutation of the 12 (layer, expert) pairs, first 5 taken.
        check(Placement::Random, 5, &FLAT, RANDOM_42_5);
    }

    /// `random`, L = 3, E = 4, seed 42: the permutation of pair indices l·4 + e is
    /// [6, 8, 1, 7, 0, 2, 10, 11, 4, 3, 5, 9]; N = 5 takes 6, 8, 1, 7, 0 (docs/CLI.md).
    const RANDOM_42_5: &[&[u16]] = &[&[0, 1], &[2, 3], &[0]];

    #[test]
    fn random_is_a_prefix_of_one_permutation() {
        let s = stats(vec![vec![1; 4]; 3]);
        let perm = torch_randperm(12, DEFAULT_PLACEMENT_SEED);
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..12).collect::<Vec<_>>());
        for n in 1..=12u64 {
            let map = KeepMap::place(&s, Placement::Random, n, None).unwrap();
            let mut want = vec![Vec::new(); 3];
            for &i in &perm[..n as usize] {
                want[i / 4].push((i % 4) as u16);
            }
            want.iter_mut().for_each(|l| l.sort_unstable());
            assert_eq!(map.layers, want, "N = {n}");
            assert_eq!(map.placement.unwrap().seed, Some(42));
        }
        let other = KeepMap::place(&s, Placement::Random, 5, Some(7)).unwrap();
        assert_eq!(other.label(), "random@pins5:seed7");
        assert_eq!(KeepMap::place(&s, Placement::Random, 5, None).unwrap().label(), "random@pins5");
    }

    #[test]
    fn mt19937_matches_the_cpp_standard() {
        // [rand.predef]: the 10000th output of a default-constructed std::mt19937 (seed 5489).
        let mut mt = Mt19937::new(5489);
        let v = (0..10_000).map(|_| mt.next_u32()).last();
        assert_eq!(v, Some(4_123_659_995));
    }

    #[test]
    fn refusals() {
        let s = stats(vec![vec![1; 4]; 3]);
        assert!(KeepMap::place(&s, Placement::Uniform, 0, None).is_err());
        assert!(KeepMap::place(&s, Placement::Front, 13, None).is_err());
        assert!(KeepMap::place(&s, Placement::Uniform, 5, Some(1)).is_err());
        assert_eq!("front-loading".parse::<Placement>().unwrap(), Placement::Front);
        assert!("middle".parse::<Placement>().is_err());
        // A placed map whose total disagrees with its layers is refused on reading.
        let mut map = KeepMap::place(&s, Placement::Front, 5, None).unwrap();
        map.layers[1].clear();
        assert!(map.validate().is_err());
    }

    proptest! {
        #[test]
        fn every_placement_places_exactly_n(
            l in 1usize..6, e in 1usize..9, frac in 0.0f64..1.0, seed in any::<u32>(),
            counts in proptest::collection::vec(0u64..5, 48),
        ) {
            let all = l * e;
            let n = 1 + ((all - 1) as f64 * frac) as u64;
            let table: Vec<Vec<u64>> = (0..l).map(|x| counts[x * e..(x + 1) * e].to_vec()).collect();
            let s = stats(table);
            for p in Placement::ALL {
                let seed = (p == Placement::Random).then_some(seed);
                let map = KeepMap::place(&s, p, n, seed).unwrap();
                prop_assert_eq!(map.total_kept() as u64, n);
                for ids in &map.layers {
                    prop_assert!(ids.windows(2).all(|w| w[0] < w[1]));
                    prop_assert!(ids.iter().all(|&x| usize::from(x) < e));
                }
                map.validate().unwrap();
            }
        }
    }
}
