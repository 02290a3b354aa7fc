#!/usr/bin/env python3
"""Two `moe_offload.replay` calls in two Python threads against one call: the GIL is released.

    python python/bench_threads.py [TRACE] [--policy lru --cap 16 --repeat 3]

Without TRACE it generates a one-layer synthetic trace with the CLI (`moe-offload synth`,
MOE_OFFLOAD_BIN or target/release/moe-offload): a one-layer replay is one task on the rayon
pool, so one call keeps one core busy and two calls in two threads can use two cores. Prints
the best-of-N wall time of one call, of two calls in two threads, and their ratio (on 2 idle
cores, below 1.3 means the calls ran in parallel; with the GIL held it would be about 2). A
many-layer trace parallelizes one call over layers already; two calls then share the cores.
A measurement script, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import moe_offload as mo


def best_of(n, f):
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("trace", nargs="?")
    p.add_argument("--policy", default="lru")
    p.add_argument("--cap", type=int, default=16)
    p.add_argument("--tokens", type=int, default=2_000_000, help="tokens of the generated trace")
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    path = a.trace
    if path is None:
        exe = os.environ.get("MOE_OFFLOAD_BIN") or str(Path(__file__).resolve().parent.parent / "target/release/moe-offload")
        path = os.path.join(tempfile.mkdtemp(prefix="moe-offload-bench-"), "one-layer.safetensors")
        subprocess.run([exe, "synth", "--layers", "1", "--experts", "64", "--top-k", "6", "--candidates", "6",
                        "--tokens", str(a.tokens), "-o", path], check=True, capture_output=True)
    t = mo.open_trace(path)
    call = lambda: mo.replay(t, policy=a.policy, cap=a.cap)  # noqa: E731
    call()  # validation and page cache, once

    def two():
        ts = [threading.Thread(target=call) for _ in range(2)]
        for th in ts:
            th.start()
        for th in ts:
            th.join()

    one_s, two_s = best_of(a.repeat, call), best_of(a.repeat, two)
    print(f"{t}: {a.policy} cap {a.cap}")
    print(f"one call {one_s:.3f} s; two calls in two threads {two_s:.3f} s; ratio {two_s / one_s:.2f} "
          f"({os.cpu_count()} CPUs, rayon threads {os.environ.get('RAYON_NUM_THREADS', 'all')})")


if __name__ == "__main__":
    main()
