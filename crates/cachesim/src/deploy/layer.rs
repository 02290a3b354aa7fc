//! The step loop of one layer (SEMANTICS.md §11 steps 1–4 with the pins of §9), and tier 2 over
//! its misses (§10). Every buffer is allocated before the loops.

use trace_io::TraceView;

use super::level::Level;
use super::prio::{Prio, StepParams, StepSets};
use super::steps::StepPlan;
use super::{Deployment, LayerExtra};
use crate::engine::token_loop::{extend_f, select_cache_aware};
use crate::policy::{VisitSteps, with_steps};
use crate::{Keep, LayerCounts, ReplayConfig};

/// One layer's inputs, resolved.
struct Input<'a> {
    ids: &'a [u16],
    scores: Option<&'a [f32]>,
    keep: &'a [bool],
    /// Whether `keep` keeps every expert (then F is the row).
    all_kept: bool,
    pinned: &'a [bool],
    plan: &'a StepPlan,
    m: usize,
    k: usize,
    num_experts: usize,
    warmup: usize,
    lambda: f64,
    j: usize,
}

/// The tier-2 request stream of a layer: per step, the tier-1 misses that are not forced, in
/// miss order (a [`StepSets`]), and whether the step is counted.
struct Stream {
    sets: StepSets,
    counted: Vec<bool>,
}

/// What the step loop tells an execution model (SEMANTICS.md §14) about each step: a no-op
/// for the deployed replay of §9–§11 (`()`, which compiles to nothing), the hybrid recorder
/// ([`crate::hybrid::LayerEvents`]) otherwise.
pub(crate) trait StepSink {
    /// Before a step of `rows` rows goes through the cache.
    fn begin_step(&mut self, rows: usize);
    /// A miss that is not forced, of an expert chosen by `rows_choosing` rows of the step.
    fn miss(&mut self, rows_choosing: u32);
    /// After the step.
    fn end_step(&mut self);
}

impl StepSink for () {
    #[inline(always)]
    fn begin_step(&mut self, _rows: usize) {}
    #[inline(always)]
    fn miss(&mut self, _rows_choosing: u32) {}
    #[inline(always)]
    fn end_step(&mut self) {}
}

impl StepSink for crate::hybrid::LayerEvents {
    #[inline(always)]
    fn begin_step(&mut self, rows: usize) {
        crate::hybrid::LayerEvents::begin_step(self, rows);
    }
    #[inline(always)]
    fn miss(&mut self, rows_choosing: u32) {
        crate::hybrid::LayerEvents::miss(self, rows_choosing);
    }
    #[inline(always)]
    fn end_step(&mut self) {
        crate::hybrid::LayerEvents::end_step(self);
    }
}

/// Replays layer `l` (validated configuration).
pub(crate) fn replay_layer(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    plan: &StepPlan,
    l: usize,
) -> (LayerCounts, LayerExtra) {
    replay_layer_with(trace, keep, cfg, dep, plan, l, &mut ())
}

/// Replays layer `l` (validated configuration), telling `sink` each step's misses.
pub(crate) fn replay_layer_with<X: StepSink>(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    plan: &StepPlan,
    l: usize,
    sink: &mut X,
) -> (LayerCounts, LayerExtra) {
    let shape = trace.shape();
    let no_pins = vec![false; shape.num_experts];
    let input = Input {
        ids: trace.layer_ids(l),
        scores: trace.layer_scores(l),
        keep: keep.layer_mask(l),
        all_kept: keep.layer_mask(l).iter().all(|&k| k),
        pinned: dep.pins.as_ref().map_or(&no_pins[..], |p| p.layer_mask(l)),
        plan,
        m: shape.candidates,
        k: cfg.k_used_or(shape.top_k),
        num_experts: shape.num_experts,
        warmup: cfg.warmup,
        lambda: cfg.lambda,
        j: cfg.j,
    };
    let e_n = shape.num_experts;
    let params = StepParams { num_experts: e_n, decay: cfg.decay, near_n: cfg.near_pick_n, m: shape.candidates };
    let level = Level::new(e_n, cfg.cap_of(l));
    let tier1 = Tier1 { input: &input, level, record: dep.tier2.is_some(), sink };
    let (counts, mut extra, stream) = with_steps(cfg.policy, &params, || lambda0_sets(&input), tier1);
    match dep.tier2 {
        None => extra.storage_reads = counts.misses - counts.forced_misses,
        Some(t2) => {
            // validate() admits at tier 2 only policies that may serve there (their facts).
            let sets = || StepSets { ids: stream.sets.ids.clone(), starts: stream.sets.starts.clone() };
            let tier2 = Tier2Loop { stream: &stream, num_experts: e_n, level: Level::new(e_n, t2.cap) };
            let (hits, misses) = with_steps(t2.policy, &params, sets, tier2);
            extra.t2_hits = hits;
            extra.storage_reads = misses;
        }
    }
    (counts, extra)
}

