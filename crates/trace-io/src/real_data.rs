//! Test support: where the real routing data is (`../shared/data/real/` in CI).
//!
//! Tests that need real data call [`dir_or_skip`]: CI sets [`ENV`] and the tests fail loudly if the
//! directory is missing; on a fresh clone the variable is unset and they skip with a printed note,
//! so `cargo test --workspace` passes without the data.

use std::path::PathBuf;

/// The environment variable naming the real-data directory.
pub const ENV: &str = "MOE_OFFLOAD_REAL_DATA";

/// The real-data directory, or `None` after printing a skip note when [`ENV`] is unset.
///
/// # Panics
/// When [`ENV`] is set but does not name a directory: a CI run must not silently skip.
#[expect(clippy::print_stderr, reason = "test support: tell the user why a test skips")]
pub fn dir_or_skip() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(ENV) else {
        eprintln!("skipping: {ENV} not set (it names ../shared/data/real; .ci/run sets it)");
        return None;
    };
    let dir = PathBuf::from(dir);
    assert!(dir.is_dir(), "{ENV}={} is set but is not a directory: the real data is missing", dir.display());
    Some(dir)
}
