//! The recorder: graph tensors of one `llama_decode` in, trace rows out.
//!
//! The eval callback hands each recorded tensor to [`Recorder::tensor`]; after each `llama_decode`
//! the runner calls [`Recorder::end_batch`] with the batch's token count, which turns the layers'
//! tensors into rows (the used ids first, in the runtime's order, then the other experts by logit)
//! and checks that every MoE layer saw every token. [`Recorder::finish`] gives the trace.

use std::collections::BTreeMap;

use trace_io::{OwnedParts, Phase, ScoreKind, TraceData, TraceMeta};

use crate::tensor::{Dtype, Layout, Role, parse_name, read_rows};
use crate::{CaptureError, Result};

/// A graph tensor as the eval callback sees it, with a reader of its data.
pub struct Tensor<'a> {
    /// Its name, e.g. `ffn_moe_topk-12`.
    pub name: &'a str,
    /// Its element type.
    pub dtype: Dtype,
    /// ggml's extents (`ne[0]` innermost).
    pub ne: [i64; 4],
    /// ggml's byte strides.
    pub nb: [usize; 4],
    /// Fills a buffer from the tensor's data at a byte offset (a host copy, or
    /// `ggml_backend_tensor_get` for a device buffer).
    pub read: &'a mut dyn FnMut(usize, &mut [u8]) -> Result<()>,
}

/// What the recorder was asked for.
#[derive(Debug, Clone, Copy)]
pub struct RecorderConfig {
    /// E: routed experts per layer (`<arch>.expert_count`).
    pub num_experts: usize,
    /// k: experts used per token (`<arch>.expert_used_count`).
    pub top_k: usize,
    /// m: candidates kept per row when the logits are recorded (k <= m <= E).
    pub candidates: usize,
}

/// One layer's tensors of the batch in progress, as 4-byte values in row order.
#[derive(Default)]
struct Pending {
    logits: Vec<[u8; 4]>,
    topk: Vec<[u8; 4]>,
    /// Per weight stage (see [`Role::Weights`]).
    weights: [Vec<[u8; 4]>; 4],
    selection: bool,
}

/// One layer's finished rows.
#[derive(Default)]
struct Rows {
    /// `[T, m]` ids, the used k first.
    ids: Vec<u16>,
    /// `[T, m]` logits of those ids (empty when no logits were recorded).
    scores: Vec<f32>,
    /// `[T, k]` gate weights of the used ids.
    gates: Vec<f32>,
}

/// Collects the routing of a capture; see the module documentation.
pub struct Recorder {
    cfg: RecorderConfig,
    pending: BTreeMap<u32, Pending>,
    rows: BTreeMap<u32, Rows>,
    tokens: usize,
    prefill: usize,
    decode: usize,
    seq_offsets: Vec<u64>,
    /// Where each `llama_decode` (an engine step of one sequence) starts.
    step_offsets: Vec<u64>,
    /// Rows whose used ids are not the top k of the logits, in order (selection bias, group
    /// masking, or ties of the probabilities).
    disordered: usize,
    /// Whether any layer recorded logits / a selection tensor.
    logits: Option<bool>,
    selection: bool,
}

/// What [`Recorder::finish`] saw, for the capture's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// Candidates per row written (m, or k when no scores are written).
    pub candidates: usize,
    /// Whether router logits were written as scores.
    pub scores: bool,
    /// Rows whose used ids are not the top k of the logits (scores then left out).
    pub disordered_rows: usize,
    /// Whether the graph has a selection bias or group mask.
    pub selection_bias: bool,
    /// Prefill tokens.
    pub prefill_tokens: usize,
    /// Decode tokens.
    pub decode_tokens: usize,
}

impl Recorder {
    /// An empty recorder.
    ///
    /// # Errors
    /// [`CaptureError::Config`] unless `1 <= k <= m <= E <= 65536`.
    pub fn new(cfg: RecorderConfig) -> Result<Recorder> {
        let RecorderConfig { num_experts: e, top_k: k, candidates: m } = cfg;
        if !(1 <= k && k <= m && m <= e && e <= 1 << 16) {
            return Err(CaptureError::Config(format!(
                "candidates: need 1 <= k ({k}) <= candidates ({m}) <= experts ({e}) <= 65536"
            )));
        }
        Ok(Recorder {
            cfg,
            pending: BTreeMap::new(),
            rows: BTreeMap::new(),
            tokens: 0,
            prefill: 0,
            decode: 0,
            seq_offsets: Vec::new(),
            step_offsets: Vec::new(),
            disordered: 0,
            logits: None,
            selection: false,
        })
    }

    /// Whether a tensor of this name is one the recorder reads (the callback's "ask" phase).
    pub fn wants(name: &str) -> bool {
        parse_name(name).is_some()
    }

