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
            link_gbps: None,
            compute_ms_per_step: None,
        }
    }

    /// A profile whose expert size comes from a model shape.
    pub fn from_shape(name: &str, shape: ExpertShape, compute_ms: f64, bandwidth_gbps: Vec<f64>) -> DeviceProfile {
        DeviceProfile {
            name: name.into(),
            expert_mb: shape.expert_mb(),
            compute_ms,
            bandwidth_gbps,
            link_gbps: None,
            compute_ms_per_step: None,
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
