"""python/examples/quickstart.ipynb runs from top to bottom on the real ESFT data (nbclient)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[1] / "examples" / "quickstart.ipynb"
CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def test_the_quickstart_notebook_runs(real_data, monkeypatch):
    if CI:
        import matplotlib  # noqa: F401
        import nbclient
        import nbformat
    else:
        nbclient = pytest.importorskip("nbclient")
        nbformat = pytest.importorskip("nbformat")
        pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.get("output_type") == "error"]
    assert not errors
    # The last cell shows the sweep's table.
    assert nb.cells[-1].outputs[0]["data"]["text/plain"].startswith("sample")
