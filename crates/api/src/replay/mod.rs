//! `replay`: one configuration on one trace (SEMANTICS.md §5; deployments §9–§11, prefetch and
//! the timeline §12–§13 with the shuffled-order control, hybrid execution §14).
//!
//! [`ReplayRequest`] is what both front ends fill in (the CLI from its flags, Python from its
//! keyword arguments); [`ReplayRequest::resolve`] applies every rule about which options go
//! together and reads the keep, plan, pin and profile inputs; [`Resolved::run`] replays;
//! [`ReplayReport::document`] is the `moe-offload-replay` JSON document.

use std::path::PathBuf;
use std::sync::Arc;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::hybrid::{Exec, Overlap};
use cachesim::shared_cache::{self, SharedCache};
use cachesim::{Keep, Policy, Prefetch, ReplayConfig, Semantics};
use serde::{Deserialize, Serialize};
use sweep::DeviceProfile;
use trace_io::TraceFile;

use crate::error::{Context, Error, Msg, Result};
use crate::inputs::{self, CapsSource, MapSource, TraceSource};
use crate::profile::{self, Overrides};
use crate::usage;

mod plan_check;
mod prefetch;
mod report;

pub use prefetch::PrefetchReport;
pub use report::{CountsReport, Hybrid, ReplayReport, Shared};

/// Everything `replay` takes, owned (a front end fills it in; the work may run on another
/// thread). Field names are the neutral option names of error messages; [`ReplayRequest::new`]
/// gives every default.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    /// The trace.
    pub trace: TraceSource,
    /// Cache policy (§5).
    pub policy: Policy,
    /// Cache capacity per layer, in experts; `None` with `layer_caps` (the smallest of them) or
    /// `shared_cap`.
    pub cap: Option<usize>,
    /// One cache shared by every layer, of this many (layer, expert) slots, instead of a cache
    /// per layer (SEMANTICS.md §15.1); excludes `cap` and `layer_caps`.
    #[serde(default)]
    pub shared_cap: Option<usize>,
    /// Per-layer caps: a list, or a file (a list, or a plan whose settings must be this replay's).
    pub layer_caps: Option<CapsSource>,
    /// Keep map (or a plan: its chosen keep map); `None`: every expert kept.
    pub keep: Option<MapSource>,
    /// Experts used per token (`None`: the trace's top-k).
    pub k_used: Option<usize>,
    /// Warmup tokens not counted (default 64).
    pub warmup: usize,
    /// λ of cache-aware routing.
    pub lambda: f64,
    /// j: ranks boosted regardless of the cache.
    pub j: usize,
    /// Decay d of near_pick_ema and inv_router.
    pub decay: f64,
    /// N of near_pick and near_pick_ema.
    pub near_pick_n: usize,
    /// Residency semantics.
    pub semantics: Semantics,
    /// Empty every cache at each sequence start.
    pub reset_at_sequence: bool,
    /// Pin map (§9): a keep map, or a plan made with `pin_counts`.
    pub pin: Option<MapSource>,
    /// A second memory tier (§10).
    pub tier2: Option<Tier2>,
    /// Served replay on the trace's engine steps (§11).
    pub served: bool,
    /// Re-batching: B sequences at once (§11).
    pub batch: Option<usize>,
    /// Tier-2 to tier-1 link, or host to GPU under hybrid execution, GB/s.
    pub link_gbps: Option<f64>,
    /// Dense compute of one engine step, ms (served, re-batched, or hybrid execution).
    pub compute_ms_per_step: Option<f64>,
    /// Prefetch before each token's demand accesses (§12).
    pub prefetch: Option<Prefetch>,
    /// Calibration trace of the coact predictor.
    pub calib: Option<TraceSource>,
    /// Play the replay on the timeline of §13.
    pub timeline: bool,
    /// A named device profile.
    pub profile: Option<String>,
    /// I/O bandwidth of the timeline, GB/s.
    pub bandwidth: Option<f64>,
    /// Also replay a token-shuffled copy with this seed.
    pub shuffle: Option<u64>,
    /// What happens to a chosen expert that is not GPU-resident (§14).
    #[serde(with = "crate::display_from_str")]
    pub exec: Exec,
    /// How a layer's CPU and GPU parts combine under hybrid execution.
    pub overlap: Option<Overlap>,
    /// GB/s the CPU's expert kernels reach.
    pub host_gbps: Option<f64>,
    /// CPU compute per row per expert, ms.
    pub host_ms_per_row: Option<f64>,
    /// CPU-GPU synchronisation per layer with a host run, ms.
    pub host_sync_ms: Option<f64>,
    /// A device profile file, instead of the named `profile`.
    pub profile_file: Option<PathBuf>,
}

