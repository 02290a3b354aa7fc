//! `replay --shared-cap`: one cache for every layer (SEMANTICS.md §15.1) through the binary: the
//! document's occupancy fields, the table, pins outside the cache, and the refusals.

mod common;

use common::{fails, json, ok, s, synth};

#[test]
fn shared_cap_replays_one_cache_for_every_layer() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [3, 16, 2, 4, 300], &["--sequences", "6"]);
    let t = s(&trace);
    let doc = json(&["replay", t, "--policy", "lru", "--shared-cap", "12", "--warmup", "0", "--json"]);
    assert_eq!(doc["shared_cap"], 12);
    let end: Vec<u64> = serde_json::from_value(doc["layer_slots_end"].clone()).unwrap();
    let mean: Vec<f64> = serde_json::from_value(doc["layer_slots_mean"].clone()).unwrap();
    assert_eq!((end.len(), mean.len()), (3, 3));
    assert_eq!(end.iter().sum::<u64>(), 12, "a full cache at the end");
    assert!(mean.iter().sum::<f64>() <= 12.0);
    let layer_misses: Vec<u64> = serde_json::from_value(doc["layer_misses"].clone()).unwrap();
    assert_eq!(layer_misses.iter().sum::<u64>(), doc["misses"].as_u64().unwrap());
    // Per-layer replays carry none of the shared fields.
    let per_layer = json(&["replay", t, "--policy", "lru", "--cap", "4", "--warmup", "0", "--json"]);
    assert!(per_layer.get("shared_cap").is_none());
    // Pins stay outside the shared cache; C = 0 streams every unpinned pick.
    let stats = dir.path().join("stats.json");
    ok(&["stats", t, "-o", s(&stats)]);
    let pin = dir.path().join("pin.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "2", "-o", s(&pin)]);
    let zero = json(&["replay", t, "--policy", "fifo", "--shared-cap", "0", "--pin", s(&pin), "--json"]);
    assert_eq!(zero["hits"], zero["pinned_hits"]);
    assert_eq!(zero["layer_pins"], serde_json::json!([2, 2, 2]));
    assert_eq!(zero["layer_slots_end"], serde_json::json!([0, 0, 0]));
    // The table shows each layer's slots.
    let table = ok(&["replay", t, "--policy", "belady", "--shared-cap", "12"]);
    assert!(table.contains("shared cache of 12 slots") && table.contains("mean slots"), "{table}");
    // Re-batched steps through the one cache (§11 with §15.1); B = 1 is the per-token replay.
    let b1 = json(&["replay", t, "--policy", "lru", "--shared-cap", "12", "--warmup", "0", "--batch", "1", "--json"]);
    for key in ["hits", "misses", "layer_misses", "layer_slots_end", "layer_slots_mean"] {
        assert_eq!(b1[key], doc[key], "{key}");
    }
}

#[test]
fn shared_cap_refusals_name_the_flags() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    synth(&trace, [2, 16, 2, 4, 200], &[]);
    let t = s(&trace);
    let base = ["replay", t, "--policy", "lru", "--shared-cap", "8"];
    for (extra, said) in [
        (&["--cap", "4"][..], "--shared-cap and --cap exclude each other"),
        (&["--layer-caps", "4,4"], "--shared-cap and --layer-caps exclude each other"),
        (&["--tier2", "lru:4"], "--tier2 with --shared-cap"),
        (&["--prefetch", "prev_token:2"], "--prefetch with --shared-cap"),
        (&["--exec", "host"], "--exec host with --shared-cap"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let err = fails(&args);
        assert!(err.contains(said), "{extra:?}: {err}");
    }
    let err = fails(&["replay", t, "--policy", "lru", "--shared-cap", "1"]);
    assert!(err.contains("below k_used"), "{err}");
}
