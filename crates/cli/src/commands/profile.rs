//! `moe-offload profile show`: every field of a device profile (a preset or a profile file) with
//! its unit, so that a profile's figures can be checked before they price a replay, a sweep or a
//! plan (SEMANTICS.md §6, §10, §11, §14; docs/grid-format.md, "Profiles").

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use sweep::DeviceProfile;

use super::{align_numbers, json as kinds};

/// `moe-offload profile ...`.
#[derive(Debug, Subcommand)]
pub enum ProfileCmd {
    /// Print every field of a device profile with its unit: a preset by name, or a profile file.
    #[command(
        after_help = "Examples:\n  moe-offload profile show dsv2-lite-bf16\n  moe-offload profile show --file data/profiles/laptop-16gb-ddr5.json --json"
    )]
    Show(ShowArgs),
    /// Measure this machine with llama.cpp's CPU kernels on a GGUF model's tensors and write a profile
    /// (host expert runs of 1..64 rows, dense compute per token; needs a build with the capture feature).
    #[command(
        after_help = "Examples:\n  moe-offload profile measure --gguf model.gguf -o hw.json\n  moe-offload profile measure --gguf model.gguf --threads 8 --repeats 9 --json\nThen: moe-offload replay trace.safetensors --exec host --cap 0 --profile-file hw.json (docs/validation.md)."
    )]
    Measure(MeasureArgs),
}

/// `moe-offload profile measure --gguf MODEL [--threads N] [--repeats R] [-o FILE] [--json]`.
#[derive(Debug, Args)]
pub struct MeasureArgs {
    /// The GGUF model whose expert and dense tensor types and shapes are timed.
    #[arg(long)]
    gguf: PathBuf,
    /// CPU threads (default: every core).
    #[arg(long)]
    threads: Option<usize>,
    /// Repeats of each timing; the median is used.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Copies of the expert cycled through while timing (default: as many as the model has experts,
    /// at most 2 GB); a few copies that fit in the CPU's caches time a warm expert.
    #[arg(long, value_name = "N")]
    expert_copies: Option<usize>,
    /// Also time cold reads of one expert from a test file in this directory (its disk): direct,
    /// buffered and through mmap; the mmap rate becomes the profile's SSD bandwidth.
    #[arg(long, value_name = "DIR")]
    disk: Option<PathBuf>,
    /// Size of the disk test file, MB.
    #[arg(long, default_value_t = 1000, requires = "disk")]
    disk_mb: u64,
    /// Cold reads timed per disk mode.
    #[arg(long, default_value_t = 16, requires = "disk")]
    disk_reads: usize,
    /// The profile to write (a device profile for --profile-file).
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Print one JSON document (kind moe-offload-profile-measure) instead of the table.
    #[arg(long)]
    json: bool,
}

/// `moe-offload profile show [NAME | --file FILE] [--json]`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// A preset's name (reference, dsv2-lite-bf16, qwen15-moe-bf16, mixtral-8x7b-q4).
    #[arg(conflicts_with = "file")]
    name: Option<String>,
    /// A profile file (one JSON object, as `--profile-file` and grid profiles take it).
    #[arg(long)]
    file: Option<PathBuf>,
    /// Print one JSON document (`kind` moe-offload-profile) instead of the table.
    #[arg(long)]
    json: bool,
}

/// One line of the table: a field, its value as written (`None` = absent), its unit and what an
/// absent value means.
struct Field {
    name: &'static str,
    value: Option<Value>,
    unit: &'static str,
    absent: &'static str,
}

/// Every field of `p`, in the order of [`DeviceProfile`].
fn fields(p: &DeviceProfile) -> Vec<Field> {
    let num = |v: Option<f64>| v.map(Value::from);
    let f = |name, value, unit, absent| Field { name, value, unit, absent };
    vec![
        f("name", Some(p.name.clone().into()), "", ""),
        f("expert_mb", num(Some(p.expert_mb)), "MB (10^6 bytes) per expert as stored", ""),
        f("compute_ms", num(Some(p.compute_ms)), "ms per token (dense compute on the GPU)", ""),
        f("bandwidth_gbps", Some(json!(p.bandwidth_gbps)), "GB/s (10^9 B/s), SSD reads (§6)", ""),
        f("link_gbps", num(p.link_gbps), "GB/s, host-to-GPU link (§10, §14)", "none: no loads or copies allowed"),
        f("compute_ms_per_step", num(p.compute_ms_per_step), "ms per engine step (§11)", "compute_ms x rows"),
        f("host_gbps", num(p.host_gbps), "GB/s the CPU expert kernels reach (§14)", "none: exec host refused"),
        f("host_ms_per_row", num(p.host_ms_per_row), "ms per row per expert on the CPU (§14)", "0"),
        f("host_sync_ms", num(p.host_sync_ms), "ms per layer with host runs (§14)", "0"),
        f("overlap", p.overlap.map(|o| o.to_string().into()), "sequential or concurrent (§14)", "sequential"),
        f("gpu_gb", num(p.gpu_gb), "GB (10^9 bytes) for experts and KV cache", "none: give --gpu-budget-gb"),
    ]
}

