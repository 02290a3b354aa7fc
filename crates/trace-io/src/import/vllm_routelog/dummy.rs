//! Dummy rows (an engine's warm-up runs on dummy input), engine runs, and signs of dummy rows that
//! no rule caught. Everything here reads the aligned rows of all the layers of one log.
//!
//! Rules (docs/importers.md restates them):
//! - a maximal run of two or more consecutive rows whose route (ids and weights, bit for bit) is
//!   the same in every layer is dummy input: real tokens differ in their hidden states, so their
//!   softmax weights differ; this catches warm-up batches wherever they are, inside a step or
//!   across steps;
//! - a leading run (at the start of the log or of an engine run) of two or more rows whose weights
//!   are all 1/k in every layer is dummy routing (a logger that records a placeholder);
//! - a new engine run starts at a meta line inside the file, at a dummy region that comes after
//!   real rows of the current run, and at an engine step larger than every warm-up step of the
//!   current run once real steps were seen (no step of one run exceeds its profiling batch).

use std::ops::Range;

use super::parse::LayerLog;

/// Weights within this of 1/k count as uniform.
pub(super) const UNIFORM_TOLERANCE: f64 = 1e-6;

/// Smallest step size that the step-size warning considers (profiling batches are powers of two
/// from 256 up).
const PROFILE_STEP_MIN: usize = 256;

/// Why a span of rows is taken for dummy input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Why {
    /// Two or more consecutive rows with one route in every layer.
    IdenticalRoute,
    /// Leading rows whose weights are all 1/k.
    UniformWeights,
}

impl Why {
    /// The name in the metadata key `dummy_rows`.
    pub fn as_str(self) -> &'static str {
        match self {
            Why::IdenticalRoute => "identical_route",
            Why::UniformWeights => "uniform_weights",
        }
    }
}

/// A maximal span of rows taken for dummy input for one reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Piece {
    pub rows: Range<usize>,
    pub why: Why,
}

/// Adjacent pieces: one report entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Region {
    pub rows: Range<usize>,
    pub pieces: Vec<Piece>,
}

/// A row where a new engine run (a sequence of the trace) starts, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Boundary {
    pub row: usize,
    pub why: String,
}

fn row_eq(logs: &[LayerLog], k: usize, a: usize, b: usize) -> bool {
    logs.iter().all(|l| {
        l.ids[a * k..(a + 1) * k] == l.ids[b * k..(b + 1) * k]
            && l.probs[a * k..(a + 1) * k]
                .iter()
                .zip(&l.probs[b * k..(b + 1) * k])
                .all(|(x, y)| x.to_bits() == y.to_bits())
    })
}

fn row_uniform(logs: &[LayerLog], k: usize, r: usize) -> bool {
    let u = 1.0 / k as f64;
    logs.iter().all(|l| l.probs[r * k..(r + 1) * k].iter().all(|&p| (p - u).abs() <= UNIFORM_TOLERANCE))
}

/// `range` minus the (sorted, disjoint) `covered` ranges.
fn subtract(range: Range<usize>, covered: &[Range<usize>]) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = range.start;
    for c in covered.iter().filter(|c| c.start < range.end && c.end > range.start) {
        if c.start > start {
            out.push(start..c.start);
        }
        start = start.max(c.end);
    }
    if start < range.end {
        out.push(start..range.end);
    }
    out
}

/// The dummy regions of the aligned `logs` (rows of width `k`), in row order. `run_starts` are
/// the rows where an engine run is known to start (0 and the meta lines inside the files).
pub(super) fn find_dummies(logs: &[LayerLog], k: usize, run_starts: &[usize]) -> Vec<Region> {
    let n = logs[0].rows();
    let mut uniform: Vec<Range<usize>> = Vec::new();
    for &s in run_starts {
        let mut r = s;
        while r < n && row_uniform(logs, k, r) {
            r += 1;
        }
        if r - s >= 2 {
            uniform.push(s..r);
        }
    }
    uniform.sort_by_key(|r| r.start);
    let mut pieces: Vec<Piece> = uniform.iter().map(|r| Piece { rows: r.clone(), why: Why::UniformWeights }).collect();
    let mut i = 0;
    while i < n {
        let mut j = i + 1;
        while j < n && row_eq(logs, k, i, j) {
            j += 1;
        }
        if j - i >= 2 {
            for rows in subtract(i..j, &uniform) {
                if rows.len() >= 2 {
                    pieces.push(Piece { rows, why: Why::IdenticalRoute });
                }
            }
        }
        i = j;
    }
    pieces.sort_by_key(|p| p.rows.start);
    let mut regions: Vec<Region> = Vec::new();
    for p in pieces {
        match regions.last_mut() {
            Some(r) if r.rows.end == p.rows.start => {
                r.rows.end = p.rows.end;
                r.pieces.push(p);
            }
            _ => regions.push(Region { rows: p.rows.clone(), pieces: vec![p] }),
        }
    }
    regions
}

