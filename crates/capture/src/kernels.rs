//! The kernels `profile measure` times (see [`crate::measure`]): ggml contexts, weights of the
//! model's types, and `mul_mat` graphs on the CPU. Every call into ggml is here.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::path::Path;
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::measure::{DENSE_ROWS, EXPERTS_PER_OP, MeasureConfig, Measured, ROWS, Spread};

/// Experts per weight set (the copies are made as sets, as a layer's experts are stored).
const SET: usize = 8;
use crate::{CaptureError, Result};

/// The most memory the expert copies may take, bytes.
const COPIES_BYTES: usize = 2 << 30;

/// A tensor of the model: name, type, extents.
struct Info {
    name: String,
    ty: sys::ggml_type,
    ne: [i64; 4],
}

/// Attention heads of the model: query heads, key/value heads, head size.
#[derive(Debug, Clone, Copy)]
struct Heads {
    q: i64,
    kv: i64,
    dim: i64,
}

/// `general.architecture`, the attention heads (when the metadata gives them) and the tensors of a
/// GGUF file (no data read).
fn tensors(path: &Path) -> Result<(String, Option<Heads>, Vec<Info>)> {
    let err = |reason: String| CaptureError::Model { path: path.into(), reason };
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| err("a NUL in the path".into()))?;
    let mut meta: *mut sys::ggml_context = std::ptr::null_mut();
    let params = sys::gguf_init_params { no_alloc: true, ctx: &mut meta };
    // SAFETY: c is NUL-terminated; with no_alloc the context holds tensor metadata only.
    let g = unsafe { sys::gguf_init_from_file(c.as_ptr(), params) };
    if g.is_null() || meta.is_null() {
        return Err(err("not a GGUF file llama.cpp can read".into()));
    }
    // SAFETY: g is a live GGUF context; the key is NUL-terminated; a string value is NUL-terminated.
    let arch = unsafe {
        let id = sys::gguf_find_key(g, c"general.architecture".as_ptr());
        if id < 0 { String::new() } else { CStr::from_ptr(sys::gguf_get_val_str(g, id)).to_string_lossy().into_owned() }
    };
    let u32_of = |key: String| -> Option<i64> {
        let key = CString::new(key).ok()?;
        // SAFETY: g is live; the key is NUL-terminated; the value is read only when it is a u32.
        unsafe {
            let id = sys::gguf_find_key(g, key.as_ptr());
            (id >= 0 && sys::gguf_get_kv_type(g, id) == sys::GGUF_TYPE_UINT32)
                .then(|| i64::from(sys::gguf_get_val_u32(g, id)))
        }
    };
    let q = u32_of(format!("{arch}.attention.head_count"));
    let kv = u32_of(format!("{arch}.attention.head_count_kv")).or(q);
    let dim = u32_of(format!("{arch}.attention.key_length"))
        .or_else(|| u32_of(format!("{arch}.embedding_length")).zip(q).map(|(e, q)| e / q.max(1)));
    let heads = match (q, kv, dim) {
        (Some(q), Some(kv), Some(dim)) if q > 0 && kv > 0 && dim > 0 => Some(Heads { q, kv, dim }),
        _ => None,
    };
    let mut out = Vec::new();
    // SAFETY: meta is the context gguf_init_from_file made; the tensors it lists live until ggml_free.
    let mut t = unsafe { sys::ggml_get_first_tensor(meta) };
    while !t.is_null() {
        // SAFETY: t is a tensor of meta.
        let r = unsafe { &*t };
        // SAFETY: a NUL-terminated name within the tensor's array.
        let name = unsafe { CStr::from_ptr(r.name.as_ptr()) }.to_string_lossy().into_owned();
        out.push(Info { name, ty: r.type_, ne: r.ne });
        // SAFETY: as above.
        t = unsafe { sys::ggml_get_next_tensor(meta, t) };
    }
    // SAFETY: both were made above and are freed once.
    unsafe {
        sys::gguf_free(g);
        sys::ggml_free(meta);
    }
    Ok((arch, heads, out))
}

fn type_name(ty: sys::ggml_type) -> String {
    // SAFETY: ggml returns a static NUL-terminated name for every type.
    unsafe { CStr::from_ptr(sys::ggml_type_name(ty)) }.to_string_lossy().into_owned()
}

