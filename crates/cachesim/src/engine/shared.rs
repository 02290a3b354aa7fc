//! Work that depends only on the trace, not on the cache (SEMANTICS.md §5: such values may be
//! computed once and shared by every configuration that replays the trace): F tables, and the
//! scores of near_pick_ema and inv_router for configurations that differ only in cap, λ, j,
//! k_used or warmup.

use super::token_loop::{State, extend_f, run_tokens};
use super::{LayerInput, Params};
use crate::LayerCounts;
use crate::policy::{Decayed, ExpMemo, Tracked, softmax_row};

/// F of every row of one layer under one pruned keep set (SEMANTICS.md §5 step 1: the row's
/// kept candidates, in order, with their row positions), built once and read by every
/// configuration that prunes the layer with that set, instead of each building F along every
/// row. Memory: 4 bytes per recorded candidate plus 4 per token (`[T, m]` ids and positions,
/// `[T]` lengths), e.g. 32 MiB for 131,072 tokens of 64 candidates.
///
/// A table is rebuilt in place ([`FTable::rebuild`]) so that its buffers serve one layer after
/// another: allocating and freeing 32 MiB per layer and keep set cost the sweep millions of page
/// faults (its system time fell from 9.3 s to 0.6 s, docs/performance.md "Seventh round").
#[derive(Default)]
pub(crate) struct FTable {
    pub(crate) m: usize,
    pub(crate) ids: Vec<u16>,
    /// Row positions (< m <= 65,536).
    pub(crate) pos: Vec<u16>,
    pub(crate) len: Vec<u32>,
}

impl FTable {
    /// F of every row of `ids` (`[T, m]`) under `keep` (`[E]`), in this table's buffers (grown
    /// when too small, never shrunk). Entries past a row's length are left as they were: they
    /// are never read.
    pub fn rebuild(&mut self, ids: &[u16], keep: &[bool], m: usize) -> &FTable {
        let tokens = ids.len() / m.max(1);
        self.m = m;
        for buf in [&mut self.ids, &mut self.pos] {
            if buf.len() < tokens * m {
                buf.resize(tokens * m, 0);
            }
        }
        self.len.resize(tokens, 0);
        for (t, row) in ids.chunks_exact(m).enumerate() {
            let (mut f_len, mut scanned) = (0, 0);
            let (f_ids, f_pos) = (&mut self.ids[t * m..(t + 1) * m], &mut self.pos[t * m..(t + 1) * m]);
            extend_f(row, keep, f_ids, f_pos, &mut f_len, &mut scanned, m, m);
            self.len[t] = f_len as u32;
        }
        self
    }

    /// F of row `t`: its expert ids and their row positions, `[|F|]` each.
    #[inline(always)]
    pub(crate) fn row(&self, t: usize) -> (&[u16], &[u16]) {
        let (start, len) = (t * self.m, self.len[t] as usize);
        (&self.ids[start..start + len], &self.pos[start..start + len])
    }
}

/// The softmax of every row of one layer's scores (`[T, m]`), row after row: the credits of
/// `inv_router`, the same bits [`softmax_row`] gives inside the replay, so one table can serve
/// every `inv_router` configuration of a sweep.
pub(crate) fn softmax_layer(scores: &[f32], m: usize) -> Vec<f64> {
    let mut probs = vec![0.0; scores.len()];
    let mut memo = ExpMemo::new();
    for (z, out) in scores.chunks_exact(m).zip(probs.chunks_exact_mut(m)) {
        softmax_row(z, &mut memo, out);
    }
    probs
}

/// The scores of `near_pick_ema` or `inv_router` for every expert of one layer, token after
/// token. They do not depend on the cache (the credits come from F or from the row, never from
/// what is cached), so the configurations that differ only in cap, λ, j, k_used or warmup
/// share them: the track decays and credits once per token, in blocks of rows, and each
/// configuration ([`TrackedRun`]) reads its cached experts' scores from the rows in its victim
/// selection ([`Selector`]). The values are
/// those of [`Decayed`], bit for bit: the same operations in the same order (decays of the
/// experts a configuration prunes, and their credits, are never read).
pub(crate) struct TrackedScores<'a> {
    pub(crate) credit: TrackCredit<'a>,
    pub(crate) ids: &'a [u16],
    pub(crate) scores_z: Option<&'a [f32]>,
    pub(crate) m: usize,
    pub(crate) num_experts: usize,
    pub(crate) decay: f64,
    pub(crate) resets: &'a [u64],
    pub(crate) ri: usize,
    /// Row 0: the scores before the block's first token; row i + 1: after its token i. `[block
    /// + 1, E]`.
    pub(crate) rows: Vec<f64>,
    /// Tokens in the last block filled.
    pub(crate) filled: usize,
    /// inv_router: the softmax of the current row, `[m]`, and the `exp` memo.
    pub(crate) exps: Vec<f64>,
    pub(crate) memo: ExpMemo,
}

/// What [`TrackedScores`] credits after each token.
pub(crate) enum TrackCredit<'a> {
    /// near_pick_ema: 1 to each of the first `n` kept candidates (`keep`, `[E]`).
    Ema { n: usize, keep: &'a [bool] },
    /// inv_router: the softmax of the row's scores to each candidate.
    Router,
}

