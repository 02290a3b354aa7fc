//! `moe-offload plan --exec host --gpu-budget-gb X`: pinned experts per layer chosen by the
//! in-sample tok/s of hybrid execution, reported with their out-of-sample tok/s (SEMANTICS.md §14; [`sweep::plan::hybrid`]), at both
//! granularities: per expert (kTransformers-style counts and lists; the `--moe-hot-count` list of
//! unmerged llama.cpp patches) and per layer (llama.cpp's `-ot ...=CPU`, and `--n-cpu-moe N` when
//! exactly the same: [`sweep::plan::llama`]).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use cachesim::hybrid::{Exec, Overlap};
use clap::Args;
use serde_json::json;
use sweep::DeviceProfile;
use sweep::plan::hybrid::{Granularity, HybridPlan, HybridPlanRequest, plan_hybrid};
use sweep::plan::llama;
use trace_io::TraceFile;

/// The flags of `plan --exec host`.
#[derive(Debug, Args)]
pub struct HybridFlags {
    /// Plan for hybrid execution (SEMANTICS.md §14): `host` (pins chosen by tok/s, cap 0).
    #[arg(long)]
    pub exec: Option<Exec>,
    /// GPU memory for pinned experts and the KV cache, GB (default: the profile's gpu_gb).
    #[arg(long, value_parser = crate::args::non_negative, requires = "exec")]
    pub gpu_budget_gb: Option<f64>,
    /// GPU memory the KV cache takes from the budget, GB.
    #[arg(long, default_value_t = 0.0, value_parser = crate::args::non_negative, requires = "exec")]
    pub kv_gb: f64,
    /// How host and GPU parts of a layer combine (default: the profile's, else sequential).
    #[arg(long)]
    pub overlap: Option<Overlap>,
    /// A profile file (docs/grid-format.md, "Profiles"); instead of `--profile NAME`.
    #[arg(long, conflicts_with = "profile")]
    pub profile_file: Option<PathBuf>,
    /// The model's blocks with routed experts (`1-26`, `0,8,12-18`), for the llama.cpp flags:
    /// without it they are the traced layers, and a trace that lacks a block below its last layer
    /// gets no flags (the block may be an MoE layer it did not record).
    #[arg(long)]
    pub moe_layers: Option<crate::args::Blocks>,
}

