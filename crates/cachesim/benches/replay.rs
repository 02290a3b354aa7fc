//! Single-core replay throughput in picks per second on a synthetic trace generated in-process.
//!
//! Per-layer shape of the study: 512 experts, k = 10, m = 64, cap 128 (8 layers x 8192 tokens to
//! keep the run short). The replay runs inside a rayon pool of one thread, so layers are replayed
//! one after the other on one core: the reported throughput is per core. Every policy at λ = 0
//! and lru at λ = 0.12 with the full keep set, and lru at λ = 0 and 0.12 with a pruned one
//! (about 60% of the experts kept: F is built and filtered, not the row itself).
//!
//! The `floor` group times fixed pieces of arithmetic on the same number of tokens, reported in
//! the same picks (k = 10 per token): the eager decay of 512 f64 scores per token (what
//! near_pick_ema and inv_router did before the lazy form of SEMANTICS.md §5; now the machine's
//! speed reference, since this VM's speed moves by 40% between runs: read a policy's figure as a
//! ratio to it), and the softmax of 64 continuous router scores per token with `f64::exp` and
//! with the project's exp (`cachesim::exp`, inv_router's credits).

#![expect(missing_docs, reason = "criterion_group! generates an undocumented pub fn")]

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::Duration;

use cachesim::{Keep, Policy, ReplayConfig};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};

/// A benchmark group with this file's timing: 10 samples, 0.5 s warm-up, 4 s of measurement.
fn timed_group<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(4));
    group
}

/// A rayon pool of one thread: layers replay one after the other, so throughput is per core.
fn one_core_pool() -> rayon::ThreadPool {
    rayon::ThreadPoolBuilder::new().num_threads(1).build().expect("a one-thread pool")
}

