//! The deployment flags of `moe-offload replay` (SEMANTICS.md §9–§11): `--pin`, `--tier2`,
//! `--served`, `--batch`, and the cost flags; the line they add to the table.

use std::path::PathBuf;

use cachesim::deploy::{DeployCounts, Deployment, Schedule};
use clap::Args;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Pin map: a keep-map JSON (as `keep --metric frequency --k 8` writes; per-layer sizes
    /// allowed) of experts held resident outside the cache (SEMANTICS.md §9), a plan made with
    /// `--pin-counts`, or a hybrid plan (`plan --exec host`: its per-expert pins). Memory per
    /// layer = pins + cap; `--cap 0` streams every unpinned expert.
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
