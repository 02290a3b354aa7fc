//! One layer of a deployed replay: tier 1 (pins of §9, the cache, §11 steps 2-4) as the
//! residency of the one step loop (`crate::engine::run_rows`, which takes §11 step 1 per row as
//! it takes §5 steps 1-3), and tier 2 over its misses (§10). Every buffer is allocated before
//! the loops.

use trace_io::TraceView;

use super::level::Level;
use super::prio::{Prio, StepParams, StepSets};
use super::steps::StepPlan;
use super::{Deployment, LayerExtra};
use crate::engine::{ByStep, LayerInput, State, Steps, layer_alone, run_rows};
use crate::policy::{VisitSteps, with_steps};
use crate::{Keep, LayerCounts, ReplayConfig};
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
    let (params, input) = layer_alone(trace, keep, cfg, l);
    let e_n = params.num_experts;
    let no_pins = vec![false; e_n];
    let pinned = dep.pins.as_ref().map_or(&no_pins[..], |p| p.layer_mask(l));
    let step_params = StepParams { num_experts: e_n, decay: cfg.decay, near_n: cfg.near_pick_n, m: params.m };
    let tier1 = Tier1 {
        params: &params,
        input: &input,
        pinned,
        plan,
        level: Level::new(e_n, params.cap),
        record: dep.tier2.is_some(),
        sink,
    };
    let sets = || lambda0_sets(&input, plan, params.m, params.k_used, e_n);
    let (counts, mut extra, stream) = with_steps(cfg.policy, &step_params, sets, tier1);
    match dep.tier2 {
        None => extra.storage_reads = counts.misses - counts.forced_misses,
        Some(t2) => {
            // validate() admits at tier 2 only policies that may serve there (their facts).
            let sets = || StepSets { ids: stream.sets.ids.clone(), starts: stream.sets.starts.clone() };
            let tier2 = Tier2Loop { stream: &stream, num_experts: e_n, level: Level::new(e_n, t2.cap) };
            let (hits, misses) = with_steps(t2.policy, &step_params, sets, tier2);
            extra.t2_hits = hits;
            extra.storage_reads = misses;
        }
    }
    (counts, extra)
}

/// The first `k` entries of F of `row` into `f` (fewer when F is shorter); returns their number.
#[inline(always)]
fn build_f_prefix(row: &[u16], keep: &[bool], f: &mut [u16], k: usize) -> usize {
    let mut len = 0;
    for &e in row {
        if len == k {
            break;
        }
        f[len] = e;
        len += usize::from(keep[usize::from(e)]);
    }
    len
}

