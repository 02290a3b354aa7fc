#!/usr/bin/env python3
"""Capture a moe-offload routing trace from a Hugging Face MoE model while it reads text.

Per MoE layer and token it records the router's top-m candidate ids and logits, the gate weights
the model applied to its k experts, the L2 norm of each used expert's output (for REAP) and,
with --lookahead, the ids layer l's router gives the previous MoE layer's input, in the trace
format of docs/trace-format.md. Prefill by default; --generate N records N greedily generated
tokens per prompt with the KV cache (phase decode), one engine step per decode forward pass.

    python python/capture_routing.py --model allenai/OLMoE-1B-7B-0924 --device-map auto \\
        --text corpus.txt --candidates 16 --max-tokens 4096 -o trace.safetensors
    moe-offload inspect trace.safetensors

Supported MoE blocks (found by class name, see capture_rows.ADAPTERS): Qwen2-MoE, Qwen3-MoE,
Qwen3-Next, Mixtral, OLMoE, DeepSeek-V2, DeepSeek-V3 and gpt-oss, as implemented in
transformers >= 5. docs/capture.md explains the choices.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from capture_recorder import Recorder, write_trace  # noqa: E402
from capture_rows import ADAPTERS, Adapter, adapter_for, find_moe_blocks, order_rows  # noqa: E402,F401

LOOKAHEAD_META = ("layer l's router applied to the input of the previous MoE layer (the first MoE layer: its "
                  "decoder layer's input through its post_attention_layernorm); top-m' by logit")


@dataclass
class Captured:
    """What one capture wrote: the trace's shape and the rows accepted through ties."""

    path: str
    layers: int
    tokens: int
    candidates: int
    top_k: int
    tied_rows: int
    lookahead: int = 0


def _batches(seqs, size):
    for i in range(0, len(seqs), size):
        yield seqs[i: i + size]


def _padded(batch, pad_id, left, device):
    import torch

    n = max(len(s) for s in batch)
    ids = torch.full((len(batch), n), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), n), dtype=torch.long)
    for r, s in enumerate(batch):
        sl = slice(n - len(s), n) if left else slice(0, len(s))
        ids[r, sl] = torch.tensor(s, dtype=torch.long)
        mask[r, sl] = 1
    return ids.to(device), mask.to(device)


def _input_device(model):
    import torch

    d = model.get_input_embeddings().weight.device
    return torch.device("cpu") if d.type == "meta" else d


def _cache_of(out):
    c = getattr(out, "cache", None)
    return c if c is not None else getattr(out, "past_key_values", None)


def _metadata(model, rec, model_name, source, phase, extra):
    per_layer = [s.tied for s in extra.pop("_out").sinks]
    md = {
        "format": "moe-offload-trace",
        "format_version": "1",
        "model": model_name or getattr(model.config, "_name_or_path", "") or type(model).__name__,
        "num_experts": str(rec.num_experts),
        "top_k": str(rec.top_k),
        "layer_ids": json.dumps([b[0] for b in rec.blocks]),
        "score_kind": "logits" if rec.selection == "top_logits" else "log_probs_renormalized",
        "phase": phase,
        "source": source or "python/capture_routing.py",
        "architecture": rec.blocks[0][3].family,
        "moe_blocks": type(rec.blocks[0][2]).__name__,
        "tied_rows": str(sum(per_layer)),
        "tied_rows_per_layer": json.dumps(per_layer),
    }
    if rec.lookahead:
        md["lookahead"] = LOOKAHEAD_META
    md.update({k: str(v) for k, v in extra.items()})
    return md


