//! The eviction policies of SEMANTICS.md §5, one file each, and the one table that names them.
//!
//! A policy is a type that implements [`crate::engine::Evictor`] (what the token loops of the
//! plain and prefetch replays ask of it: accesses, evictions, victims, credits after a token)
//! and [`PolicyKind`]: its facts ([`PolicyFacts`]), how to build it for one layer, and its
//! priorities in the deployed step loop (`PolicyKind::Steps`, a [`crate::deploy::prio::Prio`]:
//! pins, tier 2, served and re-batched steps, hybrid execution), all in the policy's file. The
//! table at the end of this file ([`policies!`]) lists each policy once, with its doc line and
//! its type; from it come the public [`Policy`] enum, its names ([`Policy::ALL`],
//! [`Policy::as_str`], parsing), its facts and the dispatch of every fast loop ([`replay_layer`],
//! [`lockstep_member`], [`with_policy`], [`with_steps`]). Every refusal that depends on the policy
//! reads its facts. Adding a policy is one new file here and one line in that table (plus, as
//! for every policy, its priority in the reference replayers, `crate::reference`, which are
//! written from the spec, not from this code).

use std::fmt;
use std::str::FromStr;
use std::sync::LazyLock;

use serde::{Deserialize, Serialize};

use crate::LayerCounts;
use crate::config::ParseNameError;
use crate::deploy::prio::{Prio, StepParams, StepSets};
use crate::engine::lockstep::{Member, Run};
use crate::engine::{Evictor, LayerInput, Params, run};

mod belady;
mod decayed;
mod fifo;
mod inv_router;
mod lfru;
mod lfu;
#[cfg(feature = "experimental-policy")]
mod lfu_fifo;
mod lru;
mod near_pick;
mod near_pick_ema;
mod perfect_lfu;

pub(crate) use inv_router::softmax_row;

/// Facts about one policy, kept on the policy (its `PolicyKind::FACTS`) and read through
/// [`Policy::facts`] by validation of every path (plain, prefetch, deployed, hybrid), by the
/// miss-ratio curves, by the scheduler of `replay_many`, and by the sweep and the cli. Every
/// refusal that depends on the policy reads these facts, never a policy's name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyFacts {
    /// The spelling on the command line, in grids and in output keys (`lru`, `near_pick_ema`).
    pub name: &'static str,
    /// Reads the future of the trace (`belady`): exact only when the selection does not depend
    /// on the cache, so refused with cache-aware routing (λ > 0, SEMANTICS.md §5) and with
    /// prefetch (§12); a bound, not a policy to deploy, in the sweep's summaries.
    pub offline: bool,
    /// The credits the policy takes from each token's (or step's) candidates (SEMANTICS.md §5).
    pub credits: Credits,
    /// Records token indices as `u32` (`belady`'s next use, `near_pick`'s last near token): the
    /// trace must have fewer than 2^32 tokens.
    pub token_indices: bool,
    /// What configurations of one layer may share, computed once for all of them.
    pub shares: Shares,
    /// The policy's one-pass miss-ratio curve ([`crate::mrc`]), if it has one.
    pub curve: OnePass,
    /// Instructions per pick, roughly, on the seed-scale benchmark trace (docs/performance.md):
    /// only to order the tasks of `replay_many`, costliest first.
    pub cost_per_pick: u64,
}

impl PolicyFacts {
    /// Whether cache-aware routing (λ > 0) may be combined with the policy: every online one.
    pub const fn allows_lambda(&self) -> bool {
        !self.offline
    }

    /// Whether prefetch (SEMANTICS.md §12) may be combined with the policy: every online one.
    pub const fn allows_prefetch(&self) -> bool {
        !self.offline
    }

    /// Whether the trace must hold router scores (the softmax credits of `inv_router`).
    pub const fn needs_scores(&self) -> bool {
        matches!(self.credits, Credits::RouterScores)
    }

    /// Whether the policy may serve as tier 2 (SEMANTICS.md §10): tier 2 sees only tier 1's
    /// misses, not the router's candidates, so only a policy without credits can.
    pub const fn may_be_tier2(&self) -> bool {
        matches!(self.credits, Credits::None)
    }
}

/// The credits of a policy (SEMANTICS.md §5), which decide what of each row it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credits {
    /// None: the priority changes only on accesses (lru, fifo, lfu, belady, perfect_lfu, lfru).
    None,
    /// The first N kept candidates of each row (F at rank < N: near_pick, near_pick_ema).
    NearPickRanks,
    /// The softmax of each row's router scores over all m candidates (inv_router).
    RouterScores,
}

