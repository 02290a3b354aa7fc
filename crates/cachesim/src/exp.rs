//! The project's own deterministic `exp` (SEMANTICS.md §5): the same bits on every platform and
//! in every replayer, scalar or vector.
//!
//! `f64::exp` calls the platform's libm, whose last bits differ between libraries (glibc, musl,
//! macOS), so a softmax built on it, and at near-ties the counts of `inv_router`, could differ
//! between machines. This one uses only IEEE-754 additions, subtractions, multiplications and
//! comparisons, each rounded to nearest on its own (Rust never fuses `a * b + c` into an FMA), in
//! a fixed order, and bit operations on the result's exponent; so its value is a function of its
//! argument's bits alone, whatever the target, the vector width or the optimizer.
//!
//! Method: clamp x to [−746, 710] (beyond, the result is 0 or +∞ anyway); k = round(x / ln 2)
//! with the 1.5 · 2^52 shifter; r = (x − k · LN2_HI) − k · LN2_LO, |r| <= ln 2 / 2 (Cody and
//! Waite; LN2_HI has 32 significant bits, so k · LN2_HI is exact); exp(r) by its Taylor
//! polynomial of degree 13, as 1 + (r + r² · P(r)) with P in Horner form (truncation below
//! 5e-18 relative); then the result is
//! scaled by 2^k, in two steps when k is outside [−1000, 1000], so that results in the subnormal
//! range are rounded once. NaN gives NaN.
//!
//! Error, measured against a double-double reference (`tests/exp.rs`, which asserts <= 1 ulp):
//! at most 0.95 ulp in that test's sample (a dense grid of 600,001 points over [−60, 0], where
//! the softmax of router scores lives, 10^6 random points over [−745, 709.7], subnormal results
//! included, and points near 0 and the limits); exact at 0.
//!
//! [`exp`] is the scalar form, [`exp_lanes`] the same computation on `N` lanes, explicitly
//! vectorized four lanes at a time (`wide::f64x4`: the compiler did not vectorize the lane loops
//! on the default SSE2 target); both give identical bits, lane for lane (tested).

use wide::{f64x4, u64x4};

/// 1 / ln 2.
const LOG2_E: f64 = std::f64::consts::LOG2_E;
/// ln 2 rounded to 32 significant bits (fdlibm's `ln2HI`): k · LN2_HI is exact for |k| < 2^21.
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
/// ln 2 − LN2_HI (fdlibm's `ln2LO`).
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// 1.5 · 2^52: adding it to a value of magnitude < 2^51 rounds the value to an integer, held in
/// the low bits of the sum.
const SHIFTER: f64 = 6_755_399_441_055_744.0;
/// Below this, exp underflows to 0 (exp(−746) < 2^−1075, half the smallest subnormal).
const X_MIN: f64 = -746.0;
/// Above this, exp overflows to +∞ (exp(709.79) > f64::MAX).
const X_MAX: f64 = 710.0;
/// Taylor coefficients 1/i!, i = 13 down to 2 (the Horner order); the terms 1 + r are added
/// last.
const TAYLOR: [f64; 12] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
];
/// The exponent steps of the two-step scaling: 2^±1000.
const BIG_STEP: f64 = 1000.0;

/// exp(x) for one f64, deterministic to the bit (error < 1 ulp; see the module doc).
#[inline(always)]
pub fn exp(x: f64) -> f64 {
    exp_scalar_lanes([x])[0]
}

/// exp of every lane of `x`, each lane exactly [`exp`] of it: groups of four lanes in the
/// explicit vector form (`wide::f64x4`, the same operations in the same order on four lanes at
/// once), the remaining lanes (`N` mod 4) in the scalar form.
#[inline(always)]
pub fn exp_lanes<const N: usize>(x: [f64; N]) -> [f64; N] {
    let mut out = [0.0; N];
    let (x_quads, x_rest) = x.as_chunks::<4>();
    let (out_quads, out_rest) = out.as_chunks_mut::<4>();
    for (o, q) in out_quads.iter_mut().zip(x_quads) {
        *o = exp_x4(f64x4::from(*q)).to_array();
    }
    for (o, &xi) in out_rest.iter_mut().zip(x_rest) {
        *o = exp(xi);
    }
    out
}

