//! The vector selector of the lowest scores (near_pick_ema, inv_router victims).

use wide::f64x8;

use crate::engine::simd::{CHUNK, LANES, chunk_min, halves, lane_min, mask_eq, pack, pick_if};

/// Victim selection of [`Decayed`]: the `q` unprotected cached experts of lowest
/// `(score, last access, id)`, found in `q` rounds over a scratch copy of the cached scores
/// (slot order; protected ones and the padding to whole chunks set to +∞) and the minimum of each
/// chunk of 16: a round takes the lowest chunk minimum, finds its chunk by comparing the
/// minimums with it and its slot by comparing the chunk, sets the slot to +∞ and recomputes that
/// chunk's minimum. Equal scores (a tie, in one chunk or several) go to the lowest
/// `(last access, id)` on a slower path. Only the tie test depends on
/// how the scores compare; the threshold scan this replaces took about 19 mispredicted branches
/// per token (callgrind) in its offers. Chunks and minimums are stored whole (vector stores),
/// so that the next round's vector loads are forwarded from them.
pub(crate) struct Selector {
    /// `[cached rounded up to CHUNK, + 1]`: the last entry takes the writes for protected experts
    /// that are not cached.
    pub(crate) vals: Vec<f64>,
    /// The minimum of each chunk of `vals`, eight chunks per vector, padded with +∞.
    pub(crate) mins: Vec<f64x8>,
}

impl Selector {
    /// A selector for up to `slots` cached experts, its buffers allocated once.
    pub(crate) fn new(slots: usize) -> Selector {
        let chunks = slots.div_ceil(CHUNK);
        Selector { vals: Vec::with_capacity(chunks * CHUNK + 1), mins: Vec::with_capacity(chunks.div_ceil(8)) }
    }

    /// Starts a selection: `vals` is cleared; the caller pushes the cached experts' scores in
    /// slot order, then calls [`Selector::select`].
    #[inline(always)]
    pub(crate) fn start(&mut self) -> &mut Vec<f64> {
        self.vals.clear();
        &mut self.vals
    }

    /// The `q` lowest `(score, last, id)` among the scores pushed since [`Selector::start`]
    /// (`order[i]` is slot i's expert, `pos` the slot of each expert), leaving out the cached
    /// experts among `protect`, into `out` in increasing order, each as the key
    /// `score.to_bits() << 64 | last << 16 | id`. Scores are finite and >= 0; at least `q`
    /// cached experts are not protected.
    #[inline(never)]
    pub(crate) fn select(
        &mut self,
        order: &[u16],
        pos: &[u32],
        protect: &[u16],
        last: &[u64],
        q: usize,
        out: &mut Vec<u128>,
    ) {
        let len = self.vals.len();
        let chunks = len.div_ceil(CHUNK);
        let dump = chunks * CHUNK;
        self.vals.resize(dump + 1, f64::INFINITY);
        for &e in protect {
            let p = pos[usize::from(e)] as usize;
            self.vals[pick_if(p < len, p, dump)] = f64::INFINITY;
        }
        let (vals, _) = self.vals.as_chunks_mut::<CHUNK>();
        self.mins.clear();
        for group in vals.chunks(8) {
            let mut m = [f64::INFINITY; 8];
            for (m, c) in m.iter_mut().zip(group) {
                *m = chunk_min(c);
            }
            self.mins.push(f64x8::from(m));
        }
        let lanes = f64x8::from(LANES);
        out.clear();
        for _ in 0..q {
            let low = self.mins.iter().fold(f64x8::splat(f64::INFINITY), |m, &g| m.fast_min(g));
            let v = lane_min(low);
            debug_assert!(v < f64::INFINITY, "fewer than q unprotected cached experts");
            let sv = f64x8::splat(v);
            // The first chunk whose minimum is v, and how many are.
            let (mut first, mut holders) = (usize::MAX, 0);
            for (i, &g) in self.mins.iter().enumerate() {
                let m = g.simd_eq(sv).to_bitmask();
                holders += m.count_ones();
                first = pick_if(first == usize::MAX && m != 0, i * 8 + m.trailing_zeros() as usize, first);
            }
            let (a, b) = halves(&vals[first]);
            let (ea, eb) = (a.simd_eq(sv), b.simd_eq(sv));
            let mask = ea.to_bitmask() | (eb.to_bitmask() << 8);
            let unique = holders == 1 && mask.is_power_of_two();
            let slot = if unique {
                first * CHUNK + mask.trailing_zeros() as usize
            } else {
                lowest_tie(vals, &self.mins, v, order, last)
            };
            let e = usize::from(order[slot]);
            out.push(pack(v.to_bits(), (last[e] << 16) | e as u64));
            let c = slot / CHUNK;
            let (a, b) = if unique {
                // The one lane equal to v becomes +∞.
                let inf = f64x8::splat(f64::INFINITY);
                (ea.bitselect(inf, a), eb.bitselect(inf, b))
            } else {
                vals[c][slot % CHUNK] = f64::INFINITY;
                halves(&vals[c])
            };
            let (lo, hi) = vals[c].split_at_mut(CHUNK / 2);
            lo.copy_from_slice(&a.to_array());
            hi.copy_from_slice(&b.to_array());
            let g = &mut self.mins[c / 8];
            *g = lanes.simd_eq(f64x8::splat((c % 8) as f64)).bitselect(f64x8::splat(lane_min(a.fast_min(b))), *g);
        }
    }
}