/// A policy's one-pass miss-ratio curve ([`crate::mrc`]): every cap of a curve from one pass
/// over the trace instead of one replay per cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnePass {
    /// None: the policy is not a stack algorithm (fifo, lfu: counterexamples in `tests/mrc.rs`;
    /// perfect_lfu, lfru: none proven).
    None,
    /// The Fenwick-tree LRU stack distances ([`crate::mrc::lru_curve`]), under either
    /// residency semantics.
    Lru {
        /// The fewest caps of one curve for which the pass is faster than a replay per cap.
        pays_from: usize,
    },
    /// The priority stack ([`crate::mrc::belady_curve`], [`crate::mrc::credit_curve`]), under
    /// k-way residency only.
    Stack {
        /// As for [`OnePass::Lru`].
        pays_from: usize,
    },
}

/// What a policy's configurations on one layer can share (SEMANTICS.md §5: values that do not
/// depend on the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shares {
    /// Nothing beyond F (the kept candidates), which every policy shares with its keep set.
    Nothing,
    /// The softmax of every row of the layer's router scores.
    Softmax,
}

/// A policy as the fast replayer sees it: its facts, and how to build its state for one layer.
pub(crate) trait PolicyKind<'a>: Evictor + Sized {
    /// The policy's facts.
    const FACTS: PolicyFacts;
    /// The policy's state for one layer, allocated here, before the token loop.
    fn build(params: &Params<'a>, input: &LayerInput<'a>) -> Self;
    /// The policy's priorities in the deployed step loop ([`crate::deploy`]: pins, tier 2,
    /// served and re-batched steps, hybrid execution), in the same file as the policy.
    type Steps: Prio;
    /// Builds them for one layer's tier 1 or tier 2. `sets` gives the step sets whose next uses
    /// an offline policy reads (tier 1: F[0..n] of each step at λ = 0; tier 2: its requests);
    /// it is called only by a policy that reads them.
    fn build_steps(params: &StepParams, sets: impl FnOnce() -> StepSets) -> Self::Steps;
}

/// A deployed step loop generic over the policy's priorities, run by [`with_steps`].
pub(crate) trait VisitSteps {
    /// What the loop returns.
    type Out;
    /// Runs the loop with `prio`.
    fn visit<P: Prio>(self, prio: P) -> Self::Out;
}

/// A token loop generic over the policy, run by [`with_policy`] with the configured one.
pub(crate) trait VisitPolicy {
    /// What the loop returns.
    type Out;
    /// Runs the loop with `policy`.
    fn visit<P: Evictor>(self, policy: P) -> Self::Out;
}