impl ReplayRequest {
    /// A request with every default: cap `cap`, the trace's top-k, warmup 64, λ 0, decay 0.99,
    /// near_pick_n 48, k-way residency, nothing deployed, no prefetch, transfers.
    pub fn new(trace: TraceSource, policy: Policy, cap: Option<usize>) -> ReplayRequest {
        let d = ReplayConfig::new(policy, 1);
        ReplayRequest {
            trace,
            policy,
            cap,
            shared_cap: None,
            layer_caps: None,
            keep: None,
            k_used: None,
            warmup: d.warmup,
            lambda: d.lambda,
            j: d.j,
            decay: d.decay,
            near_pick_n: d.near_pick_n,
            semantics: d.semantics,
            reset_at_sequence: false,
            pin: None,
            tier2: None,
            served: false,
            batch: None,
            link_gbps: None,
            compute_ms_per_step: None,
            prefetch: None,
            calib: None,
            timeline: false,
            profile: None,
            bandwidth: None,
            shuffle: None,
            exec: Exec::Transfer,
            overlap: None,
            host_gbps: None,
            host_ms_per_row: None,
            host_sync_ms: None,
            profile_file: None,
        }
    }

    /// Whether the replay is served (recorded or re-batched steps).
    fn is_served(&self) -> bool {
        self.served || self.batch.is_some()
    }

