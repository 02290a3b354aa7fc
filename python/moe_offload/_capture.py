"""``capture``: record a routing trace from a transformers MoE model, in the notebook.

A thin wrapper of ``python/capture_routing.py`` (the command-line capture script, which stays
beside the package): the same recorder, the same trace. torch and transformers are imported
only when ``capture`` is called (``pip install "./python[capture]"``).
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Optional, Union

from . import _core


def _capture_module() -> Any:
    """``capture_routing``, from the installed wheel or from the repository's ``python/``."""
    try:
        return importlib.import_module("capture_routing")
    except ImportError:
        pass
    here = Path(__file__).resolve().parent.parent
    if (here / "capture_routing.py").is_file():
        sys.path.insert(0, str(here))
        return importlib.import_module("capture_routing")
    raise ImportError(
        "moe_offload.capture needs python/capture_routing.py (installed with the package, or in the repository "
        "beside it) and torch and transformers: pip install \"./python[capture]\""
    )


def capture(
    model: Any,
    tokenizer: Any,
    texts: Iterable[str],
    output: Optional[Union[str, "os.PathLike[str]"]] = None,
    *,
    candidates: Optional[int] = None,
    max_len: int = 2048,
    max_tokens: Optional[int] = None,
    model_name: str = "",
    source: str = "",
    norms: bool = True,
    batch_size: int = 1,
    generate: int = 0,
    lookahead: int = 0,
) -> "_core.Trace":
    """Runs ``model`` (a transformers MoE model) over ``texts`` and returns the recorded trace.

    Each text is a document, tokenized with ``tokenizer`` and split into sequences of at most
    ``max_len`` tokens (``max_tokens`` in all); a prefill pass per batch of ``batch_size``
    sequences records, per MoE layer and token, the top-``candidates`` router ids and logits,
    the gates and (``norms``) the used experts' output norms; ``generate = N`` records N greedy
    decode steps per prompt instead; ``lookahead = M`` adds M pre-gating ids per row. The trace
    is written to ``output`` (default: ``trace.safetensors`` in a new temporary directory) and
    opened with ``open_trace``. See ``python/capture_routing.py`` and docs/capture.md.
    """
    cr = _capture_module()
    texts = [texts] if isinstance(texts, str) else list(texts)
    sequences = cr.tokenize_documents(texts, tokenizer, max_len, max_tokens)
    if output is None:
        output = os.path.join(tempfile.mkdtemp(prefix="moe-offload-capture-"), "trace.safetensors")
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None) or 0
    cr.capture(
        model,
        sequences,
        os.fspath(output),
        candidates=candidates,
        model_name=model_name,
        source=source,
        norms=norms,
        batch_size=batch_size,
        generate=generate,
        lookahead=lookahead,
        pad_id=pad,
    )
    return _core.open_trace(os.fspath(output))
