//! Preparing a sweep (keep maps, validation of every configuration) and running it with rayon.

use std::path::PathBuf;

use cachesim::{CoactTable, Keep, ReplayConfig, ReplayCounts};
use saliency::{KeepConfig, KeepMap, MetricConfig, Stats};
use trace_io::TraceView;

use crate::{ConfigKey, DeviceProfile, Grid, Result, SweepError};

/// Which of the grid's two traces a row comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sample {
    /// The calibration trace (keep maps are built from it).
    InSample,
    /// The held-out trace.
    OutOfSample,
}

impl Sample {
    /// `in_sample` or `out_of_sample`.
    pub fn as_str(self) -> &'static str {
        match self {
            Sample::InSample => "in_sample",
            Sample::OutOfSample => "out_of_sample",
        }
    }
}

/// One input trace with its provenance.
#[derive(Debug, Clone, Copy)]
pub struct TraceInput<'a> {
    /// The validated trace.
    pub view: TraceView<'a>,
    /// Where it came from (a path, or `embedded:NAME`).
    pub source: &'a str,
    /// Digest of the trace file's bytes as recorded (`trace_io::trace_digest`: `blake3:HEX`).
    pub digest: &'a str,
}

/// A variant: a keep map and the grid spec it came from.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Variant {
    /// The spec in the grid (`full`, `frequency@32`, `file:...`).
    pub spec: String,
    /// Its label in keys and tables.
    pub label: String,
    /// The keep map.
    pub keep: KeepMap,
}

/// A validated sweep, ready to run: nothing in it can fail any more.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The grid.
    pub grid: Grid,
    /// The in-sample statistics the metric variants were built from.
    pub stats: Stats,
    /// Variants in grid order.
    pub variants: Vec<Variant>,
    /// Configurations, sorted by key.
    pub configs: Vec<ConfigKey>,
    /// Device profiles.
    pub profiles: Vec<DeviceProfile>,
    keeps: Vec<Keep>,
    /// The co-activation table of `coact` (SEMANTICS.md §12), when a configuration uses it.
    coact: Option<CoactTable>,
}

/// Cost figures of one row for one profile and bandwidth (SEMANTICS.md §6).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// Profile name.
    pub profile: String,
    /// SSD bandwidth, GB/s.
    pub bandwidth_gbps: f64,
    /// `misses_per_token · expert_mb`, MB per token.
    pub ssd_mb_per_token: f64,
    /// Tokens per second.
    pub tok_s: f64,
}

/// One result row: a configuration replayed on one trace.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Row {
    /// `variant/policy/lambda/j/cap/k_used`.
    pub key: String,
    /// The trace.
    pub sample: Sample,
    /// The configuration.
    pub config: ConfigKey,
    /// The replay counts.
    pub counts: ReplayCounts,
    /// `hits / picks`.
    pub hit_rate: f64,
    /// `misses / tokens counted`.
    pub misses_per_token: f64,
    /// One entry per profile and bandwidth, in grid order.
    pub cost: Vec<Cost>,
    /// Pinned hits, tier-2 hits, storage reads, steps, rows (SEMANTICS.md §9–§11): the rows of
    /// configurations with a deployment only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deploy: Option<crate::DeployFigures>,
    /// Prefetch loads, useful, wasted, precision, coverage and the timeline (SEMANTICS.md §12,
    /// §13): the rows of configurations with a predictor only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<crate::PrefetchFigures>,
    /// Host runs, loads, copies and the §14 cost per profile (SEMANTICS.md §14): the rows of
    /// configurations with `exec` host or host:R only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hybrid: Option<crate::HybridFigures>,
}

/// What [`Prepared::calibrate`] found.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    /// Estimated seconds of the whole run on one thread.
    pub seconds: f64,
    /// Configurations replayed by the calibration.
    pub sampled_configs: usize,
    /// Tokens of the one layer they were replayed on.
    pub sampled_tokens: usize,
}