    /// Marks the start of a sequence at the next token.
    pub fn begin_sequence(&mut self) {
        self.seq_offsets.push(self.tokens as u64);
    }

    /// MoE layers recorded so far.
    pub fn layers(&self) -> usize {
        self.rows.len()
    }

    /// Tokens recorded so far.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Takes one computed tensor of the batch in progress.
    ///
    /// # Errors
    /// [`CaptureError::Tensor`] when its type or shape is not what its name promises; the error of
    /// its reader.
    pub fn tensor(&mut self, t: Tensor<'_>) -> Result<()> {
        let Some((role, layer)) = parse_name(t.name) else { return Ok(()) };
        let bad = |reason: String| CaptureError::Tensor { tensor: t.name.to_string(), reason };
        let (row_len, dtype) = match role {
            Role::Logits => (self.cfg.num_experts, Dtype::F32),
            Role::TopK => (self.cfg.top_k, Dtype::I32),
            Role::Weights(_) => (self.cfg.top_k, Dtype::F32),
            Role::Selection => {
                self.pending.entry(layer).or_default().selection = true;
                return Ok(());
            }
        };
        if t.dtype != dtype {
            return Err(bad(format!("element type {:?}, expected {dtype:?}", t.dtype)));
        }
        let layout = Layout::of(t.ne, t.nb, row_len).ok_or_else(|| {
            bad(format!("extents {:?}: expected [{row_len}, tokens] or [1, {row_len}, tokens]", t.ne))
        })?;
        let p = self.pending.entry(layer).or_default();
        let out = match role {
            Role::Logits => &mut p.logits,
            Role::TopK => &mut p.topk,
            Role::Weights(s) => &mut p.weights[usize::from(s)],
            Role::Selection => unreachable!("returned above"),
        };
        read_rows(&layout, t.read, out)
    }

