//! One replay request ([`Replay`]) that picks its loop: the plain token loop of SEMANTICS.md §5,
//! the deployed step loop of §9–§11, or hybrid execution (§14), so that a caller states what to
//! replay and never chooses the path itself (as ripgrep's `Searcher` picks its strategy).

use trace_io::{Reads, Shape, TraceView};

use crate::deploy::{DeployCounts, Deployment};
use crate::hybrid::{Exec, HybridCounts, HybridEvents};
use crate::{Keep, ReplayConfig, ReplayCounts, Result};

/// What to replay: a keep set, a configuration, a deployment and an execution model. Prefetch
/// and the timeline (§12–§13) are per token with one tier and no pins, and have their own entry,
/// [`crate::replay_prefetch`].
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    /// The experts kept per layer (F is the kept candidates of each row).
    pub keep: &'a Keep,
    /// The policy, cap and replay settings.
    pub config: &'a ReplayConfig,
    /// Pins, tier 2 and the step schedule (`Deployment::default()`: none, per token).
    pub deployment: &'a Deployment,
    /// What happens to a chosen expert that is not GPU-resident (`Exec::Transfer`: it is loaded).
    pub exec: Exec,
}

/// The loop a [`Replay`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayPath {
    /// The token loop of §5 ([`crate::replay`]): per token, one tier, no pins, every cap > 0,
    /// transfers.
    Plain,
    /// The deployed step loop of §9–§11 ([`crate::deploy::replay`]).
    Deployed,
    /// Hybrid execution of §14 ([`crate::hybrid::replay_hybrid`]).
    Hybrid,
}

/// What a [`Replay`] gives, by its path.
#[derive(Debug, Clone)]
pub enum Replayed {
    /// The counts of §5.
    Plain(ReplayCounts),
    /// The counts of §9–§11.
    Deployed(DeployCounts),
    /// The counts of §14 and the per-step events its cost model prices.
    Hybrid(HybridCounts, HybridEvents),
}

impl Replayed {
    /// The counts of §5/§9/§11 whatever the path (a plain replay's with no pins and no tier 2:
    /// `DeployCounts::from_plain`).
    pub fn deploy_counts(&self) -> DeployCounts {
        match self {
            Replayed::Plain(c) => DeployCounts::from_plain(c.clone()),
            Replayed::Deployed(c) => c.clone(),
            Replayed::Hybrid(c, _) => c.deploy.clone(),
        }
    }
}

impl Replay<'_> {
    /// The loop this request runs: hybrid when `exec` is (§14), plain when the deployment is
    /// ([`Deployment::is_plain`]), else deployed.
    pub fn path(&self) -> ReplayPath {
        if self.exec.is_hybrid() {
            ReplayPath::Hybrid
        } else if self.deployment.is_plain(self.config) {
            ReplayPath::Plain
        } else {
            ReplayPath::Deployed
        }
    }

    /// What of a trace of shape `shape` the request reads (SEMANTICS.md §1), to validate that
    /// and no more: [`crate::replay_reads`] on the plain path, [`crate::deploy::deploy_reads`]
    /// on the others.
    pub fn reads(&self, shape: &Shape) -> Reads {
        match self.path() {
            ReplayPath::Plain => crate::replay_reads(shape, self.keep, self.config),
            ReplayPath::Deployed | ReplayPath::Hybrid => crate::deploy::deploy_reads(shape, self.keep, self.config),
        }
    }

    /// Replays `trace` on the request's path; layers run in parallel on the rayon pool and the
    /// result does not depend on the thread count.
    ///
    /// # Errors
    /// Those of the path's function: [`crate::replay`], [`crate::deploy::replay`] or
    /// [`crate::hybrid::replay_hybrid`] (validation before any work).
    pub fn run(&self, trace: &TraceView<'_>) -> Result<Replayed> {
        let (keep, cfg, dep) = (self.keep, self.config, self.deployment);
        Ok(match self.path() {
            ReplayPath::Plain => Replayed::Plain(crate::replay(trace, keep, cfg)?),
            ReplayPath::Deployed => Replayed::Deployed(crate::deploy::replay(trace, keep, cfg, dep)?),
            ReplayPath::Hybrid => {
                let (counts, events) = crate::hybrid::replay_hybrid(trace, keep, cfg, dep, self.exec)?;
                Replayed::Hybrid(counts, events)
            }
        })
    }
}