/// The scalar form: the computation of the module doc, lane by lane (straight-line code
/// without branches; the compiler does not vectorize it on the default target, hence
/// [`exp_x4`]).
#[inline(always)]
fn exp_scalar_lanes<const N: usize>(x: [f64; N]) -> [f64; N] {
    let mut out = [0.0; N];
    let mut t = [0.0; N];
    let mut k = [0.0; N];
    let mut r = [0.0; N];
    for i in 0..N {
        // Clamp by compare and select (not f64::max/min, whose NaN rules vary by target).
        let xc = if x[i] < X_MIN { X_MIN } else { x[i] };
        let xc = if xc > X_MAX { X_MAX } else { xc };
        t[i] = xc * LOG2_E + SHIFTER;
        k[i] = t[i] - SHIFTER;
        r[i] = (xc - k[i] * LN2_HI) - k[i] * LN2_LO;
    }
    let mut p = [TAYLOR[0]; N];
    for c in &TAYLOR[1..] {
        for i in 0..N {
            p[i] = p[i] * r[i] + c;
        }
    }
    for i in 0..N {
        // exp(r) = 1 + (r + r² · p): the last rounding is the one of 1 + s.
        let tail = (r[i] * r[i]) * p[i];
        p[i] = 1.0 + (r[i] + tail);
    }
    for i in 0..N {
        // k lies in [−1077, 1025]; outside [−1000, 1000] scale by 2^(k + adj), then 2^−adj,
        // adj = ±1000, so that both factors are normal. All on the exponent bits: the
        // shifter's low bits hold k (as a two's-complement integer).
        let adj = (if k[i] < -BIG_STEP { 1000u64 } else { 0 }).wrapping_sub(if k[i] > BIG_STEP { 1000 } else { 0 });
        let k_bits = t[i].to_bits().wrapping_sub(SHIFTER.to_bits());
        let first = f64::from_bits(k_bits.wrapping_add(adj).wrapping_add(1023) << 52);
        let second = f64::from_bits(1023u64.wrapping_sub(adj) << 52);
        let v = p[i] * first * second;
        // NaN stays NaN (the clamps above would have replaced it).
        out[i] = if x[i].is_nan() { x[i] } else { v };
    }
    out
}

/// The vector form on four lanes: [`exp_scalar_lanes`] step for step, with compares and
/// selects for the branches, the same IEEE operations in the same order (`wide` never fuses a
/// multiply and an add unless asked to) and wrapping 64-bit integer lanes for the exponent
/// bits, so every lane has the scalar form's bits.
#[inline(always)]
fn exp_x4(x: f64x4) -> f64x4 {
    let splat = f64x4::splat;
    // The clamps: `fast_max`/`fast_min` (maxpd, minpd) may return either operand for a NaN
    // lane, which the last step replaces by the NaN anyway; otherwise they equal the scalar
    // form's compare and select.
    let xc = splat(X_MIN).fast_max(x).fast_min(splat(X_MAX));
    let t = xc * splat(LOG2_E) + splat(SHIFTER);
    let k = t - splat(SHIFTER);
    let r = (xc - k * splat(LN2_HI)) - k * splat(LN2_LO);
    let mut p = splat(TAYLOR[0]);
    for &c in &TAYLOR[1..] {
        p = p * r + splat(c);
    }
    let p = splat(1.0) + (r + (r * r) * p);
    // Compare masks are all ones where true: as integers, `& 1000` selects 1000 or 0.
    let step = u64x4::splat(1000);
    let adj = (k.simd_lt(splat(-BIG_STEP)).to_bits() & step) - (k.simd_gt(splat(BIG_STEP)).to_bits() & step);
    let k_bits = t.to_bits() - u64x4::splat(SHIFTER.to_bits());
    let first = f64x4::from_bits((k_bits + adj + u64x4::splat(1023)) << 52);
    let second = f64x4::from_bits((u64x4::splat(1023) - adj) << 52);
    let v = p * first * second;
    x.is_nan().select(x, v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-checkable values: exact at 0 and at powers of two of the form exp(k · ln 2) up to
    /// rounding of k · ln 2, the limits, NaN.
    #[test]
    fn fixed_points_and_limits() {
        assert_eq!(exp(0.0).to_bits(), 1.0f64.to_bits());
        assert_eq!(exp(-0.0).to_bits(), 1.0f64.to_bits());
        assert_eq!(exp(f64::NEG_INFINITY), 0.0);
        assert_eq!(exp(-746.0), 0.0);
        assert_eq!(exp(-1e300), 0.0);
        assert_eq!(exp(f64::INFINITY), f64::INFINITY);
        assert_eq!(exp(710.0), f64::INFINITY);
        assert!(exp(f64::NAN).is_nan());
        // exp(1) = e to within 1 ulp (e's ulp is 2^-51 = 4.4e-16).
        assert!((exp(1.0) - std::f64::consts::E).abs() <= 4.5e-16);
        // The smallest subnormal, 2^-1074, is exp(-744.44...).
        assert_eq!(exp(-744.4400719213812), f64::from_bits(1));
        // The largest finite result lies below 709.79.
        assert!(exp(709.78).is_finite() && exp(709.79).is_infinite());
    }

    #[test]
    fn lanes_equal_the_scalar_form() {
        // A grid, then the points where the vector form's selects matter: NaN and the
        // infinities, the clamps, the two-step scaling's edges (k = ±1000, about ±693.1), the
        // subnormal range and the overflow edge; a multiple of four in all.
        let edges = [0.0, -1e-300, 1e-17, 709.7, f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -746.0];
        let more = [710.0, -745.13, -693.5, 693.5, -708.4, 709.79, -0.0, -693.1];
        let xs: Vec<f64> = (0..4096).map(|i| -745.5 + i as f64 * 0.36425).chain(edges).chain(more).collect();
        assert_eq!(xs.len() % 4, 0);
        for chunk in xs.chunks_exact(4) {
            let v = exp_lanes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            for (x, y) in chunk.iter().zip(v) {
                assert_eq!(exp(*x).to_bits(), y.to_bits(), "{x}");
            }
        }
    }
}