/// The first layer and first `max_tokens` tokens of `v` as a trace of its own (`None` for a
/// trace without tokens).
fn first_layer_prefix(v: &TraceView<'_>, max_tokens: usize) -> Option<trace_io::TraceData> {
    let s = v.shape();
    let n = s.tokens.min(max_tokens);
    if n == 0 || s.layers == 0 {
        return None;
    }
    let mut meta = v.meta().clone();
    meta.layer_ids.truncate(1);
    let rows = |w: usize, x: Option<&[f32]>| x.map(|x| x[..n * w].to_vec());
    let below = |o: Option<&[u64]>| o.map(|o| o.iter().copied().filter(|&t| t < n as u64).collect::<Vec<_>>());
    let parts = trace_io::OwnedParts {
        ids: v.layer_ids(0)[..n * s.candidates].to_vec(),
        scores: rows(s.candidates, v.layer_scores(0)),
        gates: rows(s.top_k, v.layer_gates(0)),
        out_norms: rows(s.top_k, v.layer_out_norms(0)),
        seq_offsets: below(v.seq_offsets()),
        step_offsets: below(v.step_offsets()),
    };
    trace_io::TraceData::new(meta, n, s.candidates, parts).ok()
}

/// Checks the traces, builds the in-sample statistics and every keep map, expands the grid and
/// validates every configuration against both traces, before any replay.
///
/// # Errors
/// [`SweepError::Grid`] for a bad variant spec, duplicate label or mismatched traces;
/// [`SweepError::Saliency`] when a keep map cannot be built (K > E, short layer, missing statistic);
/// [`SweepError::Config`] naming the first configuration `cachesim` refuses (cap < k_used, belady
/// with λ > 0, k_used > m, a view not validated for what it reads, ...); [`SweepError::Trace`]
/// when the in-sample view was not validated for the statistics (`trace_io::Reads::stats`).
pub fn prepare(grid: &Grid, in_sample: &TraceInput<'_>, out_of_sample: &TraceInput<'_>) -> Result<Prepared> {
    let (a, b) = (in_sample.view.meta(), out_of_sample.view.meta());
    if a.num_experts != b.num_experts || a.layer_ids != b.layer_ids || a.top_k != b.top_k {
        return Err(SweepError::Grid {
            key: "traces".into(),
            reason: format!(
                "in-sample and out-of-sample traces differ in shape: E {} vs {}, top_k {} vs {}, layers {:?} vs {:?}",
                a.num_experts, b.num_experts, a.top_k, b.top_k, a.layer_ids, b.layer_ids
            ),
        });
    }
    for (input, which) in [(in_sample, "in-sample"), (out_of_sample, "out-of-sample")] {
        if input.view.shape().tokens == 0 {
            return Err(SweepError::Grid {
                key: "traces".into(),
                reason: format!("the {which} trace {} has no tokens: no figure can be computed from it", input.source),
            });
        }
    }
    // The statistics read the in-sample trace's first k ids, gates and norms (the replays check
    // what they read themselves).
    in_sample.view.require(trace_io::Reads::stats(in_sample.view.shape().top_k))?;
    let stats = Stats::from_trace(&in_sample.view, in_sample.source.to_string(), in_sample.digest.to_string());
    let keep_cfg = KeepConfig { metric: MetricConfig { tau: grid.tau, ..Default::default() }, ..Default::default() };
    let mut variants: Vec<Variant> = Vec::new();
    for spec in &grid.variants {
        let keep = variant_keep_map(spec, &stats, &keep_cfg, a).map_err(|e| match e {
            SweepError::Saliency(source) => SweepError::Variant { spec: spec.clone(), source },
            e => e,
        })?;
        let label = if let Some(path) = spec.strip_prefix("file:") {
            format!("{}[{}]", keep.label(), PathBuf::from(path).file_stem().unwrap_or_default().to_string_lossy())
        } else {
            keep.label()
        };
        if variants.iter().any(|v| v.label == label) {
            return Err(SweepError::Grid {
                key: format!("variants: {spec}"),
                reason: format!("duplicate variant {label}"),
            });
        }
        variants.push(Variant { spec: spec.clone(), label, keep });
    }
    let labels: Vec<(String, String)> = variants.iter().map(|v| (v.spec.clone(), v.label.clone())).collect();
    let configs = grid.expand(&labels, a.top_k as usize)?;
    let profiles = grid.device_profiles()?;
    let shape = in_sample.view.shape();
    let keeps = variants
        .iter()
        .map(|v| Keep::from_layers(&shape, &v.keep.layers))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|source| SweepError::Config { key: "variants".into(), source })?;
    let coact = learn_coact(grid, in_sample, &configs)?;
    for key in &configs {
        for (input, which) in [(in_sample, "in-sample"), (out_of_sample, "out-of-sample")] {
            let v = &input.view;
            let (m, e) = (v.shape().candidates, v.shape().num_experts);
            let bad = |reason: String| SweepError::Grid {
                key: format!("{key} on the {which} trace {}", input.source),
                reason,
            };
            if key.j > m {
                return Err(bad(format!(
                    "j = {} is more than the {m} candidates per row: ranks below j are boosted, and a row has only {m}; \
                     use j <= {m}",
                    key.j
                )));
            }
            let caps = key.layer_caps.as_ref().map_or(&[][..], |c| &c.caps[..]);
            if let Some(&cap) = std::iter::once(&key.cap).chain(caps).find(|&&c| c > e) {
                return Err(bad(format!(
                    "cap {cap} is more than the {e} experts of a layer: every expert fits and the cache never evicts; \
                     use cap <= {e}"
                )));
            }
            let cfg = replay_config(grid, key);
            let keep = &keeps[variants.iter().position(|x| x.label == key.variant).expect("keys come from variants")];
            let checked = match (&key.deploy, &key.prefetch) {
                _ if key.hybrid.is_some() => {
                    let h = key.hybrid.expect("hybrid");
                    crate::hybrid_axes::check_profiles(key, &h, &profiles)?;
                    key.deploy
                        .as_ref()
                        .map_or_else(|| Ok(Default::default()), |d| d.deployment(&v.shape()))
                        .and_then(|dep| cachesim::hybrid::validate(v, keep, &cfg, &dep, h.exec))
                }
                (Some(d), _) => {
                    d.deployment(&v.shape()).and_then(|dep| cachesim::deploy::validate(v, keep, &cfg, &dep))
                }
                (None, Some(p)) => cachesim::validate(&v.shape(), v.parts().scores.is_some(), &cfg)
                    .and_then(|()| keep.check_shape(&v.shape()))
                    .and_then(|()| cachesim::validate_prefetch(v, &cfg, &p.options(coact.as_ref()))),
                (None, None) => cachesim::validate(&v.shape(), v.parts().scores.is_some(), &cfg),
            };
            checked.map_err(|source| SweepError::Config {
                key: format!("{key} on the {which} trace {}", input.source),
                source,
            })?;
        }
    }
    Ok(Prepared { grid: grid.clone(), stats, variants, configs, profiles, keeps, coact })
}

