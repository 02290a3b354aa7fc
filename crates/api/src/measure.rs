//! `profile measure`: this machine's §14 figures measured with llama.cpp's CPU kernels on a GGUF
//! model's tensors (`capture::measure`), written as a device profile that `--profile-file` reads.

use std::path::PathBuf;

use serde_json::{Value, json};
use sweep::DeviceProfile;

use crate::error::{Error, Result};
use crate::usage;

/// What `profile measure` takes.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct MeasureRequest {
    /// The model and the timing settings.
    pub config: capture::measure::MeasureConfig,
    /// The profile to write (`None`: only the report).
    pub output: Option<PathBuf>,
}

/// What was measured and the profile made of it.
#[derive(Debug, Clone)]
pub struct MeasureReport {
    /// The timings.
    pub measured: capture::measure::Measured,
    /// The profile: `expert_mb`, `compute_ms` (the dense weights' products of one token),
    /// `host_gbps`, `host_ms_per_row`, `host_sync_ms` (the fixed part of a layer's expert ops), and
    /// with a disk the rate of a cold expert read through `mmap` as its one SSD bandwidth.
    pub profile: DeviceProfile,
}

impl MeasureRequest {
    /// Measures, makes the profile, checks it ([`DeviceProfile::check`]) and writes it.
    ///
    /// # Errors
    /// [`Error::Capture`] for the model or this build (without llama.cpp); [`Error::Usage`] for
    /// 0 repeats or an output that is a directory; [`Error::Sweep`] when the measured figures make
    /// no valid profile; [`Error::Io`] when it cannot be written.
    pub fn run(&self, progress: &mut dyn FnMut(&str)) -> Result<MeasureReport> {
        if let Some(o) = self.output.as_ref().filter(|o| o.is_dir()) {
            usage!("‹output› {} is a directory: name the profile file", o.display());
        }
        let m = capture::measure::measure(&self.config, progress)?;
        let name =
            self.config.model.file_stem().map_or_else(|| "measured".into(), |s| s.to_string_lossy().into_owned());
        let profile = DeviceProfile {
            name: format!("{name}-measured"),
            expert_mb: m.expert_mb,
            compute_ms: m.dense.median_ms,
            // A model streamed through mmap pays one cold mmap read per expert miss (§6).
            bandwidth_gbps: m.disk.as_ref().map(|d| vec![d.mmap_gbps()]).unwrap_or_default(),
            link_gbps: None,
            compute_ms_per_step: None,
            host_gbps: Some(m.host_gbps),
            host_ms_per_row: Some(m.host_ms_per_row),
            host_sync_ms: Some(m.host_sync_ms),
            overlap: None,
            gpu_gb: None,
        };
        profile.check()?;
        if let Some(out) = &self.output {
            let mut bytes =
                serde_json::to_vec_pretty(&profile).map_err(|e| Error::io(out, std::io::Error::other(e)))?;
            bytes.push(b'\n');
            trace_io::write_atomic(out, |w| w.write_all(&bytes)).map_err(|e| Error::io(out, e))?;
        }
        Ok(MeasureReport { measured: m, profile })
    }
}

impl MeasureReport {
    /// The `moe-offload-profile-measure` document.
    pub fn document(&self) -> Value {
        json!({
            "kind": crate::kind::PROFILE_MEASURE,
            "profile": self.profile,
            "measured": self.measured,
        })
    }
}