/// Builds the [`Policy`] enum, its facts and the dispatch of the fast replayer from one table:
/// `[cfg,] doc, Variant => policy type`. A line may start with `#[cfg(...)]` (the test-only
/// experimental policy): the variant, its place in [`Policy::ALL`] and its match arms then exist
/// only under that cfg.
macro_rules! policies {
    ($( $(#[cfg($cfg:meta)])? $(#[doc = $doc:literal])* $variant:ident => $kind:ty ),* $(,)?) => {
        /// An expert-cache eviction policy (SEMANTICS.md §5, "Priorities"). The cached expert
        /// with the lowest priority is evicted; ties go to the lowest expert id.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Policy {
            $( $(#[cfg($cfg)])? $(#[doc = $doc])* $variant, )*
        }

        impl Policy {
            /// Every policy, in the order of the table.
            pub const ALL: [Policy; [$( $(#[cfg($cfg)])? stringify!($variant) ),*].len()] =
                [$( $(#[cfg($cfg)])? Policy::$variant ),*];

            /// The policy's facts ([`PolicyFacts`]).
            pub fn facts(self) -> &'static PolicyFacts {
                match self {
                    $( $(#[cfg($cfg)])? Policy::$variant => &<$kind as PolicyKind<'_>>::FACTS, )*
                }
            }
        }

        /// Replays one layer with the configured policy (monomorphized per policy).
        pub(crate) fn replay_layer(params: &Params<'_>, input: &LayerInput<'_>) -> LayerCounts {
            match params.policy {
                $( $(#[cfg($cfg)])? Policy::$variant => run(params, input, <$kind as PolicyKind<'_>>::build(params, input)), )*
            }
        }

        /// The configured policy's token loop for one layer as a member of a lockstep group
        /// ([`crate::engine::lockstep`], monomorphized per policy).
        pub(crate) fn lockstep_member<'a>(params: Params<'a>, input: LayerInput<'a>) -> Box<dyn Member + 'a> {
            match params.policy {
                $( $(#[cfg($cfg)])? Policy::$variant => {
                    let policy = <$kind as PolicyKind<'a>>::build(&params, &input);
                    Box::new(Run::new(params, input, policy))
                } )*
            }
        }

        /// Builds `policy`'s deployed priorities ([`PolicyKind::build_steps`]) and hands them to
        /// `visit` (monomorphized per policy): tier 1 and tier 2 of [`crate::deploy`].
        pub(crate) fn with_steps<V: VisitSteps>(
            policy: Policy,
            params: &StepParams,
            sets: impl FnOnce() -> StepSets,
            visit: V,
        ) -> V::Out {
            match policy {
                $( $(#[cfg($cfg)])? Policy::$variant => visit.visit(<$kind as PolicyKind<'_>>::build_steps(params, sets)), )*
            }
        }

        /// Builds the configured policy for one layer and hands it to `visit` (monomorphized
        /// per policy): for token loops other than [`run`] (prefetch, `crate::prefetch`; a hybrid
        /// replay's plain configurations, `crate::hybrid`).
        pub(crate) fn with_policy<'a, V: VisitPolicy>(params: &Params<'a>, input: &LayerInput<'a>, visit: V) -> V::Out {
            match params.policy {
                $( $(#[cfg($cfg)])? Policy::$variant => visit.visit(<$kind as PolicyKind<'a>>::build(params, input)), )*
            }
        }
    };
}

policies! {
    /// Priority = time of last access (a per-layer counter over all picks).
    Lru => lru::Lru,
    /// Priority = time of insertion.
    Fifo => fifo::Fifo,
    /// Priority = (accesses since insertion, time of last access): the in-cache count, as
    /// libCacheSim's LFU (an evicted expert comes back at 1); see perfect_lfu for counts that
    /// survive eviction.
    Lfu => lfu::Lfu,
    /// Priority = the next token at which the expert is chosen again, negated (never again:
    /// evicted first). Offline optimum; needs λ = 0.
    Belady => belady::Belady,
    /// Priority = (last token at which the expert stood in F at rank < N, time of last access).
    NearPick => near_pick::NearPick,
    /// Priority = (s, time of last access), s ← d·s + 1(rank < N in F) once per token (in the
    /// lazy form of SEMANTICS.md §5).
    NearPickEma => near_pick_ema::NearPickEma,
    /// Priority = (s, time of last access), s ← d·s + p, p = softmax of the row's scores over all
    /// m candidates (with the project's [`crate::exp`]), in the lazy form. Needs scores.
    InvRouter => inv_router::InvRouter<'_>,
    /// Priority = (accesses since the start of the trace, time of last access): lfu whose counts
    /// survive eviction (SEMANTICS.md §15.2); a reset at a sequence start resets them.
    PerfectLfu => perfect_lfu::PerfectLfu,
    /// Priority = freq / (clock − last + 1), freq = accesses since insertion, over a per-layer
    /// clock of the accesses that reach the cache, compared exactly; ties: the earlier insertion
    /// (SEMANTICS.md §15.3).
    Lfru => lfru::Lfru,
    #[cfg(feature = "experimental-policy")]
    /// Test only (the `experimental-policy` feature): priority = (accesses since insertion, time
    /// of insertion). Shows that a policy reaches every path from one file and this one line.
    LfuFifo => lfu_fifo::LfuFifo,
}

impl Policy {
    /// The spelling used on the command line, in grids and in output keys.
    pub fn as_str(self) -> &'static str {
        self.facts().name
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every policy's name, comma-separated, for [`ParseNameError`].
static NAMES: LazyLock<String> = LazyLock::new(|| Policy::ALL.map(Policy::as_str).join(", "));

impl FromStr for Policy {
    type Err = ParseNameError;
    fn from_str(s: &str) -> Result<Policy, ParseNameError> {
        Policy::ALL.into_iter().find(|p| p.as_str() == s).ok_or_else(|| ParseNameError {
            what: "policy",
            given: s.to_string(),
            expected: NAMES.as_str(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names come from the policies' facts; serde's spelling (derived from the variant)
    /// must be the same, and names must be distinct and parse back.
    #[test]
    fn names_agree_everywhere() {
        for policy in Policy::ALL {
            let name = policy.as_str();
            assert_eq!(serde_json::to_string(&policy).expect("serializable"), format!("\"{name}\""));
            assert_eq!(name.parse::<Policy>(), Ok(policy));
            assert_eq!(Policy::ALL.iter().filter(|p| p.as_str() == name).count(), 1, "{name}");
        }
        let err = "lru2".parse::<Policy>().expect_err("not a policy");
        let experimental = if cfg!(feature = "experimental-policy") { ", lfu_fifo" } else { "" };
        assert_eq!(
            err.expected,
            format!("lru, fifo, lfu, belady, near_pick, near_pick_ema, inv_router, perfect_lfu, lfru{experimental}")
        );
    }
}
