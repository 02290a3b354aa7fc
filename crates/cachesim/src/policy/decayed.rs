//! The decayed-score policies (`near_pick_ema`, `inv_router`): priority (s, last access) with
//! s ← d·s + x once per token for every expert, in the lazy form that SEMANTICS.md §5 defines;
//! they differ only in the credit x ([`Credit`]).
//!
//! Lazy form: a multiplier M starts at 1 and is multiplied by 1/d after every token (1/d
//! computed once); a credit x adds x · M to the stored score S[e]; when M exceeds 1e100 every
//! S[e] is divided by M and M is reset to 1. S[e] orders the experts as d·s + x would, without
//! touching every expert every token. The plain reference replayer does the same arithmetic in
//! the same order, so both compare identical f64 values.

use crate::engine::structures::Selector;
use crate::engine::{Cache, Evictor, Params, Pick, Protected};

/// M above which the stored scores are divided by M (SEMANTICS.md §5).
pub(crate) const RESCALE_ABOVE: f64 = 1e100;

/// near_pick_ema and inv_router: priority (S[e], last access); the stored scores S are the
/// cache's keys (`Cache::keys`, kept experts first). Victims come from a [`Selector`] over the
/// cached experts' scores.
pub(crate) struct Decayed<C> {
    /// Pick time of each expert's last access, `[E]`.
    pub(crate) last: Vec<u64>,
    /// 1/d, computed once.
    pub(crate) inv_decay: f64,
    /// M.
    pub(crate) multiplier: f64,
    /// The one victim of sequential mode.
    pub(crate) buf: Vec<u128>,
    pub(crate) sel: Selector,
    pub(crate) credit: C,
}

impl<C> Decayed<C> {
    pub(crate) fn new(params: &Params<'_>, credit: C) -> Decayed<C> {
        let e = params.num_experts;
        let sel = Selector::new(params.cap.min(e));
        Decayed {
            last: vec![0; e],
            inv_decay: 1.0 / params.decay,
            multiplier: 1.0,
            buf: Vec::with_capacity(1),
            sel,
            credit,
        }
    }
}

/// The credits x of a [`Decayed`] policy after token `t`.
pub(crate) trait Credit {
    /// How many leading candidates of F the credit reads.
    fn f_needed(&self) -> usize;
    /// Adds x · `multiplier` to the stored score of every expert credited after token `t`, in
    /// candidate order (`cache`'s keys; `f` is a prefix of F at least `f_needed` long, `row`
    /// the row's ids and `scores` its router scores).
    fn credit(
        &mut self,
        cache: &mut Cache<f64>,
        t: usize,
        f: &[u16],
        row: &[u16],
        scores: Option<&[f32]>,
        multiplier: f64,
    );
}

/// S[e] ← S[e] / M for every stored score (the rescale of the lazy form).
#[inline(never)]
fn rescale(scores: &mut [f64], multiplier: f64) {
    for s in scores {
        *s /= multiplier;
    }
}

impl<C: Credit> Evictor for Decayed<C> {
    type Key = f64;
    const ADMIT_WITHOUT_BRANCH: bool = true;
    const BATCH: bool = true;
    const SLOTS: bool = true;
    fn f_needed(&self) -> usize {
        self.credit.f_needed()
    }
    fn reset(&mut self, cache: &mut Cache<f64>) {
        cache.keys.fill(0.0);
        self.multiplier = 1.0;
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, _inserted: bool, _cache: &mut Cache<f64>) {
        let Pick { e, now, .. } = pick;
        self.last[e] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<f64>, protected: Protected<'_>) -> usize {
        // Only sequential mode asks for one victim per miss, and it protects nothing.
        let mut out = std::mem::take(&mut self.buf);
        self.victims(cache, protected, 1, &[], &mut out);
        let v = (out[0] & 0xFFFF) as usize;
        self.buf = out;
        v
    }
    #[inline(always)]
    fn victims(
        &mut self,
        cache: &Cache<f64>,
        _protected: Protected<'_>,
        q: usize,
        chosen: &[u16],
        out: &mut Vec<u128>,
    ) {
        // The protected experts are the cached ones among `chosen`.
        let order = &cache.order[..cache.len];
        self.sel.start().extend_from_slice(cache.live_keys());
        self.sel.select(order, &cache.pos, chosen, &self.last, q, out);
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, cache: &mut Cache<f64>) {
        self.multiplier *= self.inv_decay;
        self.credit.credit(cache, t, f, row, scores, self.multiplier);
        if self.multiplier > RESCALE_ABOVE {
            // Only kept experts can be cached: the scores of the others are never read.
            let kept = cache.kept;
            rescale(&mut cache.keys[..kept], self.multiplier);
            self.multiplier = 1.0;
        }
    }
}
