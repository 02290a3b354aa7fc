//! Work that depends only on the trace, not on the cache (SEMANTICS.md §5: such values may be
//! computed once and shared by every configuration that replays the trace): F tables and
//! softmax tables.

use super::step_loop::extend_f;
use crate::policy::softmax_row;

/// F of every row of one layer under one pruned keep set (SEMANTICS.md §5 step 1: the row's
/// kept candidates, in order, with their row positions), built once and read by every
/// configuration that prunes the layer with that set, instead of each building F along every
/// row. Memory: 4 bytes per recorded candidate plus 4 per token (`[T, m]` ids and positions,
/// `[T]` lengths), e.g. 32 MiB for 131,072 tokens of 64 candidates.
///
/// A table is rebuilt in place ([`FTable::rebuild`]) so that its buffers serve one layer after
/// another: allocating and freeing 32 MiB per layer and keep set cost the sweep millions of page
/// faults (its system time fell from 9.3 s to 0.6 s, the "Seventh round" of docs/performance.md at 29c2d74).
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
    for (z, out) in scores.chunks_exact(m).zip(probs.chunks_exact_mut(m)) {
        softmax_row(z, out);
    }
    probs
}
