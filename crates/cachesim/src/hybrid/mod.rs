//! Hybrid execution (SEMANTICS.md §14): experts that are not GPU-resident are computed on the
//! CPU from host memory instead of being loaded, as llama.cpp (`-ot exps=CPU`, `--n-cpu-moe`),
//! kTransformers (`--kt-num-gpu-experts`) and HybriMoE run them.
//!
//! This is not a replay loop of its own: it is the execution part of the one step loop, which
//! hands each step's misses, with the number of rows that chose each, to a per-layer recorder
//! ([`LayerEvents`]): as a deployment's `StepSink` ([`crate::deploy`]), or as the token hook of a
//! plain configuration (`per_token`). The counts are exactly those of §5/§9/§11; what
//! differs is what a miss costs, which [`HybridEvents::cost`] prices per device afterwards, so a
//! sweep records the events once and prices them for every profile.
//!
//! Map:
//! - [`Exec`], [`Overlap`]: what happens to a non-resident expert, and how the CPU and GPU
//!   parts of a layer combine.
//! - [`HybridDevice`]: the profile fields §14 needs (units on each field).
//! - [`replay_hybrid`]: the deployed replay with exec; returns [`HybridCounts`] and the
//!   [`HybridEvents`] to price.
//! - [`HybridCost`]: tok/s and the per-row seconds of the host, the GPU and the link.
//!
//! ## Readings of SEMANTICS.md §14 where the text leaves room
//! - `host:R` counts a step's rows after re-batching or serving (per token every step has one
//!   row, so `host:1` transfers every non-resident pick and `host:R` with R >= 2 never does).
//! - A step's dense compute `c_s` is split evenly over the trace's L MoE layers, as the timeline
//!   of §13 splits `compute_ms`.
//! - Loads of `host:R` and the background copies of `host` both use `link_gbps`; a device
//!   without it is refused only when a counted step makes a load or a copy.
//! - Only counted steps (first row position >= W) enter the cost, as in §11.

mod cost;
mod events;
mod per_token;

use std::fmt;
use std::str::FromStr;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use trace_io::TraceView;

pub use cost::{HybridCost, HybridDevice};
pub use events::{HybridEvents, LayerEvents};

use crate::deploy::{self, DeployCounts, Deployment};
use crate::{CacheSimError, Keep, ParseNameError, ReplayConfig, Result};

/// What happens to a chosen expert that is not GPU-resident (SEMANTICS.md §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord)]
pub enum Exec {
    /// It is loaded, as in §5–§13 (the default; the cost model of §14 does not apply).
    #[default]
    Transfer,
    /// It is computed on the CPU from host memory (a host run); with `cap > 0` it is also copied
    /// into the GPU cache in the background.
    Host,
    /// As `Host`, except that in a step of at least R rows every non-resident chosen expert is
    /// transferred for that step, computed on the GPU and not kept (llama.cpp's rule for prefill
    /// batches, R = 32 there). Needs `cap = 0`.
    HostBatch(usize),
}

impl Exec {
    /// Whether the cost model of §14 applies (`host` or `host:R`).
    pub fn is_hybrid(self) -> bool {
        self != Exec::Transfer
    }
}

impl fmt::Display for Exec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exec::Transfer => f.write_str("transfer"),
            Exec::Host => f.write_str("host"),
            Exec::HostBatch(r) => write!(f, "host:{r}"),
        }
    }
}

impl FromStr for Exec {
    type Err = ParseNameError;

    /// `transfer`, `host` or `host:R` with R >= 1.
    fn from_str(s: &str) -> std::result::Result<Exec, ParseNameError> {
        let err = || ParseNameError { what: "exec", given: s.to_string(), expected: "transfer, host, host:R (R >= 1)" };
        match s {
            "transfer" => Ok(Exec::Transfer),
            "host" => Ok(Exec::Host),
            _ => match s.strip_prefix("host:").map(str::parse::<usize>) {
                Some(Ok(r)) if r >= 1 => Ok(Exec::HostBatch(r)),
                _ => Err(err()),
            },
        }
    }
}

impl Serialize for Exec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Exec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Exec, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How the CPU part and the GPU part of a layer combine (SEMANTICS.md §14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Overlap {
    /// One after the other: layer time = g + h (llama.cpp runs the graph in order).
    #[default]
    Sequential,
    /// In parallel: layer time = max(g, h) (kTransformers, HybriMoE).
    Concurrent,
}

impl Overlap {
    /// Both, in this order.
    pub const ALL: [Overlap; 2] = [Overlap::Sequential, Overlap::Concurrent];

    /// The name as parsed.
    pub fn name(self) -> &'static str {
        match self {
            Overlap::Sequential => "sequential",
            Overlap::Concurrent => "concurrent",
        }
    }
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Overlap {
    type Err = ParseNameError;

    /// `sequential` or `concurrent`.
    fn from_str(s: &str) -> std::result::Result<Overlap, ParseNameError> {
        Overlap::ALL.into_iter().find(|o| o.name() == s).ok_or_else(|| ParseNameError {
            what: "overlap",
            given: s.to_string(),
            expected: "sequential, concurrent",
        })
    }
}

/// The counts of a hybrid replay: the deployed counts (§9–§11), and how the misses that are
/// not forced split (§14): `counts.misses = host_runs + loads + forced_misses`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HybridCounts {
    /// The counts of §5/§9/§11 (identical to [`deploy::replay`]'s for the same deployment).
    pub deploy: DeployCounts,
    /// Non-resident chosen experts computed on the CPU, per (step, expert), counted steps.
    pub host_runs: u64,
    /// Non-resident chosen experts transferred for a step of >= R rows (`host:R`), not kept.
    pub loads: u64,
    /// Background copies into the GPU cache (`host` with cap > 0): its misses that are not
    /// forced.
    pub copies: u64,
}

