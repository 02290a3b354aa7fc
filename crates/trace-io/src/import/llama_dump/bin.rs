//! `llama-bin`: little-endian records `int32 layer, int32 n_tokens, int32 k, int32
//! ids[n_tokens * k]` (token-major: token 0's k ids, then token 1's), one per MoE layer per graph
//! evaluation.
//!
//! Ubatches: the layer of the file's first record is the first MoE layer; each record of that
//! layer starts a ubatch (an engine step, recorded as `step_offsets`), and the ubatch's tokens are
//! that record's `n_tokens`. A later record of the ubatch with fewer tokens holds its last ones
//! (llama.cpp's last layer routes only the output tokens); with more, it is refused.
//! Sequences: a ubatch of more than one token after a one-token ubatch starts a new sequence (a new
//! prompt after generation); tokens of ubatches of more than one token count as prefill, the
//! others as decode.

use std::io::{BufReader, Read};
use std::path::Path;

use super::{Collected, LlamaDumpOptions, Token, check_ids, finish};
use crate::Result;
use crate::import::{Imported, import_err};

const FORMAT: &str = "llama-bin";

/// Bytes of a record's header: layer, n_tokens, k.
const HEADER: u64 = 12;

/// Imports the binary routing dump at `path` (module doc of [`super`] and of this file for the
/// rules).
///
/// # Errors
/// [`TraceError::Import`](crate::TraceError::Import) naming the file, the record and its byte
/// offset for: an empty file; a truncated record (header or ids); a negative layer; `n_tokens` or
/// `k` not positive; `k` different from the first record's (mixed k); an id `< 0`, `>= num_experts`
/// or repeated in its row; a layer recorded twice in one ubatch; a record with more tokens than its
/// ubatch. [`TraceError::File`](crate::TraceError::File) around an
/// I/O error.
pub fn import_llama_bin(path: impl AsRef<Path>, opts: &LlamaDumpOptions) -> Result<Imported> {
    let path = path.as_ref();
    let err = |m: String| import_err(FORMAT, path, None, m);
    if opts.num_experts == 0 {
        return Err(err("--num-experts 0: a layer has at least one expert".into()));
    }
    let file = crate::open_regular_file(path).map_err(|e| crate::TraceError::Io(e).in_file(path))?;
    let len = file.metadata().map_err(|e| crate::TraceError::Io(e).in_file(path))?.len();
    if len == 0 {
        return Err(err("no records: the file is empty".into()));
    }
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut c = Collected { step_starts: Some(Vec::new()), ..Default::default() };
    let (mut off, mut index) = (0u64, 0u64);
    let mut first_layer = None;
    // The current ubatch: its first token, its size, its first record's offset, the layers seen.
    let mut ubatch = (0usize, 0usize, 0u64, Vec::<(u32, u64)>::new());
    let mut prev_size = 0usize;
    let (mut sizes, mut one_token) = (Vec::new(), 0u64);
    let mut bytes = Vec::new();
    let (mut raw, mut ids) = (Vec::new(), Vec::new());
    while off < len {
        let at = |m: String| err(format!("record {index} at byte {off}: {m}"));
        if len - off < HEADER {
            return Err(at(format!(
                "truncated record: {} bytes left, a record header is 12 (layer, n_tokens, k)",
                len - off
            )));
        }
        let mut h = [0u8; 12];
        r.read_exact(&mut h).map_err(|e| at(format!("cannot read: {e}")))?;
        let [layer, n, k] = [0, 4, 8].map(|i| i32::from_le_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
        if layer < 0 {
            return Err(at(format!("layer {layer} is negative")));
        }
        let layer = layer as u32;
        if n <= 0 || k <= 0 {
            return Err(at(format!("n_tokens {n}, k {k}: both must be positive (is this a llama-bin dump?)")));
        }
        let (n, k) = (n as usize, k as usize);
        if c.k == 0 {
            c.k = k;
        } else if k != c.k {
            return Err(at(format!(
                "k = {k}, but the first record has k = {}: k changes within the file (mixed k)",
                c.k
            )));
        }
        let need = (n as u64) * (k as u64) * 4;
        if len - off - HEADER < need {
            return Err(at(format!(
                "truncated record: {n} tokens x k {k} need {need} bytes of ids, {} left",
                len - off - HEADER
            )));
        }
        bytes.resize(need as usize, 0);
        r.read_exact(&mut bytes).map_err(|e| at(format!("cannot read: {e}")))?;
        // Ubatches (module doc).
        if *first_layer.get_or_insert(layer) == layer {
            let start = c.tokens.len();
            if prev_size == 1 && n > 1 || start == 0 {
                c.seq_starts.push(start);
            }
            if let Some(s) = c.step_starts.as_mut() {
                s.push(start);
            }
            if n == 1 {
                one_token += 1;
            } else {
                sizes.push(n);
            }
            c.tokens.extend((0..n).map(|_| Token { rows: Vec::new(), prefill: n > 1 }));
            ubatch = (start, n, off, Vec::new());
            prev_size = n;
        }
        let (start, size, ub_off, seen) = &mut ubatch;
        if let Some((_, o)) = seen.iter().find(|(l, _)| *l == layer) {
            return Err(at(format!(
                "layer {layer} recorded twice in the ubatch that starts at byte {ub_off} (the first at byte {o})"
            )));
        }
        seen.push((layer, off));
        if n > *size {
            return Err(at(format!(
                "layer {layer}: {n} tokens, more than its ubatch's {size} (the first layer's record at byte {ub_off})"
            )));
        }
        for t in 0..n {
            raw.clear();
            raw.extend(
                bytes[t * k * 4..(t + 1) * k * 4].as_chunks::<4>().0.iter().map(|b| i64::from(i32::from_le_bytes(*b))),
            );
            check_ids(&raw, opts.num_experts, &mut ids).map_err(|m| {
                let slot: u64 = m.strip_prefix("slot ").and_then(|s| s.split(':').next()?.parse().ok()).unwrap_or(0);
                at(format!(
                    "layer {layer}, token {t} (id at byte {}): {m}",
                    off + HEADER + (t * k) as u64 * 4 + slot * 4
                ))
            })?;
            let row = c.push_row(&ids);
            // Fewer tokens than the ubatch: the last ones.
            c.tokens[*start + *size - n + t].rows.push((layer, row));
        }
        c.records += 1;
        off += HEADER + need;
        index += 1;
    }
    let (lo, hi) = (sizes.iter().min().copied().unwrap_or(0), sizes.iter().max().copied().unwrap_or(0));
    let steps = c.step_starts.as_ref().map_or(0, Vec::len);
    c.notes.push(format!(
        "{} records in {steps} ubatches (a ubatch starts at each record of layer {}): {} of more than one token \
         ({lo}..={hi} tokens, prefill), {one_token} of one token (decode); {} sequences (a new one where a ubatch of \
         several tokens follows a one-token ubatch)",
        c.records,
        first_layer.unwrap_or(0),
        sizes.len(),
        c.seq_starts.len()
    ));
    finish(FORMAT, path, opts, c)
}
