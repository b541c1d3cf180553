"""The compressor protocol and registry.

A compressor is any dimension-reducing method. It:

1. enumerates its :class:`~gac.sites.Site` s (``sites``);
2. collects calibration statistics through hooks (``calibrate``);
3. estimates the quality loss for every candidate kept dim (``loss_curve``; ``importance``
   is the scalar fallback used when no curve exists);
4. proposes its own native, unconstrained allocation for a parameter budget (``native_allocation``);
5. applies a chosen allocation in place (``apply``).

The allocator (:mod:`gac.allocation`) only ever sees sites, curves and budgets: it never knows
which compressor it serves. A new compressor is one module that subclasses
:class:`Compressor` and is decorated with :func:`register_compressor`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from gac.errors import GacError
from gac.sites import Site

_REGISTRY: dict[str, type[Compressor]] = {}


def register_compressor(name: str):
    """Class decorator: make a compressor available by ``name``."""

    def deco(cls: type[Compressor]) -> type[Compressor]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_compressor(name: str, **options: Any) -> Compressor:
    """Instantiate the compressor registered as ``name``."""
    _import_builtin()
    if name not in _REGISTRY:
        raise GacError(f"unknown compressor {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    from gac.guard import validate_options

    cls = _REGISTRY[name]
    return cls(**validate_options(cls.__init__, options, f"compressor {name}"))


def available_compressors() -> list[str]:
    _import_builtin()
    return sorted(_REGISTRY)


def _import_builtin() -> None:
    # Importing the modules registers them.
    import importlib
    import pkgutil

    import gac.compressors as pkg

    for m in pkgutil.iter_modules(pkg.__path__):
        if m.name not in ("base", "calibration"):
            importlib.import_module(f"gac.compressors.{m.name}")


class Compressor(ABC):
    """Base class of every compressor. Subclasses set options in ``__init__``."""

    name: ClassVar[str] = "?"
    #: True when ``calibrate`` must run before ``loss_curve``/``apply``.
    needs_calibration: ClassVar[bool] = True
    #: True when calibration and compression can run one decoder layer at a time on
    #: ``exec_device`` while the model stays elsewhere (``CompressConfig.max_gpu_memory``).
    supports_sequential: ClassVar[bool] = False
    #: where layer-by-layer work runs (set by :func:`gac.api.plan`; None: where the model is)
    exec_device: str | None = None
    #: what else the latency guard's refusal tells a user of this method (appended to its one line; empty: nothing)
    refusal_hint: ClassVar[str] = ""

    def refusal(self) -> str:
        """What the latency guard's refusal tells a user of this method about the model it refused
        (:attr:`refusal_hint` unless the method says more for that model, after :meth:`sites`)."""
        return self.refusal_hint

    @abstractmethod
    def sites(self, model: nn.Module) -> list[Site]:
        """The sites this compressor can shrink in ``model``."""

    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:  # noqa: B027
        """Run ``batches`` of token ids through ``model`` and accumulate statistics (no activations kept)."""

    @abstractmethod
    def loss_curve(self, site: Site) -> np.ndarray | None:
        """Estimated quality loss when keeping d, for d in ``0..site.max_dim`` (length ``max_dim + 1``).

        Non-increasing in d and 0 at ``max_dim``. None when the method has no curve.
        """

    def importance(self, site: Site) -> float:
        """Scalar importance of a site (fallback objective when ``loss_curve`` is None)."""
        return 1.0

    @abstractmethod
    def native_allocation(self, model: nn.Module, sites: list[Site], budget: int) -> dict[str, int]:
        """The method's own allocation: site name -> kept dim, with total cost <= ``budget``."""

    @abstractmethod
    def apply(self, model: nn.Module, sites: list[Site], dims: dict[str, int]) -> None:
        """Shrink ``model`` in place to the chosen dims (``d == site.max_dim`` leaves a site as is)."""

    def options(self) -> dict[str, Any]:
        """The options to record in ``gac_config.json``."""
        return {}


def kept_dim(site: Site, dims: dict[str, int]) -> int:
    """``dims[site.name]``, checked against ``1..site.max_dim`` (what :meth:`Compressor.apply` is given)."""
    if site.name not in dims:
        raise GacError(f"no kept dim given for site {site.name}")
    d = int(dims[site.name])
    if d < 1 or d > site.max_dim:
        raise GacError(f"kept dim {d} of {site.name} is outside 1..{site.max_dim}")
    return d


def bisect_fraction(fits: Callable[[float], bool], fits_high: bool, steps: int = 60) -> float:
    """The boundary in ``[0, 1]`` of a monotone ``fits``, on its fitting side (``steps`` halvings).

    ``fits_high``: ``fits`` holds from the boundary up (the least fraction that fits, e.g. the
    least pruning within a budget); else from the boundary down (the largest that fits).

    >>> round(bisect_fraction(lambda r: r >= 0.3, fits_high=True), 6), round(bisect_fraction(lambda r: r <= 0.3, False), 6)
    (0.3, 0.3)
    """
    lo, hi = 0.0, 1.0
    for _ in range(steps):
        mid = (lo + hi) / 2
        if fits(mid) == fits_high:
            hi = mid
        else:
            lo = mid
    return hi if fits_high else lo
