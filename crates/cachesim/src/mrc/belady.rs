//! belady's curve of every cap in one pass: OPT as a priority stack under k-way residency.
//!
//! # Why one pass is exact
//! belady ranks an unprotected cached expert by its next use (SEMANTICS.md §5: never first, then
//! the farthest, ties to the lowest id), a priority that does not depend on the cap. Mattson et
//! al. (1970) show that such a priority algorithm has the inclusion property for one request at a
//! time; it holds for a token's k-way set F too. Suppose that before token t the cache of every
//! cap C >= k_used holds the top C experts of a stack S (true at the start and after a reset: all
//! empty). At cap C the token keeps F and, of the others `A_C = S[..C] \ F`, the
//! `C - |F|` of nearest next use: `top(A_C)`; the misses evict the rest. Going from C to C + 1
//! adds at most one expert to `A` and one slot, so `top(A_{C+1})` holds `top(A_C)` plus one
//! expert: the caps' contents are again the prefixes of one stack, F first, then the expert each
//! extra slot adds. A pick hits at cap C exactly when its depth in the stack before the token is
//! below C, and the curve is one histogram of depths, as for LRU.
//!
//! The update walks the old stack down from the top with the few experts not yet placed (at most
//! |F| + 1: those `top` left out so far) and places the one of nearest next use at each slot. Once
//! every expert of F has been passed and none is left out, the rest of the stack is unchanged: a
//! token costs O(d · k) for d the depth of its deepest pick (the whole stack when a pick is a first
//! use, which leaves an expert out all the way down).

use super::DepthHistogram;

/// The depth histogram of belady at λ = 0 under k-way residency: for each counted pick of F (the
/// first `k_used` kept candidates of a row), its depth in the priority stack before the token.
/// `seq`: the tokens at which the caches are emptied (and next uses end), empty without resets.
pub(super) fn belady_depths(
    ids: &[u16],
    keep: &[bool],
    m: usize,
    k_used: usize,
    warmup: usize,
    seq: &[u64],
) -> DepthHistogram {
    let tokens = ids.len() / m.max(1);
    let e_n = keep.len();
    fn chosen<'a>(row: &'a [u16], keep: &'a [bool], k_used: usize) -> impl Iterator<Item = u16> + 'a {
        row.iter().copied().filter(|&e| keep[usize::from(e)]).take(k_used)
    }
    // Next use of the i-th chosen expert of token t (within the sequence with resets): T = never.
    let never = tokens as u32;
    let mut next_of = vec![never; tokens * k_used];
    let mut upcoming = vec![never; e_n];
    let mut ri = seq.len();
    for t in (0..tokens).rev() {
        for (i, e) in chosen(&ids[t * m..(t + 1) * m], keep, k_used).enumerate() {
            next_of[t * k_used + i] = upcoming[usize::from(e)];
            upcoming[usize::from(e)] = t as u32;
        }
        if ri > 0 && seq[ri - 1] == t as u64 {
            upcoming.fill(never);
            ri -= 1;
        }
    }

    const ABSENT: u32 = u32::MAX;
    let mut hist = DepthHistogram { depth: vec![0; e_n], cold: 0, forced: 0 };
    let mut stack: Vec<u16> = Vec::with_capacity(e_n);
    let mut pos = vec![ABSENT; e_n];
    let mut next = vec![never; e_n];
    let mut in_f = vec![false; e_n];
    let mut f: Vec<u16> = Vec::with_capacity(k_used);
    // The experts passed but not yet placed (at most |F| + 1), and the ones placed after F.
    let mut out: Vec<u16> = Vec::with_capacity(k_used + 1);
    let mut scratch: Vec<u16> = Vec::with_capacity(e_n);
    let mut next_seq = 0;
    // Kept first: the nearest next use, ties to the highest id (belady evicts the lowest first).
    let rank = |next: &[u32], e: u16| (next[usize::from(e)], std::cmp::Reverse(e));
    for (t, row) in ids.chunks_exact(m).enumerate() {
        if next_seq < seq.len() && seq[next_seq] == t as u64 {
            next_seq += 1;
            for &e in &stack {
                pos[usize::from(e)] = ABSENT;
            }
            stack.clear();
        }
        f.clear();
        f.extend(chosen(row, keep, k_used));
        let counted = t >= warmup;
        if counted {
            hist.forced += (k_used - f.len()) as u64;
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
        for (i, &e) in f.iter().enumerate() {
            next[usize::from(e)] = next_of[t * k_used + i];
        }
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
                out.push(x);
            }
            if p > fl {
                // One more slot: the left-out expert of nearest next use takes it.
                let best = (0..out.len()).min_by_key(|&j| rank(&next, out[j])).expect("an expert for each slot");
                scratch.push(out.swap_remove(best));
            }
        }
        // Past the old stack: the experts left out go below, nearest next use first. Otherwise
        // the prefix written is as long as the walk, and the stack below it is unchanged.
        out.sort_unstable_by_key(|&e| rank(&next, e));
        let written = scratch.len();
        let new_prefix = fl + written + out.len();
        if new_prefix > stack.len() {
            stack.resize(new_prefix, 0);
        }
        let (head, rest) = stack.split_at_mut(fl);
        head.copy_from_slice(&f);
        rest[..written].copy_from_slice(&scratch);
        rest[written..written + out.len()].copy_from_slice(&out);
        for (i, &e) in stack[..new_prefix].iter().enumerate() {
            pos[usize::from(e)] = i as u32;
        }
        for &e in &f {
            in_f[usize::from(e)] = false;
        }
    }
    hist
}
