//! Grid files (JSON) and their expansion into configurations (SEMANTICS.md §7).

use std::cmp::Ordering;
use std::fmt;
use std::path::{Path, PathBuf};

use cachesim::Policy;

use crate::{DeviceProfile, Result, SweepError};

/// A grid file: traces, variants, blocks of replay parameters, and device profiles.
///
/// Paths are relative to the grid file's directory. See `docs/grid-format.md`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grid {
    /// Free-form name.
    #[serde(default)]
    pub name: String,
    /// The in-sample (calibration) and out-of-sample (held-out) traces.
    pub traces: GridTraces,
    /// Variants: `"full"`, `"METRIC@K"` (a keep map built from the in-sample statistics), or
    /// `"file:PATH"` (a keep-map JSON file).
    pub variants: Vec<String>,
    /// Warmup tokens excluded from the counts (default 64).
    #[serde(default = "default_warmup")]
    pub warmup: usize,
    /// Saliency options for `METRIC@K` variants: `tau` of `shrink` (default 64).
    #[serde(default = "default_tau")]
    pub tau: f64,
    /// Blocks; the configurations are the union of each block's cartesian product.
    pub blocks: Vec<Block>,
    /// Device profiles: preset names (`"reference"`, `"dsv2-lite-bf16"`, ...) or full profiles.
    #[serde(default = "default_profiles")]
    pub profiles: Vec<ProfileSpec>,
    /// The calibration trace the `coact` predictor learns from (SEMANTICS.md §12); default
    /// `traces.in_sample`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coact_calibration: Option<PathBuf>,
}

fn default_warmup() -> usize {
    64
}
fn default_tau() -> f64 {
    64.0
}
fn default_profiles() -> Vec<ProfileSpec> {
    vec![ProfileSpec::Preset("reference".into())]
}

/// The two traces of a grid.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridTraces {
    /// Calibration trace: keep maps are built from its statistics, and it is replayed.
    pub in_sample: PathBuf,
    /// Held-out trace, replayed with the same configurations.
    pub out_of_sample: PathBuf,
}

/// A device profile in a grid: a preset's name or a full profile.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum ProfileSpec {
    /// A preset name, see [`DeviceProfile::preset`].
    Preset(String),
    /// A profile given in full.
    Full(DeviceProfile),
}

/// A string is a preset's name; anything else must be a full profile, and its own error (an
/// unknown or missing field, named) is reported rather than serde's "did not match any variant".
impl<'de> serde::Deserialize<'de> for ProfileSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(name) => Ok(ProfileSpec::Preset(name)),
            other => serde_json::from_value(other)
                .map(ProfileSpec::Full)
                .map_err(|e| serde::de::Error::custom(format!("profile: {e}"))),
        }
    }
}

/// One block: the cartesian product of its lists.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Block {
    /// Variants this block applies to (default: all of the grid's variants).
    #[serde(default)]
    pub variants: Option<Vec<String>>,
    /// Policy names.
    pub policies: Vec<String>,
    /// λ values (default `[0]`).
    #[serde(default = "zero_f")]
    pub lambda: Vec<f64>,
    /// j values (default `[0]`).
    #[serde(default = "zero_u")]
    pub j: Vec<usize>,
    /// Cache capacities, experts per layer (the same for every layer).
    #[serde(default)]
    pub cap: Vec<usize>,
    /// Per-layer capacities: JSON files holding one cap per trace layer, either a list or a plan
    /// written by `moe-offload plan` (its `chosen.plan.caps`). Each file is one more "cap" of the
    /// block, named by its file stem in keys (`caps:NAME`).
    #[serde(default)]
    pub layer_caps: Vec<PathBuf>,
    /// k_used values; `null` means the trace's top-k (default `[null]`).
    #[serde(default = "null_k")]
    pub k_used: Vec<Option<usize>>,
    /// Pin maps (SEMANTICS.md §9): keep-map JSON files, `null` = no pins (default `[null]`).
    #[serde(default = "none_list", skip_serializing_if = "is_none_list")]
    pub pin: Vec<Option<PathBuf>>,
    /// Second tiers (SEMANTICS.md §10): `POLICY:CAP`, `null` = one tier (default `[null]`).
    #[serde(default = "none_list", skip_serializing_if = "is_none_list")]
    pub tier2: Vec<Option<String>>,
    /// Re-batching (SEMANTICS.md §11): B, `null` = per token (default `[null]`).
    #[serde(default = "none_list", skip_serializing_if = "is_none_list")]
    pub batch: Vec<Option<usize>>,
    /// Prefetch (SEMANTICS.md §12): `PRED:B` (`"coact:4"`), `"none"` or `null` = no prefetch
    /// (default `[null]`).
    #[serde(default = "none_list", skip_serializing_if = "is_none_list")]
    pub prefetch: Vec<Option<String>>,
    /// The locality control of SEMANTICS.md §12: seeds of a token-shuffled replay, `null` = the
    /// real order (default `[null]`).
    #[serde(default = "none_list", skip_serializing_if = "is_none_list")]
    pub shuffle: Vec<Option<u64>>,
    /// Hybrid execution (SEMANTICS.md §14): `transfer`, `host` or `host:R` (default
    /// `["transfer"]`, the replay of §5–§13).
    #[serde(default = "transfer_list", skip_serializing_if = "is_transfer_list")]
    pub exec: Vec<cachesim::hybrid::Exec>,
    /// §14: the overlaps a hybrid configuration is priced with, each its own configuration
    /// (default `[]`: each profile's own overlap, else sequential).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overlap: Vec<cachesim::hybrid::Overlap>,
}

