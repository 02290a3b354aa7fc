//! The file's length against the byte ranges its header gives the tensors, checked before a file
//! is mapped (and on in-memory bytes before they are parsed), so that data past the end of the
//! file is reported by tensor and byte range.

use crate::{Result, TraceError};

/// The limit safetensors puts on the JSON header (100 MB): a longer one is left to its error.
const MAX_HEADER: u64 = 100_000_000;

/// Checks the 8-byte header-length prefix `header_len` against `file_len`, the whole file's
/// length in bytes.
///
/// # Errors
/// [`TraceError::Container`] when the file is shorter than the prefix, or the header runs past
/// the end of the file.
pub(crate) fn check_prefix(file_len: u64, header_len: Option<u64>) -> Result<()> {
    let Some(n) = header_len else {
        return Err(TraceError::Container(format!(
            "the file has {file_len} bytes, fewer than the 8 bytes of the header length (empty or truncated?)"
        )));
    };
    if n <= MAX_HEADER && 8 + n > file_len {
        return Err(TraceError::Container(format!(
            "the header length (first 8 bytes) is {n}, so the header needs file bytes 8..{}, but the file ends at \
             byte {file_len} (truncated, or not a safetensors file?)",
            8 + n
        )));
    }
    Ok(())
}

/// The header length of a safetensors prefix (`None` for fewer than 8 bytes).
pub(crate) fn header_len(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// Checks that the tensors of `header` (the JSON header, `header.len()` bytes after the 8-byte
/// prefix) end exactly where the file of `file_len` bytes ends. A header that cannot be read as
/// tensor entries is left to the container parser (`Ok`).
///
/// # Errors
/// [`TraceError::RepeatedKey`] for a tensor entry or a metadata key written twice (checked
/// first: serde keeps the last one); [`TraceError::Extent`] naming the first tensor (in data order) whose bytes run past the end
/// of the file, or the last tensor when bytes follow it.
pub(crate) fn check_tensors(file_len: u64, header: &[u8]) -> Result<()> {
    if let Some(r) = crate::repeated::repeated_header_key(header) {
        return Err(TraceError::RepeatedKey { within: r.within, key: r.key });
    }
    let Ok(map) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(header) else {
        return Ok(());
    };
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(map.len());
    for (name, info) in &map {
        if name == "__metadata__" {
            continue;
        }
        let Some([s, e]) = info.get("data_offsets").and_then(|o| serde_json::from_value::<[u64; 2]>(o.clone()).ok())
        else {
            return Ok(());
        };
        if e < s {
            return Ok(());
        }
        spans.push((s, e, name));
    }
    spans.sort_unstable();
    // Contiguity, checked here in a fixed order (safetensors checks it too, but names the tensor
    // of a tie in the order of its hash map).
    let mut end = 0u64;
    let mut before: Option<&str> = None;
    for &(s, e, name) in &spans {
        if s != end {
            let after =
                before.map_or("the start of the data section (0)".to_string(), |b| format!("`{b}` ends ({end})"));
            return Err(TraceError::Container(format!(
                "tensor `{name}` has data_offsets {s}..{e}, but it must start where {after}: tensors follow each other \
                 without gaps or overlaps"
            )));
        }
        end = e;
        before = Some(name);
    }
    let Some(&(_, last_end, _)) = spans.iter().max_by_key(|(_, e, _)| *e) else { return Ok(()) };
    let data_start = 8 + header.len() as u64;
    let Some(needed) = data_start.checked_add(last_end) else { return Ok(()) };
    let extent = |tensor: &str, s: u64, e: u64, problem: String| TraceError::Extent {
        tensor: tensor.to_string(),
        expected: data_start.saturating_add(s)..data_start.saturating_add(e),
        data_offsets: s..e,
        problem,
    };
    if file_len < needed {
        let &(s, e, name) = spans.iter().find(|(_, e, _)| data_start + e > file_len).expect("the last one runs past");
        let start = data_start + s;
        let there = if start < file_len {
            format!("only file bytes {start}..{file_len} of it are there")
        } else {
            "none of it is there".to_string()
        };
        return Err(extent(
            name,
            s,
            e,
            format!("but the file ends at byte {file_len}: {there} (truncated, or still being written?)"),
        ));
    }
    if file_len > needed {
        let &(s, e, name) = spans.iter().rev().find(|(_, e, _)| *e == last_end).expect("spans is not empty");
        return Err(extent(
            name,
            s,
            e,
            format!(
                "the last tensor, but the file goes on to byte {file_len}: file bytes {needed}..{file_len} belong to no \
                 tensor"
            ),
        ));
    }
    Ok(())
}

/// [`check_prefix`] then [`check_tensors`] on a whole file held in memory.
///
/// # Errors
/// As those two.
pub(crate) fn check_bytes(bytes: &[u8]) -> Result<()> {
    let n = header_len(bytes);
    check_prefix(bytes.len() as u64, n)?;
    let n = n.expect("checked by check_prefix");
    if n > MAX_HEADER {
        return Ok(());
    }
    check_tensors(bytes.len() as u64, &bytes[8..8 + n as usize])
}
