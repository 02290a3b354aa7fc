//! Descriptive figures of a trace (what `moe-offload inspect` shows): per-layer expert usage,
//! next-token expert reuse against a shuffled-order control, sequence and engine-step sizes.
//!
//! Everything here reads a validated [`TraceView`] once per layer in trace order (plus one pass in
//! a fixed permuted order for the control), allocates O(E + T · k) and never fails.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rayon::prelude::*;

use crate::{Result, Shape, TraceFile, TraceView};

/// Seed of the token permutation used by the shuffled-order control (fixed: figures reproduce).
pub const SHUFFLE_SEED: u64 = 0x6d6f_652d_6f66_666c; // "moe-offl"

/// Expert usage of one layer, over the k used slots of every token.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct LayerUsage {
    /// The layer's id in the model.
    pub layer_id: u32,
    /// Experts used by at least one token (of E).
    pub experts_used: usize,
    /// Entropy, in bits, of the distribution of used slots over experts (max log2 E).
    pub entropy_bits: f64,
    /// Share of used slots that go to the most used 10% of experts (ceil(E / 10) experts).
    pub top10pct_share: f64,
    /// Next-token reuse: of the used slots of tokens 1..T, the fraction whose expert was also used
    /// by the previous token in trace order. NaN when T < 2.
    pub next_token_reuse: f64,
    /// The same rate over consecutive tokens of a fixed random permutation of the token order
    /// (see [`shuffled_order`]): what popularity alone gives, without temporal locality.
    pub shuffled_reuse: f64,
}

/// A deterministic permutation of `0..tokens` (Fisher–Yates, ChaCha8 seeded with `seed`).
///
/// # Panics
/// When `tokens > u32::MAX` (a trace that large would need > 8 GB per layer of ids).
pub fn shuffled_order(tokens: usize, seed: u64) -> Vec<u32> {
    let n = u32::try_from(tokens).expect("token count fits in u32");
    let mut perm: Vec<u32> = (0..n).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..perm.len()).rev() {
        let j = rng.random_range(0..=i);
        perm.swap(i, j);
    }
    perm
}

/// Usage figures of layer index `l`; `perm` is the control order from [`shuffled_order`]
/// (length T; computed once and shared by all layers).
///
/// # Panics
/// When `l >= L` or `perm` is not a permutation of `0..T` (an index out of range).
pub fn layer_usage(v: &TraceView<'_>, l: usize, perm: &[u32]) -> LayerUsage {
    let s = v.shape();
    let (m, k) = (s.candidates, s.top_k);
    // The used ids of the layer, k per token, read once in trace order: the shuffled pass below
    // then jumps around this compact copy (T · k ids) instead of the mapped rows of m ids.
    let used_ids: Vec<u16> = v.layer_ids(l).chunks_exact(m).flat_map(|row| row[..k].iter().copied()).collect();
    let mut count = vec![0u64; s.num_experts];
    for &e in &used_ids {
        count[e as usize] += 1;
    }
    let used = |t: usize| &used_ids[t * k..t * k + k];
    // `stamp[e]` = the position in `order` of the last token that used e: e was used by the
    // previous token exactly when its stamp is the previous position. O(k) per token instead of
    // comparing every pair of the two rows (the used ids of a row are distinct: validated).
    let mut stamp = vec![0u64; s.num_experts];
    let mut reuse_rate = |order: &mut dyn Iterator<Item = usize>| {
        stamp.fill(0);
        let Some(first) = order.next() else { return f64::NAN };
        let mut pos = 1u64;
        for &e in used(first) {
            stamp[e as usize] = pos;
        }
        let (mut hits, mut slots) = (0u64, 0u64);
        for t in order {
            pos += 1;
            for &e in used(t) {
                let st = &mut stamp[e as usize];
                hits += u64::from(*st == pos - 1);
                *st = pos;
            }
            slots += k as u64;
        }
        if slots == 0 { f64::NAN } else { hits as f64 / slots as f64 }
    };
    let next_token_reuse = reuse_rate(&mut (0..s.tokens));
    let shuffled_reuse = reuse_rate(&mut perm.iter().map(|&t| t as usize));
    figures(v.meta().layer_ids[l], &count, next_token_reuse, shuffled_reuse)
}

