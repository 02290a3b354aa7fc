//! `coact`: a co-activation table learned from a calibration trace (SEMANTICS.md §12).
//!
//! `Q_l[a][b]` = the calibration tokens that chose a at the previous recorded layer and b at l
//! (a = b counted too); the score of b at (t, l) is Σ `Q_l[a][b]` over the experts a chosen at
//! (t, l − 1) in this replay; the proposals are the top B by (score desc, id asc) with
//! score > 0. The first recorded layer uses `prev_token` instead (chosen outside the loop).

use trace_io::TraceView;
use wide::u32x8;

use super::predict::Predict;
use super::predictor::{Choice, LayerAt, PredictorFacts, PredictorKind};
use super::prev_token::PrevToken;
use crate::{CacheSimError, Result};

/// Experts per block of the pruned search: a block's bound is one sum per chosen expert.
const BLOCK: usize = 16;

/// A block of one row: its 16 counts as two vectors of 8 lanes.
type Block = [[u32; 8]; 2];

/// The co-activation counts of a calibration trace: `Q_l[a][b]` for every layer index l >= 1
/// (layer 0's block is zero: it has no previous layer), stored for a fast top-B search.
///
/// Per layer, the columns b are permuted into `order` (column sums `Σ_a Q_l[a][b]` descending,
/// id ascending on ties; padded with zero columns to a multiple of 16) and cut into blocks of
/// 16; `block_max[a][β]` is the largest `Q_l[a][b]` of block β. A token's score bound of a block
/// is `Σ_a block_max[a][β]` over the experts a it chose at the previous layer: a block whose
/// bound is below the B-th best score found so far holds no proposal and is not read. Popular
/// experts share the first blocks, so the B-th best rises early and most blocks are skipped.
///
/// Memory: 4 · L · E · (W + 8 · ⌈W / 128⌉) + 4 · L · E bytes, W = E rounded up to a multiple
/// of 16 (0.49 MB for 26 layers of 64 experts, 53.6 MB for 48 layers of 512).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoactTable {
    layer_ids: Vec<u32>,
    num_experts: usize,
    /// W: E rounded up to a multiple of [`BLOCK`].
    width: usize,
    /// Per layer, the expert of each column, `[L, W]` (padding columns: 0, never proposed:
    /// their counts are 0).
    order: Vec<u16>,
    /// Per layer, the column of each expert, `[L, E]`.
    column: Vec<u16>,
    /// `Q_l[a][order[j]]`, `[L, E, W / 16]` blocks of 16.
    q: Vec<Block>,
    /// The largest count of each block of a row, `[L, E, V]` vectors of 8 blocks, V = ⌈W / 128⌉
    /// (padding blocks: 0).
    block_max: Vec<[u32; 8]>,
}

/// One layer of a [`CoactTable`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct CoactLayer<'a> {
    /// `[W]`.
    order: &'a [u16],
    /// `[E, W / 16]`.
    q: &'a [Block],
    /// `[E, V]`.
    block_max: &'a [[u32; 8]],
    /// W / 16.
    blocks: usize,
    /// V.
    vectors: usize,
}

