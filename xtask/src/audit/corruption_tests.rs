//! The corruption set of `audit --dir`: each kind of lie applied to the fixture's outputs (real
//! outputs of the embedded default traces, `fixture.rs`), and the first offending item the audit
//! must name (file, row, figure). Each `check(corruption, expected)` applies one corruption to a
//! fresh copy, audits it, and asserts that the audit fails with `expected` as the first failing
//! check's first offending item (a prefix of it, where the rest holds a hash or a path).

use serde_json::{Value, json};
use sweep::{Grid, SweepOutput};

use super::Status;
use super::dir::{Options, audit_dir, first_failure, passed};
use super::fixture::{Fixture, edit_json, fixture, run_sweep, trace_stats, write_saliency};

/// Applies `corrupt` to a fresh fixture, audits it (default options) and asserts the first failure.
fn check(corrupt: impl FnOnce(&Fixture), expected: &str) {
    let fx = fixture();
    corrupt(&fx);
    let r = audit_dir(&fx.out(), &Options::default()).unwrap();
    assert!(!passed(&r), "the corruption passed the audit");
    let c = first_failure(&r).unwrap();
    let first = c.first_offending.as_deref().unwrap_or_default();
    assert!(first.starts_with(expected), "first failure: [{}] {}\n{first}\nexpected: {expected}", c.section, c.name);
}

/// Reads the fixture's sweep, lets `edit` change it, and writes all three files again (so
/// `results.csv` and `summary.md` agree with the edited `results.json`: a consistent lie).
fn rewrite_sweep(fx: &Fixture, edit: impl FnOnce(&mut SweepOutput)) {
    let path = fx.path("sweep/results.json");
    let mut out = SweepOutput::read(&path).unwrap();
    edit(&mut out);
    out.write(&fx.path("sweep")).unwrap();
}

/// SHA-256 of the committed `data/default-NAME.safetensors` (the fixture's traces are copies).
fn committed_sha(name: &str) -> String {
    trace_io::sha256_file(crate::workspace_root().join(format!("data/default-{name}.safetensors"))).unwrap()
}

fn row_index(out: &SweepOutput, key: &str, sample: sweep::Sample) -> usize {
    out.rows.iter().position(|r| r.key == key && r.sample == sample).unwrap()
}

#[test]
fn untouched_outputs_pass_with_every_row_replayed() {
    let fx = fixture();
    let r = audit_dir(&fx.out(), &Options::default()).unwrap();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let replay =
        r.checks.iter().find(|c| c.name.ends_with("rows replayed by the reference replayer, every count equal"));
    let f = &replay.expect("a replay check").figures;
    // 3 variants x 7 policies x 2 caps + 2 variants x 3 policies x 2 lambdas x 2 j + 1 with
    // per-layer caps = 67, x 2 traces.
    assert_eq!((&f["replayed"], &f["of"], &f["mismatches"]), (&json!(134), &json!(134), &json!(0)));
    for name in [
        "stats.json: recomputed from its trace",
        "heldout-stats.json: recomputed from its trace",
        "sweep/results.json: traces found and verified against their recorded hashes",
        "sweep/results.json: in-sample statistics recomputed from the trace",
        "sweep/results.json: every row of the grid present, once",
        "sweep/results.json: keep maps rebuilt as recorded",
        "sweep/results.json: results.csv and summary.md agree with results.json",
        "plan.json: chosen configuration replayed by the reference replayer",
    ] {
        let c = r.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}"));
        assert_eq!(c.status, Status::Pass, "{name}");
    }
    let c = r
        .checks
        .iter()
        .find(|c| c.name == "sweep/results.json: traces found and verified against their recorded hashes");
    assert_eq!(c.unwrap().figures["in_sample"], json!("../calib.safetensors"));
}

/// One row claims 20 fewer misses, with hits, per-layer misses, hit rate, misses per token and
/// tok/s adjusted to match, and the CSV and summary written from it: only the replay sees it.
#[test]
fn a_consistent_lie_in_one_row() {
    check(
        |fx| {
            rewrite_sweep(fx, |out| {
                let profiles = out.provenance.grid.device_profiles().unwrap();
                let i = row_index(out, "full/lru/0/0/8/4", sweep::Sample::OutOfSample);
                let r = &mut out.rows[i];
                r.counts.misses -= 20;
                r.counts.hits += 20;
                r.counts.layer_misses[0] -= 20;
                r.hit_rate = r.counts.hit_rate();
                r.misses_per_token = r.counts.misses_per_token();
                let bws = profiles.iter().flat_map(|p| p.bandwidth_gbps.iter().map(move |&b| (p, b)));
                for (cost, (p, bw)) in r.cost.iter_mut().zip(bws) {
                    cost.ssd_mb_per_token = p.ssd_mb_per_token(r.misses_per_token);
                    cost.tok_s = p.tok_s(r.misses_per_token, bw);
                }
            });
        },
        "sweep/results.json: row full/lru/0/0/8/4 (out_of_sample): hits is 7770 in results.json, 7750 by the reference replayer",
    );
}

#[test]
fn a_row_deleted() {
    check(
        |fx| {
            rewrite_sweep(fx, |out| {
                let i = row_index(out, "l2_sum@16/near_pick/0.05/3/8/4", sweep::Sample::InSample);
                out.rows.remove(i);
            });
        },
        "sweep/results.json: row l2_sum@16/near_pick/0.05/3/8/4 (in_sample) is missing: the grid in its provenance gives 134 rows, results.json has 133",
    );
}