/// A layer's figures from its counts of used slots per expert (length E) and its two reuse rates.
fn figures(layer_id: u32, count: &[u64], next_token_reuse: f64, shuffled_reuse: f64) -> LayerUsage {
    let total: u64 = count.iter().sum();
    let entropy_bits: f64 = count
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / total as f64;
            -p * p.log2()
        })
        .sum();
    let mut sorted = count.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let top = count.len().div_ceil(10);
    let top10pct_share = sorted[..top].iter().sum::<u64>() as f64 / total.max(1) as f64;
    LayerUsage {
        layer_id,
        experts_used: count.iter().filter(|&&c| c > 0).count(),
        entropy_bits,
        top10pct_share,
        next_token_reuse,
        shuffled_reuse,
    }
}

/// Validates every value of `file` (as [`TraceFile::open`] does: the same first violation) and
/// computes the usage figures of every layer, in layer order: those of [`layer_usage`] with the
/// control order [`shuffled_order`]`(T, seed)`, equal whatever the thread count.
///
/// Faster than validating, then calling [`layer_usage`] per layer: the ids are read once. Layer
/// by layer, the check of its rows (in parallel blocks) copies each row's k used ids into a
/// compact buffer while the block is in cache; the shuffled-order copy is gathered from that
/// buffer in parallel (independent loads, where the plain control pass waits for one random row
/// after another), and both reuse passes and the counts run in parallel spans of tokens over
/// the two buffers (integer sums: the same figures in any order). Allocates 2 · T · k ids and
/// T token indices.
///
/// # Errors
/// As [`TraceFile::view_for`] of everything.
///
/// # Panics
/// When `T > u32::MAX`, as [`shuffled_order`].
pub fn validate_with_usage(file: &TraceFile, seed: u64) -> Result<(TraceView<'_>, Vec<LayerUsage>)> {
    file.view_all_with(|shape, layer_ids, ids| usage_pass(shape, layer_ids, ids, seed))
}

/// Tokens per parallel task of the passes over a layer's compact used ids.
const SPAN: usize = 8192;

/// [`validate_with_usage`]'s pass over the ids (`[L, T, m]`, unchecked before).
fn usage_pass(shape: &Shape, layer_ids: &[u32], ids: &[u16], seed: u64) -> Result<Vec<LayerUsage>> {
    let Shape { layers, tokens, candidates: m, top_k: k, num_experts, .. } = *shape;
    let perm = shuffled_order(tokens, seed);
    let mut used = vec![0u16; tokens * k];
    let mut shuffled = vec![0u16; tokens * k];
    let mut out = Vec::with_capacity(layers);
    for (l, &layer_id) in layer_ids.iter().enumerate().take(layers) {
        let rows = &ids[l * tokens * m..(l + 1) * tokens * m];
        crate::check::check_ids_copy(rows, l * tokens, shape, layer_ids, &mut used)?;
        if k == 0 {
            out.push(figures(layer_id, &vec![0; num_experts], f64::NAN, f64::NAN));
            continue;
        }
        shuffled.par_chunks_mut(SPAN * k).zip(perm.par_chunks(SPAN)).for_each(|(dst, order)| {
            for (i, &t) in order.iter().enumerate() {
                crate::check::copy_ids(dst, i * k, &used[t as usize * k..], k);
            }
        });
        let ((count, next_hits), (_, shuffled_hits)) = rayon::join(
            || reuse_pass::<true>(&used, k, num_experts),
            || reuse_pass::<false>(&shuffled, k, num_experts),
        );
        let slots = tokens.saturating_sub(1) as u64 * k as u64;
        let rate = |hits: u64| if slots == 0 { f64::NAN } else { hits as f64 / slots as f64 };
        out.push(figures(layer_id, &count, rate(next_hits), rate(shuffled_hits)));
    }
    Ok(out)
}

