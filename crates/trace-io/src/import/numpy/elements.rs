//! Reading the id elements of a routing array: each checked and written layer-major.
//!
//! Chunk by chunk (about 1 MiB of rows): the elements are converted in bulk, without a branch
//! per element, while one flag accumulates whether any lies outside `0..E`; the converted rows
//! are checked by the trace's own id check ([`check::ids_ok`]: ids below E, distinct in a row).
//! Only a chunk that fails either is read a second time element by element, which handles
//! padding (-1) and names the first bad element.

use super::*;
use crate::check;

/// The ids read, layer-major, per output row whether it was all padding, and per layer index
/// the sum of its ids (padding left out).
pub(super) struct Raw {
    pub(super) ids: Vec<u16>,
    pub(super) padding_row: Vec<bool>,
    /// How many of `padding_row` are true.
    pub(super) padding_rows: usize,
    /// What `finish` compares with the sum that an equal use of the E experts gives, before it
    /// counts the experts of a layer (a whole count per element is a third of the import).
    pub(super) id_sums: Vec<u64>,
    /// Whether every chunk passed [`check::ids_ok`] (none held padding): the trace need not
    /// check the ids again.
    pub(super) ids_checked: bool,
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
    let rows = layers * tokens;
    let mut raw = Raw {
        ids: vec![0u16; rows * k],
        padding_row: vec![false; rows],
        padding_rows: 0,
        id_sums: vec![0u64; layers],
        ids_checked: true,
    };
    let mut seen = check::Seen::new();
    // stamp[e] = 1 + the last input row that used e: a repeat within a row is one compare.
    let mut stamp = vec![0u64; num_experts as usize];
    let row_bytes = k * N;
    let chunk_rows = ((1usize << 20) / row_bytes).max(1);
    let mut buf = vec![0u8; chunk_rows * row_bytes];
    // The converted rows of a chunk in input order, when that is not the output's (tlk).
    let mut rows_in = vec![0u16; if at.layout == Layout::Tlk { chunk_rows * k } else { 0 }];
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
        let fast = match at.layout {
            Layout::Ltk => {
                let dst = &mut raw.ids[done * k..(done + want) * k];
                let ok = in_range(elems, dst, num_experts, &dec)
                    && check::ids_ok(dst, k, k, num_experts as usize, &mut seen);
                if ok {
                    add_ltk_sums(&mut raw.id_sums, at, done, dst);
                }
                ok
            }
            Layout::Tlk => {
                let src = &mut rows_in[..want * k];
                let ok = in_range(elems, src, num_experts, &dec)
                    && check::ids_ok(src, k, k, num_experts as usize, &mut seen);
                if ok {
                    raw.scatter_tlk(at, done, src);
                }
                ok
            }
        };
        if !fast {
            raw.ids_checked = false;
            raw.rows_one_by_one(at, done, elems, num_experts, &mut stamp, &dec)?;
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
    Ok(raw)
}

/// Converts `elems` to `dst` (as `u16`, what an id in range is); whether every element was in
/// `0..E`. No branch per element: a flag or-ed over all.
#[inline(always)]
fn in_range<const N: usize>(
    elems: &[[u8; N]],
    dst: &mut [u16],
    num_experts: u32,
    dec: &impl Fn([u8; N]) -> i64,
) -> bool {
    let e_max = u64::from(num_experts);
    let mut out = false;
    for (d, &b) in dst.iter_mut().zip(elems) {
        let v = dec(b);
        out |= (v as u64) >= e_max;
        *d = v as u16;
    }
    !out
}

/// The sum of `ids`, summed in u32 over pieces too short to overflow it.
fn sum(ids: &[u16]) -> u64 {
    ids.chunks(1 << 16).map(|c| u64::from(c.iter().map(|&x| u32::from(x)).sum::<u32>())).sum()
}

/// Adds the ids of the rows from input row `first` on (layout ltk: output rows too) to their
/// layers' sums.
fn add_ltk_sums(id_sums: &mut [u64], at: &Where<'_>, first: usize, ids: &[u16]) {
    let (mut row, end) = (first, first + ids.len() / at.k);
    while row < end {
        let l = row / at.tokens;
        let stop = ((l + 1) * at.tokens).min(end);
        id_sums[l] += sum(&ids[(row - first) * at.k..(stop - first) * at.k]);
        row = stop;
    }
}

impl Raw {
    /// Writes the rows of `ids` (input rows from `first` on, layout tlk) to their output rows,
    /// adding each to its layer's sum.
    fn scatter_tlk(&mut self, at: &Where<'_>, first: usize, ids: &[u16]) {
        let k = at.k;
        let (mut l, mut t) = at.layer_token(first);
        for row in ids.chunks_exact(k) {
            let out = l * at.tokens + t;
            self.ids[out * k..(out + 1) * k].copy_from_slice(row);
            self.id_sums[l] += u64::from(row.iter().map(|&x| u32::from(x)).sum::<u32>());
            l += 1;
            if l == at.layers {
                (l, t) = (0, t + 1);
            }
        }
    }

    /// The rows of `elems` (input rows from `first` on) element by element: each id checked,
    /// padding (-1) rows noted, the first bad element named.
    fn rows_one_by_one<const N: usize>(
        &mut self,
        at: &Where<'_>,
        first: usize,
        elems: &[[u8; N]],
        num_experts: u32,
        stamp: &mut [u64],
        dec: &impl Fn([u8; N]) -> i64,
    ) -> std::result::Result<(), String> {
        let (k, layers, tokens) = (at.k, at.layers, at.tokens);
        let e_max = i64::from(num_experts);
        // (layer, token) of the chunk's first row, then advanced row by row (no division).
        let (mut l, mut t) = at.layer_token(first);
        for (i, row) in elems.chunks_exact(k).enumerate() {
            let r_in = first + i;
            let out = l * tokens + t;
            let dst = &mut self.ids[out * k..(out + 1) * k];
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
                    self.id_sums[l] += v as u64;
                    *d = e as u16;
                } else if v == -1 {
                    pad += 1;
                    *d = 0;
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
                self.padding_row[out] = true;
                self.padding_rows += 1;
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
        Ok(())
    }
}
