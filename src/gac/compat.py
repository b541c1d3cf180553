"""transformers version differences gac depends on, in one leaf module (imports nothing of gac).

transformers 5.24 renamed the cache argument of every model and attention ``forward`` from
``past_key_values`` to ``cache`` (the old name still works with a ``FutureWarning`` until 5.40),
renamed the model output's field the same way, and stopped passing ``cache_position`` to attention
modules (a static cache now keeps its write position in ``cumulative_length``). gac supports
transformers 5.17 (the oldest) through the newest, so every call site goes through these helpers.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any


@functools.lru_cache(maxsize=64)
def _takes_cache(fn: Any) -> bool:
    try:
        return "cache" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins / C functions
        return False


def cache_kwarg(model: Any) -> str:
    """The name ``model.forward`` takes its KV cache under: ``"cache"`` (>= 5.24) or ``"past_key_values"``.

    >>> class New:
    ...     def forward(self, input_ids=None, cache=None): ...
    >>> class Old:
    ...     def forward(self, input_ids=None, past_key_values=None): ...
    >>> cache_kwarg(New()), cache_kwarg(Old())
    ('cache', 'past_key_values')
    """
    fwd = getattr(model, "forward", model)
    fn = getattr(fwd, "__func__", fwd)
    return "cache" if _takes_cache(fn) else "past_key_values"


def cache_arg(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` under the name ``model`` takes (``model(ids, **cache_arg(model, c))``)."""
    return {cache_kwarg(model): cache}


def with_cache(model: Any, cache: Any, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` plus the cache under the name ``model`` takes (no deprecation warning on any version)."""
    return {**kwargs, **cache_arg(model, cache)}


def output_cache(out: Any) -> Any:
    """The cache a model returned: ``out.cache`` (>= 5.24) or ``out.past_key_values``."""
    for name in ("cache", "past_key_values"):
        c = getattr(out, name, None) if not isinstance(out, dict) else out.get(name)
        if c is not None:
            return c
    return None


def attention_cache(cache: Any, past_key_values: Any) -> Any:
    """The cache an attention module was handed, under either name."""
    return cache if cache is not None else past_key_values
