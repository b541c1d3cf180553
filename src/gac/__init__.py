"""gac: GPU-Aligned Compression.

Measure a GPU's shape penalties (a *profile*), check a model's dimensions against it,
repair them exactly by zero-padding, and compress under a parameter budget with
aligned dimensions.
"""

from __future__ import annotations

__version__ = "0.1.0"

from gac.errors import GacError

__all__ = ["CompressConfig", "GacError", "__version__", "compress_", "generate", "load", "save"]

# Lazy exports: ``import gac`` stays cheap (no torch, no transformers) until one is used.
_LAZY = {
    "compress_": ("gac.api", "compress_"),
    "CompressConfig": ("gac.api", "CompressConfig"),
    "load": ("gac.models.loading", "load"),
    "generate": ("gac.eval.generate", "generate"),
    "save": ("gac.io", "save"),
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'gac' has no attribute {name!r}")


def _register_with_transformers() -> None:
    # ``AutoModelForCausalLM.from_pretrained(DIR)`` works on gac directories after ``import gac``;
    # the registration waits for transformers to be imported (see gac.hf_auto).
    from gac import hf_auto

    hf_auto.install()


_register_with_transformers()
