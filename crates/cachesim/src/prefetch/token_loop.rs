//! The token loop of one layer with prefetch (SEMANTICS.md §12, then §5 steps 1-5).
//!
//! A separate loop from [`crate::engine::token_loop`], so that a replay without prefetch runs
//! that one unchanged. Per token: F (step 1), the predictor's proposals (pruned ids dropped),
//! their inserts (each an access for the policy; a victim is any cached expert that is not a
//! proposal of this token), selection (step 2, which sees the prefetched experts as resident),
//! counts (step 3), demand accesses with k-way protection (step 4), credits (step 5).
//!
//! Bookkeeping of §12: `tag[e]` is non-zero while expert e sits in the cache since a prefetch
//! and has not been accessed by demand: `(t' + 1) << 17 | i << 1 | counted`, the prefetch's
//! token, its index among that token's prefetch loads and whether it was made at a counted
//! token. A demand hit on a tagged expert is `useful` (when counted) and clears the tag; a demand
//! miss clears it too (the expert was evicted since, and a stale tag is overwritten by every
//! insert), so evictions need no bookkeeping. The largest tag among a token's demand hits is
//! the latest prefetch load the layer waits for on the timeline ([`crate::timeline`]).

use super::predict::Predict;
use crate::LayerCounts;
use crate::engine::token_loop::{extend_f, select_cache_aware};
use crate::engine::{Cache, Evictor, LayerInput, Params, Pick, Protected};
use crate::timeline::LayerEvent;

/// The counts of one layer's prefetch replay.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PfLayerCounts {
    pub(crate) base: LayerCounts,
    pub(crate) prefetch_loads: u64,
    pub(crate) useful: u64,
}

/// What one layer's replay writes besides its counts.
pub(crate) struct Outputs<'o> {
    /// Per token, the layer's loads for the timeline, `[T]`.
    pub(crate) events: Option<&'o mut [LayerEvent]>,
    /// Per token, the chosen experts `[T, k_used]` and their number `[T]` (coact of the next
    /// layer at λ > 0).
    pub(crate) chosen: Option<(&'o mut [u16], &'o mut [u16])>,
}