/// Figures that follow from the profile: one expert's host-run time at the memory bound and its
/// link time τ (§14), in ms.
fn derived(p: &DeviceProfile) -> Vec<(&'static str, Option<f64>, &'static str)> {
    vec![
        (
            "host_ms_per_expert",
            p.host_gbps.map(|b| p.expert_mb / b),
            "ms, expert_mb / host_gbps (a host run's memory bound)",
        ),
        ("link_ms_per_expert", p.link_gbps.map(|b| p.expert_mb / b), "ms, expert_mb / link_gbps (tau of §14)"),
        (
            "rows_memory_bound",
            p.host_gbps.zip(p.host_ms_per_row.filter(|&r| r > 0.0)).map(|(b, r)| p.expert_mb / b / r),
            "rows below which a host run is memory bound",
        ),
    ]
}

/// Runs `moe-offload profile`.
pub fn run(cmd: &ProfileCmd) -> Result<()> {
    match cmd {
        ProfileCmd::Show(a) => show(a),
        ProfileCmd::Measure(a) => measure(a),
    }
}

/// The profile named by `a`: a preset, or a profile file (read and checked by
/// [`DeviceProfile::read`]); and where it came from.
fn load(a: &ShowArgs) -> Result<(DeviceProfile, String)> {
    if let Some(file) = &a.file {
        let p = DeviceProfile::read(file).with_context(|| format!("reading the profile file {}", file.display()))?;
        return Ok((p, file.display().to_string()));
    }
    let Some(name) = a.name.as_deref() else { bail!("profile show: give a preset's name or --file FILE") };
    match DeviceProfile::preset(name) {
        Some(p) => Ok((p, "preset".into())),
        None => {
            let names: Vec<&str> = sweep::PRESETS.iter().map(|p| p.0).chain(["reference"]).collect();
            bail!("unknown profile {name:?}; expected one of: {} (or --file FILE for a profile file)", names.join(", "))
        }
    }
}

fn show(a: &ShowArgs) -> Result<()> {
    let (p, source) = load(a)?;
    let fields = fields(&p);
    let derived = derived(&p);
    if a.json {
        let mut profile = serde_json::Map::new();
        let mut units = serde_json::Map::new();
        for f in &fields {
            profile.insert(f.name.into(), f.value.clone().unwrap_or(Value::Null));
            units.insert(f.name.into(), f.unit.into());
        }
        let derived: serde_json::Map<String, Value> =
            derived.iter().map(|(n, v, _)| ((*n).to_string(), v.map_or(Value::Null, Value::from))).collect();
        let doc = json!({"source": source, "profile": profile, "units": units, "derived": derived});
        return kinds::print(&kinds::tagged(kinds::PROFILE, doc));
    }
    let mut t = comfy_table::Table::new();
    t.load_preset(comfy_table::presets::ASCII_MARKDOWN);
    t.set_header(["field", "value", "unit", "when absent"]);
    for f in &fields {
        let value = match &f.value {
            None => "-".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(v)) => v.iter().map(Value::to_string).collect::<Vec<_>>().join(", "),
            Some(v) => v.to_string(),
        };
        t.add_row([f.name, &value, f.unit, f.absent]);
    }
    for (name, v, unit) in &derived {
        t.add_row([*name, &v.map_or("-".into(), |v| format!("{v:.4}")), *unit, "(derived)"]);
    }
    align_numbers(&mut t);
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    writeln!(out, "profile {} ({source})", p.name)?;
    writeln!(out, "{t}")?;
    Ok(out.flush()?)
}

