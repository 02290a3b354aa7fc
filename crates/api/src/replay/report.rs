//! What a replay gives ([`ReplayReport`]) and its `moe-offload-replay` JSON document.

use cachesim::deploy::{DeployCounts, Deployment, Schedule};
use cachesim::hybrid::{Exec, HybridCost, HybridCounts, HybridDevice};
use cachesim::{CacheSimError, ReplayCounts, Replayed};
use serde_json::{Value, json};
use sweep::{DeployCost, DeviceProfile};

use super::PrefetchReport;
use crate::error::{Error, Msg, Result};

/// What `replay` gives, by the path it ran.
#[derive(Debug, Clone)]
pub enum ReplayReport {
    /// With prefetch, the timeline or the shuffled order (§12–§13).
    Prefetch(PrefetchReport),
    /// Plain, deployed (§9–§11) or hybrid (§14).
    Counts(CountsReport),
}

/// The counts of a plain, deployed or hybrid replay, priced.
#[derive(Debug, Clone)]
pub struct CountsReport {
    /// The counts of §5/§9/§11 (a plain replay's with nothing deployed).
    pub counts: DeployCounts,
    /// The deployment replayed.
    pub deployment: Deployment,
    /// Whether the replay ran the plain token loop of §5.
    pub plain: bool,
    /// Whether the replay was served (recorded or re-batched steps).
    pub served: bool,
    /// The profile with the request's overrides.
    pub profile: DeviceProfile,
    /// The deployed cost at each of the profile's bandwidths (§6, §10, §11).
    pub costs: Vec<DeployCost>,
    /// Hybrid execution's counts, device and cost (§14).
    pub hybrid: Option<Hybrid>,
    /// One cache shared by every layer (§15.1): its slots and what each layer held (boxed: most
    /// replays have none).
    pub shared: Option<Box<Shared>>,
    /// What the user should know about the result.
    pub notes: Vec<Msg>,
}

/// Hybrid execution's counts, device and cost (§14).
#[derive(Debug, Clone)]
pub struct Hybrid {
    /// The execution model.
    pub exec: Exec,
    /// Host runs, loads, copies (and the deployed counts).
    pub counts: HybridCounts,
    /// The device priced.
    pub device: HybridDevice,
    /// The cost.
    pub cost: HybridCost,
}

/// What one cache shared by every layer held (SEMANTICS.md §15.1).
#[derive(Debug, Clone)]
pub struct Shared {
    /// C, the shared cache's slots.
    pub cap: usize,
    /// Slots each layer index holds when the replay ends, `[L]`.
    pub layer_slots_end: Vec<usize>,
    /// Mean slots held per layer index over counted tokens, `[L]`.
    pub layer_slots_mean: Vec<f64>,
}

/// Prices a shared-cache replay's counts (§15.1: a miss costs as in §6 wherever its slot came
/// from).
pub(super) fn shared_counts(
    shared: cachesim::shared_cache::SharedCounts,
    dep: &Deployment,
    served: bool,
    profile: &DeviceProfile,
) -> CountsReport {
    let costs =
        profile.bandwidth_gbps.iter().map(|&bw| DeployCost::of(profile, &shared.deploy, false, served, bw)).collect();
    let info = Shared {
        cap: shared.cap,
        layer_slots_mean: shared.layer_slots_mean(),
        layer_slots_end: shared.layer_slots_end,
    };
    CountsReport {
        counts: shared.deploy,
        deployment: dep.clone(),
        plain: false,
        served,
        profile: profile.clone(),
        costs,
        hybrid: None,
        shared: Some(Box::new(info)),
        notes: Vec::new(),
    }
}

