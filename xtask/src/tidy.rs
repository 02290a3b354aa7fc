//! Tidy checks on the workspace's source, run as tests (`cargo test -p xtask`): no source file
//! over [`MAX_LINES`] lines (STYLE: a file has one purpose), `cachesim` does no I/O, the
//! dev-only test-support crates stay out of the libraries' normal dependencies, and every path
//! of the workspace that the docs name exists.

use std::path::{Path, PathBuf};

/// The most lines a source file may have (tests aside).
pub const MAX_LINES: usize = 700;

/// Files allowed over [`MAX_LINES`] for now, each with the issue that splits it. A file listed
/// here that is no longer over the limit fails the test, so the list only shrinks.
const TOO_LONG_FOR_NOW: [(&str, &str); 0] = [];

/// Text that means a rule or a document written in the Python front end: a JSON document
/// (`json!(`, a `"kind"` tag) or a refusal of its own (`usage!(`). The command layer
/// (`crates/api`) owns both; the front ends translate arguments and present results.
const FRONT_END_RULES: [&str; 3] = ["json!(", "\"kind\"", "usage!("];

/// Python front-end files that still hold rules or documents of their own, with how many
/// (issue #53 moves each command under `crates/api`). A listed file with fewer fails the test,
/// so the list only shrinks; an unlisted file must hold none.
const PYTHON_RULES_FOR_NOW: [(&str, usize); 3] = [("plan_py.rs", 7), ("saliency_py.rs", 5), ("sweep_py.rs", 2)];

/// Text that means file, network, process or environment access, or the trace files' own I/O.
const IO: [&str; 11] = [
    "std::fs",
    "std::io",
    "std::net",
    "std::process",
    "std::env",
    "File::",
    "OpenOptions",
    "TraceFile",
    "write_trace",
    "write_atomic",
    "sha256_file",
];

/// Every `.rs` file under `dir`, skipping `target`, hidden directories and test code (`tests/`
/// directories and `tests.rs` modules), sorted.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("listing {}: {e}", d.display())) {
            let path = entry.expect("a directory entry").path();
            let name = path.file_name().unwrap_or_default().to_string_lossy().to_string();
            if path.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "tests") {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Files over [`MAX_LINES`] under `root`: (path relative to `root`, lines).
fn too_long(root: &Path) -> Vec<(String, usize)> {
    sources(root)
        .into_iter()
        .filter_map(|p| {
            let lines = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).lines().count();
            let rel = p.strip_prefix(root).unwrap_or(&p).to_string_lossy().replace('\\', "/");
            (lines > MAX_LINES).then_some((rel, lines))
        })
        .collect()
}

/// The I/O uses in Rust source `text`: `(line number, the IO text found)`, comments left out.
fn io_uses(text: &str) -> Vec<(usize, &'static str)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        out.extend(IO.iter().filter(|io| code.contains(*io)).map(|io| (i + 1, *io)));
    }
    out
}

/// The top-level directories whose paths the docs name.
const DOC_ROOTS: [&str; 7] = ["crates/", "data/", "docs/", "xtask/", "python/", "scripts/", ".ci/"];

