//! Validated, borrowed views of a trace's tensors, and an owned in-memory trace.

use crate::check::{Reads, check_content, check_offsets};
use crate::lookahead::Lookahead;
use crate::{Result, TraceError, TraceMeta};

/// The dimensions of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Shape {
    /// L: traced MoE layers.
    pub layers: usize,
    /// T: tokens, in trace order.
    pub tokens: usize,
    /// m: router candidates recorded per (layer, token), `m >= k`.
    pub candidates: usize,
    /// k: experts the model used per token (the first k candidates).
    pub top_k: usize,
    /// E: routed experts per layer.
    pub num_experts: usize,
}

/// Borrowed tensors of a trace, before validation. All slices are layer-major:
/// `ids[(l * T + t) * m + i]`, `gates[(l * T + t) * k + i]`.
#[derive(Debug, Clone, Copy)]
pub struct TraceParts<'a> {
    /// `ids`, u16, `[L, T, m]`: candidate expert ids in descending router score.
    pub ids: &'a [u16],
    /// `scores`, f32, `[L, T, m]`, optional: router logits or log-probabilities, non-increasing per row.
    pub scores: Option<&'a [f32]>,
    /// `gates`, f32, `[L, T, k]`, optional: gate weights applied to the k used experts.
    pub gates: Option<&'a [f32]>,
    /// `out_norms`, f32, `[L, T, k]`, optional: L2 norm of each used expert's output.
    pub out_norms: Option<&'a [f32]>,
    /// `seq_offsets`, u64, `[S]`, optional: first token of each sequence (starts at 0, strictly increasing, `< T`).
    pub seq_offsets: Option<&'a [u64]>,
    /// `step_offsets`, u64, `[N]`, optional: first token of each engine step (same rules).
    pub step_offsets: Option<&'a [u64]>,
    /// `lookahead_ids`, u16, `[L, T, m']`, optional: per (layer, token), the ids the layer's router
    /// gives the previous recorded layer's input (ids `< E`, distinct within a row).
    pub lookahead_ids: Option<Lookahead<'a>>,
}

/// A validated trace: metadata plus borrowed layer-major tensors, and what of its content was
/// validated ([`TraceView::reads`]).
///
/// Obtained from [`crate::TraceFile::view`], [`crate::TraceFile::view_for`] or
/// [`TraceData::view`], never built around unchecked data: its shapes and offsets always held,
/// and the content rules of SEMANTICS.md §1 held for [`TraceView::reads`] (everything, except
/// for a view of [`crate::TraceFile::view_for`]). A consumer that reads less than everything
/// calls [`TraceView::require`] with what it reads before reading it, then indexes without
/// checks.
#[derive(Debug, Clone, Copy)]
pub struct TraceView<'a> {
    meta: &'a TraceMeta,
    shape: Shape,
    parts: TraceParts<'a>,
    /// The content validated (clamped): the proof a consumer checks with [`TraceView::require`].
    reads: Reads,
}