/// Per row: true when it lies in a dummy region.
pub(super) fn dummy_mask(n: usize, regions: &[Region]) -> Vec<bool> {
    let mut m = vec![false; n];
    for r in regions {
        m[r.rows.clone()].iter_mut().for_each(|x| *x = true);
    }
    m
}

/// State of [`engine_runs`]: the boundaries so far and what is known of the current run.
struct Runs {
    bounds: Vec<Boundary>,
    run_start: usize,
    /// Largest all-dummy step of the current run.
    max_warm: usize,
    /// A step with real rows was seen in the current run.
    seen_real_step: bool,
}

impl Runs {
    fn start_run(&mut self, row: usize, why: String) {
        if row > 0 && self.bounds.last().is_none_or(|b| b.row != row) {
            self.bounds.push(Boundary { row, why });
            (self.run_start, self.max_warm, self.seen_real_step) = (row, 0, false);
        }
    }

    /// A meta line (`region` None) or a dummy region starting at `row`; `real(a, b)` counts the
    /// real rows in `a..b`.
    fn event(&mut self, first: &LayerLog, row: usize, region: Option<&Region>, real: impl Fn(usize, usize) -> usize) {
        match region {
            None => {
                self.start_run(row, format!("a meta line before line {} starts a new engine run", first.line_of(row)))
            }
            Some(r) if row > self.run_start && real(self.run_start, row) > 0 => {
                let why = format!(
                    "dummy rows {}..{} (a warm-up batch) after {} real rows of the run: a second engine run",
                    r.rows.start,
                    r.rows.end,
                    real(self.run_start, row)
                );
                self.start_run(row, why);
            }
            Some(_) => {}
        }
    }
}

/// The engine runs after the first: where each starts and why. `first` gives the step sizes,
/// meta lines and line numbers (the files align).
pub(super) fn engine_runs(first: &LayerLog, regions: &[Region], dummy: &[bool]) -> Vec<Boundary> {
    // real_before[r]: non-dummy rows in 0..r.
    let mut real_before = Vec::with_capacity(dummy.len() + 1);
    real_before.push(0usize);
    for &d in dummy {
        real_before.push(real_before.last().copied().unwrap_or(0) + usize::from(!d));
    }
    let real = |a: usize, b: usize| real_before[b] - real_before[a];
    // Events that can start a run, by row: meta lines first, then dummy regions.
    let mut events: Vec<(usize, Option<&Region>)> = first.meta_runs.iter().map(|&m| (m, None)).collect();
    events.extend(regions.iter().map(|r| (r.rows.start, Some(r))));
    events.sort_by_key(|(row, r)| (*row, r.is_some()));
    let mut next = 0;
    let mut runs = Runs { bounds: Vec::new(), run_start: 0, max_warm: 0, seen_real_step: false };
    let mut start = 0;
    for (s, &size) in first.steps.iter().enumerate() {
        let end = start + size;
        // Events at the step's first row, then the step-size rule, then events inside the step
        // (a log whose token_idx never restarts has a single step).
        while next < events.len() && events[next].0 <= start {
            runs.event(first, events[next].0, events[next].1, real);
            next += 1;
        }
        let step_real = real(start, end) > 0;
        if step_real && runs.seen_real_step && runs.max_warm > 0 && size > runs.max_warm {
            let why = format!(
                "engine step {s} has {size} rows, more than the largest warm-up batch ({} rows) of the run, after \
                 real steps: a second engine run whose warm-up was not logged",
                runs.max_warm
            );
            runs.start_run(start, why);
        }
        while next < events.len() && events[next].0 < end {
            runs.event(first, events[next].0, events[next].1, real);
            next += 1;
        }
        if step_real {
            runs.seen_real_step = true;
        } else {
            runs.max_warm = runs.max_warm.max(size);
        }
        start = end;
    }
    runs.bounds
}

