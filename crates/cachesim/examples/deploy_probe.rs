//! Replays the deployment benchmark's trace (the benchmark trace in 64 sequences) once through
//! the deployed step loop on one thread and prints the counts and picks per second: a target for
//! profilers (`perf record`, `valgrind --tool=callgrind`).
//!
//! `cargo run --release -p cachesim --example deploy_probe -- <policy> <cap> <pins|tier2|batch8|none|plain> [lambda]`
//! (λ > 0 replays with cache-aware routing, j = 2 by default). `plain` replays the same trace
//! through `cachesim::replay` (the §5 loop and the policy's `Evictor`) instead, and `none` through
//! the deployed loop with nothing deployed (the policy's `Prio` at one tier): the cost of each
//! form of a policy on one input.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Instant;

use cachesim::deploy::{Deployment, Schedule, Tier2};
use cachesim::{Keep, Policy, ReplayConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let policy: Policy = args.get(1).map_or("lru", String::as_str).parse().expect("a policy name");
    let cap: usize = args.get(2).map_or(Ok(64), |s| s.parse()).expect("a number");
    let mode = args.get(3).map_or("pins", String::as_str);
    let lambda: f64 = args.get(4).map_or(Ok(0.0), |s| s.parse()).expect("a number");
    let s = common::Synth { sequences: 64, ..common::BENCH_TRACE };
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let dep = match mode {
        "pins" => {
            let pins: Vec<Vec<u16>> = (0..s.layers).map(|_| (0..64).collect()).collect();
            Deployment { pins: Some(Keep::from_layers(&shape, &pins).expect("pins")), ..Deployment::default() }
        }
        "tier2" => Deployment { tier2: Some(Tier2 { policy: Policy::Lru, cap: 256 }), ..Deployment::default() },
        "batch8" => Deployment { schedule: Schedule::Rebatch(8), ..Deployment::default() },
        _ => Deployment::default(),
    };
    let cfg = ReplayConfig { lambda, ..ReplayConfig::new(policy, cap) };
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let start = Instant::now();
    let counts = pool.install(|| {
        if mode == "plain" {
            format!("{:?}", cachesim::replay(&view, &keep, &cfg).expect("valid"))
        } else {
            format!("{:?}", cachesim::deploy::replay(&view, &keep, &cfg, &dep).expect("valid").counts)
        }
    });
    let secs = start.elapsed().as_secs_f64();
    let picks = (shape.layers * shape.tokens * shape.top_k) as f64;
    #[expect(clippy::print_stdout, reason = "a developer tool")]
    {
        println!("{policy} cap {cap} {mode} lambda {lambda}: {counts}");
        println!("{:.2} M picks/s", picks / secs / 1e6);
    }
}
