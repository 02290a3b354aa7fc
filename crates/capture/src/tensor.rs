//! The graph tensors a capture reads: which role a name gives a tensor, and where its rows are.
//!
//! llama.cpp's `build_moe_ffn` (src/llama-graph.cpp) names every tensor of an MoE block with the
//! block index appended (`<name>-<il>`, `llama_context::graph_get_cb`) and hands each to the eval
//! callback of the context (`cb_eval`). The ones read here:
//! - `ffn_moe_logits` `[n_expert, n_tokens]` f32: the router's logits (absent when an architecture
//!   passes its own probabilities in);
//! - `ffn_moe_topk` `[n_expert_used, n_tokens]` i32: the ids the runtime used. It is a view of the
//!   first k columns of a wider argsort (`ggml_argsort_top_k`), so its rows are `nb[1]` bytes apart,
//!   not k · 4: it is read row by row by its strides, never flat;
//! - `ffn_moe_weights` `[1, n_expert_used, n_tokens]` f32, then, where the architecture applies
//!   them, `ffn_moe_weights_softmax`, `ffn_moe_weights_norm` and `ffn_moe_weights_scaled`: the gate
//!   weights at each stage; the last stage a layer shows is the weight the model applied;
//! - `ffn_moe_probs_biased` and `ffn_moe_probs_masked`: present when selection adds a bias or masks
//!   expert groups (DeepSeek-V3 and kin), so the used ids need not be the top k of the logits.

/// What a recorded tensor holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// `ffn_moe_logits`: the router's logits, E per token.
    Logits,
    /// `ffn_moe_topk`: the k ids the runtime used, in its order.
    TopK,
    /// A gate-weight stage, k per token: 0 = `ffn_moe_weights`, 1 = `_softmax`, 2 = `_norm`,
    /// 3 = `_scaled`.
    Weights(u8),
    /// `ffn_moe_probs_biased` or `ffn_moe_probs_masked`: selection differs from the logits' order.
    Selection,
}

/// The names of [`Role`]s, as llama.cpp spells them before the `-<layer>` suffix.
const NAMES: [(&str, Role); 8] = [
    ("ffn_moe_logits", Role::Logits),
    ("ffn_moe_topk", Role::TopK),
    ("ffn_moe_weights", Role::Weights(0)),
    ("ffn_moe_weights_softmax", Role::Weights(1)),
    ("ffn_moe_weights_norm", Role::Weights(2)),
    ("ffn_moe_weights_scaled", Role::Weights(3)),
    ("ffn_moe_probs_biased", Role::Selection),
    ("ffn_moe_probs_masked", Role::Selection),
];

/// The role and block index of a graph tensor named `<name>-<il>`, or `None` for any other tensor.
pub fn parse_name(name: &str) -> Option<(Role, u32)> {
    let (stem, layer) = name.rsplit_once('-')?;
    let layer: u32 = layer.parse().ok()?;
    NAMES.iter().find(|(n, _)| *n == stem).map(|&(_, role)| (role, layer))
}

/// Element types the recorder reads (ggml's `GGML_TYPE_F32` and `GGML_TYPE_I32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// 32-bit float.
    F32,
    /// 32-bit signed integer.
    I32,
    /// Anything else, by ggml's type number.
    Other(u32),
}

/// Where the rows of a tensor lie: `n_tokens` rows of `row_len` 4-byte elements, element `j` of row
/// `t` at byte `t · token_stride + j · elem_stride` of the tensor's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Elements per row.
    pub row_len: usize,
    /// Rows (tokens of the ubatch).
    pub n_tokens: usize,
    /// Bytes between consecutive elements of a row.
    pub elem_stride: usize,
    /// Bytes between consecutive rows.
    pub token_stride: usize,
}

impl Layout {
    /// The layout of a ggml tensor of extents `ne` and byte strides `nb` (ggml's order: `ne[0]` is
    /// the innermost) holding rows of `row_len` elements: either `[row_len, n_tokens]` or
    /// `[1, row_len, n_tokens]` (every other extent 1). `None` when it is neither.
    pub fn of(ne: [i64; 4], nb: [usize; 4], row_len: usize) -> Option<Layout> {
        let ne: Vec<usize> = ne.iter().map(|&n| usize::try_from(n).ok()).collect::<Option<_>>()?;
        for (elem, token) in [(0usize, 1usize), (1, 2)] {
            let others_one = (0..4).filter(|&a| a != elem && a != token).all(|a| ne[a] == 1);
            if ne[elem] == row_len && others_one {
                return Some(Layout { row_len, n_tokens: ne[token], elem_stride: nb[elem], token_stride: nb[token] });
            }
        }
        None
    }

