"""The fused low-rank kernel's dispatch (:mod:`gac.kernels.lowrank_fused`): both factors in one launch where faster.

Sites are the factorized layers (``o_proj``, ``down_proj``) and the fused groups with a factorized
member (q/k/v, gate/up; at most :data:`~gac.kernels.lowrank_fused.MAX_SEGMENTS` members).  Each site
shape is timed at one token row by default (the kernel lost to the existing path at 2..64 rows on the
H200, :data:`~gac.kernels.lowrank_fused.CONFIGS`), cached in ``$GAC_CACHE/lowrank_fused_dispatch.json``,
and a site is switched only where the kernel beat the existing path by the margin.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

from gac.kernels import lowrank_fused as L
from gac.nn.factorized import FactorizedLinear
from gac.nn.fused import FusedInputProjection
from gac.runtime.dispatch import Dispatch, Site, row_class, tried_all
from gac.runtime.modules import DispatchedGroup, FusedLowRankLinear


def decode_sites(model: nn.Module) -> list[Site]:
    """``(name, module, (k, splits, outs))`` for every factorized layer and fused group with a factorized member."""
    found: list[Site] = []
    for name, m in model.named_modules():
        if isinstance(m, FactorizedLinear):
            found.append((name, m, (m.in_features, (m.rank,), (m.out_features,))))
        elif isinstance(m, FusedInputProjection):
            if len(m.splits) > L.MAX_SEGMENTS or all(u is None for u in m.seconds):
                continue  # too many members for the kernel, or all dense: one GEMV already
            outs = tuple(int(u.out_features) if u is not None else None for u in m.seconds)
            found.append((name, m, (m.in_features, tuple(m.splits), outs)))
    return found


class LowRankFusedDispatch(Dispatch):
    """Sites: :func:`decode_sites`, keyed by :func:`~gac.kernels.lowrank_fused.site_key`."""

    what = "fused low-rank dispatch"
    cache = "lowrank_fused_dispatch.json"
    classes = tuple(sorted(L.CONFIGS))
    measured_classes = L.ROW_CLASSES
    attr = "lowrank_table"
    buffer = "lowrank_counters"
    swaps = {FactorizedLinear: FusedLowRankLinear, FusedInputProjection: DispatchedGroup}

    def sites(self, model: nn.Module) -> list[Site]:
        return decode_sites(model)

    def key(self, shape: Hashable) -> str:
        k, splits, outs = shape  # type: ignore[misc]
        return L.site_key(k, list(splits), list(outs))

    def measure(self, shape: Hashable, rows: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        k, splits, outs = shape  # type: ignore[misc]
        return L.measure_site(k, list(splits), list(outs), rows, dtype, device)

    def fresh(self, rec: dict[str, Any], rows: int) -> bool:
        """A record that tried every configuration :data:`~gac.kernels.lowrank_fused.CONFIGS` now lists."""
        return tried_all(rec, L.CONFIGS[row_class(rows, L.CONFIGS)])

    def value(self, decision: Any) -> Any:
        return list(decision) if decision is not None else None

    def counters(self, module: nn.Module, table: dict[int, Any]) -> torch.Tensor | None:
        w = module.weight if isinstance(module, FusedInputProjection) else module.v.weight
        return L.new_counters(w.device)


LOWRANK_FUSED = LowRankFusedDispatch()


def use_fused_lowrank_(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run each factorized layer (and each fused group with a factorized member) in one launch at decode.

    In place: a :class:`~gac.nn.FactorizedLinear` (``o_proj``, ``down_proj``) becomes a
    :class:`~gac.runtime.modules.FusedLowRankLinear`; a :class:`~gac.nn.fused.FusedInputProjection`
    with its members (q/k/v, gate/up) a :class:`~gac.runtime.modules.DispatchedGroup`.  Only the sites
    whose shape was measured faster with the kernel (cached per machine) are switched, and only inputs
    of a row class the site was measured faster at take the kernel.  Modules whose qualified name ends
    with one of ``skip`` are left alone.  Returns ``{"modules": switched, "of": sites, "shapes": {..}}``;
    on a model not on CUDA, or without Triton, nothing is switched and ``"reason"`` says why.
    """
    return LOWRANK_FUSED.use_(model, skip)


def undo_fused_lowrank_(model: nn.Module) -> int:
    """Back to the existing path everywhere. Returns the modules changed."""
    return LOWRANK_FUSED.undo_(model)


def switch_(m: nn.Module, table: dict[int, Any]) -> nn.Module:
    """Switch one factorized layer, or one fused group, to the kernel for ``table`` (row class -> config)."""
    return LOWRANK_FUSED.switch_(m, table)


def switch_recorded_(model: nn.Module, shapes: dict[str, dict[str, Any]] | None) -> int:
    """Switch the sites a recorded :func:`use_fused_lowrank_` result switched (its ``"shapes"``), measuring nothing."""
    return LOWRANK_FUSED.switch_recorded_(model, shapes)


def measured(dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """The cached fused low-rank measurements of this GPU (for reports)."""
    return LOWRANK_FUSED.measured(dtype, device)


def barrier_timeouts(model: nn.Module) -> list[str]:
    """Names of the switched modules whose barrier ever gave up (their results are wrong). Syncs the GPU."""
    return [
        name
        for name, m in model.named_modules()
        if "lowrank_counters" in getattr(m, "_buffers", {}) and int(m.lowrank_counters[2]) != 0
    ]
