//! The cost model of SEMANTICS.md §6: SSD traffic and tokens per second from misses per token.

/// A device profile: what one expert costs to load and what a token costs to compute.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    /// Profile name (shown in result columns).
    pub name: String,
    /// Bytes of one expert as stored, in MB of 10^6 bytes.
    pub expert_mb: f64,
    /// Compute time per token, in milliseconds, with every expert already in memory.
    pub compute_ms: f64,
    /// SSD read bandwidths to evaluate, in GB/s (10^9 bytes per second).
    pub bandwidth_gbps: Vec<f64>,
    /// Tier-2 to tier-1 link bandwidth in GB/s (SEMANTICS.md §10), if the device has a second
    /// tier; see [`crate::DeployCost`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_gbps: Option<f64>,
    /// Compute time of one engine step in ms (SEMANTICS.md §11, an assumption); `None` = one
    /// token's `compute_ms`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_ms_per_step: Option<f64>,
    /// Hybrid execution (SEMANTICS.md §14): the bandwidth, in GB/s, that the CPU's expert
    /// kernels reach reading experts from host memory (not the DRAM peak). Measure it from one
    /// all-CPU run (every expert on the CPU, `--n-cpu-moe` = all layers in llama.cpp) of r tok/s
    /// at one row per step: `host_gbps = expert_mb · picks_per_token / (1000 · (1/r − compute_ms/1000))`
    /// (§14's step time solved for it, with host_ms_per_row and host_sync_ms 0). Required for
    /// `exec host`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_gbps: Option<f64>,
    /// §14: CPU compute per row per expert, ms (default 0: host runs are memory bound). Measure:
    /// the slope of a host run's time against the rows of a prefill batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ms_per_row: Option<f64>,
    /// §14: the synchronisation cost of a layer with host runs, ms (default 0): a runtime's
    /// CPU-GPU hand-off per layer (e.g. one `cudaStreamSynchronize` and a copy of the hidden state).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_sync_ms: Option<f64>,
    /// §14: how the host and GPU parts of a layer combine (default sequential, llama.cpp;
    /// concurrent for kTransformers and HybriMoE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap: Option<cachesim::hybrid::Overlap>,
    /// GPU memory left for routed experts and the KV cache, GB (10^9 bytes): the card's memory
    /// minus the dense weights and the runtime's context. The default budget of
    /// `plan --exec host`, which fits its pinned experts (Σ n_l · expert_mb / 1000) and `--kv-gb`
    /// in it (docs/grid-format.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_gb: Option<f64>,
}

/// The largest `expert_mb` a profile may give, MB: one expert of a terabyte, past any model
/// (bigger sizes make the times of §6–§14 overflow).
pub const EXPERT_MB_MAX: f64 = 1e6;
/// The lowest bandwidth a profile may give, GB/s: a kilobyte per second (slower gives times no
/// machine has, and 0 infinite ones).
pub const GBPS_MIN: f64 = 1e-6;
/// The longest time a profile may give (`compute_ms`, `compute_ms_per_step`, `host_ms_per_row`,
/// `host_sync_ms`), ms: about 11.6 days.
pub const MS_MAX: f64 = 1e9;

/// A value as an error message shows it: `1.7e308` and `1e-300` rather than their 300 digits.
fn show(v: f64) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e15).contains(&v.abs()) { format!("{v:e}") } else { v.to_string() }
}

/// A model shape from which [`DeviceProfile::expert_mb`] is derived.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertShape {
    /// Model hidden size.
    pub hidden: u64,
    /// Intermediate size of one routed expert's MLP.
    pub moe_intermediate: u64,
    /// Bits per stored weight (16 for bf16, 4.5 for a typical 4-bit quantization with scales).
    pub bits_per_weight: f64,
}

impl ExpertShape {
    /// `3 · hidden · moe_intermediate · bits_per_weight / 8 / 10^6` MB (gate, up and down
    /// projections of a SwiGLU expert; SEMANTICS.md §6).
    pub fn expert_mb(&self) -> f64 {
        3.0 * self.hidden as f64 * self.moe_intermediate as f64 * self.bits_per_weight / 8.0 / 1e6
    }
}

