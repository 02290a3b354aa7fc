//! `coact`: a co-activation table learned from a calibration trace (SEMANTICS.md §12).
//!
//! `Q_l[a][b]` = the calibration tokens that chose a at the previous recorded layer and b at l
//! (a = b counted too); the score of b at (t, l) is Σ `Q_l[a][b]` over the experts a chosen at
//! (t, l − 1) in this replay; the proposals are the top B by (score desc, id asc) with
//! score > 0. The first recorded layer uses `prev_token` instead (chosen outside the loop).

use trace_io::TraceView;

use super::predict::Predict;
use crate::{CacheSimError, Result};

/// The co-activation counts of a calibration trace: `Q_l[a][b]` for every layer index l >= 1,
/// `[L, E, E]` u32 (layer 0's block is zero: it has no previous layer). Memory 4 · L · E² bytes
/// (425 KB for 26 layers of 64 experts, 50 MB for 48 layers of 512).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoactTable {
    layer_ids: Vec<u32>,
    num_experts: usize,
    q: Vec<u32>,
}

impl CoactTable {
    /// Learns Q from `calib`: a token "chooses" the first k ids of its row (the experts the
    /// model used, SEMANTICS.md §1, k = the calibration trace's top-k), and every token of the
    /// calibration trace counts.
    ///
    /// # Errors
    /// [`CacheSimError::NotValidated`] when `calib` was not validated for its first k ids
    /// (`trace_io::Reads::ids(k)`).
    pub fn learn(calib: &TraceView<'_>) -> Result<CoactTable> {
        let s = calib.shape();
        crate::require(calib, trace_io::Reads::ids(s.top_k))?;
        let (e_n, k, m) = (s.num_experts, s.top_k, s.candidates);
        let mut q = vec![0u32; s.layers * e_n * e_n];
        for l in 1..s.layers {
            let (prev, cur) = (calib.layer_ids(l - 1), calib.layer_ids(l));
            let block = &mut q[l * e_n * e_n..(l + 1) * e_n * e_n];
            for t in 0..s.tokens {
                for &a in &prev[t * m..t * m + k] {
                    let row = &mut block[usize::from(a) * e_n..(usize::from(a) + 1) * e_n];
                    for &b in &cur[t * m..t * m + k] {
                        row[usize::from(b)] += 1;
                    }
                }
            }
        }
        Ok(CoactTable { layer_ids: calib.meta().layer_ids.clone(), num_experts: e_n, q })
    }

    /// `Q_l[a][b]` (layer index `l`, experts `a` at l − 1 and `b` at l).
    pub fn get(&self, l: usize, a: usize, b: usize) -> u32 {
        let e_n = self.num_experts;
        self.q[(l * e_n + a) * e_n + b]
    }

    /// The recorded layer ids of the calibration trace.
    pub fn layer_ids(&self) -> &[u32] {
        &self.layer_ids
    }

    /// E of the calibration trace.
    pub fn num_experts(&self) -> usize {
        self.num_experts
    }

    /// Layer `l`'s block, `[E, E]`.
    pub(crate) fn layer(&self, l: usize) -> &[u32] {
        let e2 = self.num_experts * self.num_experts;
        &self.q[l * e2..(l + 1) * e2]
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
    /// Q_l, `[E, E]`.
    pub(crate) q: &'a [u32],
    pub(crate) num_experts: usize,
    pub(crate) prev: PrevChosen<'a>,
    pub(crate) budget: usize,
    /// Scores of the current token, `[E]`.
    pub(crate) scores: Vec<u32>,
    /// The best so far, (score desc, id asc), `[<= budget + 1]`.
    pub(crate) best: Vec<(u32, u16)>,
}

impl<'a> Coact<'a> {
    pub(crate) fn new(q: &'a [u32], num_experts: usize, prev: PrevChosen<'a>, budget: usize) -> Coact<'a> {
        Coact { q, num_experts, prev, budget, scores: vec![0; num_experts], best: Vec::with_capacity(budget + 1) }
    }
}

/// `scores[b] += row[b]` for every b. Over slices, so that it vectorizes.
#[inline(always)]
fn add_row(scores: &mut [u32], row: &[u32]) {
    for (s, &x) in scores.iter_mut().zip(row) {
        *s += x;
    }
}

impl Predict for Coact<'_> {
    #[inline(always)]
    fn propose(&mut self, t: usize, _oracle: &[u16], out: &mut Vec<u16>) {
        if self.budget == 0 {
            return;
        }
        let e_n = self.num_experts;
        self.scores.fill(0);
        let mut add = |a: u16| add_row(&mut self.scores, &self.q[usize::from(a) * e_n..(usize::from(a) + 1) * e_n]);
        match self.prev {
            PrevChosen::Trace { ids, m, keep, k_used } => {
                let row = &ids[t * m..(t + 1) * m];
                for &a in row.iter().filter(|&&a| keep[usize::from(a)]).take(k_used) {
                    add(a);
                }
            }
            PrevChosen::Table { ids, lens, k_used } => {
                for &a in &ids[t * k_used..t * k_used + usize::from(lens[t])] {
                    add(a);
                }
            }
        }
        // Top B by (score desc, id asc), score > 0: ids ascend, so an equal score never
        // displaces one already kept. `floor`: the score to beat (the B-th best once there are
        // B); blocks of 16 scores none of which beats it are skipped in one vector max.
        let b_n = self.budget;
        self.best.clear();
        let mut floor = 0u32;
        for (c, block) in self.scores.chunks(16).enumerate() {
            if block.iter().copied().max().unwrap_or(0) <= floor {
                continue;
            }
            for (i, &s) in block.iter().enumerate() {
                if s <= floor {
                    continue;
                }
                let at = self.best.partition_point(|&(x, _)| x >= s);
                self.best.insert(at, (s, (c * 16 + i) as u16));
                self.best.truncate(b_n);
                if self.best.len() == b_n {
                    floor = self.best[b_n - 1].0;
                }
            }
        }
        out.extend(self.best.iter().map(|&(_, e)| e));
    }
}
