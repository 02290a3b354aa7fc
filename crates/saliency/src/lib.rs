//! saliency: which experts of a Mixture-of-Experts model are worth keeping.
//!
//! From routing traces (or aggregate statistics files) this crate computes per-(layer, expert)
//! saliency statistics, scores experts with the metrics of SEMANTICS.md §2 (frequency, gate sums,
//! expert activation norms, REAP and its variants), builds keep maps that prune each layer to its K
//! most salient experts (§3), measures how much of a held-out trace's routing a keep map retains
//! (§4), and runs the audit checks on statistics, keep maps and retention (§8, checks 1 to 3).
//!
//! Main types and functions:
//! - [`Stats`] (with [`StatsMeta`], [`LayerStats`]): the statistics, from a trace
//!   ([`Stats::from_trace`]), a REAP aggregate file ([`Stats::from_reap_agg`]), a per-expert count
//!   file ([`Stats::from_counts_file`]), llama.cpp's expert profile
//!   ([`Stats::from_llama_expert_stats`]) or their own JSON file ([`Stats::read_json`]).
//! - [`Metric`], [`MetricConfig`], [`metric_scores`]: `[L][E]` scores, higher = keep.
//! - [`KeepMap`], [`KeepConfig`]: the experts kept per layer for a metric and budget K
//!   ([`KeepMap::build`], [`KeepMap::build_many`]), for a global budget with a different K per
//!   layer ([`KeepMap::build_budget`], [`Budget`], [`BudgetScale`]), or `full`.
//! - [`Placement`], [`KeepMap::place`]: kTransformers' GPU expert placements (uniform,
//!   front-loading, random, frequency) as pin maps with a different size per layer.
//! - [`retention`] → [`Retention`]: out-of-sample retention of a keep map.
//! - [`check_stats`], [`check_keep_maps`], [`check_retention`] → [`KeepCheck`]: audit checks
//!   (SEMANTICS.md §8, checks 1 to 3).
//! - [`SaliencyError`]: the one error type.
//!
//! The crate does no printing; its only I/O is reading and writing JSON files.

mod check;
mod counts;
mod error;
mod expert_profile;
mod jsonio;
mod keep;
mod metric;
mod placement;
mod reap_agg;
mod retention;
mod stats;

pub use check::{KeepCheck, LOW_HIT_THRESHOLD, check_keep_maps, check_stats};
pub use counts::{CountsFormat, CountsOptions};
pub use error::{Result, SaliencyError};
pub use expert_profile::ExpertStatsOptions;
pub use keep::{Budget, BudgetScale, KEEP_MAP_KIND, KeepConfig, KeepMap};
pub use metric::{Metric, MetricConfig, metric_scores, rank_percentiles};
pub use placement::{DEFAULT_PLACEMENT_SEED, Placement, PlacementRecord, placement_layers};
pub use reap_agg::{NonFiniteReap, ReapAggCorpus, ReapAggOptions};
pub use retention::{LayerRetention, RETENTION_TOLERANCE, Retention, RetentionFigures, check_retention, retention};
pub use stats::{LayerStats, STATS_KIND, Stats, StatsMeta};

#[cfg(test)]
mod tests;