    /// Turns the tensors of one `llama_decode` of `n_tokens` tokens of `phase` (prefill or decode)
    /// into rows.
    ///
    /// # Errors
    /// [`CaptureError::Tensor`] when a layer did not see all `n_tokens` tokens, when the MoE layers
    /// differ from the first batch's, or when a layer lacks the top-k or weight tensor;
    /// [`CaptureError::Row`] for an id out of range or repeated, or a gate not finite and >= 0.
    pub fn end_batch(&mut self, n_tokens: usize, phase: Phase) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        if self.tokens > 0 {
            let before: Vec<u32> = self.rows.keys().copied().collect();
            let now: Vec<u32> = pending.keys().copied().collect();
            if before != now {
                return Err(CaptureError::Tensor {
                    tensor: "ffn_moe_topk".into(),
                    reason: format!("MoE layers {now:?} in this batch, {before:?} before"),
                });
            }
        }
        let (e, k, m) = (self.cfg.num_experts, self.cfg.top_k, self.cfg.candidates);
        for (&layer, p) in &pending {
            let name = |stem: &str| format!("{stem}-{layer}");
            let count = |v: &[[u8; 4]], len: usize| v.len() / len;
            if count(&p.topk, k) != n_tokens {
                return Err(CaptureError::Tensor {
                    tensor: name("ffn_moe_topk"),
                    reason: format!(
                        "{} of the batch's {n_tokens} tokens reached this layer (llama.cpp routes only the \
                         tokens whose logits are requested through its last layer: every token's are, here)",
                        count(&p.topk, k)
                    ),
                });
            }
            let has_logits = !p.logits.is_empty();
            if has_logits && count(&p.logits, e) != n_tokens {
                return Err(CaptureError::Tensor {
                    tensor: name("ffn_moe_logits"),
                    reason: format!("{} rows for {n_tokens} tokens", count(&p.logits, e)),
                });
            }
            if *self.logits.get_or_insert(has_logits) != has_logits {
                return Err(CaptureError::Tensor {
                    tensor: name("ffn_moe_logits"),
                    reason: "recorded for some layers or batches and not others".into(),
                });
            }
            let stage = (0..4).rev().find(|&s| !p.weights[s].is_empty()).ok_or_else(|| CaptureError::Tensor {
                tensor: name("ffn_moe_weights"),
                reason: "never reached the eval callback".into(),
            })?;
            if count(&p.weights[stage], k) != n_tokens {
                return Err(CaptureError::Tensor {
                    tensor: name("ffn_moe_weights"),
                    reason: format!("{} rows for {n_tokens} tokens", count(&p.weights[stage], k)),
                });
            }
            self.selection |= p.selection;
            let rows = self.rows.entry(layer).or_default();
            let mut rest: Vec<(f32, u16)> = Vec::with_capacity(e);
            for t in 0..n_tokens {
                let token = self.tokens + t;
                let row_err = |reason: String| CaptureError::Row { layer, token, reason };
                let used = &p.topk[t * k..(t + 1) * k];
                let start = rows.ids.len();
                for b in used {
                    let id = i32::from_le_bytes(*b);
                    if id < 0 || id as usize >= e {
                        return Err(row_err(format!("the runtime used expert {id}, outside 0..{e}")));
                    }
                    let id = id as u16;
                    if rows.ids[start..].contains(&id) {
                        return Err(row_err(format!("the runtime used expert {id} twice")));
                    }
                    rows.ids.push(id);
                }
                for b in &p.weights[stage][t * k..(t + 1) * k] {
                    let g = f32::from_le_bytes(*b);
                    if !(g.is_finite() && g >= 0.0) {
                        return Err(row_err(format!("gate weight {g} (finite and >= 0 expected)")));
                    }
                    rows.gates.push(g);
                }
                if !has_logits {
                    continue;
                }
                let logit = |id: usize| f32::from_le_bytes(p.logits[t * e + id]);
                let used_ids = rows.ids[start..].to_vec();
                for &id in &used_ids {
                    rows.scores.push(logit(usize::from(id)));
                }
                rest.clear();
                for id in 0..e {
                    let id16 = id as u16;
                    if !used_ids.contains(&id16) {
                        rest.push((logit(id), id16));
                    }
                }
                // Descending logit, ties: lower id (SEMANTICS §1). NaN never reaches a trace.
                rest.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                for &(s, id) in rest.iter().take(m - k) {
                    rows.ids.push(id);
                    rows.scores.push(s);
                }
                let row = &rows.scores[start..];
                if !row.iter().all(|s| s.is_finite()) {
                    return Err(row_err("a router logit is not finite".into()));
                }
                if row.windows(2).any(|w| w[0] < w[1]) {
                    self.disordered += 1;
                }
            }
        }
        self.step_offsets.push(self.tokens as u64);
        self.tokens += n_tokens;
        if phase == Phase::Decode {
            self.decode += n_tokens;
        } else {
            self.prefill += n_tokens;
        }
        Ok(())
    }

    /// The trace of everything recorded, with `meta`'s model, source and extra keys (its `num_experts`,
    /// `top_k`, `layer_ids`, `score_kind` and `phase` are set here), and what was seen.
    ///
    /// Scores (the router's logits) and the candidates beyond k are written when the logits were
    /// recorded and every row's used ids are their top k in order; otherwise each row holds the k
    /// used ids alone (score kind `none`).
    ///
    /// # Errors
    /// [`CaptureError::Config`] when nothing was recorded; the trace's own validation.
    pub fn finish(self, mut meta: TraceMeta) -> Result<(TraceData, Recorded)> {
        if self.tokens == 0 || self.rows.is_empty() {
            return Err(CaptureError::Config("no token was recorded".into()));
        }
        let (k, m_full) = (self.cfg.top_k, self.cfg.candidates);
        let scores = self.logits == Some(true) && self.disordered == 0;
        let m = if scores { m_full } else { k };
        let stride = if self.logits == Some(true) { m_full } else { k };
        let layers = self.rows.len();
        let mut ids = Vec::with_capacity(layers * self.tokens * m);
        let mut all_scores = Vec::with_capacity(if scores { layers * self.tokens * m } else { 0 });
        let mut gates = Vec::with_capacity(layers * self.tokens * k);
        for rows in self.rows.values() {
            if m == stride {
                ids.extend_from_slice(&rows.ids);
            } else {
                ids.extend(rows.ids.chunks_exact(stride).flat_map(|r| r[..m].iter().copied()));
            }
            if scores {
                all_scores.extend_from_slice(&rows.scores);
            }
            gates.extend_from_slice(&rows.gates);
        }
        meta.num_experts = self.cfg.num_experts as u32;
        meta.top_k = k as u32;
        meta.layer_ids = self.rows.keys().copied().collect();
        meta.score_kind = if scores { ScoreKind::Logits } else { ScoreKind::None };
        meta.phase = match (self.prefill, self.decode) {
            (_, 0) => Phase::Prefill,
            (0, _) => Phase::Decode,
            _ => Phase::Mixed,
        };
        meta.extra.insert("prefill_tokens".into(), self.prefill.to_string());
        meta.extra.insert("decode_tokens".into(), self.decode.to_string());
        let parts = OwnedParts {
            ids,
            scores: scores.then_some(all_scores),
            gates: Some(gates),
            out_norms: None,
            seq_offsets: Some(self.seq_offsets),
            step_offsets: Some(self.step_offsets),
        };
        let seen = Recorded {
            candidates: m,
            scores,
            disordered_rows: self.disordered,
            selection_bias: self.selection,
            prefill_tokens: self.prefill,
            decode_tokens: self.decode,
        };
        Ok((TraceData::new(meta, self.tokens, m, parts)?, seen))
    }
}

#[cfg(test)]
mod tests;