/// Bytes of a row of `n` elements of `ty`.
fn row_bytes(ty: sys::ggml_type, n: i64) -> usize {
    // SAFETY: plain arithmetic on a type ggml knows.
    unsafe { sys::ggml_row_size(ty, n) }
}

/// A ggml context of `bytes` for tensors and graphs, freed on drop.
struct Ctx(*mut sys::ggml_context);
impl Ctx {
    fn new(bytes: usize) -> Result<Ctx> {
        let params = sys::ggml_init_params { mem_size: bytes, mem_buffer: std::ptr::null_mut(), no_alloc: false };
        // SAFETY: ggml allocates mem_size bytes itself.
        let c = unsafe { sys::ggml_init(params) };
        if c.is_null() {
            return Err(CaptureError::Config(format!("ggml could not allocate {bytes} bytes")));
        }
        Ok(Ctx(c))
    }

    /// A 2-D tensor of `ty`, `[ne0, ne1]`, filled from `pattern` (quantized once, copied per tensor).
    fn weight(&self, ty: sys::ggml_type, ne0: i64, ne1: i64, pattern: &[u8]) -> *mut sys::ggml_tensor {
        // SAFETY: the context has room (sized by the caller for every tensor it makes).
        let t = unsafe { sys::ggml_new_tensor_2d(self.0, ty, ne0, ne1) };
        // SAFETY: t's data holds ggml_nbytes(t) bytes; pattern holds at least that (made for this shape).
        unsafe {
            let n = sys::ggml_nbytes(t);
            std::ptr::copy_nonoverlapping(pattern.as_ptr(), (*t).data.cast::<u8>(), n);
        }
        t
    }

    /// An f32 `[ne0, ne1]` input filled with small values.
    fn input(&self, ne0: i64, ne1: i64) -> *mut sys::ggml_tensor {
        self.input3(ne0, ne1, 1)
    }

    /// An f32 `[ne0, ne1, ne2]` input filled with small values.
    fn input3(&self, ne0: i64, ne1: i64, ne2: i64) -> *mut sys::ggml_tensor {
        // SAFETY: as in `weight`.
        let t = unsafe { sys::ggml_new_tensor_3d(self.0, sys::GGML_TYPE_F32, ne0, ne1, ne2) };
        // SAFETY: an f32 tensor of ne0 · ne1 · ne2 elements.
        let data = unsafe { std::slice::from_raw_parts_mut((*t).data.cast::<f32>(), (ne0 * ne1 * ne2) as usize) };
        for (i, x) in data.iter_mut().enumerate() {
            *x = ((i * 7919 % 1000) as f32 - 500.0) / 5000.0;
        }
        t
    }

    /// A 3-D `[ne0, ne1, SET]` set of experts of `ty`, each filled from `pattern`.
    fn experts(&self, ty: sys::ggml_type, ne0: i64, ne1: i64, pattern: &[u8]) -> *mut sys::ggml_tensor {
        // SAFETY: the context has room (sized by the caller); each expert's slice is nb[2] bytes
        // at j · nb[2], and pattern holds one expert (made for this shape and type).
        unsafe {
            let t = sys::ggml_new_tensor_3d(self.0, ty, ne0, ne1, SET as i64);
            let slice = (*t).nb[2];
            for j in 0..SET {
                std::ptr::copy_nonoverlapping(pattern.as_ptr(), (*t).data.cast::<u8>().add(j * slice), slice);
            }
            t
        }
    }

