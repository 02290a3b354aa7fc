//! The llama.cpp run: load the model, feed it the sequences, record from the eval callback.
//!
//! Every call into llama.cpp is here (`unsafe`, each with its `SAFETY` comment); the recorder it
//! feeds is plain Rust ([`crate::record`]).
#![allow(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_void};
use std::path::Path;
use std::sync::{Mutex, Once};

use llama_cpp_sys_2 as sys;
use trace_io::{Phase, ScoreKind, TraceMeta};

use crate::input::{chunk_sequences, read_token_file};
use crate::record::{Recorder, RecorderConfig, Tensor};
use crate::tensor::Dtype;
use crate::{CaptureConfig, CaptureError, Captured, Input, LLAMA_CPP_SYS_VERSION, Progress, Result, Timing, Timings};

static INIT: Once = Once::new();
/// The last warning or error llama.cpp logged (its other output is dropped).
static LAST_LOG: Mutex<String> = Mutex::new(String::new());

/// llama.cpp's log callback: keeps the last warning or error for the messages of our errors;
/// with `MOE_OFFLOAD_LLAMA_LOG` set, passes everything through to standard error.
unsafe extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _user: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for the duration of the call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    if std::env::var_os("MOE_OFFLOAD_LLAMA_LOG").is_some() {
        use std::io::Write as _;
        let _ = std::io::stderr().write_all(text.as_bytes());
    }
    if (level == sys::GGML_LOG_LEVEL_WARN || level == sys::GGML_LOG_LEVEL_ERROR)
        && let Ok(mut last) = LAST_LOG.lock()
    {
        *last = text.trim().to_string();
    }
}

fn last_log() -> String {
    LAST_LOG.lock().map(|s| s.clone()).unwrap_or_default()
}

pub(crate) fn init() {
    INIT.call_once(|| {
        // SAFETY: called once, before any other llama.cpp call; the callback is a plain function
        // that lives for the whole program.
        unsafe {
            sys::llama_log_set(Some(on_log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

/// Owns a loaded model.
struct Model(*mut sys::llama_model);
impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_model_load_from_file, is not null, and is freed once.
        unsafe { sys::llama_model_free(self.0) }
    }
}

/// Owns a context.
struct Context(*mut sys::llama_context);
impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the pointer came from llama_init_from_model, is not null, and is freed once,
        // before the model it was made from (declared after it, so dropped first).
        unsafe { sys::llama_free(self.0) }
    }
}

/// Which tokens of a batch want logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outputs {
    /// Every token (recording).
    All,
    /// The last one (a plain run, as llama.cpp's tools do).
    Last,
}

/// Owns a batch.
struct Batch(sys::llama_batch, usize);
impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: the batch came from llama_batch_init and is freed once.
        unsafe { sys::llama_batch_free(self.0) }
    }
}

impl Batch {
    /// A batch for up to `n` tokens of one sequence.
    fn new(n: usize) -> Batch {
        // SAFETY: plain allocation of n slots, one sequence id each, no embeddings.
        Batch(unsafe { sys::llama_batch_init(n as i32, 0, 1) }, n)
    }

    /// Fills the batch with `tokens` of sequence 0 at positions `pos0..`, the logits of `outputs`
    /// requested (every token's while recording, so that llama.cpp routes every token through the
    /// last layer too).
    fn fill(&mut self, tokens: &[i32], pos0: usize, outputs: Outputs) {
        assert!(tokens.len() <= self.1, "a batch of {} tokens holds at most {}", tokens.len(), self.1);
        let b = &mut self.0;
        b.n_tokens = tokens.len() as i32;
        for (i, &t) in tokens.iter().enumerate() {
            // SAFETY: i < the n the batch was allocated for (asserted above); llama_batch_init
            // allocated token, pos, n_seq_id, logits and seq_id[i] (one id) for each slot.
            unsafe {
                *b.token.add(i) = t;
                *b.pos.add(i) = (pos0 + i) as i32;
                *b.n_seq_id.add(i) = 1;
                *(*b.seq_id.add(i)) = 0;
                *b.logits.add(i) = i8::from(outputs == Outputs::All || i + 1 == tokens.len());
            }
        }
    }
}

