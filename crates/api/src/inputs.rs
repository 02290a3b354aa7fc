//! What a command reads besides its options: traces, keep maps (or a plan's keep map), a plan's
//! caps and the settings it was made with, a plan's pins. One reader each, for every command and
//! both front ends.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use saliency::KeepMap;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use trace_io::{Shape, TraceFile, TraceMeta};

use crate::error::{Context, Error, Result};
use crate::usage;

/// A trace: a path to open, or a trace a front end holds open already (the Python `Trace`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum TraceSource {
    /// A trace file (`.safetensors`), opened lazily: shapes now, content when a command reads it.
    Path(PathBuf),
    /// A trace already open, with the name messages give it (its path).
    #[serde(skip)]
    Open {
        /// The mapped file.
        file: Arc<TraceFile>,
        /// The name messages give it.
        name: String,
    },
}

impl TraceSource {
    /// The trace and its name.
    ///
    /// # Errors
    /// Those of [`TraceFile::open_lazy`] (naming the file).
    pub fn open(&self) -> Result<(Arc<TraceFile>, String)> {
        let name = self.name();
        match self {
            TraceSource::Path(p) => Ok((Arc::new(TraceFile::open_lazy(p)?), name)),
            TraceSource::Open { file, .. } => Ok((file.clone(), name)),
        }
    }

    /// The name messages give it: the path, or the open trace's name.
    pub fn name(&self) -> String {
        match self {
            TraceSource::Path(p) => p.display().to_string(),
            TraceSource::Open { name, .. } => name.clone(),
        }
    }
}

/// Refuses a trace without tokens: every figure of it would be 0/0.
///
/// # Errors
/// [`Error::Usage`] naming the trace.
pub fn require_tokens(shape: &Shape, name: &str) -> Result<()> {
    if shape.tokens == 0 {
        let layers = if shape.layers == 1 { "1 layer".to_string() } else { format!("{} layers", shape.layers) };
        usage!(
            "{name} has no tokens ({layers} x 0 tokens): no figure can be computed from it; import or record a trace \
             with tokens"
        );
    }
    Ok(())
}

/// A keep map (or pin map): the path of a keep-map JSON file (or of a plan), or a map a front
/// end holds (the Python `KeepMap`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MapSource {
    /// A keep-map file, or a plan written by `plan`.
    Path(PathBuf),
    /// A map in memory.
    Map(KeepMap),
}

impl MapSource {
    /// The name messages give it: the path, or the map's label.
    pub fn name(&self) -> String {
        match self {
            MapSource::Path(p) => p.display().to_string(),
            MapSource::Map(m) => m.label(),
        }
    }

    /// Whether this is the file at `path`.
    pub fn is_path(&self, path: &Path) -> bool {
        matches!(self, MapSource::Path(p) if p == path)
    }
}

/// Refuses a keep map made for another model shape.
///
/// # Errors
/// [`Error::Usage`] naming the map and both shapes.
pub fn check_map_fits(map: &KeepMap, m: &TraceMeta, name: &str) -> Result<()> {
    if map.num_experts != m.num_experts || map.layer_ids != m.layer_ids {
        usage!(
            "keep map {name} is for E = {} and layers {:?}; the trace has E = {} and layers {:?}: build the map from \
             statistics of a trace of the same model (the stats command, then keep)",
            map.num_experts,
            map.layer_ids,
            m.num_experts,
            m.layer_ids
        );
    }
    Ok(())
}

