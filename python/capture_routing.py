#!/usr/bin/env python3
"""Capture a moe-offload routing trace from a Hugging Face MoE model while it reads a text file.

Per MoE layer and token it records the router's top-m candidate ids and logits, the gate weights
the model applied to its k experts, and the L2 norm of each used expert's output (for REAP), in
the trace format of docs/trace-format.md. Per-layer chunks are streamed to raw files in a
temporary directory while the model runs; the safetensors file is assembled from them at the end
(layer-major tensors are the per-layer files concatenated), so memory stays flat in the number of
tokens.

    python python/capture_routing.py --model Qwen/Qwen1.5-MoE-A2.7B --text corpus.txt \
        --candidates 8 --max-tokens 4096 -o trace.safetensors
    moe-offload inspect trace.safetensors

Supported MoE blocks (found by class name, see ADAPTERS): Qwen2-MoE, Qwen3-MoE, Qwen3-Next,
Mixtral, OLMoE, DeepSeek-V2, DeepSeek-V3 and gpt-oss, as implemented in transformers >= 5 (a
router child returning (logits, weights, indices) and an experts child called with the indices
and weights). docs/capture.md explains the choices.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Adapter:
    """Where a MoE block keeps its router and experts, and how its router picks experts.

    selection = "top_logits": the model uses the top-k experts by router logit (softmax or plain
    top-k over logits), so the candidates are the top-m by logit and the scores are logits.
    selection = "chosen_only": the choice is not the top-k by logit (group-limited routing, a
    score-correction bias), so only the k chosen experts are recorded (m = k), ordered by gate,
    with ln(gate) as scores (score_kind log_probs_renormalized).
    """

    family: str
    router: str
    experts: str
    selection: str


ADAPTERS: dict[str, Adapter] = {
    "Qwen2MoeSparseMoeBlock": Adapter("qwen2_moe", "gate", "experts", "top_logits"),
    "Qwen3MoeSparseMoeBlock": Adapter("qwen3_moe", "gate", "experts", "top_logits"),
    "Qwen3NextSparseMoeBlock": Adapter("qwen3_next", "gate", "experts", "top_logits"),
    "MixtralSparseMoeBlock": Adapter("mixtral", "gate", "experts", "top_logits"),
    "OlmoeSparseMoeBlock": Adapter("olmoe", "gate", "experts", "top_logits"),
    # DeepSeek-V2: greedy top-k of the softmax is the top-k by logit; group_limited_greedy is not.
    "DeepseekV2Moe": Adapter("deepseek_v2", "gate", "experts", "top_logits"),
    # DeepSeek-V3: sigmoid scores plus a correction bias, group-limited: never plain top-k by logit.
    "DeepseekV3MoE": Adapter("deepseek_v3", "gate", "experts", "chosen_only"),
    # gpt-oss: top-k over the logits, then a softmax over the k.
    "GptOssMLP": Adapter("gpt_oss", "router", "experts", "top_logits"),
}


def adapter_for(module) -> Adapter | None:
    """The adapter of a module, by class name (None when it is not a supported MoE block)."""
    a = ADAPTERS.get(type(module).__name__)
    if a is None:
        return None
    if a.family == "deepseek_v2" and getattr(getattr(module, a.router), "topk_method", "greedy") != "greedy":
        return Adapter(a.family, a.router, a.experts, "chosen_only")
    return a


def find_moe_blocks(model):
    """[(layer_id, name, block, adapter)] for every supported MoE block, in layer order.

    layer_id is the model's index of the decoder layer holding the block (`...layers.<i>...`).
    """
    found = []
    for name, module in model.named_modules():
        a = adapter_for(module)
        if a is None:
            continue
        parts = name.split(".")
        layer_id = next((int(parts[i + 1]) for i, p in enumerate(parts[:-1]) if p == "layers" and parts[i + 1].isdigit()), len(found))
        found.append((layer_id, name, module, a))
    found.sort(key=lambda x: x[0])
    return found


def order_rows(logits: np.ndarray, chosen: np.ndarray, weights: np.ndarray, k: int, m: int, selection: str):
    """Per token: candidate ids, scores and the gates of the first k, as the trace stores them.

    logits [T, E] float32, chosen [T, k] ids the model used, weights [T, k] their applied gates.
    Returns ids [T, m] uint16, scores [T, m] float32, gates [T, k] float32.
    """
    t = logits.shape[0]
    if selection == "top_logits":
        # Descending logit, ties: lower id first (a stable sort of the negated logits).
        order = np.argsort(-logits, axis=-1, kind="stable")[:, :m]
        scores = np.take_along_axis(logits, order, axis=-1)
        top = np.sort(order[:, :k], axis=-1)
        if not np.array_equal(top, np.sort(chosen, axis=-1)):
            bad = int(np.nonzero((top != np.sort(chosen, axis=-1)).any(-1))[0][0])
            raise ValueError(
                f"token {bad}: the model used experts {sorted(chosen[bad].tolist())}, not the top-{k} by logit "
                f"{sorted(order[bad, :k].tolist())}: this router is not plain top-k (use selection chosen_only)"
            )
        # Gates follow the ids' order.
        pos = np.argsort(chosen, axis=-1)
        sorted_ids = np.take_along_axis(chosen, pos, axis=-1)
        sorted_w = np.take_along_axis(weights, pos, axis=-1)
        idx = np.stack([np.searchsorted(sorted_ids[i], order[i, :k]) for i in range(t)]) if t else np.zeros((0, k), np.int64)
        gates = np.take_along_axis(sorted_w, idx, axis=-1)
        return order.astype(np.uint16), scores.astype(np.float32), gates.astype(np.float32)
    # chosen_only: the k used experts by gate (descending, ties: lower id), ln(gate) as scores.
    w = weights.astype(np.float64)
    keys = np.lexsort((chosen, -w), axis=-1) if t else np.zeros((0, k), np.int64)
    ids = np.take_along_axis(chosen, keys, axis=-1)
    gates = np.take_along_axis(w, keys, axis=-1)
    scores = np.log(np.maximum(gates, np.finfo(np.float32).tiny))
    return ids.astype(np.uint16), scores.astype(np.float32), gates.astype(np.float32)


class LayerSink:
    """Raw per-layer files a layer's rows are appended to while the model runs."""

    def __init__(self, directory: Path, index: int):
        self.paths = {n: directory / f"layer{index:04d}.{n}" for n in ("ids", "scores", "gates", "out_norms")}
        self.files = {n: open(p, "wb") for n, p in self.paths.items()}
        self.tokens = 0

    def append(self, ids, scores, gates, norms):
        self.files["ids"].write(np.ascontiguousarray(ids, dtype="<u2").tobytes())
        self.files["scores"].write(np.ascontiguousarray(scores, dtype="<f4").tobytes())
        self.files["gates"].write(np.ascontiguousarray(gates, dtype="<f4").tobytes())
        self.files["out_norms"].write(np.ascontiguousarray(norms, dtype="<f4").tobytes())
        self.tokens += ids.shape[0]

    def close(self):
        for f in self.files.values():
            f.close()