/// The co-activation table of the grid's `coact` configurations (none without them): learned
/// from `coact_calibration` when the grid names one, else from the in-sample trace.
///
/// # Errors
/// [`SweepError::Trace`] when the calibration trace cannot be opened or validated (naming the
/// file); [`SweepError::Config`] (key `coact_calibration`) when cachesim refuses it.
fn learn_coact(grid: &Grid, in_sample: &TraceInput<'_>, configs: &[ConfigKey]) -> Result<Option<CoactTable>> {
    if !crate::prefetch_axes::needs_coact(configs) {
        return Ok(None);
    }
    let key = |name: String| move |source| SweepError::Config { key: format!("coact_calibration: {name}"), source };
    let table = match &grid.coact_calibration {
        Some(path) => {
            let file = trace_io::TraceFile::open_lazy(path)?;
            let view = file.view_for(trace_io::Reads::ids(file.shape().top_k))?;
            CoactTable::learn(&view).map_err(key(path.display().to_string()))?
        }
        None => CoactTable::learn(&in_sample.view).map_err(key(format!("traces.in_sample {}", in_sample.source)))?,
    };
    Ok(Some(table))
}

/// The keep map of a variant spec: `full`, `METRIC@K` (built from `stats` with `cfg`) or
/// `file:PATH` (read, and checked against the traces' E and layers in `meta`).
///
/// # Errors
/// [`SweepError::Grid`] for a malformed spec or a map of another shape; [`SweepError::Saliency`]
/// when the map cannot be built or read.
pub fn variant_keep_map(spec: &str, stats: &Stats, cfg: &KeepConfig, meta: &trace_io::TraceMeta) -> Result<KeepMap> {
    if spec == "full" {
        return Ok(KeepMap::full(meta.num_experts, meta.layer_ids.clone()));
    }
    if let Some(path) = spec.strip_prefix("file:") {
        let map = KeepMap::read_json(std::path::Path::new(path))?;
        if map.num_experts != meta.num_experts || map.layer_ids != meta.layer_ids {
            return Err(SweepError::Grid {
                key: format!("variants: {spec}"),
                reason: format!(
                    "keep map is for E = {} and layers {:?}, the traces have E = {} and layers {:?}",
                    map.num_experts, map.layer_ids, meta.num_experts, meta.layer_ids
                ),
            });
        }
        return Ok(map);
    }
    let bad = |reason: String| SweepError::Grid { key: format!("variants: {spec}"), reason };
    let (metric, k) = spec.split_once('@').ok_or_else(|| bad("expected `full`, `METRIC@K` or `file:PATH`".into()))?;
    let metric = metric.parse().map_err(|e| bad(format!("{e}")))?;
    let k: usize = k.parse().map_err(|_| bad(format!("K = {k:?} is not a whole number")))?;
    Ok(KeepMap::build(stats, metric, k, cfg)?)
}

