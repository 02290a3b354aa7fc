"""Tests of capture_routing.py on tiny randomly initialized MoE models (nothing is downloaded).

Run: `pytest python/test_capture.py` (needs numpy, safetensors, torch, transformers >= 5 and
accelerate; skipped otherwise, except under CI=true, where a missing one fails). Traces are
checked against the model's own router outputs from a separate run, and opened, summed and
replayed by moe-offload: the binary comes from
MOE_OFFLOAD_BIN, else $CARGO_TARGET_DIR or target/ ({debug,release}/moe-offload). Those checks
skip when it is not built, except under CI=true, where a missing binary fails them.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI"):
    # CI installs everything: a missing package there is a failure, not a skip.
    import numpy as np
    import safetensors  # noqa: F401
    import torch
    import transformers
else:
    np = pytest.importorskip("numpy")
    pytest.importorskip("safetensors")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import capture_routing  # noqa: E402
from capture_rows import RoutingMismatch, order_rows  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMON = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def configs():
    """Tiny configs of every supported architecture: (name, config, expected m with --candidates 4)."""
    t = transformers
    mla = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
               v_head_dim=8)
    return [
        ("qwen2_moe", t.Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16,
                                       shared_expert_intermediate_size=16, num_hidden_layers=2, num_experts=8,
                                       num_experts_per_tok=2, decoder_sparse_step=1), 4),
        ("qwen3_moe", t.Qwen3MoeConfig(**COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=16,
                                       num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                                       decoder_sparse_step=1, norm_topk_prob=True), 4),
        ("qwen3_next", t.Qwen3NextConfig(**COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=16, num_hidden_layers=2, num_experts=8,
                                         num_experts_per_tok=2, decoder_sparse_step=1, linear_num_value_heads=2,
                                         linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                                         layer_types=["linear_attention", "full_attention"]), 4),
        ("mixtral", t.MixtralConfig(**COMMON, intermediate_size=16, num_hidden_layers=2, num_local_experts=8,
                                    num_experts_per_tok=2), 4),
        ("olmoe", t.OlmoeConfig(**COMMON, intermediate_size=16, num_hidden_layers=2, num_experts=8,
                                num_experts_per_tok=2), 4),
        ("deepseek_v2", t.DeepseekV2Config(**{**COMMON, **mla}, intermediate_size=48, moe_intermediate_size=16,
                                           num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                                           n_shared_experts=1, num_experts_per_tok=2, topk_method="greedy",
                                           n_group=1, topk_group=1), 4),
        ("deepseek_v3", t.DeepseekV3Config(**{**COMMON, **mla}, intermediate_size=48, moe_intermediate_size=16,
                                           num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                                           n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                                           norm_topk_prob=True), 2),
        ("gpt_oss", t.GptOssConfig(**COMMON, head_dim=8, intermediate_size=16, num_hidden_layers=2,
                                   num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
                                   layer_types=["sliding_attention", "full_attention"]), 4),
    ]


CONFIGS = {c[0]: c for c in configs()}


def build(name, dtype=torch.float32, widen=True):
    """The tiny model `name`; widen: routers redrawn from N(0, 1) so routing is decisive."""
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(CONFIGS[name][1])
    if widen:
        with torch.no_grad():
            for _, _, block, a in capture_routing.find_moe_blocks(model):
                r = getattr(block, a.router)
                r.weight.normal_(0.0, 1.0)
                if a.family == "deepseek_v3":
                    r.e_score_correction_bias.normal_(0.0, 0.1)
    return model.to(dtype).eval()


def moe_offload():
    exe = os.environ.get("MOE_OFFLOAD_BIN")
    if exe:
        return exe
    dirs = [Path(os.environ["CARGO_TARGET_DIR"])] if os.environ.get("CARGO_TARGET_DIR") else []
    for d in dirs + [ROOT / "target"]:
        for p in (d / "debug/moe-offload", d / "release/moe-offload"):
            if p.is_file():
                return str(p)
    if os.environ.get("CI"):
        pytest.fail("moe-offload is not built: CI must build it (cargo build -p cli) before pytest")
    pytest.skip("moe-offload is not built (cargo build -p cli, or set MOE_OFFLOAD_BIN)")


def run(*args):
    r = subprocess.run([moe_offload(), *map(str, args)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def meta_of(path):
    with safe_open(str(path), "np") as f:
        return f.metadata()


SEQS = [[(7 * i + 3 * j) % 64 for i in range(40)] for j in range(3)] + [[5, 9, 1]]


def router_outputs(model, forward):
    """Per MoE layer index: the (logits, weights, indices) arrays of every router call during forward()."""
    blocks = capture_routing.find_moe_blocks(model)
    seen = {i: [] for i in range(len(blocks))}
    handles = [getattr(b, a.router).register_forward_hook(
        lambda _m, _i, o, i=i: seen[i].append([x.detach().float().reshape(-1, x.shape[-1]).cpu().numpy()
                                               for x in o[:3]]))
        for i, (_, _, b, a) in enumerate(blocks)]
    try:
        with torch.no_grad():
            forward()
    finally:
        for h in handles:
            h.remove()
    return seen


def check_against_model(t, meta, seen, rows_of_call=None):
    """Every row's first k ids are the experts the model used, with its gates, and the rest follow
    the stable top-m by logit of the remaining experts; rows_of_call(call_index, n) picks rows."""
    k = int(meta["top_k"])
    for li in range(t["ids"].shape[0]):
        parts = [(o, (rows_of_call(c, o[0].shape[0]) if rows_of_call else slice(None))) for c, o in enumerate(seen[li])]
        logits = np.concatenate([o[0][r] for o, r in parts])
        weights = np.concatenate([o[1][r] for o, r in parts])
        chosen = np.concatenate([o[2][r] for o, r in parts]).astype(np.int64)
        ids = t["ids"][li].astype(np.int64)
        assert ids.shape[0] == chosen.shape[0]
        assert np.array_equal(np.sort(ids[:, :k], -1), np.sort(chosen, -1)), "the first k ids are the used experts"
        for tok in range(ids.shape[0]):
            w = dict(zip(chosen[tok].tolist(), weights[tok].tolist()))
            np.testing.assert_allclose([w[e] for e in ids[tok, :k]], t["gates"][li, tok], rtol=1e-6)
        if meta["score_kind"] == "logits":
            m = ids.shape[1]
            for tok in range(ids.shape[0]):
                others = [e for e in np.argsort(-logits[tok], kind="stable") if e not in set(chosen[tok])]
                assert ids[tok, k:].tolist() == others[: m - k]
            np.testing.assert_array_equal(np.diff(t["scores"][li], axis=-1) <= 0, True)
            np.testing.assert_allclose(t["scores"][li], np.minimum.accumulate(
                np.take_along_axis(logits, ids, -1), axis=-1), rtol=1e-6)


# ---------------------------------------------------------------- row rules, by hand

ROW_CASES = [
    # (logits, chosen, weights, m, expected ids, expected tied)
    ([[3.0, 2.0, 1.0, 0.0]], [[1, 0]], [[0.4, 0.6]], 3, [[0, 1, 2]], [False]),
    # A tie for second place: the model took 2; it comes second, the tied 1 right after it.
    ([[3.0, 2.0, 2.0, 0.0]], [[0, 2]], [[0.6, 0.4]], 4, [[0, 2, 1, 3]], [True]),
    # All logits equal (a zero hidden state): the model's [6, 5], equal gates: lower id first.
    ([[0.0] * 8], [[6, 5]], [[0.5, 0.5]], 4, [[5, 6, 0, 1]], [True]),
]


@pytest.mark.parametrize("logits,chosen,weights,m,ids,tied", ROW_CASES)
def test_rows_put_the_used_experts_first_and_accept_ties(logits, chosen, weights, m, ids, tied):
    lg = np.array(logits, np.float32)
    ranked = torch.softmax(torch.tensor(lg), -1).numpy()
    rows = order_rows(lg, ranked, np.array(chosen), np.array(weights), 2, m, "top_logits")
    assert rows.ids.tolist() == ids and rows.tied.tolist() == tied
    assert np.all(np.diff(rows.scores, axis=-1) <= 0)


def test_a_real_disagreement_is_refused_with_its_token():
    lg = np.array([[3.0, 2.0, 1.0, 0.0], [3.0, 2.0, 1.0, 0.0]], np.float32)
    ranked = torch.softmax(torch.tensor(lg), -1).numpy()
    want = r"token 1: the model used experts \[0, 2\], not the top-2 by logit \[0, 1\]"
    with pytest.raises(RoutingMismatch, match=want):
        order_rows(lg, ranked, np.array([[0, 1], [0, 2]]), np.ones((2, 2)), 2, 2, "top_logits")


def test_a_model_that_uses_other_experts_is_refused_with_token_and_layer(tmp_path):
    model = build("mixtral")
    gate = model.model.layers[1].mlp.gate
    orig = gate.forward

    def forward(h):
        logits, w, idx = orig(h)
        idx = idx.clone()
        idx[5] = torch.argsort(logits[5])[:2]  # the two lowest logits: no tie explains that
        return logits, w, idx

    gate.forward = forward
    with pytest.raises(RoutingMismatch, match=r"token 5, layer 1 \(model.layers.1.mlp\): the model used"):
        capture_routing.capture(model, SEQS[:1], tmp_path / "x.safetensors")
    assert not (tmp_path / "x.safetensors").exists()


# ---------------------------------------------------------------- whole models

DTYPE_CASES = [(n, "float32") for n in CONFIGS] + [(n, "bfloat16") for n in CONFIGS]


@pytest.mark.parametrize("name,dtype", DTYPE_CASES, ids=[f"{n}-{d}" for n, d in DTYPE_CASES])
def test_capture_matches_the_model_and_moe_offload(tmp_path, name, dtype):
    # bf16 with the default (near-uniform) routers: ties are common, as a new user would meet them.
    model = build(name, getattr(torch, dtype), widen=dtype == "float32")
    out = tmp_path / "trace.safetensors"
    c = capture_routing.capture(model, SEQS, out, candidates=4, model_name=name)
    m = CONFIGS[name][2]
    assert (c.tokens, c.candidates, c.top_k) == (sum(map(len, SEQS)), m, 2)
    t, meta = load_file(str(out)), meta_of(out)
    for key in ("format", "format_version", "model", "num_experts", "top_k", "layer_ids", "score_kind", "phase",
                "source", "tied_rows"):
        assert key in meta, key
    assert meta["num_experts"] == "8" and meta["top_k"] == "2" and meta["phase"] == "prefill"
    assert int(meta["tied_rows"]) == c.tied_rows == sum(json.loads(meta["tied_rows_per_layer"]))
    layer_ids = json.loads(meta["layer_ids"])
    assert t["ids"].shape == (c.layers, c.tokens, m) == (len(layer_ids), c.tokens, m)
    assert list(t["seq_offsets"]) == [0, 40, 80, 120]
    assert np.all(t["out_norms"] > 0)
    seen = router_outputs(model, lambda: [model(input_ids=torch.tensor([s]), use_cache=False) for s in SEQS])
    check_against_model(t, meta, seen)

    run("inspect", out)
    stats_path = tmp_path / "stats.json"
    run("stats", out, "-o", stats_path)
    stats = json.loads(stats_path.read_text())
    assert stats["meta"]["layer_ids"] == layer_ids
    for li, layer in enumerate(stats["layers"]):
        ids = t["ids"][li, :, :2].astype(np.int64).ravel()
        g, n = t["gates"][li].astype(np.float64).ravel(), t["out_norms"][li].astype(np.float64).ravel()
        np.testing.assert_array_equal(layer["count"], np.bincount(ids, minlength=8))
        np.testing.assert_allclose(layer["gate_sum"], np.bincount(ids, weights=g, minlength=8), rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(layer["reap_sum"], np.bincount(ids, weights=g * n, minlength=8), rtol=1e-5,
                                   atol=1e-9)


def test_a_deliberate_bf16_tie_is_kept_and_counted(tmp_path):
    """Experts 3 and 5 of Mixtral get the same router row in bf16, below a dominant expert 0: every
    token's second place is a tie, which torch.topk breaks its own way (the old script refused)."""
    model = build("mixtral", torch.bfloat16)
    with torch.no_grad():
        for _, _, block, _ in capture_routing.find_moe_blocks(model):
            w = block.gate.weight
            w[0] = w[0].abs() * 0 + 4.0
            w[5] = w[3]
    out = tmp_path / "tie.safetensors"
    c = capture_routing.capture(model, SEQS, out, candidates=4)
    t, meta = load_file(str(out)), meta_of(out)
    seen = router_outputs(model, lambda: [model(input_ids=torch.tensor([s]), use_cache=False) for s in SEQS])
    check_against_model(t, meta, seen)
    # Rows where the model took 5 over its tied 3 (and so is not the stable top-2) are the tied rows.
    want = [int(sum(((np.sort(o[2], -1) != np.sort(np.argsort(-o[0], kind="stable")[:, :2], -1)).any(-1)).sum()
                    for o in seen[li])) for li in range(c.layers)]
    assert json.loads(meta["tied_rows_per_layer"]) == want and c.tied_rows == sum(want) > 0