impl DeviceProfile {
    /// The reference profile of the original study: 48 layers, 512 experts, top-10,
    /// `expert_mb` 1.3824, 12 ms compute per token, 3.9 and 6.8 GB/s.
    pub fn reference() -> DeviceProfile {
        DeviceProfile {
            name: "reference".into(),
            expert_mb: 1.3824,
            compute_ms: 12.0,
            bandwidth_gbps: vec![3.9, 6.8],
            ..DeviceProfile::empty()
        }
    }

    /// A profile with the given name and nothing else: every optional field `None`, no bandwidth.
    fn empty() -> DeviceProfile {
        DeviceProfile {
            name: String::new(),
            expert_mb: 0.0,
            compute_ms: 0.0,
            bandwidth_gbps: Vec::new(),
            link_gbps: None,
            compute_ms_per_step: None,
            host_gbps: None,
            host_ms_per_row: None,
            host_sync_ms: None,
            overlap: None,
            gpu_gb: None,
        }
    }

    /// Reads a profile file (`--profile-file hw.json`): one JSON object with the fields of
    /// [`DeviceProfile`] (unknown fields refused, named); `name` defaults to the file stem and
    /// `bandwidth_gbps` to `[]` when absent, and the fields are checked by
    /// [`DeviceProfile::check`].
    ///
    /// # Errors
    /// [`crate::SweepError::Io`] if the file cannot be read, [`crate::SweepError::Json`] naming the file for a
    /// malformed or unknown field, [`crate::SweepError::ProfileFile`] naming the file and the field for a field
    /// given twice, [`crate::SweepError::Profile`] naming the field for a bad value.
    pub fn read(path: &std::path::Path) -> crate::Result<DeviceProfile> {
        let bytes = trace_io::read_text(path).map_err(|source| crate::SweepError::Io { path: path.into(), source })?;
        let mut v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|source| crate::SweepError::Json { path: path.into(), source })?;
        if let Some(key) = trace_io::repeated_top_key(&bytes) {
            return Err(crate::SweepError::ProfileFile {
                path: path.into(),
                key,
                reason: "appears twice: the second value would replace the first without a word; give each field once"
                    .into(),
            });
        }
        if let Some(o) = v.as_object_mut() {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            o.entry("name").or_insert(serde_json::Value::String(stem));
            o.entry("bandwidth_gbps").or_insert(serde_json::json!([]));
        }
        let p: DeviceProfile =
            serde_json::from_value(v).map_err(|source| crate::SweepError::Json { path: path.into(), source })?;
        p.check()?;
        Ok(p)
    }

    /// THE rule of a device profile: every reader (a grid's `profiles`, [`DeviceProfile::read`]
    /// for `--profile-file`, a command's field overrides, `plan`, Python) and
    /// [`DeviceProfile::hybrid`] call it, so no other place checks a field's range. Ranges
    /// (docs/grid-format.md, "Profiles"):
    /// - `expert_mb` finite, > 0 and at most [`EXPERT_MB_MAX`];
    /// - `compute_ms`, and `compute_ms_per_step` when given, finite, > 0 (a token or step of no
    ///   dense compute has no tok/s) and at most [`MS_MAX`];
    /// - `host_ms_per_row`, `host_sync_ms` finite, >= 0 and at most [`MS_MAX`];
    /// - every bandwidth (`bandwidth_gbps`, `link_gbps`, `host_gbps`) finite and at least
    ///   [`GBPS_MIN`];
    /// - `gpu_gb` finite and >= 0.
    ///
    /// Within these, every time of SEMANTICS.md §6–§14 is finite: one load or host run takes at
    /// most `EXPERT_MB_MAX / (1000 · GBPS_MIN)` = 10^9 s, a step's compute at most 10^6 s per
    /// row, so even 2^64 of each stay far below f64's 10^308. Which fields a configuration
    /// needs (`host_gbps`, `link_gbps`) is its caller's check.
    ///
    /// # Errors
    /// [`crate::SweepError::Profile`] naming the profile, the field, the value and the range.
    pub fn check(&self) -> crate::Result<()> {
        let bad = |field: &'static str, v: f64, range: &str| {
            Err(crate::SweepError::Profile {
                name: self.name.clone(),
                field,
                reason: format!("{} must be {range}", show(v)),
            })
        };
        let e = self.expert_mb;
        if !(e.is_finite() && e > 0.0 && e <= EXPERT_MB_MAX) {
            return bad("expert_mb", e, "a finite size > 0 and at most 1e6 MB (one expert of a terabyte)");
        }
        let times = [
            ("compute_ms", Some(self.compute_ms), true),
            ("compute_ms_per_step", self.compute_ms_per_step, true),
            ("host_ms_per_row", self.host_ms_per_row, false),
            ("host_sync_ms", self.host_sync_ms, false),
        ];
        for (field, v, positive) in times {
            let ok = |v: f64| v.is_finite() && (v > 0.0 || !positive && v == 0.0) && v <= MS_MAX;
            if let Some(v) = v.filter(|&v| !ok(v)) {
                let range = if positive {
                    "finite, > 0 and at most 1e9 ms: a token or step of no dense compute has no tok/s"
                } else {
                    "finite, >= 0 and at most 1e9 ms"
                };
                return bad(field, v, range);
            }
        }
        if let Some(v) = self.gpu_gb.filter(|v| !(v.is_finite() && *v >= 0.0)) {
            return bad("gpu_gb", v, "finite and >= 0 GB");
        }
        let given = [("link_gbps", self.link_gbps), ("host_gbps", self.host_gbps)];
        let bandwidths = self.bandwidth_gbps.iter().map(|&b| ("bandwidth_gbps", Some(b)));
        for (field, v) in given.into_iter().chain(bandwidths) {
            if let Some(v) = v.filter(|v| !(v.is_finite() && *v >= GBPS_MIN)) {
                return bad(field, v, "a finite bandwidth of at least 1e-6 GB/s (a kilobyte per second)");
            }
        }
        Ok(())
    }

    /// The device of hybrid execution (SEMANTICS.md §14): this profile's expert size, compute,
    /// host and link fields, with `overlap` (else the profile's, else sequential).
    ///
    /// # Errors
    /// [`DeviceProfile::check`]'s, and [`crate::SweepError::Profile`] (field `host_gbps`) when the
    /// profile has no `host_gbps`.
    pub fn hybrid(&self, overlap: Option<cachesim::hybrid::Overlap>) -> crate::Result<cachesim::hybrid::HybridDevice> {
        self.check()?;
        let host_gbps = self.host_gbps.ok_or_else(|| crate::SweepError::Profile {
            name: self.name.clone(),
            field: "host_gbps",
            reason: "missing: exec host needs the bandwidth the CPU's expert kernels reach (GB/s; docs/hybrid.md says \
                     how to measure it)"
                .into(),
        })?;
        Ok(cachesim::hybrid::HybridDevice {
            expert_mb: self.expert_mb,
            compute_ms: self.compute_ms,
            compute_ms_per_step: self.compute_ms_per_step,
            host_gbps,
            host_ms_per_row: self.host_ms_per_row.unwrap_or(0.0),
            host_sync_ms: self.host_sync_ms.unwrap_or(0.0),
            link_gbps: self.link_gbps,
            overlap: overlap.or(self.overlap).unwrap_or_default(),
        })
    }

    /// A profile whose expert size comes from a model shape.
    pub fn from_shape(name: &str, shape: ExpertShape, compute_ms: f64, bandwidth_gbps: Vec<f64>) -> DeviceProfile {
        DeviceProfile {
            name: name.into(),
            expert_mb: shape.expert_mb(),
            compute_ms,
            bandwidth_gbps,
            ..DeviceProfile::empty()
        }
    }

    /// Named presets, see [`PRESETS`].
    pub fn preset(name: &str) -> Option<DeviceProfile> {
        PRESETS
            .iter()
            .find(|p| p.0 == name)
            .map(|&(name, shape, compute_ms)| DeviceProfile::from_shape(name, shape, compute_ms, vec![3.9, 6.8]))
            .or_else(|| (name == "reference").then(DeviceProfile::reference))
    }

    /// SSD megabytes read per token: `misses_per_token · expert_mb`.
    pub fn ssd_mb_per_token(&self, misses_per_token: f64) -> f64 {
        misses_per_token * self.expert_mb
    }

    /// Tokens per second at bandwidth `bw` GB/s:
    /// `1 / (compute_ms / 1000 + ssd_mb_per_token / (1000 · bw))` (SEMANTICS.md §6).
    pub fn tok_s(&self, misses_per_token: f64, bw: f64) -> f64 {
        1.0 / (self.compute_ms / 1000.0 + self.ssd_mb_per_token(misses_per_token) / (1000.0 * bw))
    }
}

