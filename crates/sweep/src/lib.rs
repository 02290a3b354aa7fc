//! sweep: whole configuration grids of expert-cache replays, in and out of sample.
//!
//! A [`Grid`] (a JSON file, `docs/grid-format.md`) names an in-sample and an out-of-sample trace,
//! the variants (`full`, `METRIC@K` keep maps built from the in-sample statistics, or keep-map
//! files) and blocks of policies × λ × j × cap × k_used (SEMANTICS.md §7). [`prepare`] builds the
//! keep maps and validates every configuration before any work; [`Prepared::run`] replays them
//! all (with [`cachesim::replay_many_traces`]: both traces, tasks of one layer in parallel on
//! rayon's pool) and returns [`Row`]s sorted by [`ConfigKey`], identical whatever the thread
//! count. [`DeviceProfile`] is the cost model of SEMANTICS.md §6; [`SweepOutput`] writes
//! `results.json`, `results.csv` and `summary.md`, and [`SweepOutput::merge`] joins the outputs of a
//! sharded run after checking that they belong together. [`plan`] allocates per-layer caches for a
//! memory budget from miss-ratio curves (an exact knapsack over layers, `docs/planning.md`).
//!
//! sweep prints nothing: progress is reported through a callback.

mod cost;
mod deploy_axes;
mod deploy_cost;
mod grid;
mod hybrid_axes;
mod hybrid_json;
mod merge;
mod output;
pub mod plan;
mod prefetch_axes;
mod run;
mod summary;

pub use cost::{DeviceProfile, EXPERT_MB_MAX, ExpertShape, GBPS_MIN, MS_MAX, PRESETS, preset_for_model};
pub use deploy_axes::{DeployFigures, DeployKey, NamedPins};
pub use deploy_cost::DeployCost;
pub use grid::{Block, ConfigKey, Grid, GridTraces, NamedCaps, ProfileSpec};
pub use hybrid_axes::{HybridCostEntry, HybridFigures, HybridKey};
pub use hybrid_json::hybrid_fields;
pub use output::{
    BestOf, InputRef, KeepRef, Provenance, RESULTS_KIND, Shard, SweepOutput, best_per_variant, keep_map_sha256,
    write_atomic,
};
pub use prefetch_axes::{PrefetchFigures, PrefetchKey, TimelineCost};
pub use run::{Cost, Estimate, Prepared, Row, Sample, TraceInput, Variant, prepare, replay_config, variant_keep_map};
pub use summary::{Column, SUMMARY_COLUMNS, SUMMARY_INTRO, SummaryTable};

use std::path::PathBuf;

/// Everything that can go wrong preparing or writing a sweep. Running a prepared sweep cannot fail.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SweepError {
    /// A grid entry is invalid; `key` names it (for example `blocks[2].policies: lruu`).
    #[error("grid: {key}: {reason}")]
    Grid {
        /// The offending entry.
        key: String,
        /// Why.
        reason: String,
    },
    /// A device profile field is missing or out of range; `field` names it.
    #[error("profile {name:?}: {field}: {reason}")]
    Profile {
        /// The profile's name.
        name: String,
        /// The field (`host_gbps`, `compute_ms`, ...).
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A device profile file breaks a rule of the file itself (a field given twice); `key` names
    /// the field.
    #[error("{path}: key `{key}`: {reason}")]
    ProfileFile {
        /// The profile file.
        path: PathBuf,
        /// The offending field.
        key: String,
        /// Why.
        reason: String,
    },
    /// cachesim refused a configuration.
    #[error("configuration {key}: {source}")]
    Config {
        /// The configuration key.
        key: String,
        /// cachesim's reason.
        #[source]
        source: cachesim::CacheSimError,
    },
    /// A keep map could not be built or read.
    #[error(transparent)]
    Saliency(#[from] saliency::SaliencyError),
    /// The keep map of a grid variant could not be built or read.
    #[error("variant {spec}: {source}")]
    Variant {
        /// The variant as the grid spells it (`METRIC@K`, `file:PATH`).
        spec: String,
        /// saliency's reason.
        #[source]
        source: saliency::SaliencyError,
    },
    /// A trace could not be opened.
    #[error(transparent)]
    Trace(#[from] trace_io::TraceError),
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// cachesim refused a curve or replay of the plan search.
    #[error(transparent)]
    CacheSim(#[from] cachesim::CacheSimError),
    /// The plan search found no plan, or its inputs cannot be planned.
    #[error("{reason}")]
    Plan {
        /// Why.
        reason: String,
    },
    /// llama.cpp flags cannot say a plan exactly.
    #[error("llama.cpp flags: {0}")]
    LlamaFlags(#[from] plan::llama::FlagsError),
    /// Shard outputs cannot be merged.
    #[error("cannot merge: {reason}")]
    Merge {
        /// Why.
        reason: String,
    },
    /// A JSON file read as sweep results holds another moe-offload output (its `kind` tag).
    #[error("{path}: a `{kind}` file, not sweep results (`moe-offload-sweep-results`, written by `moe-offload sweep`)")]
    NotResults {
        /// The file.
        path: PathBuf,
        /// Its `kind` tag.
        kind: String,
    },
    /// A JSON file (grid, results) is malformed.
    #[error("{path}: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

/// Shorthand for `Result<T, SweepError>`.
pub type Result<T, E = SweepError> = std::result::Result<T, E>;
