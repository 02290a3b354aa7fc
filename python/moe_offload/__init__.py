"""moe_offload: replay recorded Mixture-of-Experts routing traces through expert-cache policies.

The whole pipeline of the ``moe-offload`` command line, one call each, with the same names and
the same figures (docs/python.md; the definitions are SEMANTICS.md's)::

    import moe_offload as mo
    t = mo.open_trace("translation.safetensors")  # memory-mapped, validated as the CLI does
    t.ids(0).shape                                # (T, m) uint16, a read-only view of the file
    s = mo.stats(t)                               # SEMANTICS §2
    k = mo.keep(s, "frequency", k=48)             # §3
    mo.retention(k, mo.open_trace("heldout.safetensors"))  # §4
    r = mo.replay(t, policy="lru", cap=16, keep=k)         # §5: the fields of `replay --json`
    r.misses_per_token
    mo.mrc(t).curve()                             # (cap, misses per token) at every cache size
    mo.plan(t, heldout, budget_gb=8).chosen       # per-layer caps for a memory budget
    mo.sweep("grid.json", "sweep-out").to_pandas()  # a grid's rows as a DataFrame
    mo.read_results("sweep-out").to_pandas()      # a sweep written before

Errors are ``MoeOffloadError`` subclasses (``TraceError``, ``SaliencyError``, ``ReplayError``,
``SweepError``, ``UsageError``, ``InternalError``) whose message is the command line's, naming
the file, tensor, layer or key. Long calls release the GIL and run on the same rayon pool as the
CLI; Ctrl-C interrupts them.
"""

from __future__ import annotations

from ._capture import capture
from ._core import (
    InternalError,
    KeepMap,
    MoeOffloadError,
    ReplayError,
    SaliencyError,
    Stats,
    SweepError,
    Trace,
    TraceError,
    UsageError,
    __version__,
    full_keep,
    import_esft,
    inspect,
    keep,
    mrc,
    open_trace,
    plan,
    read_keep,
    read_stats,
    replay,
    retention,
    stats,
)
from ._result import Result
from ._results import Results, read_results, sweep

__all__ = [
    "InternalError",
    "KeepMap",
    "MoeOffloadError",
    "ReplayError",
    "Result",
    "Results",
    "SaliencyError",
    "Stats",
    "SweepError",
    "Trace",
    "TraceError",
    "UsageError",
    "__version__",
    "capture",
    "full_keep",
    "import_esft",
    "inspect",
    "keep",
    "mrc",
    "open_trace",
    "plan",
    "read_keep",
    "read_results",
    "read_stats",
    "replay",
    "retention",
    "stats",
    "sweep",
]
