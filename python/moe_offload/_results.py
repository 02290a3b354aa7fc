"""``read_results``: a sweep's ``results.json`` as a table (pandas, Arrow)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

from . import _core

KEY_COLUMNS = ["key", "sample", "variant", "policy", "lambda", "j", "cap", "layer_caps", "k_used"]
COUNT_COLUMNS = ["tokens", "picks", "hits", "misses", "forced_misses", "substituted", "pruned_slots"]


def _flat(prefix: str, value: Any, out: Dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flat(f"{prefix}.{k}" if prefix else k, v, out)
    else:
        out[prefix] = value


class Results:
    """The rows of a sweep (``results.json``), one per configuration and sample.

    Columns (``columns()``, ``to_pandas()``, ``__arrow_c_stream__``) are those of the sweep's
    ``results.csv``: the key fields (``key``, ``sample`` = ``in_sample`` or ``out_of_sample``,
    ``variant``, ``policy``, ``lambda``, ``j``, ``cap``, ``layer_caps`` (its name, or ``""``),
    ``k_used``), the counts, ``hit_rate``, ``misses_per_token``, then per profile one
    ``ssd_mb_per_token@PROFILE`` column (MB per token) and per profile and bandwidth one
    ``tok_s@PROFILE@BW`` column (tokens per second), then the deployment and prefetch figures of
    rows that have them as ``deploy.*`` and ``prefetch.*`` columns (None elsewhere). ``document``
    is the whole ``results.json`` (``provenance``, ``rows``) as a dict.
    """

    def __init__(self, document: Dict[str, Any]) -> None:
        self.document = document
        self.rows: List[Dict[str, Any]] = document["rows"]
        self.provenance: Dict[str, Any] = document.get("provenance", {})

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        return f"Results({len(self.rows)} rows)"

    def records(self) -> List[Dict[str, Any]]:
        """One flat dict per row (the columns of ``to_pandas``)."""
        out = []
        extra_keys: List[str] = []
        flats = []
        for r in self.rows:
            c = r["config"]
            rec: Dict[str, Any] = {
                "key": r["key"],
                "sample": r["sample"],
                "variant": c["variant"],
                "policy": c["policy"],
                "lambda": c["lambda"],
                "j": c["j"],
                "cap": c["cap"],
                "layer_caps": (c.get("layer_caps") or {}).get("name", ""),
                "k_used": c["k_used"],
            }
            for k in COUNT_COLUMNS:
                rec[k] = r["counts"][k]
            rec["hit_rate"] = r["hit_rate"]
            rec["misses_per_token"] = r["misses_per_token"]
            prev = None
            for cost in r["cost"]:
                if cost["profile"] != prev:
                    rec[f"ssd_mb_per_token@{cost['profile']}"] = cost["ssd_mb_per_token"]
                    prev = cost["profile"]
                rec[f"tok_s@{cost['profile']}@{_num(cost['bandwidth_gbps'])}"] = cost["tok_s"]
            flat: Dict[str, Any] = {}
            for section in ("deploy", "prefetch"):
                if r.get(section) is not None:
                    _flat(section, r[section], flat)
                if c.get(section) is not None:
                    _flat(f"config.{section}", c[section], flat)
            for k in flat:
                if k not in extra_keys:
                    extra_keys.append(k)
            flats.append(flat)
            out.append(rec)
        for rec, flat in zip(out, flats):
            for k in extra_keys:
                rec[k] = flat.get(k)
        return out

    def columns(self) -> Dict[str, List[Any]]:
        """The table column by column: name -> one value per row."""
        recs = self.records()
        names: List[str] = []
        for rec in recs:
            for k in rec:
                if k not in names:
                    names.append(k)
        return {n: [rec.get(n) for rec in recs] for n in names}

    def to_pandas(self) -> Any:
        """The rows as a ``pandas.DataFrame`` (needs pandas), one row per configuration and sample."""
        import pandas as pd  # type: ignore[import-untyped,unused-ignore]

        return pd.DataFrame(self.columns())

    def to_arrow(self) -> Any:
        """The rows as a ``pyarrow.Table`` (needs pyarrow)."""
        import pyarrow as pa  # type: ignore[import-untyped,unused-ignore]

        return pa.table(self.columns())

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The Arrow PyCapsule stream interface: ``pyarrow.table(results)`` and
        ``polars.DataFrame(results)`` read the table through it (built with pyarrow)."""
        return self.to_arrow().__arrow_c_stream__(requested_schema)


def _num(x: float) -> str:
    # Rust's `f64` Display, as the CSV column names spell bandwidths: 3.9, 7, 0.5.
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def read_results(path: Union[str, "os.PathLike[str]"]) -> Results:
    """Reads a sweep's ``results.json`` (the file, or the sweep's output directory), checked by
    the same reader as ``moe-offload sweep merge``; raises ``SweepError`` naming the file."""
    return Results(_core._read_results_json(os.fspath(path)))


def sweep(
    grid: Union[str, "os.PathLike[str]"],
    output: Union[str, "os.PathLike[str]", None] = None,
    *,
    in_sample: Union[str, "os.PathLike[str]", None] = None,
    out_of_sample: Union[str, "os.PathLike[str]", None] = None,
    yes: bool = False,
) -> Results:
    """Runs the grid file ``grid`` (docs/grid-format.md) as ``moe-offload sweep GRID -o OUTPUT``
    does: every configuration on the in-sample and the out-of-sample trace (the grid's, or
    ``in_sample`` / ``out_of_sample``), keep maps built from the in-sample statistics. Returns
    the rows (``Results``: ``to_pandas()``); with ``output``, also writes the output directory
    (``results.json``, ``results.csv``, ``summary.md``, ...) atomically. A grid of more than
    10,000 configurations is refused without ``yes=True``. Runs with the GIL released."""
    return Results(_core._sweep_json(os.fspath(grid), _opt(output), _opt(in_sample), _opt(out_of_sample), yes))


def _opt(p: Union[str, "os.PathLike[str]", None]) -> Optional[str]:
    return None if p is None else os.fspath(p)