/// A keep map: a keep-map file, or the chosen keep map of a plan written by `plan`
/// (`chosen.keep_map`); for a plan made with `pin_counts` that is also the pin map (`pinned`),
/// the pinned plan's keep map (`pinned.keep_map`), which may be another variant than `chosen`'s.
///
/// # Errors
/// The file cannot be read, or holds no keep map.
pub fn read_keep(src: &MapSource, pinned: bool) -> Result<KeepMap> {
    let p = match src {
        MapSource::Map(m) => return Ok(m.clone()),
        MapSource::Path(p) => p,
    };
    let bytes = trace_io::read_text(p).map_err(|e| Error::io(p, e))?;
    if let Ok(v) = serde_json::from_slice::<Value>(&bytes)
        && let Some(chosen) = v.get("chosen")
    {
        let (m, name) = match v.get("pinned").filter(|_| pinned) {
            Some(pinned) => (&pinned["keep_map"], "pinned.keep_map"),
            None => (&chosen["keep_map"], "chosen.keep_map"),
        };
        let map: KeepMap = serde_json::from_value(m.clone())
            .map_err(|e| Error::usage(format!("{}: the plan's {name} is not a keep map: {e}", p.display())))?;
        map.validate().with_context(|| format!("{}: {name}", p.display()))?;
        return Ok(map);
    }
    Ok(KeepMap::read_json(p)?)
}

/// The pins of a pin map, per layer, checked against the trace: a keep-map file or map (its
/// kept experts), a plan made with `pin_counts` (`pinned.plan.pins`), or a hybrid plan
/// (`per_expert.pins`: `replay --exec host` then reproduces its figure). A plan made without
/// it pins nothing and is refused: its `chosen.keep_map` is the set of experts kept, not a hot
/// set.
///
/// # Errors
/// The file cannot be read, is a plan without pins, or holds a map of another model.
pub fn read_pins(src: &MapSource, meta: &TraceMeta) -> Result<Vec<Vec<u16>>> {
    if let MapSource::Path(path) = src
        && let Some(layers) = plan_pins(path, meta)?
    {
        return Ok(layers);
    }
    let name = src.name();
    let map = read_keep(src, false).with_context(|| format!("‹pin› {name} is not a keep map"))?;
    check_map_fits(&map, meta, &name).with_context(|| format!("‹pin› {name}"))?;
    Ok(map.layers)
}

/// The pins of a plan file (`pinned.plan.pins`; a hybrid plan's `per_expert.pins`), or `None`
/// when `path` is not a plan.
fn plan_pins(path: &Path, meta: &TraceMeta) -> Result<Option<Vec<Vec<u16>>>> {
    let Ok(bytes) = trace_io::read_text(path) else { return Ok(None) };
    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else { return Ok(None) };
    if v["kind"] == crate::kind::HYBRID_PLAN {
        return hybrid_plan_pins(path, &v, meta).map(Some);
    }
    if v.get("chosen").is_none() {
        return Ok(None);
    }
    let Some(pins) = v.get("pinned").map(|p| &p["plan"]["pins"]) else {
        usage!(
            "‹pin› {}: a plan made without ‹pin_counts› pins nothing (its chosen.keep_map is the keep map, give it \
             to ‹keep›); plan with ‹pin_counts›, or give a pin map",
            path.display()
        )
    };
    let layers = serde_json::from_value(pins.clone()).map_err(|_| {
        Error::usage(format!(
            "‹pin› {}: the plan's pinned.plan.pins is not a list of expert ids per layer",
            path.display()
        ))
    })?;
    Ok(Some(layers))
}

/// The pins of a hybrid plan (`plan --exec host`): its per-expert plan's (`per_expert.pins`, one
/// list per traced layer of `layer_ids`), checked against the trace's layers and experts. The
/// per-layer plan (`per_layer`) is the whole-layer placement `export llama-cpp` writes.
fn hybrid_plan_pins(path: &Path, v: &Value, meta: &TraceMeta) -> Result<Vec<Vec<u16>>> {
    let name = path.display();
    let layer_ids: Vec<u32> = serde_json::from_value(v["layer_ids"].clone())
        .map_err(|_| Error::usage(format!("‹pin› {name}: the hybrid plan's layer_ids is not a list of layer ids")))?;
    let pins: Vec<Vec<u16>> = serde_json::from_value(v["per_expert"]["pins"].clone()).map_err(|_| {
        Error::usage(format!("‹pin› {name}: the hybrid plan's per_expert.pins is not a list of expert ids per layer"))
    })?;
    if layer_ids != meta.layer_ids || pins.len() != layer_ids.len() {
        usage!(
            "‹pin› {name}: a hybrid plan for layers {layer_ids:?}; the trace has layers {:?}: plan on traces of the \
             same model",
            meta.layer_ids
        );
    }
    if let Some((l, e)) = pins
        .iter()
        .enumerate()
        .find_map(|(l, p)| p.iter().find(|&&e| u32::from(e) >= meta.num_experts).map(|&e| (l, e)))
    {
        usage!("‹pin› {name}: layer {}: expert {e} is not below the trace's E = {}", layer_ids[l], meta.num_experts);
    }
    Ok(pins)
}

