//! The deployment flags of `moe-offload replay` (SEMANTICS.md §9–§11): `--pin`, `--tier2`,
//! `--served`, `--batch`, and the cost flags; what they add to the output.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use cachesim::Keep;
use cachesim::deploy::{DeployCounts, Deployment, Schedule, Tier2};
use cachesim::hybrid::Exec;
use clap::Args;
use saliency::KeepMap;
use sweep::{DeployCost, DeviceProfile};
use trace_io::{Shape, TraceMeta};

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Pin map: a keep-map JSON (as `keep --metric frequency --k 8` writes; per-layer sizes
    /// allowed) of experts held resident outside the cache (SEMANTICS.md §9). Memory per layer
    /// = pins + cap; `--cap 0` streams every unpinned expert.
    #[arg(long)]
    pub pin: Option<PathBuf>,
    // A second memory tier under the cache, POLICY:CAP (its help names the policies).
    #[arg(long, help = crate::args::tier2_help())]
    pub tier2: Option<String>,
    /// Served replay on the trace's engine steps (`step_offsets`, SEMANTICS.md §11).
    #[arg(long, conflicts_with = "batch")]
    pub served: bool,
    /// Re-batching: serve B of the trace's sequences at once (`seq_offsets`, SEMANTICS.md §11).
    #[arg(long, value_parser = crate::args::at_least_one)]
    pub batch: Option<usize>,
    /// Tier-2 to tier-1 link bandwidth in GB/s for the cost (with --tier2), or host to device
    /// for hybrid execution (with --exec host; required there when the profile has none).
    #[arg(long)]
    pub link_gbps: Option<f64>,
    /// Compute per engine step in ms for the served cost (needs --served or --batch; default:
    /// the profile's compute_ms).
    #[arg(long, value_parser = crate::args::non_negative)]
    pub compute_ms_per_step: Option<f64>,
}

impl DeployArgs {
    /// Whether the replay is served (recorded or re-batched steps).
    pub fn served(&self) -> bool {
        self.served || self.batch.is_some()
    }
}

/// The deployment the flags ask for, with the pin map read and checked against the trace.
pub fn deployment(
    a: &DeployArgs,
    exec: Exec,
    meta: &TraceMeta,
    shape: &Shape,
    read_keep: impl Fn(&Path) -> Result<KeepMap>,
) -> Result<Deployment> {
    if a.link_gbps.is_some() && a.tier2.is_none() && !exec.is_hybrid() {
        bail!(
            "--link-gbps is the bandwidth from tier 2 to tier 1, or from host to GPU under --exec host: it applies \
             only with --tier2 or --exec host"
        );
    }
    if a.compute_ms_per_step.is_some() && !a.served() && !exec.is_hybrid() {
        bail!(
            "--compute-ms-per-step is the compute of an engine step: it applies only with --served, --batch or \
             --exec host"
        );
    }
    if let Some(g) = a.link_gbps.filter(|g| !(g.is_finite() && *g > 0.0)) {
        bail!("--link-gbps {g}: must be a positive bandwidth in GB/s");
    }
    let pins = match &a.pin {
        Some(p) => {
            let layers = match super::inputs::plan_pins(p)? {
                Some(layers) => layers,
                None => {
                    let map = read_keep(p).with_context(|| format!("--pin {} is not a keep map", p.display()))?;
                    super::inputs::check_map_fits(&map, meta, p).with_context(|| format!("--pin {}", p.display()))?;
                    map.layers
                }
            };
            Some(Keep::from_layers(shape, &layers).with_context(|| format!("pin map {}", p.display()))?)
        }
        None => None,
    };
    let schedule = match (a.served, a.batch) {
        (true, _) => Schedule::Served,
        (false, Some(b)) => Schedule::Rebatch(b),
        (false, None) => Schedule::PerToken,
    };
    Ok(Deployment {
        pins,
        tier2: a.tier2.as_deref().map(|s| s.parse::<Tier2>().with_context(|| format!("--tier2 {s:?}"))).transpose()?,
        schedule,
    })
}

/// The fields `--json` adds to the §5 ones, and the cost at each bandwidth of `profile` (replay's
/// `--profile-file` or `--profile`, else the trace model's preset, else the reference) with the
/// link and step flags.
pub fn json_extras(
    a: &DeployArgs,
    profile: DeviceProfile,
    dep: &Deployment,
    c: &DeployCounts,
) -> Result<serde_json::Value> {
    let mut p = profile;
    p.link_gbps = a.link_gbps.or(p.link_gbps);
    p.compute_ms_per_step = a.compute_ms_per_step.or(p.compute_ms_per_step);
    let costs: Vec<DeployCost> =
        p.bandwidth_gbps.iter().map(|&bw| DeployCost::of(&p, c, dep.tier2.is_some(), a.served(), bw)).collect();
    let schedule = match dep.schedule {
        Schedule::PerToken => "per_token".to_string(),
        Schedule::Served => "served".to_string(),
        Schedule::Rebatch(b) => format!("batch:{b}"),
    };
    Ok(serde_json::json!({
        "pinned_hits": c.pinned_hits, "t2_hits": c.t2_hits, "storage_reads": c.storage_reads,
        "steps": c.steps, "rows": c.rows, "loads_per_step": c.loads_per_step(),
        "lookup_hit_rate": c.lookup_hit_rate(),
        "layer_pins": c.layer_pins, "schedule": schedule,
        "tier2": dep.tier2.map(|t| format!("{}:{}", t.policy, t.cap)),
        "cost": { "profile": p.name, "expert_mb": p.expert_mb, "compute_ms": p.compute_ms,
                  "link_gbps": p.link_gbps, "compute_ms_per_step": p.compute_ms_per_step, "at": costs },
    }))
}

/// One line for the table output, when the deployment is not plain.
pub fn summary_line(c: &DeployCounts, dep: &Deployment) -> String {
    let mut s = format!("steps {}, rows {}, loads/step {:.3}", c.steps, c.rows, c.loads_per_step());
    if dep.schedule != Schedule::PerToken {
        // Served and re-batched hits and misses count per (step, expert), picks per row (§11).
        s += &format!(
            ", lookup hit rate {:.4} (hits / (hits + misses); the table's hit rate is §5's hits / picks)",
            c.lookup_hit_rate()
        );
    }
    if dep.pins.is_some() {
        s += &format!(", pinned hits {} (pins per layer {:?})", c.pinned_hits, c.layer_pins);
    }
    if dep.tier2.is_some() {
        s += &format!(", tier-2 hits {}, storage reads {}", c.t2_hits, c.storage_reads);
    }
    s
}