fn transfer_list() -> Vec<cachesim::hybrid::Exec> {
    vec![cachesim::hybrid::Exec::Transfer]
}
fn is_transfer_list(v: &[cachesim::hybrid::Exec]) -> bool {
    v == [cachesim::hybrid::Exec::Transfer]
}

fn none_list<T>() -> Vec<Option<T>> {
    vec![None]
}
fn is_none_list<T>(v: &[Option<T>]) -> bool {
    v.len() == 1 && v[0].is_none()
}

fn zero_f() -> Vec<f64> {
    vec![0.0]
}
fn zero_u() -> Vec<usize> {
    vec![0]
}
fn null_k() -> Vec<Option<usize>> {
    vec![None]
}

/// The stable identity of one configuration: `variant/policy/lambda/j/cap/k_used`.
///
/// Ordered by variant label, policy name, λ, j, cap and k_used (numerically), which is the order of
/// every output.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(from = "ConfigKeyFields")]
pub struct ConfigKey {
    /// Variant label (`full`, `frequency@32`, or the keep-map file's label).
    pub variant: String,
    /// Policy name.
    pub policy: Policy,
    /// λ of cache-aware routing.
    pub lambda: f64,
    /// j: ranks always boosted by cache-aware routing.
    pub j: usize,
    /// Cache capacity per layer; with `layer_caps`, the largest of them.
    pub cap: usize,
    /// Per-layer capacities from a `layer_caps` file of the block: its name and one cap per layer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer_caps: Option<NamedCaps>,
    /// Experts used per token (resolved: never `null` here).
    pub k_used: usize,
    /// Pins, tier 2, re-batching (SEMANTICS.md §9–§11); `None` = the plain replay of §5. A cap
    /// of 0 without pins, prefetch or hybrid execution is the deployed replay of §9 with nothing
    /// set (`Some` of the default), which is not written (as a plain row's `None` is) and comes
    /// back from the cap when read (`ConfigKey::no_cache_deploy`).
    #[serde(default, skip_serializing_if = "is_plain_deploy")]
    pub deploy: Option<crate::DeployKey>,
    /// Prefetch and the shuffled order (SEMANTICS.md §12); `None` = the plain replay of §5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::PrefetchKey>,
    /// Hybrid execution (SEMANTICS.md §14); `None` = `exec = transfer`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<crate::HybridKey>,
}

fn is_plain_deploy(d: &Option<crate::DeployKey>) -> bool {
    d.as_ref().is_none_or(|d| *d == crate::DeployKey::default())
}

/// [`ConfigKey`] as written: the same fields, read before the deployment a cap of 0 implies is
/// put back ([`ConfigKey::no_cache_deploy`]).
#[derive(serde::Deserialize)]
struct ConfigKeyFields {
    variant: String,
    policy: Policy,
    lambda: f64,
    j: usize,
    cap: usize,
    #[serde(default)]
    layer_caps: Option<NamedCaps>,
    k_used: usize,
    #[serde(default)]
    deploy: Option<crate::DeployKey>,
    #[serde(default)]
    prefetch: Option<crate::PrefetchKey>,
    #[serde(default)]
    hybrid: Option<crate::HybridKey>,
}

