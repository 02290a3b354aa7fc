"""The moe_offload package: figures equal to the CLI's JSON, hand-computed counts, zero-copy views,
errors that name the file. See conftest.py for the fixtures."""

from __future__ import annotations

import ast
import gc
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import moe_offload as mo
from conftest import write_trace

# ------------------------------------------------------------------ hand-computed


@pytest.fixture
def tiny(tmp_path):
    """One layer, E = 4, k = m = 1: the expert stream 0, 1, 0, 2, 1."""
    ids = np.array([[[0], [1], [0], [2], [1]]], dtype=np.uint16)
    return write_trace(tmp_path / "tiny.safetensors", ids, num_experts=4, top_k=1)


@pytest.mark.parametrize(
    "policy, hits, misses, layer_misses",
    [
        # lru, cap 2: 0 m, 1 m, 0 h, 2 m (evicts 1, used before 0), 1 m (evicts 0)
        ("lru", 1, 4, [4]),
        # fifo: 0 m, 1 m, 0 h, 2 m (evicts 0, loaded first), 1 h
        ("fifo", 2, 3, [3]),
        # belady: 0 m, 1 m, 0 h, 2 m (evicts 0: never used again), 1 h
        ("belady", 2, 3, [3]),
    ],
)
def test_hand_computed_counts(tiny, policy, hits, misses, layer_misses):
    r = mo.replay(mo.open_trace(tiny), policy=policy, cap=2, warmup=0)
    assert (r.tokens, r.picks, r.hits, r.misses, r.forced_misses) == (5, 5, hits, misses, 0)
    assert r.layer_misses == layer_misses
    assert r.hit_rate == hits / 5
    assert r.misses_per_token == misses / 5
    assert r["kind"] == "moe-offload-replay"


def test_warmup_tokens_are_not_counted(tiny):
    # lru cap 2 from token 2: 0 h, 2 m, 1 m
    r = mo.replay(mo.open_trace(tiny), policy="lru", cap=2, warmup=2)
    assert (r.tokens, r.hits, r.misses) == (3, 1, 2)


def test_shape_and_metadata(tiny):
    t = mo.open_trace(tiny)
    assert (t.num_layers, t.tokens, t.candidates, t.top_k, t.num_experts) == (1, 5, 1, 1, 4)
    assert t.layer_ids == [0]
    assert t.metadata["model"] == "hand"
    assert t.metadata["format"] == "moe-offload-trace"
    assert t.tensors == ["ids"]
    assert t.path == str(tiny)


def test_stats_of_a_hand_trace(tmp_path):
    # Two layers, E = 3, k = 1, m = 2; gates given: count and gate_sum per expert.
    ids = np.array([[[0, 1], [0, 2], [1, 0]], [[2, 1], [2, 0], [2, 1]]], dtype=np.uint16)
    scores = np.array([[[2, 1], [3, 0], [1, 0]], [[5, 1], [4, 0], [2, 1]]], dtype=np.float32)
    gates = np.array([[[0.5], [0.25], [1.0]], [[1.0], [0.5], [0.5]]], dtype=np.float32)
    p = write_trace(tmp_path / "s.safetensors", ids, num_experts=3, top_k=1, scores=scores, gates=gates)
    s = mo.stats(mo.open_trace(p))
    assert s.count == [[2, 1, 0], [0, 0, 3]]
    d = s.to_dict()
    assert d["kind"] == "moe-offload-stats"
    assert d["layers"][0]["gate_sum"] == [0.75, 1.0, 0.0]
    assert d["layers"][1]["gate_sum"] == [0.0, 0.0, 2.0]
    k = mo.keep(s, "frequency", k=1)
    assert k.layers == [[0], [2]]
    assert k.label == "frequency@1"


# ------------------------------------------------------------------ zero-copy views