    /// Times the graph of the outputs `outs` on `pool`, ms (the plan and its work buffer are
    /// made before the clock starts, as llama.cpp reuses them between tokens).
    fn time(&self, outs: &[*mut sys::ggml_tensor], pool: &Pool) -> f64 {
        // SAFETY: the outputs belong to this context; the graph is made in it; the plan's work
        // buffer is a Vec of the size the plan asks for, alive until the computation returns.
        unsafe {
            let g = sys::ggml_new_graph(self.0);
            for &o in outs {
                sys::ggml_build_forward_expand(g, o);
            }
            let mut plan = sys::ggml_graph_plan(g, pool.threads as i32, pool.raw);
            let mut work = vec![0u8; plan.work_size];
            plan.work_data = work.as_mut_ptr();
            let start = Instant::now();
            sys::ggml_graph_compute(g, &mut plan);
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            drop(work);
            ms
        }
    }
}
/// A ggml thread pool, kept across timings as llama.cpp keeps one across tokens.
struct Pool {
    raw: *mut sys::ggml_threadpool,
    threads: usize,
}
impl Pool {
    fn new(threads: usize) -> Result<Pool> {
        // SAFETY: default parameters for n threads; the pool is freed on drop.
        let raw = unsafe {
            let mut p = sys::ggml_threadpool_params_default(threads as i32);
            sys::ggml_threadpool_new(&mut p)
        };
        if raw.is_null() {
            return Err(CaptureError::Config(format!("ggml could not start {threads} threads")));
        }
        Ok(Pool { raw, threads })
    }
}
impl Drop for Pool {
    fn drop(&mut self) {
        // SAFETY: made by ggml_threadpool_new, freed once, no computation running.
        unsafe { sys::ggml_threadpool_free(self.raw) }
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: made by ggml_init, freed once.
        unsafe { sys::ggml_free(self.0) }
    }
}

/// `ne0 · ne1` weights of `ty` quantized (or converted) from a fixed pseudo-random pattern.
fn pattern(ty: sys::ggml_type, ne0: i64, ne1: i64) -> Result<Vec<u8>> {
    let src: Vec<f32> =
        (0..(ne0 * ne1) as usize).map(|i| ((i * 2654435761usize % 2001) as f32 - 1000.0) / 20000.0).collect();
    let mut dst = vec![0u8; row_bytes(ty, ne0) * ne1 as usize];
    // SAFETY: src holds ne1 rows of ne0 f32; dst holds ne1 rows of ty; no importance matrix.
    let n =
        unsafe { sys::ggml_quantize_chunk(ty, src.as_ptr(), dst.as_mut_ptr().cast(), 0, ne1, ne0, std::ptr::null()) };
    if n != dst.len() {
        return Err(CaptureError::Config(format!("ggml cannot make weights of type {}", type_name(ty))));
    }
    Ok(dst)
}

