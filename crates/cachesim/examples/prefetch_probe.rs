//! Replays the benchmark's synthetic trace (8 layers x 8192 tokens, 512 experts, k = 10, m = 64)
//! with prefetch (SEMANTICS.md §12) once on one thread and prints the counts and the picks per
//! second: the prefetch counterpart of `replay_probe`, for profilers
//! (`valgrind --tool=callgrind --toggle-collect='*prefetch::hook::run*'`).
//!
//! `cargo run --release -p cachesim --example prefetch_probe -- <PRED:B | none> [policy] [lambda] [reps]`
//!
//! The setting is the `prefetch` benchmark group's: coact calibrated on the trace of seed
//! `BENCH_SEED + 1`, lookahead from a `lookahead_ids` of 16 ids per row (the row's own first 16),
//! cap 128, the full keep set. `none` replays through the prefetch loop without proposals.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use cachesim::{CoactTable, Keep, Policy, Prefetch, PrefetchOptions, ReplayConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let spec = args.get(1).map_or("coact:10", String::as_str);
    let prefetch: Option<Prefetch> = (spec != "none").then(|| spec.parse().expect("PRED:B"));
    let policy: Policy = args.get(2).map_or("lru", String::as_str).parse().expect("a policy name");
    let lambda: f64 = args.get(3).map_or(Ok(0.0), |s| s.parse()).expect("a number");
    let reps: usize = args.get(4).map_or(Ok(1), |s| s.parse()).expect("a number");
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let calib = common::synth(common::BENCH_SEED + 1, s);
    let table = CoactTable::learn(&calib.view()).expect("a validated calibration trace");
    let v = trace.view();
    let width = 16;
    let lookahead: Vec<u16> = v.parts().ids.chunks_exact(s.candidates).flat_map(|row| row[..width].to_vec()).collect();
    let parts =
        trace_io::TraceParts { lookahead_ids: Some(trace_io::Lookahead { ids: &lookahead, width }), ..v.parts() };
    let view = trace_io::TraceView::new(v.meta(), s.tokens, s.candidates, parts).expect("valid lookahead");
    let keep = Keep::full(&view.shape());
    let cfg = ReplayConfig { lambda, ..ReplayConfig::new(policy, 128) };
    let opts = PrefetchOptions { prefetch, coact: Some(&table), timeline: None };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let picks = (s.layers * s.tokens * s.top_k) as f64;
    let mut rates = Vec::new();
    let mut counts = None;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        counts = Some(pool.install(|| cachesim::replay_prefetch(&view, &keep, &cfg, &opts)).expect("valid config"));
        rates.push(picks / start.elapsed().as_secs_f64() / 1e6);
    }
    let counts = counts.expect("at least one run").counts;
    let timed = if rates.len() > 1 { &mut rates[1..] } else { &mut rates[..] };
    timed.sort_by(f64::total_cmp);
    #[expect(clippy::print_stdout, reason = "a developer tool")]
    {
        println!("{spec} {policy} lambda {lambda}: {counts:?}");
        println!(
            "precision {:.4}, {:.1} M picks/s (median of {} runs), best {:.1} M",
            counts.precision(),
            timed[timed.len() / 2],
            timed.len(),
            timed[timed.len() - 1]
        );
    }
}
