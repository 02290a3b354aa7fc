//! Importing a large routing array (`import::numpy`) against plainly reading the same warm file
//! (`read` into a 128 KiB buffer, `cat FILE > /dev/null`'s work), as a ratio of speeds.
//!
//! The array is a synthetic `.npy`, int32 `[32 layers, T tokens, 8]` with E = 128 (T so that the
//! file is `NUMPY_BENCH_MB` MB, default 256), written to a temporary directory. Measured,
//! interleaved, `REPS` times each (default 3), medians reported. The requirement: the import runs
//! at least at half the speed of the read (ratio >= 0.5).

#![expect(clippy::print_stdout, reason = "a benchmark's report")]

use std::io::{Read, Write};
use std::path::Path;
use std::time::Instant;

use trace_io::import::numpy::{Layout, NumpyOptions, import_numpy};

const LAYERS: usize = 32;
const K: usize = 8;
const E: u32 = 128;

fn read_all(path: &Path) -> usize {
    let mut f = std::fs::File::open(path).expect("a readable file");
    let mut buf = vec![0u8; 128 << 10];
    let mut n = 0;
    loop {
        match f.read(&mut buf).expect("read") {
            0 => return n,
            got => n += got,
        }
    }
}

/// Writes the `.npy`: each row k distinct ids (a random base plus multiples of 17, mod E).
fn write_npy(path: &Path, tokens: usize) {
    let mut header = format!("{{'descr': '<i4', 'fortran_order': False, 'shape': ({LAYERS}, {tokens}, {K}), }}");
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    header.push_str(&" ".repeat(total - 10 - header.len() - 1));
    header.push('\n');
    let mut w = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).expect("a temporary file"));
    w.write_all(b"\x93NUMPY\x01\x00").expect("write");
    w.write_all(&(header.len() as u16).to_le_bytes()).expect("write");
    w.write_all(header.as_bytes()).expect("write");
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut row = [0u8; K * 4];
    for _ in 0..LAYERS * tokens {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let base = (x % u64::from(E)) as u32;
        for (j, c) in row.chunks_exact_mut(4).enumerate() {
            c.copy_from_slice(&((base + 17 * j as u32) % E).to_le_bytes());
        }
        w.write_all(&row).expect("write");
    }
    w.flush().expect("flush");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `--list` or `--test` from `cargo test --benches` means no run.
    if std::env::args().any(|a| a == "--list" || a == "--test") {
        return;
    }
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let mb = env("NUMPY_BENCH_MB", 256);
    let reps = env("REPS", 3).max(1);
    let tokens = (mb << 20) / (LAYERS * K * 4);
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("routing.npy");
    write_npy(&path, tokens);
    let bytes = std::fs::metadata(&path).expect("the file").len() as f64;
    let opts = NumpyOptions { layout: Some(Layout::Ltk), num_experts: Some(E), ..Default::default() };
    read_all(&path); // warm the page cache
    let (mut read, mut import) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let t = Instant::now();
        std::hint::black_box(read_all(&path));
        read.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let out = import_numpy(&path, &opts).expect("the synthetic array imports");
        import.push(t.elapsed().as_secs_f64());
        std::hint::black_box(out);
    }
    let (r, i) = (median(read), median(import));
    println!("numpy import: {:.0} MB, {LAYERS} layers x {tokens} tokens x {K} (int32), {reps} reps", bytes / 1e6);
    println!("read   {:.3} s  {:.2} GB/s", r, bytes / r / 1e9);
    println!("import {:.3} s  {:.2} GB/s", i, bytes / i / 1e9);
    println!("ratio (import speed / read speed): {:.2} (requirement >= 0.5)", r / i);
}
