//! belady's keys for the one-pass priority stack (`stack.rs`): OPT as Mattson's stack under
//! k-way residency. belady ranks an unprotected cached expert by its next use (SEMANTICS.md §5:
//! never first, then the farthest, ties to the lowest id), a priority that does not depend on
//! the cap.

use super::stack::StackKeys;

/// The next use of every expert, from a backward pass over the chosen sets.
pub(super) struct BeladyKeys {
    /// Next use of the i-th chosen expert of token t, at `t * k_used + i` (within the sequence
    /// when the caches reset): `tokens` = never.
    next_of: Vec<u32>,
    /// The next use of each expert as of the current token.
    next: Vec<u32>,
    k_used: usize,
}

impl BeladyKeys {
    /// The next uses of the chosen sets of `ids` (`[T, m]`) under `keep`, with the caches
    /// emptied at the tokens of `seq`.
    pub(super) fn new(ids: &[u16], keep: &[bool], m: usize, k_used: usize, seq: &[u64]) -> BeladyKeys {
        let tokens = ids.len() / m.max(1);
        let never = tokens as u32;
        let mut next_of = vec![never; tokens * k_used];
        let mut upcoming = vec![never; keep.len()];
        let mut ri = seq.len();
        for t in (0..tokens).rev() {
            let row = &ids[t * m..(t + 1) * m];
            for (i, e) in row.iter().copied().filter(|&e| keep[usize::from(e)]).take(k_used).enumerate() {
                next_of[t * k_used + i] = upcoming[usize::from(e)];
                upcoming[usize::from(e)] = t as u32;
            }
            if ri > 0 && seq[ri - 1] == t as u64 {
                upcoming.fill(never);
                ri -= 1;
            }
        }
        BeladyKeys { next_of, next: vec![never; keep.len()], k_used }
    }
}

impl StackKeys for BeladyKeys {
    fn start(&mut self, t: usize, f: &[u16]) {
        for (i, &e) in f.iter().enumerate() {
            self.next[usize::from(e)] = self.next_of[t * self.k_used + i];
        }
    }
    fn rank(&self, e: u16) -> u128 {
        // Kept first: the nearest next use, ties to the highest id (belady evicts the lowest).
        (u128::from(u32::MAX - self.next[usize::from(e)]) << 16) | u128::from(e)
    }
    fn finish(&mut self, _t: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>, _probs: Option<&[f64]>) {}
    fn reset(&mut self) {}
}
