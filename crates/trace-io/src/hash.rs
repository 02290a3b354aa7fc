//! Content hashes of trace files for provenance, recorded with the algorithm's name.
//!
//! A recorded digest is `ALGO:HEX` (`blake3:…`, what this build writes: BLAKE3, multi-threaded
//! on the rayon pool, several GB/s), or a bare 64-digit hex string, the SHA-256 that records
//! written before the algorithm was named hold. [`verify_digest`] reads both.

use std::path::Path;

use crate::{Result, TraceError};

/// The algorithm [`trace_digest`] uses, as recorded before the `:`.
pub const HASH_ALGO: &str = "blake3";

/// The hex digest of the file at `path` with the algorithm named `algo`: `"blake3"` (memory-mapped,
/// multi-threaded on the rayon pool) or `"sha256"` (streamed, one thread). Lower-case hex, 64
/// digits for both.
///
/// # Errors
/// [`TraceError::Config`] for another name; [`TraceError::File`] around an I/O error.
pub fn hash_file(path: impl AsRef<Path>, algo: &str) -> Result<String> {
    let path = path.as_ref();
    match algo {
        "blake3" => {
            let inner = || -> Result<String> {
                let mut h = blake3::Hasher::new();
                h.update_mmap_rayon(path)?;
                Ok(h.finalize().to_hex().to_string())
            };
            inner().map_err(|e| e.in_file(path))
        }
        "sha256" => crate::sha256_file(path),
        other => {
            Err(TraceError::Config { key: "hash algorithm", reason: format!("`{other}` is not one of blake3, sha256") })
        }
    }
}

/// The provenance digest of the file at `path` as recorded: `blake3:HEX`.
///
/// # Errors
/// As [`hash_file`].
pub fn trace_digest(path: impl AsRef<Path>) -> Result<String> {
    Ok(format!("{HASH_ALGO}:{}", hash_file(path, HASH_ALGO)?))
}

/// The digest of bytes already in memory (for example a mapped trace), as recorded:
/// `blake3:HEX`, hashed on the rayon pool. Equal to [`trace_digest`] of a file of those bytes.
pub fn bytes_digest(bytes: &[u8]) -> String {
    let mut h = blake3::Hasher::new();
    h.update_rayon(bytes);
    format!("{HASH_ALGO}:{}", h.finalize().to_hex())
}

/// A recorded digest split into (algorithm name, hex): `ALGO:HEX` as written, a bare hex
/// string (the records before the name was written) as `sha256`.
pub fn split_digest(recorded: &str) -> (&str, &str) {
    match recorded.split_once(':') {
        Some((algo, hex)) => (algo, hex),
        None => ("sha256", recorded),
    }
}

/// Whether the file at `path` has the recorded digest (either form of [`split_digest`]).
///
/// # Errors
/// As [`hash_file`], for an unknown algorithm name too.
pub fn verify_digest(path: impl AsRef<Path>, recorded: &str) -> Result<bool> {
    let (algo, hex) = split_digest(recorded);
    Ok(hash_file(path, algo)?.eq_ignore_ascii_case(hex))
}

/// A digest named by its algorithm: `blake3` (what this build writes for traces) or `sha256`.
/// Serialized as one string, `ALGO:HEX`; read from `ALGO:HEX` or from a bare hex string, the
/// SHA-256 of records written before the algorithm was named ([`split_digest`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest {
    /// The algorithm's name (`blake3`, `sha256`).
    pub algorithm: String,
    /// The digest in hex, as recorded.
    pub hex: String,
}

impl Digest {
    /// A digest as recorded (`ALGO:HEX`, or bare hex for SHA-256).
    pub fn parse(recorded: &str) -> Digest {
        let (algorithm, hex) = split_digest(recorded);
        Digest { algorithm: algorithm.to_string(), hex: hex.to_string() }
    }

    /// A SHA-256 given in hex.
    pub fn sha256(hex: impl Into<String>) -> Digest {
        Digest { algorithm: "sha256".into(), hex: hex.into() }
    }
}

impl std::fmt::Display for Digest {
    /// `ALGO:HEX`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.algorithm, self.hex)
    }
}

impl serde::Serialize for Digest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Digest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Digest, D::Error> {
        Ok(Digest::parse(&String::deserialize(d)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A digest reads from both recorded forms and writes `ALGO:HEX`.
    #[test]
    fn digests_are_named_by_algorithm() {
        let check = |recorded: &str, algorithm: &str, written: &str| {
            let d: Digest = serde_json::from_str(&format!("\"{recorded}\"")).unwrap();
            assert_eq!((d.algorithm.as_str(), d.hex.as_str()), (algorithm, &written[algorithm.len() + 1..]));
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{written}\""));
            assert_eq!(Digest::parse(recorded), d);
        };
        check("blake3:ab12", "blake3", "blake3:ab12");
        check("sha256:cd34", "sha256", "sha256:cd34");
        // A bare hex string is what records written before the algorithm was named hold: SHA-256.
        check("ef56", "sha256", "sha256:ef56");
        assert_eq!(Digest::sha256("ef56").to_string(), "sha256:ef56");
    }

    /// BLAKE3 and SHA-256 of "abc" (the published test vectors), through the file functions, and
    /// both recorded forms verify; another byte does not.
    #[test]
    fn digests_match_published_vectors_and_verify() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("abc");
        std::fs::write(&p, b"abc").unwrap();
        let b3 = "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85";
        let sha = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hash_file(&p, "blake3").unwrap(), b3);
        assert_eq!(hash_file(&p, "sha256").unwrap(), sha);
        assert_eq!(trace_digest(&p).unwrap(), format!("blake3:{b3}"));
        assert_eq!(bytes_digest(b"abc"), format!("blake3:{b3}"));
        assert_eq!(split_digest(sha), ("sha256", sha));
        assert!(verify_digest(&p, &format!("blake3:{b3}")).unwrap());
        assert!(verify_digest(&p, sha).unwrap());
        assert!(!verify_digest(&p, &format!("blake3:{sha}")).unwrap());
        std::fs::write(&p, b"abd").unwrap();
        assert!(!verify_digest(&p, &format!("blake3:{b3}")).unwrap());
        assert!(matches!(hash_file(&p, "md5"), Err(TraceError::Config { .. })));
    }
}
