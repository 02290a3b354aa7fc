//! The one error type of cachesim.

/// A configuration or keep set that cannot be replayed on a trace.
///
/// Every error is raised by [`crate::validate`] (or by [`crate::replay`] before any work starts);
/// the replay core itself cannot fail. Variants carry the offending values.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CacheSimError {
    /// The cache is smaller than the experts a token uses: under k-way residency a token needs
    /// all its `k_used` experts in memory at once (SEMANTICS.md §5).
    #[error(
        "cache capacity {cap} is below k_used = {k_used} (a token needs all its experts resident at once); use a cap of {k_used} or more"
    )]
    CapBelowKUsed {
        /// The requested capacity, in experts per layer.
        cap: usize,
        /// The experts used per token.
        k_used: usize,
    },
    /// A per-layer cache (`layer_caps`) is smaller than the experts a token uses.
    #[error(
        "layer_caps: the cap of layer {layer} (its position in the trace, from 0) is {cap}, below k_used = {k_used} (a token needs all its experts resident at once); use {k_used} or more"
    )]
    LayerCapBelowKUsed {
        /// The layer's position in the trace (and in `layer_caps`), from 0.
        layer: usize,
        /// Its requested capacity, in experts.
        cap: usize,
        /// The experts used per token.
        k_used: usize,
    },
    /// An offline policy (`belady`, [`crate::PolicyFacts::offline`]) is exact only when selection
    /// does not depend on the cache, so it cannot be combined with cache-aware routing (λ > 0).
    #[error(
        "policy {policy} needs lambda = 0 (cache-aware routing makes the future depend on the cache), got lambda = {lambda}"
    )]
    OfflineWithLambda {
        /// The offline policy.
        policy: crate::Policy,
        /// The requested λ.
        lambda: f64,
    },
    /// `k_used` exceeds the candidates recorded per row.
    #[error("k_used = {k_used} is larger than the {candidates} candidates recorded per row")]
    KUsedAboveCandidates {
        /// The requested experts per token.
        k_used: usize,
        /// m, candidates per row in the trace.
        candidates: usize,
    },
    /// The warmup covers the whole trace: nothing would be counted.
    #[error(
        "warmup = {warmup} tokens covers the whole trace ({tokens} tokens): nothing would be counted; use a smaller warmup"
    )]
    WarmupCoversTrace {
        /// W, tokens not counted.
        warmup: usize,
        /// T, tokens in the trace.
        tokens: usize,
    },
    /// The configuration needs router scores and the trace has none.
    #[error("{what} needs router scores, and the trace has none")]
    NeedsScores {
        /// What needs them (`cache-aware routing (lambda > 0)` or `policy inv_router`).
        what: String,
    },
    /// Cache-aware routing (λ > 0) on a trace without candidates beyond `k_used`: there is no
    /// alternative expert to route to.
    #[error(
        "cache-aware routing (lambda > 0) needs candidates beyond k_used, but the trace records {candidates} per row and k_used = {k_used}; use lambda = 0 or a smaller k_used"
    )]
    NoRoomForRouting {
        /// The experts used per token.
        k_used: usize,
        /// m, candidates per row in the trace.
        candidates: usize,
    },
    /// The trace view was not validated for what the replay reads ([`crate::replay_reads`]): a
    /// programming error of the caller, which opens the trace with `TraceFile::view_for`.
    #[error("the trace view was validated for {validated}, but this replay reads {needed}")]
    NotValidated {
        /// What the replay reads.
        needed: String,
        /// What the view's content was validated for.
        validated: String,
    },
    /// A keep set does not have the trace's shape.
    #[error(
        "keep set covers {actual_layers} layers x {actual_experts} experts, but the trace has {expected_layers} layers x {expected_experts} experts"
    )]
    KeepMismatch {
        /// L of the trace.
        expected_layers: usize,
        /// Layers in the keep set.
        actual_layers: usize,
        /// E of the trace.
        expected_experts: usize,
        /// Experts per layer in the keep set.
        actual_experts: usize,
    },
    /// A keep list names an expert id that does not exist.
    #[error("keep list of layer index {layer} names expert {id}, but the trace has only {num_experts} experts")]
    KeepIdOutOfRange {
        /// Layer index (position in the trace, not the model's layer id).
        layer: usize,
        /// The offending id.
        id: u16,
        /// E.
        num_experts: usize,
    },
    /// A pinned expert (SEMANTICS.md §9) that the keep set drops: pins must be kept.
    #[error(
        "pin map: expert {expert} of layer index {layer} is pinned but not kept (pins must be a subset of the keep map)"
    )]
    PinNotKept {
        /// Layer index (position in the trace).
        layer: usize,
        /// The pinned expert.
        expert: usize,
    },
    /// A tier-2 policy that may not serve as tier 2 ([`crate::PolicyFacts::may_be_tier2`]:
    /// tier 2 sees only tier 1's misses, SEMANTICS.md §10).
    #[error(
        "tier-2 policy {policy} is not supported here: tier 2 takes {allowed}: the credit policies need router candidates tier 2 does not see"
    )]
    Tier2Policy {
        /// The policy asked for.
        policy: crate::Policy,
        /// The policies that may serve as tier 2, from their facts (`lru, fifo, lfu or belady`).
        allowed: String,
    },
    /// A deployment feature (SEMANTICS.md §9–§11) in a combination the replayer does not
    /// support, or that the trace cannot give.
    #[error("{what} is not supported here: {reason}")]
    DeployUnsupported {
        /// What was asked for.
        what: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A combination one cache shared by every layer (SEMANTICS.md §15.1) does not replay.
    #[error("{what} is not supported with a shared cache: {reason}")]
    SharedUnsupported {
        /// What was asked for.
        what: &'static str,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A parameter is out of its domain (negative or non-finite λ, decay outside (0, 1],
    /// `k_used` = 0, `cap` = 0).
    #[error("invalid {name} = {value}: {reason}")]
    InvalidParameter {
        /// Parameter name as in [`crate::ReplayConfig`].
        name: &'static str,
        /// The rejected value.
        value: String,
        /// Why it is rejected.
        reason: &'static str,
    },
    /// Prefetch with an offline policy (`belady`, SEMANTICS.md §12: its future would depend on
    /// the prefetches).
    #[error("policy {policy} cannot be combined with prefetch; use an online policy such as lru")]
    PrefetchWithOffline {
        /// The offline policy.
        policy: crate::Policy,
    },
    /// The prefetch budget exceeds a layer's cache capacity (SEMANTICS.md §12: B <= cap).
    #[error(
        "prefetch budget {budget} is larger than the cache capacity {cap} of layer index {layer}; use a budget of {cap} or less"
    )]
    BudgetAboveCap {
        /// B, proposals per (token, layer).
        budget: usize,
        /// The layer's cap, in experts.
        cap: usize,
        /// The layer's position in the trace, from 0.
        layer: usize,
    },
    /// The `lookahead` predictor on a trace without `lookahead_ids`.
    #[error(
        "predictor lookahead needs the trace's lookahead_ids, and the trace has none (record them with `python/capture_routing.py ... --lookahead 16`, docs/capture.md)"
    )]
    NoLookahead,
    /// The `coact` predictor without a co-activation table.
    #[error("predictor coact needs a calibration trace to learn its co-activation table from")]
    CoactNeedsCalibration,
    /// The calibration trace of `coact` is of another model shape than the replayed trace.
    #[error(
        "the calibration trace has {what} {calibration}, the replayed trace {trace}: calibrate on a trace of the same model"
    )]
    CalibrationMismatch {
        /// What differs.
        what: &'static str,
        /// The calibration trace's value.
        calibration: String,
        /// The replayed trace's value.
        trace: String,
    },
}

/// Result type of cachesim.
pub type Result<T> = std::result::Result<T, CacheSimError>;