impl CoactTable {
    /// Learns Q from `calib`: a token "chooses" the first k ids of its row (the experts the
    /// model used, SEMANTICS.md §1, k = the calibration trace's top-k), and every token of the
    /// calibration trace counts.
    ///
    /// # Errors
    /// - [`CacheSimError::NotValidated`] when `calib` was not validated for its first k ids
    ///   (`trace_io::Reads::ids(k)`).
    /// - [`CacheSimError::InvalidParameter`] when k · T >= 2^32 (a score, a sum of counts, could
    ///   overflow 32 bits).
    pub fn learn(calib: &TraceView<'_>) -> Result<CoactTable> {
        let s = calib.shape();
        crate::require(calib, trace_io::Reads::ids(s.top_k))?;
        let (e_n, k, m) = (s.num_experts, s.top_k, s.candidates);
        if (k as u64).saturating_mul(s.tokens as u64) > u64::from(u32::MAX) {
            return Err(CacheSimError::InvalidParameter {
                name: "calibration tokens",
                value: s.tokens.to_string(),
                reason: "k · tokens must be below 2^32",
            });
        }
        let width = e_n.div_ceil(BLOCK) * BLOCK;
        let (nb, nv) = (width / BLOCK, (width / BLOCK).div_ceil(8));
        let mut q: Vec<Block> = vec![[[0; 8]; 2]; s.layers * e_n * nb];
        let mut block_max = vec![[0u32; 8]; s.layers * e_n * nv];
        let mut order = vec![0u16; s.layers * width];
        let mut column = vec![0u16; s.layers * e_n];
        let mut dense = vec![0u32; e_n * e_n];
        for l in 0..s.layers {
            dense.fill(0);
            if l > 0 {
                let (prev, cur) = (calib.layer_ids(l - 1), calib.layer_ids(l));
                for t in 0..s.tokens {
                    for &a in &prev[t * m..t * m + k] {
                        let row = &mut dense[usize::from(a) * e_n..(usize::from(a) + 1) * e_n];
                        for &b in &cur[t * m..t * m + k] {
                            row[usize::from(b)] += 1;
                        }
                    }
                }
            }
            let mut sums = vec![0u64; e_n];
            for row in dense.chunks_exact(e_n) {
                for (sum, &x) in sums.iter_mut().zip(row) {
                    *sum += u64::from(x);
                }
            }
            let mut by_sum: Vec<u16> = (0..e_n as u16).collect();
            by_sum.sort_by(|&x, &y| sums[usize::from(y)].cmp(&sums[usize::from(x)]).then(x.cmp(&y)));
            order[l * width..l * width + e_n].copy_from_slice(&by_sum);
            for (j, &b) in by_sum.iter().enumerate() {
                column[l * e_n + usize::from(b)] = j as u16;
            }
            let mut row = vec![0u32; width];
            for a in 0..e_n {
                let src = &dense[a * e_n..(a + 1) * e_n];
                for (d, &b) in row.iter_mut().zip(&by_sum) {
                    *d = src[usize::from(b)];
                }
                let at = (l * e_n + a) * nb;
                for (j, blk) in row.chunks_exact(BLOCK).enumerate() {
                    for (i, &x) in blk.iter().enumerate() {
                        q[at + j][i / 8][i % 8] = x;
                    }
                    block_max[(l * e_n + a) * nv + j / 8][j % 8] = blk.iter().copied().max().unwrap_or(0);
                }
            }
        }
        Ok(CoactTable {
            layer_ids: calib.meta().layer_ids.clone(),
            num_experts: e_n,
            width,
            order,
            column,
            q,
            block_max,
        })
    }

    /// `Q_l[a][b]` (layer index `l`, experts `a` at l − 1 and `b` at l).
    pub fn get(&self, l: usize, a: usize, b: usize) -> u32 {
        let e_n = self.num_experts;
        let j = usize::from(self.column[l * e_n + b]);
        self.q[(l * e_n + a) * (self.width / BLOCK) + j / BLOCK][j % BLOCK / 8][j % 8]
    }

    /// The recorded layer ids of the calibration trace.
    pub fn layer_ids(&self) -> &[u32] {
        &self.layer_ids
    }

    /// E of the calibration trace.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Layer `l`'s part.
    pub(crate) fn layer(&self, l: usize) -> CoactLayer<'_> {
        let (e_n, w) = (self.num_experts, self.width);
        let (nb, nv) = (w / BLOCK, (w / BLOCK).div_ceil(8));
        CoactLayer {
            order: &self.order[l * w..(l + 1) * w],
            q: &self.q[l * e_n * nb..(l + 1) * e_n * nb],
            block_max: &self.block_max[l * e_n * nv..(l + 1) * e_n * nv],
            blocks: nb,
            vectors: nv,
        }
    }

    /// Checks that the table was learned on a trace of the same model layers and experts as
    /// the replayed one (`layer_ids`, `num_experts`).
    ///
    /// # Errors
    /// [`CacheSimError::CalibrationMismatch`] naming what differs.
    pub fn check_fits(&self, layer_ids: &[u32], num_experts: usize) -> Result<()> {
        if self.num_experts != num_experts {
            return Err(CacheSimError::CalibrationMismatch {
                what: "experts per layer (E)",
                calibration: self.num_experts.to_string(),
                trace: num_experts.to_string(),
            });
        }
        if self.layer_ids != layer_ids {
            return Err(CacheSimError::CalibrationMismatch {
                what: "recorded layer ids",
                calibration: format!("{:?}", self.layer_ids),
                trace: format!("{layer_ids:?}"),
            });
        }
        Ok(())
    }
}