/// Warnings about rows that look like dummies although no rule caught them, computed over the
/// `real` rows (not dummy, not skipped): next-token expert reuse above
/// `max(0.5, (1 + k/E) / 2)` in some layer (real traffic: 0.1-0.35 on the real logs); a run's
/// first real step of a power-of-two size >= 256 (the size of a profiling batch); rows of
/// uniform weights 1/k among the real rows.
pub(super) fn warnings(
    logs: &[LayerLog],
    k: usize,
    num_experts: u32,
    real: &[bool],
    bounds: &[Boundary],
) -> Vec<String> {
    let mut out = Vec::new();
    let first = &logs[0];
    let rows: Vec<usize> = (0..real.len()).filter(|&r| real[r]).collect();
    let threshold = 0.5f64.max((1.0 + k as f64 / f64::from(num_experts)) / 2.0);
    if rows.len() >= 2 {
        for l in logs {
            let mut hits = 0u64;
            for w in rows.windows(2) {
                let prev = &l.ids[w[0] * k..(w[0] + 1) * k];
                hits += l.ids[w[1] * k..(w[1] + 1) * k].iter().filter(|id| prev.contains(id)).count() as u64;
            }
            let reuse = hits as f64 / ((rows.len() - 1) * k) as f64;
            if reuse > threshold {
                out.push(format!(
                    "layer {}: next-token expert reuse {reuse:.3} over the kept rows, above {threshold:.3} (real traffic \
                     is far lower; chance is {:.3}): dummy rows may remain; find them (identical or repeating routes) \
                     and drop them with --skip-rows A..B",
                    l.layer,
                    k as f64 / f64::from(num_experts)
                ));
            }
        }
    }
    // The first real step of each run.
    let run_starts: Vec<usize> = std::iter::once(0).chain(bounds.iter().map(|b| b.row)).collect();
    let mut start = 0;
    let mut checked_run = usize::MAX;
    for (s, &size) in first.steps.iter().enumerate() {
        let end = start + size;
        let run = run_starts.iter().rposition(|&r| r <= start).unwrap_or(0);
        if run != checked_run && real[start..end].iter().any(|&x| x) {
            checked_run = run;
            if size >= PROFILE_STEP_MIN && size.is_power_of_two() && first.steps.len() > 1 {
                out.push(format!(
                    "engine step {s} (rows {start}..{end}, lines {}-{}) is the first real step of its run and has \
                     {size} rows, a power of two like an engine's profiling batch, but its rows vary: if it is warm-up \
                     on random dummy input, drop it with --skip-rows {start}..{end}",
                    first.line_of(start),
                    first.line_of(end - 1)
                ));
            }
        }
        start = end;
    }
    let uniform: Vec<usize> = rows.iter().copied().filter(|&r| row_uniform(logs, k, r)).collect();
    if let Some(&r) = uniform.first() {
        out.push(format!(
            "{} kept row(s) have uniform weights 1/{k} in every layer (first: row {r}, line {}), as placeholder \
             routing does: if they are dummies, drop them with --skip-rows",
            uniform.len(),
            first.line_of(r)
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subtract_leaves_the_uncovered_parts() {
        // (range, covered, left), ranges as (start, end).
        type Spans = &'static [(usize, usize)];
        let cases: [((usize, usize), Spans, Spans); 5] = [
            ((0, 10), &[], &[(0, 10)]),
            ((0, 10), &[(0, 4)], &[(4, 10)]),
            ((0, 10), &[(2, 4), (6, 8)], &[(0, 2), (4, 6), (8, 10)]),
            ((3, 5), &[(0, 10)], &[]),
            ((5, 10), &[(0, 2), (12, 14)], &[(5, 10)]),
        ];
        for ((a, b), covered, want) in cases {
            let covered: Vec<Range<usize>> = covered.iter().map(|&(x, y)| x..y).collect();
            let got: Vec<(usize, usize)> = subtract(a..b, &covered).iter().map(|r| (r.start, r.end)).collect();
            assert_eq!(got, want, "{a}..{b} - {covered:?}");
        }
    }
}
