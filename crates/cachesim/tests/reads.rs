//! A replay refuses a view not validated for what it reads (SEMANTICS.md §1): through a
//! trace file, so here and not beside `reads.rs` (cachesim's library code does no I/O).

use cachesim::{CacheSimError, Keep, Policy, ReplayConfig, replay_reads};
use trace_io::TraceFile;

/// The fast and the reference replayer refuse a view not validated for what they read,
/// naming both, and replay one that is: the counts of a fully validated view.
#[test]
fn replays_refuse_a_view_not_validated_for_what_they_read() {
    let synth = trace_io::synth::SynthConfig {
        layers: 2,
        experts: 16,
        top_k: 3,
        candidates: 7,
        tokens: 300,
        sequences: 2,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.safetensors");
    trace_io::synth::write(&p, &synth, 1, &|_| {}).unwrap();
    let f = TraceFile::open_lazy(&p).unwrap();
    let shape = f.shape();
    let keep = Keep::full(&shape);
    let lru = ReplayConfig::new(Policy::Lru, 4);
    let inv = ReplayConfig::new(Policy::InvRouter, 4);
    let refused = |needed: &str, validated: &str| CacheSimError::NotValidated {
        needed: needed.into(),
        validated: validated.into(),
    };
    assert_eq!(cachesim::replay(&f.view(), &keep, &lru), Err(refused("ids up to rank 3", "nothing")));
    let v = f.view_for(replay_reads(&shape, &keep, &lru)).unwrap();
    let got = cachesim::replay(&v, &keep, &lru).unwrap();
    assert_eq!(cachesim::replay(&v, &keep, &inv), Err(refused("ids up to rank 7, scores", "ids up to rank 3")));
    assert_eq!(cachesim::reference::replay(&v, &keep, &lru), Err(refused("ids up to rank 7", "ids up to rank 3")));
    let full = TraceFile::open(&p).unwrap();
    assert_eq!(cachesim::replay(&full.view(), &keep, &lru).unwrap(), got);
    assert_eq!(cachesim::reference::replay(&full.view(), &keep, &lru).unwrap(), got);
}