/// The workspace paths named in backticks in `text` (a Markdown file) that do not exist under
/// `root`: tokens starting with one of [`DOC_ROOTS`], with a trailing `:LINE` or punctuation
/// dropped; patterns (`*`, `{`, `<`, `$`) and placeholders (a component in capitals, `NAME.rs`)
/// are not paths.
fn missing_doc_paths(root: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (i, part) in text.split('`').enumerate() {
        if i % 2 == 0 || part.contains(char::is_whitespace) || !DOC_ROOTS.iter().any(|r| part.starts_with(r)) {
            continue;
        }
        if part.contains(['*', '{', '<', '$']) {
            continue;
        }
        let path = part.split(':').next().unwrap_or(part).trim_end_matches(['.', ',', ';', ')']);
        let placeholder = path.split('/').any(|c| {
            let stem = c.split('.').next().unwrap_or(c);
            stem.len() > 1 && stem.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_')
        });
        if !placeholder && !root.join(path).exists() {
            out.push(path.to_string());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_the_docs_name_exists() {
        let root = crate::workspace_root();
        let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "md"))
            .collect();
        docs.push(root.join("README.md"));
        docs.sort();
        let missing: Vec<String> = docs
            .iter()
            .flat_map(|d| {
                let text = std::fs::read_to_string(d).unwrap();
                missing_doc_paths(&root, &text).into_iter().map(move |p| format!("{}: {p}", d.display()))
            })
            .collect();
        assert!(missing.is_empty(), "paths the docs name that do not exist:\n{}", missing.join("\n"));
    }

    #[test]
    fn doc_paths_are_told_from_patterns_and_placeholders() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("crates/a/src")).unwrap();
        std::fs::write(dir.path().join("crates/a/src/lib.rs"), "").unwrap();
        let text = "`crates/a/src/lib.rs`, `crates/a/src/lib.rs:12`, `crates/a/src/gone.rs`, `crates/*/src`, \
                    `crates/a/src/NAME.rs`, `data/grids/{a,b}.json`, `cargo test -p a`, `src/x.rs`, `docs/none.md`.";
        assert_eq!(missing_doc_paths(dir.path(), text), ["crates/a/src/gone.rs", "docs/none.md"]);
    }

    #[test]
    fn no_source_file_is_over_700_lines() {
        let found = too_long(&crate::workspace_root());
        let unexpected: Vec<_> =
            found.iter().filter(|(f, _)| !TOO_LONG_FOR_NOW.iter().any(|(known, _)| known == f)).collect();
        assert!(unexpected.is_empty(), "over {MAX_LINES} lines (split into modules): {unexpected:?}");
        for (known, why) in TOO_LONG_FOR_NOW {
            assert!(
                found.iter().any(|(f, _)| f == known),
                "{known} is no longer over {MAX_LINES} lines ({why}): remove it from TOO_LONG_FOR_NOW"
            );
        }
    }

    #[test]
    fn the_line_count_sees_a_long_file_and_skips_tests() {
        let dir = tempfile::tempdir().unwrap();
        let long = "fn f() {}\n".repeat(MAX_LINES + 1);
        std::fs::create_dir_all(dir.path().join("src/tests")).unwrap();
        std::fs::write(dir.path().join("src/long.rs"), &long).unwrap();
        std::fs::write(dir.path().join("src/ok.rs"), "fn f() {}\n".repeat(MAX_LINES)).unwrap();
        std::fs::write(dir.path().join("src/tests.rs"), &long).unwrap();
        std::fs::write(dir.path().join("src/tests/big.rs"), &long).unwrap();
        assert_eq!(too_long(dir.path()), [("src/long.rs".to_string(), MAX_LINES + 1)]);
    }

    #[test]
    fn the_python_front_end_holds_no_new_rules() {
        let src = crate::workspace_root().join("python/src");
        let mut wrong = Vec::new();
        for p in sources(&src) {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let code: String =
                text.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
            let found: usize = FRONT_END_RULES.iter().map(|r| code.matches(r).count()).sum();
            let name = p.file_name().unwrap_or_default().to_string_lossy().to_string();
            let allowed = PYTHON_RULES_FOR_NOW.iter().find(|(f, _)| *f == name).map_or(0, |a| a.1);
            if found != allowed {
                wrong.push(format!("python/src/{name}: {found} rules or documents (allowed {allowed})"));
            }
        }
        assert!(
            wrong.is_empty(),
            "a rule or JSON document belongs in crates/api (update PYTHON_RULES_FOR_NOW when one moves there): {wrong:#?}"
        );
    }

    #[test]
    fn cachesim_does_no_io() {
        let src = crate::workspace_root().join("crates/cachesim/src");
        let files = sources(&src);
        assert!(files.len() >= 5, "{files:?}");
        for f in files {
            let uses = io_uses(&std::fs::read_to_string(&f).unwrap());
            assert!(uses.is_empty(), "{}: I/O in cachesim (lines, what): {uses:?}", f.display());
        }
    }

    #[test]
    fn io_is_found_in_code_not_in_comments() {
        let text =
            "use std::fs::File;\n// std::net in a comment\nlet x = 1; // std::io too\nstd::net::TcpStream::connect(a)";
        assert_eq!(io_uses(text), [(1, "std::fs"), (4, "std::net")]);
    }

    /// The test-support crates are dev-dependencies of libraries (xtask, a tool, may use them).
    #[test]
    fn test_support_crates_are_dev_dependencies_only() {
        let out = std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["metadata", "--format-version", "1", "--no-deps", "--offline"])
            .current_dir(crate::workspace_root())
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut uses = 0;
        for p in meta["packages"].as_array().unwrap() {
            let name = p["name"].as_str().unwrap();
            for d in p["dependencies"].as_array().unwrap() {
                if crate::audit::layering::TEST_SUPPORT.contains(&d["name"].as_str().unwrap()) && name != "xtask" {
                    assert_eq!(d["kind"], "dev", "{name} depends on {} other than as a dev-dependency", d["name"]);
                    uses += 1;
                }
            }
        }
        assert!(uses >= 4, "the libraries' real-data tests use real-data");
        for p in meta["packages"].as_array().unwrap() {
            if crate::audit::layering::TEST_SUPPORT.contains(&p["name"].as_str().unwrap()) {
                assert_eq!(p["publish"], serde_json::json!([]), "{} must not be published", p["name"]);
            }
        }
    }
}
