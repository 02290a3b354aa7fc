//! The metadata of a routing array (its `meta` object and the options) and the facts the
//! import derives from it: layout, layers, E, sequences.

use super::*;

/// The keys of the meta object that are read.
#[derive(Default)]
pub(super) struct Meta {
    pub(super) raw: Option<String>,
    pub(super) model: Option<String>,
    pub(super) num_experts: Option<u64>,
    pub(super) top_k: Vec<(&'static str, u64)>,
    pub(super) n_layers: Option<(String, u64)>,
    pub(super) layer_ids: Option<Vec<u32>>,
    pub(super) layout: Option<Layout>,
    pub(super) phase: Option<Phase>,
    pub(super) source: Option<String>,
}

impl Meta {
    pub(super) fn from_json(
        m: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> std::result::Result<Meta, String> {
        let Some(m) = m else { return Ok(Meta::default()) };
        let uint = |key: &str| -> std::result::Result<Option<u64>, String> {
            m.get(key)
                .map(|v| v.as_u64().ok_or_else(|| format!("`{key}` = {v} is not a whole number >= 0")))
                .transpose()
        };
        let text = |key: &str| m.get(key).map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string));
        let mut top_k = Vec::new();
        for key in ["top_k", "k"] {
            if let Some(v) = uint(key)? {
                top_k.push((key, v));
            }
        }
        let mut n_layers = None;
        for key in ["n_moe_layers", "num_layers", "n_layers"] {
            if let Some(v) = uint(key)? {
                n_layers.get_or_insert((key.to_string(), v));
            }
        }
        let layer_ids = m
            .get("layer_ids")
            .map(|v| {
                serde_json::from_value::<Vec<u32>>(v.clone())
                    .map_err(|_| format!("`layer_ids` = {v} is not a list of ids"))
            })
            .transpose()?;
        Ok(Meta {
            raw: Some(serde_json::Value::Object(m.clone()).to_string()),
            model: text("model"),
            num_experts: match uint("num_experts")? {
                Some(e) => Some(e),
                None => uint("n_experts")?,
            },
            top_k,
            n_layers,
            layer_ids,
            layout: text("layout").map(|s| s.parse()).transpose().map_err(|e| format!("`layout`: {e}"))?,
            phase: text("phase").map(|s| s.parse()).transpose().map_err(|e| format!("`phase`: {e}"))?,
            source: text("source"),
        })
    }
}

/// What the options and the meta say, checked against each other and against the shape.
pub(super) struct Facts {
    pub(super) layout: Layout,
    pub(super) layout_from: String,
    pub(super) num_experts: u32,
    pub(super) experts_from: &'static str,
    pub(super) layer_ids: Option<(Vec<u32>, &'static str)>,
}

impl Facts {
    pub(super) fn resolve(opts: &NumpyOptions, meta: &Meta, shape: [usize; 3]) -> std::result::Result<Facts, String> {
        let k = shape[2] as u64;
        for &(key, v) in &meta.top_k {
            if v != k {
                return Err(format!(
                    "the meta's `{key}` = {v}, but the array has {k} slots per row (its last axis): the array must \
                     hold exactly the k ids each token used"
                ));
            }
        }
        let (num_experts, experts_from) = match (opts.num_experts, meta.num_experts) {
            (Some(a), Some(b)) if u64::from(a) != b => {
                return Err(format!("--num-experts {a} but the meta's `num_experts` is {b}"));
            }
            (Some(a), _) => (u64::from(a), "--num-experts"),
            (None, Some(b)) => (b, "meta num_experts"),
            (None, None) => {
                return Err(
                    "the expert count is not known: give --num-experts (the file has no meta with num_experts)".into(),
                );
            }
        };
        if num_experts == 0 || num_experts > u64::from(u16::MAX) + 1 {
            return Err(format!("num_experts {num_experts} is not in 1..=65536"));
        }
        let layer_ids = match (&opts.layer_ids, &meta.layer_ids) {
            (Some(a), Some(b)) if a != b => {
                return Err(format!("--layers {a:?} but the meta's `layer_ids` is {b:?}"));
            }
            (Some(a), _) => Some((a.clone(), "--layers")),
            (None, Some(b)) => Some((b.clone(), "meta layer_ids")),
            (None, None) => None,
        };
        // The layer count the file or the options give, and where from.
        let mut n_layers: Option<(u64, String)> =
            layer_ids.as_ref().map(|(v, from)| (v.len() as u64, from.to_string()));
        if let Some((key, n)) = &meta.n_layers {
            if let Some((m, from)) = &n_layers
                && m != n
            {
                return Err(format!("{from} lists {m} layers but the meta's `{key}` is {n}"));
            }
            n_layers.get_or_insert((*n, format!("meta {key} = {n}")));
        }
        let (layout, layout_from) = match (opts.layout, meta.layout) {
            (Some(a), Some(b)) if a != b => return Err(format!("--layout {a} but the meta's `layout` is {b}")),
            (Some(a), _) => (a, "--layout".to_string()),
            (None, Some(b)) => (b, "meta layout".to_string()),
            (None, None) => match &n_layers {
                Some((n, from)) => match (shape[0] as u64 == *n, shape[1] as u64 == *n) {
                    (true, false) => (Layout::Ltk, format!("axis 0 matches {from}")),
                    (false, true) => (Layout::Tlk, format!("axis 1 matches {from}")),
                    (true, true) => {
                        return Err(format!(
                            "shape {shape:?}: both of the first two axes match {from}: give --layout ltk or tlk"
                        ));
                    }
                    (false, false) => {
                        return Err(format!("shape {shape:?}: neither of the first two axes matches {from}"));
                    }
                },
                None => {
                    return Err(format!(
                        "shape {shape:?}: the axis order is not known: give --layout ltk ([layers, tokens, k]) or \
                         tlk ([tokens, layers, k]), or --layers with the layer ids"
                    ));
                }
            },
        };
        let layers = match layout {
            Layout::Ltk => shape[0],
            Layout::Tlk => shape[1],
        } as u64;
        if let Some((n, from)) = &n_layers
            && *n != layers
        {
            return Err(format!("shape {shape:?} read as {layout} has {layers} layers, but {from} gives {n}"));
        }
        Ok(Facts { layout, layout_from, num_experts: num_experts as u32, experts_from, layer_ids })
    }
}
