//! The part the runtime-dump importers (`sglang-dump`, `routed-experts`) share: blocks of integer
//! expert ids (one per forward pass, or one per response), each `[layers, tokens, slots]` or
//! `[tokens, layers, slots]`, with the padding conventions SGLang and vLLM use, reduced to the
//! trace's layer-major `u16` ids.
//!
//! - A **blank row** (one (layer, token) whose slots were never written): every slot `-1` (SGLang's
//!   recorder resets its buffer to -1), or every slot `0` with two slots or more (a zero-initialized
//!   capture buffer; a routed row never repeats an id).
//! - **Padding columns**: slots that are `-1` in every row that is not blank (SGLang's recorder keeps
//!   8 columns whatever the model's top-k). k = 1 + the last column holding an id.
//! - **Unrouted layers**: layers whose every row is blank (dense layers, which never route) are
//!   dropped; the others keep their index as the layer id.
//! - **Padding tokens**: tokens blank in every routed layer (padded or dummy tokens) are dropped; a
//!   token blank in some routed layers only is refused, as is a row with a `-1` among its first k
//!   slots (mixed k), any id below -1, and an id repeated in a row (after the id map).

/// Axis order of a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Axes {
    /// `[layers, tokens, slots]`.
    Ltk,
    /// `[tokens, layers, slots]`.
    Tlk,
}

/// One block of ids, as read.
pub(crate) struct Block {
    /// The ids, in the block's axis order.
    pub ids: Vec<i64>,
    /// Tokens of the block.
    pub tokens: usize,
    /// Where the block is, for errors (`records[3].topk_ids_of_layer`).
    pub name: String,
}

/// What [`reduce`] made of the blocks.
pub(crate) struct Reduced {
    /// Layer-major ids of the routed layers and kept tokens, `[layers, tokens, k]`.
    pub ids: Vec<u16>,
    /// k: the slots holding ids.
    pub k: usize,
    /// The slots every block has (k plus the padding columns).
    pub slots: usize,
    /// Indices (in the blocks' layer axis) of the routed layers.
    pub layers: Vec<usize>,
    /// Indices of the layers dropped because no row of theirs is routed.
    pub unrouted_layers: Vec<usize>,
    /// Per block and token, whether the token is kept (false: padding in every routed layer).
    pub keep: Vec<Vec<bool>>,
    /// Blank rows (-1 everywhere) and zero rows seen, over every layer.
    pub blank_rows: u64,
    /// Blank rows that are zeros rather than -1.
    pub zero_rows: u64,
}

