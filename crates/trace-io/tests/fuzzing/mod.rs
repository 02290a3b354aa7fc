//! Shared by the fuzz targets: the time-boxed proptest runner, an independent checker of the
//! content rules of SEMANTICS.md §1, error formatting, and the real-data directory.

#![allow(dead_code, reason = "each fuzz target uses a different subset")]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRng, TestRunner};
use trace_io::{ScoreKind, TraceView};

thread_local! {
    /// Cases accepted on this thread (each property runs on a thread of its own); the properties
    /// count them with [`accepted`].
    pub static ACCEPTED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Counts one accepted case.
pub fn accepted() {
    ACCEPTED.with(|a| a.set(a.get() + 1));
}

#[expect(clippy::print_stderr, reason = "the fuzz runs report their executions")]
/// Runs `test` on values of `strategy`: rounds of `PROPTEST_CASES` cases, for at least one round
/// and `MOE_OFFLOAD_FUZZ_SECS` seconds; prints the executions.
pub fn fuzz<S: Strategy>(name: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>) {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512u32);
    let budget = std::env::var("MOE_OFFLOAD_FUZZ_SECS").ok().and_then(|v| v.parse().ok()).map(Duration::from_secs);
    let start = Instant::now();
    let mut rounds = 0u64;
    loop {
        let mut seed = [0u8; 32];
        seed[..8].copy_from_slice(&rounds.to_le_bytes());
        let tag = name.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
        seed[8..16].copy_from_slice(&tag.to_le_bytes());
        let rng = TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &seed);
        let config = Config { cases, failure_persistence: None, ..Config::default() };
        let mut runner = TestRunner::new_with_rng(config, rng);
        if let Err(e) = runner.run(&strategy, &test) {
            panic!("{name}: round {rounds} (seed {seed:?}): {e}");
        }
        rounds += 1;
        if budget.is_none_or(|b| start.elapsed() >= b) {
            break;
        }
    }
    let n = rounds * u64::from(cases);
    let accepted = ACCEPTED.with(std::cell::Cell::get);
    eprintln!(
        "{name}: {n} executions in {rounds} rounds, {:.1} s; {accepted} accepted (checked against §1), the rest refused",
        start.elapsed().as_secs_f64()
    );
}

/// The real-data directory when `MOE_OFFLOAD_REAL_DATA` is set (it must then exist).
pub fn real_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("MOE_OFFLOAD_REAL_DATA")?);
    let dir = if dir.is_absolute() { dir } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir) };
    assert!(dir.is_dir(), "MOE_OFFLOAD_REAL_DATA={} is set but missing", dir.display());
    Some(dir)
}

/// Every content rule of SEMANTICS.md §1, written out again here: shapes, ids < E and distinct
/// within a row, scores finite and non-increasing, gates and norms finite and >= 0, offsets
/// starting at 0, strictly increasing and below T, `layer_ids` non-empty and distinct, k <= m.
pub fn check_rules(v: &TraceView<'_>) -> Result<(), TestCaseError> {
    let s = v.shape();
    let m = v.meta();
    prop_assert_eq!(s.layers, m.layer_ids.len());
    prop_assert!(s.layers > 0);
    let mut ids = m.layer_ids.clone();
    ids.sort_unstable();
    ids.dedup();
    prop_assert_eq!(ids.len(), s.layers, "repeated layer id");
    prop_assert!(s.top_k >= 1 && s.top_k <= s.candidates);
    prop_assert_eq!(s.num_experts, m.num_experts as usize);
    prop_assert!((1..=65_536).contains(&s.num_experts));
    for l in 0..s.layers {
        prop_assert_eq!(v.layer_ids(l).len(), s.tokens * s.candidates);
        for t in 0..s.tokens {
            let row = v.row(l, t);
            for (i, &e) in row.iter().enumerate() {
                prop_assert!(usize::from(e) < s.num_experts, "layer {l} token {t}: id {e} >= E");
                prop_assert!(!row[..i].contains(&e), "layer {l} token {t}: id {e} repeated");
            }
        }
        if let Some(sc) = v.layer_scores(l) {
            prop_assert_eq!(sc.len(), s.tokens * s.candidates);
            for row in sc.chunks(s.candidates) {
                prop_assert!(row.iter().all(|x| x.is_finite()));
                prop_assert!(row.windows(2).all(|w| w[0] >= w[1]), "increasing scores {row:?}");
            }
        }
        for g in [v.layer_gates(l), v.layer_out_norms(l)].into_iter().flatten() {
            prop_assert_eq!(g.len(), s.tokens * s.top_k);
            prop_assert!(g.iter().all(|x| x.is_finite() && *x >= 0.0));
        }
    }
    prop_assert!(m.score_kind == ScoreKind::None || v.parts().scores.is_some(), "score_kind without scores");
    for offs in [v.seq_offsets(), v.step_offsets()].into_iter().flatten() {
        prop_assert!(offs.first().is_none_or(|&o| o == 0));
        prop_assert!(offs.windows(2).all(|w| w[0] < w[1]));
        prop_assert!(offs.iter().all(|&o| o < s.tokens as u64));
    }
    Ok(())
}

/// The message of an error and of every cause: each non-empty.
pub fn formatted(e: &dyn std::error::Error) -> Result<String, TestCaseError> {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        prop_assert!(!text.is_empty());
        out += &format!(" / {text}");
        cause = c.source();
    }
    prop_assert!(!out.is_empty());
    let _ = format!("{e:?}");
    Ok(out)
}