/// The replay configuration of a key under the grid's shared settings.
pub fn replay_config(grid: &Grid, key: &ConfigKey) -> ReplayConfig {
    ReplayConfig {
        layer_caps: key.layer_caps.as_ref().map(|c| c.caps.clone()),
        k_used: Some(key.k_used),
        lambda: key.lambda,
        j: key.j,
        warmup: grid.warmup,
        ..ReplayConfig::new(key.policy, key.cap)
    }
}

impl Prepared {
    /// Restricts the sweep to one shard: the configurations whose index in the sorted list is
    /// congruent to `shard.index` modulo `shard.count` (round robin, so shards get similar mixes).
    ///
    /// # Errors
    /// [`SweepError::Grid`] when `count` is 0 or `index >= count`.
    pub fn shard(&mut self, shard: crate::Shard) -> Result<()> {
        if shard.count == 0 || shard.index >= shard.count {
            return Err(SweepError::Grid {
                key: format!("--shard {}/{}", shard.index, shard.count),
                reason: "need 0 <= index < count".into(),
            });
        }
        let configs = std::mem::take(&mut self.configs);
        self.configs =
            configs.into_iter().enumerate().filter(|(i, _)| i % shard.count == shard.index).map(|(_, c)| c).collect();
        Ok(())
    }

    /// The co-activation table the `coact` configurations replay with (SEMANTICS.md §12), when
    /// the grid has any.
    pub fn coact(&self) -> Option<&CoactTable> {
        self.coact.as_ref()
    }

    /// The keep map of every pruned variant, for [`crate::Provenance::keep_maps`], in grid order.
    pub fn keep_maps(&self) -> Vec<crate::KeepRef> {
        self.variants
            .iter()
            .filter(|v| !v.keep.is_full())
            .map(|v| crate::KeepRef { variant: v.label.clone(), sha256: crate::keep_map_sha256(&v.keep) })
            .collect()
    }

    /// Number of replays [`Prepared::run`] performs (configurations × 2 traces).
    pub fn jobs(&self) -> usize {
        self.configs.len() * 2
    }

    /// The work [`Prepared::run`] reports through `progress`: configurations × (layers × tokens)
    /// of each trace, in token-layers.
    pub fn work(&self, in_sample: &TraceView<'_>, out_of_sample: &TraceView<'_>) -> u64 {
        let size = |v: &TraceView<'_>| (v.shape().layers * v.shape().tokens) as u64;
        self.configs.len() as u64 * (size(in_sample) + size(out_of_sample))
    }

