//! The decayed-score policies (`near_pick_ema`, `inv_router`): priority (s, last access) with
//! s ← d·s + x once per token for every expert; they differ only in the credit x ([`Credit`]).

use crate::engine::structures::Selector;
use crate::engine::{Cache, Evictor, Params, Pick, Protected};

/// s <- d*s for every expert, in chunks the compiler vectorizes (each product rounded alone:
/// the same values as the reference's scalar loop).
#[inline(never)]
pub(crate) fn decay_all(s: &mut [f64], d: f64) {
    let mut chunks = s.chunks_exact_mut(8);
    for c in &mut chunks {
        for x in c {
            *x *= d;
        }
    }
    for x in chunks.into_remainder() {
        *x *= d;
    }
}

/// near_pick_ema and inv_router: priority (s, last access) with s ← d·s + x once per token for
/// every expert; they differ only in the credit x (`C`). Decays are eager (see the module doc);
/// victims come from a [`Selector`] over the cached experts' scores.
pub(crate) struct Decayed<C> {
    pub(crate) last: Vec<u64>,
    pub(crate) decay: f64,
    pub(crate) buf: Vec<u128>,
    pub(crate) sel: Selector,
    pub(crate) credit: C,
}

impl<C> Decayed<C> {
    pub(crate) fn new(params: &Params<'_>, credit: C) -> Decayed<C> {
        let e = params.num_experts;
        let sel = Selector::new(params.cap.min(e));
        Decayed { last: vec![0; e], decay: params.decay, buf: Vec::with_capacity(1), sel, credit }
    }
}

/// The credit x of a [`Decayed`] policy, added to the scores after the decay of token `t`.
pub(crate) trait Credit {
    /// The scores come from a [`TrackedScores`] shared with other configurations: the policy
    /// neither decays nor credits; its victim selection reads the track's rows.
    const TRACKED: bool = false;
    /// How many leading candidates of F the credit reads.
    fn f_needed(&self) -> usize;
    /// Adds the credits of token `t` to the scores (`cache`'s keys).
    fn credit(&mut self, cache: &mut Cache<f64>, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>);
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
    }
    #[inline(always)]
    fn access(&mut self, pick: Pick, _inserted: bool, _cache: &mut Cache<f64>) {
        let Pick { e, now, .. } = pick;
        self.last[e] = now;
    }
    #[inline(always)]
    fn victim(&mut self, cache: &Cache<f64>, protected: Protected<'_>) -> usize {
        // Only sequential mode asks for one victim per miss, and it protects nothing.
        debug_assert!(!C::TRACKED, "a tracked policy runs in k-way mode");
        let mut out = std::mem::take(&mut self.buf);
        self.victims(cache, protected, 1, &[], None, &mut out);
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
        track: Option<&[f64]>,
        out: &mut Vec<u128>,
    ) {
        debug_assert!(!C::TRACKED || track.is_some(), "a tracked policy reads the track's rows");
        // The protected experts are the cached ones among `chosen`.
        let order = &cache.order[..cache.len];
        let vals = self.sel.start();
        match track {
            Some(scores) if C::TRACKED => vals.extend(order.iter().map(|&e| scores[usize::from(e)])),
            _ => vals.extend_from_slice(cache.live_keys()),
        }
        self.sel.select(order, &cache.pos, chosen, &self.last, q, out);
    }
    #[inline(always)]
    fn end_token(&mut self, t: usize, f: &[u16], row: &[u16], scores: Option<&[f32]>, cache: &mut Cache<f64>) {
        // Tracked scores are read from the track's rows.
        if !C::TRACKED {
            // Only kept experts can be cached: the scores of the others are never read.
            let kept = cache.kept;
            decay_all(&mut cache.keys[..kept], self.decay);
            self.credit.credit(cache, t, f, row, scores);
        }
    }
}

/// The credit of a [`Decayed`] policy whose scores a [`TrackedScores`] computes.
pub(crate) struct Tracked;

impl Credit for Tracked {
    const TRACKED: bool = true;
    fn f_needed(&self) -> usize {
        0
    }
    fn credit(&mut self, _cache: &mut Cache<f64>, _t: usize, _f: &[u16], _row: &[u16], _scores: Option<&[f32]>) {}
}
