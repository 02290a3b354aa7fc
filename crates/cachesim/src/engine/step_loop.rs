//! The one step loop of one layer: SEMANTICS.md §5 steps 1-5, where each row is a step of its
//! own ([`PerToken`]), and §11 steps 1-4, where a deployment's schedule groups rows into steps
//! and its tiers ([`Steps`], `crate::deploy`) take each step's set through the cache.
//!
//! With a full keep set F is the row itself (no copy); with a pruned one F is built along the
//! row without a branch on the keep mask, or read from an [`FTable`](super::FTable) built once
//! for the configurations that share the keep set. At λ = 0 the chosen experts are F's prefix
//! and the counts of step 3 need no per-slot work; at λ > 0 F is read only up to the cut past
//! which no candidate can be chosen (its score plus the bonus below z(F[n−1])), and one pass
//! over it merges the boosted and the plain candidates and stops once n are chosen. The
//! per-token helpers run out of line (inlined into the token loop, their pointers were spilled
//! and reloaded for every candidate).

use super::{Cache, Evictor, LayerInput, Params, Pick, Protected};
use crate::LayerCounts;

/// The whole token loop of one layer with policy `policy`.
pub(crate) fn run<P: Evictor>(params: &Params<'_>, input: &LayerInput<'_>, policy: P) -> LayerCounts {
    run_rows(params, input, State::new(params, input, policy), 0..params.tokens, &mut PerToken, &mut ()).counts
}

/// How the rows of a replay are grouped into steps, and where a step goes through the cache.
/// Chosen outside the loop and monomorphized: [`PerToken`] (every row a step, through the loop's
/// own policy and cache: the §5 loop) or a deployment's tiers (`crate::deploy`: rows in the
/// schedule's order, steps of several rows, pins, tier 1 and the record for tier 2, §9-§11).
pub(crate) trait Steps {
    /// Whether the schedule's residency takes the steps (then the loop's policy is [`ByStep`]
    /// and its cache stays empty); false: the loop's policy and cache do (§5 step 4).
    const STEPS: bool;
    /// The token (trace row) of row position `p`.
    fn token(&self, p: usize) -> usize;
    /// Whether row position `p` is counted: its step starts at a row position >= `warmup`.
    fn counted(&self, p: usize, warmup: usize) -> bool;
    /// Before the selection of row position `p`: begins its step when it is the step's first.
    #[inline(always)]
    fn begin_row(&mut self, _p: usize) {}
    /// Whether expert `e` is resident for cache-aware selection (with `STEPS` only: pinned, or
    /// in tier 1 at the start of the step).
    #[inline(always)]
    fn resident(&self, _e: usize) -> bool {
        false
    }
    /// With `STEPS`, after the selection of row position `p` (`chosen` in processing order;
    /// `counted` as [`Steps::counted`] said): gathers them; after the step's last row, takes the
    /// step through the tiers (§11 steps 2-4) and, when counted, adds its hits and misses to
    /// `counts`.
    #[inline(always)]
    fn chosen(&mut self, _p: usize, _chosen: &[u16], _counted: bool, _counts: &mut LayerCounts) {}
}

/// The plain schedule of SEMANTICS.md §5: row position = token, each a step of its own through
/// the loop's policy and cache.
pub(crate) struct PerToken;

impl Steps for PerToken {
    const STEPS: bool = false;
    #[inline(always)]
    fn token(&self, p: usize) -> usize {
        p
    }
    #[inline(always)]
    fn counted(&self, p: usize, warmup: usize) -> bool {
        p >= warmup
    }
}

/// The loop's policy when a [`Steps`] residency takes the steps: it keeps no state and is never
/// asked for a victim (its cache stays empty, and [`run_rows`] refuses at build time to pair a
/// residency with a prefetch hook, the one other path to a victim; the loop reads F only as far
/// as selection does).
pub(crate) struct ByStep;

impl Evictor for ByStep {
    type Key = ();
    fn reset(&mut self, _cache: &mut Cache<()>) {}
    fn access(&mut self, _pick: Pick, _inserted: bool, _cache: &mut Cache<()>) {}
    fn victim(&mut self, _cache: &Cache<()>, _protected: Protected<'_>) -> usize {
        unreachable!("the loop's own cache is not used when the steps' residency takes the steps")
    }
}

