"""Tests of capture_routing.py on tiny randomly initialized MoE models (no download).

Run: `pytest python/test_capture.py` (needs numpy, safetensors, torch and transformers >= 5;
skipped otherwise). The trace is checked against the model's own router outputs, opened with
`moe-offload inspect` and compared with `moe-offload stats` (binary from MOE_OFFLOAD_BIN, else
target/{debug,release}/moe-offload; those two checks skip when it is not built).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

np = pytest.importorskip("numpy")
pytest.importorskip("safetensors")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(Path(__file__).parent))
import capture_routing  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
COMMON = dict(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def configs():
    """Tiny configs of every supported architecture: (name, config, expected m)."""
    t = transformers
    out = []
    out.append(("qwen2_moe", t.Qwen2MoeConfig(**COMMON, intermediate_size=48, moe_intermediate_size=16,
                                              shared_expert_intermediate_size=16, num_hidden_layers=2,
                                              num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1), 4))
    out.append(("qwen3_moe", t.Qwen3MoeConfig(**COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=16,
                                              num_hidden_layers=2, num_experts=8, num_experts_per_tok=2,
                                              decoder_sparse_step=1, norm_topk_prob=True), 4))
    out.append(("qwen3_next", t.Qwen3NextConfig(**COMMON, head_dim=8, intermediate_size=48, moe_intermediate_size=16,
                                                shared_expert_intermediate_size=16, num_hidden_layers=2,
                                                num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1,
                                                linear_num_value_heads=2, linear_num_key_heads=2,
                                                linear_key_head_dim=8, linear_value_head_dim=8,
                                                layer_types=["linear_attention", "full_attention"]), 4))
    out.append(("mixtral", t.MixtralConfig(**COMMON, intermediate_size=16, num_hidden_layers=2,
                                           num_local_experts=8, num_experts_per_tok=2), 4))
    out.append(("olmoe", t.OlmoeConfig(**COMMON, intermediate_size=16, num_hidden_layers=2, num_experts=8,
                                       num_experts_per_tok=2), 4))
    mla = dict(num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    out.append(("deepseek_v2", t.DeepseekV2Config(**{**COMMON, **mla}, intermediate_size=48, moe_intermediate_size=16,
                                                  num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                                                  n_shared_experts=1, num_experts_per_tok=2, topk_method="greedy",
                                                  n_group=1, topk_group=1), 4))
    out.append(("deepseek_v3", t.DeepseekV3Config(**{**COMMON, **mla}, intermediate_size=48, moe_intermediate_size=16,
                                                  num_hidden_layers=3, first_k_dense_replace=1, n_routed_experts=8,
                                                  n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                                                  topk_group=1, norm_topk_prob=True), 2))
    out.append(("gpt_oss", t.GptOssConfig(**COMMON, head_dim=8, intermediate_size=16, num_hidden_layers=2,
                                          num_local_experts=8, num_experts_per_tok=2, sliding_window=16,
                                          layer_types=["sliding_attention", "full_attention"]), 4))
    return out


CONFIGS = configs()


def build(config):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    # Randomly initialized routers are near-uniform; widen them so routing is decisive.
    with torch.no_grad():
        for _, _, block, a in capture_routing.find_moe_blocks(model):
            r = getattr(block, a.router)
            r.weight.normal_(0.0, 1.0)
            if a.family == "deepseek_v3":
                r.e_score_correction_bias.normal_(0.0, 0.1)
    return model.float().eval()


def moe_offload():
    exe = os.environ.get("MOE_OFFLOAD_BIN")
    if exe:
        return exe
    for p in (ROOT / "target/debug/moe-offload", ROOT / "target/release/moe-offload"):
        if p.is_file():
            return str(p)
    return None


SEQS = [[(7 * i + 3 * j) % 64 for i in range(40)] for j in range(3)] + [[5, 9, 1]]


@pytest.mark.parametrize("name,config,m", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_capture_matches_the_model_and_moe_offload(tmp_path, name, config, m):
    model = build(config)
    out = tmp_path / "trace.safetensors"
    layers, tokens, m_got, k = capture_routing.capture(model, SEQS, out, candidates=4, model_name=name)
    assert (tokens, m_got, k) == (sum(map(len, SEQS)), m, 2)

    t = load_file(str(out))
    from safetensors import safe_open

    with safe_open(str(out), "np") as f:
        meta = f.metadata()
    for key in ("format", "format_version", "model", "num_experts", "top_k", "layer_ids", "score_kind", "phase", "source"):
        assert key in meta, key
    assert meta["format"] == "moe-offload-trace" and meta["num_experts"] == "8" and meta["top_k"] == "2"
    layer_ids = json.loads(meta["layer_ids"])
    assert len(layer_ids) == layers == t["ids"].shape[0]
    assert t["ids"].shape == (layers, tokens, m) and t["gates"].shape == (layers, tokens, 2)
    assert list(t["seq_offsets"]) == [0, 40, 80, 120]
    assert np.all(np.diff(t["scores"], axis=-1) <= 0), "scores must be non-increasing along a row"
    assert np.all(t["out_norms"] > 0)

    # The model's own router outputs, recomputed independently of the hooks' ordering code.
    blocks = capture_routing.find_moe_blocks(model)
    seen = {i: [] for i in range(len(blocks))}
    handles = []
    for i, (_, _, block, a) in enumerate(blocks):
        handles.append(getattr(block, a.router).register_forward_hook(
            lambda _m, _i, o, i=i: seen[i].append([x.detach().float().reshape(-1, x.shape[-1]).numpy() for x in o])))
    with torch.no_grad():
        for s in SEQS:
            model(input_ids=torch.tensor([s]), use_cache=False)
    for h in handles:
        h.remove()
    for li in range(layers):
        logits = np.concatenate([o[0] for o in seen[li]])
        weights = np.concatenate([o[1] for o in seen[li]])
        chosen = np.concatenate([o[2] for o in seen[li]]).astype(np.int64)
        ids = t["ids"][li].astype(np.int64)
        assert np.array_equal(np.sort(ids[:, :2], -1), np.sort(chosen, -1)), "the first k ids are the used experts"
        # Each recorded gate is the weight the model applied to that expert.
        for tok in range(tokens):
            w = dict(zip(chosen[tok].tolist(), weights[tok].tolist()))
            np.testing.assert_allclose([w[e] for e in ids[tok, :2]], t["gates"][li, tok], rtol=1e-6)
        if meta["score_kind"] == "logits":
            want = np.argsort(-logits, axis=-1, kind="stable")[:, :m]
            assert np.array_equal(ids, want)
            np.testing.assert_allclose(t["scores"][li], np.take_along_axis(logits, want, -1), rtol=1e-6)

    exe = moe_offload()
    if exe is None:
        pytest.skip("moe-offload is not built (cargo build -p cli, or set MOE_OFFLOAD_BIN)")
    subprocess.run([exe, "inspect", str(out)], check=True, capture_output=True)
    stats_path = tmp_path / "stats.json"
    subprocess.run([exe, "stats", str(out), "-o", str(stats_path)], check=True, capture_output=True)
    stats = json.loads(stats_path.read_text())
    assert stats["meta"]["layer_ids"] == layer_ids
    for li, layer in enumerate(stats["layers"]):
        ids = t["ids"][li, :, :2].astype(np.int64).ravel()
        g = t["gates"][li].astype(np.float64).ravel()
        n = t["out_norms"][li].astype(np.float64).ravel()
        assert layer["tokens"] == tokens
        np.testing.assert_array_equal(layer["count"], np.bincount(ids, minlength=8))
        np.testing.assert_allclose(layer["gate_sum"], np.bincount(ids, weights=g, minlength=8), rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(layer["ean_sum"], np.bincount(ids, weights=n, minlength=8), rtol=1e-5, atol=1e-9)
        np.testing.assert_allclose(layer["reap_sum"], np.bincount(ids, weights=g * n, minlength=8), rtol=1e-5, atol=1e-9)


def test_norms_are_each_experts_own_output():
    """The norm of slot s is ||expert(x)|| for that expert alone, computed here by hand for Mixtral."""
    name, config, _ = CONFIGS[3]
    model = build(config)
    captured = {}
    block = capture_routing.find_moe_blocks(model)[0][2]

    def keep_input(_module, inputs):
        captured.setdefault("x", inputs[0].detach().reshape(-1, 32))

    block.register_forward_pre_hook(keep_input)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "t.safetensors"
        capture_routing.capture(model, SEQS[:1], out, candidates=2)
        t = load_file(str(out))
    x = captured["x"]
    ex = block.experts
    for tok in (0, 7, 39):
        for s in range(2):
            e = int(t["ids"][0, tok, s])
            gate, up = torch.nn.functional.linear(x[tok], ex.gate_up_proj[e]).chunk(2, dim=-1)
            y = torch.nn.functional.linear(ex.act_fn(gate) * up, ex.down_proj[e])
            np.testing.assert_allclose(float(y.detach().norm()), t["out_norms"][0, tok, s], rtol=1e-4)


def test_read_sequences_splits_paragraphs_and_caps_tokens(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("one two three\n\nfour five\n\n\nsix", encoding="utf-8")

    def tok(s):
        return {"input_ids": [len(w) for w in s.split()]}

    assert capture_routing.read_sequences(text, tok, 2, None) == [[3, 3], [5], [4, 4], [3]]
    assert capture_routing.read_sequences(text, tok, 10, 4) == [[3, 3, 5], [4]]


def test_unsupported_models_get_a_message_that_says_what_to_do():
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**COMMON, intermediate_size=16, num_hidden_layers=1))
    with pytest.raises(ValueError, match="add an Adapter"):
        capture_routing.capture(model, SEQS[:1], "unused.safetensors")