/// Over `used` (k >= 1 validated ids per token, in some token order): the used slots per expert
/// (length E, when `COUNT`; else empty) and the hits, the slots of tokens 1.. whose expert the
/// token before also used. In parallel spans of [`SPAN`] tokens.
fn reuse_pass<const COUNT: bool>(used: &[u16], k: usize, num_experts: usize) -> (Vec<u64>, u64) {
    let tokens = used.len() / k;
    let width = if COUNT { num_experts } else { 0 };
    (0..tokens.div_ceil(SPAN))
        .into_par_iter()
        .fold(
            || Reuse { stamp: vec![0; num_experts], pos: 0, count: vec![0; width], hits: 0 },
            |mut r, span| {
                r.span::<COUNT>(used, k, span * SPAN, ((span + 1) * SPAN).min(tokens));
                r
            },
        )
        .map(|r| (r.count, r.hits))
        .reduce(
            || (vec![0; width], 0),
            |(mut count, hits), (other, more)| {
                count.iter_mut().zip(&other).for_each(|(a, b)| *a += b);
                (count, hits + more)
            },
        )
}

/// A [`reuse_pass`] task's state: `stamp[e]` = the position of the last token that used e.
struct Reuse {
    stamp: Vec<u64>,
    pos: u64,
    count: Vec<u64>,
    hits: u64,
}

impl Reuse {
    /// Adds the tokens `from..to` of `used`: their hits (against the token before, for the first
    /// one the last of the span before) and, when `COUNT`, their slots per expert.
    fn span<const COUNT: bool>(&mut self, used: &[u16], k: usize, from: usize, to: usize) {
        // A position no stamp holds: the span's first token sees only the token before it.
        self.pos += 1;
        if from > 0 {
            for &e in &used[(from - 1) * k..from * k] {
                self.stamp[usize::from(e)] = self.pos;
            }
        }
        for row in used[from * k..to * k].chunks_exact(k) {
            self.pos += 1;
            let pos = self.pos;
            for &e in row {
                let st = &mut self.stamp[usize::from(e)];
                self.hits += u64::from(*st == pos - 1);
                *st = pos;
            }
            if COUNT {
                for &e in row {
                    self.count[usize::from(e)] += 1;
                }
            }
        }
    }
}

/// Sizes (in tokens) of the spans that start at each offset (`seq_offsets` or `step_offsets`);
/// the last span runs to `tokens`.
pub fn span_sizes(offsets: &[u64], tokens: usize) -> Vec<u64> {
    offsets.iter().enumerate().map(|(i, &o)| offsets.get(i + 1).copied().unwrap_or(tokens as u64) - o).collect()
}

/// Count, min, median, mean and max of a list of sizes.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SizeSummary {
    /// Number of spans.
    pub count: usize,
    /// Smallest span, in tokens.
    pub min: u64,
    /// Median span, in tokens: the middle size, or for an even count the mean of the two middle
    /// sizes (so it can end in .5).
    pub median: f64,
    /// Mean span, in tokens.
    pub mean: f64,
    /// Largest span, in tokens.
    pub max: u64,
}