/// The [`PRESETS`] entry for a trace's model name as the importers record it, if one matches
/// (case-insensitive): DeepSeek-V2-Lite and the ESFT models fine-tuned from it
/// (`dsv2-lite-bf16`), Qwen1.5-MoE (`qwen15-moe-bf16`), Mixtral-8x7B (`mixtral-8x7b-q4`).
pub fn preset_for_model(model: &str) -> Option<&'static str> {
    let m = model.to_ascii_lowercase();
    if m.contains("deepseek-v2-lite") || m.contains("esft-vanilla-lite") {
        Some("dsv2-lite-bf16")
    } else if m.contains("qwen1.5-moe") {
        Some("qwen15-moe-bf16")
    } else if m.contains("mixtral-8x7b") {
        Some("mixtral-8x7b-q4")
    } else {
        None
    }
}

/// Presets derived from model shapes (the study's 48-layer 512-expert model is [`DeviceProfile::reference`]) (name, shape, assumed compute ms per token), evaluated at
/// 3.9 and 6.8 GB/s. The compute times are assumptions for a laptop-class accelerator, stated so
/// they can be replaced; the expert sizes follow from the published model configurations.
pub const PRESETS: [(&str, ExpertShape, f64); 3] = [
    // DeepSeek-V2-Lite: hidden 2048, moe_intermediate_size 1408, bf16 -> 17.30 MB per expert.
    ("dsv2-lite-bf16", ExpertShape { hidden: 2048, moe_intermediate: 1408, bits_per_weight: 16.0 }, 20.0),
    // Qwen1.5-MoE-A2.7B: hidden 2048, moe_intermediate_size 1408, bf16 -> 17.30 MB.
    ("qwen15-moe-bf16", ExpertShape { hidden: 2048, moe_intermediate: 1408, bits_per_weight: 16.0 }, 20.0),
    // Mixtral-8x7B: hidden 4096, intermediate 14336, 4.5 bits -> 99.09 MB.
    ("mixtral-8x7b-q4", ExpertShape { hidden: 4096, moe_intermediate: 14336, bits_per_weight: 4.5 }, 30.0),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tok_s_follows_the_formula() {
        let p = DeviceProfile::reference();
        // 10 misses/token x 1.3824 MB = 13.824 MB; at 3.9 GB/s that is 3.5446 ms; + 12 ms compute.
        let t = p.tok_s(10.0, 3.9);
        assert!((t - 1.0 / (0.012 + 13.824 / 3900.0)).abs() < 1e-12);
        assert!((t - 64.331).abs() < 1e-3, "{t}");
        assert_eq!(p.tok_s(0.0, 6.8), 1.0 / 0.012);
        let dsv2 = DeviceProfile::preset("dsv2-lite-bf16").unwrap();
        assert!((dsv2.expert_mb - 17.301504).abs() < 1e-9);
    }

    #[test]
    fn a_profile_field_twice_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("hw.json");
        std::fs::write(&p, r#"{"expert_mb": 17.3, "compute_ms": 20, "bandwidth_gbps": [3.9], "compute_ms": 5}"#)
            .unwrap();
        let e = DeviceProfile::read(&p).unwrap_err();
        assert!(matches!(&e, crate::SweepError::ProfileFile { key, .. } if key == "compute_ms"), "{e}");
        assert!(e.to_string().contains("hw.json: key `compute_ms`: appears twice"), "{e}");
        std::fs::write(&p, r#"{"expert_mb": 17.3, "compute_ms": 20, "bandwidth_gbps": [3.9]}"#).unwrap();
        assert_eq!(DeviceProfile::read(&p).unwrap().compute_ms, 20.0);
    }

    #[test]
    fn model_names_of_the_importers_find_their_presets() {
        for (model, preset) in [
            ("deepseek-ai/ESFT-vanilla-lite (DeepSeek-V2-Lite shape)", Some("dsv2-lite-bf16")),
            ("deepseek-ai/DeepSeek-V2-Lite", Some("dsv2-lite-bf16")),
            ("Qwen/Qwen1.5-MoE-A2.7B", Some("qwen15-moe-bf16")),
            ("mistralai/Mixtral-8x7B-Instruct-v0.1 (FP8)", Some("mixtral-8x7b-q4")),
            ("synthetic 4x32 top-4", None),
            ("unknown", None),
        ] {
            assert_eq!(preset_for_model(model), preset, "{model}");
            // every name found is a preset
            assert!(preset.is_none_or(|p| DeviceProfile::preset(p).is_some()));
        }
    }
}