/// The step sets at λ = 0 (the distinct F[0..n] of the step's rows, `n = min(k, |F|)`), for
/// belady's next uses; `m` candidates per row, `e_n` experts.
fn lambda0_sets(input: &LayerInput<'_>, plan: &StepPlan, m: usize, k: usize, e_n: usize) -> StepSets {
    let mut f = vec![0u16; m];
    let mut mark = vec![usize::MAX; e_n];
    let mut sets = StepSets { ids: Vec::new(), starts: vec![0] };
    for s in 0..plan.steps() {
        for p in plan.starts[s]..plan.starts[s + 1] {
            let t = plan.token(p);
            let len = build_f_prefix(&input.ids[t * m..(t + 1) * m], input.keep, &mut f, k);
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

/// Tier 1 of a layer run by the step loop ([`Tiers`]) as a [`VisitSteps`].
struct Tier1<'i, 'a, X> {
    params: &'i crate::engine::Params<'a>,
    input: &'i LayerInput<'a>,
    pinned: &'i [bool],
    plan: &'i StepPlan,
    level: Level,
    record: bool,
    sink: &'i mut X,
}

impl<X: StepSink> VisitSteps for Tier1<'_, '_, X> {
    type Out = (LayerCounts, LayerExtra, Stream);
    #[inline(never)]
    fn visit<P: Prio>(self, prio: P) -> Self::Out {
        let (params, input, plan) = (self.params, self.input, self.plan);
        let steps = plan.steps();
        let rows_total = plan.starts[steps];
        let max_rows = (0..steps).map(|s| plan.starts[s + 1] - plan.starts[s]).max().unwrap_or(0);
        let (k, e_n, record) = (params.k_used, params.num_experts, self.record);
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
        let mut tiers = Tiers {
            input,
            m: params.m,
            pinned: self.pinned,
            plan,
            level: self.level,
            prio,
            record,
            stream,
            sink: self.sink,
            extra: LayerExtra::default(),
            step: 0,
            set: Vec::with_capacity((max_rows * k).min(e_n)),
            set_count: vec![0; e_n],
            set_mark: vec![usize::MAX; e_n],
            f: vec![0; params.m],
            all_kept: input.keep.iter().all(|&kept| kept),
        };
        let state = run_rows(params, input, State::new(params, input, ByStep), 0..rows_total, &mut tiers, &mut ());
        (state.counts, tiers.extra, tiers.stream)
    }
}

/// Tier 1 of a deployed layer as the step loop's residency ([`Steps`]): rows in the plan's
/// order, selection against the pins and the cache at the start of the step, the step's set
/// through the cache (§11 steps 2-3), the credits once per step (step 4), and with `record`
/// the tier-2 request stream.
struct Tiers<'i, 'a, P, X> {
    input: &'i LayerInput<'a>,
    m: usize,
    /// `[E]`: the layer's pinned experts (§9).
    pinned: &'i [bool],
    plan: &'i StepPlan,
    level: Level,
    prio: P,
    record: bool,
    stream: Stream,
    sink: &'i mut X,
    extra: LayerExtra,
    /// The current step.
    step: usize,
    /// The step's set (distinct chosen experts, first appearance order), with the rows choosing
    /// each (`set_count`, valid where `set_mark[e]` is the step). `[<= E]`, `[E]`, `[E]`.
    set: Vec<u16>,
    set_count: Vec<u32>,
    set_mark: Vec<usize>,
    /// The credits' F prefix of a row, `[m]`; `all_kept`: the keep set keeps every expert (then
    /// F is the row).
    f: Vec<u16>,
    all_kept: bool,
}

impl<P: Prio, X: StepSink> Steps for Tiers<'_, '_, P, X> {
    const STEPS: bool = true;

    #[inline(always)]
    fn token(&self, p: usize) -> usize {
        self.plan.token(p)
    }

    #[inline(always)]
    fn counted(&self, _p: usize, warmup: usize) -> bool {
        self.plan.starts[self.step] >= warmup
    }

    #[inline(always)]
    fn begin_row(&mut self, p: usize) {
        if p == self.plan.starts[self.step] {
            self.prio.begin_step(self.step, self.level.heap());
            self.set.clear();
        }
    }

    #[inline(always)]
    fn resident(&self, e: usize) -> bool {
        self.pinned[e] || self.level.contains(e)
    }

    #[inline(always)]
    fn chosen(&mut self, p: usize, chosen: &[u16], counted: bool, counts: &mut LayerCounts) {
        let s = self.step;
        for &e in chosen {
            let ei = usize::from(e);
            if self.set_mark[ei] != s {
                self.set_mark[ei] = s;
                self.set_count[ei] = 0;
                self.set.push(e);
            }
            self.set_count[ei] += 1;
        }
        if p + 1 == self.plan.starts[s + 1] {
            self.end_step(counted, counts);
            self.step += 1;
        }
    }
}

impl<P: Prio, X: StepSink> Tiers<'_, '_, P, X> {
    /// §11 steps 2-4 of the current step, after its rows' selection; `counted`: the step is.
    #[inline(always)]
    fn end_step(&mut self, counted: bool, counts: &mut LayerCounts) {
        let (s, m) = (self.step, self.m);
        let rows = self.plan.starts[s]..self.plan.starts[s + 1];
        // Step 2: by (rows choosing it desc, first appearance); a stable insertion sort.
        let (set, set_count) = (&mut self.set, &self.set_count);
        for i in 1..set.len() {
            let mut j = i;
            while j > 0 && set_count[usize::from(set[j - 1])] < set_count[usize::from(set[j])] {
                set.swap(j - 1, j);
                j -= 1;
            }
        }
        // Step 3.
        let (ids, record, sink) = (&mut self.stream.sets.ids, self.record, &mut *self.sink);
        sink.begin_step(rows.len());
        let out = self.level.step(&mut self.prio, set, self.pinned, |e| {
            if record {
                ids.push(e);
            }
            sink.miss(set_count[usize::from(e)]);
        });
        sink.end_step();
        if record {
            self.stream.sets.starts.push(self.stream.sets.ids.len());
            self.stream.counted.push(counted);
        }
        if counted {
            counts.hits += out.hits;
            counts.misses += out.misses;
            self.extra.pinned_hits += out.pinned_hits;
        }
        // Step 4: credits, once per step, every row's own in row order.
        if P::CREDITS {
            let (input, all_kept) = (self.input, self.all_kept);
            self.prio.begin_credits();
            let need = self.prio.f_needed().min(m);
            for p in rows {
                let t = self.plan.token(p);
                let row = &input.ids[t * m..(t + 1) * m];
                // The first `need` entries of F: the row's when every expert is kept.
                let f_row = if all_kept {
                    &row[..need]
                } else {
                    let len = build_f_prefix(row, input.keep, &mut self.f, need);
                    &self.f[..len]
                };
                let scores = input.scores.map(|z| &z[t * m..(t + 1) * m]);
                self.prio.credit_row(s, f_row, row, scores, self.level.heap());
            }
            self.prio.end_credits(self.level.heap());
        }
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
