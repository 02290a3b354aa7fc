//! Each command validates exactly what it reads (SEMANTICS.md §1): a violation in what it reads is
//! refused with the typed error naming tensor, layer, token and value; one in what it does not
//! read is not needed for its figures, which equal those of the intact trace.

mod common;

use std::path::{Path, PathBuf};

use common::{fails, ok, s, synth};

/// Layers, experts, k, m, tokens of the test trace (synthetic traces have scores and gates;
/// `--norms` adds output norms).
const SHAPE: [usize; 5] = [2, 16, 2, 6, 200];
/// The corrupted row: layer index 1 (layer id 1), token 150.
const ROW: (usize, usize) = (1, 150);

/// Byte position of element `index` of `tensor` (of `size` bytes) in the safetensors file `bytes`.
fn position(bytes: &[u8], tensor: &str, index: usize, size: usize) -> usize {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header[tensor]["data_offsets"][0].as_u64().unwrap() as usize;
    8 + n + start + index * size
}

/// A copy of `clean` named `name` with `edit` applied to its bytes.
fn corrupt(clean: &Path, name: &str, edit: impl Fn(&mut Vec<u8>)) -> PathBuf {
    let mut bytes = std::fs::read(clean).unwrap();
    edit(&mut bytes);
    let p = clean.with_file_name(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// Row-major index of slot `slot` of the corrupted row in a tensor of `width` values per row.
fn at(slot: usize, width: usize) -> usize {
    (ROW.0 * SHAPE[4] + ROW.1) * width + slot
}

fn replay(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec!["replay", s(trace), "--cap", "4", "--warmup", "0", "--json"];
    args.extend(extra);
    ok(&args)
}

fn replay_fails(trace: &Path, extra: &[&str]) -> String {
    let mut args = vec!["replay", s(trace), "--cap", "4", "--warmup", "0"];
    args.extend(extra);
    fails(&args)
}

/// The statistics of a trace without their provenance (source and digest differ by file).
fn stats_layers(trace: &Path, out: &Path) -> serde_json::Value {
    ok(&["stats", s(trace), "-o", s(out)]);
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(out).unwrap()).unwrap();
    v["layers"].clone()
}

#[test]
fn each_command_validates_what_it_reads() {
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean.safetensors");
    synth(&clean, SHAPE, &["--norms", "--seed", "5"]);
    let m = SHAPE[3];
    let bytes = std::fs::read(&clean).unwrap();
    let id_at = |slot: usize| {
        let p = position(&bytes, "ids", at(slot, m), 2);
        u16::from_le_bytes([bytes[p], bytes[p + 1]])
    };
    let first = id_at(0);
    let where_ =
        |tensor: &str, slot: usize| format!("tensor `{tensor}`, layer 1 (index 1), token {}, slot {slot}", ROW.1);

    // The last candidate repeats the first: beyond k_used and beyond N = 3, within N = 48.
    let repeat = corrupt(&clean, "repeat.safetensors", |b| {
        let p = position(b, "ids", at(m - 1, m), 2);
        b[p..p + 2].copy_from_slice(&first.to_le_bytes());
    });
    let repeated = format!("{}: expert id {first} repeated in the row", where_("ids", m - 1));
    for policy in ["lru", "fifo", "lfu", "belady"] {
        assert_eq!(replay(&repeat, &["--policy", policy]), replay(&clean, &["--policy", policy]), "{policy}");
    }
    let np3 = ["--policy", "near_pick", "--near-pick-n", "3"];
    assert_eq!(replay(&repeat, &np3), replay(&clean, &np3));
    let ema3 = ["--policy", "near_pick_ema", "--near-pick-n", "3"];
    assert_eq!(replay(&repeat, &ema3), replay(&clean, &ema3));
    for refused in [
        &["--policy", "near_pick"][..],
        &["--policy", "near_pick_ema"],
        &["--policy", "inv_router"],
        &["--policy", "lru", "--lambda", "0.1"],
    ] {
        let e = replay_fails(&repeat, refused);
        assert!(e.contains(&repeated), "{refused:?}: {e}");
    }
    assert_eq!(stats_layers(&repeat, &dir.path().join("r.json")), stats_layers(&clean, &dir.path().join("c.json")));
    assert!(fails(&["inspect", s(&repeat)]).contains(&repeated));

    // A pruned keep map reads every candidate.
    let stats = dir.path().join("c.json");
    let keep = dir.path().join("keep.json");
    ok(&["keep", s(&stats), "--metric", "frequency", "--k", "12", "-o", s(&keep)]);
    let e = replay_fails(&repeat, &["--policy", "lru", "--keep", s(&keep)]);
    assert!(e.contains(&repeated), "{e}");
    ok(&["replay", s(&clean), "--policy", "lru", "--cap", "4", "--keep", s(&keep)]);

    // An id out of range among the first k: every replay reads it.
    let out_of_range = corrupt(&clean, "range.safetensors", |b| {
        let p = position(b, "ids", at(1, m), 2);
        b[p..p + 2].copy_from_slice(&99u16.to_le_bytes());
    });
    let e = replay_fails(&out_of_range, &["--policy", "lru"]);
    assert!(e.contains(&format!("{}: expert id 99 >= num_experts 16", where_("ids", 1))), "{e}");

    // A NaN score: read by inv_router and cache-aware routing only.
    let nan = corrupt(&clean, "nan.safetensors", |b| {
        let p = position(b, "scores", at(3, m), 4);
        b[p..p + 4].copy_from_slice(&f32::NAN.to_le_bytes());
    });
    let not_finite = format!("{}: value NaN is not finite", where_("scores", 3));
    assert_eq!(replay(&nan, &["--policy", "lru"]), replay(&clean, &["--policy", "lru"]));
    assert_eq!(replay(&nan, &["--policy", "near_pick"]), replay(&clean, &["--policy", "near_pick"]));
    for refused in [&["--policy", "inv_router"][..], &["--policy", "lru", "--lambda", "0.1"]] {
        let e = replay_fails(&nan, refused);
        assert!(e.contains(&not_finite), "{refused:?}: {e}");
    }
    assert_eq!(stats_layers(&nan, &dir.path().join("n.json")), stats_layers(&clean, &stats));
    assert!(fails(&["inspect", s(&nan)]).contains(&not_finite));

    // A negative gate and an infinite norm: read by the statistics only.
    for (tensor, value, problem) in
        [("gates", -0.5f32, "value -0.5 is negative"), ("out_norms", f32::INFINITY, "value inf is not finite")]
    {
        let bad = corrupt(&clean, &format!("{tensor}.safetensors"), |b| {
            let p = position(b, tensor, at(1, SHAPE[2]), 4);
            b[p..p + 4].copy_from_slice(&value.to_le_bytes());
        });
        let want = format!("{}: {problem}", where_(tensor, 1));
        for policy in ["lru", "inv_router"] {
            assert_eq!(replay(&bad, &["--policy", policy]), replay(&clean, &["--policy", policy]), "{tensor}");
        }
        let e = fails(&["stats", s(&bad), "-o", s(&dir.path().join("bad.json"))]);
        assert!(e.contains(&want), "{tensor}: {e}");
        assert!(!dir.path().join("bad.json").exists(), "no partial output");
        assert!(fails(&["inspect", s(&bad)]).contains(&want));
    }
}
