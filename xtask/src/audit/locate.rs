//! Finding the inputs an output names (traces, keep maps, caps files) and verifying each against
//! the hash its output recorded.
//!
//! An output records an input by the path it was given (relative to the grid file's directory for
//! a sweep, to the working directory of the run for statistics and plans) or as `embedded:NAME`.
//! [`Finder::locate`] looks for it, in order: in `--trace-dir` (by file name), by file name in the
//! output's directory, beside it (its parent), in the audited directory and beside that, then as
//! recorded (absolute, or relative to the grid's directory when a sweep records it, to the
//! output's directory and to the working directory); an
//! `embedded:NAME` input is the workspace's committed file `NAME` (`cargo xtask gen-data --check`
//! keeps it equal to the embedded bytes). The first candidate whose hash matches is the input; when
//! none matches, the first one found is named with its hash.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// A hash recorded beside an input: its algorithm (`None` = SHA-256, what every output recorded
/// before the algorithm was written beside the value) and its hex value.
#[derive(Debug, Clone, Copy)]
pub struct RecordedHash<'a> {
    /// `sha256`, `blake3`, or `None` for SHA-256.
    pub algorithm: Option<&'a str>,
    /// Lowercase hex digest.
    pub value: &'a str,
}

impl<'a> RecordedHash<'a> {
    /// A digest as outputs record it: `ALGO:HEX` (`blake3:…`), or bare hex, a SHA-256
    /// (`trace_io::split_digest`).
    pub fn parse(recorded: &'a str) -> Self {
        let (algorithm, value) = trace_io::split_digest(recorded);
        Self { algorithm: Some(algorithm), value }
    }

    /// The algorithm's name (`sha256` when none was recorded).
    pub fn algorithm(&self) -> &str {
        self.algorithm.unwrap_or("sha256")
    }
}

/// The hex digest of a file under the named algorithm (`None` = SHA-256): the one place the audit
/// hashes a file.
///
/// # Errors
/// An unreadable file, or an algorithm this build cannot compute (named).
pub fn file_hash(path: &Path, algorithm: Option<&str>) -> Result<String> {
    match algorithm.unwrap_or("sha256") {
        algo @ ("sha256" | "blake3") => Ok(trace_io::hash_file(path, algo)?),
        other => {
            bail!("{}: hash algorithm {other:?} is not one this audit can compute (sha256, blake3)", path.display())
        }
    }
}

/// Where an input was looked for and what was found.
#[derive(Debug)]
pub enum Located {
    /// Found, and its hash matches (or none was recorded).
    Found(PathBuf),
    /// Files of that name exist but none has the recorded hash: the first one, and its hash.
    Mismatch {
        /// The first candidate found.
        path: PathBuf,
        /// Its hash under the recorded algorithm.
        actual: String,
    },
    /// No candidate exists: the places looked in.
    Missing(Vec<PathBuf>),
    /// A candidate could not be hashed.
    Unreadable(String),
}

/// Looks for inputs around one audited directory, hashing each file at most once.
pub struct Finder {
    /// The audited directory.
    dir: PathBuf,
    /// `--trace-dir`, searched first.
    trace_dir: Option<PathBuf>,
    /// (path, algorithm) -> hex digest.
    hashes: RefCell<BTreeMap<(PathBuf, String), String>>,
}

impl Finder {
    /// A finder for inputs of outputs under `dir`, looking first in `trace_dir` when given.
    pub fn new(dir: &Path, trace_dir: Option<&Path>) -> Finder {
        Finder { dir: dir.to_path_buf(), trace_dir: trace_dir.map(Path::to_path_buf), hashes: RefCell::default() }
    }

