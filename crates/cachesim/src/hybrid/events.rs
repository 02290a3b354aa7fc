//! What a hybrid replay records per (step, layer) for the cost of SEMANTICS.md §14: the loads,
//! the background copies, and the host runs with the rows choosing each.

use super::Exec;

/// One layer's execution events, per step of the replay (every step, counted or not).
///
/// Filled by the deployed step loop ([`crate::deploy`]) step by step (a call per miss), or by
/// the token loop of §5 token by token (a call per token); read
/// by [`super::HybridEvents::cost`]. A host run chosen by one row (every run of a per-token
/// replay) is only counted; the rows of the others are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerEvents {
    exec: Exec,
    /// Whether this layer has a GPU cache (cap > 0), which makes `host` misses copies too.
    cached: bool,
    /// Whether the current step transfers its misses (`host:R` and rows >= R).
    transfer_step: bool,
    /// `[steps]`: loads of each step (`host:R` steps of >= R rows, or every miss under transfer).
    loads: Vec<u32>,
    /// `[steps]`: background copies of each step.
    copies: Vec<u32>,
    /// `[steps]`: host runs of each step.
    runs: Vec<u32>,
    /// `[steps + 1]`: where each step's host runs of two rows or more start in `multi`.
    multi_starts: Vec<u32>,
    /// The rows choosing each host run of two rows or more, in the order the step ran them.
    multi: Vec<u32>,
}

impl LayerEvents {
    /// An empty record for a replay of `steps` steps (reserves the per-step arrays) under `exec`
    /// with this layer's `cap`.
    pub(crate) fn new(steps: usize, exec: Exec, cap: usize) -> LayerEvents {
        let mut multi_starts = Vec::with_capacity(steps + 1);
        multi_starts.push(0);
        LayerEvents {
            exec,
            cached: cap > 0,
            transfer_step: exec == Exec::Transfer,
            loads: Vec::with_capacity(steps),
            copies: Vec::with_capacity(steps),
            runs: Vec::with_capacity(steps),
            multi_starts,
            multi: Vec::new(),
        }
    }

    /// Called before a step of `rows` rows is run through the cache.
    #[inline(always)]
    pub(crate) fn begin_step(&mut self, rows: usize) {
        self.transfer_step = match self.exec {
            Exec::Transfer => true,
            Exec::Host => false,
            Exec::HostBatch(r) => rows >= r,
        };
        self.loads.push(0);
        self.copies.push(0);
        self.runs.push(0);
    }

    /// A miss (not forced) of the current step: an expert chosen by `rows_choosing` rows.
    #[inline(always)]
    pub(crate) fn miss(&mut self, rows_choosing: u32) {
        let s = self.loads.len() - 1;
        if self.transfer_step {
            self.loads[s] += 1;
        } else {
            self.runs[s] += 1;
            if rows_choosing > 1 {
                self.multi.push(rows_choosing);
            }
            if self.cached {
                self.copies[s] += 1;
            }
        }
    }

    /// Closes the current step.
    #[inline(always)]
    pub(crate) fn end_step(&mut self) {
        self.multi_starts.push(self.multi.len() as u32);
    }

    /// A whole step of one row with `misses` misses that are not forced (the token loop of §5).
    #[inline(always)]
    pub(crate) fn token(&mut self, misses: u32) {
        let transfer = match self.exec {
            Exec::Transfer => true,
            Exec::Host => false,
            Exec::HostBatch(r) => r <= 1,
        };
        let (loads, runs) = if transfer { (misses, 0) } else { (0, misses) };
        self.loads.push(loads);
        self.runs.push(runs);
        self.copies.push(if self.cached { runs } else { 0 });
        self.multi_starts.push(self.multi.len() as u32);
    }

    /// Steps recorded.
    pub fn steps(&self) -> usize {
        self.loads.len()
    }

    /// Loads of step `s`.
    pub fn loads(&self, s: usize) -> u32 {
        self.loads[s]
    }

    /// Background copies of step `s`.
    pub fn copies(&self, s: usize) -> u32 {
        self.copies[s]
    }

    /// Host runs of step `s`.
    pub fn host_runs(&self, s: usize) -> u32 {
        self.runs[s]
    }

    /// The rows choosing each host run of step `s` that two rows or more chose, in processing
    /// order (the step's other host runs were chosen by one row each).
    pub fn shared_runs(&self, s: usize) -> &[u32] {
        &self.multi[self.multi_starts[s] as usize..self.multi_starts[s + 1] as usize]
    }
}

/// The events of a whole hybrid replay: every layer's [`LayerEvents`] and the rows of each step
/// (`None` for a step that is not counted).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HybridEvents {
    /// The trace's MoE layers L (the dense compute of a step is split over them).
    pub layers: usize,
    /// `[steps]`: rows of each counted step, `None` for a warmup step.
    pub step_rows: Vec<Option<u32>>,
    /// `[L]`: each layer's events.
    pub per_layer: Vec<LayerEvents>,
}

impl HybridEvents {
    /// Assembles the per-layer records.
    pub fn new(layers: usize, step_rows: Vec<Option<u32>>, per_layer: Vec<LayerEvents>) -> HybridEvents {
        HybridEvents { layers, step_rows, per_layer }
    }

    /// (host runs, loads, copies) over counted steps and every layer.
    pub fn totals(&self) -> (u64, u64, u64) {
        let (mut runs, mut loads, mut copies) = (0u64, 0u64, 0u64);
        for ev in &self.per_layer {
            for (s, rows) in self.step_rows.iter().enumerate() {
                if rows.is_some() {
                    runs += u64::from(ev.host_runs(s));
                    loads += u64::from(ev.loads(s));
                    copies += u64::from(ev.copies(s));
                }
            }
        }
        (runs, loads, copies)
    }
}