/// results.csv from an earlier run of the grid with warmup 32 (results.json is today's).
#[test]
fn a_stale_csv() {
    check(
        |fx| {
            let mut grid = Grid::read(&fx.root().join("grid.json")).unwrap();
            grid.warmup = 32;
            let old = fx.root().join("old");
            run_sweep(fx.root(), &grid, &old);
            std::fs::copy(old.join("results.csv"), fx.path("sweep/results.csv")).unwrap();
        },
        "sweep/results.csv row frequency@16/belady/0/0/4/4 (in_sample), column tokens: 4064 in the file, 4032 from results.json",
    );
}

#[test]
fn an_edited_summary() {
    check(
        |fx| {
            let path = fx.path("sweep/summary.md");
            let text = std::fs::read_to_string(&path).unwrap();
            let lines: Vec<String> = text
                .lines()
                .map(|l| {
                    if l.starts_with("| full | 8 |") {
                        let mut cells: Vec<String> = l.split('|').map(str::to_string).collect();
                        cells[6] = " +0.0000 ".into();
                        cells.join("|")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        },
        "sweep/summary.md line ",
    );
}

#[test]
fn a_keep_map_with_one_id_swapped() {
    check(
        |fx| {
            edit_json(&fx.path("frequency@16.json"), |v| {
                let layer0 = v["layers"][0].as_array_mut().unwrap();
                let kept: Vec<u64> = layer0.iter().map(|x| x.as_u64().unwrap()).collect();
                let unused = (0..32).find(|e| !kept.contains(e)).unwrap();
                layer0[0] = json!(unused);
                layer0.sort_by_key(Value::as_u64);
            });
        },
        "frequency@16.json: layer 0: map keeps [1] not in the rebuilt map, lacks [0]",
    );
}

/// stats.json holds the held-out trace's figures under the calibration trace's name and hash, and
/// the keep maps and retention table were rebuilt from it: only recomputing the statistics sees it.
#[test]
fn statistics_of_another_trace() {
    check(
        |fx| {
            let (calib, held) = (fx.root().join("calib.safetensors"), fx.root().join("heldout.safetensors"));
            let lie = trace_stats(&calib, "calib.safetensors", Some(&held));
            let held_stats = saliency::Stats::read_json(fx.path("heldout-stats.json")).unwrap();
            write_saliency(&fx.out(), &lie, &held_stats);
        },
        "stats.json: layer 0 tokens is 1024 in the file, 4096 recomputed from ../calib.safetensors",
    );
}

/// The calibration trace beside the directory replaced by another of the same shape (the same
/// generator settings, another seed).
#[test]
fn a_trace_replaced_by_another_of_the_same_shape() {
    check(
        |fx| {
            let cfg = trace_io::synth::SynthConfig { seed: 3, ..crate::gen_data::calib_config() };
            trace_io::synth::write(fx.root().join("calib.safetensors"), &cfg, 0, &|_| {}).unwrap();
        },
        &format!("stats.json: meta.source_digest is {}, but ../calib.safetensors has sha256 ", committed_sha("calib")),
    );
}

#[test]
fn a_provenance_hash_edited() {
    check(
        |fx| {
            edit_json(&fx.path("sweep/results.json"), |v| {
                v["provenance"]["out_of_sample"]["digest"] = json!("0".repeat(64));
            });
        },
        &format!(
            "sweep/results.json: provenance.out_of_sample.digest is sha256:{}, but ../heldout.safetensors has ",
            "0".repeat(64)
        ),
    );
}

/// A plan whose held-out prediction was improved by hand.
#[test]
fn a_plan_with_an_edited_prediction() {
    check(
        |fx| {
            edit_json(&fx.path("plan.json"), |v| {
                let x = v["chosen"]["plan"]["out_of_sample_misses_per_token"].as_f64().unwrap();
                v["chosen"]["plan"]["out_of_sample_misses_per_token"] = json!(x - 0.25);
            });
        },
        "plan.json: chosen.plan.out_of_sample_misses_per_token is ",
    );
}

/// A plan whose keep map is not the one its variant gives (one id swapped out in layer 2).
#[test]
fn a_plan_with_another_keep_map() {
    check(
        |fx| {
            edit_json(&fx.path("plan.json"), |v| {
                v["chosen"]["keep_map"]["layers"][2].as_array_mut().unwrap().pop();
            });
        },
        "plan.json: chosen.keep_map is not the full map rebuilt from the statistics of calib.safetensors",
    );
}

/// A keep map's recorded hash edited in provenance (as when the map a `file:` variant names was
/// changed after the sweep, or the saliency code builds another map from the same statistics).
#[test]
fn a_recorded_keep_map_hash_edited() {
    check(
        |fx| {
            edit_json(&fx.path("sweep/results.json"), |v| {
                v["provenance"]["keep_maps"][1]["sha256"] = json!("f".repeat(64));
            });
        },
        &format!(
            "sweep/results.json: provenance.keep_maps[1] (l2_sum@16) has sha256 {}, the map rebuilt from the recomputed statistics has ",
            "f".repeat(64)
        ),
    );
}

/// The per-layer caps file the grid names, edited after the sweep.
#[test]
fn a_caps_file_changed_after_the_sweep() {
    check(
        |fx| std::fs::write(fx.root().join("caps.json"), "[4, 6, 6, 8]\n").unwrap(),
        &format!(
            "sweep/results.json: provenance.files[0].digest (caps.json) is sha256:{}, but ../caps.json has ",
            trace_io::sha256_hex(b"[4, 6, 5, 8]\n")
        ),
    );
}
