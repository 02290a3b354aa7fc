//! The project's `exp` (cachesim::exp) against a double-double reference: its error bound over
//! the range a softmax uses, and the same bits from the scalar and the vector form.

use cachesim::exp::{exp, exp_lanes};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A double-double number hi + lo, |lo| <= ulp(hi) / 2.
#[derive(Clone, Copy, Debug)]
struct Dd {
    hi: f64,
    lo: f64,
}

/// a + b exactly, as (sum, error) (Knuth).
fn two_sum(a: f64, b: f64) -> Dd {
    let s = a + b;
    let bb = s - a;
    Dd { hi: s, lo: (a - (s - bb)) + (b - bb) }
}

/// a · b exactly, as (product, error): the error by a fused multiply-add, which is exact.
fn two_prod(a: f64, b: f64) -> Dd {
    let p = a * b;
    Dd { hi: p, lo: a.mul_add(b, -p) }
}

fn renorm(hi: f64, lo: f64) -> Dd {
    two_sum(hi, lo)
}

fn add(a: Dd, b: Dd) -> Dd {
    let s = two_sum(a.hi, b.hi);
    renorm(s.hi, s.lo + a.lo + b.lo)
}

fn mul(a: Dd, b: Dd) -> Dd {
    let p = two_prod(a.hi, b.hi);
    renorm(p.hi, p.lo + a.hi * b.lo + a.lo * b.hi)
}

fn div_f64(a: Dd, b: f64) -> Dd {
    let q1 = a.hi / b;
    let r = add(a, Dd { hi: -two_prod(q1, b).hi, lo: -two_prod(q1, b).lo });
    renorm(q1, r.hi / b)
}

/// ln 2 to about 160 bits, as three doubles.
const LN2: [f64; 3] = [std::f64::consts::LN_2, 2.319_046_813_846_299_6e-17, 5.707_708_438_416_212e-34];

/// exp(x) to about 100 bits, as (m, s) with exp(x) = m · s: x = k ln 2 + r with r in
/// double-double, the Taylor series of exp(r) to 30 terms, times 2^k, of which s = 2^-1000 is
/// kept apart when k < -1000 (so that m is a normal double-double even where exp(x) is
/// subnormal), else s = 1.
fn exp_reference(x: f64) -> (Dd, f64) {
    let k = (x / LN2[0]).round();
    // r = x - k·ln2, exactly enough: each k·ln2 part as an exact product.
    let mut r = Dd { hi: x, lo: 0.0 };
    for part in LN2 {
        let p = two_prod(k, part);
        r = add(r, Dd { hi: -p.hi, lo: -p.lo });
    }
    let mut term = Dd { hi: 1.0, lo: 0.0 };
    let mut sum = Dd { hi: 1.0, lo: 0.0 };
    for i in 1..30 {
        term = div_f64(mul(term, r), i as f64);
        sum = add(sum, term);
    }
    let (k1, scale) = if k < -1000.0 { (k + 1000.0, 2f64.powi(-1000)) } else { (k, 1.0) };
    let s1 = 2f64.powi(k1 as i32);
    (Dd { hi: sum.hi * s1, lo: sum.lo * s1 }, scale)
}

/// The error of `got` against the reference, in ulps of the correctly rounded result (for a
/// subnormal result, in units of the smallest subnormal).
fn ulps(got: f64, (want, scale): (Dd, f64)) -> f64 {
    let exact = want.hi * scale;
    let ulp = if exact.abs() < f64::MIN_POSITIVE {
        f64::from_bits(1) / scale
    } else {
        2f64.powf(want.hi.abs().log2().floor() - 52.0)
    };
    // got / scale is exact (scale is a power of two and got a multiple of the smallest subnormal).
    ((got / scale - want.hi) - want.lo).abs() / ulp
}

/// The largest error over `xs`, and where.
fn worst(xs: impl Iterator<Item = f64>) -> (f64, f64) {
    let mut worst = (0.0, 0.0);
    for x in xs {
        let e = ulps(exp(x), exp_reference(x));
        if e > worst.0 {
            worst = (e, x);
        }
    }
    worst
}

/// The bound stated in `cachesim::exp`'s documentation: at most 1 ulp (measured: 0.95 on
/// this sample), on a dense grid of [-60, 0] (where the softmax of router logits lives: z − max
/// of f32 logits), on 10^6 random points of [-745, 709.7], and near 0 and the limits.
#[test]
fn error_is_at_most_one_ulp() {
    let dense = worst((0..=600_000).map(|i| -60.0 + f64::from(i) * 1e-4));
    assert!(dense.0 <= 1.0, "dense grid: {} ulp at {}", dense.0, dense.1);
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let random = worst((0..1_000_000).map(|_| rng.random_range(-745.0..709.7)));
    assert!(random.0 <= 1.0, "random: {} ulp at {}", random.0, random.1);
    let edges = worst(
        [1e-300, -1e-300, 1e-17, -1e-17, 1e-9, -1e-9, -708.3, -708.4, -740.0, -744.0, 709.0, 709.78]
            .into_iter()
            .chain((1..200).map(|i| -0.5 * f64::from(i) * std::f64::consts::LN_2)),
    );
    assert!(edges.0 <= 1.0, "edges: {} ulp at {}", edges.0, edges.1);
    // The figure for docs/performance.md and the module doc.
    eprintln!(
        "exp error: dense {:.3} ulp at {}, random {:.3} at {}, edges {:.3} at {}",
        dense.0, dense.1, random.0, random.1, edges.0, edges.1
    );
}

/// The reference itself: exact values it must reproduce.
#[test]
fn reference_is_right_on_known_values() {
    assert_eq!(exp_reference(1.0).0.hi, std::f64::consts::E);
    assert!((exp_reference(-std::f64::consts::LN_2 * 10.0).0.hi - 2f64.powi(-10)).abs() < 1e-18);
    assert_eq!(exp_reference(0.0).0.hi, 1.0);
    // The smallest subnormal: exp(-1074 ln 2) = 2^-1074, kept as 2^-74 · 2^-1000.
    let (m, scale) = exp_reference(-1074.0 * std::f64::consts::LN_2);
    assert!((m.hi - 2f64.powi(-74)).abs() < 2f64.powi(-74) * 1e-12 && scale == 2f64.powi(-1000));
}

/// Vector lanes equal the scalar form bit for bit, on 8 lanes as the softmax uses them, and on
/// 2 and 4.
#[test]
fn vector_lanes_equal_scalar() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    for _ in 0..20_000 {
        let xs: [f64; 8] = std::array::from_fn(|_| rng.random_range(-800.0..720.0));
        let v8 = exp_lanes(xs);
        let v4 = exp_lanes([xs[0], xs[1], xs[2], xs[3]]);
        let v2 = exp_lanes([xs[4], xs[5]]);
        for i in 0..8 {
            assert_eq!(v8[i].to_bits(), exp(xs[i]).to_bits(), "{}", xs[i]);
        }
        assert_eq!(v4.map(f64::to_bits), [v8[0], v8[1], v8[2], v8[3]].map(f64::to_bits));
        assert_eq!(v2.map(f64::to_bits), [v8[4], v8[5]].map(f64::to_bits));
    }
}
