#!/usr/bin/env python3
"""Measure the quality a keep map costs on the model itself: the pruned model against the unpruned one.

Teacher-forced on the same tokens (padding excluded): perplexity of both, mean KL(base || pruned)
and Jensen-Shannon divergence of the next-token distributions, top-1 and top-5 next-token
agreement, and the share of the base model's chosen expert slots the keep map keeps, per MoE
layer. One JSON (kind moe-offload-quality) per keep map; several keep maps share the base
model's forward pass of every batch. docs/quality.md defines every figure.

    moe-offload keep stats.json --metric l2_sum --k 32,48 -o maps/
    python python/eval_pruned.py --model allenai/OLMoE-1B-7B-0924 --keep maps/l2_sum@32.json \\
        maps/l2_sum@48.json --text heldout.txt --max-tokens 8192 -o quality/
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from keep_mask import (  # noqa: E402
    MODES, KeepMapError, KeepMask, Refused, full_keep_map, keep_map_label, keep_map_sha256, read_keep_map,
)

QUALITY_KIND = "moe-offload-quality"
TOP_N = 5


class _Acc:
    """Sums over the scored positions of one keep map."""

    def __init__(self, layers):
        self.n = 0
        self.nll = 0.0
        self.kl = 0.0
        self.jsd = 0.0
        self.top1 = 0
        self.topn = 0.0
        self.routed = [0] * layers  # the pruned model's chosen slots, per layer
        self.routed_kept = [0] * layers  # of those, slots on kept experts
        self.same = [0] * layers  # of those, slots the base model chose for that token too


def _padded(batch, pad_id, device):
    import torch

    n = max(len(s) for s in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for r, s in enumerate(batch):
        ids[r, : len(s)] = torch.tensor(s, dtype=torch.long)
        mask[r, : len(s)] = 1
    return ids.to(device), mask.to(device)


def _input_device(model):
    import torch

    d = model.get_input_embeddings().weight.device
    return torch.device("cpu") if d.type == "meta" else d


def _forward(model, mask_ctx, ids, mask, rows):
    mask_ctx.begin(rows)
    with mask_ctx:
        return model(input_ids=ids, attention_mask=mask, use_cache=False).logits


CHUNK = 256  # positions per float64 log_softmax (memory: CHUNK x vocab x 8 bytes, a few times)


def _compare(base_logits, logits, target, n_top):
    """Sums over positions of (nll base, nll pruned, KL, JSD, top-1 equal, top-n overlap / n), from
    float64 log_softmax of the [positions, vocab] logits, CHUNK positions at a time."""
    import torch

    ln2 = math.log(2.0)
    sums = [0.0] * 6
    for i in range(0, base_logits.shape[0], CHUNK):
        lb = torch.log_softmax(base_logits[i: i + CHUNK].double(), -1)
        lq = torch.log_softmax(logits[i: i + CHUNK].double(), -1)
        t = target[i: i + CHUNK, None]
        pb, pq = lb.exp(), lq.exp()
        # JSD with M = (P + Q) / 2, log M = logaddexp(log P, log Q) - ln 2; clamped to its range [0, ln 2].
        lm = torch.logaddexp(lb, lq) - ln2
        js = 0.5 * (pb * (lb - lm)).sum(-1) + 0.5 * (pq * (lq - lm)).sum(-1)
        tb, tq = lb.topk(n_top, -1).indices, lq.topk(n_top, -1).indices
        parts = (-lb.gather(-1, t).sum(), -lq.gather(-1, t).sum(), (pb * (lb - lq)).sum(-1).clamp(min=0).sum(),
                 js.clamp(0.0, ln2).sum(), (lb.argmax(-1) == lq.argmax(-1)).sum(),
                 (tq[:, :, None] == tb[:, None, :]).any(-1).sum() / n_top)
        sums = [a + float(b) for a, b in zip(sums, parts)]
    return sums


def _kept_tensor(km, mask_ctx):
    """bool [layers, E]: per MoE layer index (the model's order), the experts km keeps."""
    import torch

    by_id = dict(zip(km["layer_ids"], km["layers"]))
    out = torch.zeros((len(mask_ctx.layer_ids), mask_ctx.num_experts), dtype=torch.bool)
    for i, lid in enumerate(mask_ctx.layer_ids):
        out[i, by_id[lid]] = True
    return out


def evaluate(model, sequences, keep_maps, *, mode="replace", batch_size=1, pad_id=0):
    """The quality figures of each keep map (a list of dicts, one per map, in order).

    `sequences`: token-id lists; each is one teacher-forced sequence (right padded in batches of
    `batch_size`). Position t of a sequence is scored when token t + 1 exists: the next-token
    distributions of base and pruned model there, and the NLL of token t + 1. Routing (slot)
    figures count every real token. No keep map is modified; the model is left as it was.
    """
    import torch

    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: expected one of {', '.join(MODES)}")
    sequences = [list(s) for s in sequences if len(s) > 0]
    if not sum(len(s) - 1 for s in sequences):
        raise ValueError("no position to score: every sequence has fewer than two tokens")
    model.eval()
    device = _input_device(model)
    base_ctx = KeepMask(model, None, mode)
    ctxs = [KeepMask(model, km, mode) for km in keep_maps]
    kept = [_kept_tensor(km, base_ctx) for km in keep_maps]
    layers, k = len(base_ctx.blocks), base_ctx.top_k
    accs = [_Acc(layers) for _ in keep_maps]
    base_nll, n_pos, tokens = 0.0, 0, 0
    base_slots = torch.zeros(layers, dtype=torch.float64)
    surviving = [torch.zeros(layers, dtype=torch.float64) for _ in keep_maps]
    with torch.no_grad():
        for b in range(0, len(sequences), batch_size):
            batch = sequences[b: b + batch_size]
            ids, mask = _padded(batch, pad_id, device)
            rows = mask.reshape(-1).bool().cpu()
            # Scored positions: real, with a real next token (right padding: t + 1 < len).
            score = torch.zeros_like(mask, dtype=torch.bool)
            score[:, :-1] = (mask[:, :-1] > 0) & (mask[:, 1:] > 0)
            score = score.cpu()
            target = ids[:, 1:].cpu()[score[:, :-1]]
            logits_base = _forward(model, base_ctx, ids, mask, rows).float().cpu()[score]
            base_routed = [torch.cat(r) for r in base_ctx.routed]  # [tokens, k] per layer
            tokens += int(rows.sum())
            n_pos += int(score.sum())
            base_slots += torch.tensor([float(r.numel()) for r in base_routed], dtype=torch.float64)
            n_top = min(TOP_N, logits_base.shape[-1])
            for j, (km, ctx, acc) in enumerate(zip(keep_maps, ctxs, accs)):
                for li in range(layers):
                    surviving[j][li] += float(kept[j][li][base_routed[li].long()].sum())
                logits = _forward(model, ctx, ids, mask, rows).float().cpu()[score]
                nll_b, nll, kl, js, top1, topn = _compare(logits_base, logits, target, n_top)
                if j == 0:
                    base_nll += nll_b
                acc.n += logits.shape[0]
                acc.nll += nll
                acc.kl += kl
                acc.jsd += js
                acc.top1 += int(top1)
                acc.topn += topn
                for li in range(layers):
                    r = torch.cat(ctx.routed[li]).long()
                    acc.routed[li] += r.numel()
                    acc.routed_kept[li] += int(kept[j][li][r].sum())
                    bl = base_routed[li].long()
                    acc.same[li] += int((r[:, :, None] == bl[:, None, :]).any(-1).sum())
    ppl_base = math.exp(base_nll / n_pos)
    results = []
    for j, (km, acc) in enumerate(zip(keep_maps, accs)):
        surv = (surviving[j] / base_slots).tolist()
        per_layer = []
        for li, lid in enumerate(base_ctx.layer_ids):
            per_layer.append({
                "layer_id": lid,
                "module": base_ctx.blocks[li][1],
                "kept": int(kept[j][li].sum()),
                "slots_surviving": surv[li],
                "routed_slots_kept": acc.routed_kept[li] / acc.routed[li],
                "routed_slots_unchanged": acc.same[li] / acc.routed[li],
            })
        ppl = math.exp(acc.nll / acc.n)
        results.append({
            "ppl_base": ppl_base,
            "ppl_pruned": ppl,
            "ppl_increase": ppl / ppl_base - 1.0,
            "nll_base": base_nll / n_pos,
            "nll_pruned": acc.nll / acc.n,
            "kl": acc.kl / acc.n,
            "jsd": acc.jsd / acc.n,
            "top1_agreement": acc.top1 / acc.n,
            "top5_agreement": acc.topn / acc.n,
            "slots_surviving": float(surviving[j].sum() / base_slots.sum()),
            "positions": n_pos,
            "tokens": tokens,
            "top_k": k,
            "layers": per_layer,
        })
    return results


def _model_identity(model, name, blocks, dtype):
    cfg = model.config
    ident = {
        "name": name,
        "model_type": getattr(cfg, "model_type", ""),
        "architecture": blocks[0][3].family,
        "moe_blocks": type(blocks[0][2]).__name__,
        "num_experts": KeepMask(model, None).num_experts,
        "top_k": KeepMask(model, None).top_k,
        "layer_ids": [b[0] for b in blocks],
        "num_hidden_layers": getattr(cfg, "num_hidden_layers", None),
        "dtype": dtype,
    }
    for key in ("norm_topk_prob", "routed_scaling_factor", "first_k_dense_replace", "topk_method"):
        if hasattr(cfg, key):
            ident[key] = getattr(cfg, key)
    cfg_file = Path(name) / "config.json"
    if cfg_file.is_file():
        ident["config_sha256"] = hashlib.sha256(cfg_file.read_bytes()).hexdigest()
    return ident


def quality_document(result, km, mode, model_ident, text_ident):
    """The JSON object written for one keep map."""
    return {
        "kind": QUALITY_KIND,
        "format_version": 1,
        "mode": mode,
        "keep_map": {
            "path": km.get("_path", ""),
            "label": keep_map_label(km),
            "sha256": keep_map_sha256(km),
            "file_sha256": km.get("_file_sha256", ""),
            "metric": km["metric"],
            "k": km["k"],
            "num_experts": km["num_experts"],
            "stats_sha256": km.get("stats_sha256", ""),
            "layer_ids": km["layer_ids"],
            "layers": [sorted(ids) for ids in km["layers"]],
        },
        "model": model_ident,
        "text": text_ident,
        **result,
    }


# ---------------------------------------------------------------- command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model id or local directory")
    p.add_argument("--keep", required=True, nargs="+", metavar="KEEP_JSON",
                   help="keep map(s) written by `moe-offload keep`; several share the base model's forward passes")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="UTF-8 text file; paragraphs (blank-line separated) are documents")
    src.add_argument("--jsonl", help="JSON Lines file; each record's --text-key string is a document")
    src.add_argument("--dataset", help="Hugging Face dataset name or local dataset directory (needs `datasets`)")
    p.add_argument("--text-key", default="text", help="field of a JSON Lines record or dataset column (default text)")
    p.add_argument("--dataset-config", default=None, help="dataset configuration name")
    p.add_argument("--split", default="train", help="dataset split (default train)")
    p.add_argument("-o", "--output", required=True,
                   help="output JSON; with several keep maps a directory of <keep map file stem>.json")
    p.add_argument("--mode", choices=MODES, default="replace",
                   help="replace: pruned experts are never routed, the next-best kept one takes the slot "
                        "(default); drop: the router chooses as before and pruned slots get weight 0")
    p.add_argument("--max-len", type=int, default=2048, help="longest sequence per forward pass (default 2048)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop reading input after this many tokens")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass (default 1)")
    p.add_argument("--dtype", default="bfloat16", help="torch dtype to load the model in (default bfloat16; or auto)")
    p.add_argument("--device", default="cpu", help="torch device without --device-map (default cpu)")
    p.add_argument("--device-map", default=None, help="accelerate device map, e.g. auto (model larger than one device)")
    p.add_argument("--offload-folder", default=None, help="with --device-map: where weights that fit nowhere go")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model repository's own code")
    return p, p.parse_args(argv)


