//! Test support: where the real routing data is (`../shared/data/real/` in CI).
//!
//! Tests that need real data call [`dir_or_skip`]: CI sets [`ENV`] and the tests fail loudly if the
//! directory is missing; on a fresh clone the variable is unset and they skip with a printed note,
//! so `cargo test --workspace` passes without the data.

use std::path::{Path, PathBuf};

/// The environment variable naming the real-data directory.
pub const ENV: &str = "MOE_OFFLOAD_REAL_DATA";

/// The real-data directory, or `None` after printing a skip note when [`ENV`] is unset.
///
/// A relative path is taken from the workspace root, not from the working directory: `cargo
/// test` runs each crate's tests in that crate's directory, so `../shared/data/real` given at
/// the root would otherwise name a different place in every crate.
///
/// # Panics
/// When [`ENV`] is set but does not name a directory: a CI run must not silently skip.
#[expect(clippy::print_stderr, reason = "test support: tell the user why a test skips")]
pub fn dir_or_skip() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(ENV) else {
        eprintln!("skipping: {ENV} not set (it names ../shared/data/real; .ci/run sets it)");
        return None;
    };
    let dir = resolve(PathBuf::from(dir));
    assert!(dir.is_dir(), "{ENV}={} is set but is not a directory: the real data is missing", dir.display());
    Some(dir)
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
        assert!(root.join("Cargo.toml").is_file() && root.join("crates/trace-io").is_dir());
        assert_eq!(resolve(PathBuf::from("../shared/data/real")), root.join("../shared/data/real"));
        assert_eq!(resolve(PathBuf::from("/data/real")), PathBuf::from("/data/real"));
    }
}