impl SizeSummary {
    /// Summarizes `sizes`; `None` when empty.
    pub fn of(sizes: &[u64]) -> Option<SizeSummary> {
        let mut s = sizes.to_vec();
        s.sort_unstable();
        Some(SizeSummary {
            count: s.len(),
            min: *s.first()?,
            median: (s[(s.len() - 1) / 2] as f64 + s[s.len() / 2] as f64) / 2.0,
            mean: s.iter().sum::<u64>() as f64 / s.len() as f64,
            max: *s.last()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

    #[test]
    fn reuse_against_the_shuffled_control() {
        let meta = TraceMeta {
            model: "t".into(),
            num_experts: 4,
            top_k: 1,
            layer_ids: vec![7],
            score_kind: ScoreKind::None,
            phase: Phase::Unknown,
            source: "test".into(),
            extra: BTreeMap::new(),
        };
        // m = 2, k = 1; used experts 0 0 0 1 1 1: next-token reuse 4 of 5.
        let ids = vec![0, 1, 0, 1, 0, 2, 1, 0, 1, 0, 1, 3];
        let t = TraceData::new(meta, 6, 2, OwnedParts { ids, ..Default::default() }).unwrap();
        let v = t.view();
        let u = layer_usage(&v, 0, &[0, 3, 1, 4, 2, 5]);
        assert_eq!((u.layer_id, u.experts_used), (7, 2));
        assert_eq!(u.entropy_bits, 1.0);
        assert_eq!(u.top10pct_share, 0.5);
        assert_eq!(u.next_token_reuse, 0.8);
        // Control order 0 3 1 4 2 5 uses 0 1 0 1 0 1: no reuse.
        assert_eq!(u.shuffled_reuse, 0.0);
    }

    /// The O(k) reuse count equals the definition (of the used slots of each token, those whose
    /// expert the previous token also used) on a top-4 trace, in both orders.
    #[test]
    fn reuse_equals_the_pairwise_definition() {
        let cfg = crate::synth::SynthConfig {
            layers: 2,
            experts: 16,
            top_k: 4,
            candidates: 8,
            tokens: 700,
            ..Default::default()
        };
        let t = crate::synth::generate(&cfg).unwrap();
        let v = t.view();
        let perm = shuffled_order(700, SHUFFLE_SEED);
        for l in 0..2 {
            let ids = v.layer_ids(l);
            let used = |t: usize| &ids[t * 8..t * 8 + 4];
            let naive = |order: &[usize]| {
                let hits: usize =
                    order.windows(2).map(|w| used(w[1]).iter().filter(|e| used(w[0]).contains(e)).count()).sum();
                hits as f64 / (4 * (order.len() - 1)) as f64
            };
            let u = layer_usage(&v, l, &perm);
            assert_eq!(u.next_token_reuse, naive(&(0..700).collect::<Vec<_>>()), "layer {l}");
            assert_eq!(u.shuffled_reuse, naive(&perm.iter().map(|&t| t as usize).collect::<Vec<_>>()), "layer {l}");
            assert!(u.next_token_reuse > 0.0 && u.shuffled_reuse > 0.0 && u.next_token_reuse < 1.0, "{u:?}");
        }
    }

    #[test]
    fn permutation_is_deterministic_and_complete() {
        let a = shuffled_order(1000, SHUFFLE_SEED);
        assert_eq!(a, shuffled_order(1000, SHUFFLE_SEED));
        assert_ne!(a, shuffled_order(1000, 1));
        let mut s = a.clone();
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert!(shuffled_order(0, 0).is_empty());
    }

    #[test]
    fn spans_and_summaries() {
        let sizes = span_sizes(&[0, 65, 1471, 1496], 1500);
        assert_eq!(sizes, vec![65, 1406, 25, 4]);
        let s = SizeSummary::of(&sizes).unwrap();
        assert_eq!((s.count, s.min, s.max), (4, 4, 1406));
        // Sorted 4 25 65 1406: the mean of the two middle sizes.
        assert_eq!(s.median, 45.0);
        assert_eq!(s.mean, 375.0);
        assert!(SizeSummary::of(&[]).is_none());
        // (sizes, median): one, odd and even counts, an even count whose middle pair sums to an odd number.
        for (sizes, median) in
            [(&[7][..], 7.0), (&[3, 1, 2], 2.0), (&[1, 2], 1.5), (&[2, 1, 1, 2], 1.5), (&[5, 1, 9, 2], 3.5)]
        {
            assert_eq!(SizeSummary::of(sizes).unwrap().median, median, "{sizes:?}");
        }
    }
}