def test_olmoe_token_zero_of_zero_embedding_is_a_tie_not_a_refusal(tmp_path):
    """The issue's fp32 OLMoE refusal: its first token was the pad id 1, whose embedding row is zero,
    so every router logit of token 0 is exactly 0.0 and torch.topk returns [6, 5] of eight equal values."""
    model = build("olmoe")
    model.save_pretrained(tmp_path / "olmoe")
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "olmoe", dtype=torch.float32)
    pad = model.config.pad_token_id
    assert float(model.get_input_embeddings().weight[pad].detach().abs().max()) == 0.0
    seqs = [[pad] + s[1:] for s in SEQS[:2]]
    c = capture_routing.capture(model, seqs, tmp_path / "o.safetensors", candidates=4)
    t = load_file(str(tmp_path / "o.safetensors"))
    assert c.tied_rows >= 2 * c.layers  # token 0 of both sequences, every layer
    np.testing.assert_array_equal(t["scores"][:, [0, 40]], 0.0)


def test_batched_capture_equals_one_by_one_and_the_model(tmp_path):
    model = build("qwen2_moe")
    seqs = [SEQS[3], SEQS[0][:17], SEQS[1], SEQS[2][:5], [3]]
    one = capture_routing.capture(model, seqs, tmp_path / "one.safetensors", candidates=4)
    many = capture_routing.capture(model, seqs, tmp_path / "many.safetensors", candidates=4, batch_size=3)
    a, b = load_file(str(tmp_path / "one.safetensors")), load_file(str(tmp_path / "many.safetensors"))
    assert one.tokens == many.tokens == sum(map(len, seqs))
    np.testing.assert_array_equal(a["ids"], b["ids"])
    np.testing.assert_array_equal(b["seq_offsets"], [0, 3, 20, 60, 65])
    np.testing.assert_allclose(a["scores"], b["scores"], rtol=1e-4, atol=1e-5)

    # The model's own routing in the same padded batches, real tokens only.
    masks = []

    def forward():
        for i in range(0, len(seqs), 3):
            batch = seqs[i: i + 3]
            n = max(map(len, batch))
            ids = torch.tensor([s + [0] * (n - len(s)) for s in batch])
            mask = torch.tensor([[1] * len(s) + [0] * (n - len(s)) for s in batch])
            masks.append(mask.reshape(-1).bool().numpy())
            model(input_ids=ids, attention_mask=mask, use_cache=False)

    seen = router_outputs(model, forward)
    check_against_model(b, meta_of(tmp_path / "many.safetensors"), seen, lambda call, n: masks[call])


