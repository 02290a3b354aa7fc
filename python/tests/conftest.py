"""Fixtures of the moe_offload package tests: the CLI binary, synthetic traces, a trace writer.

The binary is MOE_OFFLOAD_BIN, else $CARGO_TARGET_DIR or target/ (release, then debug); tests
that compare with it skip when it is not built, except under CI=true, where they fail. Real-data
tests read MOE_OFFLOAD_REAL_DATA: skipped when it is unset, failing when it is set and missing.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _binary() -> Path | None:
    exe = os.environ.get("MOE_OFFLOAD_BIN")
    if exe:
        return Path(exe)
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    for profile in ("release", "debug"):
        p = target / profile / "moe-offload"
        if p.is_file():
            return p
    return None


@pytest.fixture(scope="session")
def cli():
    """Runs the moe-offload binary; returns its stdout (raises with stderr on failure)."""
    exe = _binary()
    if exe is None or not exe.is_file():
        if CI:
            pytest.fail(f"moe-offload binary not found ({exe}); CI builds it first")
        pytest.skip("moe-offload is not built (cargo build --release -p cli, or set MOE_OFFLOAD_BIN)")

    def run(*args, cwd=None) -> str:
        p = subprocess.run([str(exe), *map(str, args)], capture_output=True, text=True, cwd=cwd)
        if p.returncode != 0:
            raise AssertionError(f"moe-offload {' '.join(map(str, args))} failed: {p.stderr}")
        return p.stdout

    return run


@pytest.fixture(scope="session")
def synth(cli, tmp_path_factory):
    """Two synthetic traces of one model (calibration and held-out), with norms and sequences."""
    d = tmp_path_factory.mktemp("synth")
    common = ["--layers", 4, "--experts", 32, "--top-k", 4, "--candidates", 8, "--tokens", 3000,
              "--sequences", 12, "--norms", "--model-seed", 5]
    cli("synth", *common, "--seed", 1, "-o", d / "calib.safetensors")
    cli("synth", *common, "--seed", 2, "-o", d / "heldout.safetensors")
    return d


def write_trace(path, ids, *, num_experts, top_k, scores=None, gates=None, seq_offsets=None, model="hand"):
    """Writes a trace file by hand (docs/trace-format.md): `ids` is [L, T, m] uint16."""
    ids = np.ascontiguousarray(ids, dtype="<u2")
    layers = ids.shape[0]
    tensors = []
    if seq_offsets is not None:
        tensors.append(("seq_offsets", "U64", np.asarray(seq_offsets, dtype="<u8")))
    if scores is not None:
        tensors.append(("scores", "F32", np.asarray(scores, dtype="<f4")))
    if gates is not None:
        tensors.append(("gates", "F32", np.asarray(gates, dtype="<f4")))
    tensors.append(("ids", "U16", ids))
    meta = {
        "format": "moe-offload-trace", "format_version": "1", "model": model, "num_experts": str(num_experts),
        "top_k": str(top_k), "layer_ids": json.dumps(list(range(layers))),
        "score_kind": "logits" if scores is not None else "none", "phase": "prefill", "source": "test",
    }
    header = {"__metadata__": meta}
    off = 0
    blobs = []
    for name, dtype, arr in tensors:
        b = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
    return Path(path)


@pytest.fixture(scope="session")
def real_data():
    """The real-data directory, or a skip when MOE_OFFLOAD_REAL_DATA is unset."""
    d = os.environ.get("MOE_OFFLOAD_REAL_DATA")
    if not d:
        pytest.skip("MOE_OFFLOAD_REAL_DATA is not set")
    p = Path(d)
    if not (p / "esft-dsv2lite").is_dir():
        pytest.fail(f"MOE_OFFLOAD_REAL_DATA={d} is set but {p / 'esft-dsv2lite'} is missing")
    return p


@pytest.fixture(scope="session")
def esft(cli, real_data, tmp_path_factory):
    """The real ESFT translation import (26 layers x 8,251 tokens) and the law one, held out."""
    d = tmp_path_factory.mktemp("esft")
    cli("import", "esft", real_data / "esft-dsv2lite", "--domains", "translation", "-o", d / "translation.safetensors")
    cli("import", "esft", real_data / "esft-dsv2lite", "--domains", "law", "-o", d / "law.safetensors")
    return d