/// See [`crate::measure::measure`].
pub(crate) fn measure(cfg: &MeasureConfig, progress: &mut dyn FnMut(&str)) -> Result<Measured> {
    crate::llama::init();
    let path = &cfg.model;
    if !path.is_file() {
        return Err(CaptureError::Model { path: path.clone(), reason: "no such file".into() });
    }
    let (arch, heads, all) = tensors(path)?;
    let attn_layers = all.iter().filter(|t| t.name.ends_with(".attn_q.weight")).count();
    let find = |part: &str| all.iter().find(|t| t.name.ends_with(&format!(".ffn_{part}_exps.weight")));
    let (Some(gate), Some(up), Some(down)) = (find("gate"), find("up"), find("down")) else {
        return Err(CaptureError::Model {
            path: path.clone(),
            reason: "no routed-expert tensors (blk.N.ffn_gate_exps, ffn_up_exps, ffn_down_exps): not an MoE model \
                     llama.cpp stores with separate gate, up and down experts"
                .into(),
        });
    };
    let (hidden, inter, experts) = (gate.ne[0], gate.ne[1], gate.ne[2]);
    let expert_layers = all.iter().filter(|t| t.name.ends_with(".ffn_gate_exps.weight")).count();
    let experts_total = expert_layers * experts as usize;
    let expert_bytes = row_bytes(gate.ty, hidden) * inter as usize
        + row_bytes(up.ty, hidden) * inter as usize
        + row_bytes(down.ty, inter) * hidden as usize;
    let threads = cfg.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));

    let pool = Pool::new(threads)?;
    // Routed experts: copies enough to leave the caches, as many as the model has (at most 2 GB).
    let copies =
        cfg.expert_copies.unwrap_or_else(|| experts_total.min((COPIES_BYTES / expert_bytes.max(1)).max(2))).max(1);
    progress(&format!(
        "expert: {} x {} ({}), {:.3} MB; {copies} copies; rows {:?}",
        hidden,
        inter,
        type_name(gate.ty),
        expert_bytes as f64 / 1e6,
        ROWS
    ));
    let (pg, pu, pd) =
        (pattern(gate.ty, hidden, inter)?, pattern(up.ty, hidden, inter)?, pattern(down.ty, inter, hidden)?);
    // SAFETY: plain arithmetic.
    let overhead = unsafe { sys::ggml_tensor_overhead() };
    // The copies as sets of SET experts (3-D weights, as the model stores a layer's experts).
    let sets = copies.div_ceil(SET);
    let weights = Ctx::new(sets * (SET * expert_bytes + 3 * (overhead + 64)) + (1 << 20))?;
    let mats: Vec<[*mut sys::ggml_tensor; 3]> = (0..sets)
        .map(|_| {
            [
                weights.experts(gate.ty, hidden, inter, &pg),
                weights.experts(up.ty, hidden, inter, &pu),
                weights.experts(down.ty, inter, hidden, &pd),
            ]
        })
        .collect();
    let max_rows = *ROWS.last().unwrap_or(&1) as i64;
    let scratch_bytes = 64 * ((hidden + inter) as usize * max_rows as usize * 4 * 3 + 8 * overhead) + (64 << 20);
    let mut next = 0usize;
    // One MUL_MAT_ID graph (gate, up, down: the op llama.cpp's MoE block runs) of `n` rows choosing
    // `used` experts of the next set.
    let mut time_one = |n: usize, used: usize| -> Result<f64> {
        let scratch = Ctx::new(scratch_bytes)?;
        let [g, u, d] = mats[next % sets];
        next += 1;
        let x = scratch.input3(hidden, 1, n as i64);
        let y = scratch.input3(inter, used as i64, n as i64);
        // SAFETY: the weights and inputs are live tensors of matching extents; ids is an i32
        // [used, n] tensor of expert indices below SET.
        Ok(unsafe {
            let ids = sys::ggml_new_tensor_2d(scratch.0, sys::GGML_TYPE_I32, used as i64, n as i64);
            let v = std::slice::from_raw_parts_mut((*ids).data.cast::<i32>(), used * n);
            for (i, id) in v.iter_mut().enumerate() {
                *id = (i % used) as i32;
            }
            let outs = [
                sys::ggml_mul_mat_id(scratch.0, g, x, ids),
                sys::ggml_mul_mat_id(scratch.0, u, x, ids),
                sys::ggml_mul_mat_id(scratch.0, d, y, ids),
            ];
            scratch.time(&outs, &pool)
        })
    };
    let mut spread = |n: usize, used: usize| -> Result<Spread> {
        let mut times = Vec::with_capacity(cfg.repeats);
        for r in 0..=cfg.repeats {
            let ms = time_one(n, used)?;
            if r > 0 {
                times.push(ms); // the first run warms up
            }
        }
        Ok(Spread::of(times))
    };
    let mut expert_rows = Vec::new();
    for &n in &ROWS {
        expert_rows.push((n, spread(n, 1)?));
    }
    let mut experts_per_op = Vec::new();
    for &j in &EXPERTS_PER_OP {
        experts_per_op.push((j, spread(1, j)?));
    }
    drop(weights);

    // Dense weights of one token: every 2-D weight but the routed experts and the embedding lookup
    // (unless the output head is tied to it).
    let tied = !all.iter().any(|t| t.name == "output.weight");
    let dense: Vec<&Info> = all
        .iter()
        .filter(|t| t.ne[1] > 1 && t.ne[2] == 1 && !t.name.contains("_exps."))
        .filter(|t| t.name != "token_embd.weight" || tied)
        .collect();
    let dense_bytes: usize = dense.iter().map(|t| row_bytes(t.ty, t.ne[0]) * t.ne[1] as usize).sum();
    progress(&format!("dense: {} matrices, {:.1} MB", dense.len(), dense_bytes as f64 / 1e6));
    let dctx = Ctx::new(dense_bytes + dense.len() * 4 * (overhead + 64) + (16 << 20))?;
    let mut patterns: Vec<((sys::ggml_type, i64, i64), Vec<u8>)> = Vec::new();
    let mut dense_w = Vec::new();
    for t in &dense {
        let key = (t.ty, t.ne[0], t.ne[1]);
        if !patterns.iter().any(|(k, _)| *k == key) {
            patterns.push((key, pattern(t.ty, t.ne[0], t.ne[1])?));
        }
        let p = &patterns.iter().find(|(k, _)| *k == key).map(|(_, p)| p).unwrap_or(&patterns[0].1);
        dense_w.push((dctx.weight(t.ty, t.ne[0], t.ne[1], p), t.ne[0]));
    }
    drop(patterns);
    let mut dense_rows = Vec::new();
    for &n in &DENSE_ROWS {
        let mut times = Vec::with_capacity(cfg.repeats);
        for r in 0..=cfg.repeats {
            let attn = heads.map_or(0, |h| {
                attn_layers * (4 * overhead + (h.dim * n as i64 * (2 * h.q + 2 * h.kv)) as usize * 4 + 256)
            });
            let scratch = Ctx::new(
                dense.len() * (2 * overhead + 64)
                    + dense.iter().map(|t| (t.ne[0] + t.ne[1]) as usize * 4 * n + 64).sum::<usize>()
                    + attn
                    + (64 << 20),
            )?;
            let mut outs: Vec<_> = dense_w
                .iter()
                .map(|&(w, ne0)| {
                    let x = scratch.input(ne0, n as i64);
                    // SAFETY: live tensors of matching inner extents.
                    unsafe { sys::ggml_mul_mat(scratch.0, w, x) }
                })
                .collect();
            // Attention of n rows over n positions in every attention layer, as llama.cpp's CPU
            // backend computes it (flash attention, f16 K and V).
            if let Some(h) = heads {
                for _ in 0..attn_layers {
                    // SAFETY: tensors of the context, of the extents flash_attn_ext takes.
                    outs.push(unsafe {
                        let q = scratch.input3(h.dim, n as i64, h.q);
                        let k = sys::ggml_new_tensor_3d(scratch.0, sys::GGML_TYPE_F16, h.dim, n as i64, h.kv);
                        let v = sys::ggml_new_tensor_3d(scratch.0, sys::GGML_TYPE_F16, h.dim, n as i64, h.kv);
                        std::ptr::write_bytes((*k).data.cast::<u8>(), 0, sys::ggml_nbytes(k));
                        std::ptr::write_bytes((*v).data.cast::<u8>(), 0, sys::ggml_nbytes(v));
                        let scale = 1.0 / (h.dim as f32).sqrt();
                        sys::ggml_flash_attn_ext(scratch.0, q, k, v, std::ptr::null_mut(), scale, 0.0, 0.0)
                    });
                }
            }
            let ms = scratch.time(&outs, &pool);
            if r > 0 {
                times.push(ms);
            }
        }
        dense_rows.push((n, Spread::of(times)));
    }
    let dense_spread = dense_rows[0].1;
    // One row, j experts in one op: t(j) = fixed + j · per expert. The fixed part (dispatching a
    // layer's three ops and their barriers) is the layer's host_sync_ms; the per-expert part gives
    // host_gbps; the 64-row time less the fixed part, host_ms_per_row.
    let t_first = experts_per_op[0].1.median_ms;
    let (j_last, s_last) = experts_per_op[experts_per_op.len() - 1];
    let per_expert = ((s_last.median_ms - t_first) / (j_last - 1) as f64).max(f64::MIN_POSITIVE);
    let fixed = (t_first - per_expert).max(0.0);
    let t64 = expert_rows.last().map_or(t_first, |r| r.1.median_ms);
    let expert_mb = expert_bytes as f64 / 1e6;
    Ok(Measured {
        model: path.clone(),
        arch,
        expert_type: type_name(gate.ty),
        expert_mb,
        experts_total,
        expert_copies: copies,
        expert_rows,
        dense: dense_spread,
        dense_rows,
        dense_mb: dense_bytes as f64 / 1e6,
        threads,
        experts_per_op,
        host_gbps: expert_mb / per_expert,
        host_ms_per_row: ((t64 - fixed) / max_rows as f64).max(0.0),
        host_sync_ms: fixed,
        disk: None,
    })
}
