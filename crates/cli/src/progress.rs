//! Progress of long commands on stderr: an indicatif bar on a terminal, and periodic plain lines
//! otherwise (a log file, CI), so that a long run is never silent.
//!
//! Status text goes to stderr and never fails the command: a closed stderr is ignored.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Seconds between two plain progress lines when stderr is not a terminal; overridden by
/// `MOE_OFFLOAD_PROGRESS_SECS` (tests use a short one).
const PLAIN_EVERY_SECS: f64 = 10.0;

/// Writes one status line to stderr, ignoring a closed stderr.
pub fn status_line(line: std::fmt::Arguments<'_>) {
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(line);
    let _ = e.write_all(b"\n");
}

/// `status_line(format_args!(...))`: one status line on stderr.
macro_rules! status {
    ($($t:tt)*) => { $crate::progress::status_line(format_args!($($t)*)) };
}
pub(crate) use status;

struct Shared {
    done: AtomicU64,
    total: u64,
    what: String,
    unit: &'static str,
    start: Instant,
    finished: Mutex<bool>,
    wake: Condvar,
}

/// Progress of one piece of work of `total` units, reported from any thread with [`Progress::inc`].
pub struct Progress {
    shared: Arc<Shared>,
    bar: Option<indicatif::ProgressBar>,
    ticker: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    /// Starts reporting `what` (for example `sweep`), `total` units of `unit` (`token-layers`).
    pub fn new(what: &str, total: u64, unit: &'static str) -> Progress {
        let shared = Arc::new(Shared {
            done: AtomicU64::new(0),
            total,
            what: what.to_string(),
            unit,
            start: Instant::now(),
            finished: Mutex::new(false),
            wake: Condvar::new(),
        });
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(&format!(
                    "{what} {{bar:40}} {{percent}}% of {{human_len}} {unit}, {{elapsed}} elapsed, ETA {{eta}}"
                ))
                .expect("a valid template"),
            );
            return Progress { shared, bar: Some(bar), ticker: None };
        }
        let every = std::env::var("MOE_OFFLOAD_PROGRESS_SECS")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0 && s.is_finite())
            .unwrap_or(PLAIN_EVERY_SECS);
        let s = Arc::clone(&shared);
        let ticker = std::thread::spawn(move || tick_until_finished(&s, Duration::from_secs_f64(every)));
        Progress { shared, bar: None, ticker: Some(ticker) }
    }

    /// Adds `n` units done.
    pub fn inc(&self, n: u64) {
        self.shared.done.fetch_add(n, Ordering::Relaxed);
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }

    /// Stops reporting (clears the bar).
    pub fn finish(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        *self.shared.finished.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.ticker.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The plain-line ticker: a line every `every` until the work is finished. The flag is checked
/// before each wait: the work may finish (and notify) before this thread first takes the lock,
/// and waiting then would hold the command up for a whole `every` (a failing command took 10 s
/// to exit when stderr was a pipe).
fn tick_until_finished(s: &Shared, every: Duration) {
    let mut finished = s.finished.lock().unwrap_or_else(PoisonError::into_inner);
    while !*finished {
        let (f, wait) = s.wake.wait_timeout(finished, every).unwrap_or_else(PoisonError::into_inner);
        finished = f;
        if !*finished && wait.timed_out() {
            status!("{}", plain_line(s));
        }
    }
}

/// `sweep: 35.2% (1234 of 3500 token-layers), 40 s elapsed, about 75 s left`.
fn plain_line(s: &Shared) -> String {
    let done = s.done.load(Ordering::Relaxed).min(s.total);
    let elapsed = s.start.elapsed().as_secs_f64();
    if s.total == 0 {
        return format!("{}: still working, {} elapsed", s.what, seconds(elapsed));
    }
    let pct = done as f64 * 100.0 / s.total as f64;
    let left = if done == 0 {
        "time left not known yet".to_string()
    } else {
        format!("about {} left", seconds((s.total - done) as f64 * elapsed / done as f64))
    };
    format!("{}: {pct:.1}% ({done} of {} {}), {} elapsed, {left}", s.what, s.total, s.unit, seconds(elapsed))
}

/// A duration in words: `850 ms`, `42 s`, `12 min 5 s`, `3 h 20 min`.
pub fn seconds(s: f64) -> String {
    if !s.is_finite() {
        return "unknown".into();
    }
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else if s < 60.0 {
        format!("{s:.0} s")
    } else if s < 3600.0 {
        format!("{} min {} s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!("{} h {} min", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64)
    }
}

/// A spinner-like report for work of unknown size (reading input files): on a terminal a spinner
/// with the elapsed time, otherwise a plain line every few seconds. Ends when dropped.
pub fn working(what: &str) -> Progress {
    let p = Progress::new(what, 0, "");
    if let Some(b) = &p.bar {
        b.set_style(
            indicatif::ProgressStyle::with_template(&format!("{{spinner}} {what}, {{elapsed}}")).expect("valid"),
        );
        b.enable_steady_tick(Duration::from_millis(200));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Work that finished before the ticker first waits ends the ticker at once, not after a
    /// whole period (the lost wake-up that held every quick command up for 10 s).
    #[test]
    fn a_ticker_started_after_the_work_finished_returns_at_once() {
        let s = Arc::new(Shared {
            done: AtomicU64::new(1),
            total: 1,
            what: "t".into(),
            unit: "u",
            start: Instant::now(),
            finished: Mutex::new(true),
            wake: Condvar::new(),
        });
        let (tx, rx) = std::sync::mpsc::channel();
        let t = Arc::clone(&s);
        std::thread::spawn(move || {
            tick_until_finished(&t, Duration::from_secs(3600));
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(60)).is_ok(), "the ticker waited for its period");
    }

    #[test]
    fn durations_in_words() {
        for (s, want) in [(0.25, "250 ms"), (42.4, "42 s"), (725.0, "12 min 5 s"), (12_000.0, "3 h 20 min")] {
            assert_eq!(super::seconds(s), want);
        }
        assert_eq!(super::seconds(f64::INFINITY), "unknown");
    }
}
