//! Small vector and branch-free helpers of the hot core (the `wide` crate's vectors compile to
//! SSE2 on the default target).

use wide::{f64x8, u32x8};

/// Slots per chunk of [`Selector`]: two vectors of eight.
pub(crate) const CHUNK: usize = 16;

/// A chunk as two vectors.
#[inline(always)]
pub(crate) fn halves(c: &[f64; CHUNK]) -> (f64x8, f64x8) {
    (
        f64x8::from(std::array::from_fn::<f64, 8, _>(|i| c[i])),
        f64x8::from(std::array::from_fn::<f64, 8, _>(|i| c[i + 8])),
    )
}

/// The smaller of `a` and `b` (`b` when equal), written so that it compiles to `minsd`.
#[inline(always)]
pub(crate) fn min_of(a: f64, b: f64) -> f64 {
    if a < b { a } else { b }
}

/// The smallest lane.
#[inline(always)]
pub(crate) fn lane_min(v: f64x8) -> f64 {
    let a = v.to_array();
    let m = [min_of(a[0], a[4]), min_of(a[1], a[5]), min_of(a[2], a[6]), min_of(a[3], a[7])];
    min_of(min_of(m[0], m[2]), min_of(m[1], m[3]))
}

/// The minimum of a chunk (scores are never NaN, so `fast_min`, a plain `minpd`, is exact).
#[inline(always)]
pub(crate) fn chunk_min(c: &[f64; CHUNK]) -> f64 {
    let (a, b) = halves(c);
    lane_min(a.fast_min(b))
}

/// Bit i: `c[i] == v`.
#[inline(always)]
pub(crate) fn mask_eq(c: &[f64; CHUNK], v: f64) -> u32 {
    let (a, b) = halves(c);
    let v = f64x8::splat(v);
    a.simd_eq(v).to_bitmask() | (b.simd_eq(v).to_bitmask() << 8)
}

/// Lane numbers, to build one-lane masks.
pub(crate) const LANES: [f64; 8] = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0];

/// `a` if `c`, else `b`, without a branch (`c` is a hit or an eviction: unpredictable).
#[inline(always)]
pub(crate) fn pick_if(c: bool, a: usize, b: usize) -> usize {
    std::hint::select_unpredictable(c, a, b)
}

#[inline(always)]
pub(crate) fn pack(hi: u64, lo: u64) -> u128 {
    (u128::from(hi) << 64) | u128::from(lo)
}

/// Clears and returns the position of the lowest set bit of `word` (the highest with
/// `HIGHEST`); `word` is not 0.
#[inline(always)]
pub(crate) fn take_bit<const HIGHEST: bool>(word: &mut u64) -> usize {
    let b = if HIGHEST { 63 - word.leading_zeros() as usize } else { word.trailing_zeros() as usize };
    *word &= !(1 << b);
    b
}

/// Bit i: `keys[i]` is at or past `bound` (`>=` with `FROM_HIGH`, else `<=`), eight keys per
/// vector compare.
#[inline(always)]
pub(crate) fn mask_past<const FROM_HIGH: bool>(keys: &[u32; 32], bound: u32) -> u32 {
    let b = u32x8::splat(bound);
    let mut m = 0;
    for (i, c) in keys.as_chunks::<8>().0.iter().enumerate() {
        let k = u32x8::from(*c);
        // Past the bound: not strictly on the near side of it.
        let near_side = if FROM_HIGH { b.simd_gt(k) } else { k.simd_gt(b) };
        m |= (!near_side.to_bitmask() & 0xFF) << (8 * i);
    }
    m
}
