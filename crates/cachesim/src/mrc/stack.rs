//! The one-pass priority stack under k-way residency, for any policy whose priorities do not
//! depend on the cap (belady, near_pick, near_pick_ema, inv_router at λ = 0).
//!
//! # Why one pass is exact
//! Such a policy evicts, among the cached experts outside the token's chosen set F, the one of
//! lowest priority (SEMANTICS.md §5 step 4), where the priority of every expert at token t is a
//! function of the trace alone: belady's next use; near_pick's last near-pick token and last
//! access; the lazy scores S of near_pick_ema and inv_router, credited to every expert whether
//! cached or not, and their last access. At λ = 0 the chosen experts (F's first k_used) and so
//! every access time are the trace's too. Mattson et al. (1970) show that a priority algorithm
//! with such priorities has the inclusion property for one request at a time; it holds for a
//! token's k-way set as well. Suppose that before token t the cache of every cap C >= k_used
//! holds the top C experts of a stack S (true at the start and after a reset: all empty). The
//! priorities do not change inside a token, so at cap C the token keeps F and, of the others
//! `A_C = S[..C] \ F`, the `C - |F|` of highest priority, `top(A_C)`; its misses evict the rest.
//! Going from C to C + 1 adds at most one expert to `A` and one slot, so `top(A_{C+1})` holds
//! `top(A_C)` plus one expert: the caps' contents are again the prefixes of one stack, F first,
//! then the expert each extra slot adds. A pick hits at cap C exactly when its depth in the stack
//! before the token is below C, and the curve is one histogram of depths, as for LRU.
//!
//! The update walks the old stack down from the top with the few experts not yet placed (at most
//! |F| + 1: those `top` left out so far) and places the one of highest priority at each slot. Once
//! every expert of F has been passed and none is left out, the rest of the stack is unchanged: a
//! token costs O(d · k) for d the depth of its deepest pick (the whole stack when a pick is a first
//! use, which leaves an expert out all the way down). Slot i of the new stack depends only on the
//! old stack's first i + 1 experts and F, so a stack cut at depth D gives the exact curve of every
//! cap up to D (deeper picks miss at all of them, as first uses do).

use super::DepthHistogram;

/// The priorities a [`stack_depths`] pass compares: one policy's keys over the trace.
pub(super) trait StackKeys {
    /// Token `t` is about to be placed with its chosen set `f` (F's first k_used, in pick order):
    /// set what the comparisons of this token and later ones need to know about `f`.
    fn start(&mut self, t: usize, f: &[u16]);
    /// The rank of expert `e` outside the token's chosen set, for this token: of two experts the
    /// one of lower rank is evicted first. Distinct experts have distinct ranks (ties of the
    /// priority end at the expert id, in the low 16 bits: the lowest id is evicted first).
    fn rank(&self, e: u16) -> u128;
    /// After token `t` (step 5): the credits of its row (`row`, its `scores` and their softmax
    /// `probs` when known; `f` its chosen set) and the access times of `f`.
    fn finish(&mut self, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, probs: Option<&[f64]>);
    /// The caches are emptied at a sequence start: credits and times start again.
    fn reset(&mut self);
}

/// One layer's rows as a stack pass reads them.
pub(super) struct LayerRows<'a> {
    /// Candidate ids, `[T, m]` row-major.
    pub ids: &'a [u16],
    /// Router scores, `[T, m]`, when the keys read them (inv_router).
    pub scores: Option<&'a [f32]>,
    /// The softmax of every row, `[T, m]`, when a caller has it (inv_router; else computed
    /// from `scores` row by row, the same bits).
    pub probs: Option<&'a [f64]>,
    /// The layer's keep set, `[E]`.
    pub keep: &'a [bool],
    /// Candidates per row.
    pub m: usize,
    /// Experts used per token.
    pub k_used: usize,
    /// Tokens replayed but not counted.
    pub warmup: usize,
    /// Tokens at which the caches are emptied (sorted), empty without resets.
    pub seq: &'a [u64],
}

