//! The hybrid-execution flags of `moe-offload replay` (SEMANTICS.md §14): `--exec`, `--overlap`,
//! the host fields of a device and `--profile-file`; the line they add to the table.

use std::path::PathBuf;

use api::replay::Hybrid;
use cachesim::hybrid::{Exec, Overlap};
use clap::Args;
use sweep::DeviceProfile;

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

/// One line for the table output.
pub fn summary_line(h: &Hybrid, p: &DeviceProfile) -> String {
    let (exec, c, dev, cost) = (h.exec, &h.counts, &h.device, &h.cost);
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