impl<'a> TrackedScores<'a> {
    /// A track over the layer of `params` and `input` (its ids, its scores for `inv_router`), `block`
    /// tokens at a time.
    pub fn new(
        params: &Params<'a>,
        input: &LayerInput<'a>,
        credit: TrackCredit<'a>,
        block: usize,
    ) -> TrackedScores<'a> {
        TrackedScores {
            credit,
            ids: input.ids,
            scores_z: input.scores,
            m: params.m,
            num_experts: params.num_experts,
            decay: params.decay,
            resets: params.resets,
            ri: 0,
            rows: vec![0.0; (block + 1) * params.num_experts],
            filled: 0,
            exps: vec![0.0; params.m],
            memo: ExpMemo::new(),
        }
    }

    /// Computes the rows of `tokens`: the block after the previous call's (the first from token
    /// 0), at most `block` tokens.
    pub fn fill(&mut self, tokens: std::ops::Range<usize>) -> TrackRows<'_> {
        let (m, width) = (self.m, self.num_experts);
        // The scores after the previous block are the ones before this one.
        self.rows.copy_within(self.filled * width..(self.filled + 1) * width, 0);
        let first = tokens.start;
        self.filled = tokens.len();
        for t in tokens {
            let i = t - first;
            let (done, rest) = self.rows.split_at_mut((i + 1) * width);
            let (prev, cur) = (&done[i * width..], &mut rest[..width]);
            if self.ri < self.resets.len() && self.resets[self.ri] == t as u64 {
                // Scores restart from 0 (whose decay is 0).
                cur.fill(0.0);
                self.ri += 1;
            } else {
                decay_into(prev, cur, self.decay);
            }
            let row = &self.ids[t * m..(t + 1) * m];
            match self.credit {
                TrackCredit::Ema { n, keep } => {
                    for &e in row.iter().filter(|&&e| keep[usize::from(e)]).take(n) {
                        cur[usize::from(e)] += 1.0;
                    }
                }
                TrackCredit::Router => {
                    if let Some(z) = self.scores_z {
                        softmax_row(&z[t * m..(t + 1) * m], &mut self.memo, &mut self.exps);
                        for (&e, &x) in row.iter().zip(&self.exps) {
                            cur[usize::from(e)] += x;
                        }
                    }
                }
            }
        }
        TrackRows { rows: &self.rows[..(self.filled + 1) * width], first, width }
    }
}

/// `dst[i] = src[i] * d`, in chunks the compiler vectorizes (each product rounded alone, as in
/// [`decay_all`]).
#[inline(never)]
pub(crate) fn decay_into(src: &[f64], dst: &mut [f64], d: f64) {
    let mut chunks = dst.chunks_exact_mut(8);
    let mut src_chunks = src.chunks_exact(8);
    for (o, i) in (&mut chunks).zip(&mut src_chunks) {
        for j in 0..8 {
            o[j] = i[j] * d;
        }
    }
    for (o, &i) in chunks.into_remainder().iter_mut().zip(src_chunks.remainder()) {
        *o = i * d;
    }
}

/// One configuration of `near_pick_ema` or `inv_router` replayed in steps, its scores from a
/// [`TrackedScores`] shared with others. k-way mode only: its victims are chosen together per
/// token ([`Evictor::victims`], which reads the track's rows); sequential mode chooses one per
/// miss ([`Evictor::victim`]), which scans `Cache::keys`, never written for a tracked policy.
pub(crate) struct TrackedRun<'a> {
    pub(crate) params: Params<'a>,
    pub(crate) input: LayerInput<'a>,
    pub(crate) state: State<Decayed<Tracked>>,
}

impl<'a> TrackedRun<'a> {
    pub fn new(params: Params<'a>, input: LayerInput<'a>) -> TrackedRun<'a> {
        debug_assert!(!params.sequential, "scores are shared in k-way mode only");
        let state = State::new(&params, &input, Decayed::new(&params, Tracked));
        TrackedRun { params, input, state }
    }

    /// Replays `rows`' tokens (the next ones).
    pub fn advance(self, rows: TrackRows<'_>) -> TrackedRun<'a> {
        let tokens = rows.first..rows.first + rows.len();
        let state = run_tokens(&self.params, &self.input, self.state, tokens, Some(rows));
        TrackedRun { state, ..self }
    }

    pub fn counts(&self) -> LayerCounts {
        self.state.counts
    }
}

/// Rows of a [`TrackedScores`]: the scores of every expert before token `first` and after each
/// token of a block `first..first + len`, `[len + 1, E]`.
#[derive(Clone, Copy)]
pub(crate) struct TrackRows<'a> {
    pub(crate) rows: &'a [f64],
    pub(crate) first: usize,
    pub(crate) width: usize,
}

impl<'a> TrackRows<'a> {
    /// How many tokens the rows cover.
    pub fn len(self) -> usize {
        (self.rows.len() / self.width.max(1)).saturating_sub(1)
    }

    /// The scores before token `t` (one of the block's), `[E]`.
    #[inline(always)]
    pub(crate) fn before(self, t: usize) -> &'a [f64] {
        let i = t - self.first;
        &self.rows[i * self.width..(i + 1) * self.width]
    }
}
