//! Content validation (SEMANTICS.md §1): what a command reads ([`Reads`]), checked before it
//! reads it.
//!
//! The fast path checks whole rows without a branch per element: ids by pairwise vector
//! compares when the prefix read is short (at most 16 of rows of at least 31), by a vectorized
//! maximum and each pair of a row compared when whole rows of at most 16 are read, else by a
//! vectorized maximum (range) and a stamp array (repeats), scores, gates and norms by vectorized comparisons
//! reduced to one flag per block of rows. Blocks run in parallel on the rayon pool; the first
//! failing block (in the order of the old sequential scan: tensor by tensor, in storage order)
//! is scanned a second time, element by element, only to name the first violation, so the
//! error is the one a plain scan finds, whatever the thread count.

use rayon::prelude::*;
use wide::{f32x8, u16x8};

use crate::error::ValueProblem;
use crate::view::{Shape, TraceParts};
use crate::{Result, TraceError};

/// The content of a trace a computation reads, and so what must be validated before it runs
/// (SEMANTICS.md §1).
///
/// `ids` is the number of leading ranks read per row (clamped to m where compared): those ids
/// must be `< E` and distinct within that prefix. `scores`, `gates` and `out_norms` say whether
/// that tensor is read (when the trace has it). Combine with [`Reads::union`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reads {
    /// Leading ranks of each row of `ids` read (`usize::MAX`: every candidate).
    pub ids: usize,
    /// Every score of every row (finite, non-increasing along the row).
    pub scores: bool,
    /// Every gate (finite, >= 0).
    pub gates: bool,
    /// Every output norm (finite, >= 0).
    pub out_norms: bool,
}

impl Reads {
    /// Nothing of the content (shapes and offsets are checked on open).
    pub const NOTHING: Reads = Reads { ids: 0, scores: false, gates: false, out_norms: false };
    /// Every tensor, every value: what `inspect`, the audit and the importers check.
    pub const EVERYTHING: Reads = Reads { ids: usize::MAX, scores: true, gates: true, out_norms: true };

    /// The first `ranks` ids of every row, nothing else.
    pub fn ids(ranks: usize) -> Reads {
        Reads { ids: ranks, ..Reads::NOTHING }
    }

    /// Every candidate id and every score (cache-aware routing, `inv_router`).
    pub fn ids_and_scores() -> Reads {
        Reads { ids: usize::MAX, scores: true, ..Reads::NOTHING }
    }

    /// What the saliency statistics read: the first k ids, the gates and the norms.
    pub fn stats(top_k: usize) -> Reads {
        Reads { ids: top_k, gates: true, out_norms: true, ..Reads::NOTHING }
    }

    /// What either reads.
    pub fn union(self, other: Reads) -> Reads {
        Reads {
            ids: self.ids.max(other.ids),
            scores: self.scores | other.scores,
            gates: self.gates | other.gates,
            out_norms: self.out_norms | other.out_norms,
        }
    }

    /// `self` clamped to what a trace of shape `s` with these tensors holds: ids to m, the flag
    /// of an absent tensor to `false` (nothing there to read or check).
    pub(crate) fn clamp(self, s: &Shape, parts: &TraceParts<'_>) -> Reads {
        Reads {
            ids: self.ids.min(s.candidates),
            scores: self.scores & parts.scores.is_some(),
            gates: self.gates & parts.gates.is_some(),
            out_norms: self.out_norms & parts.out_norms.is_some(),
        }
    }

    /// Whether validating `self` also validated `need` (both clamped to the same trace).
    pub(crate) fn covers(self, need: Reads) -> bool {
        self.ids >= need.ids
            && (self.scores | !need.scores)
            && (self.gates | !need.gates)
            && (self.out_norms | !need.out_norms)
    }
}

