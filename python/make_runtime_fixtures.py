"""Writes the runtime fixtures of crates/trace-io/tests/data/: SGLang expert-distribution dumps
(sglang/*.pt) and the routed experts SGLang and vLLM return with responses (routed/*.json*).

Each .pt file is what SGLang's `per_token` recorder dumps (`--expert-distribution-recorder-mode
per_token`, then POST /dump_expert_distribution_record), built by the code path the recorder runs
(python/sglang/srt/eplb/expert_distribution.py, read at the version quoted in docs/importers.md):

- `_DetailSinglePassGatherer`: a buffer `topk_ids_of_layer` int32 `[num_layers, chunk * 8, 8]`
  (`_TOP_K_NUM = 8` columns whatever the model's top-k), reset to -1 before every forward pass;
  `on_select_experts(layer, topk_ids)` writes `buf[layer, :n, :k] = topk_ids`; `collect()` returns
  the pass's `input_ids`, `positions`, `extend_seq_lens` (a list, None in decode),
  `forward_mode` (the ForwardMode enum's value: 1 extend, 2 decode, 3 mixed, 4 idle),
  `topk_ids_of_layer[:, :num_tokens, :].clone()`, `misc_objects` and `global_physical_count`;
- `_DetailAccumulator.append`: one record per forward pass, with `forward_pass_id`, `rank`,
  `gatherer_key`; `dump()`: `torch.save({"records": [...], "last_physical_to_logical_map": map})`.

Dense layers (DeepSeek's first_k_dense_replace) are never written, so they stay -1. With EPLB
redundancy the ids are physical slots; `last_physical_to_logical_map` is `[num_layers,
num_physical_experts]` (int64 here, as SGLang builds it from torch.arange).

Routed experts (`return_routed_experts`): SGLang's /generate puts
`pybase64.b64encode(tensor.numpy().tobytes())` of its int32 `[tokens, num_hidden_layers, top_k]`
capture buffer (zeros where never written: dense layers) in `meta_info["routed_experts"]`, the
OpenAI API the same in `choices[i].sglext.routed_experts`; vLLM puts base64 of `np.save` bytes in
`choices[i].routed_experts` (older versions: nested lists, the prompt's rows apart in
`prompt_routed_experts`). Rows: prompt + completion - 1 (the last sampled token is never forwarded).

Run: ~/.cache/moe-offload/venv/bin/python python/make_runtime_fixtures.py crates/trace-io/tests/data
"""

import base64
import io
import json
import sys
from pathlib import Path

import torch

TOP_K_NUM = 8  # SGLang's _DetailSinglePassGatherer._TOP_K_NUM
EXTEND, DECODE, MIXED, IDLE = 1, 2, 3, 4


class Gatherer:
    """SGLang's _DetailSinglePassGatherer over a fake model (the hooks it receives)."""

    def __init__(self, num_layers, max_tokens, dtype=torch.int32):
        self.buf = torch.zeros((num_layers, max_tokens, TOP_K_NUM), dtype=dtype)
        self.num_physical = None

    def forward_pass(self, pass_id, input_ids, positions, extend_seq_lens, mode, topk_of_layer):
        # reset(), on_forward_pass_start(), on_select_experts() per MoE layer, collect()
        self.buf[...] = -1
        meta = dict(input_ids=input_ids, positions=positions, extend_seq_lens=extend_seq_lens, forward_mode=mode)
        for layer, topk in topk_of_layer.items():
            t = torch.tensor(topk, dtype=torch.int32)
            self.buf[layer, : t.shape[0], : t.shape[1]] = t
        n = len(input_ids)
        count = torch.zeros((self.buf.shape[0], self.num_physical), dtype=torch.int32)
        for layer in range(self.buf.shape[0]):
            for x in self.buf[layer, :n].flatten().tolist():
                if x >= 0 and x < self.num_physical:
                    count[layer, x] += 1
        return dict(
            forward_pass_id=pass_id,
            rank=0,
            gatherer_key="primary",
            **meta,
            topk_ids_of_layer=self.buf[:, :n, :].clone().cpu(),
            misc_objects=[],
            global_physical_count=count,
        )


def identity_map(num_layers, e):
    return torch.arange(e, dtype=torch.int64).repeat(num_layers, 1)


def basic(out):
    """3 layers (layer 0 dense), E = 4, top-2. Pass 0: prefill of two prompts (3 + 2 tokens);
    pass 1: decode of both (positions 3 and 2); pass 2: idle."""
    g = Gatherer(3, 16)
    g.num_physical = 4
    r0 = g.forward_pass(
        0, [11, 12, 13, 21, 22], [0, 1, 2, 0, 1], [3, 2], EXTEND,
        {1: [[0, 1], [2, 3], [1, 2], [3, 0], [0, 2]], 2: [[3, 2], [1, 0], [0, 3], [2, 1], [1, 3]]},
    )
    r1 = g.forward_pass(1, [14, 23], [3, 2], None, DECODE, {1: [[1, 0], [2, 1]], 2: [[0, 1], [3, 2]]})
    r2 = g.forward_pass(2, [], [], None, IDLE, {})
    torch.save({"records": [r0, r1, r2], "last_physical_to_logical_map": identity_map(3, 4)}, out / "basic.pt")


