//! `moe-offload keep --placement`: kTransformers' GPU expert placements written as pin maps and
//! replayed with `replay --pin`, a layer with no pins included.

mod common;

use common::{fails, json, ok, s, synth};

#[test]
fn placements_replay_as_pins() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.safetensors");
    let stats = dir.path().join("s.json");
    // 3 layers, 8 experts, top-2.
    synth(&trace, [3, 8, 2, 4, 400], &["--seed", "3"]);
    ok(&["stats", s(&trace), "-o", s(&stats)]);
    let t = s(&trace);
    for (placement, sizes) in [("uniform", [2u64, 2, 1]), ("front", [5, 0, 0])] {
        let pin = dir.path().join(format!("{placement}.json"));
        let out = ok(&["keep", s(&stats), "--placement", placement, "--budget", "5", "-o", s(&pin)]);
        assert!(out.contains(&format!("{placement}@pins5")), "{out}");
        let map: serde_json::Value = serde_json::from_slice(&std::fs::read(&pin).unwrap()).unwrap();
        let got: Vec<u64> =
            map["layers"].as_array().unwrap().iter().map(|l| l.as_array().unwrap().len() as u64).collect();
        assert_eq!(got, sizes, "{placement}");
        assert_eq!(map["placement"]["total"], 5);
        let r = json(&["replay", t, "--policy", "lru", "--cap", "2", "--pin", s(&pin), "--json"]);
        assert_eq!(r["layer_pins"], serde_json::json!(sizes), "{placement}");
    }
    for placement in ["random", "frequency"] {
        let pin = dir.path().join(format!("{placement}.json"));
        ok(&["keep", s(&stats), "--placement", placement, "--budget", "7", "-o", s(&pin)]);
        ok(&["replay", t, "--policy", "lru", "--cap", "2", "--pin", s(&pin)]);
    }
    // Refusals: above L·E, a seed for a placement without one, a placement with --k.
    fails(&["keep", s(&stats), "--placement", "uniform", "--budget", "25", "-o", "-"]);
    fails(&["keep", s(&stats), "--placement", "uniform", "--budget", "5", "--seed", "1", "-o", "-"]);
    fails(&["keep", s(&stats), "--placement", "uniform", "--k", "2", "-o", "-"]);
}