fn bench_replay(c: &mut Criterion) {
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let shape = view.shape();
    let full = Keep::full(&shape);
    let pruned = Keep::from_layers(&shape, &common::random_keep(common::BENCH_SEED, s.layers, s.num_experts, 0.6, 256))
        .expect("valid keep");
    let pool = one_core_pool();
    let mut group = timed_group(c, "replay");
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

fn bench_floor(c: &mut Criterion) {
    let s = common::BENCH_TRACE;
    let tokens = s.layers * s.tokens;
    let picks = (tokens * s.top_k) as u64;
    let mut group = timed_group(c, "floor");
    group.throughput(Throughput::Elements(picks));

    // s <- d*s for 512 experts once per token, as the replay's decay does.
    let mut scores = vec![1.0f64; s.num_experts];
    group.bench_function("decay_512_experts", |b| {
        b.iter(|| {
            for t in 0..tokens {
                for x in scores.iter_mut() {
                    *x *= 0.99;
                }
                scores[t % s.num_experts] += 1.0;
            }
            std::hint::black_box(&scores);
        })
    });

    // exp(z - max) / sum over 64 continuous scores per token, summed in order, in f64.
    let trace = continuous_trace();
    let view = trace.view();
    let mut p = vec![0.0f64; s.candidates];
    group.bench_function("softmax_64_continuous_own_exp", |b| {
        b.iter(|| {
            let rows = (0..s.layers).flat_map(|l| view.layer_scores(l).expect("scores").chunks_exact(s.candidates));
            for row in rows {
                let max = f64::from(row[0]);
                let (z_chunks, _) = row.as_chunks::<8>();
                for (o, zc) in p.as_chunks_mut::<8>().0.iter_mut().zip(z_chunks) {
                    *o = cachesim::exp::exp_lanes(zc.map(|zi| f64::from(zi) - max));
                }
                let mut sum = 0.0;
                for &w in p.iter() {
                    sum += w;
                }
                for x in p.iter_mut() {
                    *x /= sum;
                }
                std::hint::black_box(&p);
            }
        })
    });
    group.bench_function("softmax_64_continuous", |b| {
        b.iter(|| {
            let rows = (0..s.layers).flat_map(|l| view.layer_scores(l).expect("scores").chunks_exact(s.candidates));
            for row in rows {
                let max = f64::from(row[0]);
                let mut sum = 0.0;
                for (x, &zi) in p.iter_mut().zip(row) {
                    *x = (f64::from(zi) - max).exp();
                    sum += *x;
                }
                for x in p.iter_mut() {
                    *x /= sum;
                }
                std::hint::black_box(&p);
            }
        })
    });
    group.finish();

    // inv_router itself on those scores.
    let mut group = timed_group(c, "replay");
    group.throughput(Throughput::Elements(picks));
    let keep = Keep::full(&view.shape());
    let cfg = ReplayConfig::new(Policy::InvRouter, 128);
    let pool = one_core_pool();
    group.bench_function("inv_router/lambda0/continuous", |b| {
        b.iter(|| pool.install(|| cachesim::replay(&view, &keep, &cfg).expect("valid config")))
    });
    group.finish();
}

/// The benchmark trace's shape with the trace generator's continuous logits (not quantized).
fn continuous_trace() -> trace_io::TraceData {
    let s = common::BENCH_TRACE;
    let cfg = trace_io::synth::SynthConfig {
        layers: s.layers,
        experts: s.num_experts,
        top_k: s.top_k,
        candidates: s.candidates,
        tokens: s.tokens,
        ..Default::default()
    };
    trace_io::synth::generate(&cfg).expect("a valid synthetic trace")
}

/// Prefetch replays (SEMANTICS.md §12) on the benchmark trace, lru at λ = 0 with cap 128: each
/// predictor at B = k (coact calibrated on a second trace of the same shape; lookahead from a
/// synthetic `lookahead_ids` of 16 ids per row, the row's own first 16), prev_token with the
/// timeline of §13, coact at B = 4, and coact at λ = 0.12 (layers in order, each reading the
/// layer below's recorded choice). `replay/lru/lambda0` in the same run is the plain baseline.
fn bench_prefetch(c: &mut Criterion) {
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let calib = common::synth(common::BENCH_SEED + 1, s);
    let table = cachesim::CoactTable::learn(&calib.view()).expect("a validated calibration trace");
    let v = trace.view();
    let width = 16;
    let lookahead: Vec<u16> = v.parts().ids.chunks_exact(s.candidates).flat_map(|row| row[..width].to_vec()).collect();
    let parts =
        trace_io::TraceParts { lookahead_ids: Some(trace_io::Lookahead { ids: &lookahead, width }), ..v.parts() };
    let view = trace_io::TraceView::new(v.meta(), s.tokens, s.candidates, parts).expect("valid lookahead");
    let keep = Keep::full(&view.shape());
    let cfg = ReplayConfig::new(Policy::Lru, 128);
    let pool = one_core_pool();
    let picks = (s.layers * s.tokens * s.top_k) as u64;
    let mut group = timed_group(c, "prefetch");
    group.throughput(Throughput::Elements(picks));
    let dev = cachesim::TimelineDevice { expert_mb: 1.3824, compute_ms: 12.0, bandwidth_gbps: 3.9 };
    let mut cases: Vec<(String, cachesim::PrefetchOptions<'_>)> = cachesim::Predictor::ALL
        .iter()
        .map(|&predictor| {
            let prefetch = Some(cachesim::Prefetch { predictor, budget: s.top_k });
            (
                format!("lru/{predictor}:{}", s.top_k),
                cachesim::PrefetchOptions { prefetch, coact: Some(&table), timeline: None },
            )
        })
        .collect();
    let prev = Some(cachesim::Prefetch { predictor: cachesim::Predictor::PrevToken, budget: s.top_k });
    cases.push((
        format!("lru/prev_token:{}/timeline", s.top_k),
        cachesim::PrefetchOptions { prefetch: prev, coact: None, timeline: Some(dev) },
    ));
    let coact4 = Some(cachesim::Prefetch { predictor: cachesim::Predictor::Coact, budget: 4 });
    cases.push((
        "lru/coact:4".into(),
        cachesim::PrefetchOptions { prefetch: coact4, coact: Some(&table), timeline: None },
    ));
    let mut cases: Vec<(String, cachesim::PrefetchOptions<'_>, ReplayConfig)> =
        cases.into_iter().map(|(n, o)| (n, o, cfg.clone())).collect();
    // coact at λ > 0 follows the layer below's cache-dependent choice: layers in order.
    let coact10 = Some(cachesim::Prefetch { predictor: cachesim::Predictor::Coact, budget: s.top_k });
    cases.push((
        format!("lru/lambda0.12/coact:{}", s.top_k),
        cachesim::PrefetchOptions { prefetch: coact10, coact: Some(&table), timeline: None },
        ReplayConfig { lambda: 0.12, ..cfg.clone() },
    ));
    for (name, opts, cfg) in cases {
        group.bench_function(name, |b| {
            b.iter(|| pool.install(|| cachesim::replay_prefetch(&view, &keep, &cfg, &opts).expect("valid config")))
        });
    }
    group.finish();
}

/// Hybrid execution (SEMANTICS.md §14) against the plain replay in the same run, on the trace of
/// `replay`: `plain/lru` (§5's replay, the baseline), `deploy/lru` (the deployed step loop, no
/// execution model), `host/lru` (the same loop recording host runs and copies, then priced on
/// one device), `host/static_pins64` (cap 0 and 64 pinned experts per layer: the placement of
/// kTransformers and llama.cpp) and `host/all_cpu` (cap 0, nothing pinned). The requirement is a
/// ratio: hybrid picks/s at least half of `plain/lru`'s.
fn bench_hybrid(c: &mut Criterion) {
    use cachesim::deploy::Deployment;
    use cachesim::hybrid::{Exec, HybridDevice, Overlap};
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pins: Vec<Vec<u16>> = (0..s.layers).map(|_| (0..64).collect()).collect();
    let pinned = Deployment { pins: Some(Keep::from_layers(&shape, &pins).expect("pins")), ..Deployment::default() };
    let dev = HybridDevice {
        expert_mb: 1.3824,
        compute_ms: 12.0,
        compute_ms_per_step: None,
        host_gbps: 40.0,
        host_ms_per_row: 0.0,
        host_sync_ms: 0.0,
        link_gbps: Some(25.0),
        overlap: Overlap::Concurrent,
    };
    let pool = one_core_pool();
    let picks = (s.layers * s.tokens * s.top_k) as u64;
    let mut group = timed_group(c, "hybrid");
    group.throughput(Throughput::Elements(picks));
    let lru = ReplayConfig::new(Policy::Lru, 128);
    let cap0 = ReplayConfig::new(Policy::Lru, 0);
    group.bench_function("plain/lru", |b| {
        b.iter(|| pool.install(|| cachesim::replay(&view, &keep, &lru).expect("valid")))
    });
    let none = Deployment::default();
    group.bench_function("deploy/lru", |b| {
        b.iter(|| pool.install(|| cachesim::deploy::replay(&view, &keep, &lru, &none).expect("valid")))
    });
    let cases = [("host/lru", &lru, &none), ("host/static_pins64", &cap0, &pinned), ("host/all_cpu", &cap0, &none)];
    for (name, cfg, dep) in cases {
        group.bench_function(name, |b| {
            b.iter(|| {
                pool.install(|| {
                    let (_, events) =
                        cachesim::hybrid::replay_hybrid(&view, &keep, cfg, dep, Exec::Host).expect("valid");
                    events.cost(&dev).expect("priced")
                })
            })
        });
    }
    group.finish();
}

/// Deployments (SEMANTICS.md §9–§11) against the plain replay in the same run (issue #40: at
/// least half its picks/s): the benchmark trace cut into 64 sequences, cap 128 for the plain
/// baseline `plain/lru`; `pins64/POLICY` (lru, lfu, belady, the credit policies, perfect_lfu and lfru) pins 64 experts per layer under a cache of 64 (the same
/// fast memory), `tier2/lru` adds a second tier of 256, `batch8/lru` re-batches by B = 8.
fn bench_deploy(c: &mut Criterion) {
    use cachesim::deploy::{Deployment, Schedule, Tier2};
    let s = common::Synth { sequences: 64, ..common::BENCH_TRACE };
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pins: Vec<Vec<u16>> = (0..s.layers).map(|_| (0..64).collect()).collect();
    let pins = Some(Keep::from_layers(&shape, &pins).expect("pins"));
    let pool = one_core_pool();
    let picks = (s.layers * s.tokens * s.top_k) as u64;
    let mut group = timed_group(c, "deploy");
    group.throughput(Throughput::Elements(picks));
    let lru = ReplayConfig::new(Policy::Lru, 128);
    group.bench_function("plain/lru", |b| {
        b.iter(|| pool.install(|| cachesim::replay(&view, &keep, &lru).expect("valid")))
    });
    let pinned = Deployment { pins, ..Deployment::default() };
    let tier2 = Deployment { tier2: Some(Tier2 { policy: Policy::Lru, cap: 256 }), ..Deployment::default() };
    let batch = Deployment { schedule: Schedule::Rebatch(8), ..Deployment::default() };
    let mut cases: Vec<(String, ReplayConfig, &Deployment)> = [
        Policy::Lru,
        Policy::Lfu,
        Policy::Belady,
        Policy::NearPick,
        Policy::NearPickEma,
        Policy::InvRouter,
        Policy::PerfectLfu,
        Policy::Lfru,
    ]
    .into_iter()
    .map(|p| (format!("pins64/{p}"), ReplayConfig::new(p, 64), &pinned))
    .collect();
    cases.push(("tier2/lru".into(), lru.clone(), &tier2));
    cases.push(("batch8/lru".into(), lru.clone(), &batch));
    for (name, cfg, dep) in &cases {
        group.bench_function(name.as_str(), |b| {
            b.iter(|| pool.install(|| cachesim::deploy::replay(&view, &keep, cfg, dep).expect("valid")))
        });
    }
    group.finish();
}

/// One cache for every layer (SEMANTICS.md §15.1) against per-layer caches of the same memory in
/// the same run (issue #56: at least half the picks/s of plain lru): `plain/lru` caps each of the
/// 8 layers at 128; `shared/POLICY` replays one cache of 8 · 128 = 1024 (layer, expert) slots.
fn bench_shared(c: &mut Criterion) {
    use cachesim::deploy::Schedule;
    use cachesim::shared_cache::SharedCache;
    let s = common::BENCH_TRACE;
    let trace = common::synth(common::BENCH_SEED, s);
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let pool = one_core_pool();
    let picks = (s.layers * s.tokens * s.top_k) as u64;
    let mut group = timed_group(c, "shared");
    group.throughput(Throughput::Elements(picks));
    let lru = ReplayConfig::new(Policy::Lru, 128);
    group.bench_function("plain/lru", |b| {
        b.iter(|| pool.install(|| cachesim::replay(&view, &keep, &lru).expect("valid")))
    });
    let shared = SharedCache { cap: 128 * s.layers, pins: None, schedule: Schedule::PerToken };
    for p in [Policy::Lru, Policy::Fifo, Policy::Lfu, Policy::PerfectLfu, Policy::Lfru, Policy::Belady] {
        let cfg = ReplayConfig::new(p, 128);
        group.bench_function(format!("shared/{p}"), |b| {
            b.iter(|| pool.install(|| cachesim::shared_cache::replay(&view, &keep, &cfg, &shared).expect("valid")))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_replay, bench_floor, bench_prefetch, bench_hybrid, bench_deploy, bench_shared);
criterion_main!(benches);
