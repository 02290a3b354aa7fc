//! Replay configuration: policy, residency semantics and parameters (SEMANTICS.md §5).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An expert-cache eviction policy (SEMANTICS.md §5, "Priorities"). The cached expert with the
/// lowest priority is evicted; ties go to the lowest expert id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// Priority = time of last access (a per-layer counter over all picks).
    Lru,
    /// Priority = time of insertion.
    Fifo,
    /// Priority = (accesses since insertion, time of last access).
    Lfu,
    /// Priority = the next token at which the expert is chosen again, negated (never again:
    /// evicted first). Offline optimum; needs λ = 0.
    Belady,
    /// Priority = (last token at which the expert stood in F at rank < N, time of last access).
    NearPick,
    /// Priority = (s, time of last access), s ← d·s + 1(rank < N in F) once per token.
    NearPickEma,
    /// Priority = (s, time of last access), s ← d·s + p, p = softmax of the row's scores over all
    /// m candidates. Needs scores.
    InvRouter,
}

impl Policy {
    /// Every policy, in declaration order.
    pub const ALL: [Policy; 7] = [
        Policy::Lru,
        Policy::Fifo,
        Policy::Lfu,
        Policy::Belady,
        Policy::NearPick,
        Policy::NearPickEma,
        Policy::InvRouter,
    ];

    /// The spelling used on the command line, in grids and in output keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Lru => "lru",
            Policy::Fifo => "fifo",
            Policy::Lfu => "lfu",
            Policy::Belady => "belady",
            Policy::NearPick => "near_pick",
            Policy::NearPickEma => "near_pick_ema",
            Policy::InvRouter => "inv_router",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

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

impl FromStr for Policy {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Policy, ParseNameError> {
        Policy::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| ParseNameError {
            what: "policy",
            given: s.to_string(),
            expected: "lru, fifo, lfu, belady, near_pick, near_pick_ema, inv_router",
        })
    }
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