    /// Estimates the single-threaded time of [`Prepared::run`] from a quick calibration: replays a
    /// sample of the configurations of each kind (plain, deployed, prefetched, hybrid: each
    /// spread over its part of the sorted list, each replayed by its own path) on the first layer
    /// and first tokens (up to 4096) of the in-sample trace, for about `budget` shared between the
    /// kinds, and extrapolates each kind's rate in token-layers per second to its share of
    /// [`Prepared::work`] (a kind without a sample takes the mean rate of the others). The run
    /// itself shares work between plain configurations and runs on every core, so it is usually
    /// faster than this figure over the thread count.
    pub fn calibrate(
        &self,
        in_sample: &TraceView<'_>,
        out_of_sample: &TraceView<'_>,
        budget: std::time::Duration,
    ) -> Estimate {
        let none = Estimate { seconds: 0.0, sampled_configs: 0, sampled_tokens: 0 };
        let Some(prefix) = first_layer_prefix(in_sample, 4096) else { return none };
        let view = prefix.view();
        let shape = view.shape();
        let keeps: Vec<Option<Keep>> =
            self.variants.iter().map(|v| Keep::from_layers(&shape, &v.keep.layers[..1]).ok()).collect();
        let kind = |k: &ConfigKey| match (&k.hybrid, &k.deploy, &k.prefetch) {
            (Some(_), _, _) => 3,
            (None, Some(_), _) => 1,
            (None, None, Some(_)) => 2,
            (None, None, None) => 0,
        };
        // The deployment of a key on the one-layer prefix: its pins' first layer.
        let deployment = |k: &ConfigKey| -> Option<cachesim::deploy::Deployment> {
            let Some(d) = &k.deploy else { return Some(Default::default()) };
            let mut d = d.clone();
            if let Some(p) = &mut d.pin {
                p.layers.truncate(1);
            }
            d.deployment(&shape).ok()
        };
        let devices = crate::prefetch_axes::devices(&self.profiles);
        // One replay of `key` on the prefix by its kind's path; `false` when it cannot run there
        // (a coact table of the whole trace, a batch above the prefix's sequences).
        let replay_one = |key: &ConfigKey, keep: &Keep| -> bool {
            let mut cfg = replay_config(&self.grid, key);
            cfg.layer_caps = cfg.layer_caps.map(|c| c[..1].to_vec());
            match kind(key) {
                0 => cachesim::replay(&view, keep, &cfg).is_ok(),
                1 => deployment(key).is_some_and(|d| cachesim::deploy::replay(&view, keep, &cfg, &d).is_ok()),
                2 => key.prefetch.is_some_and(|pk| {
                    let devices = if pk.prefetch.is_some() { &devices[..] } else { &[] };
                    let opts = pk.options(self.coact.as_ref());
                    cachesim::replay_prefetch_on(&view, keep, &cfg, &opts, devices).is_ok()
                }),
                _ => key.hybrid.is_some_and(|h| {
                    deployment(key)
                        .is_some_and(|d| cachesim::hybrid::replay_hybrid(&view, keep, &cfg, &d, h.exec).is_ok())
                }),
            }
        };
        let mut per_kind: [Vec<&ConfigKey>; 4] = Default::default();
        for key in &self.configs {
            per_kind[kind(key)].push(key);
        }
        let present = per_kind.iter().filter(|k| !k.is_empty()).count().max(1) as u32;
        // (configurations sampled, seconds) per kind.
        let mut measured = [(0usize, 0.0f64); 4];
        for (ki, keys) in per_kind.iter().enumerate() {
            let stride = keys.len().div_ceil(8).max(1);
            let start = std::time::Instant::now();
            for key in keys.iter().step_by(stride) {
                let vi = self.variants.iter().position(|v| v.label == key.variant).expect("keys come from variants");
                let Some(keep) = &keeps[vi] else { continue };
                let t = std::time::Instant::now();
                if replay_one(key, keep) {
                    measured[ki].0 += 1;
                    measured[ki].1 += t.elapsed().as_secs_f64();
                }
                if start.elapsed() >= budget / present {
                    break;
                }
            }
        }
        let sampled: usize = measured.iter().map(|m| m.0).sum();
        let elapsed: f64 = measured.iter().map(|m| m.1).sum();
        if sampled == 0 || elapsed <= 0.0 {
            return none;
        }
        // Seconds per token-layer: each kind's own, else the mean of those measured.
        let mean = elapsed / (sampled * shape.tokens) as f64;
        let size = |v: &TraceView<'_>| (v.shape().layers * v.shape().tokens) as f64;
        let per_config = size(in_sample) + size(out_of_sample);
        let seconds = per_kind
            .iter()
            .zip(&measured)
            .map(|(keys, &(n, secs))| {
                let rate = if n > 0 && secs > 0.0 { secs / (n * shape.tokens) as f64 } else { mean };
                keys.len() as f64 * per_config * rate
            })
            .sum();
        Estimate { seconds, sampled_configs: sampled, sampled_tokens: shape.tokens }
    }