/// Where coact finds the experts chosen at (t, l − 1) in this replay.
pub(crate) enum PrevChosen<'a> {
    /// At λ = 0 they are F[0..n] of the previous layer's row: its ids `[T, m]` and keep mask.
    Trace { ids: &'a [u16], m: usize, keep: &'a [bool], k_used: usize },
    /// At λ > 0 they depend on that layer's cache: recorded by its replay, `[T, k_used]` ids and
    /// `[T]` counts.
    Table { ids: &'a [u16], lens: &'a [u16], k_used: usize },
}

/// coact for one layer l >= 1.
pub(crate) struct Coact<'a> {
    layer: CoactLayer<'a>,
    prev: PrevChosen<'a>,
    budget: usize,
    /// The experts chosen at (t, l − 1): the first ones of `[k_used]`.
    rows: Vec<usize>,
    /// The best so far, (score desc, id asc): the first ones of `[budget]`.
    best: Vec<(u32, u16)>,
}

impl<'a> Coact<'a> {
    pub(crate) fn new(layer: CoactLayer<'a>, prev: PrevChosen<'a>, budget: usize) -> Coact<'a> {
        let k_used = match prev {
            PrevChosen::Trace { k_used, .. } | PrevChosen::Table { k_used, .. } => k_used,
        };
        Coact { layer, prev, budget, rows: vec![0; k_used], best: vec![(0, 0); budget] }
    }
}

impl<'a> PredictorKind<'a> for Coact<'a> {
    const FACTS: PredictorFacts =
        PredictorFacts { name: "coact", needs_calibration: true, needs_lookahead: false, reads_layer_below: true };
    /// `prev_token` at the first recorded layer (no layer below).
    fn choose(at: LayerAt<'a>) -> Choice<'a> {
        match at.below {
            None => Choice::PrevToken(PrevToken::new(at.k_used, at.budget)),
            Some(below) => {
                let table = at.coact.expect("validate_prefetch() requires a table for coact");
                Choice::Coact(Coact::new(table.layer(at.l), below, at.budget))
            }
        }
    }
}