@pytest.mark.parametrize("batch_size", [1, 2])
def test_decode_capture_matches_generate(tmp_path, batch_size):
    model = build("mixtral")
    model.generation_config.eos_token_id = None
    prompts, n = [SEQS[0][:9], SEQS[1][:4], SEQS[3]], 5
    out, pre = tmp_path / "decode.safetensors", tmp_path / "prefill.safetensors"
    dec, pf = capture_routing.capture(model, prompts, out, candidates=3, batch_size=batch_size, generate=n,
                                      prefill_output=pre)
    t, meta = load_file(str(out)), meta_of(out)
    assert meta["phase"] == "decode" and dec.tokens == n * len(prompts) and pf.tokens == sum(map(len, prompts))
    sizes = [len(prompts[i: i + batch_size]) for i in range(0, len(prompts), batch_size)]
    want_steps = np.cumsum([0] + [s for s in sizes for _ in range(n)])[:-1]
    np.testing.assert_array_equal(t["step_offsets"], want_steps)
    if batch_size == 1:
        np.testing.assert_array_equal(t["seq_offsets"], [0, n, 2 * n])
    else:
        assert "seq_offsets" not in t

    # transformers' own generate with the KV cache: its forward calls after the first are the decode steps.
    calls = []

    def forward():
        for i in range(0, len(prompts), batch_size):
            batch = prompts[i: i + batch_size]
            w = max(map(len, batch))
            ids = torch.tensor([[0] * (w - len(s)) + s for s in batch])
            mask = torch.tensor([[0] * (w - len(s)) + [1] * len(s) for s in batch])
            calls.extend(["prefill"] + ["decode"] * n)
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n + 1, min_new_tokens=n + 1,
                           do_sample=False, pad_token_id=0)

    seen = router_outputs(model, forward)
    decode_only = {li: [o for o, c in zip(v, calls) if c == "decode"] for li, v in seen.items()}
    check_against_model(t, meta, decode_only)
    run("inspect", out)
    run("replay", out, "--policy", "lru", "--cap", "4", "--warmup", "0", "--json")

    # The prompts' rows equal a plain prefill capture of the same prompts.
    plain = capture_routing.capture(model, prompts, tmp_path / "plain.safetensors", candidates=3)
    np.testing.assert_array_equal(load_file(str(pre))["ids"], load_file(str(tmp_path / "plain.safetensors"))["ids"])
    assert plain.tokens == pf.tokens


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v2", "gpt_oss"])
def test_lookahead_ids_are_the_next_router_on_the_previous_input(tmp_path, name):
    model = build(name)
    out = tmp_path / "la.safetensors"
    c = capture_routing.capture(model, SEQS, out, candidates=4, lookahead=3)
    t = load_file(str(out))
    assert t["lookahead_ids"].shape == (c.layers, c.tokens, 3) and t["lookahead_ids"].dtype == np.uint16
    blocks = capture_routing.find_moe_blocks(model)
    inputs = {i: [] for i in range(len(blocks))}
    first = {"x": []}
    hs = [b.register_forward_pre_hook(lambda _m, a, i=i: inputs[i].append(a[0].reshape(-1, a[0].shape[-1])))
          for i, (_, _, b, _) in enumerate(blocks)]
    layer0 = model.get_submodule(blocks[0][1].rsplit(".", 1)[0])
    hs.append(layer0.register_forward_pre_hook(
        lambda _m, a, kw: first["x"].append(layer0.post_attention_layernorm(a[0] if a else kw["hidden_states"])),
        with_kwargs=True))
    with torch.no_grad():
        for s in SEQS:
            model(input_ids=torch.tensor([s]), use_cache=False)
    for h in hs:
        h.remove()
    for li, (_, _, b, a) in enumerate(blocks):
        x = torch.cat([v.reshape(-1, COMMON["hidden_size"]) for v in (first["x"] if li == 0 else inputs[li - 1])])
        r = getattr(b, a.router)
        logits = x.float() @ r.weight.float().T + (r.bias.float() if getattr(r, "bias", None) is not None else 0)
        want = np.argsort(-logits.detach().numpy(), axis=-1, kind="stable")[:, :3]
        agree = (t["lookahead_ids"][li] == want).all(-1).mean()
        assert agree > 0.99, (li, agree)  # our matmul may round a near-tie differently from F.linear
    text = run("inspect", out)
    assert "lookahead" in text
    run("replay", out, "--policy", "lru", "--cap", "4")