/// A string value of the model's GGUF metadata.
fn meta_str(model: &Model, key: &str) -> Option<String> {
    let key = CString::new(key).ok()?;
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: model is a loaded model; key is NUL-terminated; buf has buf.len() bytes.
        let n = unsafe { sys::llama_model_meta_val_str(model.0, key.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        let n = usize::try_from(n).ok()?;
        if n < buf.len() {
            return Some(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        buf.resize(n + 1, 0);
    }
}

/// The model's tokens for `text` (with its BOS where the model adds one).
fn tokenize(vocab: *const sys::llama_vocab, text: &str, path: &Path) -> Result<Vec<i32>> {
    let len = i32::try_from(text.len()).map_err(|_| CaptureError::Input {
        path: path.into(),
        line: 0,
        reason: "text of 2 GiB or more: split it".into(),
    })?;
    // SAFETY: vocab belongs to the loaded model.
    let add_bos = unsafe { sys::llama_vocab_get_add_bos(vocab) };
    let mut tokens = vec![0i32; text.len() + 2];
    loop {
        // SAFETY: text is valid for len bytes; tokens has tokens.len() slots.
        let n = unsafe {
            sys::llama_tokenize(
                vocab,
                text.as_ptr().cast(),
                len,
                tokens.as_mut_ptr(),
                tokens.len() as i32,
                add_bos,
                false,
            )
        };
        if n >= 0 {
            tokens.truncate(n as usize);
            return Ok(tokens);
        }
        tokens.resize(n.unsigned_abs() as usize, 0);
    }
}

/// What the eval callback reaches through its user-data pointer.
struct State {
    rec: Recorder,
    error: Option<CaptureError>,
}

/// The context's eval callback: in the ask phase, wants the tensors the recorder reads; then
/// hands each computed one to the recorder. Returning false stops the computation (after an error).
unsafe extern "C" fn on_tensor(t: *mut sys::ggml_tensor, ask: bool, user: *mut c_void) -> bool {
    // SAFETY: llama.cpp's scheduler passes a tensor of the graph being computed, valid for the call.
    let t = unsafe { &*t };
    // SAFETY: ggml tensor names are NUL-terminated within their fixed array.
    let name = unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_str().unwrap_or("");
    if ask {
        return Recorder::wants(name);
    }
    // SAFETY: user is the State the runner passed as cb_eval_user_data; the runner touches it only
    // between llama_decode calls, never while this callback can run.
    let state = unsafe { &mut *user.cast::<State>() };
    if state.error.is_some() {
        return false;
    }
    let dtype = match t.type_ {
        sys::GGML_TYPE_F32 => Dtype::F32,
        sys::GGML_TYPE_I32 => Dtype::I32,
        // ggml_type is a C enum: u32 here, i32 where the platform's enums are signed.
        #[allow(clippy::unnecessary_cast)]
        other => Dtype::Other(other as u32),
    };
    let ptr: *const sys::ggml_tensor = t;
    let mut read = |offset: usize, buf: &mut [u8]| -> Result<()> {
        // SAFETY: the tensor is computed (ask phase passed); offset + len lies within its data:
        // the recorder reads row t, element j at t·nb[token] + j·nb[elem] with t < its extent, so
        // the end is at most ggml_nbytes. ggml_backend_tensor_get copies from host or device memory.
        unsafe { sys::ggml_backend_tensor_get(ptr, buf.as_mut_ptr().cast(), offset, buf.len()) };
        Ok(())
    };
    match state.rec.tensor(Tensor { name, dtype, ne: t.ne, nb: t.nb, read: &mut read }) {
        Ok(()) => true,
        Err(e) => {
            state.error = Some(e);
            false
        }
    }
}

/// The greedy next token after the last output of the latest decode: the largest logit, ties
/// the lowest id.
fn argmax_last(ctx: &Context, n_vocab: usize) -> i32 {
    // SAFETY: the latest decode requested logits for its last token; -1 selects it; the row has
    // n_vocab floats.
    let row = unsafe { std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx.0, -1), n_vocab) };
    let mut best = 0usize;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as i32
}

/// The inputs as token sequences, before chunking.
fn read_inputs(cfg: &CaptureConfig, vocab: *const sys::llama_vocab, n_vocab: i32) -> Result<Vec<Vec<i32>>> {
    let mut seqs = Vec::new();
    match &cfg.input {
        Input::Text(files) => {
            for p in files {
                let text = trace_io::read_regular_to_string(p).map_err(|e| CaptureError::Input {
                    path: p.clone(),
                    line: 0,
                    reason: e.to_string(),
                })?;
                seqs.push(tokenize(vocab, &text, p)?);
            }
        }
        Input::Tokens(files) => {
            for p in files {
                let these = read_token_file(p)?;
                if let Some(bad) = these.iter().flatten().find(|&&t| t >= n_vocab) {
                    return Err(CaptureError::Input {
                        path: p.clone(),
                        line: 0,
                        reason: format!("token id {bad} is not below the model's vocabulary size {n_vocab}"),
                    });
                }
                seqs.extend(these);
            }
        }
    }
    if let Some(max) = cfg.max_tokens {
        let mut left = max;
        for s in &mut seqs {
            s.truncate(left);
            left -= s.len();
        }
    }
    Ok(seqs)
}

pub(crate) fn run(cfg: &CaptureConfig, progress: &mut dyn FnMut(Progress)) -> Result<Captured> {
    init();
    let path = &cfg.model;
    let model_err = |reason: String| CaptureError::Model { path: path.clone(), reason };
    if !path.is_file() {
        return Err(model_err("no such file".into()));
    }
    let c_path = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| model_err("a NUL in the path".into()))?;
    // SAFETY: plain default parameters.
    let mut mp = unsafe { sys::llama_model_default_params() };
    mp.n_gpu_layers = cfg.gpu_layers;
    if let Ok(mut last) = LAST_LOG.lock() {
        last.clear();
    }
    // SAFETY: c_path is NUL-terminated; the parameters are llama.cpp's defaults with n_gpu_layers set.
    let raw = unsafe { sys::llama_model_load_from_file(c_path.as_ptr(), mp) };
    if raw.is_null() {
        return Err(model_err(format!("llama.cpp could not load it: {}", last_log())));
    }
    let model = Model(raw);
    let arch = meta_str(&model, "general.architecture").unwrap_or_default();
    let count = |key: &str| meta_str(&model, &format!("{arch}.{key}")).and_then(|v| v.trim().parse::<usize>().ok());
    let (experts, used) = match (count("expert_count"), count("expert_used_count")) {
        (Some(e), Some(k)) if e > 0 && k > 0 => (e, k),
        _ => {
            return Err(CaptureError::NotMoe { path: path.clone(), arch, missing: "ffn_moe_topk-<layer>".into() });
        }
    };
    // SAFETY: the model is loaded; the vocabulary lives as long as it.
    let vocab = unsafe { sys::llama_model_get_vocab(model.0) };
    // SAFETY: as above.
    let n_vocab = unsafe { sys::llama_vocab_n_tokens(vocab) };
    let seqs = chunk_sequences(read_inputs(cfg, vocab, n_vocab)?, cfg.ctx - cfg.generate)?;
    let prefill_tokens: usize = seqs.iter().map(Vec::len).sum();
    if prefill_tokens == 0 {
        return Err(CaptureError::Config("the input holds no token".into()));
    }
    let candidates = cfg.candidates.unwrap_or(experts).min(experts).max(used);
    let rec = Recorder::new(RecorderConfig { num_experts: experts, top_k: used, candidates })?;
    let mut state = Box::new(State { rec, error: None });
    let sp: *mut State = &mut *state;

    let threads = cfg.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let n_batch = cfg.batch.min(cfg.ctx);
    // SAFETY: plain default parameters.
    let mut cp = unsafe { sys::llama_context_default_params() };
    cp.n_ctx = cfg.ctx as u32;
    cp.n_batch = n_batch as u32;
    cp.n_ubatch = n_batch as u32;
    cp.n_seq_max = 1;
    cp.n_threads = threads as i32;
    cp.n_threads_batch = threads as i32;
    cp.cb_eval = Some(on_tensor);
    cp.cb_eval_user_data = sp.cast();
    cp.no_perf = false;
    // SAFETY: the model is loaded; sp points at the boxed State, which outlives the context
    // (dropped after it at the end of this function).
    let raw = unsafe { sys::llama_init_from_model(model.0, cp) };
    if raw.is_null() {
        return Err(model_err(format!("llama.cpp could not make a context of {} tokens: {}", cfg.ctx, last_log())));
    }
    let ctx = Context(raw);
    let mut batch = Batch::new(n_batch);
    let mut fetched = Fetched::new();
    progress(Progress::Start { sequences: seqs.len(), tokens: prefill_tokens, generate: cfg.generate });

    let mut first = true;
    let mut generated: Vec<Vec<i32>> = Vec::with_capacity(seqs.len());
    for (si, seq) in seqs.iter().enumerate() {
        // SAFETY: ctx is live; clearing the memory (KV cache) starts a fresh sequence.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(ctx.0), true) };
        // SAFETY: between decodes (see `decode`).
        let st = unsafe { &mut *sp };
        st.rec.begin_sequence();
        let mut pos = 0usize;
        for chunk in seq.chunks(n_batch) {
            batch.fill(chunk, pos, Outputs::All);
            fetched.count(Phase::Prefill, || decode(&ctx, sp, &batch, si))?;
            // SAFETY: between decodes.
            let st = unsafe { &mut *sp };
            st.rec.end_batch(chunk.len(), Phase::Prefill)?;
            if first && st.rec.layers() == 0 {
                return Err(CaptureError::NotMoe { path: path.clone(), arch, missing: "ffn_moe_topk-<layer>".into() });
            }
            first = false;
            pos += chunk.len();
            progress(Progress::Tokens(st.rec.tokens()));
        }
        let mut next = argmax_last(&ctx, n_vocab as usize);
        let mut fed = Vec::new();
        for _ in 0..cfg.generate {
            // SAFETY: vocab belongs to the loaded model.
            if unsafe { sys::llama_vocab_is_eog(vocab, next) } {
                break;
            }
            batch.fill(&[next], pos, Outputs::All);
            fed.push(next);
            fetched.count(Phase::Decode, || decode(&ctx, sp, &batch, si))?;
            // SAFETY: between decodes.
            let st = unsafe { &mut *sp };
            st.rec.end_batch(1, Phase::Decode)?;
            pos += 1;
            next = argmax_last(&ctx, n_vocab as usize);
            progress(Progress::Tokens(st.rec.tokens()));
        }
        generated.push(fed);
    }
    let (ctx, fetched) = match cfg.timing {
        Timing::EvalCallback => (ctx, fetched),
        Timing::PlainRun => {
            drop(ctx);
            progress(Progress::TimingRun);
            plain_run(&model, cp, &seqs, &generated, &mut batch, path)?
        }
    };
    // SAFETY: ctx is live.
    let perf = unsafe { sys::llama_perf_context(ctx.0) };
    let timings = Timings {
        load_ms: perf.t_load_ms,
        // Wall time of the phase's llama_decode calls, each synchronized: llama.cpp's own prompt
        // counter (t_p_eval_ms) reads about 0 when the eval callback splits the graph.
        prompt_ms: fetched.prompt_ms,
        // The tokens fed, not llama.cpp's counters: llama_perf_context reports at least 1 decode
        // token even when none ran.
        prompt_tokens: prefill_tokens as u64,
        decode_ms: fetched.decode_ms,
        llama_perf_prompt_ms: perf.t_p_eval_ms,
        llama_perf_decode_ms: perf.t_eval_ms,
        decode_tokens: generated.iter().map(Vec::len).sum::<usize>() as u64,
        prompt_read_mb: fetched.prompt.map(|b| b as f64 / 1e6),
        decode_read_mb: fetched.decode.map(|b| b as f64 / 1e6),
        prompt_sys_ms: fetched.prompt_sys_ms,
        decode_sys_ms: fetched.decode_sys_ms,
        threads,
        batch: n_batch,
        timing: cfg.timing,
    };
    let devices = devices();
    drop(batch);
    drop(ctx);
    let State { rec, .. } = *state;

    let file = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    let mut extra = BTreeMap::new();
    let per_token = |ms: f64, n: u64| if n == 0 { "0".to_string() } else { format!("{:.4}", ms / n as f64) };
    for (k, v) in [
        ("llama_arch", arch.clone()),
        ("llama_file_type", meta_str(&model, "general.file_type").unwrap_or_default()),
        ("llama_ctx", cfg.ctx.to_string()),
        ("llama_batch", n_batch.to_string()),
        ("llama_threads", threads.to_string()),
        ("llama_gpu_layers", cfg.gpu_layers.to_string()),
        ("llama_devices", devices.join(",")),
        ("llama_prompt_ms_per_token", per_token(timings.prompt_ms, timings.prompt_tokens)),
        ("llama_decode_ms_per_token", per_token(timings.decode_ms, timings.decode_tokens)),
        ("llama_load_ms", format!("{:.1}", timings.load_ms)),
        ("llama_prompt_read_mb", timings.prompt_read_mb.map_or_else(String::new, |m| format!("{m:.3}"))),
        ("llama_decode_read_mb", timings.decode_read_mb.map_or_else(String::new, |m| format!("{m:.3}"))),
        ("llama_timed_with_eval_callback", (cfg.timing == Timing::EvalCallback).to_string()),
        ("generate", cfg.generate.to_string()),
    ] {
        if !v.is_empty() || !k.ends_with("_read_mb") {
            extra.insert(k.to_string(), v);
        }
    }
    let meta = TraceMeta {
        model: meta_str(&model, "general.name").filter(|s| !s.is_empty()).unwrap_or_else(|| file.clone()),
        num_experts: 0,
        top_k: 0,
        layer_ids: Vec::new(),
        score_kind: ScoreKind::None,
        phase: Phase::Unknown,
        source: format!("llama.cpp capture of {file} ({LLAMA_CPP_SYS_VERSION}), eval callback on ffn_moe_*"),
        extra,
    };
    let (trace, recorded) = rec.finish(meta)?;
    let mut notes = Vec::new();
    if recorded.disordered_rows > 0 {
        notes.push(format!(
            "{} rows: the runtime's top-k is not the top k of ffn_moe_logits ({}): the trace holds the used ids alone, no scores",
            recorded.disordered_rows,
            if recorded.selection_bias { "the graph adds a selection bias or masks groups" } else { "ties or rounding" }
        ));
    }
    Ok(Captured { trace, recorded, timings, arch, sequences: seqs.len(), notes })
}