def eplb(out):
    """2 layers, E = 3 logical experts on 4 physical slots (slot 3 replicates expert 0 in layer 0,
    expert 2 in layer 1), top-2; one prefill pass of 3 tokens whose ids are physical slots."""
    g = Gatherer(2, 8)
    g.num_physical = 4
    phys_to_log = torch.tensor([[0, 1, 2, 0], [0, 1, 2, 2]], dtype=torch.int64)
    r0 = g.forward_pass(0, [5, 6, 7], [0, 1, 2], [3], EXTEND, {0: [[3, 1], [0, 2], [2, 3]], 1: [[3, 0], [1, 2], [0, 1]]})
    torch.save({"records": [r0], "last_physical_to_logical_map": phys_to_log}, out / "eplb.pt")


def padded(out):
    """2 layers, E = 4, top-2; a prefill pass of 3 tokens whose second token is padding (-1 in
    every layer, as SGLang masks padded tokens), then a chunked-prefill pass continuing the prompt
    (positions 3, 4) with a new prompt (position 0) in a mixed pass."""
    g = Gatherer(2, 8)
    g.num_physical = 4
    r0 = g.forward_pass(0, [1, 0, 2], [0, 0, 1], [1, 2], EXTEND, {0: [[0, 1], [-1, -1], [2, 3]], 1: [[1, 0], [-1, -1], [3, 2]]})
    r1 = g.forward_pass(1, [3, 4, 9], [2, 3, 0], [2, 1], MIXED, {0: [[1, 2], [0, 3], [2, 0]], 1: [[2, 1], [3, 0], [0, 2]]})
    torch.save({"records": [r0, r1], "last_physical_to_logical_map": identity_map(2, 4)}, out / "padded.pt")


def hostile(out):
    """Small dumps the importer must refuse or warn about."""
    g = Gatherer(2, 8)
    g.num_physical = 4
    ok = lambda: g.forward_pass(0, [1, 2], [0, 1], [2], EXTEND, {0: [[0, 1], [2, 3]], 1: [[1, 0], [3, 2]]})
    m = identity_map(2, 4)
    # every row -1
    r = g.forward_pass(0, [1, 2], [0, 1], [2], EXTEND, {})
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "all_padding.pt")
    # an id past the map (physical slot 7 of 4)
    r = g.forward_pass(0, [1, 2], [0, 1], [2], EXTEND, {0: [[0, 7], [2, 3]], 1: [[1, 0], [3, 2]]})
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "id_out_of_range.pt")
    # mixed k: one row with a single id
    r = g.forward_pass(0, [1, 2], [0, 1], [2], EXTEND, {0: [[0, 1], [2, -1]], 1: [[1, 0], [3, 2]]})
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "mixed_k.pt")
    # wrong dtype: float ids
    r = ok()
    r["topk_ids_of_layer"] = r["topk_ids_of_layer"].float()
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "float_ids.pt")
    # keys the importer does not know, and none it needs missing
    r = ok()
    r["rids"] = ["a"]
    torch.save({"records": [r], "last_physical_to_logical_map": m, "note": "x"}, out / "unknown_keys.pt")
    # a record without topk_ids_of_layer
    r = ok()
    del r["topk_ids_of_layer"]
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "missing_topk.pt")
    # extend_seq_lens that do not add up to the tokens
    r = ok()
    r["extend_seq_lens"] = [3]
    torch.save({"records": [r], "last_physical_to_logical_map": m}, out / "bad_seq_lens.pt")
    # a stat-mode dump (logical_count only), not per_token
    torch.save({"rank": 0, "logical_count": torch.zeros((1, 2, 4), dtype=torch.int32)}, out / "stat_mode.pt")


def routed(out):
    """SGLang /generate (a batch: a list of 2 responses) and vLLM chat completions (JSON Lines)."""
    import numpy as np

    def sglang_response(rows, prompt, completion):
        buf = torch.zeros((len(rows), 3, 2), dtype=torch.int32)  # layer 0 dense: never written
        for t, (a, b) in enumerate(rows):
            buf[t, 1], buf[t, 2] = torch.tensor(a), torch.tensor(b)
        return {
            "text": "...",
            "output_ids": list(range(completion)),
            "meta_info": {
                "id": "x",
                "finish_reason": {"type": "length", "length": completion},
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "cached_tokens": 0,
                "routed_experts": base64.b64encode(buf.numpy().tobytes()).decode("utf-8"),
            },
        }

    a = sglang_response([([0, 1], [2, 3]), ([1, 2], [3, 0]), ([2, 3], [0, 1]), ([3, 0], [1, 2])], 3, 2)
    b = sglang_response([([1, 0], [0, 2]), ([0, 3], [2, 1])], 2, 1)
    (out / "sglang_generate.json").write_text(json.dumps([a, b], indent=1))

    def npy_b64(arr):
        f = io.BytesIO()
        np.save(f, arr)
        return base64.b64encode(f.getvalue()).decode("ascii")

    current = np.array([[[0, 1], [2, 3]], [[1, 2], [3, 0]], [[2, 3], [0, 1]], [[3, 0], [1, 2]]], dtype=np.uint8)
    r1 = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "tiny-moe",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "abc"}, "finish_reason": "length",
                     "token_ids": [7, 8, 9], "routed_experts": npy_b64(current)}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5},
        "prompt_token_ids": [5, 6],
    }
    r2 = {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "model": "tiny-moe",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "d"}, "finish_reason": "length",
                     "routed_experts": [[[3, 2], [1, 0]]]}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4},
        "prompt_routed_experts": [[[0, 2], [1, 3]], [[2, 0], [3, 1]]],
    }
    (out / "vllm_chat.jsonl").write_text(json.dumps(r1) + "\n" + json.dumps(r2) + "\n")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    (out / "sglang").mkdir(parents=True, exist_ok=True)
    (out / "routed").mkdir(parents=True, exist_ok=True)
    for f in (basic, eplb, padded, hostile):
        f(out / "sglang")
    routed(out / "routed")
