//! The timeline cost model of SEMANTICS.md §13: each token's layers play in order on one compute
//! stream, and the expert loads on one I/O channel that serves them one at a time in issue order.
//!
//! Per layer compute c = compute_ms / (1000 · L); a load takes τ = expert_mb / (1000 · bw) s.
//! With g = t · L + l the position of (t, l) in play order, the prefetch loads of g are issued
//! when layer g − 1 starts and its demand loads when g − 1 ends (both at time 0 for g = 0), so
//! the channel sees P(0) D(0) P(1) D(1) ... in that order; layer g starts when g − 1 has ended,
//! its demand loads have completed and so has the latest prefetch load of an expert it hits,
//! and ends c later. Forced misses load nothing.
//!
//! Every time on the timeline is a sum of compute steps and loads, so it is kept exactly as the
//! pair (i, j) meaning i · c + j · τ (two integers; `Time`), compared by value. The figures
//! come from the pairs: stall per token = (J · τ + I · c) / tokens with (I, J) the counted
//! tokens' total minus their compute, so that without prefetch (I = 0, J = the demand misses)
//! `tok_s` is §6's additive figure to the last bit (when no miss is forced: forced misses load
//! nothing here and are priced in §6).

use serde::{Deserialize, Serialize};

use crate::{CacheSimError, Result};

/// What the timeline needs of a device: plain numbers (the profiles live in the sweep crate).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimelineDevice {
    /// Bytes of one expert as stored, in MB of 10^6 bytes.
    pub expert_mb: f64,
    /// Compute time per token with every expert resident, in ms (all layers together).
    pub compute_ms: f64,
    /// Read bandwidth of the I/O channel, in GB/s (10^9 bytes per second).
    pub bandwidth_gbps: f64,
}

impl TimelineDevice {
    /// Checks that every number is finite, the expert size and bandwidth > 0 and the compute
    /// time >= 0.
    ///
    /// # Errors
    /// [`CacheSimError::InvalidParameter`] naming the field.
    pub fn validate(&self) -> Result<()> {
        let bad = |name, v: f64, reason| Err(CacheSimError::InvalidParameter { name, value: v.to_string(), reason });
        if !(self.expert_mb.is_finite() && self.expert_mb > 0.0) {
            return bad("expert_mb", self.expert_mb, "must be finite and > 0");
        }
        if !(self.compute_ms.is_finite() && self.compute_ms >= 0.0) {
            return bad("compute_ms", self.compute_ms, "must be finite and >= 0");
        }
        if !(self.bandwidth_gbps.is_finite() && self.bandwidth_gbps > 0.0) {
            return bad("bandwidth_gbps", self.bandwidth_gbps, "must be finite and > 0");
        }
        Ok(())
    }

    /// τ: seconds to load one expert, expert_mb / (1000 · bw).
    pub fn load_s(&self) -> f64 {
        self.expert_mb / (1000.0 * self.bandwidth_gbps)
    }
}

/// The timeline's figures over the counted tokens (SEMANTICS.md §13).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Timeline {
    /// Counted tokens / the sum of their times.
    pub tok_s: f64,
    /// Time per counted token spent waiting on loads (a token's time minus its compute), in s.
    pub stall_s_per_token: f64,
}

/// The loads of one (token, layer), as the replay records them for the timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LayerEvent {
    /// Prefetch loads issued for (t, l).
    pub(crate) prefetch_loads: u32,
    /// Demand loads (misses that are not forced).
    pub(crate) demand_loads: u32,
    /// The latest prefetch load of an expert hit at (t, l), as the tag of
    /// [`crate::prefetch`]'s loop: `(t' + 1) << 17 | i << 1 | counted` (i: its index among
    /// the prefetch loads of (t', l)); 0 = none.
    pub(crate) dep: u64,
}

/// A time on the timeline: `c` compute steps plus `io` loads (i · c + j · τ seconds).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Time {
    pub(crate) c: i64,
    pub(crate) io: i64,
}

impl Time {
    fn secs(self, c: f64, tau: f64) -> f64 {
        self.c as f64 * c + self.io as f64 * tau
    }
    fn plus(self, c: i64, io: i64) -> Time {
        Time { c: self.c + c, io: self.io + io }
    }
}

/// Plays the events of every layer (`events[l][t]`) on the timeline; tokens from `warmup` on
/// enter the figures.
pub(crate) fn play(events: &[Vec<LayerEvent>], warmup: usize, dev: &TimelineDevice) -> Timeline {
    let layers = events.len();
    let tokens = events.first().map_or(0, Vec::len);
    let c_s = dev.compute_ms / (1000.0 * layers as f64);
    let tau = dev.load_s();
    // The later of two times by value (ties: the first).
    let later = |a: Time, b: Time| if b.secs(c_s, tau) > a.secs(c_s, tau) { b } else { a };
    // Start of each prefetch batch P(t, l), `[L][T]` (a dep may reach back to any earlier token).
    let mut batch_start = vec![vec![Time::default(); tokens]; layers];
    let (mut free, mut prev_start, mut prev_end) = (Time::default(), Time::default(), Time::default());
    let mut counted_from = Time::default();
    for t in 0..tokens {
        if t == warmup {
            counted_from = prev_end;
        }
        for l in 0..layers {
            let ev = events[l][t];
            // P(g) at the start of g − 1, D(g) at its end (time 0 for g = 0: both defaults).
            let p_start = later(prev_start, free);
            batch_start[l][t] = p_start;
            free = p_start.plus(0, i64::from(ev.prefetch_loads));
            let mut start = prev_end;
            if ev.demand_loads > 0 {
                free = later(prev_end, free).plus(0, i64::from(ev.demand_loads));
                start = later(start, free);
            }
            if ev.dep != 0 {
                let (t_dep, i_dep) = ((ev.dep >> 17) as usize - 1, ((ev.dep >> 1) & 0xFFFF) as i64);
                start = later(start, batch_start[l][t_dep].plus(0, i_dep + 1));
            }
            prev_start = start;
            prev_end = start.plus(1, 0);
        }
    }
    let counted = tokens.saturating_sub(warmup) as u64;
    // Counted tokens' total time minus their compute (L steps each): (I, J).
    let stall =
        Time { c: prev_end.c - counted_from.c - (counted * layers as u64) as i64, io: prev_end.io - counted_from.io };
    figures(counted, stall, dev, layers)
}

/// `tok_s` and `stall_s_per_token` from the counted tokens' stall (I, J), in the operation
/// order of §6's `tok_s` (misses per token · expert_mb / (1000 · bw)).
pub(crate) fn figures(counted: u64, stall: Time, dev: &TimelineDevice, layers: usize) -> Timeline {
    if counted == 0 {
        return Timeline { tok_s: 0.0, stall_s_per_token: 0.0 };
    }
    let n = counted as f64;
    let io = (stall.io as f64 / n) * dev.expert_mb / (1000.0 * dev.bandwidth_gbps);
    let compute = (stall.c as f64 / n) * dev.compute_ms / (1000.0 * layers as f64);
    let stall_s_per_token = io + compute;
    Timeline { tok_s: 1.0 / (dev.compute_ms / 1000.0 + stall_s_per_token), stall_s_per_token }
}