def test_command_line_on_a_saved_model_with_device_map_jsonl_batches_and_generate(tmp_path):
    """The script as a user runs it: a model and tokenizer on disk, --device-map auto (accelerate)."""
    if not os.environ.get("CI"):
        pytest.importorskip("accelerate")
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = build("olmoe", torch.bfloat16, widen=False)
    model.save_pretrained(tmp_path / "m")
    vocab = {f"w{i}": i for i in range(63)} | {"[UNK]": 63}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[UNK]").save_pretrained(
        tmp_path / "m")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"body": " ".join(f"w{(5 * i + j) % 63}" for i in range(12 + j))}) + "\n"
                            for j in range(4)), encoding="utf-8")
    out = tmp_path / "t.safetensors"
    capture_routing.main(["--model", str(tmp_path / "m"), "--jsonl", str(docs), "--text-key", "body", "--device-map",
                          "auto", "--batch-size", "2", "--candidates", "4", "--lookahead", "2", "-o", str(out)])
    t, meta = load_file(str(out)), meta_of(out)
    assert t["ids"].shape == (2, 12 + 13 + 14 + 15, 4) and list(t["seq_offsets"]) == [0, 12, 25, 39]
    assert meta["batch_size"] == "2" and "tied_rows" in meta
    dec = tmp_path / "d.safetensors"
    capture_routing.main(["--model", str(tmp_path / "m"), "--jsonl", str(docs), "--text-key", "body",
                          "--batch-size", "4", "--generate", "3", "--dtype", "float32", "-o", str(dec)])
    assert list(load_file(str(dec))["step_offsets"]) == [0, 4, 8]
    run("inspect", dec)
    with pytest.raises(ValueError, match=r"docs.jsonl:1: no string under --text-key 'text' \(keys: body\)"):
        capture_routing.main(["--model", str(tmp_path / "m"), "--jsonl", str(docs), "-o", str(out)])