class Recorder:
    """Forward hooks on every MoE block's router and experts; one LayerSink per block."""

    def __init__(self, model, directory: Path, candidates: int | None, norms: bool = True):
        import torch

        self.torch = torch
        self.blocks = find_moe_blocks(model)
        if not self.blocks:
            names = sorted({type(m).__name__ for m in model.modules() if "moe" in type(m).__name__.lower() or "mlp" in type(m).__name__.lower()})
            raise ValueError(
                f"no supported MoE block in {type(model).__name__} (supported: {', '.join(sorted(ADAPTERS))}; "
                f"MoE-like modules found: {', '.join(names) or 'none'}): add an Adapter for it in ADAPTERS"
            )
        self.selection = {a.selection for _, _, _, a in self.blocks}
        if len(self.selection) != 1:
            raise ValueError(f"MoE blocks with different routing kinds in one model: {self.selection}")
        self.selection = self.selection.pop()
        first = self.blocks[0][2]
        router = getattr(first, self.blocks[0][3].router)
        self.top_k = int(router.top_k)
        self.num_experts = int(getattr(router, "num_experts", None) or router.weight.shape[0])
        if self.num_experts > 65536:
            raise ValueError(f"{self.num_experts} experts: the trace format's ids are 16-bit (at most 65536)")
        if self.selection == "chosen_only":
            self.m = self.top_k
        else:
            self.m = min(candidates or self.top_k, self.num_experts)
            if self.m < self.top_k:
                raise ValueError(f"--candidates {self.m} < top-k {self.top_k}: use --candidates {self.top_k} or more")
        self.norms = norms
        self.sinks = [LayerSink(directory, i) for i in range(len(self.blocks))]
        self.pending: dict[int, np.ndarray] = {}
        self.in_norm_pass = False
        self.handles = []
        for i, (_, _, block, a) in enumerate(self.blocks):
            self.handles.append(getattr(block, a.router).register_forward_hook(self._router_hook(i)))
            self.handles.append(getattr(block, a.experts).register_forward_hook(self._experts_hook(i)))

    def _router_hook(self, i):
        def hook(_module, _inputs, output):
            logits = output[0]
            self.pending[i] = logits.detach().float().reshape(-1, logits.shape[-1]).cpu().numpy()

        return hook

    def _experts_hook(self, i):
        torch = self.torch

        def hook(module, inputs, _output):
            if self.in_norm_pass:
                return
            hidden, indices, weights = inputs[0], inputs[1], inputs[2]
            hidden = hidden.reshape(-1, hidden.shape[-1])
            idx = indices.reshape(hidden.shape[0], -1)
            w = weights.reshape(hidden.shape[0], -1)
            if w.shape[-1] != idx.shape[-1]:
                # A dense [T, E] weight matrix: gather the used experts' weights.
                w = torch.gather(w, -1, idx.long())
            logits = self.pending.pop(i)
            chosen = idx.detach().cpu().numpy().astype(np.int64)
            gates = w.detach().float().cpu().numpy()
            ids, scores, gates = order_rows(logits, chosen, gates, self.top_k, self.m, self.selection)
            norms = np.zeros((ids.shape[0], self.top_k), dtype=np.float32)
            if self.norms:
                # Each used expert's own output: the experts module once per slot, with weight 1.
                self.in_norm_pass = True
                try:
                    with torch.no_grad():
                        order = torch.from_numpy(ids[:, : self.top_k].astype(np.int64)).to(idx.device)
                        ones = torch.ones((hidden.shape[0], 1), dtype=w.dtype, device=w.device)
                        for s in range(self.top_k):
                            out = module(hidden, order[:, s : s + 1].to(idx.dtype), ones)
                            norms[:, s] = out.reshape(hidden.shape[0], -1).float().norm(dim=-1).cpu().numpy()
                finally:
                    self.in_norm_pass = False
            self.sinks[i].append(ids, scores, gates, norms)

        return hook

    def close(self):
        for h in self.handles:
            h.remove()
        for s in self.sinks:
            s.close()


