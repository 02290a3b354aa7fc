"""Applying a moe-offload keep map to a running Hugging Face MoE model.

Two modes (docs/quality.md):
- `replace`: a pruned expert is never routed; the next-best kept expert takes its place. The
  router's logits of pruned experts are set to -inf at the one place every supported router
  computes them (its `F.linear` call, intercepted with a torch function mode), so the model's own
  code then applies its own rule: softmax then top-k (with or without `norm_topk_prob`,
  Mixtral's renormalization, DeepSeek-V2's scaling), or top-k then softmax (gpt-oss). That is the
  model with the pruned experts deleted.
- `drop`: the router chooses as before; the pruned experts' slots get weight 0 and the other
  slots keep their weights (what a runtime that skips missing experts computes).

Routers that do not choose the top-k by logit (capture_rows' `chosen_only`: DeepSeek-V3's
sigmoid scores plus a correction bias with group-limited selection, DeepSeek-V2's
group_limited_greedy) are refused: a -inf logit there does not remove the expert from the choice.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from capture_rows import find_moe_blocks

KEEP_MAP_KIND = "moe-offload-keep-map"
MODES = ("replace", "drop")

REFUSAL = {
    "deepseek_v3": ("its router chooses by sigmoid scores plus an e_score_correction_bias, group-limited "
                    "(n_group/topk_group): a -inf logit gives a score of 0 + bias, which can still be chosen, and "
                    "the group choice sees it, so masking logits cannot express pruning"),
    "deepseek_v2": ("its router uses topk_method group_limited_greedy: groups are chosen by their best score "
                    "before the experts, so masking logits changes the group choice and can still leave a "
                    "pruned expert among the top-k of a group; only topk_method greedy is supported"),
}


class KeepMapError(ValueError):
    """A keep map that is malformed or does not fit the model (the message names file, key or layer)."""


class Refused(ValueError):
    """A router whose rule a logit mask cannot express (the message says why)."""


def read_keep_map(path) -> dict:
    """The keep map JSON at `path` (as `moe-offload keep -o` writes it), checked for shape.

    Returns the parsed object with `layers` as lists of ints, plus `_path` and `_file_sha256`.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise KeepMapError(f"{path}: cannot read the keep map ({e.strerror})") from None
    try:
        km = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise KeepMapError(f"{path}: not JSON ({getattr(e, 'msg', e)})") from None
    if not isinstance(km, dict):
        raise KeepMapError(f"{path}: a keep map is a JSON object, not {type(km).__name__}")
    kind = km.get("kind", KEEP_MAP_KIND)
    if kind != KEEP_MAP_KIND:
        raise KeepMapError(f"{path}: kind {kind!r} is not a keep map ({KEEP_MAP_KIND!r}; write one with "
                           "`moe-offload keep STATS --metric M --k K -o keep.json`)")
    for key, typ in (("metric", str), ("k", int), ("num_experts", int), ("layer_ids", list), ("layers", list)):
        if not isinstance(km.get(key), typ) or isinstance(km.get(key), bool):
            raise KeepMapError(f"{path}: key {key!r} missing or not a {typ.__name__}")
    e = km["num_experts"]
    if len(km["layer_ids"]) != len(km["layers"]):
        raise KeepMapError(f"{path}: {len(km['layer_ids'])} layer_ids but {len(km['layers'])} layers")
    if len(set(km["layer_ids"])) != len(km["layer_ids"]):
        raise KeepMapError(f"{path}: layer_ids repeat a layer")
    for lid, ids in zip(km["layer_ids"], km["layers"]):
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise KeepMapError(f"{path}: layer {lid}: kept ids must be a list of integers")
        bad = [i for i in ids if not 0 <= i < e]
        if bad:
            raise KeepMapError(f"{path}: layer {lid}: expert {bad[0]} out of range (num_experts {e})")
        if len(set(ids)) != len(ids):
            raise KeepMapError(f"{path}: layer {lid}: an expert is listed twice")
    km["_path"] = str(path)
    km["_file_sha256"] = hashlib.sha256(raw).hexdigest()
    return km


