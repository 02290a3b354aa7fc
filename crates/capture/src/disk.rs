//! `profile measure --disk DIR`: how long a disk takes to give one expert, read the ways a runtime
//! reads it (SEMANTICS §6's SSD bandwidth; docs/validation.md, case b).
//!
//! A GGUF file stores a layer's routed experts as three tensors (`ffn_gate_exps`, `ffn_up_exps`,
//! `ffn_down_exps`), each holding expert 0, 1, ... back to back, so one expert is three slices of
//! about a third of its bytes, far apart in the file. The measurement writes a file of that shape
//! in `DIR` (three regions of `slots` slices each, pseudo-random bytes, synced), then, for each
//! read, evicts the file from the page cache (`posix_fadvise(DONTNEED)`) and times one expert's
//! three slices, cold:
//!
//! - `direct sequential`: `O_DIRECT` reads of slot after slot (the device's own sequential rate);
//! - `direct random`: `O_DIRECT` reads of slots in a seeded random order;
//! - `buffered random`: `read` through the page cache (with the kernel's readahead);
//! - `mmap random`: the file mapped as llama.cpp maps a model (`mmap`, `POSIX_FADV_SEQUENTIAL` on
//!   the descriptor, no `madvise`) and every page of the slices touched: page faults with the
//!   kernel's read-around, as a layer's expert kernel faults its weights in. Its rate is the
//!   profile's SSD bandwidth: the cost of one expert miss of a model streamed through `mmap`.
//!
//! `latency` is a 4 KiB `O_DIRECT` read at a random offset. A file system without `O_DIRECT`
//! (tmpfs) gives no direct figures. Every figure is per read: median, minimum and maximum.

#![expect(unsafe_code, reason = "the test file is mapped and advised (posix_fadvise): a file mapping and a C call")]

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::{FileExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::SeedableRng as _;
use rand::seq::SliceRandom as _;

use crate::measure::Spread;
use crate::{CaptureError, Result};

/// Where and how much to read.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DiskConfig {
    /// A directory on the disk to measure; the test file is made there and removed.
    pub dir: PathBuf,
    /// Size of the test file, MB (10^6 bytes); at least 16 experts are written.
    pub file_mb: u64,
    /// Cold reads timed per mode.
    pub reads: usize,
}

impl DiskConfig {
    /// `dir` with the defaults: a 1 GB file, 16 reads per mode.
    pub fn new(dir: PathBuf) -> DiskConfig {
        DiskConfig { dir, file_mb: 1000, reads: 16 }
    }
}

/// One way of reading an expert.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReadMode {
    /// `direct sequential`, `direct random`, `buffered random` or `mmap random`.
    pub mode: &'static str,
    /// Time of one expert (three slices), ms.
    pub per_expert: Spread,
    /// The expert's bytes over the median time, GB/s (10^9 bytes per second).
    pub gbps: f64,
    /// Bytes the measuring thread fetched from the storage layer per read (`/proc/thread-self/io`
    /// `read_bytes`, readahead included) over the expert's bytes, mean over the reads; `None` where the kernel
    /// does not count I/O per task. Above 1, a miss also brings in pages no layer asked for
    /// (the read-around of a page fault), which take page-cache memory beside the expert's.
    pub amplification: Option<f64>,
}

/// What `--disk` measured.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct DiskMeasured {
    /// The directory measured.
    pub dir: PathBuf,
    /// Size of the test file, MB.
    pub file_mb: f64,
    /// Bytes of one expert read (three slices, each rounded up to 4 KiB), MB.
    pub read_mb: f64,
    /// The block device's `read_ahead_kb` (`/sys/dev/block/MAJ:MIN`), where it can be found:
    /// the kernel's readahead window; `POSIX_FADV_SEQUENTIAL` doubles it for the descriptor.
    pub read_ahead_kb: Option<u64>,
    /// The modes measured, in the order of the module's list.
    pub modes: Vec<ReadMode>,
    /// A 4 KiB `O_DIRECT` read at a random offset, ms (`None` without `O_DIRECT`).
    pub latency: Option<Spread>,
    /// Why the direct modes are missing, when they are.
    pub note: Option<String>,
}

impl DiskMeasured {
    /// The cold expert read through `mmap`: its rate is the profile's SSD bandwidth.
    pub fn mmap(&self) -> Option<&ReadMode> {
        self.modes.iter().find(|m| m.mode == "mmap random")
    }
    /// The rate of a cold expert read through `mmap`, GB/s (0 when not measured).
    pub fn mmap_gbps(&self) -> f64 {
        self.mmap().map_or(0.0, |m| m.gbps)
    }
}

const ALIGN: usize = 4096;

/// A page-aligned buffer for `O_DIRECT` reads.
struct Aligned {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + ALIGN];
        let start = buf.as_ptr().align_offset(ALIGN);
        Aligned { buf, start, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.start..self.start + self.len]
    }
}

fn io_err(path: &Path, what: &str, e: &std::io::Error) -> CaptureError {
    CaptureError::Config(format!("disk {}: {what}: {e}", path.display()))
}