impl<'a> TraceView<'a> {
    /// Validates `parts` against `meta` with `T = tokens` and `m = candidates`, and returns the view.
    ///
    /// # Errors
    /// [`TraceError::Shape`] when a slice length disagrees with `[L, T, m]` or `[L, T, k]`,
    /// [`TraceError::BadMetadata`] when `k > m` or `layer_ids` is empty or repeats an id,
    /// [`TraceError::Value`] for the first row that breaks a content rule (id `>= E`, repeated id,
    /// non-finite or increasing score, negative or non-finite gate or norm, a `lookahead_ids` id
    /// `>= E` or repeated in its row), [`TraceError::Offsets`] for bad sequence or step boundaries.
    pub fn new(meta: &'a TraceMeta, tokens: usize, candidates: usize, parts: TraceParts<'a>) -> Result<TraceView<'a>> {
        TraceView::new_validated_before(meta, tokens, candidates, parts, Reads::NOTHING)
    }

    /// [`TraceView::new`] that does not validate the content `done` again: only for parts whose
    /// content `done` the caller validated with the same functions ([`crate::check::ids_ok`] for
    /// ids); shapes, offsets and metadata are checked.
    pub(crate) fn new_validated_before(
        meta: &'a TraceMeta,
        tokens: usize,
        candidates: usize,
        parts: TraceParts<'a>,
        done: Reads,
    ) -> Result<TraceView<'a>> {
        crate::meta::check_layer_ids(&meta.layer_ids)?;
        let shape = Shape {
            layers: meta.layer_ids.len(),
            tokens,
            candidates,
            top_k: meta.top_k as usize,
            num_experts: meta.num_experts as usize,
        };
        if shape.top_k > candidates {
            return Err(TraceError::BadMetadata {
                key: "top_k",
                value: meta.top_k.to_string(),
                reason: format!("larger than the {candidates} candidates per row"),
            });
        }
        let mut view = TraceView { meta, shape, parts, reads: Reads::NOTHING };
        view.check_shapes()?;
        let all = Reads::EVERYTHING.clamp(&shape, &parts);
        check_content(&shape, &meta.layer_ids, &parts, all, done.clamp(&shape, &parts))?;
        view.reads = Reads::EVERYTHING.clamp(&shape, &parts);
        Ok(view)
    }

    /// Builds a view without validating content. Only for data whose shapes, offsets and the
    /// content `reads` were validated before (by the opener); `reads` is recorded clamped.
    pub(crate) fn new_prevalidated(
        meta: &'a TraceMeta,
        shape: Shape,
        parts: TraceParts<'a>,
        reads: Reads,
    ) -> TraceView<'a> {
        TraceView { meta, shape, parts, reads: reads.clamp(&shape, &parts) }
    }

    /// The metadata.
    pub fn meta(&self) -> &'a TraceMeta {
        self.meta
    }

    /// The dimensions.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// All tensors.
    pub fn parts(&self) -> TraceParts<'a> {
        self.parts
    }

    /// Candidate ids of layer index `l`, `[T, m]` flattened. Panics if `l >= L`.
    pub fn layer_ids(&self, l: usize) -> &'a [u16] {
        let n = self.shape.tokens * self.shape.candidates;
        &self.parts.ids[l * n..(l + 1) * n]
    }

    /// Scores of layer index `l`, `[T, m]` flattened, if the trace has scores. Panics if `l >= L`.
    pub fn layer_scores(&self, l: usize) -> Option<&'a [f32]> {
        let n = self.shape.tokens * self.shape.candidates;
        self.parts.scores.map(|s| &s[l * n..(l + 1) * n])
    }

    /// Gates of layer index `l`, `[T, k]` flattened, if present. Panics if `l >= L`.
    pub fn layer_gates(&self, l: usize) -> Option<&'a [f32]> {
        let n = self.shape.tokens * self.shape.top_k;
        self.parts.gates.map(|s| &s[l * n..(l + 1) * n])
    }

    /// Output norms of layer index `l`, `[T, k]` flattened, if present. Panics if `l >= L`.
    pub fn layer_out_norms(&self, l: usize) -> Option<&'a [f32]> {
        let n = self.shape.tokens * self.shape.top_k;
        self.parts.out_norms.map(|s| &s[l * n..(l + 1) * n])
    }

    /// The `m` candidate ids of (layer index `l`, token `t`). Panics when out of range.
    pub fn row(&self, l: usize, t: usize) -> &'a [u16] {
        let m = self.shape.candidates;
        let start = (l * self.shape.tokens + t) * m;
        &self.parts.ids[start..start + m]
    }

    /// Sequence start offsets, if recorded.
    pub fn seq_offsets(&self) -> Option<&'a [u64]> {
        self.parts.seq_offsets
    }

    /// Engine-step start offsets, if recorded.
    pub fn step_offsets(&self) -> Option<&'a [u64]> {
        self.parts.step_offsets
    }

    /// The `lookahead_ids` tensor, if recorded.
    pub fn lookahead(&self) -> Option<Lookahead<'a>> {
        self.parts.lookahead_ids
    }

    /// The m' lookahead ids of (layer index `l`, token `t`), if recorded. Panics when out of range.
    pub fn lookahead_row(&self, l: usize, t: usize) -> Option<&'a [u16]> {
        self.parts.lookahead_ids.map(|la| {
            let start = (l * self.shape.tokens + t) * la.width;
            &la.ids[start..start + la.width]
        })
    }

    /// What of the content was validated when the view was made (clamped to the trace: ids to
    /// at most m, `false` for an absent tensor).
    pub fn reads(&self) -> Reads {
        self.reads
    }

    /// Refuses a view whose validated content does not cover `need` (what a computation is
    /// about to read): the check every consumer of a partly validated view makes first.
    ///
    /// # Errors
    /// [`TraceError::NotValidated`] naming what is needed and what was validated.
    pub fn require(&self, need: Reads) -> Result<()> {
        let need = need.clamp(&self.shape, &self.parts);
        if self.reads.covers(need) {
            return Ok(());
        }
        Err(TraceError::NotValidated { needed: need.to_string(), validated: self.reads.to_string() })
    }

    /// Shapes (slice lengths), offsets and the small optional `lookahead_ids` (whole): what is
    /// checked before any content.
    pub(crate) fn check_shapes(&self) -> Result<()> {
        let Shape { layers, tokens, candidates: m, top_k: k, num_experts } = self.shape;
        let layer_ids = &self.meta.layer_ids;
        let expect_len = |tensor: &'static str, len: usize, width: usize, wname: &str| -> Result<()> {
            // Checked: `tokens` comes from the caller and may be absurd.
            let want = layers.checked_mul(tokens).and_then(|n| n.checked_mul(width));
            if want != Some(len) {
                return Err(TraceError::Shape {
                    tensor,
                    expected: format!(
                        "[L, T, {wname}] = [{layers}, {tokens}, {width}] ({} values)",
                        want.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                    ),
                    actual: vec![len],
                });
            }
            Ok(())
        };
        expect_len("ids", self.parts.ids.len(), m, "m")?;
        if let Some(s) = self.parts.scores {
            expect_len("scores", s.len(), m, "m")?;
        }
        if let Some(s) = self.parts.gates {
            expect_len("gates", s.len(), k, "k")?;
        }
        if let Some(s) = self.parts.out_norms {
            expect_len("out_norms", s.len(), k, "k")?;
        }
        for (tensor, offs) in [("seq_offsets", self.parts.seq_offsets), ("step_offsets", self.parts.step_offsets)] {
            let Some(offs) = offs else { continue };
            check_offsets(tensor, offs, tokens)?;
        }
        if let Some(la) = self.parts.lookahead_ids {
            crate::lookahead::check(la, layer_ids, tokens, num_experts)?;
        }
        Ok(())
    }
}