/// The parts of a replay beyond SEMANTICS.md §5 that the one token loop is built with, chosen
/// outside the loop and monomorphized: prefetch (§12: proposals inserted before selection, the
/// bookkeeping of useful loads, the timeline's events; `crate::prefetch`) and the execution
/// model's record of each token (§14, [`crate::hybrid::LayerEvents`]). The plain replay's hook is
/// `()`: every method is empty and [`TokenHook::PREFETCH`] is false, so its loop compiles to the
/// §5 loop alone.
pub(crate) trait TokenHook {
    /// Whether the loop has the prefetch step (proposals, their inserts, their stamps).
    const PREFETCH: bool = false;
    /// Appends the proposals for token `t` to `out` (empty on entry; at most the budget,
    /// distinct ids `< E`); `oracle` is F[0..n] of the token (only the oracle may read it).
    #[inline(always)]
    fn propose(&mut self, _t: usize, _oracle: &[u16], _out: &mut Vec<u16>) {}
    /// Expert `e` was inserted by the `i`-th prefetch load of token `t`; `counted`: t >= W.
    #[inline(always)]
    fn prefetched(&mut self, _e: usize, _t: usize, _i: u64, _counted: bool) {}
    /// A demand access of expert `e` (step 4), a hit or not.
    #[inline(always)]
    fn demand(&mut self, _e: usize, _hit: bool) {}
    /// After token `t` (every token, counted or not): its chosen experts (in processing order),
    /// its misses that are not forced, and its prefetch loads.
    fn token(&mut self, t: usize, chosen: &[u16], misses: u32, loads: u32, counted: bool);
}

impl TokenHook for () {
    #[inline(always)]
    fn token(&mut self, _t: usize, _chosen: &[u16], _misses: u32, _loads: u32, _counted: bool) {}
}

/// Everything one layer's replay carries from token to token: the policy, the cache, the
/// buffers of the token loop (allocated once) and the counts so far.
pub(crate) struct State<P: Evictor> {
    pub(crate) policy: P,
    pub(crate) cache: Cache<P::Key>,
    /// `chosen_marks[e] == t + 1`: e is chosen for token t (k-way protection); never written in
    /// sequential mode. With prefetch, `2t + 1`: e is a proposal of token t (written in both
    /// modes), `2t + 2`: chosen. `[E]`.
    pub(crate) chosen_marks: Vec<u64>,
    /// With a full keep set F is the row itself; otherwise F (expert, position in the row) is
    /// built along the row in `f_ids`, `f_pos` (`[m]`), only as far as steps 2 and 5 read it.
    pub(crate) keep_all: bool,
    pub(crate) f_ids: Vec<u16>,
    pub(crate) f_pos: Vec<u16>,
    /// λ > 0: chosen (expert, position in the row) in processing order, and the merge's queue.
    pub(crate) chosen_buf: Vec<(u16, u32)>,
    pub(crate) chosen_ids: Vec<u16>,
    pub(crate) pending: Vec<u32>,
    /// A token's victims (at most one per miss or prefetch load: `<= max(k_used, budget)`).
    pub(crate) victims: Vec<u128>,
    /// A token's prefetch proposals (`<= budget`; empty without prefetch).
    pub(crate) proposals: Vec<u16>,
    pub(crate) counts: LayerCounts,
    /// The pick clock.
    pub(crate) now: u64,
    /// The next entry of `Params::resets`.
    pub(crate) ri: usize,
}

impl<P: Evictor> State<P> {
    pub(crate) fn new(params: &Params<'_>, input: &LayerInput<'_>, policy: P) -> State<P> {
        State::with_budget(params, input, policy, 0)
    }

