//! Helpers shared by the binary's integration tests: run `moe-offload`, expect success or failure.

#![allow(dead_code, reason = "each test file uses a different subset")]

use std::path::Path;
use std::process::{Command, Output};

/// Borrowed views of owned arguments, for [`ok`], [`fails`] and [`run`].
pub fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs `moe-offload` with `args`.
pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moe-offload")).args(args).output().expect("the binary runs")
}

/// Runs a command that must succeed in the working directory `dir`; returns its stdout.
pub fn ok_in(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_moe-offload")).args(args).current_dir(dir).output().expect("runs");
    assert!(out.status.success(), "{args:?} in {dir:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("stdout is UTF-8")
}

/// Runs a command that must succeed and print one JSON document; returns it.
pub fn json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).expect("one JSON document on stdout")
}

/// Runs a command that must fail; returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    assert!(!out.status.success(), "{args:?} unexpectedly succeeded");
    String::from_utf8(out.stderr).expect("stderr is UTF-8")
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// `moe-offload synth` into `out`: `shape` is `[layers, experts, top_k, candidates, tokens]`, then
/// the `extra` flags (`--seed`, `--sequences`, `--norms`, ...).
pub fn synth(out: &Path, shape: [usize; 5], extra: &[&str]) {
    let [layers, experts, top_k, candidates, tokens] = shape.map(|n| n.to_string());
    let mut args = vec!["synth", "--layers", &layers, "--experts", &experts, "--top-k", &top_k];
    args.extend(["--candidates", &candidates, "--tokens", &tokens]);
    args.extend(extra);
    args.extend(["-o", s(out)]);
    ok(&args);
}