/// Reduces `blocks` of `layers` x `slots` (axis order `axes`) to the trace's ids; `map(layer, id)`
/// turns a recorded id (>= 0) into the expert id (checks its range); `Err` is the message of the
/// importer's error, naming the block and the element.
pub(crate) fn reduce(
    blocks: &[Block],
    axes: Axes,
    layers: usize,
    slots: usize,
    mut map: impl FnMut(usize, i64) -> Result<u16, String>,
) -> Result<Reduced, String> {
    let at = |b: &Block, l: usize, t: usize| -> usize {
        match axes {
            Axes::Ltk => (l * b.tokens + t) * slots,
            Axes::Tlk => (t * layers + l) * slots,
        }
    };
    let idx = |b: &Block, l: usize, t: usize, s: usize| -> String {
        let (i0, i1) = match axes {
            Axes::Ltk => (l, t),
            Axes::Tlk => (t, l),
        };
        format!("{}[{i0}, {i1}, {s}] (layer index {l}, token {t}, slot {s})", b.name)
    };
    let blank = |row: &[i64]| row.iter().all(|&x| x == -1) || (row.len() >= 2 && row.iter().all(|&x| x == 0));
    // Pass 1: ids below -1, the last column used, routed layers.
    let mut last_col = None::<usize>;
    let mut routed = vec![false; layers];
    let (mut blank_rows, mut zero_rows) = (0u64, 0u64);
    for b in blocks {
        for (l, routed_l) in routed.iter_mut().enumerate() {
            for t in 0..b.tokens {
                let p = at(b, l, t);
                let row = &b.ids[p..p + slots];
                if let Some(s) = row.iter().position(|&x| x < -1) {
                    return Err(format!(
                        "{}: id {} (negative ids other than -1, the padding, are not ids)",
                        idx(b, l, t, s),
                        row[s]
                    ));
                }
                if blank(row) {
                    blank_rows += 1;
                    zero_rows += u64::from(row[0] == 0);
                    continue;
                }
                *routed_l = true;
                if let Some(s) = row.iter().rposition(|&x| x != -1) {
                    last_col = Some(last_col.map_or(s, |c: usize| c.max(s)));
                }
            }
        }
    }
    let Some(last) = last_col else {
        return Err(format!(
            "every row of every layer is padding (-1, or unwritten zeros): no routing was recorded ({} rows)",
            blank_rows
        ));
    };
    let k = last + 1;
    let kept_layers: Vec<usize> = (0..layers).filter(|&l| routed[l]).collect();
    let unrouted_layers: Vec<usize> = (0..layers).filter(|&l| !routed[l]).collect();
    // Pass 2: padding tokens, mixed k, ids through the map, repeats.
    let mut keep: Vec<Vec<bool>> = Vec::with_capacity(blocks.len());
    for b in blocks {
        let mut kb = vec![true; b.tokens];
        for (t, kt) in kb.iter_mut().enumerate() {
            let blanks: Vec<usize> = kept_layers
                .iter()
                .copied()
                .filter(|&l| {
                    let p = at(b, l, t);
                    blank(&b.ids[p..p + slots])
                })
                .collect();
            if blanks.len() == kept_layers.len() {
                *kt = false;
            } else if let Some(&l) = blanks.first() {
                return Err(format!(
                    "{}: token {t} is padding in {} of {} routed layers (the first: layer index {l}) and routed in \
                     the others: a token passes every MoE layer",
                    b.name,
                    blanks.len(),
                    kept_layers.len()
                ));
            }
        }
        keep.push(kb);
    }
    let total: usize = keep.iter().map(|kb| kb.iter().filter(|&&x| x).count()).sum();
    if total == 0 {
        return Err("every token is padding (-1 in every routed layer): no tokens".into());
    }
    let mut ids = Vec::with_capacity(kept_layers.len() * total * k);
    let mut row_ids: Vec<u16> = Vec::with_capacity(k);
    for &l in &kept_layers {
        for (b, kb) in blocks.iter().zip(&keep) {
            for t in (0..b.tokens).filter(|&t| kb[t]) {
                let p = at(b, l, t);
                row_ids.clear();
                for s in 0..k {
                    let x = b.ids[p + s];
                    if x == -1 {
                        return Err(format!(
                            "{}: -1 among the row's {k} ids (mixed k: this row holds fewer experts than others); \
                             the trace has one k",
                            idx(b, l, t, s)
                        ));
                    }
                    let e = map(l, x).map_err(|m| format!("{}: {m}", idx(b, l, t, s)))?;
                    if row_ids.contains(&e) {
                        return Err(format!("{}: expert {e} repeated in the row", idx(b, l, t, s)));
                    }
                    row_ids.push(e);
                }
                ids.extend_from_slice(&row_ids);
            }
        }
    }
    Ok(Reduced { ids, k, slots, layers: kept_layers, unrouted_layers, keep, blank_rows, zero_rows })
}

impl Reduced {
    /// Kept tokens of each block.
    pub fn kept(&self) -> Vec<usize> {
        self.keep.iter().map(|kb| kb.iter().filter(|&&x| x).count()).collect()
    }

