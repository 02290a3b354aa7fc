//! The inputs `replay` reads besides the trace (and `mrc` and `export` with it): keep maps (or a
//! plan's keep map), a plan's caps and the settings it was made with, and a plan's pins.

use std::path::Path;

use anyhow::{Context, Result, bail};
use saliency::KeepMap;
use trace_io::TraceMeta;

/// Refuses a keep map made for another model shape.
pub fn check_map_fits(map: &KeepMap, m: &TraceMeta, path: &Path) -> Result<()> {
    if map.num_experts != m.num_experts || map.layer_ids != m.layer_ids {
        bail!(
            "keep map {} is for E = {} and layers {:?}; the trace has E = {} and layers {:?}: build the map from \
             statistics of a trace of the same model (`moe-offload stats` then `moe-offload keep`)",
            path.display(),
            map.num_experts,
            map.layer_ids,
            m.num_experts,
            m.layer_ids
        );
    }
    Ok(())
}

/// A keep map file, or the chosen keep map of a plan written by `moe-offload plan`
/// (`chosen.keep_map`).
pub fn read_keep(p: &Path) -> Result<KeepMap> {
    read_keep_of(p, false)
}

/// [`read_keep`]; for a plan made with `--pin-counts` given as `--pin` too (`pinned`), the pinned
/// plan's keep map (`pinned.keep_map`), which may be another variant than `chosen`'s.
pub fn read_keep_of(p: &Path, pinned: bool) -> Result<KeepMap> {
    let bytes = trace_io::read_text(p).with_context(|| format!("reading {}", p.display()))?;
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes)
        && let Some(chosen) = v.get("chosen")
    {
        let (m, name) = match v.get("pinned").filter(|_| pinned) {
            Some(pinned) => (&pinned["keep_map"], "pinned.keep_map"),
            None => (&chosen["keep_map"], "chosen.keep_map"),
        };
        let map: KeepMap = serde_json::from_value(m.clone())
            .with_context(|| format!("{}: the plan's {name} is not a keep map", p.display()))?;
        map.validate().with_context(|| format!("{}: {name}", p.display()))?;
        return Ok(map);
    }
    Ok(KeepMap::read_json(p)?)
}

/// The settings a plan was made with, as `moe-offload plan` records them (a plan written before
/// it recorded k_used, warmup and its keep map has none of them).
#[derive(Debug)]
pub struct PlanSettings {
    pub policy: String,
    pub k_used: Option<usize>,
    pub warmup: Option<usize>,
    /// The chosen variant's keep-map label (`full`, `frequency@48`, ...).
    pub variant: String,
    /// The chosen keep map's kept experts per layer, when recorded (two maps of one label can
    /// differ: built from other statistics).
    pub keep_layers: Option<Vec<Vec<u16>>>,
}

/// `8,6,16` or a JSON file holding a list, or a plan JSON (`chosen.plan.caps`, with the settings
/// the plan was made with; with `pinned`, the plan is also the `--pin` map and its pinned plan's
/// caps and keep map are read: `pinned.plan.caps`, `pinned.plan.variant`, `pinned.keep_map`).
pub fn parse_layer_caps(s: &str, pinned: bool) -> Result<(Vec<usize>, Option<PlanSettings>)> {
    if std::path::Path::new(s).is_file() {
        let v: serde_json::Value =
            serde_json::from_slice(&trace_io::read_text(s)?).with_context(|| format!("reading {s}"))?;
        let pinned = pinned && !v.is_array() && v.get("pinned").is_some();
        let (list, variant) = match (v.is_array(), pinned) {
            (true, _) => (&v, &serde_json::Value::Null),
            (false, false) => (&v["chosen"]["plan"]["caps"], &v["chosen"]["variant"]),
            (false, true) => (&v["pinned"]["plan"]["caps"], &v["pinned"]["plan"]["variant"]),
        };
        let caps = serde_json::from_value(list.clone())
            .with_context(|| format!("{s}: expected a JSON list of caps or a plan written by `moe-offload plan`"))?;
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
        return Ok((caps, made_with));
    }
    let caps = s
        .split(',')
        .map(|x| {
            x.trim().parse::<usize>().with_context(|| {
                if s.contains(',') {
                    format!("--layer-caps: {x:?} is not a whole number (expected e.g. 8,6,16)")
                } else {
                    format!(
                        "--layer-caps: {s:?} is neither a file (there is none of that name) nor caps per layer \
                         (whole numbers, comma-separated: e.g. 8,6,16)"
                    )
                }
            })
        })
        .collect::<Result<_>>()?;
    Ok((caps, None))
}

/// The pins of a plan file (`moe-offload plan --pin-counts`: `pinned.plan.pins`, per layer), or
/// `None` when `path` is not a plan. A plan made without `--pin-counts` pins nothing and is
/// refused: its `chosen.keep_map` is the set of experts kept, not a hot set.
pub fn plan_pins(path: &Path) -> Result<Option<Vec<Vec<u16>>>> {
    let Ok(bytes) = trace_io::read_text(path) else { return Ok(None) };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&bytes) else { return Ok(None) };
    if v.get("chosen").is_none() {
        return Ok(None);
    }
    let Some(pins) = v.get("pinned").map(|p| &p["plan"]["pins"]) else {
        bail!(
            "--pin {}: a plan made without --pin-counts pins nothing (its chosen.keep_map is the keep map, give it \
             to --keep); plan with --pin-counts, or give a pin map",
            path.display()
        )
    };
    let layers = serde_json::from_value(pins.clone()).with_context(|| {
        format!("--pin {}: the plan's pinned.plan.pins is not a list of expert ids per layer", path.display())
    })?;
    Ok(Some(layers))
}