/// The token loop of one layer with policy `policy` and predictor `pred` (both monomorphized).
#[inline(never)]
pub(crate) fn run<P: Evictor, R: Predict>(
    params: &Params<'_>,
    input: &LayerInput<'_>,
    budget: usize,
    mut policy: P,
    mut pred: R,
    mut out: Outputs<'_>,
) -> PfLayerCounts {
    let (m, k, cap) = (params.m, params.k_used, params.cap);
    let mut cache: Cache<P::Key> = Cache::new(input.keep, P::SLOTS);
    let mut marks = vec![0u64; params.num_experts];
    let mut tag = vec![0u64; params.num_experts];
    let keep_all = input.keep.iter().all(|&kept| kept);
    let (mut f_ids, mut f_pos) = (vec![0u16; m], vec![0u16; m]);
    let mut chosen_buf: Vec<(u16, u32)> = Vec::with_capacity(k);
    let mut chosen_ids: Vec<u16> = Vec::with_capacity(k);
    let mut pending: Vec<u32> = Vec::with_capacity(m);
    let mut victims: Vec<u128> = Vec::with_capacity(k.max(budget));
    let mut proposals: Vec<u16> = Vec::with_capacity(budget);
    let mut counts = PfLayerCounts::default();
    let (mut now, mut ri) = (0u64, 0usize);
    let cache_aware = params.lambda > 0.0;
    let batch = P::BATCH && !params.sequential;
    let f_base = k.max(policy.f_needed()).min(m);

    for t in 0..params.tokens {
        if ri < params.resets.len() && params.resets[ri] == t as u64 {
            policy.reset(&mut cache);
            cache.clear();
            ri += 1;
        }
        let row = &input.ids[t * m..(t + 1) * m];
        let row_scores = input.scores.map(|s| &s[t * m..(t + 1) * m]);
        let counted = t >= params.warmup;

        // Step 1: F (its first f_base entries) and n.
        let (mut f_len, mut scanned) = (f_base, f_base);
        let mut pruned = 0;
        if !keep_all {
            (f_len, scanned) = (0, 0);
            extend_f(row, input.keep, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, f_base, m);
            pruned = row[..k].iter().filter(|&&e| !input.keep[usize::from(e)]).count();
        }
        let n = k.min(f_len);

        // Prefetch (SEMANTICS.md §12): proposals, pruned ones dropped; the non-resident ones
        // inserted in order, evicting only experts that are not proposals of this token.
        proposals.clear();
        pred.propose(t, if keep_all { &row[..n] } else { &f_ids[..n] }, &mut proposals);
        if !keep_all {
            proposals.retain(|&e| input.keep[usize::from(e)]);
        }
        let pf_stamp = 2 * t as u64 + 1;
        for &e in &proposals {
            marks[usize::from(e)] = pf_stamp;
        }
        let protected = Protected { marks: &marks, stamp: pf_stamp };
        if P::BATCH {
            let missing = proposals.iter().filter(|&&e| !cache.contains(usize::from(e))).count();
            let q = (cache.len + missing).saturating_sub(cap);
            if q > 0 {
                policy.victims(&cache, protected, q, &proposals, &mut victims);
                for &key in &victims {
                    let v = (key & 0xFFFF) as usize;
                    cache.remove(v);
                    policy.evicted(v, &cache);
                }
            }
        }
        let mut loads = 0u64;
        for &e in &proposals {
            let e = usize::from(e);
            if cache.contains(e) {
                continue;
            }
            now += 1;
            policy.step(Pick { e, now, t, i: loads as usize }, cap, protected, &mut cache);
            tag[e] = ((t as u64 + 1) << 17) | (loads << 1) | u64::from(counted);
            loads += 1;
        }

        // Step 2: selection; substituted = chosen experts outside the row's first k_used.
        let (chosen, substituted): (&[u16], usize) = match row_scores {
            Some(z) if cache_aware && n > 0 => {
                let pos = |r: usize| if keep_all { r } else { usize::from(f_pos[r]) };
                let z_last = f64::from(z[pos(n - 1)]);
                let bonus = if n <= 1 { 0.0 } else { params.lambda * (f64::from(z[pos(0)]) - z_last) };
                let mut end = pos(n - 1) + 1;
                while end < m && f64::from(z[end]) + bonus >= z_last {
                    end += 1;
                }
                let sel_len = if keep_all {
                    f_len = f_len.max(end);
                    end
                } else {
                    extend_f(row, input.keep, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, m, end);
                    f_pos[..f_len].partition_point(|&i| usize::from(i) < end)
                };
                chosen_buf.clear();
                if keep_all {
                    select_cache_aware(
                        &row[..sel_len],
                        |r| r,
                        z,
                        n,
                        bonus,
                        params.j,
                        &cache,
                        &mut pending,
                        &mut chosen_buf,
                    );
                } else {
                    select_cache_aware(
                        &f_ids[..sel_len],
                        |r| usize::from(f_pos[r]),
                        z,
                        n,
                        bonus,
                        params.j,
                        &cache,
                        &mut pending,
                        &mut chosen_buf,
                    );
                }
                chosen_ids.clear();
                chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
            }
            _ => {
                let f = if keep_all { &row[..n] } else { &f_ids[..n] };
                (f, n - (k - pruned))
            }
        };

        // Step 3: counts from token W on.
        if counted {
            let forced = (k - n) as u64;
            counts.base.picks += k as u64;
            counts.base.misses += forced;
            counts.base.forced_misses += forced;
            counts.base.substituted += substituted as u64;
            counts.base.pruned_slots += pruned as u64;
            counts.prefetch_loads += loads;
        }

        // Step 4: demand accesses.
        let stamp = 2 * t as u64 + 2;
        if !params.sequential {
            for &e in chosen {
                marks[usize::from(e)] = stamp;
            }
        }
        let protected = Protected { marks: &marks, stamp };
        if batch {
            let missing = chosen.iter().filter(|&&e| !cache.contains(usize::from(e))).count();
            let q = (cache.len + missing).saturating_sub(cap);
            if q > 0 {
                policy.victims(&cache, protected, q, chosen, &mut victims);
                for &key in &victims {
                    let v = (key & 0xFFFF) as usize;
                    cache.remove(v);
                    policy.evicted(v, &cache);
                }
            }
        }
        let (mut hits, mut useful, mut dep) = (0u64, 0u64, 0u64);
        for (i, &e) in chosen.iter().enumerate() {
            now += 1;
            let e = usize::from(e);
            let hit = policy.step(Pick { e, now, t, i }, cap, protected, &mut cache);
            let tg = tag[e];
            hits += u64::from(hit);
            useful += u64::from(hit) & tg;
            dep = dep.max(if hit { tg } else { 0 });
            tag[e] = 0;
        }
        let demand = chosen.len() as u64 - hits;
        if counted {
            counts.base.hits += hits;
            counts.base.misses += demand;
            counts.useful += useful;
        }
        if let Some(events) = out.events.as_deref_mut() {
            events[t] = LayerEvent { prefetch_loads: loads as u32, demand_loads: demand as u32, dep };
        }
        if let Some((ids, lens)) = out.chosen.as_mut() {
            ids[t * k..t * k + chosen.len()].copy_from_slice(chosen);
            lens[t] = chosen.len() as u16;
        }
        pred.observe(chosen);

        // Step 5: credits.
        let f = if keep_all { &row[..f_len] } else { &f_ids[..f_len] };
        policy.end_token(t, f, row, row_scores, &mut cache);
    }
    counts
}
