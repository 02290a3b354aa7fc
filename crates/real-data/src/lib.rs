//! Test support (dev-only, never published): where the real routing data is
//! (`../shared/data/real/` in CI).
//!
//! The real data is never in the repository: [`ENV`] names its directory. A real-data test shows
//! as *ignored* when [`ENV`] is unset (a fresh clone), runs when it is set (CI, `.ci/run`), and
//! fails loudly when it is set but names no directory. Each crate with real-data tests has a
//! `build.rs` that sets `cfg(real_data)` when [`ENV`] is set at build time (and rebuilds when it
//! changes), and each such test reads:
//!
//! ```text
//! #[test]
//! #[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
//! fn translation_imports() {
//!     let real = real_data::dir();
//!     // ... real.join("esft-dsv2lite") ...
//! }
//! ```
//!
//! The `build.rs` (copy it from `crates/trace-io/build.rs`) and a `real-data` dev-dependency are
//! all a new crate needs. `cargo test -- --include-ignored` without [`ENV`] runs them and fails in
//! [`dir`], naming the variable.

use std::path::{Path, PathBuf};

/// The environment variable naming the real-data directory.
pub const ENV: &str = "MOE_OFFLOAD_REAL_DATA";

/// The real-data directory, for a test that needs it (ignored unless [`ENV`] is set, see the
/// crate doc).
///
/// A relative path is taken from the workspace root, not from the working directory: `cargo
/// test` runs each crate's tests in that crate's directory, so `../shared/data/real` given at
/// the root would otherwise name a different place in every crate.
///
/// # Panics
/// When [`ENV`] is unset (the test was run with `--include-ignored`), or set but does not name a
/// directory: a run that asked for real data must not silently skip it.
pub fn dir() -> PathBuf {
    let Some(dir) = std::env::var_os(ENV) else {
        panic!("{ENV} is not set: this real-data test needs it (it names ../shared/data/real; .ci/run sets it)");
    };
    checked(PathBuf::from(dir))
}

/// The real-data directory, or `None` when [`ENV`] is unset: for tools that run with or without
/// the data (`cargo xtask audit`), not for tests (they use [`dir`]).
///
/// # Panics
/// When [`ENV`] is set but does not name a directory.
pub fn dir_if_set() -> Option<PathBuf> {
    std::env::var_os(ENV).map(|dir| checked(PathBuf::from(dir)))
}

/// `dir` resolved from the workspace root, asserted to be a directory.
fn checked(dir: PathBuf) -> PathBuf {
    let dir = resolve(dir);
    assert!(dir.is_dir(), "{ENV}={} is set but is not a directory: the real data is missing", dir.display());
    dir
}

/// `dir` itself when absolute, else `dir` under the workspace root (two levels above this crate).
fn resolve(dir: PathBuf) -> PathBuf {
    if dir.is_absolute() { dir } else { Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dir) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_taken_from_the_workspace_root() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        assert!(root.join("Cargo.toml").is_file() && root.join("crates/real-data").is_dir());
        assert_eq!(resolve(PathBuf::from("../shared/data/real")), root.join("../shared/data/real"));
        assert_eq!(resolve(PathBuf::from("/data/real")), PathBuf::from("/data/real"));
    }

    #[test]
    #[should_panic(expected = "is set but is not a directory: the real data is missing")]
    fn a_missing_directory_fails_loudly() {
        checked(PathBuf::from("/nonexistent/moe-offload-real-data"));
    }
}
