//! One cache shared by every layer (SEMANTICS.md §15.1) on the real traces: the ESFT translation
//! domain (26 layers) and the Qwen1.5-MoE vLLM trace (five layers), fast against the plain
//! reference, and the per-layer caches against one shared cache of the same memory. Set
//! `MOE_OFFLOAD_REAL_DATA`; without it these tests show as ignored.

mod common;

use cachesim::shared_cache::{self, SharedCache};
use cachesim::{Keep, Policy, ReplayConfig, reference};
use common::{real_qwen as qwen, real_translation as translation, top_frequency};
use trace_io::TraceData;

/// Replays `trace` with per-layer caps of `cap` and one shared cache of L · cap (fast and
/// reference, which must agree), for each policy; prints misses per token and the occupancy.
#[expect(clippy::print_stdout, reason = "the figures of docs/policies.md, shown with --nocapture")]
fn compare(name: &str, trace: &TraceData, cap: usize, policies: &[Policy], pins: bool) {
    let view = trace.view();
    let shape = view.shape();
    let keep = Keep::full(&shape);
    let pins = pins.then(|| Keep::from_layers(&shape, &top_frequency(trace, 4)).expect("pins"));
    for &policy in policies {
        let cfg = ReplayConfig::new(policy, cap);
        let shared = SharedCache { cap: shape.layers * cap, pins: pins.clone(), ..SharedCache::default() };
        let fast = shared_cache::replay(&view, &keep, &cfg, &shared).expect("valid");
        let slow = reference::shared::replay(&view, &keep, &cfg, &shared).expect("valid");
        assert_eq!(fast, slow, "{name} {policy} cap {cap}");
        let mean = fast.layer_slots_mean();
        let (lo, hi) = mean.iter().fold((f64::MAX, 0.0f64), |(lo, hi), &m| (lo.min(m), hi.max(m)));
        if pins.is_none() {
            let per_layer = cachesim::replay(&view, &keep, &cfg).expect("valid");
            println!(
                "{name} {policy} cap {cap}: per-layer {:.3} / shared {:.3} misses per token; slots per layer {lo:.1}..{hi:.1}",
                per_layer.misses_per_token(),
                fast.deploy.counts.misses_per_token()
            );
        }
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn esft_translation_shared_fast_equals_reference() {
    let trace = translation();
    compare("esft", &trace, 16, &[Policy::Lru, Policy::Lfu, Policy::Belady, Policy::InvRouter], false);
    compare("esft", &trace, 8, &[Policy::Fifo, Policy::Lru], true);
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn qwen_shared_fast_equals_reference() {
    let trace = qwen();
    compare(
        "qwen",
        &trace,
        8,
        &Policy::ALL.iter().copied().filter(|p| p.as_str() != "lfu_fifo").collect::<Vec<_>>(),
        false,
    );
}