/// The first `k` entries of F of `row` into `f` (fewer when F is shorter); returns their number
/// and the row positions read (= k exactly when the row's first k ids are all kept).
#[inline(always)]
fn build_f_prefix(row: &[u16], keep: &[bool], f: &mut [u16], k: usize) -> (usize, usize) {
    let mut len = 0;
    let mut scanned = 0;
    for &e in row {
        if len == k {
            break;
        }
        f[len] = e;
        len += usize::from(keep[usize::from(e)]);
        scanned += 1;
    }
    (len, scanned)
}

/// The cut of the λ > 0 selection (as the token loop's): the row position `end` before which
/// every candidate that can be chosen lies (one at rank >= n whose score plus the bonus stays
/// below z(F[n−1]) is beaten by all of F[0..n]; scores are non-increasing along the row), and
/// the bonus λ·δ, δ = z(F[0]) − z(F[n−1]) (0 if n <= 1). `pos(r)`: the row position of F's
/// rank r; `n >= 1`. Out of line: the λ = 0 loop stays as small.
#[inline(never)]
fn cut(z: &[f32], n: usize, lambda: f64, pos: impl Fn(usize) -> usize) -> (usize, f64) {
    let z_last = f64::from(z[pos(n - 1)]);
    let bonus = if n <= 1 { 0.0 } else { lambda * (f64::from(z[pos(0)]) - z_last) };
    let mut end = pos(n - 1) + 1;
    while end < z.len() && f64::from(z[end]) + bonus >= z_last {
        end += 1;
    }
    (end, bonus)
}

/// The experts of a λ > 0 selection (expert, row position) into `chosen`; returns how many lie
/// outside the row's first `k` (substituted). Out of line: the λ = 0 loop stays as small.
#[inline(never)]
fn take_chosen(chosen_pos: &[(u16, u32)], chosen: &mut Vec<u16>, k: usize) -> usize {
    chosen.extend(chosen_pos.iter().map(|&(e, _)| e));
    chosen_pos.iter().filter(|&&(_, i)| i as usize >= k).count()
}

/// The step sets at λ = 0 (the distinct F[0..n] of the step's rows), for belady's next uses.
fn lambda0_sets(inp: &Input<'_>) -> StepSets {
    let plan = inp.plan;
    let mut f = vec![0u16; inp.m];
    let mut mark = vec![usize::MAX; inp.num_experts];
    let mut sets = StepSets { ids: Vec::new(), starts: vec![0] };
    for s in 0..plan.steps() {
        for p in plan.starts[s]..plan.starts[s + 1] {
            let t = plan.token(p);
            let (len, _) = build_f_prefix(&inp.ids[t * inp.m..(t + 1) * inp.m], inp.keep, &mut f, inp.k);
            for &e in &f[..len] {
                if mark[usize::from(e)] != s {
                    mark[usize::from(e)] = s;
                    sets.ids.push(e);
                }
            }
        }
        sets.starts.push(sets.ids.len());
    }
    sets
}

/// Tier 1's step loop of a layer ([`tier1`]) as a [`VisitSteps`].
struct Tier1<'i, 'a, X> {
    input: &'i Input<'a>,
    level: Level,
    record: bool,
    sink: &'i mut X,
}