/// Runs `plan --exec host`.
pub fn run(a: &super::PlanArgs) -> Result<()> {
    let h = &a.hybrid;
    if h.exec != Some(Exec::Host) {
        bail!("--exec {}: plan supports exec host (static pins, cap 0)", h.exec.map_or("-".into(), |e| e.to_string()));
    }
    // The flags of the cache plan that the hybrid plan does not read: refused, not ignored.
    let not_read = [
        (a.budget_gb.is_some(), "--budget-gb", "the GPU budget is --gpu-budget-gb"),
        (a.pinned_gb != 0.0, "--pinned-gb", "memory the KV cache takes is --kv-gb"),
        (a.policy != cachesim::Policy::Lru, "--policy", "with cap 0 there is no cache to evict from"),
        (a.variants.iter().any(|v| v != "full"), "--variants", "the hybrid plan keeps every expert"),
        (a.pin_counts.is_some(), "--pin-counts", "the hybrid plan chooses each layer's pinned count itself"),
        (a.max_slot_replacement.is_some(), "--max-slot-replacement", "quality floors choose among pruned variants"),
        (!a.quality.is_empty(), "--quality", "quality floors choose among pruned variants"),
        (a.max_kl.is_some(), "--max-kl", "quality floors choose among pruned variants"),
        (a.max_ppl_increase.is_some(), "--max-ppl-increase", "quality floors choose among pruned variants"),
    ];
    if let Some((_, flag, why)) = not_read.iter().find(|f| f.0) {
        bail!("{flag} is not read by plan --exec host ({why}): drop it, or plan the cache without --exec");
    }
    crate::commands::refuse_overwrite(a.output(), [a.in_sample.as_path(), a.out_of_sample.as_path()])?;
    let calib = TraceFile::open(&a.in_sample)?;
    let held = TraceFile::open(&a.out_of_sample)?;
    let (cv, hv) = (calib.view(), held.view());
    crate::commands::require_tokens(cv.shape(), &a.in_sample)?;
    crate::commands::require_tokens(hv.shape(), &a.out_of_sample)?;
    let mut profile = match &h.profile_file {
        Some(f) => DeviceProfile::read(f).with_context(|| format!("--profile-file {}", f.display()))?,
        None => {
            let inferred = a.profile.is_none().then(|| sweep::preset_for_model(&cv.meta().model)).flatten();
            let name = a.profile.as_deref().or(inferred).unwrap_or("reference");
            DeviceProfile::preset(name).with_context(|| format!("unknown profile {name:?}; see docs/grid-format.md"))?
        }
    };
    if let Some(mb) = a.expert_mb {
        profile.expert_mb = mb;
    }
    let device = profile.hybrid(h.overlap)?;
    let budget = h.gpu_budget_gb.or(profile.gpu_gb).with_context(|| {
        format!(
            "--gpu-budget-gb: give the GPU memory for experts and KV cache (profile {:?} has no gpu_gb)",
            profile.name
        )
    })?;
    let req = HybridPlanRequest {
        in_sample: &cv,
        out_of_sample: &hv,
        device,
        gpu_budget_gb: budget,
        kv_gb: h.kv_gb,
        k_used: a.k_used.unwrap_or(cv.shape().top_k),
        warmup: a.warmup,
        granularity: Granularity::Expert,
    };
    let per_expert = plan_hybrid(&req)?;
    let per_layer = plan_hybrid(&HybridPlanRequest { granularity: Granularity::Layer, ..req })?;
    let ids = &cv.meta().layer_ids;
    let cpu: Vec<u32> = ids.iter().zip(&per_layer.counts).filter(|(_, n)| **n == 0).map(|(&id, _)| id).collect();
    let flags = llama::cpu_layer_flags(ids, &cpu, h.moe_layers.as_ref().map(|b| b.0.as_slice()));
    let hot = sweep::plan::hot_count_list(ids, &per_expert.counts);
    let doc = json!({
        "kind": crate::commands::json::HYBRID_PLAN,
        "tool_version": crate::commands::version(),
        "exec": "host",
        "overlap": device.overlap,
        "gpu_budget_gb": budget,
        "kv_gb": h.kv_gb,
        "profile": profile,
        "k_used": req.k_used,
        "warmup": a.warmup,
        "in_sample": a.in_sample.display().to_string(),
        "out_of_sample": a.out_of_sample.display().to_string(),
        "layer_ids": ids,
        "per_expert": per_expert,
        "per_layer": per_layer,
        "moe_layers": h.moe_layers.as_ref().map(|b| &b.0),
        "llama_cpp": match &flags {
            Ok(f) => json!({ "flags": f, "refused": null }),
            Err(e) => json!({ "flags": null, "refused": e.to_string() }),
        },
        "unmerged_moe_hot_count": hot,
    });
    let bytes = serde_json::to_vec_pretty(&doc)?;
    let bytes = [bytes, b"\n".to_vec()].concat();
    crate::commands::write_output(a.output(), &bytes)?;
    if a.json {
        if !crate::commands::is_stdout(a.output()) {
            crate::commands::status(format_args!("wrote {}", a.output().display()));
            crate::commands::write_output(std::path::Path::new("-"), &bytes)?;
        }
        return Ok(());
    }
    let mut out = crate::commands::human(a.output());
    let line = |p: &HybridPlan| {
        format!(
            "{:.2} tok/s out of sample ({:.2} in sample, where it was chosen; {:.2} all-CPU, {:.2} all-GPU), {:.3} GB \
             of GPU memory",
            p.tok_s, p.in_sample_tok_s, p.baseline_tok_s, p.all_gpu_tok_s, p.gpu_gb
        )
    };
    writeln!(
        out,
        "plan --exec host, {} overlap, budget {budget} GB (KV {} GB), profile {}",
        device.overlap, h.kv_gb, profile.name
    )?;
    writeln!(out, "per expert: {}", line(&per_expert))?;
    writeln!(
        out,
        "  pinned per layer: {}",
        per_expert.counts.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
    )?;
    writeln!(
        out,
        "  hot counts per model layer: {hot} (kTransformers-style placement; stock llama.cpp places whole \
         layers only, and `--moe-hot-count` is from unmerged llama.cpp patches, not a llama.cpp flag)"
    )?;
    writeln!(out, "per layer: {}", line(&per_layer))?;
    match &flags {
        Err(e) => {
            writeln!(out, "  llama.cpp flags: none: {}", crate::commands::plan::spell_moe_layers(&e.to_string()))?
        }
        Ok(f) if f.args.is_empty() => writeln!(out, "  every layer's experts on the GPU (no llama.cpp flags)")?,
        Ok(f) => {
            writeln!(out, "  llama.cpp {}", f.shell_line())?;
            if let Some(n) = f.n_cpu_moe {
                writeln!(out, "    the same placement: --n-cpu-moe {n}")?;
            }
            writeln!(
                out,
                "    one argument per line: moe-offload export llama-cpp {} -o flags.txt",
                crate::commands::shown(a.output())
            )?;
        }
    }
    writeln!(out, "wrote {}", crate::commands::shown(a.output()))?;
    Ok(())
}