/// The same sequences again in a context without the eval callback, prefill with the last token's
/// logits only and decode feeding the tokens the capture generated, for llama.cpp's timings of a
/// plain run. Returns that context (its `llama_perf_context` holds the timings).
fn plain_run(
    model: &Model,
    mut cp: sys::llama_context_params,
    seqs: &[Vec<i32>],
    generated: &[Vec<i32>],
    batch: &mut Batch,
    path: &Path,
) -> Result<(Context, Fetched)> {
    let mut fetched = Fetched::new();
    cp.cb_eval = None;
    cp.cb_eval_user_data = std::ptr::null_mut();
    // SAFETY: the model is loaded; the parameters are the capture's without the callback.
    let raw = unsafe { sys::llama_init_from_model(model.0, cp) };
    if raw.is_null() {
        return Err(CaptureError::Model { path: path.into(), reason: format!("a second context: {}", last_log()) });
    }
    let ctx = Context(raw);
    for (si, (seq, fed)) in seqs.iter().zip(generated).enumerate() {
        // SAFETY: ctx is live.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(ctx.0), true) };
        let mut pos = 0usize;
        for chunk in seq.chunks(batch.1) {
            batch.fill(chunk, pos, Outputs::Last);
            fetched.count(Phase::Prefill, || llama_decode(&ctx, batch, si))?;
            pos += chunk.len();
        }
        for &t in fed {
            batch.fill(&[t], pos, Outputs::Last);
            fetched.count(Phase::Decode, || llama_decode(&ctx, batch, si))?;
            pos += 1;
        }
    }
    Ok((ctx, fetched))
}