fn measure(a: &MeasureArgs) -> Result<()> {
    use std::io::Write as _;

    use crate::args::Spelled;
    let config = capture::measure::MeasureConfig {
        model: a.gguf.clone(),
        threads: a.threads,
        repeats: a.repeats,
        expert_copies: a.expert_copies,
        disk: a.disk.as_ref().map(|dir| capture::disk::DiskConfig {
            reads: a.disk_reads,
            file_mb: a.disk_mb,
            ..capture::disk::DiskConfig::new(dir.clone())
        }),
    };
    let request = api::measure::MeasureRequest { config, output: a.output.clone() };
    let r = request.run(&mut |line| crate::progress::status!("measuring {line}")).flags()?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&r.document())?)?;
        return Ok(());
    }
    let m = &r.measured;
    writeln!(
        out,
        "{} ({}): one expert {:.3} MB of {}, {} experts, {} copies timed; {} threads",
        m.model.display(),
        m.arch,
        m.expert_mb,
        m.expert_type,
        m.experts_total,
        m.expert_copies,
        m.threads
    )?;
    let mut t = comfy_table::Table::new();
    t.set_header(["rows", "median ms", "min ms", "max ms", "GB/s", "ms per row"]);
    for (n, s) in &m.expert_rows {
        t.add_row([
            n.to_string(),
            format!("{:.4}", s.median_ms),
            format!("{:.4}", s.min_ms),
            format!("{:.4}", s.max_ms),
            format!("{:.2}", m.expert_mb / s.median_ms),
            format!("{:.5}", s.median_ms / *n as f64),
        ]);
    }
    align_numbers(&mut t);
    writeln!(out, "{t}")?;
    writeln!(
        out,
        "dense weights of one token: {:.1} MB in {:.4} ms (min {:.4}, max {:.4})",
        m.dense_mb, m.dense.median_ms, m.dense.min_ms, m.dense.max_ms
    )?;
    let per_op: Vec<String> =
        m.experts_per_op.iter().map(|(j, s)| format!("{j} experts {:.4} ms", s.median_ms)).collect();
    writeln!(out, "one row, experts in one op: {}", per_op.join(", "))?;
    let steps: Vec<String> =
        m.dense_rows.iter().skip(1).map(|(n, s)| format!("{n} rows {:.4} ms", s.median_ms)).collect();
    writeln!(out, "dense weights of a step (compute_ms_per_step): {}", steps.join(", "))?;
    if let Some(d) = &m.disk {
        writeln!(
            out,
            "disk {}: cold reads of one expert ({:.3} MB in three slices) from a {:.0} MB file, read_ahead_kb {}",
            d.dir.display(),
            d.read_mb,
            d.file_mb,
            d.read_ahead_kb.map_or_else(|| "unknown".into(), |k| k.to_string())
        )?;
        let mut t = comfy_table::Table::new();
        t.set_header(["mode", "median ms", "min ms", "max ms", "GB/s", "bytes read / expert"]);
        for r in &d.modes {
            t.add_row([
                r.mode.to_string(),
                format!("{:.3}", r.per_expert.median_ms),
                format!("{:.3}", r.per_expert.min_ms),
                format!("{:.3}", r.per_expert.max_ms),
                format!("{:.3}", r.gbps),
                r.amplification.map_or_else(|| "-".into(), |a| format!("{a:.2}")),
            ]);
        }
        align_numbers(&mut t);
        writeln!(out, "{t}")?;
        if let Some(l) = &d.latency {
            writeln!(out, "4 KiB direct read: {:.3} ms (min {:.3}, max {:.3})", l.median_ms, l.min_ms, l.max_ms)?;
        }
        if let Some(n) = &d.note {
            writeln!(out, "{n}")?;
        }
    }
    writeln!(
        out,
        "profile: expert_mb {:.6}, compute_ms {:.4}, host_gbps {:.3}, host_ms_per_row {:.5}, host_sync_ms {:.4}{}{}",
        r.profile.expert_mb,
        r.profile.compute_ms,
        m.host_gbps,
        m.host_ms_per_row,
        m.host_sync_ms,
        r.profile.bandwidth_gbps.first().map_or(String::new(), |g| format!(", ssd {g:.3} GB/s")),
        a.output.as_ref().map_or(String::new(), |o| format!(" -> {}", o.display()))
    )?;
    Ok(())
}