    /// Replays every configuration on both traces and returns the rows sorted by (key, sample).
    /// Both traces are replayed by [`cachesim::replay_many_traces`]: tasks of one layer and one set
    /// of configurations that share work, from one queue on the rayon pool, the longest first.
    /// `progress(n)` is called from worker threads as n token-layers are replayed (they add up
    /// to [`Prepared::work`]). The rows are identical whatever the number of threads.
    pub fn run(
        &self,
        in_sample: &TraceView<'_>,
        out_of_sample: &TraceView<'_>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<Row> {
        self.run_with(in_sample, out_of_sample, cachesim::Sharing::default(), progress)
    }

    /// [`Prepared::run`] with the plain configurations of a layer that share a keep map
    /// replayed as `sharing` says ([`cachesim::Sharing`]: in one pass over the rows, the
    /// default, or one after another); the rows are identical either way.
    pub fn run_with(
        &self,
        in_sample: &TraceView<'_>,
        out_of_sample: &TraceView<'_>,
        sharing: cachesim::Sharing,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<Row> {
        // Plain configurations share work in one queue; deployed ones replay one by one (each
        // with its layers in parallel).
        let (hybrid, rest): (Vec<&ConfigKey>, Vec<&ConfigKey>) = self.configs.iter().partition(|k| k.hybrid.is_some());
        let (special, plain): (Vec<&ConfigKey>, Vec<&ConfigKey>) =
            rest.into_iter().partition(|k| k.deploy.is_some() || k.prefetch.is_some());
        let (deployed, prefetched): (Vec<&ConfigKey>, Vec<&ConfigKey>) =
            special.into_iter().partition(|k| k.deploy.is_some());
        let keep_of = |key: &ConfigKey| {
            &self.keeps[self.variants.iter().position(|v| v.label == key.variant).expect("keys come from variants")]
        };
        let runs: Vec<(&Keep, ReplayConfig)> = plain
            .iter()
            .map(|key| {
                let vi = self.variants.iter().position(|v| v.label == key.variant).expect("keys come from variants");
                (&self.keeps[vi], replay_config(&self.grid, key))
            })
            .collect();
        let runs: Vec<(&Keep, &ReplayConfig)> = runs.iter().map(|(k, c)| (*k, c)).collect();
        // Both traces in one queue of tasks, the longest first: the short out-of-sample tasks
        // fill the end.
        let mut counts = cachesim::replay_many_traces_with(&[*in_sample, *out_of_sample], &runs, sharing, &|tokens| {
            progress(tokens as u64)
        })
        .expect("every configuration was validated by prepare");
        let (oos, ins) = (counts.pop().expect("two traces"), counts.pop().expect("two traces"));
        let mut rows: Vec<Row> = plain
            .iter()
            .zip(ins.into_iter().zip(oos))
            .flat_map(|(key, (i, o))| [self.row(key, Sample::InSample, i), self.row(key, Sample::OutOfSample, o)])
            .collect();
        for key in deployed {
            let (keep, cfg, d) = (keep_of(key), replay_config(&self.grid, key), key.deploy.as_ref().expect("deployed"));
            for (view, sample) in [(in_sample, Sample::InSample), (out_of_sample, Sample::OutOfSample)] {
                let c = crate::deploy_axes::replay(view, keep, &cfg, d);
                progress((view.shape().layers * view.shape().tokens) as u64);
                let mut row = self.row(key, sample, c.counts.clone());
                row.cost = crate::deploy_axes::costs(&self.profiles, &c, d);
                row.deploy = Some(crate::DeployFigures::of(&c));
                rows.push(row);
            }
        }
        rows.extend(self.run_prefetch(&prefetched, in_sample, out_of_sample, progress));
        rows.extend(self.run_hybrid(&hybrid, in_sample, out_of_sample, progress));
        // Configurations are sorted by key: rows in that order, in-sample first.
        rows.sort_by(|a, b| a.config.cmp(&b.config).then(a.sample.cmp(&b.sample)));
        rows
    }

    /// Builds a row from counts: derived fields follow SEMANTICS.md §5 and §6.
    pub fn row(&self, key: &ConfigKey, sample: Sample, counts: ReplayCounts) -> Row {
        let mpt = counts.misses_per_token();
        let cost = self
            .profiles
            .iter()
            .flat_map(|p| {
                p.bandwidth_gbps.iter().map(move |&bw| Cost {
                    profile: p.name.clone(),
                    bandwidth_gbps: bw,
                    ssd_mb_per_token: p.ssd_mb_per_token(mpt),
                    tok_s: p.tok_s(mpt, bw),
                })
            })
            .collect();
        Row {
            key: key.to_string(),
            sample,
            config: key.clone(),
            hit_rate: counts.hit_rate(),
            misses_per_token: mpt,
            counts,
            cost,
            deploy: None,
            prefetch: None,
            hybrid: None,
        }
    }

    /// The rows of the hybrid configurations (SEMANTICS.md §14), both traces, one configuration
    /// after another (each with its layers in parallel). Keys that differ only in their overlap
    /// are adjacent in key order and share one replay: the events are recorded once and priced
    /// per overlap and profile.
    fn run_hybrid(
        &self,
        keys: &[&ConfigKey],
        in_sample: &TraceView<'_>,
        out_of_sample: &TraceView<'_>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<Row> {
        let mut rows = Vec::new();
        for (view, sample) in [(in_sample, Sample::InSample), (out_of_sample, Sample::OutOfSample)] {
            let mut last: Option<(ConfigKey, cachesim::hybrid::HybridCounts, cachesim::hybrid::HybridEvents)> = None;
            for key in keys {
                let h = key.hybrid.expect("hybrid keys");
                let mut bare = (*key).clone();
                bare.hybrid = Some(crate::HybridKey { overlap: None, ..h });
                if last.as_ref().is_none_or(|(k, _, _)| *k != bare) {
                    let vi =
                        self.variants.iter().position(|v| v.label == key.variant).expect("keys come from variants");
                    let cfg = replay_config(&self.grid, key);
                    let dep = key
                        .deploy
                        .as_ref()
                        .map_or_else(Default::default, |d| d.deployment(&view.shape()).expect("validated by prepare"));
                    let (c, e) = crate::hybrid_axes::replay(view, &self.keeps[vi], &cfg, &dep, h.exec);
                    last = Some((bare, c, e));
                }
                // Every key counts its share of [`Prepared::work`], replayed or shared.
                progress((view.shape().layers * view.shape().tokens) as u64);
                let (_, counts, events) = last.as_ref().expect("replayed");
                let figures = crate::hybrid_axes::figures(&self.profiles, counts, events, &h);
                let mut row = self.row(key, sample, counts.deploy.counts.clone());
                row.cost = crate::hybrid_axes::costs(&self.profiles, &figures);
                row.hybrid = Some(figures);
                rows.push(row);
            }
        }
        rows
    }

    /// The rows of the configurations with a prefetch key, both traces, one configuration after
    /// another (each with its layers in parallel); a shuffled copy is built once per seed and
    /// trace.
    fn run_prefetch(
        &self,
        keys: &[&ConfigKey],
        in_sample: &TraceView<'_>,
        out_of_sample: &TraceView<'_>,
        progress: &(dyn Fn(u64) + Sync),
    ) -> Vec<Row> {
        let devices = crate::prefetch_axes::devices(&self.profiles);
        let mut seeds: Vec<Option<u64>> = keys.iter().map(|k| k.prefetch.and_then(|p| p.shuffle)).collect();
        seeds.sort_unstable();
        seeds.dedup();
        let mut rows = Vec::new();
        for (view, sample) in [(in_sample, Sample::InSample), (out_of_sample, Sample::OutOfSample)] {
            for &seed in &seeds {
                let shuffled = seed.map(|s| cachesim::shuffle::Shuffled::new(view, s));
                for key in keys.iter().filter(|k| k.prefetch.and_then(|p| p.shuffle) == seed) {
                    let vi =
                        self.variants.iter().position(|v| v.label == key.variant).expect("keys come from variants");
                    let pk = key.prefetch.expect("prefetched");
                    let cfg = replay_config(&self.grid, key);
                    let r = crate::prefetch_axes::replay(
                        view,
                        shuffled.as_ref(),
                        &self.keeps[vi],
                        &cfg,
                        &pk,
                        self.coact.as_ref(),
                        &devices,
                    );
                    progress((view.shape().layers * view.shape().tokens) as u64);
                    let mut row = self.row(key, sample, r.counts.replay.clone());
                    if pk.prefetch.is_some() {
                        let (cost, figures) = crate::prefetch_axes::figures(&self.profiles, &r.counts, &r.timelines);
                        row.cost = cost;
                        row.prefetch = Some(figures);
                    }
                    rows.push(row);
                }
            }
        }
        rows
    }
}
