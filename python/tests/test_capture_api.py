"""moe_offload.capture: the capture script's trace, from a model and a tokenizer, as a Trace.

Needs torch and transformers (the `capture` extra): skipped without them, except when
MOE_OFFLOAD_REQUIRE_TORCH=1 (CI runs this file in its torch environment), where they must import.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import moe_offload as mo

if os.environ.get("MOE_OFFLOAD_REQUIRE_TORCH") == "1":
    import torch
    import transformers
else:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

SCRIPTS = Path(__file__).resolve().parents[1]


class CharTokenizer:
    """A tokenizer of the tiny models' 64-token vocabulary: one id per character."""

    pad_token_id = 0
    eos_token_id = 1

    def __call__(self, text):
        return {"input_ids": [2 + (ord(c) % 62) for c in text]}


def tiny_mixtral():
    torch.manual_seed(0)
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=128, intermediate_size=16, num_hidden_layers=2,
                                     num_local_experts=8, num_experts_per_tok=2)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "gate" in name and p.dim() == 2 and p.shape[0] == 8:
                p.normal_(0.0, 1.0)  # decisive routing
    return model.eval()


def test_capture_returns_the_trace_the_script_writes(tmp_path):
    texts = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs"]
    model, tok = tiny_mixtral(), CharTokenizer()
    t = mo.capture(model, tok, texts, tmp_path / "api.safetensors", candidates=4, max_len=16)
    assert isinstance(t, mo.Trace)
    assert (t.num_layers, t.num_experts, t.top_k, t.candidates) == (2, 8, 2, 4)
    assert t.tokens == sum(len(x) for x in texts)
    sys.path.insert(0, str(SCRIPTS))
    cr = importlib.import_module("capture_routing")
    seqs = cr.tokenize_documents(texts, tok, 16, None)
    cr.capture(model, seqs, tmp_path / "script.safetensors", candidates=4, pad_id=0)
    assert (tmp_path / "api.safetensors").read_bytes() == (tmp_path / "script.safetensors").read_bytes()
    s = mo.open_trace(tmp_path / "script.safetensors")
    for layer in range(t.num_layers):
        assert np.array_equal(t.ids(layer), s.ids(layer))
    assert mo.replay(t, policy="lru", cap=4, warmup=0).picks == t.tokens * 2 * 2


def test_capture_writes_to_a_temporary_directory_by_default():
    t = mo.capture(tiny_mixtral(), CharTokenizer(), "a single text")
    assert Path(t.path).is_file() and t.tokens == len("a single text")
