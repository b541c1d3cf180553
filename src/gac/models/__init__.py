"""Models: loading (:func:`load_model`), per-family adapters (:func:`get_adapter`) and the
dimension inventory (:mod:`gac.models.inventory`)."""

from __future__ import annotations

from gac.models.adapters import ROLES, SUPPORTED, FamilyAdapter, get_adapter, in_features, out_features
from gac.models.loading import ALIASES, LoadedModel, cache_root, load, load_model

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