    /// The state of a replay with prefetch of up to `budget` loads per token.
    pub(crate) fn with_budget(params: &Params<'_>, input: &LayerInput<'_>, policy: P, budget: usize) -> State<P> {
        let (m, k) = (params.m, params.k_used);
        State {
            policy,
            cache: Cache::new(input.keep, P::SLOTS),
            chosen_marks: vec![0; params.num_experts],
            keep_all: input.keep.iter().all(|&kept| kept),
            f_ids: vec![0; m],
            f_pos: vec![0; m],
            chosen_buf: Vec::with_capacity(k),
            chosen_ids: Vec::with_capacity(k),
            pending: Vec::with_capacity(m),
            victims: Vec::with_capacity(k.max(budget)),
            proposals: Vec::with_capacity(budget),
            counts: LayerCounts::default(),
            now: 0,
            ri: 0,
        }
    }
}

/// The step loop of one layer over the row positions `rows` of `steps`' schedule, from `state`
/// (moved in and out: inside, its parts are locals the compiler keeps apart): SEMANTICS.md §5
/// steps 1-5 with [`PerToken`] (rows = tokens), §11 steps 1-4 with a deployment's tiers (which
/// must be given every row position, in order). Resumable with [`PerToken`]: a caller may replay
/// a trace's tokens in several ranges, in order.
#[inline(never)]
pub(crate) fn run_rows<P: Evictor, S: Steps, H: TokenHook>(
    params: &Params<'_>,
    input: &LayerInput<'_>,
    state: State<P>,
    rows: std::ops::Range<usize>,
    steps: &mut S,
    hook: &mut H,
) -> State<P> {
    // §12's prefetch step is per token, through the loop's own cache: a deployment's tiers take
    // the steps without it (paired, a proposal would reach `ByStep::victim`). Refused when built.
    const { assert!(!(S::STEPS && H::PREFETCH), "prefetch runs per token, not with a deployment's tiers") };
    let (m, k, cap) = (params.m, params.k_used, params.cap);
    let State {
        mut policy,
        mut cache,
        mut chosen_marks,
        keep_all,
        mut f_ids,
        mut f_pos,
        mut chosen_buf,
        mut chosen_ids,
        mut pending,
        mut victims,
        mut proposals,
        mut counts,
        mut now,
        mut ri,
    } = state;
    let cache_aware = params.lambda > 0.0;
    let batch = P::BATCH && !params.sequential;
    // The part of F that the λ = 0 selection and the credits read.
    let f_base = k.max(policy.f_needed()).min(m);

    for p in rows {
        let t = steps.token(p);
        steps.begin_row(p);
        if ri < params.resets.len() && params.resets[ri] == t as u64 {
            policy.reset(&mut cache);
            cache.clear();
            ri += 1;
        }
        let row = &input.ids[t * m..(t + 1) * m];
        let row_scores = input.scores.map(|s| &s[t * m..(t + 1) * m]);

        // Step 1: F (its first f_base entries) and n; pruned slots (of the row's first k_used
        // ids, the ones not kept). `scanned`: row positions examined so far.
        // With an F table, F is its row, whole.
        let (mut f_len, mut scanned) = (f_base, f_base);
        let mut pruned = 0;
        let table_f = input.f_table.map(|ft| ft.row(t));
        if !keep_all {
            if let Some((ids, _)) = table_f {
                f_len = ids.len();
            } else {
                (f_len, scanned) = (0, 0);
                extend_f(row, input.keep, &mut f_ids, &mut f_pos, &mut f_len, &mut scanned, f_base, m);
            }
            pruned = row[..k].iter().filter(|&&e| !input.keep[usize::from(e)]).count();
        }
        let n = k.min(f_len);

        // Prefetch (SEMANTICS.md §12): proposals, pruned ones dropped; the non-resident ones
        // inserted in order, evicting only experts that are not proposals of this token.
        let mut loads = 0u64;
        if H::PREFETCH {
            proposals.clear();
            let oracle = if keep_all { &row[..n] } else { &table_f.map_or(&f_ids[..], |t| t.0)[..n] };
            hook.propose(t, oracle, &mut proposals);
            if !keep_all {
                proposals.retain(|&e| input.keep[usize::from(e)]);
            }
            let pf_stamp = 2 * t as u64 + 1;
            for &e in &proposals {
                chosen_marks[usize::from(e)] = pf_stamp;
            }
            let protected = Protected { marks: &chosen_marks, stamp: pf_stamp };
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
            for &e in &proposals {
                let e = usize::from(e);
                if cache.contains(e) {
                    continue;
                }
                now += 1;
                policy.step(Pick { e, now, t, i: loads as usize, demand: false }, cap, protected, &mut cache);
                hook.prefetched(e, t, loads, t >= params.warmup);
                loads += 1;
            }
        }

        // Step 2: selection; substituted = chosen experts outside the row's first k_used.
        let (chosen, substituted): (&[u16], usize) = match row_scores {
            Some(z) if cache_aware && n > 0 => {
                let pos = |r: usize| if keep_all { r } else { usize::from(table_f.map_or(&f_pos[..], |t| t.1)[r]) };
                // Only row positions before `end` can be chosen: a candidate at rank >= n whose
                // score plus the bonus stays below z(F[n-1]) is beaten by all of F[0..n] (and
                // scores are non-increasing along the row, so all later ones are too).
                let z_last = f64::from(z[pos(n - 1)]);
                let bonus = if n <= 1 { 0.0 } else { params.lambda * (f64::from(z[pos(0)]) - z_last) };
                let mut end = pos(n - 1) + 1;
                while end < m && f64::from(z[end]) + bonus >= z_last {
                    end += 1;
                }
                let sel_len = if keep_all {
                    f_len = f_len.max(end);
                    end
                } else if let Some((_, table_pos)) = table_f {
                    table_pos.partition_point(|&i| usize::from(i) < end)
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
                        |e| if S::STEPS { steps.resident(e) } else { cache.contains(e) },
                        &mut pending,
                        &mut chosen_buf,
                    );
                } else {
                    let (fi, fp): (&[u16], &[u16]) = table_f.unwrap_or((&f_ids, &f_pos));
                    select_cache_aware(
                        &fi[..sel_len],
                        |r| usize::from(fp[r]),
                        z,
                        n,
                        bonus,
                        params.j,
                        |e| if S::STEPS { steps.resident(e) } else { cache.contains(e) },
                        &mut pending,
                        &mut chosen_buf,
                    );
                }
                chosen_ids.clear();
                chosen_ids.extend(chosen_buf.iter().map(|&(e, _)| e));
                (&chosen_ids, chosen_buf.iter().filter(|&&(_, i)| i as usize >= k).count())
            }
            // F's first n: the kept ids among the row's first k_used (k_used − pruned of them)
            // come first, the rest lie beyond.
            _ => {
                let f = if keep_all { &row[..n] } else { &table_f.map_or(&f_ids[..], |t| t.0)[..n] };
                (f, n - (k - pruned))
            }
        };

        // Step 3: counts from token W on (from the first step that starts at W or later).
        let counted = steps.counted(p, params.warmup);
        if counted {
            counts.add_selection(k, n, pruned, substituted);
        }

        // Step 4: residency; a deployment's tiers take the step's set after its last row.
        if S::STEPS {
            steps.chosen(p, chosen, counted, &mut counts);
            continue;
        }
        // With prefetch, a token's proposals have stamp 2t + 1 and its chosen experts 2t + 2.
        let stamp = if H::PREFETCH { 2 * t as u64 + 2 } else { t as u64 + 1 };
        if !params.sequential {
            for &e in chosen {
                chosen_marks[usize::from(e)] = stamp;
            }
        }
        let protected = Protected { marks: &chosen_marks, stamp };
        if batch {
            // The token's misses evict the q lowest unprotected keys, which the token's own
            // accesses do not change (only chosen, protected experts are touched).
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
        let mut hits = 0;
        for (i, &e) in chosen.iter().enumerate() {
            now += 1;
            let e = usize::from(e);
            let hit = policy.step(Pick { e, now, t, i, demand: true }, cap, protected, &mut cache);
            hook.demand(e, hit);
            hits += u64::from(hit);
        }
        if counted {
            counts.hits += hits;
            counts.misses += chosen.len() as u64 - hits;
        }
        hook.token(t, chosen, (chosen.len() as u64 - hits) as u32, loads as u32, counted);

        // Step 5: credits.
        // With a table, f_len is its row's length.
        let f = if keep_all { &row[..f_len] } else { &table_f.map_or(&f_ids[..], |t| t.0)[..f_len] };
        policy.end_token(t, f, row, row_scores, &mut cache);
    }
    State {
        policy,
        cache,
        chosen_marks,
        keep_all,
        f_ids,
        f_pos,
        chosen_buf,
        chosen_ids,
        pending,
        victims,
        proposals,
        counts,
        now,
        ri,
    }
}

