//! Single-core replay throughput in picks per second on a synthetic trace generated in-process.
//!
//! Per-layer shape of the study: 512 experts, k = 10, m = 64, cap 128 (8 layers x 8192 tokens to
//! keep the run short). The replay runs inside a rayon pool of one thread, so layers are replayed
//! one after the other on one core: the reported throughput is per core. Every policy at λ = 0
//! and lru at λ = 0.12 with the full keep set, and lru at λ = 0 and 0.12 with a pruned one
//! (about 60% of the experts kept: F is built and filtered, not the row itself).

#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use cachesim::{Keep, Policy, ReplayConfig};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

fn bench_replay(c: &mut Criterion) {
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let shape = view.shape();
    let full = Keep::full(&shape);
    let pruned = Keep::from_layers(&shape, &common::random_keep(common::BENCH_SEED, s.layers, s.num_experts, 0.6, 256))
        .expect("valid keep");
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool");
    let mut group = c.benchmark_group("replay");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let lru12 = ReplayConfig { lambda: 0.12, ..ReplayConfig::new(Policy::Lru, 128) };
    let mut configs: Vec<(String, ReplayConfig, &Keep)> =
        Policy::ALL.iter().map(|&p| (format!("{p}/lambda0"), ReplayConfig::new(p, 128), &full)).collect();
    configs.push(("lru/lambda0.12".into(), lru12.clone(), &full));
    configs.push(("lru/lambda0/pruned".into(), ReplayConfig::new(Policy::Lru, 128), &pruned));
    configs.push(("lru/lambda0.12/pruned".into(), lru12, &pruned));
    for (name, cfg, keep) in configs {
        let counts = cachesim::replay(&view, keep, &cfg).expect("valid config");
        // picks of every token, warmup included (the replay processes them all)
        let picks = (s.layers * s.tokens * s.top_k) as u64;
        assert!(counts.picks <= picks);
        group.throughput(Throughput::Elements(picks));
        group.bench_function(name, |b| {
            b.iter(|| pool.install(|| cachesim::replay(&view, keep, &cfg).expect("valid config")))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_replay);
criterion_main!(benches);