def _outputs(keep_paths, output):
    if len(keep_paths) == 1:
        return [Path(output)]
    stems = [Path(k).stem for k in keep_paths]
    dup = sorted({s for s in stems if stems.count(s) > 1})
    if dup:
        raise KeepMapError(f"keep maps with the same file name {dup[0]!r}: their outputs in {output}/ would collide")
    Path(output).mkdir(parents=True, exist_ok=True)
    return [Path(output) / f"{s}.json" for s in stems]


def _text_identity(a, seqs, tok):
    ident = {"text_key": a.text_key} if (a.jsonl or a.dataset) else {}
    if a.text or a.jsonl:
        f = Path(a.text or a.jsonl)
        ident.update(source="text" if a.text else "jsonl", path=str(f), sha256=hashlib.sha256(f.read_bytes()).hexdigest())
    else:
        ident.update(source="dataset", dataset=a.dataset, config=a.dataset_config, split=a.split)
    h = hashlib.sha256()
    for s in seqs:
        h.update(json.dumps(s).encode() + b"\n")
    ident.update(sequences=len(seqs), tokens=sum(map(len, seqs)), token_ids_sha256=h.hexdigest(), max_len=a.max_len,
                 max_tokens=a.max_tokens, tokenizer=getattr(tok, "name_or_path", ""))
    return ident


