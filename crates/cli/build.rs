//! Records the git commit the binary is built from as `MOE_OFFLOAD_GIT_COMMIT` (shown by
//! `--version`, written into outputs' provenance). Outside a git checkout (a source tarball, a
//! missing `.git`, no `git` on PATH) it is `unknown`, or the value of the environment variable
//! `MOE_OFFLOAD_GIT_COMMIT` when the packager sets it.
//!
//! Also sets `cfg(real_data)` when `MOE_OFFLOAD_REAL_DATA` is set, so that the real-data tests run
//! then and show as ignored otherwise (see the `real-data` crate), and `cfg(chromium)` when
//! `MOE_OFFLOAD_REQUIRE_CHROMIUM` is set, for the test that renders the report in Chromium.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(real_data)");
    println!("cargo::rerun-if-env-changed=MOE_OFFLOAD_REAL_DATA");
    if std::env::var_os("MOE_OFFLOAD_REAL_DATA").is_some() {
        println!("cargo::rustc-cfg=real_data");
    }
    println!("cargo::rustc-check-cfg=cfg(chromium)");
    println!("cargo::rerun-if-env-changed=MOE_OFFLOAD_REQUIRE_CHROMIUM");
    if std::env::var_os("MOE_OFFLOAD_REQUIRE_CHROMIUM").is_some() {
        println!("cargo::rustc-cfg=chromium");
    }
    println!("cargo::rerun-if-env-changed=MOE_OFFLOAD_GIT_COMMIT");
    let commit = std::env::var("MOE_OFFLOAD_GIT_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_string());
    // Rebuild when HEAD moves: HEAD itself, the branch it points to, packed refs.
    for path in ["HEAD", "packed-refs"].into_iter().map(str::to_string).chain(git(&["symbolic-ref", "-q", "HEAD"])) {
        if let Some(p) = git(&["rev-parse", "--git-path", &path])
            && std::path::Path::new(&p).exists()
        {
            println!("cargo::rerun-if-changed={p}");
        }
    }
    println!("cargo::rustc-env=MOE_OFFLOAD_GIT_COMMIT={commit}");
}