/// Step 1 for a pruned keep set: appends the kept candidates of `row[*scanned..end]` to F
/// (`f_ids`, `f_pos`: expert and row position, length >= m) until F holds `want`. Every
/// candidate is written and the length advances only when it is kept (no branch on the keep
/// mask, which is as unpredictable as the map is mixed).
#[expect(clippy::too_many_arguments, reason = "a helper of the token loop")]
// Not inlined: inside the token loop its pointers and counters are spilled to the stack; on its
// own they stay in registers (a call per token costs less than a reload per candidate).
#[inline(never)]
pub(crate) fn extend_f(
    row: &[u16],
    keep: &[bool],
    f_ids: &mut [u16],
    f_pos: &mut [u16],
    f_len: &mut usize,
    scanned: &mut usize,
    want: usize,
    end: usize,
) {
    // Locals, and F's buffers cut to the row's length (F never outgrows the row scanned).
    let (mut len, mut i) = (*f_len, *scanned);
    let m = row.len();
    let (f_ids, f_pos) = (&mut f_ids[..m], &mut f_pos[..m]);
    let end = end.min(m);
    while len < want && i < end {
        let e = row[i];
        f_ids[len] = e;
        // Row positions are below m <= 65,536.
        f_pos[len] = i as u16;
        len += usize::from(keep[usize::from(e)]);
        i += 1;
    }
    (*f_len, *scanned) = (len, i);
}