impl std::fmt::Display for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        match self.ids {
            0 => {}
            usize::MAX => parts.push("every id".to_string()),
            r => parts.push(format!("ids up to rank {r}")),
        }
        for (on, name) in [(self.scores, "scores"), (self.gates, "gates"), (self.out_norms, "out_norms")] {
            if on {
                parts.push(name.to_string());
            }
        }
        if parts.is_empty() { f.write_str("nothing") } else { f.write_str(&parts.join(", ")) }
    }
}

/// Rows per block of the parallel scan (a block of ids of m = 64 is 128 KiB).
const BLOCK_ROWS: usize = 1024;

/// Validates the content `need` asks for and `done` (both clamped) did not cover, in the order of
/// a plain scan: ids, scores, gates, norms.
///
/// # Errors
/// [`TraceError::Value`] for the first violation, as [`crate::TraceView::new`] documents.
pub(crate) fn check_content(
    shape: &Shape,
    layer_ids: &[u32],
    parts: &TraceParts<'_>,
    need: Reads,
    done: Reads,
) -> Result<()> {
    let Shape { tokens, candidates: m, top_k: k, num_experts, .. } = *shape;
    let namer = Namer { tokens, layer_ids };
    if need.ids > done.ids && m > 0 {
        check_ids(parts.ids, 0, m, need.ids, num_experts, &namer)?;
    }
    if let Some(scores) = parts.scores.filter(|_| need.scores && !done.scores && m > 0) {
        check_blocks(scores, m, |b| scores_ok(b, m), |b, first| name_scores(b, m, first, &namer))?;
    }
    for (tensor, data, want) in [
        ("gates", parts.gates, need.gates && !done.gates),
        ("out_norms", parts.out_norms, need.out_norms && !done.out_norms),
    ] {
        let Some(data) = data.filter(|_| want && k > 0) else { continue };
        check_blocks(data, k, nonneg_ok, |b, first| name_nonneg(tensor, b, k, first, &namer))?;
    }
    Ok(())
}

/// Builds the [`TraceError::Value`] of a position.
struct Namer<'a> {
    tokens: usize,
    layer_ids: &'a [u32],
}

impl Namer<'_> {
    fn err(&self, tensor: &'static str, row: usize, slot: usize, problem: ValueProblem) -> TraceError {
        let t = self.tokens.max(1);
        TraceError::Value { tensor, layer: row / t, layer_id: self.layer_ids[row / t], token: row % t, slot, problem }
    }
}

/// Runs `ok` over blocks of [`BLOCK_ROWS`] rows of `width` values in parallel; names the first
/// failing block's first violation with `name(block, first_row)`.
fn check_blocks<T: Sync>(
    data: &[T],
    width: usize,
    ok: impl Fn(&[T]) -> bool + Sync,
    name: impl Fn(&[T], usize) -> TraceError,
) -> Result<()> {
    let len = BLOCK_ROWS * width;
    match data.par_chunks(len).position_first(|b| !ok(b)) {
        None => Ok(()),
        Some(i) => Err(name(&data[i * len..((i + 1) * len).min(data.len())], i * BLOCK_ROWS)),
    }
}

/// The ids of every row, up to rank `ranks`: each `< E`, none repeated within the prefix. `ids`
/// are whole rows of the tensor from row `first_row` on (what an error names).
fn check_ids(
    ids: &[u16],
    first_row: usize,
    m: usize,
    ranks: usize,
    num_experts: usize,
    namer: &Namer<'_>,
) -> Result<()> {
    let r = ranks.min(m);
    let len = BLOCK_ROWS * m;
    let first = match ShortPrefix::new(m, r, num_experts) {
        Some(short) => ids.par_chunks(len).position_first(|b| !short.block_ok(b, m)),
        None => ids
            .par_chunks(len)
            .map_init(Seen::new, |seen, b| ids_ok(b, m, r, num_experts, seen))
            .position_first(|ok| !ok),
    };
    let Some(i) = first else { return Ok(()) };
    let block = &ids[i * len..((i + 1) * len).min(ids.len())];
    Err(name_ids(block, m, r, num_experts, first_row + i * BLOCK_ROWS, namer))
}

