"""Tests of eval_pruned.py, keep_mask.py and capture_routing.py --keep on tiny random MoE models.

They pin invariants, not quality: keeping every expert is the base model exactly; masking a
router equals deleting the pruned experts; no pruned expert is routed under the mask; drop mode
equals zeroing the pruned experts' outputs; the figures equal a hand computation on unbatched
sequences (padding excluded); slots_surviving equals a count over the captured trace and
moe-offload's own slot_replacement; a pruned capture replays with no pruned slot. Models and
helpers come from test_capture.py (same configs, nothing downloaded).
"""

import copy
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import numpy as np
    import torch
    import transformers
else:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import capture_routing  # noqa: E402
import eval_pruned  # noqa: E402
import keep_mask  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from test_capture import CONFIGS, SEQS, build, moe_offload, router_outputs  # noqa: E402

ARCHS = ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v2", "gpt_oss", "qwen3_next"]
# Kept experts per MoE layer index: a different half in each layer.
HALVES = [[0, 2, 4, 6], [1, 2, 5, 7], [0, 3, 4, 7]]


def build_with(name, **overrides):
    """build(name) from a copy of its config with `overrides` (the shared CONFIGS stay untouched)."""
    cfg = copy.deepcopy(CONFIGS[name][1])
    for key, value in overrides.items():
        setattr(cfg, key, value)
    if "num_hidden_layers" in overrides and getattr(cfg, "layer_types", None):
        cfg.layer_types = [cfg.layer_types[0]] * cfg.num_hidden_layers  # one attention kind for the new depth
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for b in keep_mask.supported_blocks(model):
            getattr(b[2], b[3].router).weight.normal_(0.0, 1.0)
    return model.eval()


def keep_of(model, layers=None):
    """A keep map for `model`: `layers` (one list per MoE layer) or every expert."""
    km = keep_mask.full_keep_map(model)
    if layers is not None:
        km.update(metric="frequency", k=max(map(len, layers)), layers=[sorted(x) for x in layers[: len(km["layer_ids"])]])
    return km


def half_of(model):
    return keep_of(model, HALVES[: len(keep_mask.full_keep_map(model)["layer_ids"])])


def logits_of(model, seq, km=None, mode="replace"):
    ctx = keep_mask.KeepMask(model, km, mode, record=False)
    with torch.no_grad(), ctx:
        return model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].double()


# ---------------------------------------------------------------- keep all: the base model exactly


@pytest.mark.parametrize("name", ARCHS)
def test_keeping_every_expert_is_the_base_model_exactly(name):
    model = build(name)
    full = keep_of(model)
    res = eval_pruned.evaluate(model, SEQS, [full], batch_size=2)[0]
    assert res["kl"] == 0.0 and res["jsd"] == 0.0
    assert res["ppl_pruned"] == res["ppl_base"] and res["ppl_increase"] == 0.0
    assert res["top1_agreement"] == 1.0 and res["top5_agreement"] == 1.0 and res["slots_surviving"] == 1.0
    assert res["positions"] == sum(len(s) - 1 for s in SEQS) and res["tokens"] == sum(map(len, SEQS))
    assert all(la["routed_slots_unchanged"] == 1.0 for la in res["layers"])
    # The mask's machinery is in place for the full map too (a -inf fill of no expert): same logits, bit for bit.
    torch.testing.assert_close(logits_of(model, SEQS[0], full), logits_of(model, SEQS[0]), rtol=0, atol=0)


