//! Replays on real routing data (ESFT, DeepSeek-V2-Lite shape, translation domain).
//! Set `MOE_OFFLOAD_REAL_DATA` to the real data directory (for example /work/shared/data/real);
//! without it these tests show as ignored.

use cachesim::{Keep, Policy, ReplayConfig, Semantics, reference};
use trace_io::TraceData;
use trace_io::import::esft::{EsftOptions, import_esft};

/// The ESFT translation domain of the real data.
fn translation() -> TraceData {
    let dir = real_data::dir().join("esft-dsv2lite");
    let opts = EsftOptions { domains: vec!["translation".into()], ..Default::default() };
    import_esft(&dir, &opts).unwrap_or_else(|e| panic!("importing {}: {e}", dir.display()))
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn belady_bounds_every_policy_on_translation() {
    let trace = translation();
    let view = trace.view();
    let shape = view.shape();
    assert_eq!((shape.layers, shape.num_experts, shape.top_k, shape.candidates), (26, 64, 6, 6));
    let keep = Keep::full(&shape);
    for cap in [8, 16, 32] {
        let opt = cachesim::replay(&view, &keep, &ReplayConfig::new(Policy::Belady, cap)).expect("valid");
        let mut line = format!("cap {cap}: tokens {}", opt.tokens);
        for policy in Policy::ALL {
            let c = cachesim::replay(&view, &keep, &ReplayConfig::new(policy, cap)).expect("valid");
            assert_eq!(c.hits + c.misses, c.picks);
            assert_eq!(c.picks, c.tokens * 26 * 6);
            assert!(opt.misses <= c.misses, "cap {cap}: belady {} > {policy} {}", opt.misses, c.misses);
            line += &format!(", {policy} {:.3}", c.misses_per_token());
        }
        println!("misses per token (translation, W = 64, k = 6, λ = 0) {line}");
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn fast_equals_reference_on_translation() {
    let trace = translation();
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for policy in Policy::ALL {
        for lambda in [0.0, 0.09] {
            if !policy.facts().allows_lambda() && lambda > 0.0 {
                continue;
            }
            let cfg = ReplayConfig { k_used: Some(4), lambda, ..ReplayConfig::new(policy, 16) };
            let fast = cachesim::replay(&view, &keep, &cfg).expect("valid");
            let slow = reference::replay(&view, &keep, &cfg).expect("valid");
            assert_eq!(fast, slow, "{cfg:?}");
            println!("k_used 4, cap 16, {policy} λ {lambda}: misses/token {:.4}", fast.misses_per_token());
        }
    }
}

#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn k_way_versus_sequential_lru_on_translation() {
    let trace = translation();
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    let kway = cachesim::replay(&view, &keep, &ReplayConfig::new(Policy::Lru, 16)).expect("valid");
    let seq_cfg = ReplayConfig { semantics: Semantics::Sequential, ..ReplayConfig::new(Policy::Lru, 16) };
    let seq = cachesim::replay(&view, &keep, &seq_cfg).expect("valid");
    let diff = (seq.misses as f64 - kway.misses as f64) / kway.misses as f64;
    println!(
        "lru cap 16: k-way {:.4} misses/token, sequential {:.4} ({:+.2}%)",
        kway.misses_per_token(),
        seq.misses_per_token(),
        100.0 * diff
    );
    // Protection can only help LRU here: evicting an expert the token still needs costs a miss.
    assert!(seq.misses >= kway.misses);
}
