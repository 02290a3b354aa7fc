#!/usr/bin/env python3
"""Predicted against measured tok/s on this machine (docs/validation.md): case (a), every expert on the
CPU in memory; case (b), a model larger than its memory limit, its experts streamed from disk through mmap.

For each case (a model shape and weight type), it makes a random-weight MoE model with
python/tiny_gguf.py, then:

1. `moe-offload capture MODEL --tokens IDS --generate G --timing-run`: the routing, and llama.cpp's own
   timings of a plain run of the same tokens (prompt ms per token, decode ms per token): measured;
2. `moe-offload profile measure --gguf MODEL`: host_gbps, host_ms_per_row and compute_ms from
   llama.cpp's CPU kernels on the model's tensor types and shapes;
3. `moe-offload replay TRACE --exec host --cap 0 --profile-file PROFILE`: every pick a host run
   (SEMANTICS §14's all-CPU baseline), per token for decode; `--served` on a prefill-only capture
   (each llama_decode one engine step), with the dense time of a step of that many rows as
   `--compute-ms-per-step`, for prefill: predicted.

Case (b), `stream-<case>` (root, cgroup v1 memory controller): the same model, one sequence, run by
`capture --timing-run` in a memory cgroup limited to a fraction of the model file (each run after
the page cache is dropped, so that the model's pages are charged to the limited cgroup); the
profile adds `--disk` (cold expert reads through mmap: the SSD bandwidth); predicted by
`replay --served --shared-cap C` (SEMANTICS §15.1: the page cache is one pool for every layer),
C = (limit − the run's peak anonymous memory − the dense weights' bytes) / expert bytes, with
compute_ms = the in-memory prediction of case (a) on the same trace.

It prints one Markdown row per case and phase (and writes them as JSON with --json). Run:

    python scripts/validate.py --bin target/release/moe-offload --work /tmp/validate          # case (a)
    python scripts/validate.py --bin ... --work ... --cases stream-mixtral-e8k2-f16           # case (b)
    python scripts/validate.py --bin ... --work ... --cases tiny --check                        # CI

The binary must be built with the capture feature. The torch environment of .ci/run has what the
script imports (torch, transformers, gguf).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import threading
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "python"))
import tiny_gguf  # noqa: E402

# name: (arch, experts, top_k, layers, hidden, heads, kv_heads, expert_ffn, type)
CASES = {
    "tiny": ("qwen3_moe", 8, 2, 2, 64, 4, 2, 64, "f32"),
    "qwen-e32k4-f16": ("qwen3_moe", 32, 4, 8, 1024, 8, 4, 512, "f16"),
    "qwen-e32k4-q8": ("qwen3_moe", 32, 4, 8, 1024, 8, 4, 512, "q8_0"),
    "mixtral-e8k2-f16": ("mixtral", 8, 2, 4, 2048, 16, 8, 2816, "f16"),
    "mixtral-e8k2-q8": ("mixtral", 8, 2, 4, 2048, 16, 8, 2816, "q8_0"),
    "qwen-e64k8-f16": ("qwen3_moe", 64, 8, 12, 768, 8, 4, 384, "f16"),
    "qwen-e64k8-q8": ("qwen3_moe", 64, 8, 12, 768, 8, 4, 384, "q8_0"),
}


# Case (b): a model of case (a) streamed from disk under memory limits (fractions of the file).
STREAM = {f"stream-{c}": c for c in ("mixtral-e8k2-f16", "qwen-e64k8-f16")}
LIMITS = (0.25, 0.5, 0.75)
CGROUP = Path("/sys/fs/cgroup/memory/moe-offload-validate")


def run(bin_, *args, cgroup=None):
    join = None if cgroup is None else (lambda: (cgroup / "cgroup.procs").write_text(str(os.getpid())))
    p = subprocess.run([bin_, *map(str, args)], capture_output=True, text=True, preexec_fn=join)
    if p.returncode != 0:
        raise SystemExit(f"moe-offload {' '.join(map(str, args))}: {p.stderr}")
    return json.loads(p.stdout)


def model(name, work: Path):
    arch, e, k, layers, hidden, heads, kv, ffn, ty = CASES[name]
    d = work / name
    gguf = d / f"{arch}.gguf"
    if not gguf.is_file():
        a = tiny_gguf.parser().parse_args([
            "--arch", arch, "--out-dir", str(d), "--experts", str(e), "--top-k", str(k), "--layers", str(layers),
            "--hidden", str(hidden), "--heads", str(heads), "--kv-heads", str(kv), "--expert-ffn", str(ffn),
            "--type", ty, "--vocab", "320", "--ctx", "1024"])
        tiny_gguf.make(arch, d, a)
    return gguf, (arch, e, k, layers, hidden, ffn, ty)


def case(bin_, name, work: Path, a):
    gguf, shape = model(name, work)
    d = gguf.parent
    ids = d / "ids.txt"
    ids.write_text("".join(" ".join(str(3 + (i * 7 + s * 13) % 310) for i in range(a.prompt)) + "\n"
                           for s in range(a.sequences)))
    threads = ["--threads", str(a.threads)] if a.threads else []
    ctx = a.prompt + a.generate
    dec = run(bin_, "capture", gguf, "--tokens", ids, "--ctx", ctx, "--batch", a.prompt, "--generate", a.generate,
              "--timing-run", "--candidates", shape[2], *threads, "-o", d / "decode.safetensors", "--json")
    pre = run(bin_, "capture", gguf, "--tokens", ids, "--ctx", ctx, "--batch", a.prompt, "--timing-run",
              "--candidates", shape[2], *threads, "-o", d / "prefill.safetensors", "--json")
    prof = run(bin_, "profile", "measure", "--gguf", gguf, "--repeats", a.repeats, *threads, "-o", d / "hw.json",
               "--json")
    common = ["--policy", "lru", "--exec", "host", "--cap", 0, "--warmup", 0, "--profile-file", d / "hw.json", "--json"]
    p_dec = run(bin_, "replay", d / "decode.safetensors", *common)["cost"]["tok_s"]
    # A prefill step's dense compute: the dense weights' products on `prompt` rows at once.
    step_ms = dict(prof["measured"]["dense_rows"])[a.prompt]["median_ms"]
    p_pre = run(bin_, "replay", d / "prefill.safetensors", "--served", "--compute-ms-per-step", step_ms,
                *common)["cost"]["tok_s"]
    m_dec = 1000.0 / dec["timings"]["decode_ms_per_token"]
    m_pre = 1000.0 / pre["timings"]["prompt_ms_per_token"]
    arch, e, k, layers, hidden, ffn, ty = shape
    base = dict(case=name, arch=arch, experts=e, top_k=k, layers=layers, hidden=hidden, expert_ffn=ffn, type=ty,
                threads=prof["measured"]["threads"], expert_mb=prof["profile"]["expert_mb"],
                host_gbps=prof["profile"]["host_gbps"], host_ms_per_row=prof["profile"]["host_ms_per_row"],
                compute_ms=prof["profile"]["compute_ms"])
    return [dict(base, phase="decode", predicted=p_dec, measured=m_dec, error=p_dec / m_dec - 1.0),
            dict(base, phase=f"prefill {a.prompt}", predicted=p_pre, measured=m_pre, error=p_pre / m_pre - 1.0)]


def rounds(bin_, name, work: Path, a):
    """`case` `a.rounds` times in a row (capture, profile, replay each time, so that each prediction
    uses a profile measured beside its run), one row per phase with the median predicted and
    measured tok/s, and the errors of every round."""
    runs = [case(bin_, name, work, a) for _ in range(a.rounds)]
    med = lambda v: sorted(v)[len(v) // 2] if len(v) % 2 else sum(sorted(v)[len(v) // 2 - 1:len(v) // 2 + 1]) / 2  # noqa: E731
    rows = []
    for i, r in enumerate(runs[0]):
        pred, meas = med([run_[i]["predicted"] for run_ in runs]), med([run_[i]["measured"] for run_ in runs])
        rows.append(dict(r, predicted=pred, measured=meas, error=pred / meas - 1.0,
                         round_errors=[run_[i]["error"] for run_ in runs]))
    return rows


def read_ahead_file(path: Path) -> Path:
    """The sysfs `read_ahead_kb` of the block device holding `path` (a partition's is its disk's)."""
    dev = path.stat().st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for q in (base / "queue/read_ahead_kb", base / "../queue/read_ahead_kb"):
        if q.exists():
            return q
    raise SystemExit(f"no read_ahead_kb for the device of {path}")


def limited(bin_, limit, args):
    """Runs moe-offload in the memory cgroup limited to `limit` bytes, from a cold page cache; returns
    its JSON and the cgroup's peak anonymous memory (memory.stat `rss`, polled every 20 ms)."""
    CGROUP.mkdir(exist_ok=True)
    (CGROUP / "memory.force_empty").write_text("0")
    (CGROUP / "memory.limit_in_bytes").write_text(str(limit))
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1")
    peak, done = [0], threading.Event()

    def poll():
        while not done.wait(0.02):
            stat = dict(line.split() for line in (CGROUP / "memory.stat").read_text().splitlines())
            peak[0] = max(peak[0], int(stat["rss"]))
    t = threading.Thread(target=poll)
    t.start()
    try:
        out = run(bin_, *args, cgroup=CGROUP)
    finally:
        done.set()
        t.join()
    return out, peak[0]


