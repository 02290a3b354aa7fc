//! The cost model of deployed replays: §6 extended by a second tier (SEMANTICS.md §10) and by
//! engine steps (§11).

use cachesim::deploy::DeployCounts;
use serde::Serialize;

use crate::DeviceProfile;

/// The cost of one deployed replay at one SSD bandwidth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DeployCost {
    /// SSD read bandwidth, GB/s.
    pub ssd_gbps: f64,
    /// Seconds of expert transfer per counted row (token).
    pub transfer_s_per_token: f64,
    /// Milliseconds per engine step (§11; per token: one token's compute plus its transfers).
    pub step_ms: f64,
    /// Rows (tokens) per second.
    pub tok_s: f64,
}

impl DeployCost {
    /// The cost of `c` on `profile` at `ssd_gbps`:
    /// - transfer (total over counted steps): without tier 2, `misses · expert_mb / (1000 · bw)`
    ///   (§6); with it (`tier2`), `t2_hits · expert_mb / (1000 · link_gbps) + storage_reads ·
    ///   expert_mb / (1000 · bw)`, plus the link term for each storage read, when the profile
    ///   gives `link_gbps` (without it the link costs nothing) (§10);
    /// - per token (`served` false): tok/s = 1 / (compute_ms / 1000 + transfer per token);
    /// - served: Σ step times = steps · compute_ms_per_step / 1000 + transfer (`compute_ms` when
    ///   the profile has no `compute_ms_per_step`); tok/s = rows / Σ step times (§11).
    pub fn of(profile: &DeviceProfile, c: &DeployCounts, tier2: bool, served: bool, ssd_gbps: f64) -> DeployCost {
        let mb = profile.expert_mb;
        let link = |n: u64| profile.link_gbps.map_or(0.0, |g| n as f64 * mb / (1000.0 * g));
        let ssd = |n: u64| n as f64 * mb / (1000.0 * ssd_gbps);
        let transfer =
            if tier2 { link(c.t2_hits) + ssd(c.storage_reads) + link(c.storage_reads) } else { ssd(c.counts.misses) };
        let rows = c.rows.max(1) as f64;
        let steps = c.steps.max(1) as f64;
        if served {
            let step_compute = profile.compute_ms_per_step.unwrap_or(profile.compute_ms) / 1000.0;
            let total = c.steps as f64 * step_compute + transfer;
            DeployCost {
                ssd_gbps,
                transfer_s_per_token: transfer / rows,
                step_ms: 1000.0 * total / steps,
                tok_s: if total > 0.0 { c.rows as f64 / total } else { 0.0 },
            }
        } else {
            let per_token = profile.compute_ms / 1000.0 + transfer / rows;
            DeployCost {
                ssd_gbps,
                transfer_s_per_token: transfer / rows,
                step_ms: 1000.0 * per_token,
                tok_s: 1.0 / per_token,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(misses: u64, t2_hits: u64, storage_reads: u64, steps: u64, rows: u64) -> DeployCounts {
        let mut c = DeployCounts { t2_hits, storage_reads, steps, rows, ..DeployCounts::default() };
        c.counts.misses = misses;
        c.counts.tokens = rows;
        c
    }

    #[test]
    fn deploy_cost_follows_the_formulas() {
        let mut p = DeviceProfile::reference();
        // Per token, one tier: §6 (10 misses/token).
        let c = counts(100, 0, 100, 10, 10);
        assert!((DeployCost::of(&p, &c, false, false, 3.9).tok_s - p.tok_s(10.0, 3.9)).abs() < 1e-9);
        // Tier 2 with a 25 GB/s link: per token 4 t2 hits and 2 reads.
        p.link_gbps = Some(25.0);
        let c = counts(60, 40, 20, 10, 10);
        let per_token = 4.0 * 1.3824 / 25_000.0 + 2.0 * 1.3824 / 3_900.0 + 2.0 * 1.3824 / 25_000.0;
        let got = DeployCost::of(&p, &c, true, false, 3.9);
        assert!((got.transfer_s_per_token - per_token).abs() < 1e-15);
        assert!((got.tok_s - 1.0 / (0.012 + per_token)).abs() < 1e-9);
        // Served: 2 steps of 50 ms compute, 30 loads from SSD, 40 rows.
        p.link_gbps = None;
        p.compute_ms_per_step = Some(50.0);
        let c = counts(30, 0, 30, 2, 40);
        let total = 0.1 + 30.0 * 1.3824 / 6_800.0;
        let got = DeployCost::of(&p, &c, false, true, 6.8);
        assert!((got.tok_s - 40.0 / total).abs() < 1e-9);
        assert!((got.step_ms - 500.0 * total).abs() < 1e-9);
    }
}