    /// Tokens dropped as padding, over every block.
    pub fn dropped(&self) -> usize {
        self.keep.iter().map(|kb| kb.iter().filter(|&&x| !x).count()).sum()
    }

    /// The report entry of the padding tokens dropped (each a record in every routed layer), or
    /// `None` when none was; `detail` says what padding looked like in this runtime's dump.
    pub fn padding_dropped(&self, detail: &str) -> Option<super::Dropped> {
        let tokens = self.dropped();
        (tokens > 0).then(|| super::Dropped {
            reason: super::DropReason::Padding,
            records: (tokens * self.layers.len()) as u64,
            tokens: tokens as u64,
            detail: detail.into(),
        })
    }
}

/// `0, 1, 2, 5, 6` as `0..=2, 5..=6`.
pub(crate) fn ranges(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j { v[i].to_string() } else { format!("{}..={}", v[i], v[j]) });
        i = j + 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(ids: &[i64], tokens: usize) -> Block {
        Block { ids: ids.to_vec(), tokens, name: "b".into() }
    }

    fn plain(_: usize, x: i64) -> Result<u16, String> {
        u16::try_from(x)
            .map_err(|_| "too big".into())
            .and_then(|e| if e < 4 { Ok(e) } else { Err(format!("id {e} >= 4")) })
    }

    #[test]
    fn padding_columns_dense_layers_and_padding_tokens() {
        // ltk, 3 layers (layer 0 never written), 3 tokens (token 1 padding), 4 slots (2 padding).
        let ids = [
            [-1, -1, -1, -1],
            [-1, -1, -1, -1],
            [-1, -1, -1, -1], // layer 0
            [0, 1, -1, -1],
            [-1, -1, -1, -1],
            [2, 3, -1, -1], // layer 1
            [3, 2, -1, -1],
            [-1, -1, -1, -1],
            [1, 0, -1, -1], // layer 2
        ]
        .concat();
        let r = reduce(&[block(&ids, 3)], Axes::Ltk, 3, 4, plain).unwrap();
        assert_eq!((r.k, r.layers.clone(), r.unrouted_layers.clone()), (2, vec![1, 2], vec![0]));
        assert_eq!(r.ids, vec![0, 1, 2, 3, 3, 2, 1, 0]);
        assert_eq!((r.keep.clone(), r.blank_rows), (vec![vec![true, false, true]], 5));
        assert_eq!(ranges(&[0, 1, 2, 5, 7, 8]), "0..=2, 5, 7..=8");
    }

    #[test]
    fn refusals_name_the_element() {
        let check = |ids: &[i64], want: &str| {
            let e = reduce(&[block(ids, 2)], Axes::Tlk, 1, 2, plain).err().unwrap_or_default();
            assert!(e.contains(want), "{e}");
        };
        check(&[0, 1, 2, -1], "b[1, 0, 1] (layer index 0, token 1, slot 1): -1 among the row's 2 ids (mixed k");
        check(&[0, 1, 2, 9], "b[1, 0, 1] (layer index 0, token 1, slot 1): id 9 >= 4");
        check(&[0, 1, -2, 1], "b[1, 0, 0] (layer index 0, token 1, slot 0): id -2");
        check(&[-1, -1, -1, -1], "every row of every layer is padding");
        check(&[0, 1, 1, 1], "expert 1 repeated in the row");
        // A token padded in some layers only.
        let e = reduce(&[block(&[0, 1, -1, -1, 2, 3, 3, 2], 2)], Axes::Tlk, 2, 2, plain).err().unwrap_or_default();
        assert!(e.contains("token 0 is padding in 1 of 2 routed layers"), "{e}");
        // Zeros rows are blank too (a zero-initialized capture buffer).
        let r = reduce(&[block(&[0, 0, 2, 3, 0, 0, 1, 0], 2)], Axes::Tlk, 2, 2, plain).unwrap();
        assert_eq!((r.layers.clone(), r.zero_rows), (vec![1], 2));
    }
}