/// Checks a hybrid configuration before any work: everything [`deploy::validate`] checks, plus
/// the rules of §14.
///
/// # Errors
/// Those of [`deploy::validate`], plus [`CacheSimError::DeployUnsupported`] for tier 2,
/// sequential semantics or resets at sequence starts with `exec != transfer` and for `host:R`
/// with a cap (or a per-layer cap) above 0, and
/// [`CacheSimError::InvalidParameter`] for `host:0`.
pub fn validate(trace: &TraceView<'_>, keep: &Keep, cfg: &ReplayConfig, dep: &Deployment, exec: Exec) -> Result<()> {
    if exec.is_hybrid() && cfg.semantics == crate::Semantics::Sequential {
        return Err(CacheSimError::DeployUnsupported {
            what: "semantics sequential with exec host",
            reason: "hybrid execution is replayed with k-way residency: a layer computes all its chosen experts",
        });
    }
    if exec.is_hybrid() && cfg.reset_at_sequence {
        return Err(CacheSimError::DeployUnsupported {
            what: "reset_at_sequence with exec host",
            reason: "hybrid execution keeps its GPU cache across sequences, as a runtime does",
        });
    }
    deploy::validate(trace, keep, cfg, dep)?;
    if exec.is_hybrid() && dep.tier2.is_some() {
        return Err(CacheSimError::DeployUnsupported {
            what: "tier 2 with exec host",
            reason: "a non-resident expert is computed on the CPU from host memory, so there is no second tier to \
                     load it from (SEMANTICS.md §14)",
        });
    }
    if let Exec::HostBatch(r) = exec {
        if r == 0 {
            return Err(CacheSimError::InvalidParameter {
                name: "exec",
                value: "host:0".into(),
                reason: "R must be at least 1",
            });
        }
        let caps_zero = cfg.cap == 0 && cfg.layer_caps.as_ref().is_none_or(|c| c.iter().all(|&c| c == 0));
        if !caps_zero {
            return Err(CacheSimError::DeployUnsupported {
                what: "exec host:R with a cache",
                reason: "host:R transfers a large step's experts without keeping them, so it needs cap = 0 \
                         (SEMANTICS.md §14); use exec host for a dynamic GPU cache",
            });
        }
    }
    Ok(())
}

/// Replays `trace` with deployment `dep` and execution `exec` (SEMANTICS.md §14), layers in
/// parallel; the result does not depend on the thread count.
///
/// With `exec = transfer` the counts are [`deploy::replay`]'s and every miss that is not forced
/// is a load. Memory beyond the deployed replay: per layer, three `u32` per step and one per
/// host run.
///
/// # Errors
/// As [`validate`].
pub fn replay_hybrid(
    trace: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    exec: Exec,
) -> Result<(HybridCounts, HybridEvents)> {
    validate(trace, keep, cfg, dep, exec)?;
    let shape = trace.shape();
    let plan = deploy::plan(trace, dep.schedule);
    // A plain configuration (per token, no pins, one tier, cap > 0) runs the fast token loop of
    // §5 resumed per token; any other the deployed step loop, recording as it goes.
    let plain = dep.is_plain(cfg);
    let per_layer: Vec<_> = (0..shape.layers)
        .into_par_iter()
        .map(|l| {
            let mut ev = LayerEvents::new(plan.steps(), exec, cfg.cap_of(l));
            if plain {
                let counts = per_token::token_misses(trace, keep, cfg, l, &mut ev);
                let extra =
                    deploy::LayerExtra { storage_reads: counts.misses - counts.forced_misses, ..Default::default() };
                return ((counts, extra), ev);
            }
            let (counts, extra) = deploy::replay_layer_with(trace, keep, cfg, dep, &plan, l, &mut ev);
            ((counts, extra), ev)
        })
        .collect();
    let (layers, events): (Vec<_>, Vec<_>) = per_layer.into_iter().unzip();
    let deploy = deploy::assemble(&shape, cfg, dep, &plan, &layers);
    let events = HybridEvents::new(shape.layers, deploy::step_rows(&plan, cfg.warmup), events);
    let (host_runs, loads, copies) = events.totals();
    Ok((HybridCounts { deploy, host_runs, loads, copies }, events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_and_overlap_parse_and_print() {
        for (s, e) in [("transfer", Exec::Transfer), ("host", Exec::Host), ("host:32", Exec::HostBatch(32))] {
            assert_eq!(s.parse::<Exec>().unwrap(), e);
            assert_eq!(e.to_string(), s);
        }
        for bad in ["", "Host", "host:", "host:0", "host:x", "gpu", "host:-1"] {
            let err = bad.parse::<Exec>().unwrap_err().to_string();
            assert!(err.contains("exec") && err.contains("host:R"), "{bad}: {err}");
        }
        assert_eq!("concurrent".parse::<Overlap>().unwrap(), Overlap::Concurrent);
        assert!("parallel".parse::<Overlap>().unwrap_err().to_string().contains("sequential, concurrent"));
        assert_eq!(serde_json::to_string(&Exec::HostBatch(4)).unwrap(), "\"host:4\"");
        assert_eq!(serde_json::from_str::<Exec>("\"host\"").unwrap(), Exec::Host);
        assert_eq!(serde_json::to_string(&Overlap::Concurrent).unwrap(), "\"concurrent\"");
    }
}