def write_trace(path: Path, rec: Recorder, seq_offsets: list[int], metadata: dict[str, str]):
    """Assembles the safetensors file from the per-layer raw files, streaming, atomically."""
    tokens = {s.tokens for s in rec.sinks}
    if len(tokens) != 1:
        raise RuntimeError(f"layers saw different token counts {sorted(tokens)}: a block was skipped")
    t = tokens.pop()
    n_layers, m, k = len(rec.sinks), rec.m, rec.top_k
    tensors = [
        ("seq_offsets", "U64", [len(seq_offsets)], 8 * len(seq_offsets)),
        ("scores", "F32", [n_layers, t, m], 4 * n_layers * t * m),
        ("gates", "F32", [n_layers, t, k], 4 * n_layers * t * k),
        ("out_norms", "F32", [n_layers, t, k], 4 * n_layers * t * k),
        ("ids", "U16", [n_layers, t, m], 2 * n_layers * t * m),
    ]
    if not rec.norms:
        tensors = [x for x in tensors if x[0] != "out_norms"]
    header, offset = {}, 0
    for name, dtype, shape, size in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent if str(path.parent) else ".", prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(struct.pack("<Q", len(text)))
            out.write(text)
            out.write(np.asarray(seq_offsets, dtype="<u8").tobytes())
            for name, *_ in tensors[1:]:
                for sink in rec.sinks:
                    with open(sink.paths[name], "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def capture(model, sequences, output, *, candidates=None, model_name="", source="", norms=True):
    """Runs `model` on each token-id sequence (a list of lists of ints, one forward each, in
    order) and writes the trace to `output`. Returns the trace's shape (layers, tokens, m, k)."""
    import torch

    sequences = [list(s) for s in sequences if len(s) > 0]
    if not sequences:
        raise ValueError("no tokens to run: the text is empty")
    model.eval()
    with tempfile.TemporaryDirectory(prefix="moe-capture-") as tmp:
        rec = Recorder(model, Path(tmp), candidates, norms=norms)
        seq_offsets, n = [], 0
        try:
            with torch.no_grad():
                device = next(model.parameters()).device
                for s in sequences:
                    seq_offsets.append(n)
                    model(input_ids=torch.tensor([s], device=device), use_cache=False)
                    n += len(s)
        finally:
            rec.close()
        metadata = {
            "format": "moe-offload-trace",
            "format_version": "1",
            "model": model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
            "num_experts": str(rec.num_experts),
            "top_k": str(rec.top_k),
            "layer_ids": json.dumps([b[0] for b in rec.blocks]),
            "score_kind": "logits" if rec.selection == "top_logits" else "log_probs_renormalized",
            "phase": "prefill",
            "source": source or "python/capture_routing.py",
            "architecture": rec.blocks[0][3].family,
            "moe_blocks": type(rec.blocks[0][2]).__name__,
        }
        write_trace(Path(output), rec, seq_offsets, metadata)
        return len(rec.blocks), n, rec.m, rec.top_k


def read_sequences(text_path, tokenizer, max_len: int, max_tokens: int | None):
    """Token ids of the text: one sequence per paragraph (blank-line separated), split into
    chunks of at most max_len tokens, up to max_tokens in all."""
    text = Path(text_path).read_text(encoding="utf-8")
    out, total = [], 0
    for para in (p.strip() for p in text.split("\n\n")):
        if not para:
            continue
        ids = tokenizer(para)["input_ids"]
        for i in range(0, len(ids), max_len):
            chunk = ids[i : i + max_len]
            if max_tokens is not None:
                chunk = chunk[: max(0, max_tokens - total)]
            if chunk:
                out.append(chunk)
                total += len(chunk)
        if max_tokens is not None and total >= max_tokens:
            break
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model id or local directory")
    p.add_argument("--text", required=True, help="UTF-8 text file; paragraphs (blank-line separated) are sequences")
    p.add_argument("-o", "--output", required=True, help="output trace (.safetensors)")
    p.add_argument("--candidates", type=int, default=None, help="router candidates m recorded per token (default: top-k)")
    p.add_argument("--max-len", type=int, default=2048, help="longest sequence per forward pass (default 2048)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many tokens")
    p.add_argument("--dtype", default="bfloat16", help="torch dtype to load the model in (default bfloat16)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--no-norms", action="store_true", help="skip expert output norms (no REAP; faster)")
    a = p.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype)).to(a.device)
    seqs = read_sequences(a.text, tok, a.max_len, a.max_tokens)
    shape = capture(
        model, seqs, a.output, candidates=a.candidates, model_name=a.model,
        source=f"capture_routing.py on {Path(a.text).name}", norms=not a.no_norms,
    )
    print(f"wrote {a.output}: {shape[0]} MoE layers x {shape[1]} tokens, {shape[2]} candidates, top-{shape[3]}")
    print(f"next: moe-offload inspect {a.output}")


if __name__ == "__main__":
    main()