/// Prices a replay's counts.
pub(super) fn counts(
    replayed: Replayed,
    dep: &Deployment,
    exec: Exec,
    served: bool,
    profile: &DeviceProfile,
    notes: Vec<Msg>,
) -> Result<CountsReport> {
    let plain = matches!(replayed, Replayed::Plain(_));
    let counts = replayed.deploy_counts();
    let hybrid = match replayed {
        Replayed::Hybrid(hc, events) => {
            let device = profile
                .hybrid(None)
                .map_err(|e| Error::from(e).hint("give ‹host_gbps›, or a ‹profile_file› with host_gbps"))?;
            let cost = events.cost(&device).map_err(|e| match e {
                CacheSimError::InvalidParameter { name: "link_gbps", .. } => {
                    let static_too = if exec == Exec::Host {
                        ", or ‹cap=0› for a static placement that copies nothing"
                    } else {
                        ""
                    };
                    Error::from(e).hint(format!("give ‹link_gbps› (host-to-GPU GB/s){static_too}"))
                }
                e => e.into(),
            })?;
            Some(Hybrid { exec, counts: hc, device, cost })
        }
        _ => None,
    };
    let costs = profile
        .bandwidth_gbps
        .iter()
        .map(|&bw| DeployCost::of(profile, &counts, dep.tier2.is_some(), served, bw))
        .collect();
    Ok(CountsReport {
        counts,
        deployment: dep.clone(),
        plain,
        served,
        profile: profile.clone(),
        costs,
        hybrid,
        shared: None,
        notes,
    })
}

/// The §5 fields every replay document starts with.
pub(super) fn count_fields(c: &ReplayCounts) -> Value {
    json!({
        "tokens": c.tokens, "picks": c.picks, "hits": c.hits, "misses": c.misses,
        "forced_misses": c.forced_misses, "substituted": c.substituted, "pruned_slots": c.pruned_slots,
        "hit_rate": c.hit_rate(), "misses_per_token": c.misses_per_token(), "layer_misses": c.layer_misses,
    })
}

impl ReplayReport {
    /// The `moe-offload-replay` document (what `replay --json` prints and Python returns).
    pub fn document(&self) -> Value {
        let fields = match self {
            ReplayReport::Prefetch(p) => p.fields(),
            ReplayReport::Counts(c) => c.fields(),
        };
        crate::kind::tagged(crate::kind::REPLAY, fields)
    }
}

impl CountsReport {
    fn fields(&self) -> Value {
        let (c, dep, p) = (&self.counts, &self.deployment, &self.profile);
        let mut j = count_fields(&c.counts);
        let schedule = match dep.schedule {
            Schedule::PerToken => "per_token".to_string(),
            Schedule::Served => "served".to_string(),
            Schedule::Rebatch(b) => format!("batch:{b}"),
        };
        let extra = json!({
            "pinned_hits": c.pinned_hits, "t2_hits": c.t2_hits, "storage_reads": c.storage_reads,
            "steps": c.steps, "rows": c.rows, "loads_per_step": c.loads_per_step(),
            "lookup_hit_rate": c.lookup_hit_rate(),
            "layer_pins": c.layer_pins, "schedule": schedule,
            "tier2": dep.tier2.map(|t| format!("{}:{}", t.policy, t.cap)),
            "cost": { "profile": p.name, "expert_mb": p.expert_mb, "compute_ms": p.compute_ms,
                      "link_gbps": p.link_gbps, "compute_ms_per_step": p.compute_ms_per_step, "at": self.costs },
        });
        if let (Value::Object(j), Value::Object(extra)) = (&mut j, extra) {
            j.extend(extra);
        }
        if let Some(h) = &self.hybrid
            && let (Value::Object(j), Value::Object(hf)) =
                (&mut j, sweep::hybrid_fields(h.exec, &h.counts, &p.name, &h.device, &h.cost))
        {
            j.extend(hf);
        }
        if let Some(sh) = &self.shared
            && let Value::Object(j) = &mut j
        {
            j.insert("shared_cap".into(), json!(sh.cap));
            j.insert("layer_slots_end".into(), json!(sh.layer_slots_end));
            j.insert("layer_slots_mean".into(), json!(sh.layer_slots_mean));
        }
        j
    }
}
