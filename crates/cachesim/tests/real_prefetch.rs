//! Prefetch and the timeline on real routing data (ESFT, DeepSeek-V2-Lite shape): the
//! translation domain, coact calibrated on the three other domains. Set `MOE_OFFLOAD_REAL_DATA`
//! to the real data directory; without it these tests show as ignored.

use cachesim::{
    CoactTable, Keep, Policy, Predictor, Prefetch, PrefetchOptions, ReplayConfig, TimelineDevice, reference,
    shuffle::Shuffled,
};
use trace_io::TraceData;
use trace_io::import::esft::{EsftOptions, import_esft};

fn esft(domains: &[&str]) -> TraceData {
    let dir = real_data::dir().join("esft-dsv2lite");
    let opts = EsftOptions { domains: domains.iter().map(|d| d.to_string()).collect(), ..Default::default() };
    import_esft(&dir, &opts).unwrap_or_else(|e| panic!("importing {}: {e}", dir.display()))
}

/// dsv2-lite-bf16 at 3.9 GB/s (sweep's preset: 17.301504 MB per expert, 20 ms per token).
const DEV: TimelineDevice = TimelineDevice { expert_mb: 17.301504, compute_ms: 20.0, bandwidth_gbps: 3.9 };

/// Counts and timeline figures of the fast replayer equal the plain reference's on every
/// policy with each predictor ESFT supports (it records no lookahead_ids), and the oracle at
/// B = k moves every miss ahead.
#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn fast_equals_reference_on_translation() {
    let trace = esft(&["translation"]);
    let calib = esft(&["intent", "law", "summary"]);
    let table = CoactTable::learn(&calib.view()).expect("a validated calibration trace");
    let view = trace.view();
    let keep = Keep::full(&view.shape());
    for policy in Policy::ALL.into_iter().filter(|p| p.facts().allows_prefetch()) {
        let cfg = ReplayConfig::new(policy, 16);
        let plain = cachesim::replay(&view, &keep, &cfg).expect("valid");
        for (predictor, budget) in [(Predictor::PrevToken, 6), (Predictor::Coact, 4), (Predictor::Oracle, 6)] {
            let opts = PrefetchOptions {
                prefetch: Some(Prefetch { predictor, budget }),
                coact: Some(&table),
                timeline: Some(DEV),
            };
            let fast = cachesim::replay_prefetch(&view, &keep, &cfg, &opts).expect("valid");
            let slow = reference::prefetch::replay(&view, &keep, &cfg, &opts).expect("valid");
            assert_eq!(fast.counts, slow.counts, "{policy} {predictor}:{budget}");
            let (a, b) = (fast.timeline.expect("asked"), slow.timeline.expect("asked"));
            assert!((a.tok_s - b.tok_s).abs() <= 1e-9 * a.tok_s, "{a:?} {b:?}");
            assert!((a.stall_s_per_token - b.stall_s_per_token).abs() <= 1e-9 * a.tok_s.recip(), "{a:?} {b:?}");
            if predictor == Predictor::Oracle {
                assert_eq!(fast.counts.replay.misses, 0);
                assert_eq!(fast.counts.wasted, 0);
                // Not lfru's loads: a prefetch load is an insert and advances its clock (SEMANTICS.md
                // §15.3), so its victims differ from the plain replay's (tests/prefetch.rs says more).
                if policy != Policy::Lfru {
                    assert_eq!(fast.counts.prefetch_loads, plain.misses, "{policy}");
                }
            }
            println!(
                "{policy} cap 16 {predictor}:{budget}: precision {:.3} coverage {:.3} misses/token {:.3} (plain {:.3}) tok/s {:.2}",
                fast.counts.precision(),
                fast.counts.coverage(),
                fast.counts.replay.misses_per_token(),
                plain.misses_per_token(),
                a.tok_s
            );
        }
    }
}

/// The translation trace has temporal locality: every online policy misses more on a shuffled
/// copy (README: 27% vs 9% reuse at the next token).
#[test]
#[cfg_attr(not(real_data), ignore = "set MOE_OFFLOAD_REAL_DATA to run")]
fn shuffled_order_misses_more_on_translation() {
    let trace = esft(&["translation"]);
    let view = trace.view();
    let shuffled = Shuffled::new(&view, 1);
    let keep = Keep::full(&view.shape());
    for policy in Policy::ALL {
        let cfg = ReplayConfig::new(policy, 16);
        let real = cachesim::replay(&view, &keep, &cfg).expect("valid");
        let shuf = cachesim::replay(&shuffled.view(), &keep, &cfg).expect("valid");
        assert_eq!(real.picks, shuf.picks);
        println!(
            "{policy} cap 16: misses/token real {:.3}, shuffled {:.3}",
            real.misses_per_token(),
            shuf.misses_per_token()
        );
        if !policy.facts().offline {
            assert!(shuf.misses > real.misses, "{policy}: shuffled {} <= real {}", shuf.misses, real.misses);
        }
    }
}