    /// The prefetch-section options given (prefetch, calib, timeline, profile, bandwidth,
    /// shuffle), by neutral name.
    fn prefetch_options(&self) -> impl Iterator<Item = &'static str> {
        [
            (self.prefetch.is_some(), "prefetch"),
            (self.calib.is_some(), "calib"),
            (self.timeline, "timeline"),
            (self.bandwidth.is_some(), "bandwidth"),
            (self.shuffle.is_some(), "shuffle"),
        ]
        .into_iter()
        .filter_map(|(given, name)| given.then_some(name))
    }

    /// The profile overrides the request gives.
    fn overrides(&self) -> Overrides {
        Overrides {
            link_gbps: self.link_gbps,
            compute_ms_per_step: self.compute_ms_per_step,
            host_gbps: self.host_gbps,
            host_ms_per_row: self.host_ms_per_row,
            host_sync_ms: self.host_sync_ms,
            overlap: self.overlap,
        }
    }

    /// Checks the options against each other and reads every input but the trace's content:
    /// the keep map, the caps (and a plan's settings), the pins, the profile.
    ///
    /// # Errors
    /// [`Error::Usage`] for options that do not fit together or values out of range (naming
    /// the option); the readers' errors naming the file.
    pub fn resolve(&self) -> Result<Resolved> {
        self.check_values()?;
        let (file, name) = self.trace.open()?;
        let shape = file.shape();
        inputs::require_tokens(&shape, &name)?;
        let meta = file.meta().clone();
        // A plan given as pins and as keep map (or caps) is replayed as its pinned plan.
        let pinned_plan = |p: &std::path::Path| self.pin.as_ref().is_some_and(|pin| pin.is_path(p));
        let (map, keep) = match &self.keep {
            Some(src) => {
                let pinned = matches!(src, MapSource::Path(p) if pinned_plan(p));
                let name = src.name();
                let map = inputs::read_keep(src, pinned).with_context(|| {
                    format!("‹keep› {name} is not a keep map (the keep command writes one from statistics)")
                })?;
                inputs::check_map_fits(&map, &meta, &name)?;
                let keep = Keep::from_layers(&shape, &map.layers).with_context(|| format!("keep map {name}"))?;
                (Some(map), keep)
            }
            None => (None, Keep::full(&shape)),
        };
        let (layer_caps, made_with) = match &self.layer_caps {
            Some(src) => {
                let pinned = matches!(src, CapsSource::File(p) if pinned_plan(p));
                let (caps, made_with) = inputs::read_caps(src, pinned)?;
                (Some(caps), made_with)
            }
            None => (None, None),
        };
        if let (Some(plan), Some(CapsSource::File(path)), Some(caps)) = (&made_with, &self.layer_caps, &layer_caps) {
            // A plan of another model first: its other settings would only mislead.
            if caps.len() != shape.layers {
                usage!(
                    "‹layer_caps› {}: the plan has caps for {} layers and {name} has {} MoE layers: it was made for \
                     another model; plan again on traces of this one",
                    path.display(),
                    caps.len(),
                    shape.layers
                );
            }
            plan_check::check(&path.display().to_string(), plan, self, shape.top_k, map.as_ref())?;
        }
        // With per-layer caps and no cap, the base cap is the smallest of them (validated likewise).
        let cap = self
            .cap
            .or(self.shared_cap)
            .or_else(|| layer_caps.as_ref().and_then(|c| c.iter().copied().min()))
            .unwrap_or(0);
        let cfg = ReplayConfig {
            k_used: self.k_used,
            warmup: self.warmup,
            lambda: self.lambda,
            j: self.j,
            decay: self.decay,
            near_pick_n: self.near_pick_n,
            semantics: self.semantics,
            reset_at_sequence: self.reset_at_sequence,
            layer_caps: layer_caps.clone(),
            ..ReplayConfig::new(self.policy, cap)
        };
        let mut notes = Vec::new();
        // Credits read the router's candidates beyond the used ones (§5); a log that records
        // only the used experts has none, and near_pick then ranks as lru does.
        let k_used = cfg.k_used_or(shape.top_k);
        if self.policy.facts().credits != cachesim::Credits::None && shape.candidates <= k_used {
            notes.push(Msg::from(format!(
                "note: {name} records {} candidates per token, no more than the {k_used} used: {}'s credits see no \
                 other candidate (with near_pick_n >= k_used near_pick then ranks exactly as lru); a capture with \
                 more candidates (python/capture_routing.py) or a smaller ‹k_used› gives them some",
                shape.candidates, self.policy
            )));
        }
        // A sweep refuses a cap above E (a typo there multiplies); one replay runs it, and says so.
        let e = shape.num_experts;
        let per_layer = std::iter::once(cap).filter(|_| self.shared_cap.is_none());
        if let Some(c) = per_layer.chain(layer_caps.iter().flatten().copied()).find(|&c| c > e) {
            notes.push(Msg::from(format!(
                "note: cap {c} is more than the {e} experts of a layer: every expert fits and the cache never evicts"
            )));
        }
        let dep = self.deployment(&meta, &shape)?;
        let shared = self.shared_cap.map(|cap| SharedCache { cap, pins: dep.pins.clone(), schedule: dep.schedule });
        let exec = self.exec;
        let plain = shared.is_none()
            && cachesim::Replay { keep: &keep, config: &cfg, deployment: &dep, exec }.path()
                == cachesim::ReplayPath::Plain;
        // With a deployment or hybrid execution, `profile` prices the replay; the other
        // prefetch-section options do not apply to it.
        let prefetch_given = self.prefetch_options().next();
        let prefetch = match (prefetch_given, plain) {
            (Some(_), true) => Some(prefetch::resolve(self)?),
            (None, true) if self.profile.is_some() => Some(prefetch::resolve(self)?),
            (Some(option), false) if exec.is_hybrid() => usage!(
                "‹{option}› with ‹exec={exec}›: prefetch, the timeline of §13 (‹bandwidth›) and the shuffled control \
                 price loads to the GPU, which hybrid execution replaces by host runs (SEMANTICS.md §14); drop \
                 ‹{option}›, or use ‹exec=transfer›"
            ),
            (Some(_), false) => usage!(
                "prefetch, the timeline and the shuffled order (SEMANTICS.md §12-§13) are replayed per token with one \
                 tier and no pins: drop ‹pin›, ‹tier2›, ‹served›, ‹batch› and ‹cap=0›, or the prefetch options"
            ),
            (None, _) => None,
        };
        let base = profile::base_profile(self.profile_file.as_deref(), self.profile.as_deref(), &meta)?;
        Ok(Resolved {
            file,
            name,
            keep,
            cfg,
            dep,
            shared,
            exec,
            served: self.is_served(),
            prefetch,
            profile: self.overrides().apply(base)?,
            notes,
        })
    }

    /// Values out of range, and options that exclude each other or need another.
    fn check_values(&self) -> Result<()> {
        if self.cap.is_none() && self.layer_caps.is_none() && self.shared_cap.is_none() {
            usage!(
                "replay needs ‹cap› (experts per layer), ‹layer_caps› (one per layer) or ‹shared_cap› (one cache for \
                 every layer)"
            );
        }
        if self.shared_cap.is_some() {
            self.check_shared()?;
        }
        if self.served && self.batch.is_some() {
            usage!("‹served› and ‹batch› exclude each other: ‹served› replays the recorded steps");
        }
        if self.profile.is_some() && self.profile_file.is_some() {
            usage!("‹profile› and ‹profile_file› exclude each other: give one");
        }
        if self.batch == Some(0) || self.k_used == Some(0) {
            let name = if self.batch == Some(0) { "batch" } else { "k_used" };
            usage!("‹{name}› 0: must be at least 1");
        }
        // The profile fields a request overrides are checked with the profile, by its one rule
        // (`profile::Overrides::apply`); the timeline's bandwidth is a bandwidth like them.
        if let Some(x) = self.bandwidth.filter(|x| !(x.is_finite() && *x >= sweep::GBPS_MIN)) {
            usage!("‹bandwidth› {x}: must be a finite bandwidth of at least 1e-6 GB/s");
        }
        if !self.exec.is_hybrid() {
            let stray = [
                (self.overlap.is_some(), "overlap"),
                (self.host_gbps.is_some(), "host_gbps"),
                (self.host_ms_per_row.is_some(), "host_ms_per_row"),
                (self.host_sync_ms.is_some(), "host_sync_ms"),
            ];
            if let Some((_, name)) = stray.into_iter().find(|s| s.0) {
                usage!(
                    "‹{name}› prices hybrid execution (SEMANTICS.md §14): add ‹exec=host› (or host:R), or drop ‹{name}›"
                );
            }
        }
        if self.link_gbps.is_some() && self.tier2.is_none() && !self.exec.is_hybrid() {
            usage!(
                "‹link_gbps› is the bandwidth from tier 2 to tier 1, or from host to GPU under ‹exec=host›: it \
                 applies only with ‹tier2› or ‹exec=host›"
            );
        }
        // Hybrid execution prices every step's dense compute too (SEMANTICS.md §14: c_s).
        if self.compute_ms_per_step.is_some() && !self.is_served() && !self.exec.is_hybrid() {
            usage!(
                "‹compute_ms_per_step› is the compute of an engine step: it applies only with ‹served›, ‹batch› or \
                 ‹exec=host›"
            );
        }
        if self.exec.is_hybrid() && self.tier2.is_some() {
            let exec = self.exec;
            usage!(
                "‹tier2› with ‹exec={exec}›: a non-resident expert is computed on the CPU from host memory, so there \
                 is no second tier to load it from (SEMANTICS.md §14); drop ‹tier2›, or use ‹exec=transfer›"
            );
        }
        Ok(())
    }

    /// What one cache shared by every layer (SEMANTICS.md §15.1) may go with: pins, served and
    /// re-batched steps; not the per-layer caps it replaces, not a second tier or prefetch
    /// (errors by §15.1), and not yet hybrid execution.
    fn check_shared(&self) -> Result<()> {
        let caps = [(self.cap.is_some(), "cap"), (self.layer_caps.is_some(), "layer_caps")];
        if let Some((_, name)) = caps.into_iter().find(|c| c.0) {
            usage!(
                "‹shared_cap› and ‹{name}› exclude each other: one cache of ‹shared_cap› slots replaces the per-layer \
                 caches (SEMANTICS.md §15.1); give one"
            );
        }
        if self.tier2.is_some() {
            usage!("‹tier2› with ‹shared_cap›: a second tier under one shared cache is an error (SEMANTICS.md §15.1)");
        }
        if let Some(option) = self.prefetch_options().next() {
            usage!("‹{option}› with ‹shared_cap›: prefetch into one shared cache is an error (SEMANTICS.md §15.1)");
        }
        if self.exec.is_hybrid() {
            let exec = self.exec;
            usage!("‹exec={exec}› with ‹shared_cap›: hybrid execution with one shared cache is not replayed yet");
        }
        Ok(())
    }

    /// The deployment: the pins read and checked against the trace, tier 2, the schedule.
    fn deployment(&self, meta: &trace_io::TraceMeta, shape: &trace_io::Shape) -> Result<Deployment> {
        let pins = match &self.pin {
            Some(src) => {
                let layers = inputs::read_pins(src, meta)?;
                Some(Keep::from_layers(shape, &layers).with_context(|| format!("pin map {}", src.name()))?)
            }
            None => None,
        };
        let schedule = match (self.served, self.batch) {
            (true, _) => Schedule::Served,
            (false, Some(b)) => Schedule::Rebatch(b),
            (false, None) => Schedule::PerToken,
        };
        Ok(Deployment { pins, tier2: self.tier2, schedule })
    }
}