/// The depth histogram of the priority stack of `keys` over `rows`, cut at depth `max_depth`
/// (>= k_used; picks deeper than that are counted as first uses): for each counted pick of F,
/// its depth in the stack before the token. Also counts the forced misses and, at λ = 0, the
/// substituted picks and pruned slots of §5 step 3.
pub(super) fn stack_depths<K: StackKeys>(rows: &LayerRows<'_>, max_depth: usize, keys: &mut K) -> DepthHistogram {
    let LayerRows { ids, scores, probs, keep, m, k_used, warmup, seq } = *rows;
    let e_n = keep.len();
    let max_depth = max_depth.clamp(k_used, e_n.max(k_used));
    const ABSENT: u32 = u32::MAX;
    let mut hist = DepthHistogram::new(e_n);
    let mut stack: Vec<u16> = Vec::with_capacity(max_depth + k_used);
    let mut pos = vec![ABSENT; e_n];
    let mut in_f = vec![false; e_n];
    let mut f: Vec<u16> = Vec::with_capacity(k_used);
    // The experts passed but not yet placed (at most |F| + 1) with their ranks, and the ones
    // placed after F.
    let mut out: Vec<(u128, u16)> = Vec::with_capacity(k_used + 1);
    let mut scratch: Vec<u16> = Vec::with_capacity(e_n);
    let mut next_seq = 0;
    for (t, row) in ids.chunks_exact(m).enumerate() {
        if next_seq < seq.len() && seq[next_seq] == t as u64 {
            next_seq += 1;
            for &e in &stack {
                pos[usize::from(e)] = ABSENT;
            }
            stack.clear();
            keys.reset();
        }
        f.clear();
        f.extend(row.iter().copied().filter(|&e| keep[usize::from(e)]).take(k_used));
        let counted = t >= warmup;
        if counted {
            hist.count_row(row, &f, keep, k_used);
        }
        // Depths before the token; the walk must pass the deepest pick.
        let mut limit = f.len();
        for &e in &f {
            in_f[usize::from(e)] = true;
            match pos[usize::from(e)] {
                ABSENT if counted => hist.cold += 1,
                ABSENT => {}
                d => {
                    if counted {
                        hist.depth[d as usize] += 1;
                    }
                    limit = limit.max(d as usize + 1);
                }
            }
        }
        keys.start(t, &f);
        // The new stack's prefix: F, then one expert per slot from those not yet placed.
        let fl = f.len();
        out.clear();
        // Placed experts go to `scratch` first: the walk still reads `stack`.
        scratch.clear();
        let mut p = 0;
        let old_len = stack.len();
        while p < old_len && (p < limit || !out.is_empty()) {
            let x = stack[p];
            p += 1;
            if !in_f[usize::from(x)] {
                out.push((keys.rank(x), x));
            }
            if p > fl {
                // One more slot: the left-out expert of highest rank takes it.
                let mut best = 0;
                for j in 1..out.len() {
                    if out[j].0 > out[best].0 {
                        best = j;
                    }
                }
                scratch.push(out.swap_remove(best).1);
            }
        }
        // Past the old stack: the experts left out go below, highest priority first. Otherwise
        // the prefix written is as long as the walk, and the stack below it is unchanged.
        out.sort_unstable_by_key(|&(rank, _)| std::cmp::Reverse(rank));
        let written = scratch.len();
        let new_prefix = fl + written + out.len();
        if new_prefix > stack.len() {
            stack.resize(new_prefix, 0);
        }
        let (head, rest) = stack.split_at_mut(fl);
        head.copy_from_slice(&f);
        rest[..written].copy_from_slice(&scratch);
        for (slot, &(_, e)) in rest[written..].iter_mut().zip(&out) {
            *slot = e;
        }
        // Below the cut the stack is not kept: those experts are absent at every cap <= D.
        for &e in stack.iter().skip(max_depth) {
            pos[usize::from(e)] = ABSENT;
        }
        stack.truncate(max_depth);
        for (i, &e) in stack[..new_prefix.min(max_depth)].iter().enumerate() {
            pos[usize::from(e)] = i as u32;
        }
        for &e in &f {
            in_f[usize::from(e)] = false;
        }
        let span = t * m..(t + 1) * m;
        keys.finish(t, &f, row, scores.map(|z| &z[span.clone()]), probs.map(|p| &p[span]));
    }
    hist
}

#[cfg(test)]
mod tests {
    use crate::mrc::Stacked;
    use crate::{OnePass, Policy};

    /// The facts of a policy and the stacks agree: a policy whose facts say [`OnePass::Stack`]
    /// has keys ([`Stacked::of`]), and the keys give back their policy.
    #[test]
    fn every_stack_policy_has_keys() {
        for policy in Policy::ALL {
            let stacked = Stacked::of(policy);
            assert_eq!(stacked.is_some(), matches!(policy.facts().curve, OnePass::Stack { .. }), "{policy}");
            assert!(stacked.is_none_or(|s| s.policy() == policy), "{policy}");
        }
    }
}
