"""Tests of convert_counts.py. Pickle cases need only pytest; the torch cases skip when torch is
absent; the end-to-end check through `moe-offload import counts` skips when the binary is not
built (MOE_OFFLOAD_BIN, else target/{debug,release}/moe-offload).

Run: `pytest python/test_convert_counts.py`.
"""

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import convert_counts  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
# Counts a top-2 routing of 4 tokens can give: no count above the tokens (sum / k).
WANT = {"layers": [3, 7], "counts": [[3, 1, 2, 2], [0, 4, 2, 2]]}


def binary():
    cands = [os.environ.get("MOE_OFFLOAD_BIN")]
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    cands += [target / "debug" / "moe-offload", target / "release" / "moe-offload"]
    return next((Path(c) for c in cands if c and Path(c).is_file()), None)


@pytest.mark.parametrize(
    "obj, kwargs",
    [
        ({3: [3, 1, 2, 2], 7: [0, 4, 2, 2]}, {}),
        ({"model.layers.7.mlp": (0, 4, 2, 2), "model.layers.3.mlp": [3.0, 1, 2, 2]}, {}),
        ({3: {0: 3, 1: 1, 2: 2, 3: 2}, 7: {1: 4, 2: 2, 3: 2}}, {}),
        ({"step": 10, "expert_counts": {3: [3, 1, 2, 2], 7: [0, 4, 2, 2]}}, {"key": "expert_counts"}),
        ({"layers": [3, 7], "counts": [[3, 1, 2, 2], [0, 4, 2, 2]]}, {}),
    ],
)
def test_layouts_give_the_same_counts(obj, kwargs):
    assert convert_counts.to_counts(obj, **kwargs) == WANT


def test_a_list_is_layer_indices_and_top_k_is_recorded():
    out = convert_counts.to_counts([[3, 1, 2, 2], [0, 4, 2, 2]], top_k=2)
    assert out == {"layers": [0, 1], "counts": WANT["counts"], "top_k": 2}


@pytest.mark.parametrize(
    "obj, kwargs, words",
    [
        ({3: [5, 1.5]}, {}, "[3][1]: 1.5 is not a whole number"),
        ({3: [5, -1]}, {}, "[3][1]: -1 is not a whole number"),
        ({"router.experts": [1]}, {}, "key 'router.experts' is not a layer"),
        ({"a": 1}, {"key": "counts_x"}, "--key 'counts_x': not in the file (it has 'a')"),
        (42, {}, "the file holds a int"),
        ({3: [1], "layer3": [2]}, {}, "layer 3 appears twice"),
        ({3: [1, 2], 7: [1]}, {}, "layer 7 has 1 experts, another layer 2"),
        ({"counts": [[1]], "top_k": 4}, {"top_k": 2}, "top_k 4 disagrees with --top-k 2"),
    ],
)
def test_refusals_name_the_entry(obj, kwargs, words):
    with pytest.raises(convert_counts.CountsError) as e:
        convert_counts.to_counts(obj, **kwargs)
    assert words in str(e.value)


def test_pickle_file_end_to_end(tmp_path):
    src = tmp_path / "counts.pkl"
    src.write_bytes(pickle.dumps({3: [3, 1, 2, 2], 7: [0, 4, 2, 2]}))
    out = tmp_path / "counts.json"
    assert convert_counts.main([str(src), "-o", str(out), "--top-k", "2"]) == 0
    assert json.loads(out.read_text()) == dict(WANT, top_k=2)
    bad = tmp_path / "bad.pkl"
    bad.write_bytes(pickle.dumps({3: [0.5]}))
    assert convert_counts.main([str(bad), "-o", str(tmp_path / "x.json")]) == 1
    exe = binary()
    if exe is None:
        pytest.skip("moe-offload is not built (cargo build -p cli)")
    stats = tmp_path / "stats.json"
    subprocess.run([str(exe), "import", "counts", str(out), "-o", str(stats)], check=True, capture_output=True)
    s = json.loads(stats.read_text())
    assert s["meta"]["layer_ids"] == [3, 7] and s["meta"]["top_k"] == 2
    assert [layer["count"] for layer in s["layers"]] == WANT["counts"]
    assert [layer["tokens"] for layer in s["layers"]] == [4, 4]


def test_torch_files(tmp_path):
    torch = pytest.importorskip("torch")
    src = tmp_path / "counts.pt"
    torch.save({"expert_counts": torch.tensor([[3, 1, 2, 2], [0, 4, 2, 2]])}, src)
    out = convert_counts.to_counts(convert_counts.load(src), key="expert_counts")
    assert out == {"layers": [0, 1], "counts": WANT["counts"]}
    torch.save({3: torch.tensor([3.0, 1, 2, 2]), 7: torch.tensor([0, 4, 2, 2])}, src)
    assert convert_counts.to_counts(convert_counts.load(src)) == WANT