impl From<ConfigKeyFields> for ConfigKey {
    fn from(f: ConfigKeyFields) -> ConfigKey {
        let mut key = ConfigKey {
            variant: f.variant,
            policy: f.policy,
            lambda: f.lambda,
            j: f.j,
            cap: f.cap,
            layer_caps: f.layer_caps,
            k_used: f.k_used,
            deploy: f.deploy,
            prefetch: f.prefetch,
            hybrid: f.hybrid,
        };
        key.deploy = key.no_cache_deploy(key.deploy.clone());
        key
    }
}

impl ConfigKey {
    /// The deployment of a configuration with the deployment axes `deploy`: a cap of 0 (or a
    /// per-layer cap of 0) without pins, prefetch or hybrid execution is the deployed replay (as
    /// `replay --cap 0`): every pick not pinned misses.
    fn no_cache_deploy(&self, deploy: Option<crate::DeployKey>) -> Option<crate::DeployKey> {
        let no_cache = self.cap == 0 || self.layer_caps.as_ref().is_some_and(|c| c.caps.contains(&0));
        match deploy {
            None if no_cache && self.prefetch.is_none() && self.hybrid.is_none() => Some(crate::DeployKey::default()),
            d => d,
        }
    }
}

/// Per-layer cache capacities with the name they carry in keys.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct NamedCaps {
    /// The file stem of the `layer_caps` file.
    pub name: String,
    /// One capacity per trace layer.
    pub caps: Vec<usize>,
}

impl Eq for ConfigKey {}

impl Ord for ConfigKey {
    fn cmp(&self, o: &Self) -> Ordering {
        self.variant
            .cmp(&o.variant)
            .then_with(|| self.policy.as_str().cmp(o.policy.as_str()))
            .then_with(|| self.lambda.total_cmp(&o.lambda))
            .then_with(|| self.j.cmp(&o.j))
            .then_with(|| self.cap.cmp(&o.cap))
            .then_with(|| self.k_used.cmp(&o.k_used))
            .then_with(|| self.layer_caps.cmp(&o.layer_caps))
            .then_with(|| self.deploy.cmp(&o.deploy))
            .then_with(|| self.prefetch.cmp(&o.prefetch))
            .then_with(|| self.hybrid.cmp(&o.hybrid))
    }
}

impl PartialOrd for ConfigKey {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.layer_caps {
            None => {
                write!(f, "{}/{}/{}/{}/{}/{}", self.variant, self.policy, self.lambda, self.j, self.cap, self.k_used)?;
            }
            Some(c) => {
                write!(
                    f,
                    "{}/{}/{}/{}/caps:{}/{}",
                    self.variant, self.policy, self.lambda, self.j, c.name, self.k_used
                )?;
            }
        }
        if let Some(d) = &self.deploy {
            f.write_str(&d.suffix())?;
        }
        if let Some(p) = &self.prefetch {
            f.write_str(&p.suffix())?;
        }
        match &self.hybrid {
            Some(h) => f.write_str(&h.suffix()),
            None => Ok(()),
        }
    }
}

/// Why an empty list of a grid is refused.
const EMPTY_LIST: &str =
    "is an empty list, which gives no configurations: give at least one value (or leave the key out for its default)";

impl Grid {
    /// Reads a grid file; relative trace and keep-map paths are resolved against its directory.
    ///
    /// # Errors
    /// [`SweepError::Io`] or [`SweepError::Json`] naming the file.
    pub fn read(path: &Path) -> Result<Grid> {
        let text =
            trace_io::read_regular_to_string(path).map_err(|source| SweepError::Io { path: path.into(), source })?;
        let base = path.parent().unwrap_or(Path::new(""));
        Grid::from_json(&text, base).map_err(|source| SweepError::Json { path: path.into(), source })
    }

