"""Type stubs of the native module ``moe_offload._core`` (checked against it by mypy.stubtest in CI)."""

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

import numpy as np
import numpy.typing as npt

from ._result import Result

_Path = Union[str, "os.PathLike[str]"]

__version__: str

class MoeOffloadError(Exception):
    """Base class of every error moe_offload raises; the message is the command line's."""

class TraceError(MoeOffloadError):
    """A trace that cannot be read or breaks the format (file, tensor, layer and token named)."""

class SaliencyError(MoeOffloadError):
    """Statistics, keep maps or retention: a bad file, a missing statistic, a K too large."""

class ReplayError(MoeOffloadError):
    """A replay configuration the trace cannot be replayed with (cap, k_used, policy, prefetch)."""

class SweepError(MoeOffloadError):
    """A grid, a sweep output directory or its results.json that cannot be read or run."""

class UsageError(MoeOffloadError):
    """Arguments that do not fit together, or a value out of range (as the CLI refuses a flag)."""

class InternalError(MoeOffloadError):
    """A bug in moe_offload (a panic in the native code): please report it with the message."""

@final
class Trace:
    """A routing trace, memory-mapped (SEMANTICS.md §1); see ``open_trace``."""

    @property
    def path(self) -> str:
        """The path the trace was opened from."""
    @property
    def num_layers(self) -> int:
        """L: traced MoE layers."""
    @property
    def num_experts(self) -> int:
        """E: routed experts per layer."""
    @property
    def top_k(self) -> int:
        """k: experts the model used per token."""
    @property
    def candidates(self) -> int:
        """m: router candidates recorded per (layer, token)."""
    @property
    def tokens(self) -> int:
        """T: tokens, in trace order."""
    @property
    def layer_ids(self) -> List[int]:
        """The model's id of each traced layer."""
    @property
    def byte_len(self) -> int:
        """Size of the file in bytes."""
    @property
    def metadata(self) -> Dict[str, str]:
        """The trace's metadata (string keys and values)."""
    @property
    def tensors(self) -> List[str]:
        """The tensors the trace holds (``ids`` and the optional ones present)."""
    @property
    def seq_offsets(self) -> Optional[List[int]]:
        """First token of each sequence, or None."""
    @property
    def step_offsets(self) -> Optional[List[int]]:
        """First token of each engine step, or None."""
    def ids(self, layer: int) -> npt.NDArray[np.uint16]:
        """Candidate ids of layer index ``layer``: read-only uint16 ``[T, m]``, a view of the file."""
    def scores(self, layer: int) -> npt.NDArray[np.float32]:
        """Router scores of layer index ``layer``: read-only float32 ``[T, m]``, a view of the file."""
    def gates(self, layer: int) -> npt.NDArray[np.float32]:
        """Gate weights of layer index ``layer``: read-only float32 ``[T, k]``, a view of the file."""
    def out_norms(self, layer: int) -> npt.NDArray[np.float32]:
        """Expert output norms of layer index ``layer``: read-only float32 ``[T, k]``, a view."""
    def validate(self) -> None:
        """Validates every value of every tensor (what ``moe-offload inspect`` checks)."""

@final
class _Mapped:
    """The owner of a numpy view of a mapped trace (the array's ``base``)."""

    @property
    def __array_interface__(self) -> Dict[str, Any]: ...

@final
class Stats:
    """Per-(layer, expert) saliency statistics (SEMANTICS.md §2)."""

    @property
    def num_experts(self) -> int: ...
    @property
    def top_k(self) -> int: ...
    @property
    def layer_ids(self) -> List[int]: ...
    @property
    def source(self) -> str: ...
    @property
    def count(self) -> List[List[int]]:
        """``count[l][e]``: slots of layer index l routed to expert e."""
    @property
    def present(self) -> List[str]:
        """The names of the statistics present."""
    def to_dict(self) -> Dict[str, Any]:
        """The statistics file's JSON document (kind ``moe-offload-stats`` first)."""
    def write(self, path: _Path) -> None:
        """Writes the statistics JSON file (atomically)."""

