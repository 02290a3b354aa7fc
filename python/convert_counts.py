#!/usr/bin/env python3
"""Convert per-expert count files saved with torch (.pt) or pickle to the JSON that
`moe-offload import counts` reads: {"layers": [ids], "counts": [[E counts], ...], "top_k": k}.

Accepted objects (after --key picks an entry of a dict that holds other things too):
- a mapping {layer: counts}, where layer is an int or a string with one number in it
  ("model.layers.3.mlp") and counts is a list, tuple, numpy array or 1-D tensor of E counts,
  or a mapping {expert: count} (absent experts count 0);
- a list or tuple of per-layer counts (the layers are indices 0..L: give the model's ids to
  `moe-offload import counts --layer-ids`);
- a 2-D array or tensor [L, E];
- a mapping with "counts" (and optionally "layers", "top_k"), as this script writes.
Counts must be whole numbers >= 0. Nothing is guessed: a layout not listed is refused with the
path of the offending entry.

Usage: python convert_counts.py INPUT(.pt|.pkl|.pickle) -o counts.json [--key NAME] [--top-k K]
torch is needed for .pt files only (loaded with weights_only=True where torch supports it).
"""

import argparse
import json
import pickle
import re
import sys
from pathlib import Path


class CountsError(ValueError):
    """A count file this script cannot convert; the message names the entry and what to do."""


def _plain(x):
    """Tensors and numpy arrays to nested Python lists; other values unchanged."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch.Tensor
        x = x.detach().cpu()
    if hasattr(x, "tolist"):
        return x.tolist()
    return x


def _whole(v, where):
    if isinstance(v, bool):
        raise CountsError(f"{where}: {v!r} is not a count")
    if isinstance(v, int) and v >= 0:
        return v
    if isinstance(v, float) and v >= 0 and v.is_integer():
        return int(v)
    raise CountsError(f"{where}: {v!r} is not a whole number >= 0")


def _layer_id(key, where):
    if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
        return key
    if isinstance(key, str):
        if key.strip().isdigit():
            return int(key)
        runs = re.findall(r"\d+", key)
        if len(runs) == 1:
            return int(runs[0])
    raise CountsError(f"{where}: key {key!r} is not a layer (an int, or a name with exactly one number in it)")


def _vector(v, where):
    v = _plain(v)
    if isinstance(v, dict):
        experts = {}
        for e, c in v.items():
            experts[_layer_id(e, f"{where} expert key")] = _whole(_plain(c), f"{where}[{e!r}]")
        if not experts:
            raise CountsError(f"{where}: no experts")
        out = [0] * (max(experts) + 1)
        for e, c in experts.items():
            out[e] = c
        return out, True
    if isinstance(v, (list, tuple)):
        return [_whole(c, f"{where}[{i}]") for i, c in enumerate(v)], False
    raise CountsError(f"{where}: {type(v).__name__} is not a vector of per-expert counts")


def to_counts(obj, key=None, top_k=None):
    """The JSON-ready {"layers", "counts", "top_k"} of a loaded count object."""
    if key is not None:
        if not isinstance(obj, dict) or key not in obj:
            have = ", ".join(map(repr, obj)) if isinstance(obj, dict) else type(obj).__name__
            raise CountsError(f"--key {key!r}: not in the file (it has {have})")
        obj = obj[key]
    obj = _plain(obj)
    file_k = None
    if isinstance(obj, dict) and "counts" in obj:
        file_k = obj.get("top_k")
        rows = _plain(obj["counts"])
        if not isinstance(rows, (list, tuple)):
            raise CountsError("'counts': not a list of per-layer counts")
        layers = obj.get("layers")
        layers = list(range(len(rows))) if layers is None else [_layer_id(x, "'layers'") for x in _plain(layers)]
        if len(layers) != len(rows):
            raise CountsError(f"'layers' has {len(layers)} ids but 'counts' {len(rows)} rows")
        pairs = [(lid, _vector(r, f"'counts'[{i}]")) for i, (lid, r) in enumerate(zip(layers, rows))]
    elif isinstance(obj, dict):
        pairs = [(_layer_id(k, "top level"), _vector(v, f"[{k!r}]")) for k, v in obj.items()]
    elif isinstance(obj, (list, tuple)):
        pairs = [(i, _vector(v, f"[{i}]")) for i, v in enumerate(obj)]
    else:
        raise CountsError(
            f"the file holds a {type(obj).__name__}: expected a dict of per-layer counts, a list of them, "
            "or a 2-D array (use --key NAME for an entry of a larger dict)"
        )
    if not pairs:
        raise CountsError("no layers")
    pairs.sort(key=lambda p: p[0])
    ids = [p[0] for p in pairs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise CountsError(f"layer {dup} appears twice")
    width = max(len(v) for _, (v, _) in pairs)
    # Expert dicts may stop early (their last experts never routed); vectors must be whole.
    for lid, (v, sparse) in pairs:
        if not sparse and len(v) != width:
            raise CountsError(f"layer {lid} has {len(v)} experts, another layer {width}: one count per expert")
    counts = [v + [0] * (width - len(v)) for _, (v, _) in pairs]
    if top_k is not None and file_k is not None and int(file_k) != top_k:
        raise CountsError(f"the file's top_k {file_k} disagrees with --top-k {top_k}")
    out = {"layers": ids, "counts": counts}
    k = top_k if top_k is not None else file_k
    if k is not None:
        out["top_k"] = int(k)
    return out


def load(path):
    """The object in a .pt (torch) or pickle file."""
    path = Path(path)
    if path.suffix in (".pt", ".pth", ".bin"):
        try:
            import torch
        except ImportError as e:
            raise CountsError(f"{path}: reading a torch file needs torch (pip install torch)") from e
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except TypeError:  # torch < 1.13 has no weights_only
            return torch.load(path, map_location="cpu")
    with open(path, "rb") as f:
        return pickle.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("input", help="a .pt/.pth (torch) or .pkl/.pickle file of per-expert counts")
    ap.add_argument("-o", "--output", required=True, help="the JSON to write (for moe-offload import counts)")
    ap.add_argument("--key", help="the entry of a dict that holds the counts")
    ap.add_argument("--top-k", type=int, help="the model's experts per token, recorded in the JSON")
    a = ap.parse_args(argv)
    try:
        out = to_counts(load(a.input), key=a.key, top_k=a.top_k)
    except CountsError as e:
        print(f"{a.input}: {e}", file=sys.stderr)
        return 1
    Path(a.output).write_text(json.dumps(out) + "\n")
    print(f"wrote {a.output}: {len(out['layers'])} layers x {len(out['counts'][0])} experts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
