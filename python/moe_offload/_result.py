"""The result of a call that returns a JSON document of the command line (``replay``, ``mrc``)."""

from __future__ import annotations

from typing import Any, Dict


class Result(Dict[str, Any]):
    """A ``dict`` holding exactly the fields of the command line's ``--json`` document, in its
    order (``kind`` first), with the fields readable as attributes too: ``r["misses_per_token"]``
    and ``r.misses_per_token`` are the same value. ``dict(r)`` equals ``json.loads`` of the CLI's
    output for the same inputs.
    """

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no field {name!r}; fields: {', '.join(self)}"
            ) from None

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(self))

    def misses_per_token_at(self, cap: int) -> float:
        """For a miss-ratio curve (``mrc``): misses per counted token, all layers together, at
        cache capacity ``cap`` (experts per layer, ``min_cap <= cap <= max_cap``)."""
        lo, hi = self["min_cap"], self["max_cap"]
        if not lo <= cap <= hi:
            raise ValueError(f"cap {cap} is outside the curve's caps {lo}..{hi}")
        misses = sum(layer["misses"][cap - lo] for layer in self["layers"])
        tokens = self["tokens"]
        return 0.0 if tokens == 0 else misses / tokens

    def curve(self) -> list[tuple[int, float]]:
        """For a miss-ratio curve (``mrc``): ``(cap, misses per token)`` for every cap."""
        return [(c, self.misses_per_token_at(c)) for c in range(self["min_cap"], self["max_cap"] + 1)]