/// The slot of lowest `(last, id)` among those whose score is `v` (several: a tie).
#[cold]
#[inline(never)]
pub(crate) fn lowest_tie(vals: &[[f64; CHUNK]], mins: &[f64x8], v: f64, order: &[u16], last: &[u64]) -> usize {
    let mut best = (u64::MAX, 0);
    for (c, chunk) in vals.iter().enumerate() {
        if mins[c / 8].to_array()[c % 8] != v {
            continue;
        }
        let mut mask = mask_eq(chunk, v);
        while mask != 0 {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            let slot = c * CHUNK + b;
            let e = usize::from(order[slot]);
            let key = (last[e] << 16) | e as u64;
            if key < best.0 {
                best = (key, slot);
            }
        }
    }
    debug_assert!(best.0 != u64::MAX, "a tie has at least one slot");
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scores over two chunks and a second vector of chunk minimums (40 slots), protected
    /// experts left out, and ties ordered by (last access, id).
    #[test]
    fn selects_the_lowest_unprotected_with_ties_by_last_access() {
        let slots = 140;
        let order: Vec<u16> = (0..slots as u16).rev().collect();
        let mut pos = vec![0u32; slots];
        for (i, &e) in order.iter().enumerate() {
            pos[usize::from(e)] = i as u32;
        }
        // Slot i scores 10 + i, except three slots that tie at 1.0 and one lower at 0.5.
        let mut scores: Vec<f64> = (0..slots).map(|i| 10.0 + i as f64).collect();
        for slot in [3, 70, 130] {
            scores[slot] = 1.0;
        }
        scores[139] = 0.5;
        let mut last = vec![0u64; slots];
        // The expert of slot 70 was accessed longest ago, then slot 130's, then slot 3's.
        for (slot, t) in [(70, 1), (130, 2), (3, 3)] {
            last[usize::from(order[slot])] = t;
        }
        let mut sel = Selector::new(slots);
        sel.start().extend_from_slice(&scores);
        let mut out = Vec::new();
        // Slot 5's expert is protected; a protected expert that is not cached changes nothing.
        let protect = [order[5], 200];
        let mut pos_ext = pos.clone();
        pos_ext.resize(201, u32::MAX);
        sel.select(&order, &pos_ext, &protect, &last, 6, &mut out);
        let experts: Vec<usize> = out.iter().map(|&k| (k & 0xFFFF) as usize).collect();
        let slot_of = |e: usize| pos[e] as usize;
        assert_eq!(experts.iter().map(|&e| slot_of(e)).collect::<Vec<_>>(), [139, 70, 130, 3, 0, 1]);
        assert_eq!((out[0] >> 64) as u64, 0.5f64.to_bits());
        // The keys increase.
        assert!(out.windows(2).all(|w| w[0] < w[1]));
    }
}
