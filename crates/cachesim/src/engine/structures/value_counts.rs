//! Cached experts counted per integer key value, and the victims they bound (near_pick,
//! belady).

use crate::engine::simd::mask_past;
use crate::engine::simd::take_bit;
use crate::engine::{Cache, Protected};

/// Cached experts counted per integer key value (a near token, a next-use token) in `0..values`,
/// with a two-level bitmap of the values in use. Updates do not branch: a bit stays set when its
/// count drops to 0, and the walks clear the ones they pass.
pub(crate) struct ValueCounts {
    pub(crate) count: Vec<u32>,
    /// Bit v: count[v] may be > 0 (every positive count has its bit set).
    pub(crate) bits: Vec<u64>,
    /// Bit w: bits[w] may be != 0.
    pub(crate) summary: Vec<u64>,
}

impl ValueCounts {
    pub(crate) fn new(values: usize) -> ValueCounts {
        let words = values.div_ceil(64);
        ValueCounts { count: vec![0; values], bits: vec![0; words], summary: vec![0; words.div_ceil(64)] }
    }

    #[inline(always)]
    pub(crate) fn add(&mut self, v: usize, c: u32) {
        self.count[v] += c;
        let w = v >> 6;
        self.bits[w] |= u64::from(c != 0) << (v & 63);
        self.summary[w >> 6] |= u64::from(c != 0) << (w & 63);
    }

    #[inline(always)]
    pub(crate) fn sub(&mut self, v: usize, c: u32) {
        self.count[v] -= c;
    }

    /// Empties every count, given the values of all counted experts.
    pub(crate) fn clear(&mut self, values: impl Iterator<Item = usize>) {
        for v in values {
            self.count[v] = 0;
            self.bits[v >> 6] = 0;
            self.summary[v >> 12] = 0;
        }
    }

    /// The count of value v, clearing v's stale bits when it is 0.
    #[inline(always)]
    pub(crate) fn visit(&mut self, v: usize) -> usize {
        let c = self.count[v] as usize;
        if c == 0 {
            let w = v >> 6;
            self.bits[w] &= !(1 << (v & 63));
            if self.bits[w] == 0 {
                self.summary[w >> 6] &= !(1 << (w & 63));
            }
        }
        c
    }

    /// With `FROM_HIGH` false: the smallest v with at least `need` counted at or below it; with
    /// `FROM_HIGH` true: the largest v with at least `need` counted at or above it. When fewer
    /// are counted, the last value in use the walk reached.
    #[inline(always)]
    pub(crate) fn bound<const FROM_HIGH: bool>(&mut self, need: usize) -> usize {
        let (mut seen, mut last) = (0, 0);
        let words = self.summary.len();
        for i in 0..words {
            let sw = if FROM_HIGH { words - 1 - i } else { i };
            let mut sword = self.summary[sw];
            while sword != 0 {
                let w = sw * 64 + take_bit::<FROM_HIGH>(&mut sword);
                let mut word = self.bits[w];
                while word != 0 {
                    let v = w * 64 + take_bit::<FROM_HIGH>(&mut word);
                    let c = self.visit(v);
                    if c > 0 {
                        seen += c;
                        last = v;
                        if seen >= need {
                            return v;
                        }
                    }
                }
            }
        }
        last
    }
}

