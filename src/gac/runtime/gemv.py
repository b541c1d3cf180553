"""The Triton decode GEMV's dispatch (:mod:`gac.kernels.gemv`): every linear layer where it was measured faster.

For every linear layer of a model on CUDA (dense, each factor of a factorized layer, each fused first
stage) and each row class (``M = 1`` and ``2..16``), the kernel's tile configurations and cuBLAS are
timed alone (:func:`gac.kernels.gemv.measure_shape`); the Triton GEMV is used only where its best
configuration beat cuBLAS by the margin.  Decisions are cached per GPU, torch, Triton and dtype in
``$GAC_CACHE/gemv_dispatch.json``, so a model's shapes are measured once per machine.  Prefill (more
than 16 rows) always takes cuBLAS.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

from gac.kernels import gemv as G
from gac.nn.fused import FusedInputProjection
from gac.runtime.dispatch import Dispatch, Site, row_class, tried_all
from gac.runtime.modules import DispatchedGroup, GemvLinear


class GemvDispatch(Dispatch):
    """Sites: every ``nn.Linear`` and fused first stage, keyed by its weight's ``(out, in)`` shape."""

    what = "Triton GEMV dispatch"
    cache = "gemv_dispatch.json"
    classes = G.ROW_CLASSES
    attr = "gemv_table"
    buffer = "gemv_counters"
    swaps = {nn.Linear: GemvLinear, FusedInputProjection: DispatchedGroup}

    def sites(self, model: nn.Module) -> list[Site]:
        return [(name, m, tuple(m.weight.shape)) for name, m in model.named_modules()
                if isinstance(m, (nn.Linear, FusedInputProjection))]  # fmt: skip

    def key(self, shape: Hashable) -> str:
        n, k = shape  # type: ignore[misc]
        return f"{n}x{k}"

    def sort(self, shapes: set[Hashable]) -> list[Hashable]:
        return sorted(shapes)  # type: ignore[type-var]

    def measure(self, shape: Hashable, rows: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        return G.measure_shape(*shape, rows, dtype, device)  # type: ignore[misc]

    def fresh(self, rec: dict[str, Any], rows: int) -> bool:
        """A record of this :data:`~gac.kernels.gemv.REVISION` of the kernel that timed every configuration
        :data:`~gac.kernels.gemv.CONFIGS` now lists for ``rows``."""
        return rec.get("revision", 1) == G.REVISION and tried_all(rec, G.CONFIGS[row_class(rows, G.CONFIGS)])

    def counters(self, module: nn.Module, table: dict[int, Any]) -> torch.Tensor | None:
        if any(v is not None and G.split_of(v) > 1 for v in table.values()):  # split-K tickets
            return G.new_counters(module.weight.shape[0], module.weight.device)
        return None


GEMV = GemvDispatch()


def use_triton_gemv_(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Route every decode-sized GEMV of ``model`` that the Triton kernel runs faster to it, in place.

    Every ``nn.Linear`` (dense, or a factor of a factorized layer) and every fused first stage
    (:class:`~gac.nn.fused.FusedInputProjection`) is looked up in the dispatch table of its
    ``(out, in)`` shape (measured on first use); where neither row class wins, the module is left as
    it is.  Modules whose qualified name ends with one of ``skip`` are left alone.  Returns
    ``{"modules": switched, "of": linear layers seen, "shapes": {..}}``; a model not on CUDA, or no
    Triton, switches nothing (``"reason"`` says why).
    """
    return GEMV.use_(model, skip)


def undo_triton_gemv_(model: nn.Module) -> int:
    """Back to cuBLAS everywhere. Returns the modules changed."""
    return GEMV.undo_(model)


def measured(dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """The cached GEMV measurements of this GPU (for reports)."""
    return GEMV.measured(dtype, device)
