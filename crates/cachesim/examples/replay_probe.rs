//! Replays the benchmark's synthetic trace (8 layers x 8192 tokens, 512 experts, k = 10, m = 64)
//! once with one policy on one thread and prints the counts and the picks per second: a target
//! for profilers (`valgrind --tool=callgrind --toggle-collect='*engine::step_loop::run_rows*'`), whose
//! instruction counts are stable on a loaded machine where wall time is not.
//!
//! `cargo run --release -p cachesim --example replay_probe -- <policy> [lambda] [cap] [pruned|full] [reps] [group]`
//! (with reps > 1 it prints the median and the best throughput of the repetitions after the first; with
//! `PROBE_TRACE=<file>` it replays that trace instead, e.g. `target/bench-traces/seed-calib.safetensors`,
//! whose locality is the sweep's). With
//! `group`, four configurations (λ = 0 with j = 2; the given λ with j = 2 and 3; half of it with
//! j = 2) are replayed together by `cachesim::replay_many`, which shares their scores when the
//! policy is near_pick_ema or inv_router, and F when the keep set is pruned; the throughput counts
//! the picks of all four, and the counts printed are those of the given λ with j = 2. For
//! callgrind, the shared work runs outside `engine::step_loop::run_rows`: add
//! `--toggle-collect='*TrackedScores*' --toggle-collect='*FTable*'`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use cachesim::{Keep, Policy, ReplayConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let policy: Policy = args.get(1).map_or("lru", String::as_str).parse().expect("a policy name");
    let lambda: f64 = args.get(2).map_or(Ok(0.0), |s| s.parse()).expect("a number");
    let cap: usize = args.get(3).map_or(Ok(128), |s| s.parse()).expect("a number");
    let pruned = args.get(4).is_some_and(|s| s == "pruned");
    let reps: usize = args.get(5).map_or(Ok(1), |s| s.parse()).expect("a number");
    let group = args.get(6).is_some_and(|s| s == "group");
    let s = common::BENCH_TRACE;
    let (synthetic, file);
    let view = if let Ok(path) = std::env::var("PROBE_TRACE") {
        file = trace_io::TraceFile::open(&path).expect("a readable trace");
        file.view()
    } else {
        synthetic = common::synth(common::BENCH_SEED, s);
        synthetic.view()
    };
    let shape = view.shape();
    let keep = if pruned {
        let keep = common::random_keep(common::BENCH_SEED, shape.layers, shape.num_experts, 0.6, shape.num_experts / 2);
        Keep::from_layers(&shape, &keep).expect("valid keep")
    } else {
        Keep::full(&shape)
    };
    let cfg = ReplayConfig { lambda, ..ReplayConfig::new(policy, cap) };
    let cfgs: Vec<ReplayConfig> = if group {
        [(0.0, 2), (lambda, 2), (lambda, 3), (lambda / 2.0, 2)]
            .map(|(lambda, j)| ReplayConfig { lambda, j, ..cfg.clone() })
            .to_vec()
    } else {
        vec![cfg.clone()]
    };
    let runs: Vec<(&Keep, &ReplayConfig)> = cfgs.iter().map(|c| (&keep, c)).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let picks = (shape.layers * shape.tokens * shape.top_k * runs.len()) as f64;
    let mut rates = Vec::new();
    let mut counts = None;
    for _ in 0..reps.max(1) {
        let start = Instant::now();
        counts = Some(pool.install(|| cachesim::replay_many(&view, &runs, &|_| {})).expect("valid config"));
        rates.push(picks / start.elapsed().as_secs_f64() / 1e6);
    }
    let counts = counts.expect("at least one run").swap_remove(usize::from(group));
    let timed = if rates.len() > 1 { &mut rates[1..] } else { &mut rates[..] };
    timed.sort_by(f64::total_cmp);
    let median = timed[timed.len() / 2];
    #[expect(clippy::print_stdout, reason = "a developer tool")]
    {
        println!("{policy} lambda {lambda} cap {cap} pruned {pruned}: {counts:?}");
        // The best run is the one this VM slowed least (its speed moves by up to 45% between
        // minutes): the steadiest figure for comparing two builds.
        println!(
            "hit rate {:.4}, {median:.1} M picks/s (median of {} runs), best {:.1} M",
            counts.hit_rate(),
            timed.len(),
            timed[timed.len() - 1]
        );
    }
}
