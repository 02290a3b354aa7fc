//! What a capture feeds the model: token ids from a file, or text, cut into sequences.

use std::path::Path;

use crate::{CaptureError, Result};

/// Reads a file of token ids: one sequence per non-empty line, ids separated by spaces, tabs or
/// commas (`1 15 27`, `1,15,27`); lines starting with `#` are comments.
///
/// # Errors
/// [`CaptureError::Input`] naming the file and line for a value that is not a non-negative
/// integer below 2^31, or a file without any id.
pub fn read_token_file(path: &Path) -> Result<Vec<Vec<i32>>> {
    let text = trace_io::read_regular_to_string(path).map_err(|e| CaptureError::Input {
        path: path.into(),
        line: 0,
        reason: e.to_string(),
    })?;
    let mut seqs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let seq = line
            .split(|c: char| c.is_whitespace() || c == ',')
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<i32>().ok().filter(|&v| v >= 0).ok_or_else(|| CaptureError::Input {
                    path: path.into(),
                    line: i + 1,
                    reason: format!("`{s}` is not a token id (a non-negative integer below 2^31)"),
                })
            })
            .collect::<Result<Vec<i32>>>()?;
        seqs.push(seq);
    }
    if seqs.is_empty() {
        return Err(CaptureError::Input { path: path.into(), line: 0, reason: "no token id in the file".into() });
    }
    Ok(seqs)
}

/// Cuts each input sequence into chunks of at most `chunk` tokens, each chunk a sequence of its
/// own (a fresh context), in order; empty inputs vanish.
///
/// # Errors
/// [`CaptureError::Config`] when `chunk` is 0.
pub fn chunk_sequences(inputs: Vec<Vec<i32>>, chunk: usize) -> Result<Vec<Vec<i32>>> {
    if chunk == 0 {
        return Err(CaptureError::Config("a chunk of 0 tokens: raise the context or lower --generate".into()));
    }
    Ok(inputs.into_iter().flat_map(|s| s.chunks(chunk).map(<[i32]>::to_vec).collect::<Vec<_>>()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_read_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let check = |text: &str, expect: std::result::Result<Vec<Vec<i32>>, &str>| {
            let p = dir.path().join("ids.txt");
            std::fs::write(&p, text).unwrap();
            match (read_token_file(&p), expect) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{text:?}"),
                (Err(e), Err(want)) => assert!(e.to_string().contains(want), "{e} lacks {want}"),
                (got, want) => panic!("{text:?}: {got:?} vs {want:?}"),
            }
        };
        check("1 2 3\n\n# note\n4,5\t6\n", Ok(vec![vec![1, 2, 3], vec![4, 5, 6]]));
        check("1 2\n3 x\n", Err("line 2: `x` is not a token id"));
        check("1 -2\n", Err("line 1: `-2`"));
        check("1 99999999999\n", Err("`99999999999`"));
        check("\n# only a comment\n", Err("no token id"));
    }

    #[test]
    fn chunks_are_sequences_of_their_own() {
        let got = chunk_sequences(vec![vec![1, 2, 3, 4, 5], vec![], vec![6]], 2).unwrap();
        assert_eq!(got, vec![vec![1, 2], vec![3, 4], vec![5], vec![6]]);
        assert!(chunk_sequences(vec![vec![1]], 0).is_err());
    }
}