/// Per-layer caps: a list, or a JSON file holding a list or a plan written by `plan`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CapsSource {
    /// One cap per trace layer.
    List(Vec<usize>),
    /// A JSON file: a list of caps, or a plan (its `chosen.plan.caps`, with its settings).
    File(PathBuf),
}

/// The settings a plan was made with, as `plan` records them (a plan written before it recorded
/// k_used, warmup and its keep map has none of them).
#[derive(Debug, Clone)]
pub struct PlanSettings {
    /// The policy.
    pub policy: String,
    /// Experts used per token.
    pub k_used: Option<usize>,
    /// Warmup tokens.
    pub warmup: Option<usize>,
    /// The chosen variant's keep-map label (`full`, `frequency@48`, ...).
    pub variant: String,
    /// The chosen keep map's kept experts per layer, when recorded (two maps of one label can
    /// differ: built from other statistics).
    pub keep_layers: Option<Vec<Vec<u16>>>,
}

/// The caps of `src` and, for a plan, the settings it was made with; with `pinned` (the plan is
/// also the pin map), its pinned plan's caps and keep map (`pinned.plan.caps`,
/// `pinned.plan.variant`, `pinned.keep_map`).
///
/// # Errors
/// The file cannot be read or holds neither a list nor a plan.
pub fn read_caps(src: &CapsSource, pinned: bool) -> Result<(Vec<usize>, Option<PlanSettings>)> {
    let path = match src {
        CapsSource::List(caps) => return Ok((caps.clone(), None)),
        CapsSource::File(p) => p,
    };
    let shown = path.display();
    if !path.is_file() {
        usage!(
            "‹layer_caps›: {shown:?} is neither a file (there is none of that name) nor caps per layer (whole numbers, \
             comma-separated: e.g. 8,6,16)"
        );
    }
    let v: Value = serde_json::from_slice(&trace_io::read_text(path).map_err(|e| Error::io(path, e))?)
        .map_err(|e| Error::usage(format!("reading {shown}: {e}")))?;
    let pinned = pinned && !v.is_array() && v.get("pinned").is_some();
    let (list, variant) = match (v.is_array(), pinned) {
        (true, _) => (&v, &Value::Null),
        (false, false) => (&v["chosen"]["plan"]["caps"], &v["chosen"]["variant"]),
        (false, true) => (&v["pinned"]["plan"]["caps"], &v["pinned"]["plan"]["variant"]),
    };
    let caps = serde_json::from_value(list.clone()).map_err(|e| {
        Error::usage(format!("{shown}: expected a JSON list of caps or a plan written by the plan command: {e}"))
    })?;
    let variant = variant.as_str().unwrap_or_default().to_string();
    let keep_map = if pinned { &v["pinned"]["keep_map"] } else { &v["chosen"]["keep_map"] };
    let keep_layers = serde_json::from_value(keep_map["layers"].clone()).ok();
    let made_with = (!v.is_array()).then(|| PlanSettings {
        policy: v["policy"].as_str().unwrap_or_default().to_string(),
        k_used: v["k_used"].as_u64().map(|k| k as usize),
        warmup: v["warmup"].as_u64().map(|w| w as usize),
        variant,
        keep_layers,
    });
    Ok((caps, made_with))
}
