//! The cost of hybrid execution (SEMANTICS.md §14), from a replay's [`HybridEvents`].

use serde::{Deserialize, Serialize};

use super::{HybridEvents, Overlap};
use crate::{CacheSimError, Result};

/// The device fields the cost of §14 reads. Every bandwidth in GB/s (10^9 bytes per second),
/// every size in MB (10^6 bytes), every time in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HybridDevice {
    /// Bytes of one expert as stored, MB.
    pub expert_mb: f64,
    /// Dense compute per row (token) on the GPU, ms: `c_s = compute_ms · rows` when
    /// `compute_ms_per_step` is not given.
    pub compute_ms: f64,
    /// Dense compute of one engine step, ms (§11), when given.
    pub compute_ms_per_step: Option<f64>,
    /// The bandwidth the CPU's expert kernels reach reading host memory, GB/s (not the DRAM
    /// peak): a host run takes at least `expert_mb / (1000 · host_gbps)` s.
    pub host_gbps: f64,
    /// CPU compute per row per expert, ms (default 0): a host run chosen by n rows takes at
    /// least `n · host_ms_per_row / 1000` s.
    pub host_ms_per_row: f64,
    /// Synchronisation per (step, layer) with a host run, ms (default 0).
    pub host_sync_ms: f64,
    /// Host-to-GPU link, GB/s: loads of `host:R` and background copies; required when either
    /// occurs.
    pub link_gbps: Option<f64>,
    /// How the host and GPU parts of a layer combine.
    pub overlap: Overlap,
}

/// The cost of one hybrid replay on one device (SEMANTICS.md §14), over counted steps.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct HybridCost {
    /// Rows counted per second of step time.
    pub tok_s: f64,
    /// Σ h (host parts) per row counted, seconds.
    pub host_s_per_row: f64,
    /// Σ g (GPU parts: dense compute and loads) per row counted, seconds.
    pub gpu_s_per_row: f64,
    /// (loads + copies) · τ per row counted, seconds.
    pub link_s_per_row: f64,
    /// Σ counted step times, seconds.
    pub total_s: f64,
}

impl HybridDevice {
    /// Checks the fields: finite, `expert_mb`, `compute_ms`, `host_ms_per_row`, `host_sync_ms`
    /// at least 0, `host_gbps` above 0, `link_gbps` above 0 when given, `compute_ms_per_step`
    /// above 0 when given (else `compute_ms` above 0: a step takes time).
    ///
    /// # Errors
    /// [`CacheSimError::InvalidParameter`] naming the field.
    pub fn check(&self) -> Result<()> {
        let bad = |name: &'static str, v: f64, reason: &'static str| {
            Err(CacheSimError::InvalidParameter { name, value: v.to_string(), reason })
        };
        for (name, v) in [
            ("expert_mb", self.expert_mb),
            ("compute_ms", self.compute_ms),
            ("host_ms_per_row", self.host_ms_per_row),
            ("host_sync_ms", self.host_sync_ms),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(name, v, "must be finite and >= 0");
            }
        }
        if let Some(v) = self.compute_ms_per_step.filter(|v| !(v.is_finite() && *v > 0.0)) {
            return bad("compute_ms_per_step", v, "must be finite and > 0 (a step's dense compute)");
        }
        if self.compute_ms_per_step.is_none() && self.compute_ms <= 0.0 {
            return bad("compute_ms", self.compute_ms, "must be > 0: a step of no time has no tok/s");
        }
        if !(self.host_gbps.is_finite() && self.host_gbps > 0.0) {
            return bad("host_gbps", self.host_gbps, "must be finite and > 0 (GB/s the CPU's expert kernels reach)");
        }
        if let Some(v) = self.link_gbps.filter(|v| !(v.is_finite() && *v > 0.0)) {
            return bad("link_gbps", v, "must be finite and > 0");
        }
        Ok(())
    }
}