@pytest.mark.parametrize("name", ARCHS)
def test_pruning_half_changes_the_output_and_routes_no_pruned_expert(name):
    model = build(name)
    km = half_of(model)
    res = eval_pruned.evaluate(model, SEQS, [km], batch_size=2)[0]
    assert res["kl"] > 0 and 0 < res["jsd"] <= math.log(2) and res["top1_agreement"] < 1
    assert 0 < res["slots_surviving"] < 1
    assert all(la["routed_slots_kept"] == 1.0 for la in res["layers"])
    # The first MoE layer's input is the base model's: every kept expert the base chose is still chosen.
    first = res["layers"][0]
    assert first["routed_slots_unchanged"] == pytest.approx(first["slots_surviving"], abs=0.01)
    # An independent hook on the routers: no call of any router chose a pruned expert.
    ctx = keep_mask.KeepMask(model, km, record=False)
    with ctx:
        seen = router_outputs(model, lambda: [model(input_ids=torch.tensor([s]), use_cache=False) for s in SEQS])
    for li, calls in seen.items():
        chosen = np.concatenate([c[2] for c in calls]).astype(np.int64)
        assert set(np.unique(chosen)) <= set(km["layers"][li]), li
    # The first MoE layer sees the base model's input: its choice is the top-k of the base logits among the kept.
    base = router_outputs(model, lambda: [model(input_ids=torch.tensor([s]), use_cache=False) for s in SEQS])
    lg = np.concatenate([c[0] for c in base[0]])
    pruned = np.setdiff1d(np.arange(8), km["layers"][0])
    lg[:, pruned] = -np.inf
    want = np.sort(np.argsort(-lg, axis=-1, kind="stable")[:, :2], -1)
    got = np.sort(np.concatenate([c[2] for c in seen[0]]).astype(np.int64), -1)
    assert (want == got).all(-1).mean() > 0.99  # a near-tie may round differently


# ---------------------------------------------------------------- masking equals deleting


def deleted(model, km):
    """A copy of `model` whose MoE layers hold only the kept experts (K per layer, the same K everywhere)."""
    k = len(km["layers"][0])
    cfg = copy.deepcopy(model.config)
    for attr in ("num_experts", "num_local_experts", "n_routed_experts"):
        if attr in cfg.to_dict():
            setattr(cfg, attr, k)
    torch.manual_seed(1)
    small = transformers.AutoModelForCausalLM.from_config(cfg).to(next(model.parameters()).dtype).eval()
    big, e = model.state_dict(), 8
    blocks = {b[1]: (b, keep_mask.KeepMask(model, None).layer_ids.index(b[0])) for b in keep_mask.supported_blocks(model)}
    out = {}
    for key, value in small.state_dict().items():
        src = big[key]
        owner = next(((b, i) for name, (b, i) in blocks.items()
                      if key.startswith(f"{name}.{b[3].router}.") or key.startswith(f"{name}.{b[3].experts}.")), None)
        if owner is not None and src.shape[0] == e and value.shape[0] == k:
            src = src[km["layers"][owner[1]]]
        assert src.shape == value.shape, key
        out[key] = src
    small.load_state_dict(out)
    return small


DELETE_CASES = ["mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "qwen3_moe-unnormalized", "deepseek_v2", "gpt_oss"]


@pytest.mark.parametrize("case", DELETE_CASES)
def test_masking_equals_deleting_the_pruned_experts(case):
    name = case.split("-")[0]
    model = build_with(name, norm_topk_prob=False) if case.endswith("unnormalized") else build(name)
    km = half_of(model)
    if name == "qwen3_moe":  # both settings of norm_topk_prob really are in use
        assert {b[2].gate.norm_topk_prob for b in keep_mask.supported_blocks(model)} == {not case.endswith("unnormalized")}
    small = deleted(model, km)
    for s in SEQS:
        torch.testing.assert_close(logits_of(model, s, km), logits_of(small, s), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(logits_of(model, SEQS[0], km), logits_of(model, SEQS[0]), atol=1e-6)


def test_norm_topk_prob_changes_the_pruned_model():
    """With norm_topk_prob off the kept weights are softmax shares over the kept experts, not renormalized
    over the k: the two settings must give different pruned outputs (and each equals its deleted model above)."""
    normalized, plain = build_with("qwen3_moe", norm_topk_prob=True), build_with("qwen3_moe", norm_topk_prob=False)
    km = half_of(plain)
    assert CONFIGS["qwen3_moe"][1].norm_topk_prob is True  # the shared config is untouched
    diff = (logits_of(normalized, SEQS[0], km) - logits_of(plain, SEQS[0], km)).abs().max()
    assert float(diff) > 1e-4


# ---------------------------------------------------------------- drop mode


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "deepseek_v2"])
def test_drop_mode_equals_zeroing_the_pruned_experts_outputs(name):
    model = build(name)
    km = half_of(model)
    zeroed = copy.deepcopy(model)
    with torch.no_grad():
        for i, b in enumerate(keep_mask.supported_blocks(zeroed)):
            pruned = sorted(set(range(8)) - set(km["layers"][i]))
            getattr(b[2], b[3].experts).down_proj[pruned] = 0
    for s in SEQS:
        torch.testing.assert_close(logits_of(model, s, km, "drop"), logits_of(zeroed, s), rtol=1e-5, atol=1e-6)
    res = eval_pruned.evaluate(model, SEQS, [km], mode="drop")[0]
    assert res["kl"] > 0 and all(la["routed_slots_kept"] < 1 for la in res["layers"])
    # In the first MoE layer the router is untouched: the pruned model routes exactly as the base does.
    assert res["layers"][0]["routed_slots_unchanged"] == 1.0
    assert res["layers"][0]["routed_slots_kept"] == res["layers"][0]["slots_surviving"]