def keep_map_sha256(km: dict) -> str:
    """The SHA-256 moe-offload gives a keep map (sweep's `keep_maps[].sha256`, Rust
    `sweep::keep_map_sha256`): of its compact JSON serialization, fields in the struct's order,
    without `kind`."""
    obj = {f: km[f] for f in ("metric", "k", "num_experts", "layer_ids", "layers")}
    obj["stats_sha256"] = km.get("stats_sha256", "")
    obj["short_layers"] = km.get("short_layers", [])
    if km.get("budget") is not None:
        b = km["budget"]
        obj["budget"] = {"total": b["total"], "floor": b["floor"], "scale": b["scale"]}
    return hashlib.sha256(json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()).hexdigest()


def keep_map_label(km: dict) -> str:
    """`metric@K` (or `metric@budgetB`), as moe-offload labels the map."""
    if km.get("budget"):
        return f"{km['metric']}@budget{km['budget']['total']}"
    return "full" if km["metric"] == "full" else f"{km['metric']}@{km['k']}"


def full_keep_map(model) -> dict:
    """The unpruned keep map of `model` (every expert kept in every MoE layer)."""
    blocks = supported_blocks(model)
    e = _num_experts(blocks[0])
    return {"metric": "full", "k": e, "num_experts": e, "layer_ids": [b[0] for b in blocks],
            "layers": [list(range(e)) for _ in blocks], "stats_sha256": "", "short_layers": []}


def _router(block):
    return getattr(block[2], block[3].router)


def _num_experts(block) -> int:
    r = _router(block)
    return int(getattr(r, "num_experts", None) or r.weight.shape[0])


def supported_blocks(model):
    """The model's MoE blocks (capture_rows.find_moe_blocks), refusing routers a mask cannot express."""
    blocks = find_moe_blocks(model)
    if not blocks:
        raise Refused(f"no supported MoE block in {type(model).__name__}: see capture_rows.ADAPTERS")
    for lid, name, block, a in blocks:
        if a.selection != "top_logits":
            why = REFUSAL.get(a.family, "its router does not choose the top-k experts by logit")
            raise Refused(f"layer {lid} ({name}, {type(block).__name__}): refused: {why}")
    return blocks