/// Drops the file's clean pages from the page cache.
fn evict(file: &File, path: &Path) -> Result<()> {
    // SAFETY: posix_fadvise only advises the kernel about a descriptor this function borrows.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io_err(path, "posix_fadvise(DONTNEED)", &std::io::Error::from_raw_os_error(rc)));
    }
    Ok(())
}

/// Bytes this process has fetched from the storage layer (`/proc/self/io` `read_bytes`: what it
/// caused to be read from a block device, readahead included, every thread), if the kernel
/// counts them.
pub fn read_bytes() -> Option<u64> {
    io_read_bytes("/proc/self/io")
}

/// The same for the calling thread alone (`/proc/thread-self/io`): the disk measurement's reads,
/// whatever other threads of the process read meanwhile.
fn thread_read_bytes() -> Option<u64> {
    io_read_bytes("/proc/thread-self/io")
}

fn io_read_bytes(file: &str) -> Option<u64> {
    let io = std::fs::read_to_string(file).ok()?;
    io.lines().find_map(|l| l.strip_prefix("read_bytes:")?.trim().parse().ok())
}

fn read_ahead_kb(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition's queue is its disk's.
    [base.join("queue/read_ahead_kb"), base.join("../queue/read_ahead_kb")]
        .iter()
        .find_map(|p| std::fs::read_to_string(p).ok()?.trim().parse().ok())
}

/// The test file: three regions of `slots` slices of `slice` bytes.
struct TestFile {
    path: PathBuf,
    slots: usize,
    slice: usize,
}

impl TestFile {
    fn write(dir: &Path, file_bytes: u64, expert_bytes: usize) -> Result<TestFile> {
        let slice = (expert_bytes.div_ceil(3)).div_ceil(ALIGN) * ALIGN;
        let slots = ((file_bytes as usize) / (3 * slice)).max(16);
        let path = dir.join(format!(".moe-offload-disk-{}.bin", std::process::id()));
        let mut f = File::create(&path).map_err(|e| io_err(&path, "create", &e))?;
        let t = TestFile { path, slots, slice };
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut chunk = vec![0u8; 1 << 20];
        let mut left = 3 * slots * slice;
        while left > 0 {
            for c in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                c.copy_from_slice(&x.to_le_bytes());
            }
            let n = left.min(chunk.len());
            f.write_all(&chunk[..n]).map_err(|e| io_err(&t.path, "write", &e))?;
            left -= n;
        }
        f.sync_all().map_err(|e| io_err(&t.path, "fsync", &e))?;
        Ok(t)
    }
    /// File offsets of slot `s`'s three slices.
    fn offsets(&self, s: usize) -> [u64; 3] {
        [0, 1, 2].map(|r| ((r * self.slots + s) * self.slice) as u64)
    }
}

