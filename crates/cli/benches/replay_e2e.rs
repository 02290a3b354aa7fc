//! The `replay` command end to end against the replay inside it, on one thread each, with a warm
//! page cache: `moe-offload replay TRACE --policy lru --cap 128` (process start, opening,
//! validating what lru reads, replaying, printing) timed from outside, against
//! `cachesim::replay` of the same configuration on a trace already opened and validated, in a
//! one-thread pool, in the same run. The ratio (in-process time / command time) is the share of
//! the replay's speed the command reaches.
//!
//! The trace is `REPLAY_TRACE` when set (e.g. `target/bench-traces/seed-calib.safetensors`, the
//! seed-scale calibration trace of `cargo xtask gen-bench-traces`), else a synthetic one of the
//! study's row shape (48 layers x 16,384 tokens, 512 experts, k = 10 of m = 64) written to a
//! temporary directory. `REPS` (default 7) interleaved runs each, medians.

#![expect(clippy::print_stdout, reason = "a benchmark's report")]

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use cachesim::{Keep, Policy, ReplayConfig};
use trace_io::TraceFile;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn best(v: &[f64]) -> f64 {
    v.iter().copied().fold(f64::INFINITY, f64::min)
}

/// CPU seconds of this process (user + system, every thread) and of its waited-for children, from
/// `/proc/self/stat` (Linux; clock ticks of 1/100 s). On a loaded machine wall time measures the
/// other processes too; CPU time does not.
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    let tick = |i: usize| f.get(i).copied().unwrap_or(0.0) / 100.0;
    (tick(11) + tick(12), tick(13) + tick(14))
}

fn main() {
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let _dir;
    let path: PathBuf = match std::env::var("REPLAY_TRACE") {
        Ok(p) => p.into(),
        Err(_) => {
            _dir = tempfile::tempdir().expect("a temporary directory");
            let p = _dir.path().join("bench.safetensors");
            let cfg = trace_io::synth::SynthConfig {
                layers: 48,
                experts: 512,
                top_k: 10,
                candidates: 64,
                tokens: 16_384,
                sequences: 64,
                norms: true,
                ..Default::default()
            };
            trace_io::synth::write(&p, &cfg, 0, &|_| {}).expect("the synthetic trace");
            p
        }
    };
    let reps: usize = std::env::var("REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let file = TraceFile::open(&path).expect("a valid trace"); // also warms the page cache
    let view = file.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let cfg = ReplayConfig::new(Policy::Lru, 128);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let expected = pool.install(|| cachesim::replay(&view, &keep, &cfg)).expect("a valid configuration");
    let (mut inside, mut command, mut inside_cpu, mut command_cpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..reps {
        let (cpu, _) = cpu_seconds();
        let start = Instant::now();
        let counts = pool.install(|| cachesim::replay(&view, &keep, &cfg)).expect("a valid configuration");
        inside.push(start.elapsed().as_secs_f64());
        inside_cpu.push(cpu_seconds().0 - cpu);
        assert_eq!(counts, expected);
        let (_, child) = cpu_seconds();
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_moe-offload"))
            .args(["replay", path.to_str().expect("a UTF-8 path"), "--policy", "lru", "--cap", "128", "--json"])
            .env("RAYON_NUM_THREADS", "1")
            .output()
            .expect("the command runs");
        command.push(start.elapsed().as_secs_f64());
        command_cpu.push(cpu_seconds().1 - child);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        assert_eq!(json["misses"], expected.misses, "the command's figures are the replay's");
    }
    let picks = (shape.layers * shape.tokens * shape.top_k) as f64;
    println!("{} ({} x {} tokens), lru cap 128, one thread, {reps} runs:", path.display(), shape.layers, shape.tokens);
    println!("  {:<20} {:>12} {:>12} {:>12}", "", "wall median", "wall best", "CPU median");
    let row = |name: &str, wall: &[f64], cpu: Vec<f64>| {
        let (m, b, c) = (median(wall.to_vec()), best(wall), median(cpu));
        println!("  {name:<20} {m:>10.3} s {b:>10.3} s {c:>10.2} s   ({:.1} M picks/s at the median)", picks / m / 1e6);
        (m, b, c)
    };
    let (im, ib, ic) = row("in-process replay", &inside, inside_cpu);
    let (cm, cb, cc) = row("replay command", &command, command_cpu);
    println!(
        "  command / in-process speed: {:.1}% (wall medians), {:.1}% (wall best), {:.1}% (CPU medians)",
        100.0 * im / cm,
        100.0 * ib / cb,
        100.0 * ic / cc
    );
}