def test_ids_is_a_read_only_view_of_the_mapping(tiny):
    t = mo.open_trace(tiny)
    a, b = t.ids(0), t.ids(0)
    assert a.dtype == np.uint16 and a.shape == (5, 1)
    assert a[:, 0].tolist() == [0, 1, 0, 2, 1]
    # Two calls, one buffer: the same address in the mapped file, no copy.
    assert a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    assert np.shares_memory(a, b)
    assert not a.flags.writeable and not a.flags.owndata
    with pytest.raises(ValueError):
        a[0, 0] = 3
    with pytest.raises(ValueError):
        a.setflags(write=True)
    # The array's base owns the mapping: it outlives the Trace.
    assert type(a.base).__name__ == "_Mapped"
    del t, b
    gc.collect()
    assert a[:, 0].tolist() == [0, 1, 0, 2, 1]


def test_scores_and_gates_views(synth):
    t = mo.open_trace(synth / "calib.safetensors")
    s, g, n = t.scores(1), t.gates(1), t.out_norms(1)
    assert s.dtype == np.float32 and s.shape == (t.tokens, t.candidates)
    assert g.shape == n.shape == (t.tokens, t.top_k)
    assert np.all(np.diff(s, axis=1) <= 0)  # non-increasing along a row (validated)
    assert np.all(g >= 0)
    assert not s.flags.writeable


def _anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    pytest.skip("no RssAnon in /proc/self/status")


