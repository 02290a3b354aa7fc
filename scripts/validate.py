#!/usr/bin/env python3
"""Predicted against measured tok/s on this machine, every expert on the CPU (docs/validation.md, case a).

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

It prints one Markdown row per case and phase (and writes them as JSON with --json). Run:

    python scripts/validate.py --bin target/release/moe-offload --work /tmp/validate          # every case
    python scripts/validate.py --bin ... --work ... --cases tiny --check                        # CI

The binary must be built with the capture feature. The torch environment of .ci/run has what the
script imports (torch, transformers, gguf).
"""

from __future__ import annotations

import argparse
import json
import subprocess
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


def run(bin_, *args):
    p = subprocess.run([bin_, *map(str, args)], capture_output=True, text=True)
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
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    p.add_argument("--check", action="store_true", help="fail unless every figure is present and positive")
    a = p.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    rows = []
    print("| case | type | E | k | layers | hidden | expert MB | threads | phase | predicted tok/s | measured tok/s | error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in a.cases.split(","):
        start = time.time()
        for r in case(a.bin, name, a.work, a):
            rows.append(r)
            print(f"| {r['case']} | {r['type']} | {r['experts']} | {r['top_k']} | {r['layers']} | {r['hidden']} | "
                  f"{r['expert_mb']:.3f} | {r['threads']} | {r['phase']} | {r['predicted']:.1f} | "
                  f"{r['measured']:.1f} | {100 * r['error']:+.1f}% |", flush=True)
        print(f"<!-- {name}: {time.time() - start:.0f} s -->", file=sys.stderr)
    if a.json:
        a.json.write_text(json.dumps(rows, indent=1) + "\n")
    if a.check:
        bad = [r for r in rows if not (r["predicted"] > 0 and r["measured"] > 0)]
        if bad:
            raise SystemExit(f"figures missing or not positive: {bad}")


if __name__ == "__main__":
    main()