/// Wall time, bytes fetched from storage ([`crate::disk::read_bytes`]) and the process's system
/// CPU time (page faults, reclaim) of the prompt and the decode `llama_decode`s of one run; a
/// byte count is `None` once a reading is missing.
struct Fetched {
    prompt: Option<u64>,
    decode: Option<u64>,
    prompt_ms: f64,
    decode_ms: f64,
    prompt_sys_ms: f64,
    decode_sys_ms: f64,
}

impl Fetched {
    fn new() -> Fetched {
        Fetched {
            prompt: Some(0),
            decode: Some(0),
            prompt_ms: 0.0,
            decode_ms: 0.0,
            prompt_sys_ms: 0.0,
            decode_sys_ms: 0.0,
        }
    }
    /// Runs `f` and adds its wall time, what it fetched and its system time to the phase's counts.
    fn count(&mut self, phase: Phase, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let (before, sys_before) = (crate::disk::read_bytes(), sys_ms());
        let start = std::time::Instant::now();
        f()?;
        let wall = start.elapsed().as_secs_f64() * 1e3;
        let (after, sys_after) = (crate::disk::read_bytes(), sys_ms());
        let (acc, ms, sys) = if phase == Phase::Decode {
            (&mut self.decode, &mut self.decode_ms, &mut self.decode_sys_ms)
        } else {
            (&mut self.prompt, &mut self.prompt_ms, &mut self.prompt_sys_ms)
        };
        *acc = acc.zip(before.zip(after)).map(|(sum, (b, a))| sum + a.saturating_sub(b));
        *ms += wall;
        *sys += sys_after - sys_before;
        Ok(())
    }
}

