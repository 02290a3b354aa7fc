//! The hybrid-execution axes of a grid block (SEMANTICS.md §14): `exec` (`transfer`, `host`,
//! `host:R`) and `overlap` (`sequential`, `concurrent`), their part of a configuration's key, and
//! the replay and pricing of those configurations.
//!
//! A block without `exec` (or with `exec: ["transfer"]` only) gives exactly the keys it gave
//! before: `exec = transfer` is the replay of §5–§13 and carries no hybrid key.

use cachesim::deploy::Deployment;
use cachesim::hybrid::{Exec, HybridCounts, HybridEvents, Overlap};
use cachesim::{Keep, ReplayConfig};
use trace_io::TraceView;

use crate::{DeviceProfile, SweepError};

/// The hybrid part of a configuration key; `None` in [`crate::ConfigKey`] is `exec = transfer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct HybridKey {
    /// `host` or `host:R` (never `transfer`).
    pub exec: Exec,
    /// The overlap the row is priced with; `None` = each profile's own (else sequential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<Overlap>,
}

impl HybridKey {
    /// The key's suffix: `/exec:host` or `/exec:host:R`, then `/overlap:NAME` when the block
    /// gives one.
    pub fn suffix(&self) -> String {
        match self.overlap {
            Some(o) => format!("/exec:{}/overlap:{o}", self.exec),
            None => format!("/exec:{}", self.exec),
        }
    }
}

/// The §14 cost of a hybrid row on one profile (SEMANTICS.md §14; [`cachesim::hybrid::HybridCost`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HybridCostEntry {
    /// The profile's name.
    pub profile: String,
    /// The overlap the row was priced with (the key's, else the profile's, else sequential).
    pub overlap: Overlap,
    /// Rows counted per second of counted step time.
    pub tok_s: f64,
    /// Host seconds (Σ h) per row counted.
    pub host_s_per_row: f64,
    /// GPU seconds (Σ g) per row counted.
    pub gpu_s_per_row: f64,
    /// Link seconds ((loads + copies) · τ) per row counted.
    pub link_s_per_row: f64,
}

/// The hybrid figures of a row (SEMANTICS.md §14).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HybridFigures {
    /// Picks computed on the CPU from host memory.
    pub host_runs: u64,
    /// Experts transferred for a step and computed on the GPU (`host:R` on large steps).
    pub loads: u64,
    /// Background copies into the GPU cache (`host` with cap > 0).
    pub copies: u64,
    /// Pinned hits (§9).
    pub pinned_hits: u64,
    /// Steps and rows counted.
    pub steps: u64,
    /// Rows counted.
    pub rows: u64,
    /// One entry per profile, in grid order.
    pub cost: Vec<HybridCostEntry>,
}

/// The hybrid keys of one block: `None` for `transfer`, one key per (exec, overlap) otherwise
/// (`overlap` absent: one key with the profiles' own overlap).
///
/// # Errors
/// [`SweepError::Grid`] naming the block when a hybrid exec meets a `tier2` or `prefetch` axis
/// value (§14 refuses both).
pub(crate) fn expand_axes(
    exec: &[Exec],
    overlap: &[Overlap],
    has_tier2: bool,
    has_prefetch: bool,
    block: usize,
) -> crate::Result<Vec<Option<HybridKey>>> {
    let mut out = Vec::new();
    for &e in exec {
        if !e.is_hybrid() {
            out.push(None);
            continue;
        }
        for (axis, present) in [("tier2", has_tier2), ("prefetch", has_prefetch)] {
            if present {
                return Err(SweepError::Grid {
                    key: format!("blocks[{block}].exec: {e}"),
                    reason: format!(
                        "exec {e} computes a non-resident expert on the CPU, so the block's `{axis}` axis does not \
                         apply (SEMANTICS.md §14): put exec host in a block without {axis}"
                    ),
                });
            }
        }
        if overlap.is_empty() {
            out.push(Some(HybridKey { exec: e, overlap: None }));
        }
        out.extend(overlap.iter().map(|&o| Some(HybridKey { exec: e, overlap: Some(o) })));
    }
    if out.is_empty() {
        return Err(SweepError::Grid {
            key: format!("blocks[{block}].exec: []"),
            reason: "an empty list gives no configurations: omit `exec` for transfer".into(),
        });
    }
    Ok(out)
}

