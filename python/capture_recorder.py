"""Forward hooks that turn a running Hugging Face MoE model into trace rows, and the trace writer.

The hooks sit on every supported MoE block's router and experts child (capture_rows.ADAPTERS).
Each layer's rows are appended to raw per-layer files while the model runs; write_trace
assembles the safetensors file from them at the end (layer-major tensors are the per-layer files
concatenated), so memory stays flat in the number of tokens.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import numpy as np

from capture_rows import ADAPTERS, RoutingMismatch, find_moe_blocks, lookahead_rows, order_rows

TENSORS = ("ids", "scores", "gates", "out_norms", "lookahead_ids")


class LayerSink:
    """Raw per-layer files one layer's rows of one output trace are appended to."""

    def __init__(self, directory: Path, tag: str, index: int, names):
        self.paths = {n: directory / f"{tag}.layer{index:04d}.{n}" for n in names}
        self.files = {n: open(p, "wb") for n, p in self.paths.items()}
        self.tokens = 0
        self.tied = 0

    def append(self, **arrays):
        dtypes = {"ids": "<u2", "lookahead_ids": "<u2"}
        for name, a in arrays.items():
            if name in self.files:
                self.files[name].write(np.ascontiguousarray(a, dtype=dtypes.get(name, "<f4")).tobytes())
        self.tokens += arrays["ids"].shape[0]

    def close(self):
        for f in self.files.values():
            f.close()


class Output:
    """One trace file being recorded: a LayerSink per MoE layer."""

    def __init__(self, directory: Path, tag: str, layers: int, names):
        self.sinks = [LayerSink(directory, tag, i, names) for i in range(layers)]

    @property
    def tokens(self) -> int:
        counts = {s.tokens for s in self.sinks}
        if len(counts) != 1:
            raise RuntimeError(f"layers saw different token counts {sorted(counts)}: a block was skipped")
        return counts.pop()

    def close(self):
        for s in self.sinks:
            s.close()


