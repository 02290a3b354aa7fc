//! The device profile of a command: a profile file, else a named preset, else the trace model's
//! preset, else the reference; then the overrides a request gives field by field.

use std::path::Path;

use sweep::DeviceProfile;
use trace_io::TraceMeta;

use crate::error::{Context, Error, Result};

/// `file` (`profile_file`), else the preset `name` (`profile`), else the preset of the trace's
/// model ([`sweep::preset_for_model`]), else `reference`.
///
/// # Errors
/// The file cannot be read or is not a valid profile; `name` is no preset (the error lists them).
pub fn base_profile(file: Option<&Path>, name: Option<&str>, meta: &TraceMeta) -> Result<DeviceProfile> {
    if let Some(path) = file {
        return DeviceProfile::read(path).with_context(|| format!("‹profile_file› {}", path.display()));
    }
    let inferred = name.is_none().then(|| sweep::preset_for_model(&meta.model)).flatten();
    let name = name.or(inferred).unwrap_or("reference");
    DeviceProfile::preset(name).ok_or_else(|| {
        let names: Vec<&str> = sweep::PRESETS.iter().map(|p| p.0).chain(["reference"]).collect();
        Error::usage(format!(
            "unknown ‹profile› {name:?}; expected one of: {}, or ‹profile_file› FILE (docs/grid-format.md)",
            names.join(", ")
        ))
    })
}

/// The fields of a profile a request may override, each `None` to keep the profile's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Overrides {
    /// Tier-2 to tier-1 (or host-to-GPU) link, GB/s.
    pub link_gbps: Option<f64>,
    /// Dense compute of one engine step, ms.
    pub compute_ms_per_step: Option<f64>,
    /// GB/s the CPU's expert kernels reach.
    pub host_gbps: Option<f64>,
    /// CPU compute per row per expert, ms.
    pub host_ms_per_row: Option<f64>,
    /// CPU-GPU synchronisation per layer with a host run, ms.
    pub host_sync_ms: Option<f64>,
    /// How a layer's CPU and GPU parts combine.
    pub overlap: Option<cachesim::hybrid::Overlap>,
}

impl Overrides {
    /// `p` with every given field replaced, checked by the one rule of a profile
    /// ([`DeviceProfile::check`]).
    ///
    /// # Errors
    /// A field out of its range, naming the profile, the field and the range.
    pub fn apply(&self, mut p: DeviceProfile) -> Result<DeviceProfile> {
        p.link_gbps = self.link_gbps.or(p.link_gbps);
        p.compute_ms_per_step = self.compute_ms_per_step.or(p.compute_ms_per_step);
        p.host_gbps = self.host_gbps.or(p.host_gbps);
        p.host_ms_per_row = self.host_ms_per_row.or(p.host_ms_per_row);
        p.host_sync_ms = self.host_sync_ms.or(p.host_sync_ms);
        p.overlap = self.overlap.or(p.overlap);
        p.check().map_err(|e| {
            let given = match &e {
                sweep::SweepError::Profile { field, .. } => self.given(field),
                _ => None,
            };
            match given {
                Some(name) => Error::from(e).hint(format!("‹{name}› gives it")),
                None => Error::from(e),
            }
        })?;
        Ok(p)
    }

    /// `field` when this request overrides it (the option and the field share the name).
    fn given(&self, field: &'static str) -> Option<&'static str> {
        let given = [
            ("link_gbps", self.link_gbps),
            ("compute_ms_per_step", self.compute_ms_per_step),
            ("host_gbps", self.host_gbps),
            ("host_ms_per_row", self.host_ms_per_row),
            ("host_sync_ms", self.host_sync_ms),
        ];
        given.iter().any(|&(f, v)| f == field && v.is_some()).then_some(field)
    }
}
