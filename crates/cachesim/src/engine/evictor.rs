//! What the token loop needs from a policy: the [`Evictor`] trait.

use super::Cache;

/// The experts chosen for the current token, which a miss must not evict (k-way protection):
/// `marks[e] == stamp`. Nothing is marked in sequential mode, so nothing is protected there.
#[derive(Clone, Copy)]
pub(crate) struct Protected<'a> {
    /// `[E]`: the stamp of the last token that chose each expert.
    pub(crate) marks: &'a [u64],
    /// The current token's stamp (t + 1).
    pub(crate) stamp: u64,
}

impl Protected<'_> {
    /// Whether expert `e` is chosen for the current token.
    #[inline(always)]
    pub(crate) fn has(self, e: usize) -> bool {
        self.marks[e] == self.stamp
    }
}

/// One pick of step 4: expert `e`, the `i`-th chosen of token `t`, at pick time `now`; or, with
/// `demand` false, the `i`-th prefetch load of token t (SEMANTICS.md §12: an access at its time
/// for the policy, but not a pick, which perfect_lfu counts, §15.2).
#[derive(Clone, Copy)]
pub(crate) struct Pick {
    pub(crate) e: usize,
    pub(crate) now: u64,
    pub(crate) t: usize,
    pub(crate) i: usize,
    pub(crate) demand: bool,
}

/// What the token loop needs from a policy. `protected.has(e)` marks experts chosen for the
/// current token (never written in sequential mode, so nothing is protected there).
pub(crate) trait Evictor {
    /// The first priority key the cache keeps with each expert (`()` when the policy does not
    /// scan the cache).
    type Key: Copy + Default;
    /// k-way mode selects all of a token's victims at once with [`Evictor::victims`].
    const BATCH: bool = false;
    /// The policy keeps its first key in `Cache::keys` and scans the cached experts.
    const SLOTS: bool = false;
    /// How many leading candidates of F the credits read (F is built at least this long).
    fn f_needed(&self) -> usize {
        0
    }
    /// Forgets all state: the cache (still holding its experts) is about to be emptied at a
    /// sequence start.
    fn reset(&mut self, cache: &mut Cache<Self::Key>);
    /// Expert `e`, the `i`-th chosen of token `t`, was accessed at pick time `now`; `inserted`:
    /// it was just inserted.
    fn access(&mut self, pick: Pick, inserted: bool, cache: &mut Cache<Self::Key>);
    /// Expert `e` was evicted (its key is still in `cache`).
    fn evicted(&mut self, _e: usize, _cache: &Cache<Self::Key>) {}
    /// Whether [`Evictor::step`] admits an expert without a branch on the hit (a self-swap on
    /// a hit): fewer mispredicted branches for the decayed policies, whose accesses are one
    /// store; more instructions and no fewer mispredictions for the others (callgrind).
    const ADMIT_WITHOUT_BRANCH: bool = false;
    /// Step 4 for one chosen expert: a hit, or a miss that evicts [`Evictor::victim`] when the
    /// cache holds `cap` and then inserts; returns whether it hit. lru and fifo override it with
    /// one path for both outcomes (a hit is as hard to predict as the hit rate is close to 1/2,
    /// and a mispredicted branch costs about as much as their whole update).
    #[inline(always)]
    fn step(&mut self, pick: Pick, cap: usize, protected: Protected<'_>, cache: &mut Cache<Self::Key>) -> bool {
        let e = pick.e;
        let hit = cache.contains(e);
        if hit && !Self::ADMIT_WITHOUT_BRANCH {
            self.access(pick, false, cache);
            return true;
        }
        // Never true in k-way mode for the policies that evict a token's victims beforehand.
        if !hit & (cache.len >= cap) {
            let v = self.victim(cache, protected);
            cache.remove(v);
            self.evicted(v, cache);
        }
        cache.admit(e, !hit);
        self.access(pick, !hit, cache);
        hit
    }
    /// The cached, unprotected expert of lowest priority (ties: lowest id). The cache is full.
    fn victim(&mut self, cache: &Cache<Self::Key>, protected: Protected<'_>) -> usize;
    /// With `BATCH`: the `q` cached, unprotected experts of lowest priority, into `out`, each
    /// as a key whose low 16 bits are the expert id; `chosen` are the token's chosen experts
    /// (the protected ones are those of them that are cached).
    fn victims(
        &mut self,
        _cache: &Cache<Self::Key>,
        _protected: Protected<'_>,
        _q: usize,
        _chosen: &[u16],
        _out: &mut Vec<u128>,
    ) {
    }
    /// Credits after token `t`: `f` is a prefix (at least `f_needed` long, or all) of F.
    fn end_token(
        &mut self,
        _t: usize,
        _f: &[u16],
        _row: &[u16],
        _scores: Option<&[f32]>,
        _cache: &mut Cache<Self::Key>,
    ) {
    }
}
