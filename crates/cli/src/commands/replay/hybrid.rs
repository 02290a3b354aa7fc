//! The hybrid-execution flags of `moe-offload replay` (SEMANTICS.md §14): `--exec`, `--overlap`,
//! the host fields of a device and `--profile-file`; the replay and what it adds to the output.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::hybrid::{Exec, HybridCost, HybridCounts, HybridDevice, Overlap};
use clap::Args;
use sweep::DeviceProfile;
use trace_io::TraceView;

/// The flags of hybrid execution.
#[derive(Debug, Args)]
pub struct HybridArgs {
    /// What happens to a chosen expert that is not GPU-resident (SEMANTICS.md §14): `transfer`
    /// (loaded, the default), `host` (computed on the CPU from host memory; with --cap > 0 also
    /// copied into the GPU cache in the background), `host:R` (as host, but a step of >= R rows
    /// transfers its experts for that step, llama.cpp's prefill rule with R = 32; needs --cap 0).
    #[arg(long, default_value = "transfer", value_name = "EXEC")]
    pub exec: Exec,
    /// How a layer's CPU and GPU parts combine under --exec host: sequential (llama.cpp; the
    /// default, or the profile's) or concurrent (kTransformers, HybriMoE).
    #[arg(long)]
    pub overlap: Option<Overlap>,
    /// GB/s the CPU's expert kernels reach reading host memory (not the DRAM peak); overrides the
    /// profile's. See docs/hybrid.md for how to measure it from one all-CPU run.
    #[arg(long, value_name = "GBPS", value_parser = crate::args::positive)]
    pub host_gbps: Option<f64>,
    /// CPU compute per row per expert, in ms (default: the profile's, else 0).
    #[arg(long, value_name = "MS", value_parser = crate::args::non_negative)]
    pub host_ms_per_row: Option<f64>,
    /// CPU-GPU synchronisation per layer with a host run, in ms (default: the profile's, else 0).
    #[arg(long, value_name = "MS", value_parser = crate::args::non_negative)]
    pub host_sync_ms: Option<f64>,
    /// A device profile file (JSON: expert_mb, compute_ms, host_gbps, link_gbps, ...; see
    /// docs/grid-format.md), instead of the named --profile.
    #[arg(long, value_name = "FILE", conflicts_with = "profile")]
    pub profile_file: Option<PathBuf>,
}

impl HybridArgs {
    /// Whether a host flag was given without `--exec host`.
    pub fn stray_flag(&self) -> Option<&'static str> {
        if self.exec.is_hybrid() {
            return None;
        }
        [
            (self.overlap.is_some(), "--overlap"),
            (self.host_gbps.is_some(), "--host-gbps"),
            (self.host_ms_per_row.is_some(), "--host-ms-per-row"),
            (self.host_sync_ms.is_some(), "--host-sync-ms"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }
}

/// The profile of a replay: `--profile-file`, else the named `--profile`, else the trace
/// model's preset, else the reference.
pub fn base_profile(file: Option<&std::path::Path>, name: Option<&str>, v: &TraceView<'_>) -> Result<DeviceProfile> {
    if let Some(path) = file {
        return DeviceProfile::read(path).with_context(|| format!("--profile-file {}", path.display()));
    }
    let inferred = name.is_none().then(|| sweep::preset_for_model(&v.meta().model)).flatten();
    let name = name.or(inferred).unwrap_or("reference");
    DeviceProfile::preset(name).with_context(|| {
        let names: Vec<&str> = sweep::PRESETS.iter().map(|p| p.0).chain(["reference"]).collect();
        format!("unknown --profile {name:?}; expected one of: {}, or --profile-file FILE", names.join(", "))
    })
}

/// The hybrid device: the profile with the flags' overrides (`link_gbps` and
/// `compute_ms_per_step` from the deployment flags).
pub fn device(
    h: &HybridArgs,
    profile: &mut DeviceProfile,
    link_gbps: Option<f64>,
    compute_ms_per_step: Option<f64>,
) -> Result<HybridDevice> {
    profile.host_gbps = h.host_gbps.or(profile.host_gbps);
    profile.host_ms_per_row = h.host_ms_per_row.or(profile.host_ms_per_row);
    profile.host_sync_ms = h.host_sync_ms.or(profile.host_sync_ms);
    profile.link_gbps = link_gbps.or(profile.link_gbps);
    profile.compute_ms_per_step = compute_ms_per_step.or(profile.compute_ms_per_step);
    profile.overlap = h.overlap.or(profile.overlap);
    match profile.hybrid(None) {
        Ok(d) => Ok(d),
        Err(e) => bail!("{e}: give --host-gbps, or a --profile-file with host_gbps"),
    }
}

/// Prices the events, naming the flag to add when the link is missing.
pub fn cost(events: &cachesim::hybrid::HybridEvents, dev: &HybridDevice, exec: Exec) -> Result<HybridCost> {
    events.cost(dev).map_err(|e| match e {
        cachesim::CacheSimError::InvalidParameter { name: "link_gbps", .. } => anyhow::anyhow!(
            "{e}: give --link-gbps (host-to-GPU GB/s){}",
            if exec == Exec::Host { ", or --cap 0 for a static placement that copies nothing" } else { "" }
        ),
        e => e.into(),
    })
}

/// The fields `--json` adds for a hybrid replay (they replace the deployed `cost`).
pub fn json_fields(
    exec: Exec,
    c: &HybridCounts,
    p: &DeviceProfile,
    dev: &HybridDevice,
    cost: &HybridCost,
) -> serde_json::Value {
    sweep::hybrid_fields(exec, c, &p.name, dev, cost)
}

/// One line for the table output.
pub fn summary_line(exec: Exec, c: &HybridCounts, p: &DeviceProfile, dev: &HybridDevice, cost: &HybridCost) -> String {
    format!(
        "exec {exec} ({}), profile {}: host runs {}, loads {}, copies {}; {:.3} tok/s (per row: host {:.3} ms, GPU \
         {:.3} ms, link {:.3} ms)",
        dev.overlap,
        p.name,
        c.host_runs,
        c.loads,
        c.copies,
        cost.tok_s,
        1000.0 * cost.host_s_per_row,
        1000.0 * cost.gpu_s_per_row,
        1000.0 * cost.link_s_per_row
    )
}