class Recorder:
    """Forward hooks on every MoE block's router and experts.

    Before each forward pass the driver calls `begin(output, keep)`: the rows of that pass go to
    `output` (None: recorded nowhere), and `keep` ([rows] bool, the flattened attention mask, or
    None for all) says which of the flattened [batch * sequence] rows are real tokens.
    """

    def __init__(self, model, directory: Path, candidates: int | None, norms: bool = True, lookahead: int = 0):
        import torch

        self.torch = torch
        self.directory = directory
        self.blocks = find_moe_blocks(model)
        if not self.blocks:
            names = sorted({type(m).__name__ for m in model.modules()
                            if "moe" in type(m).__name__.lower() or "mlp" in type(m).__name__.lower()})
            raise ValueError(
                f"no supported MoE block in {type(model).__name__} (supported: {', '.join(sorted(ADAPTERS))}; "
                f"MoE-like modules found: {', '.join(names) or 'none'}): add an Adapter for it in ADAPTERS"
            )
        kinds = {a.selection for _, _, _, a in self.blocks}
        if len(kinds) != 1:
            raise ValueError(f"MoE blocks with different routing kinds in one model: {kinds}")
        self.selection = kinds.pop()
        router = getattr(self.blocks[0][2], self.blocks[0][3].router)
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
        limit = self.top_k if self.selection == "chosen_only" else self.num_experts
        if lookahead > limit:
            raise ValueError(f"--lookahead {lookahead} > {limit}, the most ids this router ranks")
        self.lookahead = lookahead
        self.norms = norms
        self.names = [n for n in TENSORS if (n != "out_norms" or norms) and (n != "lookahead_ids" or lookahead)]
        self.target: Output | None = None
        self.keep = None
        self.pending: dict[int, object] = {}
        self.inputs: dict[int, object] = {}
        self.busy = False
        self.handles = []
        for i, (_, name, block, a) in enumerate(self.blocks):
            r = getattr(block, a.router)
            self.handles.append(r.register_forward_hook(self._router_hook(i)))
            self.handles.append(getattr(block, a.experts).register_forward_hook(self._experts_hook(i)))
            if lookahead:
                self.handles.append(r.register_forward_pre_hook(self._stash(i)))
        if lookahead:
            # The first MoE layer has no previous one: its decoder layer's input, through that
            # layer's post-attention norm, is the earliest hidden state a runtime has for it.
            name = self.blocks[0][1]
            layer = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else model
            self.first_norm = getattr(layer, "post_attention_layernorm", None)
            self.handles.append(layer.register_forward_pre_hook(self._stash_first, with_kwargs=True))

    def output(self, tag: str) -> Output:
        """A new output trace recorded under `tag` (a file-name prefix in the scratch directory)."""
        return Output(self.directory, tag, len(self.blocks), self.names)

    def begin(self, target: Output | None, keep=None):
        """Where the rows of the next forward pass go, and which flattened rows are real (see class doc)."""
        self.target, self.keep = target, keep
        self.pending.clear()
        self.inputs.clear()

    def _stash(self, i):
        def hook(_module, inputs):
            if not self.busy and self.target is not None:
                self.inputs[i] = inputs[0].reshape(-1, inputs[0].shape[-1])

        return hook

    def _stash_first(self, _module, args, kwargs):
        if self.busy or self.target is None:
            return
        h = args[0] if args else kwargs["hidden_states"]
        self.busy = True
        try:
            with self.torch.no_grad():
                h = self.first_norm(h) if self.first_norm is not None else h
        finally:
            self.busy = False
        self.inputs[-1] = h.reshape(-1, h.shape[-1])

    def _router_hook(self, i):
        def hook(_module, _inputs, output):
            if not self.busy and self.target is not None:
                self.pending[i] = output[0].detach()

        return hook

    def _select(self, x):
        if self.keep is None:
            return x
        return x[self.keep.to(x.device)]

    def _rows(self, i, logits, idx, w):
        """Trace rows of layer index i from the kept rows of its router's outputs."""
        torch = self.torch
        a = self.blocks[i][3]
        ranked = None
        if a.selection == "top_logits":
            ranked = torch.softmax(logits.float(), dim=-1) if a.ranking == "softmax" else logits.float()
            ranked = ranked.cpu().numpy()
        if w.shape[-1] != idx.shape[-1]:
            # A dense [T, E] weight matrix: gather the used experts' weights.
            w = torch.gather(w, -1, idx.long())
        try:
            return order_rows(logits.float().cpu().numpy(), ranked, idx.cpu().numpy(), w.float().cpu().numpy(),
                              self.top_k, self.m, self.selection)
        except RoutingMismatch as e:
            layer = f"{self.blocks[i][0]} ({self.blocks[i][1]})"
            raise RoutingMismatch(self.target.sinks[i].tokens + e.token, e.used, e.top, e.k, layer) from None

    def _lookahead(self, i):
        """lookahead_ids of layer index i: its router applied to the previous MoE layer's input."""
        block, a = self.blocks[i][2], self.blocks[i][3]
        prev = self.inputs.get(i - 1)
        if prev is None:
            raise RuntimeError(f"no input of the MoE layer before {self.blocks[i][1]} in this forward pass")
        self.busy = True
        try:
            with self.torch.no_grad():
                logits, w, idx = getattr(block, a.router)(prev)[:3]
        finally:
            self.busy = False
        logits, w, idx = self._select(logits), self._select(w), self._select(idx)
        if w.shape[-1] != idx.shape[-1]:
            w = self.torch.gather(w, -1, idx.long())
        return lookahead_rows(logits.float().cpu().numpy(), idx.cpu().numpy(), w.float().cpu().numpy(),
                              self.lookahead, a.selection)

    def _experts_hook(self, i):
        torch = self.torch

        def hook(module, inputs, _output):
            if self.busy or self.target is None:
                return
            hidden, indices, weights = inputs[0], inputs[1], inputs[2]
            hidden = hidden.reshape(-1, hidden.shape[-1])
            idx = indices.reshape(hidden.shape[0], -1).detach()
            w = weights.reshape(hidden.shape[0], -1).detach()
            logits = self.pending.pop(i).reshape(hidden.shape[0], -1)
            hidden, idx, w, logits = (self._select(x) for x in (hidden, idx, w, logits))
            rows = self._rows(i, logits, idx, w)
            out = {"ids": rows.ids, "scores": rows.scores, "gates": rows.gates}
            if self.norms:
                # Each used expert's own output: one call of the experts module on every (token,
                # slot) pair as its own row, with that slot's expert alone at weight 1.
                n, k = rows.ids.shape[0], self.top_k
                self.busy = True
                try:
                    with torch.no_grad():
                        order = torch.from_numpy(rows.ids[:, :k].astype(np.int64)).to(idx.device)
                        rep = hidden.repeat_interleave(k, dim=0)
                        ones = torch.ones((n * k, 1), dtype=w.dtype, device=w.device)
                        y = module(rep, order.reshape(-1, 1).to(idx.dtype), ones)
                        out["out_norms"] = y.reshape(n, k, -1).float().norm(dim=-1).cpu().numpy()
                finally:
                    self.busy = False
            if self.lookahead:
                out["lookahead_ids"] = self._lookahead(i)
            sink = self.target.sinks[i]
            sink.append(**out)
            sink.tied += int(rows.tied.sum())

        return hook

    def close(self):
        for h in self.handles:
            h.remove()


def write_trace(path: Path, rec: Recorder, out: Output, metadata: dict[str, str], seq_offsets=None, step_offsets=None):
    """Assembles the safetensors file of `out` from its per-layer raw files, streaming, atomically.

    Tensor order: seq_offsets, step_offsets (u64), scores, gates, out_norms (f32), ids,
    lookahead_ids (u16): descending alignment, as moe-offload's own writer does.
    """
    out.close()
    t = out.tokens
    n_layers, m, k, la = len(out.sinks), rec.m, rec.top_k, rec.lookahead
    shapes = {"scores": ("F32", m), "gates": ("F32", k), "out_norms": ("F32", k), "ids": ("U16", m),
              "lookahead_ids": ("U16", la)}
    tensors = []
    for name, offs in (("seq_offsets", seq_offsets), ("step_offsets", step_offsets)):
        if offs is not None:
            tensors.append((name, "U64", [len(offs)], 8 * len(offs)))
    for name in ("scores", "gates", "out_norms", "ids", "lookahead_ids"):
        if name in rec.names:
            dtype, width = shapes[name]
            tensors.append((name, dtype, [n_layers, t, width], (2 if dtype == "U16" else 4) * n_layers * t * width))
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
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for offs in (seq_offsets, step_offsets):
                if offs is not None:
                    f.write(np.asarray(offs, dtype="<u8").tobytes())
            for name, *_ in tensors:
                if name.endswith("_offsets"):
                    continue
                for sink in out.sinks:
                    with open(sink.paths[name], "rb") as src:
                        shutil.copyfileobj(src, f, 1 << 20)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return t
