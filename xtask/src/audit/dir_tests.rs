//! Tests of `audit --dir` on the fixture's outputs (the corruption set is in `corruption_tests`).

use super::*;
use crate::audit::fixture::{Fixture, edit_json, fixture};

fn audit(fx: &Fixture) -> Report {
    audit_dir(&fx.out(), &Options::default()).unwrap()
}

/// The check named `name`, asserted failed.
fn failed<'r>(r: &'r Report, name: &str) -> &'r Check {
    let c = r.checks.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no check {name}"));
    assert_eq!(c.status, Status::Fail, "{name}");
    c
}

#[test]
fn clean_outputs_pass() {
    let fx = fixture();
    let r = audit(&fx);
    assert!(passed(&r), "{:?}", first_failure(&r));
    assert_eq!(r.checks[0].figures["keep_maps"], json!(2));
    assert_eq!(r.checks[0].figures["sweeps"], json!(1));
    assert_eq!(r.checks[0].figures["retention_files"], json!(1));
    assert_eq!(r.checks.iter().filter(|c| c.section == "3 retention" && c.status == Status::Pass).count(), 2);
    assert!(r.checks.iter().any(|c| c.name == "nesting: frequency" && c.status == Status::Pass));
}

/// The failing `0 inputs` check of `name`, with its first offending item.
fn unreadable<'r>(r: &'r Report, name: &str) -> &'r str {
    let c = r.checks.iter().find(|c| c.name == format!("{name}: readable")).expect("a check for the file");
    assert_eq!((c.section, c.status), ("0 inputs", Status::Fail));
    c.first_offending.as_deref().unwrap()
}

#[test]
fn a_truncated_results_json_fails_naming_the_file() {
    let fx = fixture();
    let path = fx.path("sweep/results.json");
    let text = std::fs::read(&path).unwrap();
    std::fs::write(&path, &text[..300]).unwrap();
    let r = audit(&fx);
    assert!(!passed(&r));
    let e = unreadable(&r, "sweep/results.json");
    assert!(e.starts_with("sweep/results.json: not valid JSON") && e.contains("EOF while parsing"), "{e}");
    // The other outputs are still audited; the sweep is not counted.
    assert_eq!(r.checks[0].figures["sweeps"], json!(0));
    assert_eq!(r.checks[0].figures["keep_maps"], json!(2));
    assert!(r.checks.iter().any(|c| c.name == "nesting: frequency" && c.status == Status::Pass));
}

