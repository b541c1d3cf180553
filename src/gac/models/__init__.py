"""Models: loading (:func:`load_model`), per-family adapters (:func:`get_adapter`) and the
dimension inventory (:mod:`gac.models.inventory`).

The loader's names (``load_model``, ``load``, ``LoadedModel``, ``ALIASES``) are imported on first
use: :mod:`gac.models.loading` sits above :mod:`gac.io` and :mod:`gac.surgery` (it loads saved and
repaired directories), while :mod:`gac.io` and :mod:`gac.surgery` import the adapters from this
package (docs/architecture.md).
"""

from __future__ import annotations

from typing import Any

from gac.models.adapters import ROLES, SUPPORTED, FamilyAdapter, get_adapter, in_features, out_features
from gac.utils import cache_root

__all__ = [
    "ALIASES",
    "ROLES",
    "SUPPORTED",
    "FamilyAdapter",
    "LoadedModel",
    "cache_root",
    "get_adapter",
    "in_features",
    "load",
    "load_model",
    "out_features",
]

_LOADING = ("ALIASES", "LoadedModel", "load", "load_model")


def __getattr__(name: str) -> Any:
    if name in _LOADING:
        from gac.models import loading

        value = getattr(loading, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gac.models' has no attribute {name!r}")
