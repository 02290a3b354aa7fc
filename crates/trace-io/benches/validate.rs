//! Opening and validating a trace file, in bytes per second, as a ratio against reading the same
//! warm file in the same run (`cat FILE > /dev/null`'s work: `read` into a 128 KiB buffer).
//!
//! The trace is `VALIDATE_TRACE` when set (e.g. `target/bench-traces/seed-calib.safetensors`, the
//! 2.9 GB seed-scale calibration trace, `cargo xtask gen-bench-traces`), else a synthetic one of
//! the study's row shape (512 experts, k = 10 of m = 64, scores, gates, norms; 48 layers x 4096
//! tokens, 91 MB) written to a temporary directory. Measured, interleaved, `REPS` times each
//! (default 7), medians reported:
//! - `read`: the baseline;
//! - `validate/all`: [`TraceFile::open_lazy`] and `view_for(Reads::EVERYTHING)` (what `inspect`
//!   and the audit do) on the rayon pool (`RAYON_NUM_THREADS`, default every core) and on one
//!   thread;
//! - `validate/ids-k`: the ids a λ = 0 lru replay reads (the first k of each row), one thread.

#![expect(clippy::print_stdout, reason = "a benchmark's report")]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use trace_io::{Reads, TraceFile};

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

fn validate(path: &Path, need: Reads) {
    let f = TraceFile::open_lazy(path).expect("a trace");
    f.view_for(need).expect("a valid trace");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// CPU seconds of this process (user + system, every thread), from `/proc/self/stat` (Linux;
/// clock ticks of 1/100 s): on a loaded machine wall time measures the other processes too.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let f: Vec<f64> = after.split_whitespace().map(|x| x.parse().unwrap_or(0.0)).collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) / 100.0
}

fn main() {
    // `cargo bench` passes `--bench`; a filter or `--list` from `cargo test --benches` means no run.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let _dir;
    let path: PathBuf = match std::env::var("VALIDATE_TRACE") {
        Ok(p) => p.into(),
        Err(_) => {
            _dir = tempfile::tempdir().expect("a temporary directory");
            let p = _dir.path().join("bench.safetensors");
            let cfg = trace_io::synth::SynthConfig {
                layers: 48,
                experts: 512,
                top_k: 10,
                candidates: 64,
                tokens: 4096,
                sequences: 16,
                norms: true,
                ..Default::default()
            };
            trace_io::synth::write(&p, &cfg, 0, &|_| {}).expect("the synthetic trace");
            p
        }
    };
    let reps: usize = std::env::var("REPS").ok().and_then(|r| r.parse().ok()).unwrap_or(7);
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let top_k = TraceFile::open_lazy(&path).expect("a trace").shape().top_k;
    let bytes = read_all(&path) as f64; // also warms the page cache
    let names = ["read", "validate/all", "validate/all/1-thread", "validate/ids-k/1-thread"];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
    for _ in 0..reps {
        for (i, (t, c)) in times.iter_mut().zip(&mut cpu).enumerate() {
            let cpu_start = cpu_seconds();
            let start = Instant::now();
            match i {
                0 => drop(read_all(&path)),
                1 => validate(&path, Reads::EVERYTHING),
                2 => one.install(|| validate(&path, Reads::EVERYTHING)),
                _ => one.install(|| validate(&path, Reads::ids(top_k))),
            }
            t.push(start.elapsed().as_secs_f64());
            c.push(cpu_seconds() - cpu_start);
        }
    }
    let best = |t: &[f64]| t.iter().copied().fold(f64::INFINITY, f64::min);
    let (base, base_best) = (median(times[0].clone()), best(&times[0]));
    println!("{} ({:.2} GB), {} threads, {reps} runs:", path.display(), bytes / 1e9, rayon::current_num_threads());
    println!("  {:<24} {:>9} {:>9} {:>12} {:>11} {:>9}", "", "median", "GB/s", "x read", "x read best", "CPU s");
    for ((name, t), c) in names.iter().zip(times).zip(cpu) {
        let (m, b) = (median(t.clone()), best(&t));
        let ratio = m / base;
        println!(
            "  {name:<24} {m:>7.3} s {:>9.2} {ratio:>12.2} {:>11.2} {:>9.2}",
            bytes / m / 1e9,
            b / base_best,
            median(c)
        );
    }
}