/// Checks every id of the rows of `ids` (whole rows of the tensor from row `first_row` on, a
/// layer for the usage summary) as [`check_content`] does, and copies each row's first k ids
/// into `used` (k per row, as many rows), block by block while the block is in cache: what the
/// usage summary reads next, without reading the mapped rows a second time.
///
/// # Errors
/// [`TraceError::Value`] for the first violation (the one a plain scan in storage order finds);
/// `used` is then partly written.
pub(crate) fn check_ids_copy(
    ids: &[u16],
    first_row: usize,
    shape: &Shape,
    layer_ids: &[u32],
    used: &mut [u16],
) -> Result<()> {
    let Shape { tokens, candidates: m, top_k: k, num_experts, .. } = *shape;
    let namer = Namer { tokens, layer_ids };
    if m == 0 {
        return Ok(());
    }
    if k == 0 {
        return check_ids(ids, first_row, m, m, num_experts, &namer);
    }
    let first = ids
        .par_chunks(BLOCK_ROWS * m)
        .zip(used.par_chunks_mut(BLOCK_ROWS * k))
        .map_init(Seen::new, |seen, (b, u)| {
            let ok = ids_ok(b, m, m, num_experts, seen);
            for (j, row) in b.chunks_exact(m).enumerate() {
                copy_ids(u, j * k, row, k);
            }
            ok
        })
        .position_first(|ok| !ok);
    let Some(i) = first else { return Ok(()) };
    let len = BLOCK_ROWS * m;
    let block = &ids[i * len..((i + 1) * len).min(ids.len())];
    Err(name_ids(block, m, m, num_experts, first_row + i * BLOCK_ROWS, &namer))
}

/// Copies the first `k` ids of `src` to `dst[at..at + k]`. With at least 16 ids on both sides it
/// copies 16 (a fixed-size copy the compiler inlines as two vector moves, where a copy of k ids is
/// a call): the ids past k are overwritten by the next row's copy, or lie past the rows copied.
#[inline(always)]
pub(crate) fn copy_ids(dst: &mut [u16], at: usize, src: &[u16], k: usize) {
    const WIDE: usize = 16;
    match (dst.get_mut(at..at + WIDE), src.get(..WIDE)) {
        (Some(d), Some(s)) if k <= WIDE => d.copy_from_slice(s),
        _ => dst[at..at + k].copy_from_slice(&src[..k]),
    }
}

/// Per-thread stamps of the ids seen in the current row: `at[id] == stamp`.
pub(crate) struct Seen {
    at: Box<[u32; 1 << 16]>,
    stamp: u32,
}

impl Seen {
    pub(crate) fn new() -> Seen {
        Seen { at: vec![0u32; 1 << 16].into_boxed_slice().try_into().expect("length 2^16"), stamp: 0 }
    }

    /// A stamp for a new row (never one already stored).
    fn next(&mut self) -> u32 {
        if self.stamp == u32::MAX {
            self.at.fill(0);
            self.stamp = 0;
        }
        self.stamp += 1;
        self.stamp
    }
}