# ---------------------------------------------------------------- the figures by hand, padding excluded


def test_figures_equal_a_hand_computation_on_unpadded_sequences():
    model = build("olmoe")
    km = half_of(model)
    seqs = [SEQS[3], SEQS[0][:17], SEQS[1], [4]]  # one sequence has no scored position
    res = eval_pruned.evaluate(model, seqs, [km], batch_size=3)[0]
    nll_b = nll_p = kl = js = top1 = top5 = 0.0
    n = 0
    for s in seqs:
        if len(s) < 2:
            continue
        lb = torch.log_softmax(logits_of(model, s), -1)[:-1].numpy()
        lq = torch.log_softmax(logits_of(model, s, km), -1)[:-1].numpy()
        for t in range(len(s) - 1):
            p, q = np.exp(lb[t]), np.exp(lq[t])
            nll_b -= lb[t, s[t + 1]]
            nll_p -= lq[t, s[t + 1]]
            kl += float(np.sum(p * (lb[t] - lq[t])))
            mix = (p + q) / 2
            js += 0.5 * float(np.sum(p * np.log(p / mix))) + 0.5 * float(np.sum(q * np.log(q / mix)))
            top1 += int(np.argmax(lb[t]) == np.argmax(lq[t]))
            top5 += len(set(np.argsort(-lb[t])[:5]) & set(np.argsort(-lq[t])[:5])) / 5
            n += 1
    assert res["positions"] == n == 2 + 16 + 39 and res["tokens"] == 3 + 17 + 40 + 1
    # Right padding: real positions see the same causal context; only float rounding differs.
    assert res["ppl_base"] == pytest.approx(math.exp(nll_b / n), rel=1e-5)
    assert res["ppl_pruned"] == pytest.approx(math.exp(nll_p / n), rel=1e-5)
    assert res["kl"] == pytest.approx(kl / n, rel=1e-3, abs=1e-9)
    assert res["jsd"] == pytest.approx(js / n, rel=1e-3, abs=1e-9)
    assert res["top1_agreement"] == pytest.approx(top1 / n, abs=1.5 / n)  # a near tie may flip
    assert res["top5_agreement"] == pytest.approx(top5 / n, abs=1.5 / n)


def test_jsd_is_at_most_ln2_and_grows_with_pruning():
    model = build("mixtral")
    six = keep_of(model, [[0, 1, 2, 4, 5, 6], [1, 2, 3, 5, 6, 7]])
    two = keep_of(model, [[0, 6], [1, 5]])
    r6, r2 = eval_pruned.evaluate(model, SEQS, [six, two], batch_size=4)
    for r in (r6, r2):
        assert 0 < r["jsd"] <= math.log(2)
        # For small differences KL ~ chi^2 / 2 and JSD ~ chi^2 / 8 (second order in Q - P): JSD ~ KL / 4.
        assert 0.2 < r["jsd"] / r["kl"] < 0.3, (r["jsd"], r["kl"])
    assert r2["slots_surviving"] < r6["slots_surviving"] and r2["jsd"] > r6["jsd"] and r2["kl"] > r6["kl"]


# ---------------------------------------------------------------- slots against the trace and moe-offload


def write_keep(path, km):
    path.write_text(json.dumps({"kind": "moe-offload-keep-map", **km}), encoding="utf-8")
    return path