/// Checks that every profile can price a hybrid configuration: its fields in range (the one rule,
/// [`DeviceProfile::check`], through [`DeviceProfile::hybrid`]), `host_gbps` present, and
/// `link_gbps` when the configuration may load or copy (`host` with a cache, `host:R`). With
/// these, [`figures`] cannot fail: the cost of §14 refuses only a device out of the rule's
/// ranges, a missing link, or times that overflow, which the rule's bounds exclude.
///
/// # Errors
/// [`SweepError::Grid`] naming the configuration and the profile.
pub(crate) fn check_profiles(key: &crate::ConfigKey, h: &HybridKey, profiles: &[DeviceProfile]) -> crate::Result<()> {
    let may_move = matches!(h.exec, Exec::HostBatch(_))
        || key.cap > 0
        || key.layer_caps.as_ref().is_some_and(|c| c.caps.iter().any(|&c| c > 0));
    for p in profiles {
        let named = |reason: String| SweepError::Grid { key: format!("{key} with profile {:?}", p.name), reason };
        p.hybrid(h.overlap).map_err(|e| named(e.to_string()))?;
        if may_move && p.link_gbps.is_none() {
            return Err(named(format!(
                "exec {} with this cache loads or copies experts over the host-to-GPU link: give the profile \
                 link_gbps (GB/s)",
                h.exec
            )));
        }
    }
    Ok(())
}

/// Replays one hybrid configuration (validated by `prepare`) on `view`.
pub(crate) fn replay(
    view: &TraceView<'_>,
    keep: &Keep,
    cfg: &ReplayConfig,
    dep: &Deployment,
    exec: Exec,
) -> (HybridCounts, HybridEvents) {
    cachesim::hybrid::replay_hybrid(view, keep, cfg, dep, exec).expect("validated by prepare")
}

/// The figures of a hybrid row: the counts and, per profile, the §14 cost of `events` with the
/// key's overlap (else the profile's). `prepare` ran [`check_profiles`] on the key, which makes
/// both steps below infallible (see there).
pub(crate) fn figures(
    profiles: &[DeviceProfile],
    counts: &HybridCounts,
    events: &HybridEvents,
    h: &HybridKey,
) -> HybridFigures {
    let cost = profiles
        .iter()
        .map(|p| {
            let dev = p.hybrid(h.overlap).expect("check_profiles: in range, with host_gbps");
            let c = events.cost(&dev).expect("check_profiles: in range, with a link when moving; finite times");
            HybridCostEntry {
                profile: p.name.clone(),
                overlap: dev.overlap,
                tok_s: c.tok_s,
                host_s_per_row: c.host_s_per_row,
                gpu_s_per_row: c.gpu_s_per_row,
                link_s_per_row: c.link_s_per_row,
            }
        })
        .collect();
    HybridFigures {
        host_runs: counts.host_runs,
        loads: counts.loads,
        copies: counts.copies,
        pinned_hits: counts.deploy.pinned_hits,
        steps: counts.deploy.steps,
        rows: counts.deploy.rows,
        cost,
    }
}

/// The §6-shaped cost entries of a hybrid row, so that its CSV columns line up with the others:
/// per profile and bandwidth, no SSD traffic (experts live in host memory) and §14's tok/s.
pub(crate) fn costs(profiles: &[DeviceProfile], f: &HybridFigures) -> Vec<crate::Cost> {
    profiles
        .iter()
        .zip(&f.cost)
        .flat_map(|(p, h)| {
            p.bandwidth_gbps.iter().map(move |&bw| crate::Cost {
                profile: p.name.clone(),
                bandwidth_gbps: bw,
                ssd_mb_per_token: 0.0,
                tok_s: h.tok_s,
            })
        })
        .collect()
}