/// An owned, validated, in-memory trace (what importers and generators build before writing).
#[derive(Debug, Clone, PartialEq)]
pub struct TraceData {
    meta: TraceMeta,
    tokens: usize,
    candidates: usize,
    ids: Vec<u16>,
    scores: Option<Vec<f32>>,
    gates: Option<Vec<f32>>,
    out_norms: Option<Vec<f32>>,
    seq_offsets: Option<Vec<u64>>,
    step_offsets: Option<Vec<u64>>,
}

/// The owned tensors of a [`TraceData`], layer-major, as in [`TraceParts`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OwnedParts {
    /// `ids` `[L, T, m]`.
    pub ids: Vec<u16>,
    /// `scores` `[L, T, m]`.
    pub scores: Option<Vec<f32>>,
    /// `gates` `[L, T, k]`.
    pub gates: Option<Vec<f32>>,
    /// `out_norms` `[L, T, k]`.
    pub out_norms: Option<Vec<f32>>,
    /// `seq_offsets` `[S]`.
    pub seq_offsets: Option<Vec<u64>>,
    /// `step_offsets` `[N]`.
    pub step_offsets: Option<Vec<u64>>,
}

impl TraceData {
    /// Validates and takes ownership of a trace's tensors (rules as in [`TraceView::new`]).
    ///
    /// # Errors
    /// As [`TraceView::new`].
    pub fn new(meta: TraceMeta, tokens: usize, candidates: usize, parts: OwnedParts) -> Result<TraceData> {
        TraceData::new_validated_before(meta, tokens, candidates, parts, Reads::NOTHING)
    }

    /// [`TraceData::new`] for parts whose content `done` the caller validated with the same
    /// functions (an importer that checked every id with [`crate::check::ids_ok`] while
    /// converting them: `Reads::ids(m)`), so that it is not validated a second time; everything
    /// else is, as [`TraceData::new`] does.
    pub(crate) fn new_validated_before(
        meta: TraceMeta,
        tokens: usize,
        candidates: usize,
        parts: OwnedParts,
        done: Reads,
    ) -> Result<TraceData> {
        let data = TraceData {
            meta,
            tokens,
            candidates,
            ids: parts.ids,
            scores: parts.scores,
            gates: parts.gates,
            out_norms: parts.out_norms,
            seq_offsets: parts.seq_offsets,
            step_offsets: parts.step_offsets,
        };
        TraceView::new_validated_before(&data.meta, tokens, candidates, data.borrowed(), done)?;
        Ok(data)
    }

    fn borrowed(&self) -> TraceParts<'_> {
        TraceParts {
            ids: &self.ids,
            scores: self.scores.as_deref(),
            gates: self.gates.as_deref(),
            out_norms: self.out_norms.as_deref(),
            seq_offsets: self.seq_offsets.as_deref(),
            step_offsets: self.step_offsets.as_deref(),
            lookahead_ids: None,
        }
    }

    /// The validated view.
    pub fn view(&self) -> TraceView<'_> {
        let shape = Shape {
            layers: self.meta.layer_ids.len(),
            tokens: self.tokens,
            candidates: self.candidates,
            top_k: self.meta.top_k as usize,
            num_experts: self.meta.num_experts as usize,
        };
        TraceView::new_prevalidated(&self.meta, shape, self.borrowed(), Reads::EVERYTHING)
    }

    /// The metadata.
    pub fn meta(&self) -> &TraceMeta {
        &self.meta
    }

    /// Gives the tensors back (for example to edit and re-validate).
    pub fn into_parts(self) -> (TraceMeta, usize, usize, OwnedParts) {
        let parts = OwnedParts {
            ids: self.ids,
            scores: self.scores,
            gates: self.gates,
            out_norms: self.out_norms,
            seq_offsets: self.seq_offsets,
            step_offsets: self.step_offsets,
        };
        (self.meta, self.tokens, self.candidates, parts)
    }
}
