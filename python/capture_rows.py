"""The MoE blocks capture_routing.py knows, and how one layer's router outputs become trace rows.

Kept apart from the hooks so the row rules (ties, candidates, gates, lookahead) are plain NumPy
functions that the tests call directly. docs/capture.md explains the rules.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Adapter:
    """Where a MoE block keeps its router and experts, and how its router picks experts.

    selection = "top_logits": the model uses the top-k experts of a monotone function of the
    router logits, so the candidates are the top-m by logit and the scores are logits.
    ranking: what the model's torch.topk runs on, recomputed to tell ties from disagreements:
    "softmax" (float32 softmax of the logits) or "logits".
    selection = "chosen_only": the choice is not the top-k by logit (group-limited routing, a
    score-correction bias), so only the k chosen experts are recorded (m = k), ordered by gate,
    with ln(gate) as scores (score_kind log_probs_renormalized).
    """

    family: str
    router: str
    experts: str
    selection: str
    ranking: str = "softmax"


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
    "GptOssMLP": Adapter("gpt_oss", "router", "experts", "top_logits", ranking="logits"),
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
        layer_id = next(
            (int(parts[i + 1]) for i, p in enumerate(parts[:-1]) if p == "layers" and parts[i + 1].isdigit()),
            len(found),
        )
        found.append((layer_id, name, module, a))
    found.sort(key=lambda x: x[0])
    return found


class RoutingMismatch(ValueError):
    """The model used experts that are not its top-k, beyond ties, at trace token `token` of a layer."""

    def __init__(self, token: int, used: list[int], top: list[int], k: int, layer: str = ""):
        self.token, self.used, self.top, self.k = token, used, top, k
        where = f"token {token}" + (f", layer {layer}" if layer else "")
        super().__init__(
            f"{where}: the model used experts {used}, not the top-{k} by logit {top}, and the difference is "
            "not a tie: this router is not plain top-k (use selection chosen_only in its Adapter)"
        )


@dataclass
class Rows:
    """One call's trace rows: ids [T, m] u16, scores [T, m] f32, gates [T, k] f32, and per row
    whether the model's choice differs from the stable top-k by logit through ties (tied [T] bool)."""

    ids: np.ndarray
    scores: np.ndarray
    gates: np.ndarray
    tied: np.ndarray


def stable_top(values: np.ndarray, m: int) -> np.ndarray:
    """Per row, the ids of the m largest values, descending, ties: lower id first. [T, E] -> [T, m]."""
    return np.argsort(-values, axis=-1, kind="stable")[:, :m]


def order_rows(
    logits: np.ndarray, ranked: np.ndarray | None, chosen: np.ndarray, weights: np.ndarray, k: int, m: int,
    selection: str,
) -> Rows:
    """Per token: candidate ids, scores and the gates of the first k, as the trace stores them.

    logits [T, E] float32 (the router's logits), ranked [T, E] float32 (what the model's top-k ran
    on; None for chosen_only), chosen [T, k] the ids the model used, weights [T, k] their applied
    gates.

    top_logits: the first k ids are the used experts in the model's order of gates (descending
    gate, ties: descending logit, then lower id), the other m - k the remaining experts by
    descending logit (ties: lower id). A row whose used experts are not the stable top-k by logit
    is accepted when they are the top-k of `ranked` up to ties (their sorted ranked values equal
    the k largest, within 2^-20 of the row's largest magnitude: the model's own rounding), and
    flagged in `tied`; its scores are then made non-increasing by a running minimum (a change only
    where `ranked` ties values whose logits differ). Otherwise RoutingMismatch names the row.

    chosen_only: the k used experts by gate (descending, ties: lower id), ln(gate) as scores.
    """
    t = chosen.shape[0]
    chosen = chosen.astype(np.int64)
    w = weights.astype(np.float64)
    if selection != "top_logits":
        keys = np.lexsort((chosen, -w), axis=-1) if t else np.zeros((0, k), np.int64)
        ids = np.take_along_axis(chosen, keys, axis=-1)
        gates = np.take_along_axis(w, keys, axis=-1)
        scores = np.log(np.maximum(gates, np.finfo(np.float32).tiny))
        return Rows(ids.astype(np.uint16), scores.astype(np.float32), gates.astype(np.float32), np.zeros(t, bool))
    if t == 0:
        z = np.zeros((0, m), np.uint16)
        return Rows(z, z.astype(np.float32), np.zeros((0, k), np.float32), np.zeros(0, bool))
    used_logit = np.take_along_axis(logits, chosen, axis=-1)
    # The model's order of gates: descending gate, ties by descending logit, then lower id.
    key = np.lexsort((chosen, -used_logit.astype(np.float64), -w), axis=-1)
    first = np.take_along_axis(chosen, key, axis=-1)
    gates = np.take_along_axis(w, key, axis=-1)
    # The rest by descending logit, ties lower id: a stable sort with the used experts pushed last.
    used_mask = np.zeros(logits.shape, bool)
    np.put_along_axis(used_mask, chosen, True, axis=-1)
    rest = np.argsort(np.where(used_mask, np.inf, -logits.astype(np.float64)), axis=-1, kind="stable")[:, : m - k]
    ids = np.concatenate([first, rest], axis=-1)
    top = np.sort(stable_top(logits, k), axis=-1)
    tied = ~np.all(top == np.sort(chosen, axis=-1), axis=-1)
    if tied.any():
        rows = np.nonzero(tied)[0]
        r = ranked[rows].astype(np.float64)
        want = -np.sort(-r, axis=-1)[:, :k]
        got = -np.sort(-np.take_along_axis(r, chosen[rows], axis=-1), axis=-1)
        tol = np.abs(r).max(axis=-1, keepdims=True) * 2.0**-20
        bad = ~np.all(np.abs(got - want) <= tol, axis=-1)
        if bad.any():
            i = int(rows[np.nonzero(bad)[0][0]])
            raise RoutingMismatch(i, sorted(chosen[i].tolist()), top[i].tolist(), k)
    scores = np.take_along_axis(logits, ids, axis=-1).astype(np.float32)
    scores[tied] = np.minimum.accumulate(scores[tied], axis=-1)
    return Rows(ids.astype(np.uint16), scores, gates.astype(np.float32), tied)


def lookahead_rows(logits: np.ndarray | None, chosen: np.ndarray, weights: np.ndarray, width: int,
                   selection: str) -> np.ndarray:
    """The lookahead ids of one layer [T, width] u16 from its router's outputs on the previous
    MoE layer's input: top_logits, the top-`width` by logit (ties: lower id); chosen_only, the
    experts that router would choose, by gate (the trace's rule for ids), width <= k."""
    if selection == "top_logits":
        return stable_top(logits, width).astype(np.uint16)
    return order_rows(np.zeros((chosen.shape[0], 0), np.float32), None, chosen, weights, chosen.shape[1],
                      chosen.shape[1], "chosen_only").ids[:, :width]
