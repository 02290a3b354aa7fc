"""`moe-offload capture` (llama.cpp) against capture_routing.py (transformers) on the same weights.

Tiny random-weight MoE models of two architectures llama.cpp names differently (`qwen3moe`, and
Mixtral as `llama` with experts) are made by tiny_gguf.py: a Hugging Face checkpoint and the same
weights as an f32 GGUF. Both runtimes read the same token ids; their traces must choose the same
experts on every (layer, token), except where the router's k-th and (k+1)-th logits are closer
than TIE_TOLERANCE (llama.cpp keeps K and V in f16 and sums in another order), and such rows
must be rare.

Needs a moe-offload built with the capture feature (`cargo build --release -p cli --features
capture`), named by MOE_OFFLOAD_CAPTURE_BIN, plus torch, transformers and gguf; skipped without
them, except under CI=true, where a missing one fails.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

if os.environ.get("CI"):
    import numpy as np
    import torch
    import transformers
    import gguf  # noqa: F401
else:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("gguf")

sys.path.insert(0, str(Path(__file__).parent))
import capture_routing  # noqa: E402
import tiny_gguf  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

# Logit units; the routers' logits are of order 1 (N(0, 1) weights on normalized inputs).
TIE_TOLERANCE = 0.05
# At most this share of (layer, token) rows may differ (each within the tolerance).
MAX_TIED_SHARE = 0.02
SEQS, LEN, GENERATE = 3, 40, 4


def binary():
    exe = os.environ.get("MOE_OFFLOAD_CAPTURE_BIN")
    if exe and Path(exe).is_file():
        return exe
    if os.environ.get("CI"):
        pytest.fail("MOE_OFFLOAD_CAPTURE_BIN is not a built binary: CI must build --features capture first")
    pytest.skip("set MOE_OFFLOAD_CAPTURE_BIN to a moe-offload built with --features capture")


def run(*args, check=True):
    p = subprocess.run([binary(), *map(str, args)], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"moe-offload {' '.join(map(str, args))}: {p.stderr}")
    return p


def options(**kw):
    a = tiny_gguf.parser().parse_args(["--out-dir", "unused"])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {arch: tiny_gguf.make(arch, d / arch, options(arch=arch)) for arch in ("qwen3_moe", "mixtral")}


def token_ids(path, seqs=SEQS, length=LEN, seed=1):
    rng = np.random.default_rng(seed)
    ids = [[int(x) for x in rng.integers(3, 300, length)] for _ in range(seqs)]
    path.write_text("".join(" ".join(map(str, s)) + "\n" for s in ids))
    return ids


def by_id(ids, scores, e):
    """[L, T, E] logits indexed by expert id from rows of candidates."""
    out = np.full(ids.shape[:2] + (e,), np.nan)
    np.put_along_axis(out, ids.astype(np.int64), scores, 2)
    return out


def compare(ours, theirs, logits, k):
    """Rows where the used ids differ; each must be a near-tie of `logits` (by id) at the k-th place."""
    differ = np.argwhere(~(ours[:, :, :k] == theirs[:, :, :k]).all(axis=2))
    for l, t in differ:
        ranked = np.sort(logits[l, t])[::-1]
        gap = ranked[k - 1] - ranked[k]
        assert gap < TIE_TOLERANCE, f"layer {l} token {t}: {ours[l, t, :k]} vs {theirs[l, t, :k]}, logit gap {gap}"
    assert len(differ) <= MAX_TIED_SHARE * ours.shape[0] * ours.shape[1], f"{len(differ)} rows differ"
    return len(differ)


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_llama_cpp_and_transformers_choose_the_same_experts(models, arch, tmp_path):
    m = models[arch]
    seqs = token_ids(tmp_path / "ids.txt")
    out = tmp_path / "llama.safetensors"
    doc = json.loads(run("capture", m["gguf"], "--tokens", tmp_path / "ids.txt", "--ctx", 64, "--generate", GENERATE,
                         "-o", out, "--json").stdout)
    assert doc["kind"] == "moe-offload-capture"
    assert (doc["prefill_tokens"], doc["decode_tokens"], doc["sequences"]) == (SEQS * LEN, SEQS * GENERATE, SEQS)
    assert doc["scores"] and doc["candidates"] == m["experts"]
    assert doc["timings"]["prompt_ms_per_token"] > 0 and doc["timings"]["decode_ms_per_token"] > 0

    model = transformers.AutoModelForCausalLM.from_pretrained(m["hf"], dtype=torch.float32).eval()
    capture_routing.capture(model, seqs, tmp_path / "hf_decode.safetensors", candidates=m["experts"],
                            generate=GENERATE, prefill_output=tmp_path / "hf_prefill.safetensors")
    ll = load_file(out)
    hp, hd = load_file(tmp_path / "hf_prefill.safetensors"), load_file(tmp_path / "hf_decode.safetensors")
    with safe_open(out, "np") as f:
        meta = f.metadata()
    assert (meta["score_kind"], meta["phase"], meta["llama_arch"]) == (
        "logits", "mixed", {"qwen3_moe": "qwen3moe", "mixtral": "llama"}[arch])
    # Each sequence: LEN prefill rows, then GENERATE decode rows.
    per = LEN + GENERATE
    prefill = [s * per + i for s in range(SEQS) for i in range(LEN)]
    decode = [s * per + LEN + i for s in range(SEQS) for i in range(GENERATE)]
    assert list(ll["seq_offsets"]) == [s * per for s in range(SEQS)]
    k, e = m["top_k"], m["experts"]
    logits = by_id(ll["ids"][:, prefill], ll["scores"][:, prefill], e)
    # The same logits up to a per-row constant and the f16 KV cache's rounding.
    theirs = by_id(hp["ids"], hp["scores"], e)
    centered = lambda x: x - x.mean(axis=2, keepdims=True)  # noqa: E731
    same = (ll["ids"][:, prefill, :k] == hp["ids"][:, :, :k]).all(axis=2)
    assert np.abs(centered(logits) - centered(theirs))[same].max() < 0.1
    compare(ll["ids"][:, prefill], hp["ids"], logits, k)
    compare(ll["ids"][:, decode], hd["ids"], by_id(ll["ids"][:, decode], ll["scores"][:, decode], e), k)
    # The gates the models applied (renormalized top-k softmax in both).
    assert np.abs(ll["gates"][:, prefill] - hp["gates"])[same].max() < 0.02


def test_the_trace_replays_and_text_is_tokenized_by_the_model(models, tmp_path):
    m = models["qwen3_moe"]
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat. " * 40)
    out = tmp_path / "t.safetensors"
    doc = json.loads(run("capture", m["gguf"], "--text", text, "--ctx", 128, "--batch", 32, "--candidates", 4,
                         "-o", out, "--json").stdout)
    # 960 bytes, BOS first: 961 tokens at most (byte fallback), in chunks of 128.
    assert 100 < doc["prefill_tokens"] <= 961 and doc["sequences"] == -(-doc["prefill_tokens"] // 128)
    assert doc["shape"]["candidates"] == 4 and doc["decode_tokens"] == 0
    rep = json.loads(run("replay", out, "--policy", "lru", "--cap", 4, "--json").stdout)
    assert rep["kind"] == "moe-offload-replay"


def check_refused(args, expect, tmp_path):
    out = tmp_path / "never.safetensors"
    p = run("capture", *args, "-o", out, check=False)
    assert p.returncode == 1, p.stderr
    assert expect in p.stderr, p.stderr
    assert not out.exists()


def test_bad_inputs_are_refused_by_name(models, tmp_path):
    m = models["qwen3_moe"]
    ids = tmp_path / "ids.txt"
    ids.write_text("1 2 3\n4 5 999\n")
    check_refused([m["gguf"], "--tokens", ids], "token id 999 is not below the model's vocabulary size 300", tmp_path)
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2 x\n")
    check_refused([m["gguf"], "--tokens", bad], "line 1: `x` is not a token id", tmp_path)
    check_refused([tmp_path / "missing.gguf", "--tokens", ids], "missing.gguf: no such file", tmp_path)
    check_refused([ids, "--tokens", ids], "llama.cpp could not load it", tmp_path)
    check_refused([m["gguf"], "--tokens", ids, "--ctx", 8, "--generate", 8], "--ctx 8 leaves no room", tmp_path)


def test_a_dense_model_is_refused_naming_what_is_missing(tmp_path):
    d = tiny_gguf.make("llama_dense", tmp_path / "dense", options(arch="llama_dense"))
    token_ids(tmp_path / "ids.txt")
    check_refused([d["gguf"], "--tokens", tmp_path / "ids.txt"], "has no ffn_moe_topk-<layer> tensor", tmp_path)


def test_an_interrupt_leaves_no_partial_trace(models, tmp_path):
    m = models["mixtral"]
    token_ids(tmp_path / "ids.txt", seqs=400, length=8)
    out = tmp_path / "interrupted.safetensors"
    args = ["capture", m["gguf"], "--tokens", tmp_path / "ids.txt", "--ctx", 128, "--generate", 100, "-o", out]
    p = subprocess.Popen([binary(), *map(str, args)], stderr=subprocess.PIPE, text=True)
    assert p.stderr.readline().startswith("capturing")
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "interrupted" in err
    assert not out.exists() and list(tmp_path.glob("*.safetensors*")) == []


def test_profile_measure_writes_a_profile_replay_takes(models, tmp_path):
    m = models["qwen3_moe"]
    prof = tmp_path / "hw.json"
    doc = json.loads(run("profile", "measure", "--gguf", m["gguf"], "--repeats", 3, "-o", prof, "--json").stdout)
    assert doc["kind"] == "moe-offload-profile-measure"
    measured, written = doc["measured"], json.loads(prof.read_text())
    assert written == doc["profile"]
    # One expert of the f32 model: gate and up 32 x 16, down 16 x 32, 4 bytes each.
    assert written["expert_mb"] == 3 * 32 * 16 * 4 / 1e6
    assert [n for n, _ in measured["expert_rows"]] == [1, 2, 4, 8, 16, 32, 64]
    assert measured["experts_total"] == 16 and measured["arch"] == "qwen3moe"
    assert all(s["min_ms"] <= s["median_ms"] <= s["max_ms"] for _, s in measured["expert_rows"])
    assert written["host_gbps"] > 0 and written["host_ms_per_row"] > 0 and written["compute_ms"] > 0
    token_ids(tmp_path / "ids.txt")
    trace = tmp_path / "t.safetensors"
    run("capture", m["gguf"], "--tokens", tmp_path / "ids.txt", "--ctx", 64, "-o", trace)
    rep = json.loads(run("replay", trace, "--policy", "lru", "--exec", "host", "--cap", 0, "--profile-file", prof,
                         "--json").stdout)
    assert rep["cost"]["tok_s"] > 0 and rep["host_runs"] == rep["picks"]
    p = run("profile", "measure", "--gguf", tmp_path / "ids.txt", check=False)
    assert p.returncode == 1 and "not a GGUF file" in p.stderr, p.stderr


def test_profile_measure_times_the_disk_and_capture_counts_what_it_read(models, tmp_path):
    m = models["qwen3_moe"]
    prof = tmp_path / "hw.json"
    disk = tmp_path / "disk"
    disk.mkdir()
    doc = json.loads(run("profile", "measure", "--gguf", m["gguf"], "--repeats", 1, "--disk", disk, "--disk-mb", 2,
                         "--disk-reads", 3, "-o", prof, "--json").stdout)
    d = doc["measured"]["disk"]
    modes = {r["mode"]: r for r in d["modes"]}
    assert "mmap random" in modes and "buffered random" in modes
    # One expert of 6,144 bytes is read as three slices of one 4 KiB page each.
    assert d["read_mb"] == 3 * 4096 / 1e6
    assert all(r["gbps"] > 0 and r["per_expert"]["min_ms"] <= r["per_expert"]["max_ms"] for r in d["modes"])
    for name in ("direct sequential", "direct random"):
        if name in modes and modes[name]["amplification"] is not None:
            assert modes[name]["amplification"] == 1.0
    # The profile's one SSD bandwidth is the cold mmap read's rate; the test file is gone.
    assert doc["profile"]["bandwidth_gbps"] == [modes["mmap random"]["gbps"]]
    assert list(disk.iterdir()) == []
    token_ids(tmp_path / "ids.txt")
    trace = tmp_path / "t.safetensors"
    cap = json.loads(run("capture", m["gguf"], "--tokens", tmp_path / "ids.txt", "--ctx", 64, "--generate", 4,
                         "--timing-run", "-o", trace, "--json").stdout)
    t = cap["timings"]
    assert t["decode_sys_ms"] >= 0 and t["prompt_sys_ms"] >= 0
    assert t["decode_read_mb"] is None or t["decode_read_mb"] >= 0
    rep = json.loads(run("replay", trace, "--policy", "lru", "--shared-cap", 4, "--warmup", 0, "--profile-file", prof,
                         "--json").stdout)
    assert rep["cost"]["at"][0]["ssd_gbps"] == doc["profile"]["bandwidth_gbps"][0]
    p = run("profile", "measure", "--gguf", m["gguf"], "--disk", tmp_path / "nowhere", check=False)
    assert p.returncode == 1 and "nowhere: not a directory" in p.stderr, p.stderr