    /// Parses a grid from JSON text, resolving relative paths against `base`.
    ///
    /// # Errors
    /// The JSON error (unknown fields are refused), an error naming `tau` when it is negative,
    /// and an error naming the block and the key for an empty `overlap` or `layer_caps` list (which the parsed grid cannot tell from an absent
    /// one; the other empty lists are refused by [`Grid::expand`]).
    pub fn from_json(text: &str, base: &Path) -> std::result::Result<Grid, serde_json::Error> {
        let mut g: Grid = serde_json::from_str(text)?;
        if !(g.tau.is_finite() && g.tau >= 0.0) {
            return Err(serde::de::Error::custom(format!(
                "tau: {} is not a finite value >= 0 (τ of the shrink metric)",
                g.tau
            )));
        }
        let raw: serde_json::Value = serde_json::from_str(text)?;
        let blocks = raw.get("blocks").and_then(serde_json::Value::as_array).map_or(&[][..], Vec::as_slice);
        for (bi, b) in blocks.iter().enumerate() {
            for key in ["overlap", "layer_caps"] {
                if b.get(key).and_then(serde_json::Value::as_array).is_some_and(Vec::is_empty) {
                    return Err(serde::de::Error::custom(format!("blocks[{bi}].{key}: {EMPTY_LIST}")));
                }
            }
        }
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut g.traces.in_sample);
        resolve(&mut g.traces.out_of_sample);
        g.coact_calibration.iter_mut().for_each(&resolve);
        for b in &mut g.blocks {
            b.layer_caps.iter_mut().for_each(&resolve);
            b.pin.iter_mut().flatten().for_each(&resolve);
        }
        for v in &mut g.variants {
            if let Some(rest) = v.strip_prefix("file:") {
                let p = Path::new(rest);
                if p.is_relative() {
                    *v = format!("file:{}", base.join(p).display());
                }
            }
        }
        Ok(g)
    }

    /// The grid with the paths [`Grid::from_json`] resolved against `base` written relative to it
    /// again (absolute paths and paths elsewhere are kept): what `results.json` records, so that
    /// the same grid file run from different working directories gives the same provenance (and
    /// shards run from different directories can be merged).
    pub fn relative_to(&self, base: &Path) -> Grid {
        let rel = |p: &Path| -> PathBuf { p.strip_prefix(base).map_or_else(|_| p.to_path_buf(), Path::to_path_buf) };
        let mut g = self.clone();
        g.traces.in_sample = rel(&g.traces.in_sample);
        g.traces.out_of_sample = rel(&g.traces.out_of_sample);
        g.coact_calibration = g.coact_calibration.as_deref().map(rel);
        for b in &mut g.blocks {
            b.layer_caps.iter_mut().for_each(|p| *p = rel(p));
            b.pin.iter_mut().flatten().for_each(|p| *p = rel(p));
        }
        for v in &mut g.variants {
            if let Some(rest) = v.strip_prefix("file:") {
                *v = format!("file:{}", rel(Path::new(rest)).display());
            }
        }
        g
    }

    /// The files the grid names besides its traces, in grid order without repeats: the keep maps
    /// of `file:PATH` variants, then every block's `layer_caps` files, then the pin maps, then
    /// the `coact_calibration` trace. Their SHA-256 go into a
    /// sweep's provenance, so that `sweep merge` refuses shards that read different copies.
    pub fn files(&self) -> Vec<PathBuf> {
        let maps = self.variants.iter().filter_map(|v| v.strip_prefix("file:")).map(PathBuf::from);
        let caps = self.blocks.iter().flat_map(|b| b.layer_caps.iter().cloned());
        let pins = self.blocks.iter().flat_map(|b| b.pin.iter().flatten().cloned());
        let mut files: Vec<PathBuf> = Vec::new();
        for f in maps.chain(caps).chain(pins).chain(self.coact_calibration.iter().cloned()) {
            if !files.contains(&f) {
                files.push(f);
            }
        }
        files
    }

    /// Resolves the device profiles.
    ///
    /// Profile names label the cost columns (`tok_s@NAME@BW`), so they must be unique, and a full
    /// profile may not take a preset's name (its columns would pass for the preset's).
    ///
    /// # Errors
    /// [`SweepError::Grid`] for an unknown preset, an empty `bandwidth_gbps`, a name given twice,
    /// or a full profile named like a preset; [`SweepError::Profile`] for a field out of its
    /// range ([`DeviceProfile::check`], the one rule).
    pub fn device_profiles(&self) -> Result<Vec<DeviceProfile>> {
        if self.profiles.is_empty() {
            return Err(SweepError::Grid {
                key: "profiles: []".into(),
                reason: "an empty list gives the rows no cost figures: omit `profiles` for the default profile, or \
                         name at least one (a preset such as \"reference\", or a full profile)"
                    .into(),
            });
        }
        let profiles: Vec<DeviceProfile> = self
            .profiles
            .iter()
            .map(|p| {
                let prof = match p {
                    ProfileSpec::Preset(name) => DeviceProfile::preset(name).ok_or_else(|| SweepError::Grid {
                        key: format!("profiles: {name}"),
                        reason: format!(
                            "unknown preset; known: reference, {}",
                            crate::cost::PRESETS.iter().map(|p| p.0).collect::<Vec<_>>().join(", ")
                        ),
                    })?,
                    ProfileSpec::Full(p) => p.clone(),
                };
                if prof.bandwidth_gbps.is_empty() {
                    return Err(SweepError::Grid {
                        key: format!("profiles: {}: bandwidth_gbps", prof.name),
                        reason: "an empty list gives the profile no cost columns: give at least one bandwidth".into(),
                    });
                }
                prof.check()?;
                Ok(prof)
            })
            .collect::<Result<_>>()?;
        for (i, (spec, prof)) in self.profiles.iter().zip(&profiles).enumerate() {
            if let ProfileSpec::Full(p) = spec
                && DeviceProfile::preset(&p.name).is_some()
            {
                return Err(SweepError::Grid {
                    key: format!("profiles[{i}]: {}", p.name),
                    reason: format!(
                        "a full profile may not take the name of the preset `{}`: write the preset's name alone \
                         (\"{}\") to use it, or give this profile another name",
                        p.name, p.name
                    ),
                });
            }
            if let Some(first) = profiles[..i].iter().position(|q| q.name == prof.name) {
                return Err(SweepError::Grid {
                    key: format!("profiles[{i}]: {}", prof.name),
                    reason: format!(
                        "profile name `{}` is also profiles[{first}]: names label the cost columns, give each profile its own",
                        prof.name
                    ),
                });
            }
        }
        Ok(profiles)
    }

    /// The number of configurations the blocks expand to before duplicates are removed (an upper
    /// bound of [`Grid::expand`]'s length), computed without expanding; saturates at `u64::MAX`.
    pub fn size(&self) -> u64 {
        self.blocks
            .iter()
            .map(|b| {
                let variants = b.variants.as_ref().map_or(self.variants.len(), Vec::len);
                [
                    variants,
                    b.policies.len(),
                    b.lambda.len(),
                    b.j.len(),
                    b.cap.len() + b.layer_caps.len(),
                    b.k_used.len(),
                    b.prefetch.len(),
                    b.shuffle.len(),
                ]
                .into_iter()
                .fold(1u64, |a, n| a.saturating_mul(n as u64))
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Expands the blocks into configuration keys, sorted by [`ConfigKey`]'s order, duplicates
    /// across blocks removed, `k_used: null` resolved to `top_k`. `labels` maps each variant spec
    /// of the grid to its label. Unknown policies and variants that are not in [`Grid::variants`]
    /// are errors naming the block.
    ///
    /// # Errors
    /// [`SweepError::Grid`] naming the block and the offending value.
    pub fn expand(&self, labels: &[(String, String)], top_k: usize) -> Result<Vec<ConfigKey>> {
        let mut out = Vec::new();
        let empty = |key: String| SweepError::Grid { key, reason: EMPTY_LIST.into() };
        if self.variants.is_empty() {
            return Err(SweepError::Grid {
                key: "variants".into(),
                reason: "is an empty list, which gives no configurations: give at least one variant (`full` keeps \
                         every expert)"
                    .into(),
            });
        }
        if self.blocks.is_empty() {
            return Err(SweepError::Grid {
                key: "blocks".into(),
                reason: "is an empty list, which gives no configurations: give at least one block".into(),
            });
        }
        for (bi, b) in self.blocks.iter().enumerate() {
            let lists = [
                ("variants", b.variants.as_ref().map_or(1, Vec::len)),
                ("policies", b.policies.len()),
                ("lambda", b.lambda.len()),
                ("j", b.j.len()),
                ("k_used", b.k_used.len()),
                ("pin", b.pin.len()),
                ("tier2", b.tier2.len()),
                ("batch", b.batch.len()),
                ("prefetch", b.prefetch.len()),
                ("shuffle", b.shuffle.len()),
            ];
            if let Some((name, _)) = lists.iter().find(|(_, n)| *n == 0) {
                return Err(empty(format!("blocks[{bi}].{name}")));
            }
            if b.cap.is_empty() && b.layer_caps.is_empty() {
                return Err(SweepError::Grid {
                    key: format!("blocks[{bi}]"),
                    reason: "give `cap` or `layer_caps`".into(),
                });
            }
            // Each entry: (cap, per-layer caps).
            let mut caps: Vec<(usize, Option<NamedCaps>)> = b.cap.iter().map(|&c| (c, None)).collect();
            for path in &b.layer_caps {
                let named = read_layer_caps(path).map_err(|reason| SweepError::Grid {
                    key: format!("blocks[{bi}].layer_caps: {}", path.display()),
                    reason,
                })?;
                caps.push((named.caps.iter().copied().max().unwrap_or(0), Some(named)));
            }
            let deploys = crate::deploy_axes::expand_axes(&b.pin, &b.tier2, &b.batch, bi)?;
            let deployed = deploys.iter().any(Option::is_some);
            let prefetches = crate::prefetch_axes::expand_axes(&b.prefetch, &b.shuffle, deployed, bi)?;
            let has_tier2 = b.tier2.iter().any(Option::is_some);
            let has_prefetch = b.prefetch.iter().any(|p| p.as_deref().is_some_and(|p| p != "none"));
            let hybrids = crate::hybrid_axes::expand_axes(&b.exec, &b.overlap, has_tier2, has_prefetch, bi)?;
            let hybrids = &hybrids;
            #[allow(clippy::type_complexity, reason = "one tuple per axis")]
            let axes: Vec<(
                &Option<crate::DeployKey>,
                &Option<crate::PrefetchKey>,
                &Option<crate::HybridKey>,
            )> = deploys
                .iter()
                .flat_map(|d| prefetches.iter().flat_map(move |p| hybrids.iter().map(move |h| (d, p, h))))
                .collect();
            let specs: Vec<&String> = match &b.variants {
                Some(v) => v.iter().collect(),
                None => self.variants.iter().collect(),
            };
            for spec in specs {
                let label = labels.iter().find(|(s, _)| s == spec).map(|(_, l)| l).ok_or_else(|| SweepError::Grid {
                    key: format!("blocks[{bi}].variants: {spec}"),
                    reason: "not one of the grid's variants".into(),
                })?;
                for pname in &b.policies {
                    let policy: Policy = pname.parse().map_err(|e| SweepError::Grid {
                        key: format!("blocks[{bi}].policies: {pname}"),
                        reason: format!("{e}"),
                    })?;
                    for &lambda in &b.lambda {
                        for &j in &b.j {
                            for (cap, layer_caps) in &caps {
                                for (&k, &(deploy, prefetch, hybrid)) in
                                    b.k_used.iter().flat_map(|k| axes.iter().map(move |a| (k, a)))
                                {
                                    let mut key = ConfigKey {
                                        variant: label.clone(),
                                        policy,
                                        lambda,
                                        j,
                                        cap: *cap,
                                        k_used: k.unwrap_or(top_k),
                                        layer_caps: layer_caps.clone(),
                                        deploy: None,
                                        prefetch: *prefetch,
                                        hybrid: *hybrid,
                                    };
                                    key.deploy = key.no_cache_deploy(deploy.clone());
                                    out.push(key);
                                }
                            }
                        }
                    }
                }
            }
        }
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err(SweepError::Grid {
                key: "blocks".into(),
                reason: "no configurations: give at least one block".into(),
            });
        }
        Ok(out)
    }
}

/// Reads a `layer_caps` file: a JSON list of caps, or a plan written by `moe-offload plan`.
fn read_layer_caps(path: &Path) -> std::result::Result<NamedCaps, String> {
    let bytes = trace_io::read_text(path).map_err(|e| format!("cannot read: {e}"))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("not JSON: {e}"))?;
    let list = if v.is_array() { &v } else { &v["chosen"]["plan"]["caps"] };
    let caps: Vec<usize> = serde_json::from_value(list.clone())
        .map_err(|_| "expected a JSON list of caps or a plan written by `moe-offload plan`".to_string())?;
    let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
    Ok(NamedCaps { name, caps })
}