/// Whether every row of `block` (whole rows of `m` ids) has its first `r` ids below
/// `num_experts` and distinct: the id rule, also applied by the numpy importer to the ids it
/// converts. Rows of at most 16 ids read whole by [`short_rows_ok`], others by [`stamps_ok`].
pub(crate) fn ids_ok(block: &[u16], m: usize, r: usize, num_experts: usize, seen: &mut Seen) -> bool {
    // One monomorphized loop per row length: the pairs unrolled.
    macro_rules! short {
        ($($n:literal)*) => {
            match m {
                $($n if r >= $n => short_rows_ok::<$n>(block, num_experts),)*
                _ => stamps_ok(block, m, r, num_experts, seen),
            }
        };
    }
    short!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// [`ids_ok`] for rows of `M` ids read whole: a vectorized maximum over the block, and each pair
/// of a row compared, without a branch or a store per id.
fn short_rows_ok<const M: usize>(block: &[u16], num_experts: usize) -> bool {
    let max = block.iter().fold(0u16, |a, &b| a.max(b));
    let (rows, _) = block.as_chunks::<M>();
    let mut repeated = false;
    for row in rows {
        for i in 0..M {
            for j in i + 1..M {
                repeated |= row[i] == row[j];
            }
        }
    }
    usize::from(max) < num_experts && !repeated
}

/// [`ids_ok`] for any rows. No branch per id: a vectorized maximum, and the stamps written and
/// compared in one pass.
fn stamps_ok(block: &[u16], m: usize, r: usize, num_experts: usize, seen: &mut Seen) -> bool {
    let mut bad = false;
    for row in block.chunks_exact(m) {
        let prefix = &row[..r];
        let max = prefix.iter().fold(0u16, |a, &b| a.max(b));
        let stamp = seen.next();
        let mut repeated = false;
        for &id in prefix {
            let slot = &mut seen.at[usize::from(id)];
            repeated |= *slot == stamp;
            *slot = stamp;
        }
        bad |= (usize::from(max) >= num_experts) | repeated;
    }
    !bad
}

/// Lanes of [`ShortPrefix`]: one row's first ids in two SSE2 vectors.
const LANES: usize = 16;

/// The id check of short prefixes (what a λ = 0 replay reads: r <= 16 ids of rows of m >= 31)
/// without a store per id: for each distance s = 1..r, the row's first 8 ids (and, for s < r − 8,
/// its next 8) compared with the 8 that start s further (both loaded from the row itself),
/// masked to the pairs inside the prefix (i + s < r); and the first r ids compared with E. The same verdict per block as
/// [`ids_ok`] (unit test `short_prefix_agrees_with_stamps`).
#[derive(Clone, Copy)]
struct ShortPrefix {
    /// r: the prefix length.
    r: usize,
    /// `pairs[s]`, lanes 0..8 and 8..16: all ones in lane i when i + s < r (lane i and lane
    /// i + s are both in the prefix).
    pairs: [[u16x8; 2]; LANES],
    /// All ones in the lanes below r, lanes 0..8 and 8..16.
    keep: [u16x8; 2],
    /// E in every lane, at most 65,535 (E = 65,536 does not fit a lane: the stamp form runs).
    limit: u16x8,
}

impl ShortPrefix {
    /// The check for prefixes of `r` ids of rows of `m`, when it applies.
    fn new(m: usize, r: usize, num_experts: usize) -> Option<ShortPrefix> {
        if m < 2 * LANES - 1 || r > LANES {
            return None;
        }
        let limit = u16x8::splat(u16::try_from(num_experts).ok()?);
        let lanes = |on: &dyn Fn(usize) -> bool| -> [u16x8; 2] {
            let bits: [u16; LANES] = std::array::from_fn(|i| if on(i) { u16::MAX } else { 0 });
            [u16s(&bits[..8]), u16s(&bits[8..])]
        };
        let pairs = std::array::from_fn(|s| lanes(&|i| s > 0 && i + s < r));
        Some(ShortPrefix { r, pairs, keep: lanes(&|i| i < r), limit })
    }

    /// Whether every row of `block` (rows of `m`) has its first r ids below E and distinct:
    /// lane masks or-ed over the whole block, one test at the end.
    fn block_ok(&self, block: &[u16], m: usize) -> bool {
        let mut bad = u16x8::splat(0);
        for row in block.chunks_exact(m) {
            let (lo, hi) = (u16s(&row[..8]), u16s(&row[8..LANES]));
            bad |= (lo & self.keep[0]).simd_ge(self.limit) | (hi & self.keep[1]).simd_ge(self.limit);
            // Pairs (i, i + s) with i >= 8 exist only for s < r - 8.
            for s in 1..self.r.saturating_sub(8) {
                bad |= hi.simd_eq(u16s(&row[s + 8..s + LANES])) & self.pairs[s][1];
            }
            for s in 1..self.r {
                bad |= lo.simd_eq(u16s(&row[s..s + 8])) & self.pairs[s][0];
            }
        }
        bad.to_bitmask() == 0
    }
}

/// Eight ids as a vector (`c` has eight).
#[inline(always)]
fn u16s(c: &[u16]) -> u16x8 {
    u16x8::from(<[u16; 8]>::try_from(c).unwrap_or_default())
}

/// The first violation of a block that [`ids_ok`] refused (plain scan).
fn name_ids(block: &[u16], m: usize, r: usize, num_experts: usize, first_row: usize, namer: &Namer<'_>) -> TraceError {
    let mut seen = vec![usize::MAX; num_experts];
    for (j, row) in block.chunks_exact(m).enumerate() {
        for (slot, &id) in row[..r].iter().enumerate() {
            let e = usize::from(id);
            if e >= num_experts {
                let problem = ValueProblem::IdOutOfRange { id, num_experts: num_experts as u32 };
                return namer.err("ids", first_row + j, slot, problem);
            }
            if seen[e] == j {
                return namer.err("ids", first_row + j, slot, ValueProblem::RepeatedId { id });
            }
            seen[e] = j;
        }
    }
    unreachable_block("ids")
}

/// Whether every score of `block` is finite and no score exceeds the one before it in its row.
fn scores_ok(block: &[f32], m: usize) -> bool {
    // NaN differs from itself and fails `<`; ±inf equals the bound.
    let inf = f32x8::splat(f32::INFINITY);
    if m > 8 {
        return scores_ok_rows(block, m);
    }
    let mut bad = any_lanes(block, |v| v.abs().simd_ge(inf) | v.simd_ne(v), |v| !v.is_finite());
    for row in block.chunks_exact(m) {
        bad |= any_pairs(&row[..m - 1], &row[1..], |a, b| b.simd_gt(a), |a, b| b > a);
    }
    !bad
}

/// [`scores_ok`] for rows of m > 8 in one pass per row, without a scalar tail: the pairs
/// (i, i + 1) eight at a time, the last eight pairs of the row overlapping the ones before
/// (checked twice, the same verdict), every value checked finite by the same loads (the
/// first elements of the pairs, and the last eight values); flags or-ed over the block (whole
/// rows, as [`check_blocks`] cuts them).
fn scores_ok_rows(block: &[f32], m: usize) -> bool {
    let inf = f32x8::splat(f32::INFINITY);
    let not_finite = |v: f32x8| v.abs().simd_ge(inf) | v.simd_ne(v);
    let (mut bad, full) = (f32x8::splat(0.0), (m - 1) / 8 * 8);
    for row in block.chunks_exact(m) {
        for i in (0..full).step_by(8) {
            let (x, y) = (lanes(&row[i..i + 8]), lanes(&row[i + 1..i + 9]));
            bad |= y.simd_gt(x) | not_finite(x);
        }
        let (x, y) = (lanes(&row[m - 9..m - 1]), lanes(&row[m - 8..]));
        bad |= y.simd_gt(x) | not_finite(y);
    }
    bad.to_bitmask() == 0
}

/// Eight values as a vector (`c` has eight).
#[inline(always)]
fn lanes(c: &[f32]) -> f32x8 {
    f32x8::from(<[f32; 8]>::try_from(c).unwrap_or_default())
}

/// Whether `bad` (a lane mask; `one` for a single value) holds for any value of `data`, with
/// vector compares and ors, without a branch per value.
#[inline(always)]
fn any_lanes(data: &[f32], bad: impl Fn(f32x8) -> f32x8, one: impl Fn(f32) -> bool) -> bool {
    let chunks = data.chunks_exact(8);
    let tail = chunks.remainder().iter().any(|&v| one(v));
    let acc = chunks.fold(f32x8::splat(0.0), |acc, c| acc | bad(lanes(c)));
    tail | (acc.to_bitmask() != 0)
}

/// Whether `bad(a[i], b[i])` (a lane mask; `one` for a single pair) holds for any i (`a` and `b`
/// of one length), with vector compares and ors.
#[inline(always)]
fn any_pairs(a: &[f32], b: &[f32], bad: impl Fn(f32x8, f32x8) -> f32x8, one: impl Fn(f32, f32) -> bool) -> bool {
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail = ca.remainder().iter().zip(cb.remainder()).any(|(&x, &y)| one(x, y));
    let acc = ca.zip(cb).fold(f32x8::splat(0.0), |acc, (x, y)| acc | bad(lanes(x), lanes(y)));
    tail | (acc.to_bitmask() != 0)
}

/// The first violation of a block of scores that [`scores_ok`] refused (plain scan).
fn name_scores(block: &[f32], m: usize, first_row: usize, namer: &Namer<'_>) -> TraceError {
    for (j, row) in block.chunks_exact(m).enumerate() {
        let mut prev = f32::INFINITY;
        for (slot, &v) in row.iter().enumerate() {
            if !v.is_finite() {
                return namer.err("scores", first_row + j, slot, ValueProblem::NotFinite { value: v });
            }
            if v > prev {
                return namer.err("scores", first_row + j, slot, ValueProblem::Increasing { previous: prev, value: v });
            }
            prev = v;
        }
    }
    unreachable_block("scores")
}

/// Whether every value of `block` is finite and >= 0 (-0 included).
fn nonneg_ok(block: &[f32]) -> bool {
    let (zero, inf) = (f32x8::splat(0.0), f32x8::splat(f32::INFINITY));
    // NaN differs from itself and fails both comparisons.
    !any_lanes(block, |v| v.simd_lt(zero) | v.simd_ge(inf) | v.simd_ne(v), |v| !v.is_finite() | (v < 0.0))
}

/// The first violation of a block of gates or norms that [`nonneg_ok`] refused (plain scan).
fn name_nonneg(tensor: &'static str, block: &[f32], k: usize, first_row: usize, namer: &Namer<'_>) -> TraceError {
    for (pos, &v) in block.iter().enumerate() {
        let (row, slot) = (first_row + pos / k, pos % k);
        if !v.is_finite() {
            return namer.err(tensor, row, slot, ValueProblem::NotFinite { value: v });
        }
        if v < 0.0 {
            return namer.err(tensor, row, slot, ValueProblem::Negative { value: v });
        }
    }
    unreachable_block(tensor)
}

/// The fast check refused a block the plain scan accepts: the two disagree, a bug of this file.
fn unreachable_block(tensor: &'static str) -> TraceError {
    TraceError::Container(format!("internal error: the fast and the plain check of `{tensor}` disagree"))
}

/// Checks `seq_offsets` or `step_offsets`: start at 0, strictly increasing, below the token count.
///
/// # Errors
/// [`TraceError::Offsets`] for the first bad entry.
pub(crate) fn check_offsets(tensor: &'static str, offs: &[u64], tokens: usize) -> Result<()> {
    for (i, &v) in offs.iter().enumerate() {
        let reason = if i == 0 && v != 0 {
            "the first offset must be 0"
        } else if i > 0 && v <= offs[i - 1] {
            "offsets must be strictly increasing"
        } else if v >= tokens as u64 {
            "offset is not below the token count"
        } else {
            continue;
        };
        return Err(TraceError::Offsets { tensor, index: i, value: v, reason });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A block of `rows` rows of `m` ids from `seed`: mostly distinct ids below `e`, with
    /// repeats, ids >= E and values near `u16::MAX` planted at random positions.
    fn block(rows: usize, m: usize, e: usize, seed: u64) -> Vec<u16> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut ids = Vec::with_capacity(rows * m);
        for _ in 0..rows {
            let start = next() as usize % e;
            ids.extend((0..m).map(|j| ((start + j) % e) as u16));
        }
        for _ in 0..(next() % 3) {
            let at = next() as usize % ids.len();
            ids[at] = match next() % 3 {
                0 => ids[at - at % m + (next() as usize % m)],
                1 => (e + (next() as usize % 4)).min(0xFFFF) as u16,
                _ => 0xFFF0 + (next() % 16) as u16,
            };
        }
        ids
    }

    /// The short-prefix check and the stamp check give the same verdict on every block, for
    /// every prefix length it serves and E up to its limit.
    #[test]
    fn short_prefix_agrees_with_stamps() {
        let mut seen = Seen::new();
        let (mut refused, mut cases) = (0, 0);
        for (m, e) in [(31, 31), (31, 40), (40, 512), (64, 512), (64, 65_535)] {
            for r in 1..=LANES {
                for seed in 0..40 {
                    let b = block(50, m, e, seed * 131 + r as u64);
                    let short = ShortPrefix::new(m, r, e).expect("the short form applies");
                    let want = stamps_ok(&b, m, r, e, &mut seen);
                    assert_eq!(short.block_ok(&b, m), want, "m {m}, E {e}, r {r}, seed {seed}");
                    refused += usize::from(!want);
                    cases += 1;
                }
            }
        }
        assert!(refused > cases / 10 && refused < cases, "both verdicts occur ({refused} of {cases})");
    }

    /// The whole-row check of short rows and the stamp check give the same verdict on every
    /// block, for every row length it serves.
    #[test]
    fn short_rows_agree_with_stamps() {
        let mut seen = Seen::new();
        let (mut refused, mut cases) = (0, 0);
        for m in 1..=16 {
            for e in [m, m + 3, 128, 65_535] {
                for seed in 0..40 {
                    let b = block(50, m, e, seed * 17 + m as u64);
                    let want = stamps_ok(&b, m, m, e, &mut seen);
                    assert_eq!(ids_ok(&b, m, m, e, &mut seen), want, "m {m}, E {e}, seed {seed}");
                    refused += usize::from(!want);
                    cases += 1;
                }
            }
        }
        assert!(refused > cases / 10 && refused < cases, "both verdicts occur ({refused} of {cases})");
    }

    /// The one-pass score check of rows of m > 8 gives the plain verdict (every value finite, none
    /// above the one before it in its row) on blocks with NaN, infinities and rises planted
    /// anywhere, for row lengths around the vector width.
    #[test]
    fn score_rows_agree_with_the_plain_scan() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut refused, mut cases) = (0, 0);
        for m in [9, 10, 15, 16, 17, 24, 31, 64] {
            for _ in 0..300 {
                let rows = 1 + (next() % 20) as usize;
                let mut b: Vec<f32> = (0..rows * m).map(|i| -((i % m) as f32) * 0.5).collect();
                for _ in 0..(next() % 3) {
                    let at = next() as usize % b.len();
                    b[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 100.0, -100.0, b[at] + 0.25]
                        [(next() % 6) as usize];
                }
                let plain = b
                    .chunks_exact(m)
                    .all(|row| row.iter().all(|v| v.is_finite()) && row.windows(2).all(|w| w[1] <= w[0]));
                assert_eq!(scores_ok(&b, m), plain, "m {m}: {b:?}");
                refused += usize::from(!plain);
                cases += 1;
            }
        }
        assert!(refused > cases / 5 && refused < cases, "both verdicts occur ({refused} of {cases})");
    }

    /// Where the short form does not apply: rows below 31 ids, prefixes above 16, E = 65,536.
    #[test]
    fn short_prefix_applies_only_where_exact() {
        for (m, r, e, applies) in
            [(31, 16, 65_535, true), (30, 8, 64, false), (64, 17, 512, false), (64, 10, 65_536, false)]
        {
            assert_eq!(ShortPrefix::new(m, r, e).is_some(), applies, "m {m}, r {r}, E {e}");
        }
    }
}