/// The process's system CPU time so far, ms (`getrusage`; every thread of ggml's pool).
fn sys_ms() -> f64 {
    // SAFETY: getrusage writes the struct it is given; a zeroed rusage is a valid value.
    let mut r: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF needs no other argument.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) } != 0 {
        return 0.0;
    }
    r.ru_stime.tv_sec as f64 * 1e3 + r.ru_stime.tv_usec as f64 / 1e3
}

/// Runs one `llama_decode` of `batch` and synchronizes, which is what adds its time to llama.cpp's
/// prompt or decode counters.
fn llama_decode(ctx: &Context, batch: &Batch, sequence: usize) -> Result<()> {
    // SAFETY: ctx and batch are live; the batch was filled with n_tokens valid slots.
    let rc = unsafe {
        let rc = sys::llama_decode(ctx.0, batch.0);
        sys::llama_synchronize(ctx.0);
        rc
    };
    if rc != 0 {
        return Err(CaptureError::Decode { sequence, code: rc, detail: last_log() });
    }
    Ok(())
}

/// [`llama_decode`] with the eval callback recording: the error the callback met, if any, comes
/// first (it is why the decode stopped).
fn decode(ctx: &Context, sp: *mut State, batch: &Batch, sequence: usize) -> Result<()> {
    let decoded = llama_decode(ctx, batch, sequence);
    // SAFETY: no decode is running: the callback cannot touch the State now.
    let st = unsafe { &mut *sp };
    match st.error.take() {
        Some(e) => Err(e),
        None => decoded,
    }
}

/// The names of the backend devices llama.cpp registered (CPU, and a GPU where built with one).
fn devices() -> Vec<String> {
    // SAFETY: the backend registry is initialized by llama_backend_init.
    let n = unsafe { sys::ggml_backend_dev_count() };
    (0..n)
        .filter_map(|i| {
            // SAFETY: i < the device count; names are NUL-terminated strings owned by the registry.
            let dev = unsafe { sys::ggml_backend_dev_get(i) };
            if dev.is_null() {
                return None;
            }
            // SAFETY: as above.
            let name = unsafe { sys::ggml_backend_dev_name(dev) };
            // SAFETY: as above.
            (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
        })
        .collect()
}