def capture(model, sequences, output, *, candidates=None, model_name="", source="", norms=True, batch_size=1,
            generate=0, lookahead=0, prefill_output=None, pad_id=0, keep=None):
    """Runs `model` over token-id sequences (lists of ints) and writes the trace to `output`.

    Without `generate`: one prefill forward pass per batch of `batch_size` sequences (right
    padded, attention mask, no KV cache); rows are the real tokens, sequence after sequence
    (`seq_offsets`), phase prefill. With `generate = N`: each batch's prompts (left padded) are
    prefilled with the KV cache, then N greedy decode steps feed back the generated tokens; the
    trace holds the rows of those decode passes (phase decode), one engine step per pass
    (`step_offsets`, step-major: the batch's rows of step 0, then step 1, ...), plus
    `seq_offsets` when `batch_size` is 1 (each sequence's N rows are then contiguous). The
    prompts' prefill rows go to `prefill_output` when given.
    With `keep` (a keep map, keep_mask.read_keep_map): the routing of the pruned model, pruned
    experts' router logits at -inf (keep_mask.KeepMask, mode replace), so no pruned id appears in
    the trace; candidates and lookahead must then fit in every layer's kept experts.
    Returns a Captured (and, with prefill_output, a pair (decode, prefill)).
    """
    import torch

    sequences = [list(s) for s in sequences if len(s) > 0]
    if not sequences:
        raise ValueError("no tokens to run: the input is empty")
    if batch_size < 1 or generate < 0:
        raise ValueError(f"--batch-size {batch_size} must be >= 1 and --generate {generate} >= 0")
    model.eval()
    device = _input_device(model)
    params = inspect.signature(model.forward).parameters
    cache_kw = "cache" if "cache" in params else "past_key_values"
    with tempfile.TemporaryDirectory(prefix="moe-capture-") as tmp, contextlib.ExitStack() as masked:
        common = {"batch_size": batch_size}
        if keep is not None:
            common.update(_apply_keep(masked, model, keep, candidates, lookahead))
        rec = Recorder(model, Path(tmp), candidates, norms=norms, lookahead=lookahead)
        main = rec.output("main")
        pre = rec.output("prefill") if generate and prefill_output else None
        seq_offsets, step_offsets = [], []
        try:
            with torch.no_grad():
                for batch in _batches(sequences, batch_size):
                    if not generate:
                        ids, mask = _padded(batch, pad_id, left=False, device=device)
                        rec.begin(main, mask.reshape(-1).bool())
                        model(input_ids=ids, attention_mask=mask, use_cache=False)
                        continue
                    ids, mask = _padded(batch, pad_id, left=True, device=device)
                    pos = (mask.cumsum(-1) - 1).clamp(min=0)
                    rec.begin(pre, mask.reshape(-1).bool())
                    extra = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
                    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **extra)
                    last = pos[:, -1:]
                    if batch_size == 1:
                        seq_offsets.append(main.sinks[0].tokens)
                    for _ in range(generate):
                        nxt = out.logits[:, -1].argmax(-1, keepdim=True).to(device)
                        mask = torch.cat([mask, torch.ones_like(nxt)], dim=-1)
                        last = last + 1
                        step_offsets.append(main.sinks[0].tokens)
                        rec.begin(main, None)
                        out = model(input_ids=nxt, attention_mask=mask, position_ids=last, use_cache=True,
                                    **{cache_kw: _cache_of(out)}, **extra)
        finally:
            rec.close()
        if not generate:
            seq_offsets = _offsets_of(sequences)
            md = _metadata(model, rec, model_name, source, "prefill", {**common, "_out": main})
            t = write_trace(Path(output), rec, main, md, seq_offsets=seq_offsets)
            return Captured(str(output), len(rec.blocks), t, rec.m, rec.top_k, int(md["tied_rows"]), lookahead)
        md = _metadata(model, rec, model_name, source, "decode", {**common, "generate": generate, "_out": main})
        t = write_trace(Path(output), rec, main, md, seq_offsets=seq_offsets if batch_size == 1 else None,
                        step_offsets=step_offsets)
        dec = Captured(str(output), len(rec.blocks), t, rec.m, rec.top_k, int(md["tied_rows"]), lookahead)
        if pre is None:
            return dec
        md = _metadata(model, rec, model_name, source, "prefill", {**common, "_out": pre})
        tp = write_trace(Path(prefill_output), rec, pre, md, seq_offsets=_offsets_of(sequences))
        return dec, Captured(str(prefill_output), len(rec.blocks), tp, rec.m, rec.top_k, int(md["tied_rows"]),
                             lookahead)


