//! The engine steps of a replay (SEMANTICS.md §11): one token per step, a served trace's
//! `step_offsets`, or the re-batching of a trace's sequences by B slots.

use trace_io::TraceView;

use super::Schedule;

/// The rows of a replay in the order they are served, cut into steps.
pub(crate) struct StepPlan {
    /// Token index of each row position; `None` = trace order (position = token).
    pub order: Option<Vec<u32>>,
    /// First row position of each step, then the row count: `[steps + 1]`.
    pub starts: Vec<usize>,
}

impl StepPlan {
    /// The plan of `schedule` on `trace` (validated: the offsets it needs exist, B >= 1).
    pub fn new(trace: &TraceView<'_>, schedule: Schedule) -> StepPlan {
        let tokens = trace.shape().tokens;
        match schedule {
            Schedule::PerToken => StepPlan { order: None, starts: (0..=tokens).collect() },
            Schedule::Served => {
                let offs = trace.step_offsets().unwrap_or(&[0]);
                let mut starts: Vec<usize> = offs.iter().map(|&o| o as usize).collect();
                starts.push(tokens);
                StepPlan { order: None, starts }
            }
            Schedule::Rebatch(b) => {
                let (order, starts) = rebatch_order(trace.seq_offsets().unwrap_or(&[0]), tokens, b);
                StepPlan { order: Some(order), starts }
            }
        }
    }

    /// Number of steps.
    pub fn steps(&self) -> usize {
        self.starts.len() - 1
    }

    /// The token index of row position `p`.
    #[inline(always)]
    pub fn token(&self, p: usize) -> usize {
        self.order.as_ref().map_or(p, |o| o[p] as usize)
    }

    /// The counted (steps, rows): a step is counted when its first row position is >= W, and
    /// its rows with it.
    #[inline(always)]
    pub fn counted(&self, warmup: usize) -> (u64, u64) {
        let mut out = (0, 0);
        for s in 0..self.steps() {
            if self.starts[s] >= warmup {
                out.0 += 1;
                out.1 += (self.starts[s + 1] - self.starts[s]) as u64;
            }
        }
        out
    }
}

/// Re-batching (SEMANTICS.md §11): B slots take the sequences that start at `seq_offsets` (a
/// trace of `tokens` tokens) in trace order; each slot takes the next sequence at the step after
/// its own ends (slots freed at one step take sequences in slot order); step i holds the next
/// token of every active slot, slots in order.
///
/// Returns the token index of each row in served order (a permutation of `0..tokens`) and the
/// first row of each step followed by `tokens` (`[steps + 1]`). `seq_offsets` must start at 0
/// and increase strictly below `tokens` (trace-io checks it); `batch` >= 1. A `batch` above the
/// number of sequences gives the result of `batch` = sequences (the other slots never hold a
/// sequence), and allocates only that many slots: memory is O(tokens) whatever `batch`.
pub fn rebatch_order(seq_offsets: &[u64], tokens: usize, batch: usize) -> (Vec<u32>, Vec<usize>) {
    let mut bounds: Vec<usize> = seq_offsets.iter().map(|&o| o as usize).collect();
    bounds.push(tokens);
    let sequences: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
    let mut next_seq = 0;
    // (next token, end) of each slot's sequence; None = free.
    let mut slots: Vec<Option<(usize, usize)>> = vec![None; batch.clamp(1, sequences.len().max(1))];
    for slot in slots.iter_mut() {
        if next_seq < sequences.len() {
            *slot = Some(sequences[next_seq]);
            next_seq += 1;
        }
    }
    let mut order = Vec::with_capacity(tokens);
    let mut starts = Vec::new();
    while slots.iter().any(Option::is_some) {
        starts.push(order.len());
        for slot in slots.iter_mut() {
            if let Some((cur, end)) = *slot {
                order.push(cur as u32);
                *slot = if cur + 1 < end { Some((cur + 1, end)) } else { None };
            }
        }
        for slot in slots.iter_mut() {
            if slot.is_none() && next_seq < sequences.len() {
                *slot = Some(sequences[next_seq]);
                next_seq += 1;
            }
        }
    }
    starts.push(order.len());
    (order, starts)
}

#[cfg(test)]
mod tests {
    use super::rebatch_order;

    /// Sequences 0..3, 3..4, 4..6, 6..7 (lengths 3, 1, 2, 1).
    #[test]
    fn rebatch_by_hand() {
        let offs = [0, 3, 4, 6];
        // B = 1: trace order, one row per step.
        assert_eq!(rebatch_order(&offs, 7, 1), ((0..7).collect(), (0..=7).collect()));
        // B = 2: step 0 = [0, 3]; seq 1 ends at step 0, slot 1 takes seq 2 at step 1:
        // step 1 = [1, 4], step 2 = [2, 5]; both end at step 2, slot 0 takes seq 3: step 3 = [6].
        assert_eq!(rebatch_order(&offs, 7, 2), (vec![0, 3, 1, 4, 2, 5, 6], vec![0, 2, 4, 6, 7]));
        // B larger than the sequences: all start at once.
        assert_eq!(rebatch_order(&offs, 7, 8), (vec![0, 3, 4, 6, 1, 5, 2], vec![0, 4, 6, 7]));
    }

    /// B far above the number of sequences is B = sequences, and allocates no slot per B
    /// (a `batch` of `usize::MAX` slots cannot be allocated at all).
    #[test]
    fn rebatch_huge_batch_is_batch_of_sequences() {
        let offs = [0, 3, 4, 6];
        let four = rebatch_order(&offs, 7, 4);
        for b in [5, 1_000_000_000, usize::MAX] {
            assert_eq!(rebatch_order(&offs, 7, b), four, "batch {b}");
        }
    }
}