class KeepMask:
    """Applies a keep map to `model` while active (`with KeepMask(model, km, mode): ...`).

    km None (or the full map) applies nothing but still records routing. While active, per MoE
    layer index i, `routed[i]` collects the [rows, k] expert ids the router chose in each forward
    pass, over the rows `begin(rows)` selected (a flattened [batch * seq] bool mask, None = all).
    In replace mode a chosen pruned expert is a RuntimeError naming the layer (it cannot happen
    when the mask is in place, so it means the router did not route as assumed).
    """

    def __init__(self, model, km: dict | None, mode: str = "replace", record: bool = True):
        import torch

        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
        self.torch, self.mode, self.record = torch, mode, record
        self.blocks = supported_blocks(model)
        self.num_experts = _num_experts(self.blocks[0])
        self.top_k = int(_router(self.blocks[0]).top_k)
        self.layer_ids = [b[0] for b in self.blocks]
        self.km = km
        self.kept = [None] * len(self.blocks)  # bool [E] per layer; None: every expert kept
        if km is not None:
            self._fit(km)
        self.rows = None
        self.routed = [[] for _ in self.blocks]
        self.handles, self.saved = [], []

    def _fit(self, km):
        torch = self.torch
        where = km.get("_path", "keep map")
        if km["num_experts"] != self.num_experts:
            raise KeepMapError(f"{where}: num_experts {km['num_experts']} but the model's MoE layers route among "
                               f"{self.num_experts} experts")
        have, want = list(km["layer_ids"]), self.layer_ids
        if sorted(have) != sorted(want):
            missing = sorted(set(want) - set(have))
            extra = sorted(set(have) - set(want))
            parts = ([f"no entry for MoE layer(s) {missing}"] if missing else []) + (
                [f"layer(s) {extra} are not MoE layers of the model"] if extra else [])
            raise KeepMapError(f"{where}: layer_ids {have} do not match the model's MoE layers {want} (decoder "
                               f"layer indices, dense layers skipped): {'; '.join(parts)}")
        by_id = dict(zip(have, km["layers"]))
        for i, lid in enumerate(want):
            ids = by_id[lid]
            if self.mode == "replace" and len(ids) < self.top_k:
                raise KeepMapError(f"{where}: layer {lid} keeps {len(ids)} experts, fewer than the model's top-k "
                                   f"{self.top_k}: no routing can replace every pruned slot (use --mode drop)")
            # Even a full map gets its (all-kept) mask: the keep-all invariant then tests the machinery.
            m = torch.zeros(self.num_experts, dtype=torch.bool)
            m[list(ids)] = True
            self.kept[i] = m

    def begin(self, rows=None):
        """The flattened rows of the next forward pass to record (bool tensor) and a fresh record."""
        self.rows = rows
        self.routed = [[] for _ in self.blocks]

    def __enter__(self):
        for i, (lid, name, block, a) in enumerate(self.blocks):
            router = getattr(block, a.router)
            if self.mode == "replace" and self.kept[i] is not None:
                self.saved.append((router, router.__dict__.get("forward")))
                router.forward = self._masked_forward(router, router.forward, i)
            if self.mode == "drop" and self.kept[i] is not None:
                self.handles.append(getattr(block, a.experts).register_forward_pre_hook(self._drop_hook(i)))
            self.handles.append(router.register_forward_hook(self._router_hook(i)))
        return self

    def __exit__(self, *exc):
        for h in self.handles:
            h.remove()
        for router, fwd in self.saved:
            if fwd is None:
                del router.forward
            else:
                router.forward = fwd
        self.handles, self.saved = [], []
        return False

    def _masked_forward(self, router, forward, i):
        torch = self.torch
        from torch.overrides import TorchFunctionMode

        pruned = ~self.kept[i]
        lid, name = self.blocks[i][0], self.blocks[i][1]
        e = self.num_experts

        class Mask(TorchFunctionMode):
            calls = 0

            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if func is torch.nn.functional.linear:
                    Mask.calls += 1
                    if out.shape[-1] != e:
                        raise RuntimeError(f"layer {lid} ({name}): the router's linear gives {out.shape[-1]} "
                                           f"outputs, not {e} expert logits: cannot place the keep mask")
                    out = out.masked_fill(pruned.to(out.device), float("-inf"))
                return out

        def masked(*args, **kwargs):
            Mask.calls = 0
            with Mask():
                out = forward(*args, **kwargs)
            if Mask.calls != 1:
                raise RuntimeError(f"layer {lid} ({name}): the router made {Mask.calls} F.linear calls, not one: "
                                   "cannot tell which gives the expert logits, so the keep mask is not applied")
            return out

        return masked

    def _drop_hook(self, i):
        torch = self.torch
        kept = self.kept[i]

        def hook(_module, inputs):
            hidden, idx, w = inputs[0], inputs[1], inputs[2]
            k = kept.to(w.device)
            if w.shape[-1] == idx.shape[-1]:
                w = w * k[idx.long()].to(w.dtype)
            else:  # a dense [T, E] weight matrix
                w = w * k.to(w.dtype)
            return (hidden, idx, w, *inputs[3:])

        del torch
        return hook

    def _router_hook(self, i):
        def hook(_module, _inputs, output):
            idx = output[2].detach().reshape(-1, self.top_k)
            if self.mode == "replace" and self.kept[i] is not None:
                bad = ~self.kept[i].to(idx.device)[idx.long()]
                if bool(bad.any()):
                    row = int(bad.any(-1).nonzero()[0])
                    raise RuntimeError(f"layer {self.blocks[i][0]} ({self.blocks[i][1]}): the router chose pruned "
                                       f"expert(s) {idx[row][bad[row]].tolist()} under the keep mask")
            if self.record:
                if self.rows is not None:
                    idx = idx[self.rows.to(idx.device)]
                self.routed[i].append(idx.cpu())

        return hook
