//! `moe-offload inspect FILE` end to end (the built binary: process start, opening, validating
//! every value, the usage summary, printing to /dev/null) against `cat FILE > /dev/null`'s work
//! (`read` of the same file into a 128 KiB buffer), with the page cache warm (issue #39: at most
//! 1.5x).
//!
//! Both criterion benchmarks run the same interleaved pairs (a read, then the command), each
//! reporting its own half; every pair measured (warm-up included) is recorded, and the ratio of
//! the medians (command / read) and the median of the per-pair ratios are printed at the end.
//! Interleaving keeps both sides under the same machine load, whose speed moves by 40% between
//! runs; the CPU seconds of both sides (user + system, every thread) are printed too, which
//! another process's load does not inflate as much as wall time.
//!
//! The binary is `MOE_OFFLOAD_BENCH_BIN` when set, else the one cargo built. The trace is
//! `MOE_OFFLOAD_BENCH_TRACE` when set (e.g. the 2.9 GB seed-scale calibration trace
//! of `cargo xtask gen-bench-traces`), else a synthetic one of the study's row shape (48 layers x
//! 8,192 tokens, 512 experts, k = 10 of m = 64, scores, norms; 182 MB) written to a temporary
//! directory.

#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]
#![expect(clippy::print_stdout, reason = "a benchmark's report")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};

/// `cat FILE > /dev/null`: the file read into a 128 KiB buffer; returns the bytes read.
fn read_all(path: &Path) -> usize {
    let mut f = std::fs::File::open(path).expect("a readable trace");
    let mut buf = vec![0u8; 128 << 10];
    let mut n = 0;
    loop {
        match f.read(&mut buf).expect("read") {
            0 => return n,
            got => n += got,
        }
    }
}

/// The binary timed: `MOE_OFFLOAD_BENCH_BIN` when set (another build, e.g. the one before a
/// change, measured against the same baseline), else the one cargo built.
fn binary() -> PathBuf {
    std::env::var_os("MOE_OFFLOAD_BENCH_BIN").map_or_else(|| env!("CARGO_BIN_EXE_moe-offload").into(), PathBuf::from)
}

/// `moe-offload inspect FILE > /dev/null`.
fn inspect(path: &Path) {
    let status =
        Command::new(binary()).arg("inspect").arg(path).stdout(Stdio::null()).status().expect("the command runs");
    assert!(status.success(), "inspect failed: {status}");
}

/// CPU seconds (user + system) of this process and of its waited-for children, from
/// `/proc/self/stat` (Linux; clock ticks of 1/100 s): on a loaded machine wall time measures the
/// other processes too, CPU time does not.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    let tick = |i: usize| f.get(i).copied().unwrap_or(0.0) / 100.0;
    (tick(11) + tick(12), tick(13) + tick(14))
}

/// One interleaved pair, wall and CPU seconds of each side.
#[derive(Debug, Clone, Copy)]
struct Pair {
    read: f64,
    command: f64,
    read_cpu: f64,
    command_cpu: f64,
}

fn pair(path: &Path) -> Pair {
    let (cpu, _) = cpu_seconds();
    let start = Instant::now();
    std::hint::black_box(read_all(path));
    let read = start.elapsed().as_secs_f64();
    let (cpu_after, child) = cpu_seconds();
    let start = Instant::now();
    inspect(path);
    let command = start.elapsed().as_secs_f64();
    Pair { read, command, read_cpu: cpu_after - cpu, command_cpu: cpu_seconds().1 - child }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The trace to inspect: `MOE_OFFLOAD_BENCH_TRACE`, or a synthetic one in `dir`.
fn trace(dir: &Path) -> PathBuf {
    if let Ok(p) = std::env::var("MOE_OFFLOAD_BENCH_TRACE") {
        return p.into();
    }
    let p = dir.join("bench.safetensors");
    let cfg = trace_io::synth::SynthConfig {
        layers: 48,
        experts: 512,
        top_k: 10,
        candidates: 64,
        tokens: 8192,
        sequences: 32,
        norms: true,
        ..Default::default()
    };
    trace_io::synth::write(&p, &cfg, 0, &|_| {}).expect("the synthetic trace");
    p
}

fn bench_inspect(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = trace(dir.path());
    read_all(&path); // warms the page cache
    inspect(&path);
    let pairs = Mutex::new(Vec::new());
    let mut group = c.benchmark_group("inspect_e2e");
    group
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_millis(100))
        .measurement_time(Duration::from_secs(1));
    for (name, half) in [("cat", 0), ("inspect", 1)] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let p = pair(&path);
                    pairs.lock().expect("not poisoned").push(p);
                    total += Duration::from_secs_f64(if half == 0 { p.read } else { p.command });
                }
                total
            });
        });
    }
    group.finish();
    let pairs = pairs.into_inner().expect("not poisoned");
    let of = |f: fn(&Pair) -> f64| median(pairs.iter().map(f).collect());
    let (read, command, per_pair) = (of(|p| p.read), of(|p| p.command), of(|p| p.command / p.read));
    let (read_cpu, command_cpu) = (of(|p| p.read_cpu), of(|p| p.command_cpu));
    let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
    println!("{} ({:.2} GB), {} interleaved pairs:", path.display(), bytes as f64 / 1e9, pairs.len());
    println!("  binary {}", binary().display());
    println!("  read (cat)   median {read:.3} s ({:.1} GB/s)", bytes as f64 / read / 1e9);
    println!("  inspect      median {command:.3} s ({:.1} GB/s)", bytes as f64 / command / 1e9);
    println!("  inspect / cat: {:.2}x (medians), {per_pair:.2}x (median of the pairs' ratios)", command / read);
    println!(
        "  CPU (user + system, all threads): cat median {read_cpu:.2} s, inspect median {command_cpu:.2} s ({:.2}x); load {}",
        command_cpu / read_cpu.max(0.01),
        std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim()
    );
}

criterion_group!(benches, bench_inspect);
criterion_main!(benches);