/// Victim selection of the policies whose first key is an integer value counted in
/// [`ValueCounts`] and kept in `Cache::keys`: with a bound from a walk that covers the `q`
/// victims, the unprotected experts strictly past the bound (below it, or above it with
/// `FROM_HIGH`) are all victims (fewer than `q`), and the rest are the lowest `tie(e)` keys
/// (unique, the id in the low 16 bits) of those at the bound, taken by repeated minimum. One
/// pass over the cached keys, 32 at a time (four compares of eight with the bound); only the experts
/// at or past it (about as many as there are victims) are looked at further. `below`,
/// `at_buf`: buffers of length > cached count. The protected experts come as their two parts
/// ([`Protected`]'s marks and stamp): passed whole, the three-word struct goes by reference,
/// and the token loop stored it to memory before every pick (callgrind).
#[expect(clippy::too_many_arguments, reason = "a helper of two policies")]
#[inline(never)]
pub(crate) fn pick_counted<const FROM_HIGH: bool>(
    cache: &Cache<u32>,
    marks: &[u64],
    stamp: u64,
    q: usize,
    bound: u32,
    below: &mut [u16],
    at_buf: &mut [u64],
    out: &mut Vec<u128>,
    tie: impl Fn(usize) -> u64,
) {
    let protected = Protected { marks, stamp };
    let (mut nb, mut na) = (0, 0);
    let keys = cache.live_keys();
    let mut take = |i: usize| {
        let e = cache.order[i];
        let eu = usize::from(e);
        if !protected.has(eu) {
            let at = keys[i] == bound;
            below[nb] = e;
            nb += usize::from(!at);
            at_buf[na] = tie(eu);
            na += usize::from(at);
        }
    };
    let (chunks, tail) = keys.as_chunks::<32>();
    for (c, chunk) in chunks.iter().enumerate() {
        let mut mask = mask_past::<FROM_HIGH>(chunk, bound);
        while mask != 0 {
            take(c * 32 + mask.trailing_zeros() as usize);
            mask &= mask - 1;
        }
    }
    let base = chunks.len() * 32;
    for (i, &k) in tail.iter().enumerate() {
        if if FROM_HIGH { k >= bound } else { k <= bound } {
            take(base + i);
        }
    }
    debug_assert!(nb < q && nb + na >= q, "the counts cover q unprotected experts");
    out.clear();
    out.extend(below[..nb].iter().map(|&e| u128::from(e)));
    for _ in nb..q {
        let (mut best, mut bi) = (u64::MAX, 0);
        for (i, &x) in at_buf[..na].iter().enumerate() {
            // As likely as not: a conditional move, not a branch.
            let lower = x < best;
            best = std::hint::select_unpredictable(lower, x, best);
            bi = std::hint::select_unpredictable(lower, i, bi);
        }
        out.push(u128::from(best));
        na -= 1;
        at_buf[bi] = at_buf[na];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_from_either_end_skip_emptied_values() {
        // Values 3 (two experts), 70 (one), 4000 (one), across bitmap words and summary words.
        let mut counts = ValueCounts::new(5000);
        for (v, c) in [(3, 2), (70, 1), (4000, 1), (100, 1)] {
            counts.add(v, c);
        }
        counts.sub(100, 1);
        assert_eq!(counts.bound::<false>(1), 3);
        assert_eq!(counts.bound::<false>(2), 3);
        assert_eq!(counts.bound::<false>(3), 70);
        // 100 was emptied: the walk passes it (and clears its bit) on the way to 4000.
        assert_eq!(counts.bound::<false>(4), 4000);
        assert_eq!(counts.bits[100 >> 6] & (1 << (100 & 63)), 0);
        assert_eq!(counts.bound::<true>(1), 4000);
        assert_eq!(counts.bound::<true>(2), 70);
        assert_eq!(counts.bound::<true>(4), 3);
        // Fewer than asked: the last value in use the walk reached.
        assert_eq!(counts.bound::<true>(9), 3);
        counts.clear([3, 70, 4000].into_iter());
        assert_eq!(counts.bound::<false>(1), 0);
        assert!(counts.count.iter().all(|&c| c == 0));
    }

    /// The victims past and at the bound, protected experts left out, ties at the bound by
    /// the tie key.
    #[test]
    fn pick_counted_takes_past_then_lowest_ties() {
        // Experts 0..40 all cached, keys = e % 5 (so eight experts per value), 40 slots: one
        // chunk of 32 and a tail.
        let keep = vec![true; 40];
        let mut cache: Cache<u32> = Cache::new(&keep, true);
        for e in 0..40 {
            cache.admit(e, true);
            *cache.key_mut(e) = (e % 5) as u32;
        }
        let mut marks = vec![0u64; 40];
        marks[0] = 1; // key 0, protected
        marks[10] = 1;
        let (mut below, mut at, mut out) = (vec![0u16; 41], vec![0u64; 41], Vec::new());
        // q = 9 lowest keys: the 6 unprotected experts of key 0 lie below bound 1, and 3 of
        // key 1 (the lowest tie keys: ids 1, 6, 11).
        pick_counted::<false>(&cache, &marks, 1, 9, 1, &mut below, &mut at, &mut out, |e| e as u64);
        let mut got: Vec<u128> = out[..6].to_vec();
        got.sort_unstable();
        assert_eq!(got, [5, 15, 20, 25, 30, 35]);
        assert_eq!(out[6..], [1, 6, 11]);
        // From the high end: keys 4 (8 experts) above bound 3, then the lowest ids of key 3.
        pick_counted::<true>(&cache, &marks, 1, 10, 3, &mut below, &mut at, &mut out, |e| e as u64);
        assert_eq!(out[8..], [3, 8]);
    }
}