/// Step 2 for λ > 0: the first n of F by (score desc, rank asc), where candidates of rank < j
/// or already cached get z + λ·δ. F's scores are non-increasing, so one pass in rank order
/// suffices: a plain candidate waits in `pending` until a boosted one scores strictly above it
/// (a later plain candidate never scores above a boosted one, λ·δ >= 0), and the pass stops as
/// soon as n are chosen. `pos(r)` is the row position of F's rank r; `f` may stop early (at
/// the cut of the token loop); `bonus` = λ·δ with δ = z(F[0]) − z(F[n−1]) (0 if n <= 1);
/// `resident(e)`: whether expert e is resident (cached, or pinned in a deployment), so boosted.
/// The deployed step loop selects with it too.
#[expect(clippy::too_many_arguments, reason = "a helper of the token loop")]
#[inline(never)]
pub(crate) fn select_cache_aware(
    f: &[u16],
    pos: impl Fn(usize) -> usize,
    z_row: &[f32],
    n: usize,
    bonus: f64,
    j: usize,
    resident: impl Fn(usize) -> bool,
    pending: &mut Vec<u32>,
    chosen: &mut Vec<(u16, u32)>,
) {
    if n == 0 {
        return;
    }
    let z = |r: usize| f64::from(z_row[pos(r)]);
    pending.clear();
    let mut head = 0;
    for (r, &e) in f.iter().enumerate() {
        if r < j || resident(usize::from(e)) {
            let s = z(r) + bonus;
            while head < pending.len() && chosen.len() < n {
                let b = pending[head] as usize;
                if z(b) < s {
                    break;
                }
                chosen.push((f[b], pos(b) as u32));
                head += 1;
            }
            if chosen.len() == n {
                return;
            }
            chosen.push((e, pos(r) as u32));
            if chosen.len() == n {
                return;
            }
        } else {
            pending.push(r as u32);
        }
    }
    while chosen.len() < n && head < pending.len() {
        let b = pending[head] as usize;
        chosen.push((f[b], pos(b) as u32));
        head += 1;
    }
}