def run(argv=None):
    """The command: returns the paths written. Bad input raises KeepMapError, Refused or ValueError."""
    import capture_routing

    p, a = parse_args(argv)
    if a.max_len < 2 or a.batch_size < 1:
        raise ValueError(f"--max-len {a.max_len} must be >= 2 and --batch-size {a.batch_size} >= 1")
    maps = [read_keep_map(k) for k in a.keep]
    outs = _outputs(a.keep, a.output)
    tok, model = capture_routing.load_model(a)
    blocks = KeepMask(model, None).blocks  # refuses unsupported routers before any forward pass
    for km in maps:
        KeepMask(model, km, a.mode)  # fit checks (layers, experts, K >= top-k) before the long run
    if a.text:
        docs = capture_routing.documents_from_text(a.text)
    elif a.jsonl:
        docs = capture_routing.documents_from_jsonl(a.jsonl, a.text_key)
    else:
        docs = capture_routing.documents_from_dataset(a.dataset, a.text_key, a.dataset_config, a.split)
    seqs = capture_routing.tokenize_documents(docs, tok, a.max_len, a.max_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    results = evaluate(model, seqs, maps, mode=a.mode, batch_size=a.batch_size, pad_id=pad)
    mi = _model_identity(model, a.model, blocks, a.dtype)
    ti = _text_identity(a, seqs, tok)
    for res, km, out in zip(results, maps, outs):
        doc = quality_document(res, km, a.mode, mi, ti)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        tmp.replace(out)
        print(f"wrote {out}: {doc['keep_map']['label']} ({a.mode}) ppl {res['ppl_base']:.4g} -> {res['ppl_pruned']:.4g}, "
              f"KL {res['kl']:.4g}, top-1 agreement {res['top1_agreement']:.4f}, slots surviving "
              f"{res['slots_surviving']:.4f} over {res['positions']} positions")
    return outs


def main(argv=None):
    try:
        run(argv)
    except (KeepMapError, Refused, ValueError) as e:
        print(f"eval_pruned.py: error: {e}", file=sys.stderr)
        sys.exit(2)


__all__ = ["evaluate", "full_keep_map", "quality_document", "read_keep_map", "QUALITY_KIND"]

if __name__ == "__main__":
    main()