def stream_case(bin_, name, work: Path, a):
    """Case (b): rows of predicted against measured decode tok/s, one per memory limit."""
    gguf, shape = model(STREAM[name], work)
    arch, e, k, layers, hidden, ffn, ty = shape
    d = gguf.parent / "stream"
    d.mkdir(exist_ok=True)
    ids = d / "ids.txt"
    ids.write_text(" ".join(str(3 + (i * 7) % 310) for i in range(a.prompt)) + "\n")
    threads = ["--threads", str(a.threads)] if a.threads else []
    prof = run(bin_, "profile", "measure", "--gguf", gguf, "--repeats", a.repeats, "--disk", d, *threads,
               "-o", d / "hw.json", "--json")
    m = prof["measured"]
    expert_bytes = m["expert_mb"] * 1e6
    file_bytes = gguf.stat().st_size
    dense_bytes = file_bytes - m["experts_total"] * expert_bytes
    ssd = m["disk"]["modes"]
    ssd_gbps = prof["profile"]["bandwidth_gbps"][0]
    # A cold expert read through mmap also brings pages no layer asked for (the fault's read-around):
    # they take page-cache memory beside the expert's, so a slot costs expert bytes x amplification.
    amp = max(1.0, next(r for r in ssd if r["mode"] == "mmap random")["amplification"] or 1.0)
    rows = []
    for frac in a.limits:
        limit = int(frac * file_bytes)
        trace = d / f"decode-{frac}.safetensors"
        dec, anon = limited(bin_, limit, ["capture", gguf, "--tokens", ids, "--ctx", a.prompt + a.generate,
                                          "--batch", a.prompt, "--generate", a.generate, "--timing-run",
                                          "--candidates", k, *threads, "-o", trace, "--json"])
        slots = int((limit - anon - dense_bytes) // (expert_bytes * amp))
        # In memory (case a's prediction on this trace, decode tokens only): compute_ms per token.
        p_ram = run(bin_, "replay", trace, "--policy", "lru", "--exec", "host", "--cap", 0, "--warmup", a.prompt,
                    "--profile-file", d / "hw.json", "--json")["cost"]["tok_s"]
        stream = dict(name=f"{STREAM[name]}-stream", expert_mb=m["expert_mb"], compute_ms=1000.0 / p_ram,
                      bandwidth_gbps=[ssd_gbps])
        (d / "stream.json").write_text(json.dumps(stream) + "\n")
        t = dec["timings"]
        n = t["decode_tokens"]
        read = t["decode_read_mb"]
        base = dict(case=name, arch=arch, experts=e, top_k=k, layers=layers, hidden=hidden, expert_ffn=ffn,
                    type=ty, threads=m["threads"], expert_mb=m["expert_mb"], file_mb=file_bytes / 1e6,
                    limit=frac, limit_mb=limit / 1e6, anon_mb=anon / 1e6, dense_mb=dense_bytes / 1e6,
                    slots=slots, ssd_gbps=ssd_gbps, amplification=amp, read_ahead_kb=m["disk"]["read_ahead_kb"],
                    ram_tok_s=p_ram, disk=ssd, phase="decode", measured=1000.0 / t["decode_ms_per_token"],
                    # What the run fetched from storage, in expert misses (each brings amp x its bytes),
                    # and the kernel time (page faults, reclaim) it spent, per decode token.
                    read_mb_per_token=None if read is None else read / n,
                    measured_misses_per_token=None if read is None else read / n / (m["expert_mb"] * amp),
                    sys_ms_per_token=t["decode_sys_ms"] / n)
        if slots < k:
            rows.append(dict(base, predicted=None, error=None, misses_per_token=None,
                             note=f"the limit holds {slots} experts, fewer than k = {k}"))
            continue
        common = ["--served", "--warmup", a.prompt, "--policy", "lru", "--profile-file", d / "stream.json", "--json"]
        shared = run(bin_, "replay", trace, "--shared-cap", slots, *common)
        per_layer = (run(bin_, "replay", trace, "--cap", slots // layers, *common)
                     if slots // layers >= k else None)
        p = shared["cost"]["at"][0]["tok_s"]
        rows.append(dict(base, predicted=p, error=p / base["measured"] - 1.0,
                         misses_per_token=shared["misses_per_token"],
                         per_layer_predicted=per_layer["cost"]["at"][0]["tok_s"] if per_layer else None,
                         per_layer_misses_per_token=per_layer["misses_per_token"] if per_layer else None))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bin", required=True, help="moe-offload built with --features capture")
    p.add_argument("--work", required=True, type=Path, help="where the models and traces go (reused)")
    p.add_argument("--cases", default=",".join(c for c in CASES if c != "tiny"), help="comma-separated case names")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompt", type=int, default=128, choices=(16, 64, 128, 512),
                   help="prompt tokens per sequence (one prefill step; profile measure times these row counts)")
    p.add_argument("--generate", type=int, default=64, help="decode tokens per sequence")
    p.add_argument("--sequences", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="case (a): measure and predict each case this many times; the rows give the medians")
    p.add_argument("--limits", default=",".join(map(str, LIMITS)),
                   help="case (b): memory limits as fractions of the model file, comma-separated")
    p.add_argument("--read-ahead-kb", type=int, default=None,
                   help="case (b): set the work directory's block device's read_ahead_kb for the run (restored after)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--check", action="store_true", help="fail unless every figure is present and positive")
    a = p.parse_args()
    a.limits = [float(x) for x in a.limits.split(",")]
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    names = a.cases.split(",")
    unknown = [n for n in names if n not in CASES and n not in STREAM]
    if unknown:
        raise SystemExit(f"unknown cases {unknown}: choose from {sorted(CASES) + sorted(STREAM)}")
    streamed = [n for n in names if n in STREAM]
    if streamed:
        print("| case | type | expert MB | model MB | read_ahead_kb | limit | anon MB | amplification | slots C | "
              "SSD GB/s | misses/token predicted | misses/token measured | kernel ms/token | predicted tok/s | "
              "measured tok/s | error |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    queue = read_ahead_file(a.work) if a.read_ahead_kb is not None and streamed else None
    saved = queue.read_text() if queue else None
    if queue:
        queue.write_text(str(a.read_ahead_kb))
    try:
        stream_rows = [r for name in streamed for r in stream_case(a.bin, name, a.work, a)]
    finally:
        if queue:
            queue.write_text(saved)
    for r in stream_rows:
        rows.append(r)
        fmt = lambda x, f: "—" if x is None else format(x, f)  # noqa: E731
        print(f"| {r['case']} | {r['type']} | {r['expert_mb']:.3f} | {r['file_mb']:.0f} | {r['read_ahead_kb']} | "
              f"{100 * r['limit']:.0f}% ({r['limit_mb']:.0f} MB) | {r['anon_mb']:.0f} | "
              f"{r['amplification']:.2f} | {r['slots']} | {r['ssd_gbps']:.3f} | "
              f"{fmt(r['misses_per_token'], '.2f')} | {fmt(r['measured_misses_per_token'], '.2f')} | "
              f"{r['sys_ms_per_token']:.1f} | {fmt(r['predicted'], '.2f')} | {r['measured']:.2f} | "
              f"{'—' if r['error'] is None else format(100 * r['error'], '+.1f') + '%'} |", flush=True)
    names = [n for n in names if n in CASES]
    if names:
        print("| case | type | E | k | layers | hidden | expert MB | threads | phase | predicted tok/s | measured tok/s | error "
              "| errors of the rounds |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        start = time.time()
        for r in rounds(a.bin, name, a.work, a):
            rows.append(r)
            print(f"| {r['case']} | {r['type']} | {r['experts']} | {r['top_k']} | {r['layers']} | {r['hidden']} | "
                  f"{r['expert_mb']:.3f} | {r['threads']} | {r['phase']} | {r['predicted']:.1f} | "
                  f"{r['measured']:.1f} | {100 * r['error']:+.1f}% | "
                  f"{', '.join(format(100 * e, '+.1f') + '%' for e in r['round_errors'])} |", flush=True)
        print(f"<!-- {name}: {time.time() - start:.0f} s -->", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    if a.check:
        bad = [r for r in rows if not ((r["predicted"] or 0) > 0 and r["measured"] > 0)]
        if bad:
            raise SystemExit(f"figures missing or not positive: {bad}")


if __name__ == "__main__":
    main()