def test_norms_are_each_experts_own_output(tmp_path):
    """The norm of slot s is ||expert(x)|| for that expert alone, computed here by hand for Mixtral."""
    model = build("mixtral")
    captured = {}
    block = capture_routing.find_moe_blocks(model)[0][2]
    block.register_forward_pre_hook(lambda _m, inputs: [captured.setdefault("x", inputs[0].detach().reshape(-1, 32))]
                                    and None)
    capture_routing.capture(model, SEQS[:1], tmp_path / "t.safetensors", candidates=2)
    t = load_file(str(tmp_path / "t.safetensors"))
    x, ex = captured["x"], block.experts
    for tok in (0, 7, 39):
        for s in range(2):
            e = int(t["ids"][0, tok, s])
            gate, up = torch.nn.functional.linear(x[tok], ex.gate_up_proj[e]).chunk(2, dim=-1)
            y = torch.nn.functional.linear(ex.act_fn(gate) * up, ex.down_proj[e])
            np.testing.assert_allclose(float(y.detach().norm()), t["out_norms"][0, tok, s], rtol=1e-4)


def test_input_readers_split_documents_and_cap_tokens(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("one two three\n\nfour five\n\n\nsix", encoding="utf-8")

    def tok(s):
        return {"input_ids": [len(w) for w in s.split()]}

    assert capture_routing.read_sequences(text, tok, 2, None) == [[3, 3], [5], [4, 4], [3]]
    assert capture_routing.read_sequences(text, tok, 10, 4) == [[3, 3, 5], [4]]
    jl = tmp_path / "d.jsonl"
    jl.write_text('{"text": "a bb"}\n\n{"text": "ccc", "id": 2}\n', encoding="utf-8")
    assert capture_routing.documents_from_jsonl(jl) == ["a bb", "ccc"]
    jl.write_text('{"text": "a"}\nnot json\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"d.jsonl:2: not JSON"):
        capture_routing.documents_from_jsonl(jl)


def test_dataset_input_reads_a_local_dataset(tmp_path):
    if not os.environ.get("CI"):
        pytest.importorskip("datasets")
    d = tmp_path / "ds"
    d.mkdir()
    (d / "train.jsonl").write_text('{"content": "x y"}\n{"content": "z"}\n', encoding="utf-8")
    assert list(capture_routing.documents_from_dataset(str(d), "content")) == ["x y", "z"]


def test_unsupported_models_get_a_message_that_says_what_to_do(tmp_path):
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**COMMON, intermediate_size=16, num_hidden_layers=1))
    with pytest.raises(ValueError, match="add an Adapter"):
        capture_routing.capture(model, SEQS[:1], tmp_path / "unused.safetensors")
