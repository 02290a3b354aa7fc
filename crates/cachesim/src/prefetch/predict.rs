//! What the prefetch token loop asks of a predictor: the [`Predict`] trait, and the
//! predictor that proposes nothing (plain replay on the timeline).

/// A predictor of SEMANTICS.md §12 for one layer: proposes, before the demand accesses of a
/// token, up to `budget` experts to load, from what a runtime knows by then.
pub(crate) trait Predict {
    /// Whether the predictor may propose at all ([`NoPrefetch`] does not: the loop then has no
    /// prefetch step, and no tag is ever set).
    const ACTIVE: bool = true;
    /// Appends the proposals for token `t` to `out` (empty on entry; at most the budget,
    /// distinct ids `< E`). `oracle` is F[0..n] of (t, l), the experts chosen at λ = 0; only
    /// `oracle` may read it (it is the future).
    fn propose(&mut self, t: usize, oracle: &[u16], out: &mut Vec<u16>);
    /// The experts chosen at token `t`, after selection (in processing order).
    fn observe(&mut self, _chosen: &[u16]) {}
}

/// Proposes nothing: the prefetch loop then replays exactly as [`crate::replay`] does, and
/// records the demand loads for the timeline.
pub(crate) struct NoPrefetch;

impl Predict for NoPrefetch {
    const ACTIVE: bool = false;
    #[inline(always)]
    fn propose(&mut self, _t: usize, _oracle: &[u16], _out: &mut Vec<u16>) {}
}
