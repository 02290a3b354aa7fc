//! The fields a hybrid replay (SEMANTICS.md §14) adds to `replay --json`, built in one place for
//! the CLI and the Python package.

use cachesim::hybrid::{Exec, HybridCost, HybridCounts, HybridDevice};
use serde_json::{Value, json};

/// `exec`, `overlap`, `host_runs`, `loads`, `copies` and a `cost` object: the profile's name,
/// the device fields used (MB, ms, GB/s) and the cost (`tok_s` in rows per second;
/// `host_s_per_row`, `gpu_s_per_row`, `link_s_per_row` in seconds per counted row). Also the
/// deployed fields whose meaning changes when experts run on the CPU: `storage_reads` = 0
/// (host memory is not storage) and `loads_per_step` = loads / steps.
pub fn hybrid_fields(exec: Exec, c: &HybridCounts, profile: &str, dev: &HybridDevice, cost: &HybridCost) -> Value {
    let steps = c.deploy.steps;
    json!({
        "storage_reads": 0,
        "loads_per_step": if steps == 0 { 0.0 } else { c.loads as f64 / steps as f64 },
        "exec": exec.to_string(), "overlap": dev.overlap.to_string(),
        "host_runs": c.host_runs, "loads": c.loads, "copies": c.copies,
        "cost": {
            "profile": profile, "expert_mb": dev.expert_mb, "compute_ms": dev.compute_ms,
            "compute_ms_per_step": dev.compute_ms_per_step, "host_gbps": dev.host_gbps,
            "host_ms_per_row": dev.host_ms_per_row, "host_sync_ms": dev.host_sync_ms,
            "link_gbps": dev.link_gbps, "overlap": dev.overlap.to_string(),
            "tok_s": cost.tok_s, "host_s_per_row": cost.host_s_per_row, "gpu_s_per_row": cost.gpu_s_per_row,
            "link_s_per_row": cost.link_s_per_row,
        },
    })
}