def test_slots_surviving_is_a_count_over_the_captured_trace_and_moe_offloads_slot_replacement(tmp_path):
    model = build("deepseek_v2")  # a dense first layer: MoE layer ids [1, 2]
    km = half_of(model)
    assert km["layer_ids"] == [1, 2]
    trace = tmp_path / "base.safetensors"
    capture_routing.capture(model, SEQS, trace, candidates=4)
    ids = load_file(str(trace))["ids"][:, :, :2].astype(np.int64)
    res = eval_pruned.evaluate(model, SEQS, [km], batch_size=2)[0]
    want = [float(np.isin(ids[li], km["layers"][li]).mean()) for li in range(2)]
    assert [la["slots_surviving"] for la in res["layers"]] == pytest.approx(want, abs=1e-12)
    assert res["slots_surviving"] == pytest.approx(float(np.mean(want)), abs=1e-12)
    r = subprocess.run([moe_offload(), "retention", str(write_keep(tmp_path / "keep.json", km)), "--heldout", str(trace),
                        "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    per = json.loads(r.stdout)["maps"][0]["per_layer"]
    assert [p["layer_id"] for p in per] == [1, 2]
    assert [1 - p["figures"]["slot_replacement"] for p in per] == pytest.approx(want, abs=1e-9)


def test_a_pruned_capture_holds_no_pruned_expert_and_replays_without_pruned_slots(tmp_path):
    model = build("qwen2_moe")
    km = half_of(model)
    keep = write_keep(tmp_path / "keep.json", km)
    km = keep_mask.read_keep_map(keep)
    trace = tmp_path / "pruned.safetensors"
    c = capture_routing.capture(model, SEQS, trace, candidates=4, lookahead=3, keep=km)
    t = load_file(str(trace))
    for li in range(c.layers):
        for name in ("ids", "lookahead_ids"):
            assert set(np.unique(t[name][li])) <= set(km["layers"][li]), (name, li)
    assert np.isfinite(t["scores"]).all()
    from safetensors import safe_open

    with safe_open(str(trace), "np") as f:
        meta = f.metadata()
    assert meta["keep_map"] == "frequency@4" and meta["keep_map_sha256"] == keep_mask.keep_map_sha256(km)
    r = subprocess.run([moe_offload(), "replay", str(trace), "--policy", "lru", "--cap", "4", "--keep", str(keep),
                        "--warmup", "0", "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["pruned_slots"] == 0 and rep["forced_misses"] == 0 and rep["substituted"] == 0
    # The base model's trace under the same keep map does have pruned slots: the check can fail.
    base = tmp_path / "base.safetensors"
    capture_routing.capture(model, SEQS, base, candidates=4)
    r = subprocess.run([moe_offload(), "replay", str(base), "--policy", "lru", "--cap", "4", "--keep", str(keep),
                        "--warmup", "0", "--json"], capture_output=True, text=True)
    assert json.loads(r.stdout)["pruned_slots"] > 0
    with pytest.raises(keep_mask.KeepMapError, match=r"--candidates 5 > 4, the experts layer 0 of .*keep.json keeps"):
        capture_routing.capture(model, SEQS, tmp_path / "x.safetensors", candidates=5, keep=km)


# ---------------------------------------------------------------- refusals and bad input


def test_group_limited_routers_are_refused_with_the_reason():
    with pytest.raises(keep_mask.Refused, match=r"layer 1 \(model.layers.1.mlp, DeepseekV3MoE\): refused: .*"
                                                r"e_score_correction_bias"):
        eval_pruned.evaluate(build("deepseek_v3"), SEQS, [])
    cfg = copy.deepcopy(CONFIGS["deepseek_v2"][1])
    cfg.topk_method, cfg.n_group, cfg.topk_group = "group_limited_greedy", 2, 1
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(keep_mask.Refused, match="group_limited_greedy"):
        keep_mask.KeepMask(model, None)


def test_keep_maps_that_do_not_fit_the_model_name_the_layer(tmp_path):
    model = build("deepseek_v2")
    km = half_of(model)
    with pytest.raises(keep_mask.KeepMapError, match=r"no entry for MoE layer\(s\) \[2\]; layer\(s\) \[0\] are not MoE"):
        keep_mask.KeepMask(model, dict(km, layer_ids=[0, 1]))
    with pytest.raises(keep_mask.KeepMapError, match=r"layer 2 keeps 1 experts, fewer than the model's top-k 2"):
        keep_mask.KeepMask(model, dict(km, layers=[[0, 1], [3]]))
    keep_mask.KeepMask(model, dict(km, layers=[[0, 1], [3]]), "drop")  # drop mode: any number kept
    with pytest.raises(keep_mask.KeepMapError, match=r"num_experts 16 but the model's MoE layers route among 8"):
        keep_mask.KeepMask(model, dict(km, num_experts=16))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**km, "layers": [[0, 1], [2, 9]]}), encoding="utf-8")
    with pytest.raises(keep_mask.KeepMapError, match=r"bad.json: layer 2: expert 9 out of range"):
        keep_mask.read_keep_map(bad)
    bad.write_text(json.dumps({"kind": "moe-offload-stats"}), encoding="utf-8")
    with pytest.raises(keep_mask.KeepMapError, match=r"bad.json: kind 'moe-offload-stats' is not a keep map"):
        keep_mask.read_keep_map(bad)


def test_keep_map_sha256_is_moe_offloads(tmp_path):
    """The digest of a keep map that moe-offload wrote itself equals the one sweep records for it."""
    data = Path(__file__).resolve().parent.parent / "data"
    stats, keep = tmp_path / "s.json", tmp_path / "k.json"
    subprocess.run([moe_offload(), "stats", str(data / "default-calib.safetensors"), "-o", str(stats)], check=True,
                   capture_output=True)
    subprocess.run([moe_offload(), "keep", str(stats), "--metric", "frequency", "--k", "4", "-o", str(keep)], check=True,
                   capture_output=True)
    grid = tmp_path / "grid.json"
    grid.write_text(json.dumps({"traces": {"in_sample": str(data / "default-calib.safetensors"),
                                           "out_of_sample": str(data / "default-heldout.safetensors")},
                                "variants": [f"file:{keep}"], "blocks": [{"policies": ["lru"], "cap": [8]}]}),
                    encoding="utf-8")
    r = subprocess.run([moe_offload(), "sweep", str(grid), "--threads", "1", "-o", str(tmp_path / "sw")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    results = json.loads((tmp_path / "sw" / "results.json").read_text())
    shas = [k["sha256"] for k in results["provenance"]["keep_maps"]]
    assert shas == [keep_mask.keep_map_sha256(keep_mask.read_keep_map(keep))]


# ---------------------------------------------------------------- the command line


def saved_model(tmp_path, name="mixtral"):
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = build(name)
    model.save_pretrained(tmp_path / "m")
    vocab = {f"w{i}": i for i in range(63)} | {"[UNK]": 63}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[UNK]").save_pretrained(
        tmp_path / "m")
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(" ".join(f"w{(5 * i + 3 * j) % 63}" for i in range(10 + 7 * j)) for j in range(3)),
                    encoding="utf-8")
    return model, tmp_path / "m", text


def test_command_line_writes_one_document_per_keep_map(tmp_path, capsys):
    model, mdir, text = saved_model(tmp_path)
    full = write_keep(tmp_path / "full.json", keep_of(model))
    half = write_keep(tmp_path / "half.json", half_of(model))
    out = tmp_path / "q"
    common = ["--model", str(mdir), "--text", str(text), "--dtype", "float32", "--batch-size", "2"]
    eval_pruned.main(common + ["--keep", str(full), str(half), "-o", str(out)])
    docs = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert sorted(docs) == ["full", "half"]
    for stem, d in docs.items():
        assert d["kind"] == "moe-offload-quality" and d["mode"] == "replace"
        assert d["keep_map"]["sha256"] == keep_mask.keep_map_sha256(keep_mask.read_keep_map(tmp_path / f"{stem}.json"))
        assert d["model"]["architecture"] == "mixtral" and d["model"]["layer_ids"] == [0, 1]
        assert d["text"]["tokens"] == 10 + 17 + 24 and d["positions"] == 9 + 16 + 23
        assert len(d["text"]["sha256"]) == 64 and len(d["text"]["token_ids_sha256"]) == 64
    assert docs["full"]["kl"] == 0.0 and docs["half"]["kl"] > 0
    assert docs["full"]["ppl_base"] == docs["half"]["ppl_base"]
    assert "wrote" in capsys.readouterr().out
    single = tmp_path / "one.json"
    # accelerate's --device-map puts its own forward on every module: the mask must wrap it, not lose it.
    eval_pruned.main(common + ["--keep", str(half), "--mode", "drop", "--device-map", "auto", "-o", str(single)])
    d = json.loads(single.read_text())
    assert d["mode"] == "drop" and d["ppl_base"] == pytest.approx(docs["half"]["ppl_base"], rel=1e-6)
    assert d["kl"] > 0 and all(la["routed_slots_kept"] < 1 for la in d["layers"])
    replace = tmp_path / "replace.json"
    eval_pruned.main(common + ["--keep", str(half), "--device-map", "auto", "-o", str(replace)])
    assert json.loads(replace.read_text())["kl"] == pytest.approx(docs["half"]["kl"], rel=1e-9)


def test_bad_input_is_a_message_and_exit_2_not_a_traceback(tmp_path):
    model, mdir, text = saved_model(tmp_path)
    wrong = write_keep(tmp_path / "wrong.json", dict(half_of(model), layer_ids=[0, 5]))
    script = Path(eval_pruned.__file__)
    r = subprocess.run([sys.executable, str(script), "--model", str(mdir), "--text", str(text), "--keep", str(wrong),
                        "-o", str(tmp_path / "x.json")], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "wrong.json: layer_ids [0, 5] do not match the model's MoE layers [0, 1]" in r.stderr
    r = subprocess.run([sys.executable, str(Path(capture_routing.__file__)), "--model", str(mdir), "--text", str(text),
                        "--keep", str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "missing.json: cannot read the keep map" in r.stderr


def test_capture_command_line_with_keep_records_the_pruned_model(tmp_path):
    model, mdir, text = saved_model(tmp_path, "olmoe")
    km = half_of(model)
    keep = write_keep(tmp_path / "keep.json", km)
    out = tmp_path / "p.safetensors"
    capture_routing.main(["--model", str(mdir), "--text", str(text), "--dtype", "float32", "--keep", str(keep),
                          "--candidates", "3", "-o", str(out)])
    ids = load_file(str(out))["ids"]
    assert ids.shape == (2, 51, 3)
    for li in range(2):
        assert set(np.unique(ids[li])) <= set(km["layers"][li])


# ---------------------------------------------------------------- configurations the fixed configs do not cover

VARIANT_CASES = {
    # Dense layers between MoE layers (decoder_sparse_step 2: MoE layers 1 and 3), 16 experts, top-1.
    "qwen2_moe-sparse-step-2": ("qwen2_moe", dict(num_hidden_layers=4, decoder_sparse_step=2, num_experts=16,
                                                  num_experts_per_tok=1), [1, 3]),
    # mlp_only_layers: layer 0 dense, norm_topk_prob on, top-3.
    "qwen3_moe-mlp-only-0": ("qwen3_moe", dict(num_hidden_layers=3, mlp_only_layers=[0], num_experts_per_tok=3,
                                               norm_topk_prob=True), [1, 2]),
    # OLMoE with norm_topk_prob on and 4 experts.
    "olmoe-normalized": ("olmoe", dict(num_experts=4, norm_topk_prob=True), [0, 1]),
    # Two dense first layers, two shared experts.
    "deepseek_v2-two-dense": ("deepseek_v2", dict(num_hidden_layers=4, first_k_dense_replace=2, n_shared_experts=2),
                              [2, 3]),
}


@pytest.mark.parametrize("case", sorted(VARIANT_CASES))
def test_other_configurations_keep_all_exactly_and_route_only_kept_experts(case):
    name, overrides, layer_ids = VARIANT_CASES[case]
    model = build_with(name, **overrides)
    full = keep_mask.full_keep_map(model)
    assert full["layer_ids"] == layer_ids
    e, k = full["num_experts"], keep_mask.KeepMask(model, None).top_k
    half = keep_of(model, [[x for x in range(e) if (x + li) % 2 == 0] for li in range(len(layer_ids))])
    for dtype in (torch.float32, torch.bfloat16):
        m = model.to(dtype)
        torch.testing.assert_close(logits_of(m, SEQS[0], full), logits_of(m, SEQS[0]), rtol=0, atol=0)
        with keep_mask.KeepMask(m, half, record=False):
            seen = router_outputs(m, lambda: m(input_ids=torch.tensor([SEQS[0]]), use_cache=False))
        for li, calls in seen.items():
            chosen = np.concatenate([c[2] for c in calls]).astype(np.int64)
            assert chosen.shape[1] == k and set(np.unique(chosen)) <= set(half["layers"][li]), (case, li)
    res = eval_pruned.evaluate(model.to(torch.float32), SEQS, [full, half], batch_size=2)
    assert res[0]["kl"] == 0.0 and res[1]["kl"] > 0 and res[1]["slots_surviving"] < 1