def _apply_keep(stack, model, keep, candidates, lookahead):
    """Enters the keep mask of `keep` on `stack`; the trace metadata that records it."""
    from keep_mask import KeepMapError, KeepMask, keep_map_label, keep_map_sha256

    mask = KeepMask(model, keep, "replace", record=False)
    fewest = min(len(ids) for ids in keep["layers"])
    lid = keep["layer_ids"][[len(ids) for ids in keep["layers"]].index(fewest)]
    for flag, n in (("--candidates", candidates or mask.top_k), ("--lookahead", lookahead)):
        if n > fewest:
            raise KeepMapError(f"{flag} {n} > {fewest}, the experts layer {lid} of {keep.get('_path', 'the keep map')} "
                               "keeps: the trace would list pruned experts among the candidates")
    stack.enter_context(mask)
    return {"keep_map": keep_map_label(keep), "keep_map_sha256": keep_map_sha256(keep), "keep_mode": "replace"}


def _offsets_of(sequences):
    offs, n = [], 0
    for s in sequences:
        offs.append(n)
        n += len(s)
    return offs


# ---------------------------------------------------------------- input


def documents_from_text(path):
    """Paragraphs (blank-line separated, stripped, non-empty) of a UTF-8 text file."""
    text = Path(path).read_text(encoding="utf-8")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def documents_from_jsonl(path, key="text"):
    """The `key` string of each record of a JSON Lines file (blank lines skipped).

    A line that is not a JSON object with a string under `key` is a ValueError naming the file,
    line and key.
    """
    docs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e.msg})") from None
            if not isinstance(rec, dict) or not isinstance(rec.get(key), str):
                have = ", ".join(sorted(rec)) if isinstance(rec, dict) else type(rec).__name__
                raise ValueError(f"{path}:{n}: no string under --text-key {key!r} (keys: {have})")
            docs.append(rec[key])
    return docs


def documents_from_dataset(name, key="text", config=None, split="train"):
    """The `key` column of a Hugging Face dataset (a hub name or a local directory), streamed."""
    try:
        import datasets
    except ImportError:
        raise SystemExit("--dataset needs the `datasets` package: pip install datasets") from None
    ds = datasets.load_dataset(name, config, split=split, streaming=True)
    for n, rec in enumerate(ds):
        if not isinstance(rec.get(key), str):
            raise ValueError(f"dataset {name} ({split}) record {n}: no string column {key!r} (columns: "
                             f"{', '.join(sorted(rec))}); choose one with --text-key")
        yield rec[key]


def tokenize_documents(docs, tokenizer, max_len: int, max_tokens: int | None):
    """Token ids of the documents: each split into chunks of at most max_len tokens, up to max_tokens in all."""
    out, total = [], 0
    for doc in docs:
        ids = tokenizer(doc)["input_ids"]
        for i in range(0, len(ids), max_len):
            chunk = ids[i: i + max_len]
            if max_tokens is not None:
                chunk = chunk[: max(0, max_tokens - total)]
            if chunk:
                out.append(chunk)
                total += len(chunk)
        if max_tokens is not None and total >= max_tokens:
            break
    return out


def read_sequences(text_path, tokenizer, max_len: int, max_tokens: int | None):
    """Token ids of a text file: one sequence per paragraph, split into chunks of at most max_len."""
    return tokenize_documents(documents_from_text(text_path), tokenizer, max_len, max_tokens)