def test_reading_a_layer_of_a_large_trace_allocates_no_copy(cli, tmp_path):
    # MOE_OFFLOAD_LARGE_TRACE names a large trace to measure instead (the 2.6 GB one);
    # by default a 205 MB synthetic trace (8 layers x 200,000 tokens x 16 candidates).
    path = os.environ.get("MOE_OFFLOAD_LARGE_TRACE")
    if not path:
        path = tmp_path / "large.safetensors"
        cli("synth", "--layers", 8, "--experts", 64, "--top-k", 4, "--candidates", 16, "--tokens", 200000,
            "--norms", "-o", path)
    gc.collect()
    before = _anon_kb()
    t = mo.open_trace(path)
    ids = t.ids(t.num_layers // 2)
    total = int(ids.sum(dtype=np.uint64))  # touches every page of the layer
    grown = _anon_kb() - before
    layer_mb = ids.nbytes / 1e6
    print(f"{path}: {t.byte_len / 1e9:.2f} GB, one layer's ids {layer_mb:.1f} MB, anonymous memory +{grown} kB")
    assert total > 0
    assert grown < 10_000, f"anonymous memory grew by {grown} kB reading a {layer_mb:.1f} MB layer"


# ------------------------------------------------------------------ equal to the CLI's JSON


def _replay_cli(cli, trace, **kw) -> dict:
    flags = []
    for k, v in kw.items():
        if k in ("keep", "pin", "calib"):
            v = v if isinstance(v, (str, Path)) else None
        name = {"lam": "lambda"}.get(k, k).replace("_", "-")
        if v is True:
            flags.append(f"--{name}")
        elif v is not False and v is not None:
            flags += [f"--{name}", ",".join(map(str, v)) if isinstance(v, list) else str(v)]
    return json.loads(cli("replay", trace, *flags, "--json"))


@pytest.fixture(scope="session")
def maps(cli, synth):
    """A pruned keep map and a pin map of the calibration statistics, as files."""
    cli("stats", synth / "calib.safetensors", "-o", synth / "stats.json")
    cli("keep", synth / "stats.json", "--metric", "frequency", "--k", 24, "-o", synth / "keep24.json")
    cli("keep", synth / "stats.json", "--metric", "gate_sum", "--k", 4, "-o", synth / "pin4.json")
    return synth


REPLAYS = [
    dict(policy="lru", cap=8),
    dict(policy="fifo", cap=12),
    dict(policy="lfu", cap=8, k_used=2),
    dict(policy="belady", cap=8, warmup=0),
    dict(policy="near_pick", cap=8, lam=0.05, j=2),
    dict(policy="near_pick_ema", cap=10, decay=0.95, near_pick_n=6),
    dict(policy="inv_router", cap=8, lam=0.12, j=3),
    dict(policy="lru", cap=8, semantics="sequential", reset_at_sequence=True),
    dict(policy="lru", layer_caps=[6, 8, 10, 12]),
    dict(policy="lru", cap=8, keep="keep24.json"),
    dict(policy="lru", cap=6, pin="pin4.json"),
    dict(policy="lru", cap=0, pin="pin4.json"),
    dict(policy="lru", cap=6, tier2="lfu:12", link_gbps=32.0),
    dict(policy="lru", cap=8, batch=4, compute_ms_per_step=30.0),
    dict(policy="lru", cap=8, prefetch="prev_token:2"),
    dict(policy="lru", cap=8, prefetch="coact:2", calib="heldout.safetensors", timeline=True),
    dict(policy="lru", cap=8, timeline=True, bandwidth=7.0, profile="dsv2-lite-bf16"),
    dict(policy="lru", cap=8, shuffle=7),
    dict(policy="lru", cap=8, profile="qwen15-moe-bf16"),
    dict(policy="lru", cap=0, pin="pin4.json", exec="host", host_gbps=40.0),
    # Hybrid execution prices each step's dense compute: compute_ms_per_step applies (api::replay).
    dict(policy="lru", cap=0, pin="pin4.json", exec="host", host_gbps=40.0, compute_ms_per_step=12.5),
    dict(policy="lru", cap=6, exec="host", overlap="concurrent", host_gbps=40.0, link_gbps=25.0, host_ms_per_row=0.05,
         host_sync_ms=0.02),
    dict(policy="lfu", cap=0, batch=4, exec="host:2", host_gbps=40.0, link_gbps=25.0, profile="qwen15-moe-bf16"),
    # One cache for every layer (SEMANTICS.md §15.1), per token, with pins, re-batched.
    dict(policy="lru", shared_cap=40),
    dict(policy="belady", shared_cap=32, warmup=0),
    dict(policy="lfru", shared_cap=24, pin="pin4.json"),
    dict(policy="fifo", shared_cap=32, batch=4),
]


@pytest.mark.parametrize("kw", REPLAYS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_replay_equals_the_cli(cli, maps, kw):
    trace = maps / "calib.safetensors"
    files = {k: maps / v for k, v in kw.items() if k in ("keep", "pin", "calib")}
    expected = _replay_cli(cli, trace, **{**kw, **files})
    args = dict(kw)
    for k, p in files.items():
        args[k] = mo.open_trace(p) if k == "calib" else str(p)
    got = mo.replay(mo.open_trace(trace), **args)
    assert dict(got) == expected
    assert list(got) == list(expected)  # the same fields in the same order


@pytest.mark.parametrize("name", ["calib.safetensors", "heldout.safetensors"])
def test_inspect_equals_the_cli(cli, synth, name):
    path = str(synth / name)
    assert dict(mo.inspect(mo.open_trace(path))) == json.loads(cli("inspect", path, "--json"))


def test_keep_maps_as_objects_equal_keep_maps_as_files(maps):
    t = mo.open_trace(maps / "calib.safetensors")
    k = mo.read_keep(maps / "keep24.json")
    assert mo.replay(t, policy="lru", cap=8, keep=k) == mo.replay(t, policy="lru", cap=8, keep=str(maps / "keep24.json"))


def test_stats_and_keep_equal_the_cli(cli, maps, tmp_path):
    trace = str(maps / "calib.safetensors")
    s = mo.stats(mo.open_trace(trace))
    assert s.to_dict() == json.loads((maps / "stats.json").read_text())
    assert mo.read_stats(maps / "stats.json").to_dict() == s.to_dict()
    k = mo.keep(s, "frequency", k=24)
    assert k.to_dict() == json.loads((maps / "keep24.json").read_text())
    cli("keep", maps / "stats.json", "--metric", "hybrid", "--budget", 80, "--floor", 8, "-o", tmp_path / "b.json")
    b = mo.keep(s, "hybrid", budget=80, floor=8)
    assert b.to_dict() == json.loads((tmp_path / "b.json").read_text())
    assert b.label == "hybrid@budget80" and b.total_kept == 80
    k.write(tmp_path / "k.json")
    assert (tmp_path / "k.json").read_text() == (maps / "keep24.json").read_text()


@pytest.mark.parametrize("heldout_kind", ["trace", "stats"])
def test_retention_equals_the_cli(cli, maps, tmp_path, heldout_kind):
    h = maps / "heldout.safetensors"
    if heldout_kind == "stats":
        cli("stats", h, "-o", tmp_path / "h.json")
        h = tmp_path / "h.json"
    doc = json.loads(cli("retention", maps / "keep24.json", "--heldout", h, "--json"))
    expected = {k: v for k, v in doc["maps"][0].items() if k != "file"}
    heldout = mo.open_trace(str(h)) if heldout_kind == "trace" else mo.read_stats(h)
    got = mo.retention(mo.read_keep(maps / "keep24.json"), heldout)
    if heldout_kind == "stats":
        got["heldout"] = str(h)  # the CLI names the file it read; Stats know their trace
    assert got == expected


@pytest.mark.parametrize("kw", [dict(), dict(policy="fifo", caps=(4, 12)), dict(policy="lru", caps=(6, 20), k_used=2),
                                dict(policy="belady", caps=(4, 10)), dict(policy="lru", caps=(4, 12), pin="pin4.json")])
def test_mrc_equals_the_cli(cli, maps, tmp_path, kw):
    flags = ["--policy", kw.get("policy", "lru")]
    if "caps" in kw:
        flags += ["--caps", "{}..{}".format(*kw["caps"])]
    if "k_used" in kw:
        flags += ["--k-used", kw["k_used"]]
    if "pin" in kw:
        kw = {**kw, "pin": str(maps / kw["pin"])}
        flags += ["--pin", kw["pin"]]
    expected = json.loads(cli("mrc", maps / "calib.safetensors", *flags, "-o", tmp_path / "m.json", "--json"))
    got = mo.mrc(mo.open_trace(maps / "calib.safetensors"), **kw)
    assert dict(got) == expected
    # One point of the curve equals a replay at that cap (with the same pins).
    cap = got.min_cap + 2
    r = mo.replay(mo.open_trace(maps / "calib.safetensors"), policy=kw.get("policy", "lru"), cap=cap,
                  k_used=kw.get("k_used"), pin=kw.get("pin"))
    assert got.misses_per_token_at(cap) == pytest.approx(r.misses_per_token, rel=1e-12)


@pytest.mark.parametrize("kw", [dict(budget_gb=0.5, variants=["full", "frequency@24"]),
                                dict(budget_gb=0.4, variants=["full"], pin_counts=[0, 2, 4], expert_mb=10.0)])
def test_plan_equals_the_cli(cli, maps, tmp_path, kw):
    ins, oos = str(maps / "calib.safetensors"), str(maps / "heldout.safetensors")
    flags = ["--budget-gb", kw["budget_gb"], "--variants", ",".join(kw["variants"])]
    if "pin_counts" in kw:
        flags += ["--pin-counts", ",".join(map(str, kw["pin_counts"]))]
    if "expert_mb" in kw:
        flags += ["--expert-mb", kw["expert_mb"]]
    doc = json.loads(cli("plan", "--in-sample", ins, "--out-of-sample", oos, *flags, "-o", tmp_path / "p.json", "--json"))
    del doc["tool_version"]
    got = mo.plan(mo.open_trace(ins), mo.open_trace(oos), **kw)
    assert dict(got) == doc
    # The plan's caps replayed give its figures, given as a list or as the plan file.
    keep = None if got.chosen["variant"] == "full" else str(tmp_path / "p.json")
    r = mo.replay(mo.open_trace(oos), policy="lru", layer_caps=got.chosen["plan"]["caps"], keep=keep)
    assert r.misses_per_token == got.chosen["replayed"]["out_of_sample_misses_per_token"]
    if "pin_counts" not in kw:
        r = mo.replay(mo.open_trace(oos), policy="lru", layer_caps=str(tmp_path / "p.json"), keep=keep)
        assert r.misses_per_token == got.chosen["replayed"]["out_of_sample_misses_per_token"]
        with pytest.raises(mo.UsageError, match="is a plan made with policy lru .here fifo.*policy=\"lru\""):
            mo.replay(mo.open_trace(oos), policy="fifo", layer_caps=str(tmp_path / "p.json"), keep=keep)


def test_a_plan_given_as_pins_pins_its_pinned_plan_as_the_cli_does(cli, maps, tmp_path):
    """One reader of pin maps (api::inputs::read_pins): a plan made with pin counts pins its
    pinned.plan.pins (not its chosen keep map) on both front ends; one made without is refused."""
    ins, oos = str(maps / "calib.safetensors"), str(maps / "heldout.safetensors")
    plan = tmp_path / "pinned.json"
    cli("plan", "--in-sample", ins, "--out-of-sample", oos, "--budget-gb", 0.4, "--variants", "full",
        "--pin-counts", "2,4", "--expert-mb", 10.0, "-o", plan)
    pins = json.loads(plan.read_text())["pinned"]["plan"]["pins"]
    expected = _replay_cli(cli, oos, policy="lru", cap=6, pin=plan)
    got = mo.replay(mo.open_trace(oos), policy="lru", cap=6, pin=str(plan))
    assert dict(got) == expected
    assert got["layer_pins"] == [len(p) for p in pins]
    bare = tmp_path / "bare.json"
    cli("plan", "--in-sample", ins, "--out-of-sample", oos, "--budget-gb", 0.4, "--variants", "full", "-o", bare)
    with pytest.raises(mo.UsageError, match="without pin_counts pins nothing"):
        mo.replay(mo.open_trace(oos), policy="lru", cap=6, pin=str(bare))


# ------------------------------------------------------------------ sweeps as tables


@pytest.fixture(scope="session")
def sweep_dir(cli, maps):
    """A sweep of plain, deployed (pins, tier 2) and prefetching configurations, run by the CLI."""
    grid = {
        "name": "package test",
        "traces": {"in_sample": "calib.safetensors", "out_of_sample": "heldout.safetensors"},
        "variants": ["full", "frequency@24"],
        "warmup": 64,
        "blocks": [{"policies": ["lru", "belady", "near_pick"], "cap": [6, 12]},
                   {"variants": ["full"], "policies": ["lru"], "cap": [6], "pin": ["pin4.json"], "tier2": ["lru:12"]},
                   {"variants": ["full"], "policies": ["lru"], "cap": [8], "prefetch": ["prev_token:2"]}],
        "profiles": ["reference", {"name": "laptop", "expert_mb": 17.3, "compute_ms": 20.0,
                                   "bandwidth_gbps": [3.9, 7.0]}],
    }
    (maps / "grid.json").write_text(json.dumps(grid))
    cli("sweep", maps / "grid.json", "-o", maps / "sweep-out")
    return maps / "sweep-out"


def test_read_results_to_pandas_equals_results_csv(sweep_dir):
    pd = pytest.importorskip("pandas")
    r = mo.read_results(sweep_dir)
    doc = json.loads((sweep_dir / "results.json").read_text())
    assert len(r) == len(doc["rows"]) > 0
    df = r.to_pandas()
    assert len(df) == len(doc["rows"])
    csv = pd.read_csv(sweep_dir / "results.csv", keep_default_na=False)
    assert list(df.columns[: len(csv.columns)]) == list(csv.columns)
    for col in csv.columns:
        a, b = df[col].tolist(), csv[col].tolist()
        if csv[col].dtype.kind in "iuf":
            assert [float(x) for x in a] == pytest.approx(b, rel=1e-15), col
        else:
            assert [str(x) for x in a] == [str(x) for x in b], col
    assert set(df["sample"]) == {"in_sample", "out_of_sample"}
    # Deployed and prefetching rows carry their figures as columns (None on the other rows).
    assert df["deploy.t2_hits"].notna().sum() == 2
    assert df["prefetch.prefetch_loads"].notna().sum() == 2


def test_sweep_rows_equal_the_cli(sweep_dir, tmp_path):
    grid = sweep_dir.parent / "grid.json"
    r = mo.sweep(grid, tmp_path / "out")
    cli_doc = json.loads((sweep_dir / "results.json").read_text())
    assert r.rows == cli_doc["rows"]
    assert r.provenance["stats_sha256"] == cli_doc["provenance"]["stats_sha256"]
    assert r.provenance["keep_maps"] == cli_doc["provenance"]["keep_maps"]
    assert (tmp_path / "out" / "results.csv").read_text() == (sweep_dir / "results.csv").read_text()
    assert mo.read_results(tmp_path / "out").rows == r.rows


def test_results_export_arrow_without_copies_through_the_c_stream(sweep_dir):
    pa = pytest.importorskip("pyarrow")
    r = mo.read_results(sweep_dir / "results.json")
    t = pa.table(r)  # through __arrow_c_stream__
    assert t.num_rows == len(r)
    assert t.column("misses_per_token").to_pylist() == [row["misses_per_token"] for row in r.rows]


# ------------------------------------------------------------------ errors


def test_a_missing_trace_raises_trace_error_naming_the_file(tmp_path):
    p = tmp_path / "nope.safetensors"
    with pytest.raises(mo.TraceError, match="nope.safetensors") as e:
        mo.open_trace(p)
    assert isinstance(e.value, mo.MoeOffloadError)


def test_a_truncated_trace_raises_naming_file_and_tensor(tiny, tmp_path):
    bad = tmp_path / "cut.safetensors"
    bad.write_bytes(tiny.read_bytes()[:-4])
    with pytest.raises(mo.TraceError, match=r"cut\.safetensors.*ids"):
        mo.open_trace(bad)


def test_a_bad_id_is_named_with_file_layer_and_token(tmp_path):
    ids = np.array([[[0], [1], [9]]], dtype=np.uint16)  # 9 >= E = 4
    p = write_trace(tmp_path / "badid.safetensors", ids, num_experts=4, top_k=1)
    t = mo.open_trace(p)  # shapes are fine; the content is checked when read
    with pytest.raises(mo.TraceError, match=r"badid\.safetensors.*token 2"):
        t.ids(0)
    with pytest.raises(mo.TraceError, match="badid.safetensors"):
        mo.replay(t, policy="lru", cap=2)


def test_replay_and_keep_errors_are_typed(tiny, maps):
    t = mo.open_trace(tiny)
    c = mo.open_trace(maps / "calib.safetensors")
    with pytest.raises(mo.ReplayError, match="cache capacity 2 is below k_used = 4"):
        mo.replay(c, policy="lru", cap=2)
    with pytest.raises(mo.ReplayError, match="k_used=8 or less"):
        mo.replay(c, policy="lru", cap=10, k_used=9)
    with pytest.raises(mo.ReplayError, match="warmup = 64 tokens covers the whole trace"):
        mo.replay(t, policy="lru", cap=2)
    # A curve's caps end at E, as the command line's `mrc --caps` does.
    e = c.num_experts
    with pytest.raises(mo.UsageError, match=f"caps 4..{e + 1}: cap {e + 1} is more than the E = {e} experts"):
        mo.mrc(c, caps=(4, e + 1))
    assert mo.mrc(c, caps=(4, e)).max_cap == e
    with pytest.raises(mo.UsageError, match="policy"):
        mo.replay(t, policy="nope", cap=2)
    with pytest.raises(mo.UsageError, match="cap"):
        mo.replay(t, policy="lru")
    with pytest.raises(mo.UsageError, match="layer index 3"):
        t.ids(3)
    with pytest.raises(mo.TraceError, match="scores"):
        t.scores(0)
    s = mo.read_stats(maps / "stats.json")
    with pytest.raises(mo.SaliencyError, match="k=32 or less"):
        mo.keep(s, "frequency", k=40)
    with pytest.raises(mo.SaliencyError, match="keep24.json"):
        mo.read_stats(maps / "keep24.json")


def test_a_file_that_is_not_results_raises_sweep_error(maps):
    with pytest.raises(mo.SweepError, match="stats.json"):
        mo.read_results(maps / "stats.json")


# ------------------------------------------------------------------ stubs


def test_the_stubs_name_what_the_module_defines():
    stub = ast.parse((Path(mo.__file__).parent / "_core.pyi").read_text())
    names = {n.name for n in stub.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {t.id for n in stub.body if isinstance(n, ast.AnnAssign) for t in [n.target] if isinstance(t, ast.Name)}
    public = {n for n in dir(mo._core) if not n.startswith("__") or n == "__version__"}
    assert names - {"_Path", "_MapArg"} == public


# ------------------------------------------------------------------ real data


@pytest.mark.parametrize("policy", ["lru", "lfu", "near_pick"])
def test_real_esft_replay_equals_the_cli(cli, esft, policy):
    trace = esft / "translation.safetensors"
    t = mo.open_trace(trace)
    assert (t.num_layers, t.tokens, t.top_k, t.num_experts) == (26, 8251, 6, 64)
    for cap in (8, 16, 32):
        expected = json.loads(cli("replay", trace, "--policy", policy, "--cap", cap, "--json"))
        assert dict(mo.replay(t, policy=policy, cap=cap)) == expected
    if policy == "lru":
        assert dict(mo.inspect(t)) == json.loads(cli("inspect", trace, "--json"))


def test_real_esft_stats_keep_retention_equal_the_cli(cli, esft, tmp_path):
    trace = str(esft / "translation.safetensors")
    cli("stats", trace, "-o", tmp_path / "s.json")
    cli("keep", tmp_path / "s.json", "--metric", "frequency", "--k", 48, "-o", tmp_path / "k.json")
    s = mo.stats(mo.open_trace(trace))
    assert s.to_dict() == json.loads((tmp_path / "s.json").read_text())
    k = mo.keep(s, "frequency", k=48)
    assert k.to_dict() == json.loads((tmp_path / "k.json").read_text())
    law = str(esft / "law.safetensors")
    doc = json.loads(cli("retention", tmp_path / "k.json", "--heldout", law, "--json"))
    assert mo.retention(k, mo.open_trace(law)) == {k: v for k, v in doc["maps"][0].items() if k != "file"}


def test_import_esft_writes_the_cli_s_trace(cli, real_data, esft, tmp_path):
    t = mo.import_esft(real_data / "esft-dsv2lite", tmp_path / "t.safetensors", domains=["translation"])
    assert (t.num_layers, t.tokens) == (26, 8251)
    assert (tmp_path / "t.safetensors").read_bytes() == (esft / "translation.safetensors").read_bytes()


# ------------------------------------------------------------------ threads and Ctrl-C


def test_ctrl_c_interrupts_a_long_call_at_once(cli, tmp_path):
    import signal
    import threading
    import time

    path = tmp_path / "long.safetensors"
    # 8 layers x 1,000,000 tokens: nine fifo replays are seconds of work even on an idle machine
    # (100,000 tokens finished in under 0.3 s there, before the signal).
    cli("synth", "--layers", 8, "--experts", 64, "--top-k", 4, "--candidates", 8, "--tokens", 1000000, "-o", path)
    t = mo.open_trace(path)
    t.ids(0)  # validation done before the timed call
    sent = []

    def interrupt():
        sent.append(time.perf_counter())
        signal.raise_signal(signal.SIGINT)

    timer = threading.Timer(0.2, interrupt)
    start = time.perf_counter()
    timer.start()
    interrupted = False
    try:
        mo.mrc(t, policy="fifo", caps=(4, 12))
    except KeyboardInterrupt:
        interrupted = True
    caught = time.perf_counter()
    # A call that ended first must not leave a SIGINT to hit the test runner.
    timer.cancel()
    timer.join()
    assert interrupted and sent, "the call ended before the signal"
    assert caught - sent[0] < 0.5, f"KeyboardInterrupt came {caught - sent[0]:.2f} s after SIGINT"
    assert caught - start < 1.5


def test_other_python_threads_run_during_a_call(cli, tmp_path):
    import threading

    path = tmp_path / "t.safetensors"
    # A call of a few hundred ms even on an idle machine (100,000 tokens took 30 ms there, best of 5).
    cli("synth", "--layers", 4, "--experts", 64, "--top-k", 4, "--candidates", 8, "--tokens", 1000000, "-o", path)
    t = mo.open_trace(path)
    t.ids(0)
    ticks = 0
    done = threading.Event()

    def work():
        mo.mrc(t, policy="fifo", caps=(4, 6))
        done.set()

    th = threading.Thread(target=work)
    th.start()
    while not done.is_set():  # runs only while the call has released the GIL
        ticks += 1
        done.wait(0.001)
    th.join()
    assert ticks > 10