impl Drop for TestFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Measures `cfg.dir` with reads of one expert of `expert_bytes`; `progress` hears of each mode.
///
/// # Errors
/// [`CaptureError::Config`] when the directory cannot hold the test file, or a read or an advice
/// call fails (naming the file and the call).
pub fn measure(cfg: &DiskConfig, expert_bytes: usize, progress: &mut dyn FnMut(&str)) -> Result<DiskMeasured> {
    if cfg.reads == 0 {
        return Err(CaptureError::Config("‹disk reads› must be at least 1".into()));
    }
    if !cfg.dir.is_dir() {
        return Err(CaptureError::Config(format!("disk {}: not a directory", cfg.dir.display())));
    }
    progress(&format!("disk: writing a {} MB test file in {}", cfg.file_mb, cfg.dir.display()));
    let t = TestFile::write(&cfg.dir, cfg.file_mb * 1_000_000, expert_bytes.max(1))?;
    let reads = cfg.reads.min(t.slots);
    let mut order: Vec<usize> = (0..t.slots).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(0x006d_6f65));
    let random = &order[..reads];
    let sequential: Vec<usize> = (0..reads).collect();
    let buffered = File::open(&t.path).map_err(|e| io_err(&t.path, "open", &e))?;
    let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&t.path);
    let mut buf = Aligned::new(t.slice);
    let mut modes = Vec::new();
    let mut note = None;
    let mut latency = None;
    let read_mb = (3 * t.slice) as f64 / 1e6;

    let mut timed = |name: &'static str, slots: &[usize], read: &mut dyn FnMut(usize, &mut [u8]) -> Result<()>| {
        progress(&format!("disk: {name}"));
        let mut ms = Vec::with_capacity(slots.len());
        let mut fetched = Some(0u64);
        for &s in slots {
            evict(&buffered, &t.path)?;
            let before = thread_read_bytes();
            let start = Instant::now();
            read(s, buf.get())?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
            fetched = fetched.zip(before.zip(thread_read_bytes())).map(|(sum, (b, a))| sum + a.saturating_sub(b));
        }
        let per_expert = Spread::of(ms);
        let amplification = fetched.map(|f| f as f64 / 1e6 / slots.len() as f64 / read_mb);
        modes.push(ReadMode { mode: name, per_expert, gbps: read_mb / per_expert.median_ms, amplification });
        Ok::<(), CaptureError>(())
    };
    let pread = |f: &File, off: u64, b: &mut [u8]| f.read_exact_at(b, off).map_err(|e| io_err(&t.path, "read", &e));
    match &direct {
        Ok(d) => {
            let mut read = |s: usize, b: &mut [u8]| t.offsets(s).iter().try_for_each(|&o| pread(d, o, b));
            timed("direct sequential", &sequential, &mut read)?;
            timed("direct random", random, &mut read)?;
        }
        Err(e) => note = Some(format!("no O_DIRECT on {}: {e}", cfg.dir.display())),
    }
    let mut read = |s: usize, b: &mut [u8]| t.offsets(s).iter().try_for_each(|&o| pread(&buffered, o, b));
    timed("buffered random", random, &mut read)?;
    // As llama.cpp's llama_mmap: the descriptor advised sequential, the whole file mapped shared.
    let mapped = File::open(&t.path).map_err(|e| io_err(&t.path, "open", &e))?;
    // SAFETY: posix_fadvise only advises the kernel about a descriptor owned here.
    let rc = unsafe { libc::posix_fadvise(mapped.as_raw_fd(), 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    if rc != 0 {
        return Err(io_err(&t.path, "posix_fadvise(SEQUENTIAL)", &std::io::Error::from_raw_os_error(rc)));
    }
    let slice = t.slice;
    let mut read = |s: usize, _: &mut [u8]| {
        // A fresh mapping per read: pages mapped by a live mapping would survive the eviction.
        // SAFETY: the test file is private to this function, written and synced before, and
        // nothing writes or truncates it while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&mapped) }.map_err(|e| io_err(&t.path, "mmap", &e))?;
        let mut sum = 0u8;
        for o in t.offsets(s) {
            let o = o as usize;
            for p in (o..o + slice).step_by(ALIGN) {
                sum ^= map[p];
            }
        }
        std::hint::black_box(sum);
        Ok(())
    };
    timed("mmap random", random, &mut read)?;
    if let Ok(d) = &direct {
        let mut small = Aligned::new(ALIGN);
        let mut ms = Vec::with_capacity(reads);
        let pages = 3 * t.slots * t.slice / ALIGN;
        for (i, &s) in random.iter().enumerate() {
            evict(&buffered, &t.path)?;
            let page = (s * 7919 + i * 104_729) % pages;
            let start = Instant::now();
            pread(d, (page * ALIGN) as u64, small.get())?;
            ms.push(start.elapsed().as_secs_f64() * 1e3);
        }
        latency = Some(Spread::of(ms));
    }
    Ok(DiskMeasured {
        dir: cfg.dir.clone(),
        file_mb: (3 * t.slots * t.slice) as f64 / 1e6,
        read_mb,
        read_ahead_kb: read_ahead_kb(&cfg.dir),
        modes,
        latency,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::{DiskConfig, measure};

    #[test]
    fn every_mode_reads_one_expert_and_gives_a_positive_rate() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let cfg = DiskConfig { dir: dir.path().to_path_buf(), file_mb: 4, reads: 3 };
        let m = measure(&cfg, 100_000, &mut |_| {}).expect("the measurement");
        // 100 kB in three slices of 36 kB (33,334 rounded up to 4 KiB): 0.110592 MB per read.
        assert_eq!(m.read_mb, 3.0 * 36_864.0 / 1e6);
        // 16 slots at least: 4 MB / 110,592 B = 36 slots.
        assert_eq!(m.file_mb, 36.0 * 3.0 * 36_864.0 / 1e6);
        let names: Vec<&str> = m.modes.iter().map(|r| r.mode).collect();
        let want: &[&str] = if m.note.is_some() {
            &["buffered random", "mmap random"]
        } else {
            &["direct sequential", "direct random", "buffered random", "mmap random"]
        };
        assert_eq!(names, want);
        assert!(m.modes.iter().all(|r| r.gbps > 0.0 && r.per_expert.min_ms <= r.per_expert.max_ms));
        assert!(m.mmap_gbps() > 0.0);
        // Direct reads fetch exactly the expert's bytes, where the kernel counts them.
        for r in m.modes.iter().filter(|r| r.mode.starts_with("direct")) {
            if let Some(a) = r.amplification {
                assert!((a - 1.0).abs() < 1e-9, "{}: {a}", r.mode);
            }
        }
        assert_eq!(m.latency.is_some(), m.note.is_none());
        assert_eq!(std::fs::read_dir(dir.path()).expect("the directory").count(), 0, "the test file is removed");
    }

    #[test]
    fn a_missing_directory_is_named() {
        let cfg = DiskConfig::new("/nonexistent/moe-offload".into());
        let e = measure(&cfg, 1000, &mut |_| {}).expect_err("no directory");
        assert!(e.to_string().contains("/nonexistent/moe-offload: not a directory"), "{e}");
    }
}
