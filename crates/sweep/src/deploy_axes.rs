//! The deployment axes of a grid block (SEMANTICS.md §9–§11): `pin` (pin-map files), `tier2`
//! (`POLICY:CAP`) and `batch` (re-batching by B), their part of a configuration's key, and the
//! replay of those configurations.

use std::cmp::Ordering;
use std::path::{Path, PathBuf};

use cachesim::Keep;
use cachesim::deploy::{DeployCounts, Deployment, Schedule, Tier2};
use trace_io::TraceView;

use crate::{DeployCost, DeviceProfile};

/// A pin map of a grid block: the file's stem (its name in keys) and its experts per layer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct NamedPins {
    /// The file stem of the pin-map file.
    pub name: String,
    /// Pinned expert ids per trace layer.
    pub layers: Vec<Vec<u16>>,
}

/// The deployment part of a configuration key; `None` everywhere is the plain replay of §5.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct DeployKey {
    /// §9: the pin map.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin: Option<NamedPins>,
    /// §10: the second tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier2: Option<Tier2>,
    /// §11: re-batching by B.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
}

impl DeployKey {
    /// The key's suffix: `/pin:NAME`, `/t2:POLICY:CAP`, `/batch:B`, each when set.
    pub fn suffix(&self) -> String {
        let mut s = String::new();
        if let Some(p) = &self.pin {
            s += &format!("/pin:{}", p.name);
        }
        if let Some(t) = self.tier2 {
            s += &format!("/t2:{}:{}", t.policy, t.cap);
        }
        if let Some(b) = self.batch {
            s += &format!("/batch:{b}");
        }
        s
    }

    /// The deployment of this key on a trace of `shape` (the pin map was checked by
    /// `read_pins` against the grid's traces).
    ///
    /// # Errors
    /// cachesim's, for a pin map that does not fit the trace.
    pub fn deployment(&self, shape: &trace_io::Shape) -> cachesim::Result<Deployment> {
        Ok(Deployment {
            pins: self.pin.as_ref().map(|p| Keep::from_layers(shape, &p.layers)).transpose()?,
            tier2: self.tier2,
            schedule: self.batch.map_or(Schedule::PerToken, Schedule::Rebatch),
        })
    }
}

impl Ord for DeployKey {
    fn cmp(&self, o: &Self) -> Ordering {
        let t2 = |k: &DeployKey| k.tier2.map(|t| (t.policy.as_str(), t.cap));
        self.pin.cmp(&o.pin).then_with(|| t2(self).cmp(&t2(o))).then_with(|| self.batch.cmp(&o.batch))
    }
}

impl PartialOrd for DeployKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

/// The deployment figures of a row (SEMANTICS.md §9–§11).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct DeployFigures {
    /// Hits on pinned experts.
    pub pinned_hits: u64,
    /// Tier-2 hits.
    pub t2_hits: u64,
    /// Reads from storage.
    pub storage_reads: u64,
    /// Steps counted.
    pub steps: u64,
    /// Rows counted.
    pub rows: u64,
    /// misses / steps.
    pub loads_per_step: f64,
}

impl DeployFigures {
    /// The figures of `c`.
    pub fn of(c: &DeployCounts) -> DeployFigures {
        DeployFigures {
            pinned_hits: c.pinned_hits,
            t2_hits: c.t2_hits,
            storage_reads: c.storage_reads,
            steps: c.steps,
            rows: c.rows,
            loads_per_step: c.loads_per_step(),
        }
    }
}

/// Reads a pin-map file of a grid's `pin` axis (a keep-map JSON; per-layer sizes allowed).
pub(crate) fn read_pins(path: &Path) -> Result<NamedPins, String> {
    let map = saliency::KeepMap::read_json(path).map_err(|e| e.to_string())?;
    let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    Ok(NamedPins { name, layers: map.layers })
}

/// The deployment axes of one block, expanded: every (pin, tier2, batch) combination.
pub(crate) fn expand_axes(
    pins: &[Option<PathBuf>],
    tier2: &[Option<String>],
    batch: &[Option<usize>],
    block: usize,
) -> crate::Result<Vec<Option<DeployKey>>> {
    let err = |key: String, reason: String| crate::SweepError::Grid { key, reason };
    let mut read = Vec::new();
    for p in pins {
        read.push(match p {
            Some(path) => {
                Some(read_pins(path).map_err(|r| err(format!("blocks[{block}].pin: {}", path.display()), r))?)
            }
            None => None,
        });
    }
    let mut out = Vec::new();
    for pin in &read {
        for t in tier2 {
            let tier2 = t
                .as_deref()
                .map(|s| s.parse::<Tier2>().map_err(|e| e.to_string()))
                .transpose()
                .map_err(|r| err(format!("blocks[{block}].tier2: {}", t.as_deref().unwrap_or_default()), r))?;
            for &b in batch {
                let key = DeployKey { pin: pin.clone(), tier2, batch: b };
                out.push((key != DeployKey::default()).then_some(key));
            }
        }
    }
    Ok(out)
}

/// The cost entries of a deployed row: per profile and bandwidth, SSD MB per token from the
/// storage reads (plus forced misses without tier 2, as §6) and tok/s of [`DeployCost`].
pub(crate) fn costs(profiles: &[DeviceProfile], c: &DeployCounts, key: &DeployKey) -> Vec<crate::Cost> {
    let served = key.batch.is_some();
    profiles
        .iter()
        .flat_map(|p| {
            p.bandwidth_gbps.iter().map(move |&bw| {
                let cost = DeployCost::of(p, c, key.tier2.is_some(), served, bw);
                let reads = if key.tier2.is_some() { c.storage_reads } else { c.counts.misses };
                crate::Cost {
                    profile: p.name.clone(),
                    bandwidth_gbps: bw,
                    ssd_mb_per_token: reads as f64 / c.rows.max(1) as f64 * p.expert_mb,
                    tok_s: cost.tok_s,
                }
            })
        })
        .collect()
}

/// Replays one deployed configuration (validated) on `view`.
pub(crate) fn replay(view: &TraceView<'_>, keep: &Keep, cfg: &cachesim::ReplayConfig, key: &DeployKey) -> DeployCounts {
    let dep = key.deployment(&view.shape()).expect("validated by prepare");
    cachesim::deploy::replay(view, keep, cfg, &dep).expect("validated by prepare")
}