    /// Whether each row's elements are contiguous (4 bytes apart), so a row is one read.
    pub fn rows_contiguous(&self) -> bool {
        self.elem_stride == 4 || self.row_len <= 1
    }
}

/// Reads the rows of a tensor of layout `layout` through `read(offset, buffer)` (which fills
/// `buffer` from the tensor's data at byte `offset`), appending `n_tokens · row_len` 4-byte
/// values to `out` in row order: row by row, by the strides, never as one flat copy.
pub fn read_rows<E, F>(layout: &Layout, read: &mut F, out: &mut Vec<[u8; 4]>) -> Result<(), E>
where
    F: FnMut(usize, &mut [u8]) -> Result<(), E> + ?Sized,
{
    let mut row = vec![0u8; layout.row_len * 4];
    for t in 0..layout.n_tokens {
        let base = t * layout.token_stride;
        if layout.rows_contiguous() {
            read(base, &mut row)?;
        } else {
            for j in 0..layout.row_len {
                read(base + j * layout.elem_stride, &mut row[j * 4..j * 4 + 4])?;
            }
        }
        out.extend(row.chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_role_and_block() {
        let check = |name: &str, expect: Option<(Role, u32)>| assert_eq!(parse_name(name), expect, "{name}");
        check("ffn_moe_topk-12", Some((Role::TopK, 12)));
        check("ffn_moe_logits-0", Some((Role::Logits, 0)));
        check("ffn_moe_weights_norm-47", Some((Role::Weights(2), 47)));
        check("ffn_moe_weights_scaled-3", Some((Role::Weights(3), 3)));
        check("ffn_moe_probs_biased-5", Some((Role::Selection, 5)));
        check("ffn_moe_probs-5", None);
        check("ffn_moe_argsort-5", None);
        check("ffn_moe_topk", None);
        check("ffn_moe_topk-x", None);
        check("attn_norm-3", None);
    }

    #[test]
    fn layouts_of_the_shapes_build_moe_ffn_makes() {
        // ffn_moe_topk: a view of the first 2 of 8 argsort columns, 3 tokens.
        let topk = Layout::of([2, 3, 1, 1], [4, 32, 96, 96], 2).unwrap();
        assert_eq!((topk.n_tokens, topk.elem_stride, topk.token_stride), (3, 4, 32));
        // ffn_moe_weights: [1, k, T].
        let w = Layout::of([1, 2, 3, 1], [4, 4, 8, 24], 2).unwrap();
        assert_eq!((w.n_tokens, w.elem_stride, w.token_stride), (3, 4, 8));
        // k = 1: [1, 1, T] is read over its third extent.
        let w1 = Layout::of([1, 1, 5, 1], [4, 4, 4, 20], 1).unwrap();
        assert_eq!(w1.n_tokens, 5);
        // A decode step: one token.
        assert_eq!(Layout::of([8, 1, 1, 1], [4, 32, 32, 32], 8).unwrap().n_tokens, 1);
        // Wrong row length, or a fourth extent.
        assert_eq!(Layout::of([8, 3, 1, 1], [4, 32, 96, 96], 2), None);
        assert_eq!(Layout::of([2, 3, 2, 1], [4, 8, 24, 48], 2), None);
    }

    #[test]
    fn a_strided_view_is_read_row_by_row() {
        // An argsort of 4 columns per token, of which the view holds the first 2.
        let argsort: Vec<i32> = vec![3, 1, 0, 2, /**/ 2, 0, 1, 3, /**/ 1, 3, 2, 0];
        let bytes: Vec<u8> = argsort.iter().flat_map(|v| v.to_le_bytes()).collect();
        let layout = Layout::of([2, 3, 1, 1], [4, 16, 48, 48], 2).unwrap();
        let mut out = Vec::new();
        let mut read = |off: usize, buf: &mut [u8]| -> Result<(), ()> {
            buf.copy_from_slice(&bytes[off..off + buf.len()]);
            Ok(())
        };
        read_rows(&layout, &mut read, &mut out).unwrap();
        let ids: Vec<i32> = out.iter().map(|b| i32::from_le_bytes(*b)).collect();
        assert_eq!(ids, vec![3, 1, 2, 0, 1, 3]);
        // The flat copy a careless reader makes is the argsort's first six values instead.
        assert_ne!(ids, argsort[..6].to_vec());
    }
}