    /// The places `recorded` may be, for an output at `output` (a file under the audited directory),
    /// in search order, without duplicates.
    /// A relative `recorded` is also looked for under `base` (the grid's directory a sweep
    /// records), before the paths as recorded.
    pub fn candidates_from(&self, recorded: &str, output: &Path, base: Option<&Path>) -> Vec<PathBuf> {
        if let Some(name) = recorded.strip_prefix("embedded:") {
            return vec![crate::workspace_root().join(name)];
        }
        let rec = Path::new(recorded);
        let Some(file_name) = rec.file_name() else { return Vec::new() };
        let here = output.parent().unwrap_or(&self.dir);
        let mut out: Vec<PathBuf> = Vec::new();
        if let Some(t) = &self.trace_dir {
            out.push(t.join(file_name));
        }
        out.push(here.join(file_name));
        if let Some(up) = here.parent() {
            out.push(up.join(file_name));
        }
        out.push(self.dir.join(file_name));
        if let Some(up) = self.dir.parent() {
            out.push(up.join(file_name));
        }
        if rec.is_absolute() {
            out.push(rec.to_path_buf());
        } else {
            if let Some(b) = base {
                out.push(b.join(rec));
            }
            out.push(here.join(rec));
            out.push(rec.to_path_buf());
        }
        let mut seen = Vec::new();
        out.retain(|p| {
            let key = std::path::absolute(p).unwrap_or_else(|_| p.clone());
            let fresh = !seen.contains(&key);
            seen.push(key);
            fresh
        });
        out
    }

    /// The hash of `path` under `algorithm`, computed once per file and algorithm.
    ///
    /// # Errors
    /// As [`file_hash`].
    pub fn hash(&self, path: &Path, algorithm: Option<&str>) -> Result<String> {
        let key = (path.to_path_buf(), algorithm.unwrap_or("sha256").to_string());
        if let Some(h) = self.hashes.borrow().get(&key) {
            return Ok(h.clone());
        }
        let h = file_hash(path, algorithm)?;
        self.hashes.borrow_mut().insert(key, h.clone());
        Ok(h)
    }

    /// Finds the input `recorded` of the output at `output`, verified against `hash` when one was
    /// recorded (an empty value means none was).
    pub fn locate(&self, recorded: &str, output: &Path, hash: Option<RecordedHash<'_>>) -> Located {
        self.locate_from(recorded, output, hash, None)
    }

    /// [`Finder::locate`], looking also under `base` ([`Finder::candidates_from`]).
    pub fn locate_from(
        &self,
        recorded: &str,
        output: &Path,
        hash: Option<RecordedHash<'_>>,
        base: Option<&Path>,
    ) -> Located {
        let cands = self.candidates_from(recorded, output, base);
        let existing: Vec<&PathBuf> = cands.iter().filter(|p| p.is_file()).collect();
        let Some(first) = existing.first() else { return Located::Missing(cands) };
        let Some(hash) = hash.filter(|h| !h.value.is_empty()) else { return Located::Found((*first).clone()) };
        let mut first_actual = None;
        for p in &existing {
            match self.hash(p, hash.algorithm) {
                Ok(h) if h.eq_ignore_ascii_case(hash.value) => return Located::Found((*p).clone()),
                Ok(h) => {
                    first_actual.get_or_insert(h);
                }
                Err(e) => return Located::Unreadable(format!("{e:#}")),
            }
        }
        Located::Mismatch { path: (*first).clone(), actual: first_actual.unwrap_or_default() }
    }

    /// `path` as the report shows it: relative to the audited directory when below it or beside
    /// it (`../NAME`), else in full.
    pub fn show(&self, path: &Path) -> String {
        if let Ok(rel) = path.strip_prefix(&self.dir) {
            return rel.display().to_string();
        }
        match self.dir.parent().map(|up| path.strip_prefix(up)) {
            Some(Ok(rel)) if !self.dir.as_os_str().is_empty() => Path::new("..").join(rel).display().to_string(),
            // Elsewhere (a path relative to the working directory, say): in full.
            _ => std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()).display().to_string(),
        }
    }
}
