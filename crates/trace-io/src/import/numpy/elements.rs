//! Reading the id elements of a routing array: each checked and written layer-major.

use super::*;

/// The ids read, layer-major, and per output row whether it was all padding, with each layer's
/// expert counts.
pub(super) struct Raw {
    pub(super) ids: Vec<u16>,
    pub(super) padding_row: Vec<bool>,
    pub(super) counts: Vec<u64>,
}

/// Reads the element data after the header from `r`, checks each id and writes it layer-major.
pub(super) fn read_ids(
    r: impl Read,
    int: IntType,
    at: &Where<'_>,
    num_experts: u32,
) -> std::result::Result<Raw, String> {
    // One monomorphized loop per element type and byte order.
    macro_rules! go {
        ($t:ty, $n:literal, $to:expr) => {
            if int.big {
                convert::<$n>(r, at, num_experts, |b| $to(<$t>::from_be_bytes(b)))
            } else {
                convert::<$n>(r, at, num_experts, |b| $to(<$t>::from_le_bytes(b)))
            }
        };
    }
    match (int.size, int.signed) {
        (1, true) => go!(i8, 1, i64::from),
        (1, false) => go!(u8, 1, i64::from),
        (2, true) => go!(i16, 2, i64::from),
        (2, false) => go!(u16, 2, i64::from),
        (4, true) => go!(i32, 4, i64::from),
        (4, false) => go!(u32, 4, i64::from),
        (8, true) => go!(i64, 8, |v: i64| v),
        // A u64 above i64::MAX saturates: it is out of range either way.
        _ => go!(u64, 8, |v: u64| i64::try_from(v).unwrap_or(i64::MAX)),
    }
}

/// Reads until `buf` is full or the input ends; the bytes read.
pub(super) fn fill(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(got) => n += got,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

pub(super) fn convert<const N: usize>(
    mut r: impl Read,
    at: &Where<'_>,
    num_experts: u32,
    dec: impl Fn([u8; N]) -> i64,
) -> std::result::Result<Raw, String> {
    let (k, layers, tokens) = (at.k, at.layers, at.tokens);
    let e_max = i64::from(num_experts);
    let rows = layers * tokens;
    let mut ids = vec![0u16; rows * k];
    let mut padding_row = vec![false; rows];
    let mut counts = vec![0u64; layers * num_experts as usize];
    // stamp[e] = 1 + the last input row that used e: a repeat within a row is one compare.
    let mut stamp = vec![0u64; num_experts as usize];
    let row_bytes = k * N;
    let chunk_rows = ((1usize << 20) / row_bytes).max(1);
    let mut buf = vec![0u8; chunk_rows * row_bytes];
    let mut done = 0;
    while done < rows {
        let want = chunk_rows.min(rows - done);
        let got = fill(&mut r, &mut buf[..want * row_bytes]).map_err(|e| format!("array `{}`: {e}", at.name))?;
        if got < want * row_bytes {
            let have = (done * row_bytes + got) as u64;
            return Err(format!(
                "array `{}`: truncated: its shape needs {} bytes of data, the file holds {have} (it ends inside {})",
                at.name,
                (rows * row_bytes) as u64,
                at.element(done + got / row_bytes, (got % row_bytes) / N, N)
            ));
        }
        let (elems, _) = buf[..want * row_bytes].as_chunks::<N>();
        // (layer, token) of the chunk's first row, then advanced row by row (no division).
        let (mut l, mut t) = at.layer_token(done);
        for (i, row) in elems.chunks_exact(k).enumerate() {
            let r_in = done + i;
            let out = l * tokens + t;
            let dst = &mut ids[out * k..(out + 1) * k];
            let layer_counts = &mut counts[l * num_experts as usize..(l + 1) * num_experts as usize];
            let mut pad = 0;
            let tag = r_in as u64 + 1;
            for (s, (&b, d)) in row.iter().zip(dst.iter_mut()).enumerate() {
                let v = dec(b);
                // One compare for the common case: 0 <= v < E.
                if (v as u64) < e_max as u64 {
                    let e = v as usize;
                    if stamp[e] == tag {
                        return Err(format!("{}: expert id {v} repeated in the row", at.element(r_in, s, N)));
                    }
                    stamp[e] = tag;
                    layer_counts[e] += 1;
                    *d = e as u16;
                } else if v == -1 {
                    pad += 1;
                } else {
                    return Err(format!(
                        "{}: expert id {v} {}",
                        at.element(r_in, s, N),
                        if v < 0 {
                            "is negative (only -1, padding, may be)".to_string()
                        } else {
                            format!("is >= num_experts {num_experts}: is the expert count right?")
                        }
                    ));
                }
            }
            if pad == k {
                padding_row[out] = true;
            } else if pad > 0 {
                return Err(format!(
                    "{}: {} ids and {pad} padding slots (-1): a row with fewer than k = {k} ids; every row of a \
                     trace has the same k, so rows of mixed k are refused",
                    at.element(r_in, 0, N).replace(", 0] (", "] (").replace(", slot 0", ""),
                    k - pad
                ));
            }
            match at.layout {
                Layout::Ltk => {
                    t += 1;
                    if t == tokens {
                        (l, t) = (l + 1, 0);
                    }
                }
                Layout::Tlk => {
                    l += 1;
                    if l == layers {
                        (l, t) = (0, t + 1);
                    }
                }
            }
        }
        done += want;
    }
    // Read to the end: a zip entry checks its CRC there, and bytes past the array are not numpy's.
    let mut rest = [0u8; 1];
    match fill(&mut r, &mut rest) {
        Ok(0) => {}
        Ok(_) => return Err(format!("array `{}`: bytes past the end of the data its shape gives", at.name)),
        Err(e) => return Err(format!("array `{}`: {e}", at.name)),
    }
    Ok(Raw { ids, padding_row, counts })
}