impl HybridEvents {
    /// Prices the events on `dev` (SEMANTICS.md §14). Per counted step s and layer l, with
    /// c_s = `compute_ms_per_step`, else `compute_ms · rows(s)`, τ = expert_mb / (1000 ·
    /// link_gbps), a = expert_mb / (1000 · host_gbps), b = host_ms_per_row / 1000:
    /// - g = c_s / (1000 · L) + loads(s, l) · τ;
    /// - h = Σ over host runs e of max(a, n_e · b), plus host_sync_ms / 1000 when there is one;
    /// - layer time = g + h (`sequential`) or max(g, h) (`concurrent`);
    /// - step time = max(Σ_l layer times, copies(s) · τ), copies(s) summed over layers.
    ///
    /// tok/s = rows counted / Σ step times (0 when nothing was counted or the time is 0).
    /// Sums run over steps, then layers in order (the runs one row chose first, as one product,
    /// then the others in order), so the figure is the same whatever the thread count of the
    /// replay.
    ///
    /// # Errors
    /// [`HybridDevice::check`]'s, and [`CacheSimError::InvalidParameter`] for `link_gbps` when a
    /// counted step loads or copies and the device has no link, and (name `device`) when the
    /// times overflow f64.
    pub fn cost(&self, dev: &HybridDevice) -> Result<HybridCost> {
        dev.check()?;
        let (_, loads, copies) = self.totals();
        if dev.link_gbps.is_none() && loads + copies > 0 {
            return Err(CacheSimError::InvalidParameter {
                name: "link_gbps",
                value: "none".into(),
                reason: "required: this replay loads or copies experts over the host-to-GPU link (SEMANTICS.md §14)",
            });
        }
        let tau = dev.link_gbps.map_or(0.0, |g| dev.expert_mb / (1000.0 * g));
        let a = dev.expert_mb / (1000.0 * dev.host_gbps);
        let b = dev.host_ms_per_row / 1000.0;
        let sync = dev.host_sync_ms / 1000.0;
        let layers = self.layers.max(1) as f64;
        let (mut total, mut host, mut gpu, mut link, mut rows_counted) = (0.0, 0.0, 0.0, 0.0, 0u64);
        for (s, rows) in self.step_rows.iter().enumerate() {
            let Some(rows) = *rows else { continue };
            rows_counted += u64::from(rows);
            let c_s = dev.compute_ms_per_step.unwrap_or(dev.compute_ms * f64::from(rows));
            let (mut layer_sum, mut copies_s) = (0.0, 0u64);
            for ev in &self.per_layer {
                let g = c_s / (1000.0 * layers) + f64::from(ev.loads(s)) * tau;
                let runs = ev.host_runs(s);
                let shared = ev.shared_runs(s);
                let mut h = f64::from(runs - shared.len() as u32) * a.max(b);
                for &n in shared {
                    h += a.max(f64::from(n) * b);
                }
                if runs > 0 {
                    h += sync;
                }
                layer_sum += match dev.overlap {
                    Overlap::Sequential => g + h,
                    Overlap::Concurrent => g.max(h),
                };
                host += h;
                gpu += g;
                copies_s += u64::from(ev.copies(s));
                link += f64::from(ev.loads(s) + ev.copies(s)) * tau;
            }
            total += layer_sum.max(copies_s as f64 * tau);
        }
        if !(total.is_finite() && host.is_finite() && gpu.is_finite() && link.is_finite()) {
            return Err(CacheSimError::InvalidParameter {
                name: "device",
                value: format!("{dev:?}"),
                reason: "the step times overflow f64: a field of the profile is out of any physical range",
            });
        }
        let per_row = |x: f64| if rows_counted == 0 { 0.0 } else { x / rows_counted as f64 };
        Ok(HybridCost {
            tok_s: if total > 0.0 { rows_counted as f64 / total } else { 0.0 },
            host_s_per_row: per_row(host),
            gpu_s_per_row: per_row(gpu),
            link_s_per_row: per_row(link),
            total_s: total,
        })
    }
}