#[test]
fn a_reap_aggregate_beside_the_outputs_is_skipped() {
    let fx = fixture();
    let before = audit(&fx);
    // Not strict JSON (NaN), and not one of our outputs: an input, skipped as before.
    std::fs::write(
        fx.path("core_agg.json"),
        r#"{"a": {"n": 1, "tok": 2, "freq": {"0": [1, 3]}, "reap": {"0": [NaN, 2.0]}}}"#,
    )
    .unwrap();
    let after = audit(&fx);
    assert!(passed(&after));
    assert_eq!(after.checks.len(), before.checks.len());
    // The same bytes cut short are neither: a failed check.
    std::fs::write(fx.path("core_agg.json"), r#"{"a": {"n": 1, "tok": 2, "freq": {"0": [1, 3]}, "re"#).unwrap();
    assert!(unreadable(&audit(&fx), "core_agg.json").contains("not valid JSON"));
}

#[test]
fn a_keep_map_with_a_duplicated_id_fails_naming_the_file() {
    let fx = fixture();
    edit_json(&fx.path("frequency@24.json"), |v| {
        let layer1 = v["layers"][1].as_array_mut().unwrap();
        layer1[1] = layer1[0].clone();
    });
    let r = audit(&fx);
    assert!(!passed(&r));
    let e = unreadable(&r, "frequency@24.json");
    assert!(e.starts_with("frequency@24.json looks like a keep map but does not parse: "), "{e}");
    assert!(e.contains("is listed twice"), "{e}");
    assert_eq!(r.checks[0].figures["keep_maps"], json!(1));
}

/// A sweep whose recorded grid no longer validates (two profiles of one name) is a failed
/// check naming the file, not an abort.
#[test]
fn a_sweep_with_invalid_recorded_profiles_fails_naming_the_file() {
    let fx = fixture();
    edit_json(&fx.path("sweep/results.json"), |v| {
        let p = v["provenance"]["grid"]["profiles"].as_array_mut().unwrap();
        p.push(p[0].clone());
    });
    let r = audit(&fx);
    let c = failed(&r, "sweep/results.json: device profiles");
    assert_eq!(c.section, "5 sweep rows");
    let e = c.first_offending.as_deref().unwrap();
    assert!(e.starts_with("sweep/results.json: the grid in its provenance: grid: profiles[2]: reference"), "{e}");
}

#[test]
fn a_changed_keep_map_id_is_named() {
    let fx = fixture();
    let path = fx.path("frequency@16.json");
    edit_json(&path, |v| {
        let layer0 = v["layers"][0].as_array_mut().unwrap();
        let kept: Vec<u64> = layer0.iter().map(|x| x.as_u64().unwrap()).collect();
        let unused = (0..32).find(|e| !kept.contains(e)).unwrap();
        layer0[0] = json!(unused);
        layer0.sort_by_key(|x| x.as_u64());
    });
    let r = audit(&fx);
    let c = first_failure(&r).expect("the audit fails");
    assert_eq!(c.name, "frequency@16: reproduces");
    assert!(c.first_offending.as_deref().unwrap().contains("layer"), "{:?}", c.first_offending);
}

#[test]
fn a_changed_sweep_count_or_tok_s_is_named() {
    let fx = fixture();
    let path = fx.path("sweep/results.json");
    let key = |v: &Value, i: usize| v["rows"][i]["key"].as_str().unwrap().to_string();
    let mut k0 = String::new();
    edit_json(&path, |v| {
        k0 = key(v, 0);
        let m = v["rows"][0]["counts"]["misses"].as_u64().unwrap();
        v["rows"][0]["counts"]["misses"] = json!(m + 1);
    });
    let r = audit(&fx);
    let c = failed(&r, "sweep/results.json: derived fields follow from the counts");
    // Named with the figure: one more miss changes misses_per_token first (hit_rate is hits / picks).
    assert!(
        c.first_offending.as_deref().unwrap().starts_with(&format!("{k0} (in_sample): misses_per_token is ")),
        "{:?}",
        c.first_offending
    );
    // The replay names the count itself.
    let c = failed(&r, "sweep/results.json: rows replayed by the reference replayer, every count equal");
    assert!(c.first_offending.as_deref().unwrap().contains(&format!("row {k0} (in_sample): misses is ")));

    let fx = fixture();
    let path = fx.path("sweep/results.json");
    let mut k5 = String::new();
    edit_json(&path, |v| {
        k5 = key(v, 5);
        let t = v["rows"][5]["cost"][1]["tok_s"].as_f64().unwrap();
        v["rows"][5]["cost"][1]["tok_s"] = json!(t * 1.001);
    });
    let r = audit(&fx);
    let c = failed(&r, "sweep/results.json: derived fields follow from the counts");
    assert!(c.first_offending.as_deref().unwrap().starts_with(&k5), "{:?}", c.first_offending);

    // A cost entry dropped (the zip of entries and profiles used to stop at the shorter).
    let fx = fixture();
    let mut k3 = String::new();
    edit_json(&fx.path("sweep/results.json"), |v| {
        k3 = key(v, 3);
        v["rows"][3]["cost"].as_array_mut().unwrap().pop();
    });
    let r = audit(&fx);
    let c = failed(&r, "sweep/results.json: derived fields follow from the counts");
    assert_eq!(
        c.first_offending.as_deref(),
        Some(format!("{k3} (out_of_sample): 2 cost entries, the profiles give 3").as_str())
    );
}

#[test]
fn a_changed_retention_value_is_named() {
    let fx = fixture();
    let path = fx.path("retention.json");
    edit_json(&path, |v| {
        let x = v["maps"][1]["per_layer"][2]["figures"]["slot_replacement"].as_f64().unwrap();
        v["maps"][1]["per_layer"][2]["figures"]["slot_replacement"] = json!(x + 0.001);
    });
    let r = audit(&fx);
    let c = first_failure(&r).expect("the audit fails");
    assert_eq!(c.name, "retention.json: frequency@24 on heldout-stats.json");
    let detail = c.first_offending.as_deref().unwrap();
    assert!(detail.contains("slot_replacement") && detail.contains("layer"), "{detail}");
}

#[test]
fn a_retention_table_without_its_kind_tag_is_audited_too() {
    // `retention --json` before the tag printed the bare array of rows.
    let fx = fixture();
    let path = fx.path("retention.json");
    edit_json(&path, |v| *v = v["maps"].take());
    let r = audit(&fx);
    assert_eq!(r.checks.iter().filter(|c| c.section == "3 retention" && c.status == Status::Pass).count(), 2);
}

#[test]
fn a_keep_map_without_its_statistics_fails() {
    let fx = fixture();
    std::fs::remove_file(fx.path("stats.json")).unwrap();
    let r = audit(&fx);
    let c = first_failure(&r).expect("the audit fails");
    assert!(c.first_offending.as_deref().unwrap().contains("cannot be reproduced"), "{:?}", c.first_offending);
}

/// Belady above an online policy: within the cap per layer after a warmup it is a finding (the
/// caches enter the window in different states); beyond it, or with W = 0, a failure. With
/// per-layer caps the slack is the layer's own cap.
#[test]
fn belady_above_online_is_a_finding_within_the_warmup_slack_and_a_failure_beyond() {
    let fx = fixture();
    let text = std::fs::read_to_string(fx.path("sweep/results.json")).unwrap();
    let out: SweepOutput = serde_json::from_str(&text).unwrap();
    let profiles = out.provenance.grid.device_profiles().unwrap();
    let status = |rows: &[sweep::Row], warmup| {
        let grid = sweep::Grid { warmup, ..out.provenance.grid.clone() };
        let checks = sweep_checks(&profiles, &grid, rows);
        let c = checks.into_iter().find(|c| c.name == "belady is a lower bound").unwrap();
        (
            c.status,
            c.figures["above_online_within_warmup_slack"].as_u64().unwrap(),
            c.first_offending.unwrap_or_default(),
        )
    };
    assert_eq!(status(&out.rows, 64).0, Status::Pass);
    // Raise layer 0 of full/belady at cap 8 (in sample) to `extra` above the online policy with
    // the fewest misses on that layer (λ = 0, same variant, cap and k_used).
    let b = out.rows.iter().position(|r| r.key == "full/belady/0/0/8/4").unwrap();
    let online = (0..out.rows.len())
        .filter(|&i| {
            let r = &out.rows[i];
            r.key.starts_with("full/") && r.key.ends_with("/0/0/8/4") && r.sample == out.rows[b].sample && i != b
        })
        .min_by_key(|&i| out.rows[i].counts.layer_misses[0])
        .unwrap();
    let raised = |rows: &[sweep::Row], extra: u64| {
        let mut rows = rows.to_vec();
        let target = rows[online].counts.layer_misses[0] + extra;
        let c = &mut rows[b].counts;
        c.misses = c.misses + target - c.layer_misses[0];
        c.layer_misses[0] = target;
        rows
    };
    let (st, above, first) = status(&raised(&out.rows, 1), 64);
    assert!(st == Status::Finding && above >= 1, "{st:?} {above} {first}");
    assert!(
        first.contains(" on layer 0: ") && first.contains("within the slack of warmup 64 (the layer's cap, 8)"),
        "{first}"
    );
    let (st, _, first) = status(&raised(&out.rows, 1), 0);
    assert_eq!(st, Status::Fail, "{first}");
    assert!(first.contains("W = 0: every token counts, no slack"), "{first}");
    let (st, _, first) = status(&raised(&out.rows, 9), 64);
    assert_eq!(st, Status::Fail, "{first}");
    assert!(first.contains("beyond the slack of warmup 64 (the layer's cap, 8)"), "{first}");
    // Per-layer caps (layer 0 at 2): 3 above is beyond that layer's slack though within 8.
    let mut rows = out.rows.clone();
    let caps = sweep::NamedCaps { name: "plan".into(), caps: vec![2, 8, 8, 8] };
    for i in [b, online] {
        rows[i].config.layer_caps = Some(caps.clone());
    }
    let (st, _, first) = status(&raised(&rows, 3), 64);
    assert_eq!(st, Status::Fail, "{first}");
    assert!(first.contains("beyond the slack of warmup 64 (the layer's cap, 2)"), "{first}");
    assert_eq!(status(&raised(&rows, 2), 64).0, Status::Finding);
}

/// Without the traces the audit says so and fails; `--no-replay` passes and says that nothing was
/// replayed or recomputed; `--trace-dir` finds the traces elsewhere.
#[test]
fn missing_traces_fail_unless_no_replay_or_trace_dir() {
    let fx = fixture();
    let moved = fx.root().join("elsewhere");
    std::fs::create_dir(&moved).unwrap();
    for t in ["calib.safetensors", "heldout.safetensors"] {
        std::fs::rename(fx.root().join(t), moved.join(t)).unwrap();
    }
    let r = audit(&fx);
    let first = first_failure(&r).unwrap().first_offending.clone().unwrap();
    let cwd = std::env::current_dir().unwrap().join("heldout.safetensors");
    assert_eq!(
        first,
        format!(
            "heldout-stats.json: meta.source trace heldout.safetensors not found (looked for heldout.safetensors, \
             ../heldout.safetensors, {}); give --trace-dir DIR, or --no-replay to audit without the traces",
            cwd.display()
        )
    );
    let c = failed(&r, "sweep/results.json: traces found and verified against their recorded hashes");
    let first = c.first_offending.as_deref().unwrap();
    assert!(
        first.starts_with("sweep/results.json: provenance.in_sample trace calib.safetensors not found (looked for ")
    );
    assert!(
        first.contains("../calib.safetensors")
            && first.ends_with("or --no-replay to check the rows without replaying them")
    );

    let r = audit_dir(&fx.out(), &Options { no_replay: true, ..Options::default() }).unwrap();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let c = r.checks.iter().find(|c| c.name == "sweep/results.json: rows replayed").unwrap();
    assert_eq!(c.status, Status::Finding);
    assert_eq!(
        c.first_offending.as_deref(),
        Some("sweep/results.json: not replayed (--no-replay): its rows are checked for self-consistency only")
    );
    let c = r.checks.iter().find(|c| c.name == "stats.json: recomputed from its trace").unwrap();
    assert_eq!(c.status, Status::Finding);
    assert!(c.first_offending.as_deref().unwrap().ends_with("not recomputed (--no-replay)"));

    let r = audit_dir(&fx.out(), &Options { trace_dir: Some(moved), ..Options::default() }).unwrap();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let c = r.checks.iter().find(|c| c.name.ends_with("traces found and verified against their recorded hashes"));
    assert_eq!(c.unwrap().figures["in_sample"], json!("../elsewhere/calib.safetensors"));
}

/// `--sample N --seed S` replays N rows chosen by the seed and says so; a lie in every row is
/// caught in the first of them, the same one for the same seed.
#[test]
fn a_sample_replays_n_rows_chosen_by_the_seed() {
    let fx = fixture();
    let opts = |seed| Options { sample: Some(10), seed, ..Options::default() };
    let r = audit_dir(&fx.out(), &opts(7)).unwrap();
    assert!(passed(&r), "{:?}", first_failure(&r));
    let name = "sweep/results.json: rows replayed by the reference replayer, every count equal";
    let f = &r.checks.iter().find(|c| c.name == name).unwrap().figures;
    assert_eq!((&f["replayed"], &f["of"], &f["seed"]), (&json!(10), &json!(134), &json!(7)));

    edit_json(&fx.path("sweep/results.json"), |v| {
        for row in v["rows"].as_array_mut().unwrap() {
            let p = row["counts"]["pruned_slots"].as_u64().unwrap();
            row["counts"]["pruned_slots"] = json!(p + 1);
        }
    });
    let first = |seed| failed(&audit_dir(&fx.out(), &opts(seed)).unwrap(), name).first_offending.clone().unwrap();
    let (a, b, c) = (first(7), first(7), first(8));
    assert!(a.contains("pruned_slots is ") && a == b, "{a} / {b}");
    assert_ne!(a, c, "seeds 7 and 8 chose the same first row");
}