# ---------------------------------------------------------------- command line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face model id or local directory")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--text", help="UTF-8 text file; paragraphs (blank-line separated) are documents")
    src.add_argument("--jsonl", help="JSON Lines file; each record's --text-key string is a document")
    src.add_argument("--dataset", help="Hugging Face dataset name or local dataset directory (needs `datasets`)")
    p.add_argument("--text-key", default="text", help="field of a JSON Lines record or dataset column (default text)")
    p.add_argument("--dataset-config", default=None, help="dataset configuration name")
    p.add_argument("--split", default="train", help="dataset split (default train)")
    p.add_argument("-o", "--output", required=True, help="output trace (.safetensors)")
    p.add_argument("--candidates", type=int, default=None,
                   help="router candidates m recorded per token (default: top-k)")
    p.add_argument("--max-len", type=int, default=2048,
                   help="longest sequence (prompt) per forward pass (default 2048)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop reading input after this many tokens")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward pass (default 1)")
    p.add_argument("--generate", type=int, default=0, metavar="N",
                   help="greedily generate N tokens per prompt with the KV cache and record those (phase decode)")
    p.add_argument("--prefill-output", default=None, help="with --generate: also write the prompts' prefill trace here")
    p.add_argument("--lookahead", type=int, default=0, metavar="M",
                   help="also record lookahead_ids: per layer, the top-M ids of its router on the previous "
                        "MoE layer's input")
    p.add_argument("--dtype", default="bfloat16", help="torch dtype to load the model in (default bfloat16; or auto)")
    p.add_argument("--device", default="cpu", help="torch device without --device-map (default cpu)")
    p.add_argument("--device-map", default=None, help="accelerate device map, e.g. auto (model larger than one device)")
    p.add_argument("--offload-folder", default=None, help="with --device-map: where weights that fit nowhere go")
    p.add_argument("--trust-remote-code", action="store_true", help="allow the model repository's own code")
    p.add_argument("--no-norms", action="store_true", help="skip expert output norms (no REAP; faster)")
    p.add_argument("--keep", default=None, metavar="KEEP_JSON",
                   help="record the pruned model: a keep map (moe-offload keep -o); pruned experts are never "
                        "routed, the next-best kept one takes the slot (docs/quality.md)")
    return p.parse_args(argv)


def load_model(a):
    """(tokenizer, model) as the arguments ask."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.model, trust_remote_code=a.trust_remote_code)
    kw = {"dtype": a.dtype if a.dtype == "auto" else getattr(torch, a.dtype), "trust_remote_code": a.trust_remote_code}
    if a.device_map:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise SystemExit("--device-map needs the `accelerate` package: pip install accelerate") from None
        kw["device_map"] = a.device_map
        if a.offload_folder:
            kw["offload_folder"] = a.offload_folder
    model = AutoModelForCausalLM.from_pretrained(a.model, **kw)
    if not a.device_map:
        model = model.to(a.device)
    return tok, model


def main(argv=None):
    a = parse_args(argv)
    keep = None
    if a.keep:
        from keep_mask import read_keep_map

        keep = read_keep_map(a.keep)
    tok, model = load_model(a)
    if a.text:
        docs, name = documents_from_text(a.text), Path(a.text).name
    elif a.jsonl:
        docs, name = documents_from_jsonl(a.jsonl, a.text_key), Path(a.jsonl).name
    else:
        docs, name = documents_from_dataset(a.dataset, a.text_key, a.dataset_config, a.split), a.dataset
    seqs = tokenize_documents(docs, tok, a.max_len, a.max_tokens)
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    res = capture(
        model, seqs, a.output, candidates=a.candidates, model_name=a.model, source=f"capture_routing.py on {name}",
        norms=not a.no_norms, batch_size=a.batch_size, generate=a.generate, lookahead=a.lookahead,
        prefill_output=a.prefill_output, pad_id=pad, keep=keep,
    )
    for c in res if isinstance(res, tuple) else (res,):
        print(f"wrote {c.path}: {c.layers} MoE layers x {c.tokens} tokens, {c.candidates} candidates, top-{c.top_k}"
              f"{f', lookahead {c.lookahead}' if c.lookahead else ''}; {c.tied_rows} rows chose among tied logits")
    print(f"next: moe-offload inspect {a.output}")


if __name__ == "__main__":
    try:
        main()
    except ValueError as e:  # bad input (files, keys, keep maps): a message, not a traceback
        print(f"capture_routing.py: error: {e}", file=sys.stderr)
        sys.exit(2)