impl<X: StepSink> VisitSteps for Tier1<'_, '_, X> {
    type Out = (LayerCounts, LayerExtra, Stream);
    fn visit<P: Prio>(self, prio: P) -> Self::Out {
        tier1(self.input, self.level, prio, self.record, self.sink)
    }
}

/// Tier 2's loop over a layer's stream ([`tier2`]) as a [`VisitSteps`].
struct Tier2Loop<'s> {
    stream: &'s Stream,
    num_experts: usize,
    level: Level,
}

impl VisitSteps for Tier2Loop<'_> {
    type Out = (u64, u64);
    fn visit<P: Prio>(self, prio: P) -> Self::Out {
        tier2(self.stream, self.num_experts, self.level, prio)
    }
}

/// Tier 1 of one layer with policy `prio`; with `record`, the tier-2 request stream.
#[inline(never)]
fn tier1<P: Prio, X: StepSink>(
    inp: &Input<'_>,
    mut level: Level,
    mut prio: P,
    record: bool,
    sink: &mut X,
) -> (LayerCounts, LayerExtra, Stream) {
    let (m, k, plan) = (inp.m, inp.k, inp.plan);
    let steps = plan.steps();
    let max_rows = (0..steps).map(|s| plan.starts[s + 1] - plan.starts[s]).max().unwrap_or(0);
    let rows_total = plan.starts[steps];
    let mut counts = LayerCounts::default();
    let mut extra = LayerExtra::default();
    let mut stream = Stream {
        sets: StepSets {
            ids: Vec::with_capacity(if record { rows_total * k } else { 0 }),
            starts: Vec::with_capacity(if record { steps + 1 } else { 0 }),
        },
        counted: Vec::with_capacity(if record { steps } else { 0 }),
    };
    if record {
        stream.sets.starts.push(0);
    }
    let mut f = vec![0u16; m];
    let mut f_pos = vec![0u16; m];
    let mut chosen: Vec<u16> = Vec::with_capacity(k);
    let mut chosen_pos: Vec<(u16, u32)> = Vec::with_capacity(k);
    let mut pending: Vec<u32> = Vec::with_capacity(m);
    let mut set: Vec<u16> = Vec::with_capacity((max_rows * k).min(inp.num_experts));
    let mut set_count = vec![0u32; inp.num_experts];
    let mut set_mark = vec![usize::MAX; inp.num_experts];

    let cache_aware = inp.lambda > 0.0 && inp.scores.is_some();
    for s in 0..steps {
        let rows = plan.starts[s]..plan.starts[s + 1];
        let counted = plan.starts[s] >= inp.warmup;
        prio.begin_step(s, level.heap());
        set.clear();
        // Step 1–2 per row, against the cache at the start of the step.
        for p in rows.clone() {
            let t = plan.token(p);
            let row = &inp.ids[t * m..(t + 1) * m];
            let row_z = inp.scores.filter(|_| cache_aware).map(|z| &z[t * m..(t + 1) * m]);
            let resident = |e: usize| inp.pinned[e] || level.contains(e);
            chosen.clear();
            // Steps 1–2 as the token loop takes them: F is the row when every expert is kept,
            // else built with row positions only as far as selection reads it; at λ > 0 only
            // candidates before the cut can be chosen (engine/token_loop.rs). `substituted`:
            // chosen experts outside the row's first k (row position >= k).
            let (n, pruned, substituted) = if inp.all_kept {
                match row_z {
                    Some(z) => {
                        let (end, bonus) = cut(z, k, inp.lambda, |r| r);
                        chosen_pos.clear();
                        select_cache_aware(
                            &row[..end],
                            |r| r,
                            z,
                            k,
                            bonus,
                            inp.j,
                            resident,
                            &mut pending,
                            &mut chosen_pos,
                        );
                        (k, 0, take_chosen(&chosen_pos, &mut chosen, k))
                    }
                    None => {
                        chosen.extend_from_slice(&row[..k]);
                        (k, 0, 0)
                    }
                }
            } else {
                let (mut len, mut scanned) = (0, 0);
                extend_f(row, inp.keep, &mut f, &mut f_pos, &mut len, &mut scanned, k, m);
                let n = k.min(len);
                let pruned = row[..k].iter().filter(|&&e| !inp.keep[usize::from(e)]).count();
                match row_z {
                    Some(z) if n > 0 => {
                        let (end, bonus) = cut(z, n, inp.lambda, |r| usize::from(f_pos[r]));
                        extend_f(row, inp.keep, &mut f, &mut f_pos, &mut len, &mut scanned, m, end);
                        let sel = f_pos[..len].partition_point(|&i| usize::from(i) < end);
                        chosen_pos.clear();
                        let fp = &f_pos;
                        let pos = |r: usize| usize::from(fp[r]);
                        select_cache_aware(&f[..sel], pos, z, n, bonus, inp.j, resident, &mut pending, &mut chosen_pos);
                        (n, pruned, take_chosen(&chosen_pos, &mut chosen, k))
                    }
                    // F's first n: the kept ids among the row's first k (k − pruned of them)
                    // come first, the rest lie beyond.
                    _ => {
                        chosen.extend_from_slice(&f[..n]);
                        (n, pruned, n - (k - pruned))
                    }
                }
            };
            if counted {
                counts.add_selection(k, n, pruned, substituted);
            }
            for &e in &chosen {
                let ei = usize::from(e);
                if set_mark[ei] != s {
                    set_mark[ei] = s;
                    set_count[ei] = 0;
                    set.push(e);
                }
                set_count[ei] += 1;
            }
        }
        // Step 2 of §11: by (rows choosing it desc, first appearance); a stable insertion sort.
        for i in 1..set.len() {
            let mut j = i;
            while j > 0 && set_count[usize::from(set[j - 1])] < set_count[usize::from(set[j])] {
                set.swap(j - 1, j);
                j -= 1;
            }
        }
        // Step 3.
        let ids = &mut stream.sets.ids;
        sink.begin_step(rows.len());
        let out = level.step(&mut prio, &set, inp.pinned, |e| {
            if record {
                ids.push(e);
            }
            sink.miss(set_count[usize::from(e)]);
        });
        sink.end_step();
        if record {
            stream.sets.starts.push(stream.sets.ids.len());
            stream.counted.push(counted);
        }
        if counted {
            counts.hits += out.hits;
            counts.misses += out.misses;
            extra.pinned_hits += out.pinned_hits;
        }
        // Step 4: credits, once per step, every row's own in row order.
        if P::CREDITS {
            prio.begin_credits();
            let need = prio.f_needed().min(m);
            for p in rows {
                let t = plan.token(p);
                let row = &inp.ids[t * m..(t + 1) * m];
                // The first `need` entries of F: the row's when every expert is kept.
                let f_row = if inp.all_kept {
                    &row[..need]
                } else {
                    let (len, _) = build_f_prefix(row, inp.keep, &mut f, need);
                    &f[..len]
                };
                prio.credit_row(s, f_row, row, inp.scores.map(|z| &z[t * m..(t + 1) * m]), level.heap());
            }
            prio.end_credits(level.heap());
        }
    }
    (counts, extra, stream)
}

/// Tier 2 over a layer's request stream: (hits, misses) of the counted steps.
#[inline(never)]
fn tier2<P: Prio>(stream: &Stream, num_experts: usize, mut level: Level, mut prio: P) -> (u64, u64) {
    let no_pins = vec![false; num_experts];
    let (mut hits, mut misses) = (0, 0);
    for s in 0..stream.counted.len() {
        prio.begin_step(s, level.heap());
        let set = &stream.sets.ids[stream.sets.starts[s]..stream.sets.starts[s + 1]];
        let out = level.step(&mut prio, set, &no_pins, |_| {});
        if stream.counted[s] {
            hits += out.hits;
            misses += out.misses;
        }
    }
    (hits, misses)
}
