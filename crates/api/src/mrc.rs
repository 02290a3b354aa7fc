//! `mrc`: miss-ratio curves, the misses of every cache size per layer (SEMANTICS.md §5 replayed
//! at every cap; one pass where the policy's curve allows it, `cachesim::mrc`), with pins the
//! one-pass lru curve of the unpinned stream (§9).

use cachesim::mrc::{CurveConfig, MissCurve};
use cachesim::{Keep, Policy, Semantics};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use trace_io::{Reads, TraceView};

use crate::error::{Context, Error, Msg, Result};
use crate::inputs::{self, MapSource, TraceSource};
use crate::usage;

/// Everything `mrc` takes.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MrcRequest {
    /// The trace.
    pub trace: TraceSource,
    /// Keep map (or a plan: its chosen keep map); `None`: every expert kept.
    pub keep: Option<MapSource>,
    /// The cache policy.
    pub policy: Policy,
    /// Caps `lo..=hi` (default k_used..=E).
    pub caps: Option<(usize, usize)>,
    /// Experts used per token (`None`: the trace's top-k).
    pub k_used: Option<usize>,
    /// Warmup tokens not counted.
    pub warmup: usize,
    /// Residency semantics.
    pub semantics: Semantics,
    /// Compute a curve above the work limit ([`crate::work::MAX_CURVE_STEPS`]).
    pub yes: bool,
    /// Pin map (§9): the curve of the unpinned stream, pinned picks counted as hits (lru only).
    pub pin: Option<MapSource>,
}

/// A curve and, with pins, the pins per layer.
#[derive(Debug, Clone)]
pub struct MrcReport {
    /// The misses of every cap per layer.
    pub curve: MissCurve,
    /// Pinned experts per layer, when pinned.
    pub layer_pins: Option<Vec<usize>>,
}

impl MrcRequest {
    /// A request with the defaults: every expert kept, caps k_used..=E, the trace's top-k,
    /// warmup 64, k-way residency, within the work limit, no pins.
    pub fn new(trace: TraceSource, policy: Policy) -> MrcRequest {
        let d = CurveConfig::default();
        MrcRequest {
            trace,
            keep: None,
            policy,
            caps: None,
            k_used: None,
            warmup: d.warmup,
            semantics: d.semantics,
            yes: false,
            pin: None,
        }
    }

    /// Checks the request, tells `announce` the work the curve will cost (before the work limit
    /// is applied: the refusal is about it), and computes the curve.
    ///
    /// # Errors
    /// The trace breaks the format or has no tokens; a keep or pin map of another model; caps
    /// outside k_used..=E; pins with a policy without a pinned one-pass curve; a first replay
    /// the curve would refuse; work above the limit without `yes`.
    pub fn run(&self, announce: &mut dyn FnMut(&Msg)) -> Result<MrcReport> {
        if let Some((a, b)) = self.caps.filter(|(a, b)| a > b) {
            usage!("‹caps›: empty range {a}..{b}");
        }
        let (f, name) = self.trace.open()?;
        let v = f.view_for(Reads::EVERYTHING)?;
        let s = v.shape();
        inputs::require_tokens(&s, &name)?;
        let keep = open_keep(self.keep.as_ref(), &v)?;
        if self.pin.is_some() && !cachesim::mrc::has_pinned_curve(self.policy) {
            usage!(
                "‹pin› gives the one-pass lru curve of the unpinned stream; for {} replay each cap with the replay \
                 command and ‹pin›",
                self.policy
            );
        }
        let k_used = self.k_used.unwrap_or(s.top_k);
        check_caps(self.caps, k_used, s.num_experts)?;
        // The replay of the curve's first cap, refused here as the curve would refuse it (k_used
        // above the candidates, a policy that needs scores on a trace without them).
        let first = cachesim::ReplayConfig {
            k_used: self.k_used,
            warmup: self.warmup,
            semantics: self.semantics,
            ..cachesim::ReplayConfig::new(self.policy, self.caps.map_or(k_used, |(lo, _)| lo))
        };
        cachesim::validate(&s, v.parts().scores.is_some(), &first)?;
        let pins = match &self.pin {
            Some(src) => {
                let layers = inputs::read_pins(src, v.meta())?;
                Some(Keep::from_layers(&s, &layers).with_context(|| format!("‹pin› {}", src.name()))?)
            }
            None => None,
        };
        let (steps, what) = crate::work::curve_work(&v, self.policy, self.semantics, self.k_used, self.caps);
        announce(&Msg::from(format!("mrc: {what}")));
        crate::work::bound_curves(steps, self.yes, "narrow ‹caps›")?;
        let base = CurveConfig {
            k_used: self.k_used,
            warmup: self.warmup,
            semantics: self.semantics,
            ..CurveConfig::default()
        };
        Ok(match &pins {
            None => MrcReport {
                curve: sweep::plan::miss_curve(&v, &keep, self.policy, &base, self.caps)?,
                layer_pins: None,
            },
            Some(pins) => {
                let full = cachesim::mrc::lru_curve_pinned(&v, &keep, Some(pins), &base)?;
                let per_layer = (0..pins.layers()).map(|l| pins.kept_count(l)).collect();
                MrcReport { curve: slice_caps(full, self.caps)?, layer_pins: Some(per_layer) }
            }
        })
    }
}

