//! Replay configuration: policy, residency semantics and parameters (SEMANTICS.md §5).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Policy;

/// Error of parsing a [`Policy`] or [`Semantics`] name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; expected one of: {expected}")]
pub struct ParseNameError {
    /// `policy` or `semantics`.
    pub what: &'static str,
    /// The string given.
    pub given: String,
    /// The accepted names, comma-separated.
    pub expected: &'static str,
}

/// Residency semantics of step 4 of SEMANTICS.md §5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum Semantics {
    /// Default: a miss never evicts an expert chosen for the same token (a token needs all its
    /// experts in memory at once).
    #[default]
    #[serde(rename = "k-way")]
    KWay,
    /// Comparison mode: a miss may evict any cached expert, including one chosen for the same
    /// token and processed later (which then misses). What per-request cache simulators compute.
    #[serde(rename = "sequential")]
    Sequential,
}

impl Semantics {
    /// The spelling used on the command line: `k-way` or `sequential`.
    pub fn as_str(self) -> &'static str {
        match self {
            Semantics::KWay => "k-way",
            Semantics::Sequential => "sequential",
        }
    }
}

impl fmt::Display for Semantics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Semantics {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Semantics, ParseNameError> {
        match s {
            "k-way" => Ok(Semantics::KWay),
            "sequential" => Ok(Semantics::Sequential),
            _ => Err(ParseNameError { what: "semantics", given: s.to_string(), expected: "k-way, sequential" }),
        }
    }
}

/// One replay configuration (SEMANTICS.md §5 "Parameters"). Build with [`ReplayConfig::new`] and
/// adjust fields; [`crate::validate`] checks it against a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayConfig {
    /// Eviction policy.
    pub policy: Policy,
    /// Cache capacity in experts, per layer (each layer has its own cache). Must be >= `k_used`.
    pub cap: usize,
    /// Per-layer capacities, one per trace layer, overriding `cap` (for plans that give layers
    /// different cache sizes). Each must be >= `k_used`. `None` = `cap` for every layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_caps: Option<Vec<usize>>,
    /// Experts used per token; `None` = the trace's `top_k`. Must be in `1..=m`.
    pub k_used: Option<usize>,
    /// λ >= 0: strength of cache-aware routing; 0 = plain routing.
    pub lambda: f64,
    /// j >= 0: candidates of rank < j in F get the λ bonus even when not cached.
    pub j: usize,
    /// W: tokens at the start that warm the cache but are not counted (default 64).
    pub warmup: usize,
    /// d in (0, 1]: per-token decay of `near_pick_ema` and `inv_router` scores (default 0.99).
    pub decay: f64,
    /// N: rank bound of `near_pick` and `near_pick_ema` credits (default 48).
    pub near_pick_n: usize,
    /// Residency semantics of step 4 (default k-way).
    pub semantics: Semantics,
    /// Empty every cache and forget every policy credit at each sequence start recorded in the
    /// trace's `seq_offsets` (no effect when the trace records none). Default false.
    pub reset_at_sequence: bool,
}

impl ReplayConfig {
    /// A configuration with the defaults: `k_used` = the trace's k, λ = 0, j = 2, W = 64,
    /// d = 0.99, N = 48, k-way semantics, no reset at sequence starts.
    pub fn new(policy: Policy, cap: usize) -> ReplayConfig {
        ReplayConfig {
            policy,
            cap,
            layer_caps: None,
            k_used: None,
            lambda: 0.0,
            j: 2,
            warmup: 64,
            decay: 0.99,
            near_pick_n: 48,
            semantics: Semantics::KWay,
            reset_at_sequence: false,
        }
    }

    /// The cache capacity of layer index `l`: `layer_caps[l]` when set, else `cap`.
    pub fn cap_of(&self, l: usize) -> usize {
        self.layer_caps.as_ref().and_then(|c| c.get(l).copied()).unwrap_or(self.cap)
    }

    /// The experts used per token on a trace whose top-k is `top_k`.
    pub fn k_used_or(&self, top_k: usize) -> usize {
        self.k_used.unwrap_or(top_k)
    }
}
