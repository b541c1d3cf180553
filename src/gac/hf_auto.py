"""``import gac`` makes gac directories loadable with ``transformers``' Auto classes.

A directory whose skeleton differs from its base architecture (factorized low-rank layers, PaLU's
latent attention, per-layer pruned widths) is saved with a wrapping ``config.json``
(:mod:`gac.hf_config`).

After ``import gac``, ``AutoConfig.from_pretrained(DIR)`` returns a :class:`GacConfig` and
``AutoModelForCausalLM.from_pretrained(DIR)`` returns the model :func:`gac.io.load` builds (an
instance of the base architecture's class with gac's modules at the recorded places): no
``trust_remote_code``, no pickle. Without ``import gac``, transformers refuses the directory
(unknown ``model_type``), never loads it wrong.

A pruned directory whose widths vary by layer keeps its base ``model_type`` and carries the
standard ``per_layer_config`` (transformers >= 5.24 reads it with plain ``AutoConfig``; its modeling
side is not upstream yet, so plain ``AutoModelForCausalLM`` refuses it). After ``import gac``,
``AutoModelForCausalLM.from_pretrained(DIR)`` builds it through :func:`gac.io.load` too: gac wraps
that one classmethod, and only for local gac directories with a ``per_layer_config``.

``import gac`` stays cheap: when ``transformers`` is not imported yet, registration waits for its
Auto module through a one-shot import hook, and :func:`gac.io.load` is imported only when a
directory is loaded.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import sys
from typing import Any

from gac.hf_config import BASE_KEY, MODEL_TYPE, base_config, is_per_layer_dir

_AUTO_MODULE = "transformers.models.auto.modeling_auto"
_registered = False


def register() -> None:
    """Register :class:`GacConfig` and :class:`GacForCausalLM` with the Auto classes (idempotent)."""
    global _registered
    if _registered:
        return
    from transformers import AutoConfig, AutoModelForCausalLM, PretrainedConfig

    class GacConfig(PretrainedConfig):
        """The wrapping config of a gac directory; ``base()`` is the base architecture's config."""

        model_type = MODEL_TYPE

        def __init__(self, gac_base: dict[str, Any] | None = None, **kwargs: Any) -> None:
            self.gac_base = gac_base or {}
            super().__init__(**kwargs)

        def base(self) -> Any:
            return base_config({BASE_KEY: self.gac_base})

    class GacForCausalLM:
        """Loads a gac directory through :func:`gac.io.load` (what ``from_pretrained`` dispatches to)."""

        config_class = GacConfig

        @classmethod
        def from_pretrained(cls, path: Any, *args: Any, **kwargs: Any) -> Any:
            # here, not at the top: ``import gac`` imports this module and stays torch-free
            from gac import io

            dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
            if isinstance(dtype, str) and dtype != "auto":
                import torch

                dtype = getattr(torch, dtype)
            elif dtype == "auto":
                dtype = None
            device = kwargs.get("device_map") or "cpu"
            if not isinstance(device, str) or device == "auto":
                device = "cpu"
            return io.load(path, dtype=dtype, device=device)

    AutoConfig.register(MODEL_TYPE, GacConfig, exist_ok=True)
    AutoModelForCausalLM.register(GacConfig, GacForCausalLM, exist_ok=True)
    _route_per_layer_dirs(AutoModelForCausalLM, GacForCausalLM.from_pretrained)
    _registered = True


def _route_per_layer_dirs(auto_cls: Any, gac_from_pretrained: Any) -> None:
    """Send ``auto_cls.from_pretrained`` of a per-layer gac directory to gac's loader (idempotent)."""
    current = auto_cls.from_pretrained
    if getattr(current, "_gac_routes_per_layer", False):
        return
    original = current.__func__

    def from_pretrained(cls: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        if is_per_layer_dir(path):
            return gac_from_pretrained(path, *args, **kwargs)
        return original(cls, path, *args, **kwargs)

    from_pretrained._gac_routes_per_layer = True  # type: ignore[attr-defined]
    from_pretrained.__doc__ = original.__doc__
    auto_cls.from_pretrained = classmethod(from_pretrained)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """One-shot hook: run :func:`register` right after transformers' Auto-model module loads."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _AUTO_MODULE:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            with contextlib.suppress(Exception):  # a failed registration must not break transformers
                register()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Register now if transformers' Auto module is loaded, else when it is."""
    if _AUTO_MODULE in sys.modules:
        register()
    elif not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())