impl Predict for Coact<'_> {
    #[inline(always)]
    fn propose(&mut self, t: usize, _oracle: &[u16], out: &mut Vec<u16>) {
        if self.budget == 0 {
            return;
        }
        let mut n = 0;
        match self.prev {
            PrevChosen::Trace { ids, m, keep, k_used } => {
                for &a in &ids[t * m..(t + 1) * m] {
                    if n == k_used {
                        break;
                    }
                    if keep[usize::from(a)] {
                        self.rows[n] = usize::from(a);
                        n += 1;
                    }
                }
            }
            PrevChosen::Table { ids, lens, k_used } => {
                n = usize::from(lens[t]);
                for (r, &a) in self.rows.iter_mut().zip(&ids[t * k_used..t * k_used + n]) {
                    *r = usize::from(a);
                }
            }
        }
        let rows = &self.rows[..n];
        let CoactLayer { order, q, block_max, blocks, vectors } = self.layer;
        // Top B by (score desc, id asc), score > 0. Once B are kept, (floor, last) is the B-th:
        // a block whose bound is below floor cannot hold a better one (padding blocks: bound 0).
        // Bounds go 8 blocks at a time, each vector summed over the chosen experts in registers.
        let b_n = self.budget;
        let best = &mut self.best;
        let mut kept = 0;
        let (mut floor, mut last) = (1u32, 0u16);
        for v in 0..vectors {
            let mut acc = u32x8::ZERO;
            for &a in rows {
                acc += u32x8::from(block_max[a * vectors + v]);
            }
            // Lanes at or above floor (floor >= 1), as bits; floor may rise while they are read.
            let mut blocks_left = acc.simd_gt(u32x8::splat(floor - 1)).to_bitmask();
            if blocks_left == 0 {
                continue;
            }
            let bounds = acc.to_array();
            while blocks_left != 0 {
                let j = blocks_left.trailing_zeros() as usize;
                blocks_left &= blocks_left - 1;
                if bounds[j] < floor {
                    continue;
                }
                let blk = v * 8 + j;
                let (mut lo, mut hi) = (u32x8::ZERO, u32x8::ZERO);
                for &a in rows {
                    let [x, y] = q[a * blocks + blk];
                    lo += u32x8::from(x);
                    hi += u32x8::from(y);
                }
                let at_least = u32x8::splat(floor - 1);
                let mut lanes = lo.simd_gt(at_least).to_bitmask() | (hi.simd_gt(at_least).to_bitmask() << 8);
                let scores = [lo.to_array(), hi.to_array()];
                let scores = scores.as_flattened();
                while lanes != 0 {
                    let i = lanes.trailing_zeros() as usize;
                    lanes &= lanes - 1;
                    let sc = scores[i];
                    if sc < floor {
                        continue;
                    }
                    let id = order[blk * BLOCK + i];
                    let full = kept == b_n;
                    if full && sc == floor && id > last {
                        continue;
                    }
                    // Insert from the back, (score desc, id asc); when full the last drops out.
                    let mut at = if full { b_n - 1 } else { kept };
                    while at > 0 && (best[at - 1].0 < sc || (best[at - 1].0 == sc && best[at - 1].1 > id)) {
                        best[at] = best[at - 1];
                        at -= 1;
                    }
                    best[at] = (sc, id);
                    kept += usize::from(!full);
                    if kept == b_n {
                        (floor, last) = best[b_n - 1];
                    }
                }
            }
        }
        out.extend(self.best[..kept].iter().map(|&(_, e)| e));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

    use super::{Coact, CoactTable, PrevChosen};
    use crate::prefetch::predict::Predict;

    /// A two-layer calibration trace of `tokens` rows of k distinct ids each, skewed (squares of
    /// uniforms pick low ids more often), so that counts repeat and scores tie.
    fn calibration(seed: u64, e_n: usize, k: usize, tokens: usize) -> TraceData {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut ids = Vec::new();
        for _ in 0..2 * tokens {
            let mut row: Vec<u16> = Vec::new();
            while row.len() < k {
                let u: f64 = rng.random();
                let e = ((u * u) * e_n as f64) as u16;
                if !row.contains(&e) {
                    row.push(e);
                }
            }
            ids.extend(row);
        }
        let meta = TraceMeta {
            model: "synthetic".into(),
            num_experts: e_n as u32,
            top_k: k as u32,
            layer_ids: vec![0, 1],
            score_kind: ScoreKind::Logits,
            phase: Phase::Unknown,
            source: "coact tests".into(),
            extra: BTreeMap::new(),
        };
        TraceData::new(meta, tokens, k, OwnedParts { ids, ..Default::default() }).expect("a valid trace")
    }

    /// The pruned block search proposes exactly the top B by (score desc, id asc) with
    /// score > 0 of a brute-force ranking of every expert, for sets of chosen experts of every
    /// size, with ties (few calibration tokens), E not a multiple of 16 and budgets up to E.
    #[test]
    fn block_search_equals_brute_force() {
        let mut checked = 0;
        for (seed, e_n, k, tokens) in [(1, 5, 2, 7), (2, 16, 3, 40), (3, 33, 4, 25), (4, 70, 6, 60), (5, 64, 6, 3000)] {
            let calib = calibration(seed, e_n, k, tokens);
            let table = CoactTable::learn(&calib.view()).expect("validated");
            let mut rng = ChaCha8Rng::seed_from_u64(seed + 100);
            for _ in 0..150 {
                let n = rng.random_range(0..=(k + 2).min(e_n));
                let mut chosen: Vec<u16> = Vec::new();
                while chosen.len() < n {
                    let e = rng.random_range(0..e_n as u16);
                    if !chosen.contains(&e) {
                        chosen.push(e);
                    }
                }
                let mut ranked: Vec<(u64, u16)> = (0..e_n)
                    .map(|b| (chosen.iter().map(|&a| u64::from(table.get(1, a.into(), b))).sum(), b as u16))
                    .filter(|&(s, _)| s > 0)
                    .collect();
                ranked.sort_by(|x, y| y.0.cmp(&x.0).then(x.1.cmp(&y.1)));
                let k_used = n.max(1);
                let mut ids = chosen.clone();
                ids.resize(k_used, 0);
                let lens = [n as u16];
                for budget in [1, 2, 3, 7, 16, e_n] {
                    let prev = PrevChosen::Table { ids: &ids, lens: &lens, k_used };
                    let mut coact = Coact::new(table.layer(1), prev, budget);
                    let mut out = Vec::new();
                    coact.propose(0, &[], &mut out);
                    let want: Vec<u16> = ranked.iter().take(budget).map(|&(_, e)| e).collect();
                    assert_eq!(out, want, "E {e_n}, chosen {chosen:?}, B {budget}");
                    checked += usize::from(!want.is_empty());
                }
            }
        }
        assert!(checked > 3000, "{checked}");
    }
}
