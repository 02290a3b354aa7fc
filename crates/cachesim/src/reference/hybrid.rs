//! A plain reference of hybrid execution (SEMANTICS.md §14), written from the text: the
//! reference deployed replay ([`super::deploy`]) gives, per layer and step, the misses
//! that are not forced and the rows choosing each; this file decides, for each, whether it is a
//! host run, a load or a host run plus a copy, and prices every step with the formulas of §14
//! directly (f64, one step at a time). It shares no code with [`crate::hybrid`].

use trace_io::TraceView;

use crate::deploy::Deployment;
use crate::hybrid::{Exec, HybridCost, HybridCounts, HybridDevice, Overlap};
use crate::{CacheSimError, Keep, ReplayConfig, Result};

/// Replays like [`crate::hybrid::replay_hybrid`] and prices the result on `dev` like
/// [`crate::hybrid::HybridEvents::cost`], plainly and on one thread.
///
/// # Errors
/// As [`crate::hybrid::replay_hybrid`] and [`crate::hybrid::HybridEvents::cost`].
pub fn replay(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    exec: Exec,
    dev: &HybridDevice,
) -> Result<(HybridCounts, HybridCost)> {
    crate::hybrid::validate(trace, keep, cfg, dep, exec)?;
    dev.check()?;
    let (deploy, layers) = super::deploy::replay_with_misses(trace, keep, cfg, dep)?;
    let num_layers = layers.len();
    let steps = layers.first().map_or(0, Vec::len);
    let mut out = HybridCounts { deploy, ..HybridCounts::default() };

    // What happens to each miss, per step and layer: (loads, copies, rows of each host run).
    struct LayerStep {
        loads: u64,
        copies: u64,
        host_runs: Vec<usize>,
    }
    let mut table: Vec<Vec<LayerStep>> = Vec::new();
    for s in 0..steps {
        let mut row = Vec::new();
        for (l, layer) in layers.iter().enumerate() {
            let step = &layer[s];
            let mut ls = LayerStep { loads: 0, copies: 0, host_runs: Vec::new() };
            for &(_, rows_choosing) in &step.misses {
                match exec {
                    Exec::Transfer => ls.loads += 1,
                    Exec::HostBatch(r) if step.rows >= r => ls.loads += 1,
                    Exec::HostBatch(_) => ls.host_runs.push(rows_choosing),
                    Exec::Host => {
                        ls.host_runs.push(rows_choosing);
                        if cfg.cap_of(l) > 0 {
                            ls.copies += 1;
                        }
                    }
                }
            }
            if step.counted {
                out.loads += ls.loads;
                out.copies += ls.copies;
                out.host_runs += ls.host_runs.len() as u64;
            }
            row.push(ls);
        }
        table.push(row);
    }

    if dev.link_gbps.is_none() && out.loads + out.copies > 0 {
        return Err(CacheSimError::InvalidParameter {
            name: "link_gbps",
            value: "none".into(),
            reason: "required: this replay loads or copies experts over the host-to-GPU link (SEMANTICS.md §14)",
        });
    }
    let link_s = |n: u64| match dev.link_gbps {
        Some(gbps) => n as f64 * dev.expert_mb / (1000.0 * gbps),
        None => 0.0,
    };
    let mut total = 0.0;
    let mut host_total = 0.0;
    let mut gpu_total = 0.0;
    let mut link_total = 0.0;
    let mut rows_counted = 0usize;
    for s in 0..steps {
        let step = &layers[0][s];
        if !step.counted {
            continue;
        }
        rows_counted += step.rows;
        let dense_ms = match dev.compute_ms_per_step {
            Some(ms) => ms,
            None => dev.compute_ms * step.rows as f64,
        };
        let mut layer_times = 0.0;
        let mut step_copies = 0;
        for ls in &table[s] {
            let g = dense_ms / (1000.0 * num_layers as f64) + link_s(ls.loads);
            let mut h = 0.0;
            for &n in &ls.host_runs {
                let memory_bound = dev.expert_mb / (1000.0 * dev.host_gbps);
                let compute_bound = n as f64 * dev.host_ms_per_row / 1000.0;
                h += if memory_bound >= compute_bound { memory_bound } else { compute_bound };
            }
            if !ls.host_runs.is_empty() {
                h += dev.host_sync_ms / 1000.0;
            }
            layer_times += match dev.overlap {
                Overlap::Sequential => g + h,
                Overlap::Concurrent => {
                    if g >= h {
                        g
                    } else {
                        h
                    }
                }
            };
            host_total += h;
            gpu_total += g;
            link_total += link_s(ls.loads + ls.copies);
            step_copies += ls.copies;
        }
        let copy_time = link_s(step_copies);
        total += if layer_times >= copy_time { layer_times } else { copy_time };
    }
    let rows = rows_counted as f64;
    let cost = HybridCost {
        tok_s: if total > 0.0 { rows / total } else { 0.0 },
        host_s_per_row: if rows_counted > 0 { host_total / rows } else { 0.0 },
        gpu_s_per_row: if rows_counted > 0 { gpu_total / rows } else { 0.0 },
        link_s_per_row: if rows_counted > 0 { link_total / rows } else { 0.0 },
        total_s: total,
    };
    Ok((out, cost))
}