/// A replay ready to run: its inputs read and checked ([`ReplayRequest::resolve`]).
#[derive(Debug)]
pub struct Resolved {
    file: Arc<TraceFile>,
    name: String,
    keep: Keep,
    cfg: ReplayConfig,
    dep: Deployment,
    /// One cache for every layer (§15.1), with the deployment's pins.
    shared: Option<SharedCache>,
    exec: Exec,
    served: bool,
    prefetch: Option<prefetch::Resolved>,
    profile: DeviceProfile,
    notes: Vec<Msg>,
}

impl Resolved {
    /// What the user should know before the replay runs (the front end shows them).
    pub fn notes(&self) -> &[Msg] {
        &self.notes
    }

    /// Replays: on the path the request asks for (plain, deployed, hybrid, or with prefetch).
    ///
    /// # Errors
    /// The trace's content breaks the format where the replay reads it; the replay refuses the
    /// configuration (with what to change).
    pub fn run(&self) -> Result<ReplayReport> {
        if let Some(p) = &self.prefetch {
            let r = prefetch::run(p, &self.file, &self.name, &self.keep, &self.cfg, &self.profile)?;
            return Ok(ReplayReport::Prefetch(r));
        }
        if let Some(shared) = &self.shared {
            let reads = cachesim::deploy::deploy_reads(&self.file.shape(), &self.keep, &self.cfg);
            let view = self.file.view_for(reads)?;
            let counts = shared_cache::replay(&view, &self.keep, &self.cfg, shared).map_err(hint)?;
            return Ok(ReplayReport::Counts(report::shared_counts(counts, &self.dep, self.served, &self.profile)));
        }
        let request = cachesim::Replay { keep: &self.keep, config: &self.cfg, deployment: &self.dep, exec: self.exec };
        let view = self.file.view_for(request.reads(&self.file.shape()))?;
        let replayed = request.run(&view).map_err(hint)?;
        let mut notes = Vec::new();
        if self.cfg.reset_at_sequence && view.seq_offsets().is_none_or(|s| s.len() <= 1) {
            notes.push(Msg::from(format!(
                "note: {} records no sequence start after token 0 (seq_offsets); ‹reset_at_sequence› changes nothing",
                self.name
            )));
        }
        let counts = report::counts(replayed, &self.dep, self.exec, self.served, &self.profile, notes)?;
        Ok(ReplayReport::Counts(counts))
    }
}

/// A replay's refusal, with what to change where one option fixes it.
fn hint(e: cachesim::CacheSimError) -> Error {
    match e {
        cachesim::CacheSimError::KUsedAboveCandidates { candidates, .. } => {
            Error::from(e).hint(format!("use ‹k_used={candidates}› or less"))
        }
        cachesim::CacheSimError::OfflineWithLambda { .. } => {
            Error::from(e).hint("drop ‹lambda›, or use an online policy such as lru with ‹lambda›")
        }
        e => e.into(),
    }
}