impl MrcReport {
    /// The `moe-offload-mrc` document: the curve's fields (`min_cap`, `max_cap`, `tokens`,
    /// `picks_per_layer`, `layers`), then `layer_pins` when pinned.
    pub fn document(&self) -> Value {
        let mut value = crate::kind::tagged(crate::kind::MRC, serde_json::to_value(&self.curve).unwrap_or_default());
        if let (Some(obj), Some(pins)) = (value.as_object_mut(), &self.layer_pins) {
            obj.insert("layer_pins".into(), serde_json::json!(pins));
        }
        value
    }
}

/// The keep map of `src` checked against the trace of `v`; every expert kept for `None`.
///
/// # Errors
/// The map cannot be read or is of another model.
pub fn open_keep(src: Option<&MapSource>, v: &TraceView<'_>) -> Result<Keep> {
    Ok(match src {
        Some(src) => {
            let name = src.name();
            let map = inputs::read_keep(src, false)?;
            inputs::check_map_fits(&map, v.meta(), &name)?;
            Keep::from_layers(&v.shape(), &map.layers).with_context(|| format!("keep map {name}"))?
        }
        None => Keep::full(&v.shape()),
    })
}

/// Refuses caps outside k_used..=E (before any work): below k_used a token cannot hold its
/// experts (SEMANTICS.md §5; cap 0, no cache, is the deployed replay of §9), above E there is
/// nothing more to cache.
fn check_caps(caps: Option<(usize, usize)>, k_used: usize, e: usize) -> Result<()> {
    let Some((lo, hi)) = caps else { return Ok(()) };
    if lo < k_used {
        usage!(
            "‹caps› {lo}..{hi}: cap {lo} is below k_used = {k_used} (a token needs all its experts resident at once, \
             SEMANTICS.md §5): a curve covers caps k_used..E = {k_used}..{e}; cap 0 (no cache, §9) is a replay with \
             ‹cap=0›"
        );
    }
    if hi > e {
        usage!(
            "‹caps› {lo}..{hi}: cap {hi} is more than the E = {e} experts per layer (a cache of E holds every \
             expert): give caps up to {e}"
        );
    }
    Ok(())
}

/// The curve sliced to `caps`.
fn slice_caps(c: MissCurve, caps: Option<(usize, usize)>) -> Result<MissCurve> {
    let Some((lo, hi)) = caps else { return Ok(c) };
    let (min, max) = (c.min_cap, c.max_cap);
    c.sliced(lo, hi)
        .map_err(|e| Error::from(e).context(format!("‹caps› {lo}..{hi}: the curve covers k_used..E = {min}..{max}")))
}