@final
class KeepMap:
    """The experts kept per layer (SEMANTICS.md §3)."""

    @property
    def label(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def k(self) -> int: ...
    @property
    def num_experts(self) -> int: ...
    @property
    def layer_ids(self) -> List[int]: ...
    @property
    def layers(self) -> List[List[int]]:
        """Kept expert ids per layer index, ascending."""
    @property
    def short_layers(self) -> List[int]: ...
    @property
    def total_kept(self) -> int: ...
    def to_dict(self) -> Dict[str, Any]:
        """The keep-map file's JSON document (kind ``moe-offload-keep-map`` first)."""
    def write(self, path: _Path) -> None:
        """Writes the keep-map JSON file (atomically)."""

_MapArg = Union[KeepMap, _Path]

def open_trace(path: _Path) -> Trace:
    """Opens a trace (``.safetensors``) as the command line does; raises ``TraceError``."""

def import_esft(
    dir: _Path, output: _Path, *, domains: Optional[Sequence[str]] = None, num_experts: int = 64, top_k: int = 6
) -> Trace:
    """Imports the ESFT layout as ``moe-offload import esft``, writes ``output`` and opens it."""

def inspect(trace: Trace) -> Result:
    """What ``moe-offload inspect --json`` reports: shape, metadata, per-layer expert usage and reuse."""

def stats(trace: Trace) -> Stats:
    """Statistics of ``trace`` (SEMANTICS.md §2), as ``moe-offload stats`` computes them."""

def read_stats(path: _Path) -> Stats:
    """Reads a statistics JSON file."""

def keep(
    stats: Stats,
    metric: str,
    k: Optional[int] = None,
    *,
    budget: Optional[int] = None,
    floor: Optional[int] = None,
    budget_scale: Optional[str] = None,
    tau: float = 64.0,
    hybrid_base: Optional[Sequence[str]] = None,
    allow_short_layers: bool = False,
) -> KeepMap:
    """A keep map (SEMANTICS.md §3), as ``moe-offload keep --metric M --k K`` builds it."""

def read_keep(path: _Path) -> KeepMap:
    """Reads a keep-map JSON file."""

def full_keep(source: Union[Trace, Stats]) -> KeepMap:
    """The unpruned map (every expert kept)."""

def retention(keep: KeepMap, heldout: Union[Trace, Stats]) -> Dict[str, Any]:
    """Out-of-sample retention (SEMANTICS.md §4), one entry of ``retention --json``'s ``maps``."""

def replay(
    trace: Trace,
    *,
    policy: str,
    cap: Optional[int] = None,
    shared_cap: Optional[int] = None,
    layer_caps: Union[Sequence[int], str, os.PathLike[str], None] = None,
    keep: Optional[_MapArg] = None,
    k_used: Optional[int] = None,
    warmup: int = 64,
    lam: float = 0.0,
    j: int = 0,
    decay: float = 0.99,
    near_pick_n: int = 48,
    semantics: str = "k-way",
    reset_at_sequence: bool = False,
    pin: Optional[_MapArg] = None,
    tier2: Optional[str] = None,
    served: bool = False,
    batch: Optional[int] = None,
    link_gbps: Optional[float] = None,
    compute_ms_per_step: Optional[float] = None,
    prefetch: Optional[str] = None,
    calib: Optional[Trace] = None,
    timeline: bool = False,
    profile: Optional[str] = None,
    bandwidth: Optional[float] = None,
    shuffle: Optional[int] = None,
    exec: str = "transfer",
    overlap: Optional[str] = None,
    host_gbps: Optional[float] = None,
    host_ms_per_row: Optional[float] = None,
    host_sync_ms: Optional[float] = None,
    profile_file: Optional[Union[str, "os.PathLike[str]"]] = None,
) -> Result:
    """One configuration on ``trace``: the fields of ``moe-offload replay --json``.

    ``exec="host"`` (or ``"host:R"``) prices hybrid execution (SEMANTICS.md §14): non-resident
    experts computed on the CPU; ``overlap`` ``"sequential"`` or ``"concurrent"``; ``host_gbps``
    (GB/s), ``host_ms_per_row`` and ``host_sync_ms`` (ms) override the profile's; adds
    ``host_runs``, ``loads``, ``copies`` and a ``cost`` with ``tok_s`` and seconds per row.

    ``shared_cap=C`` replays one cache of C (layer, expert) slots for every layer instead of
    ``cap`` per layer (SEMANTICS.md §15.1); adds ``shared_cap``, ``layer_slots_end`` and
    ``layer_slots_mean`` (slots each layer holds at the end and on average over counted tokens)."""

def mrc(
    trace: Trace,
    *,
    policy: str = "lru",
    caps: Optional[Tuple[int, int]] = None,
    keep: Optional[_MapArg] = None,
    k_used: Optional[int] = None,
    warmup: int = 64,
    semantics: str = "k-way",
    yes: bool = False,
    pin: Optional[_MapArg] = None,
) -> Result:
    """The miss-ratio curve, as ``moe-offload mrc --json`` computes it."""

def plan(
    in_sample: Trace,
    out_of_sample: Trace,
    *,
    budget_gb: float,
    variants: Optional[Sequence[str]] = None,
    pinned_gb: float = 0.0,
    profile: Optional[str] = None,
    expert_mb: Optional[float] = None,
    policy: str = "lru",
    k_used: Optional[int] = None,
    warmup: int = 64,
    max_slot_replacement: Optional[float] = None,
    pin_counts: Optional[Sequence[int]] = None,
    yes: bool = False,
) -> Result:
    """Per-layer caches and a keep map for a memory budget, as ``moe-offload plan --json``."""

def _read_results_json(path: _Path) -> Dict[str, Any]:
    """A sweep's results.json, read and checked by the sweep crate."""

def _sweep_json(
    grid: _Path,
    output: Optional[_Path] = None,
    in_sample: Optional[_Path] = None,
    out_of_sample: Optional[_Path] = None,
    yes: bool = False,
) -> Dict[str, Any]:
    """Runs a grid; the results.json document (and the output directory, when given)."""

__all__ = [
    "__version__",
    "MoeOffloadError",
    "TraceError",
    "SaliencyError",
    "ReplayError",
    "SweepError",
    "UsageError",
    "InternalError",
    "Trace",
    "_Mapped",
    "open_trace",
    "import_esft",
    "inspect",
    "Stats",
    "KeepMap",
    "stats",
    "read_stats",
    "keep",
    "read_keep",
    "full_keep",
    "retention",
    "replay",
    "mrc",
    "plan",
    "_read_results_json",
    "_sweep_json",
]
