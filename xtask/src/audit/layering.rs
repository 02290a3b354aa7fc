//! The layering check: internal dependency edges only point down (docs/ARCHITECTURE.md).

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use super::{Check, check};

/// Internal crates and the internal crates each may depend on (any dependency kind).
pub const ALLOWED: [(&str, &[&str]); 8] = [
    ("trace-io", &[]),
    ("capture", &["trace-io"]),
    ("saliency", &["trace-io"]),
    ("cachesim", &["trace-io"]),
    ("sweep", &["trace-io", "saliency", "cachesim"]),
    ("api", &["trace-io", "saliency", "cachesim", "sweep", "capture"]),
    ("cli", &["trace-io", "saliency", "cachesim", "sweep", "api", "capture"]),
    ("xtask", &["trace-io", "saliency", "cachesim", "sweep"]),
];

/// Dev-only test-support crates (never published, no layer of their own): left out of the edges;
/// `xtask`'s tidy tests check that libraries use them only as dev-dependencies.
pub const TEST_SUPPORT: [&str; 1] = ["real-data"];

/// Reads the workspace's internal edges from `cargo metadata`: `(package, internal dependency)`,
/// leaving out [`TEST_SUPPORT`].
pub fn workspace_edges() -> Result<Vec<(String, String)>> {
    let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
        .current_dir(crate::workspace_root())
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(out.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let mut edges = Vec::new();
    for p in meta["packages"].as_array().context("no packages in cargo metadata")? {
        let name = p["name"].as_str().unwrap_or_default().to_string();
        for d in p["dependencies"].as_array().into_iter().flatten() {
            let dep = d["name"].as_str().unwrap_or_default();
            if d.get("path").is_some_and(|v| !v.is_null()) && !TEST_SUPPORT.contains(&dep) {
                edges.push((name.clone(), dep.to_string()));
            }
        }
    }
    edges.sort();
    edges.dedup();
    Ok(edges)
}

/// Checks `edges` against [`ALLOWED`]: an unknown internal crate or an edge pointing up fails.
pub fn check_edges(edges: &[(String, String)]) -> Check {
    let mut first = None;
    for (from, to) in edges {
        let ok = ALLOWED.iter().find(|(c, _)| c == from).is_some_and(|(_, allowed)| allowed.contains(&to.as_str()));
        if !ok && first.is_none() {
            first = Some(format!("{from} depends on {to}, which is not below it"));
        }
    }
    let mut f = BTreeMap::new();
    f.insert("edges".into(), json!(edges.iter().map(|(a, b)| format!("{a} -> {b}")).collect::<Vec<_>>()));
    check("0 layering", "internal dependencies point down", first.is_none(), f, first)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upward_edge_fails_and_the_workspace_passes() {
        let edges = workspace_edges().unwrap();
        assert!(edges.contains(&("sweep".into(), "cachesim".into())));
        assert_eq!(check_edges(&edges).status, super::super::Status::Pass);
        let mut bad = edges.clone();
        bad.push(("cachesim".into(), "saliency".into()));
        let c = check_edges(&bad);
        assert_eq!(c.status, super::super::Status::Fail);
        assert_eq!(c.first_offending.as_deref(), Some("cachesim depends on saliency, which is not below it"));
    }
}
