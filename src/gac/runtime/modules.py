"""The module classes the dispatches swap in (:mod:`gac.runtime.dispatch`): each reads its table at every call.

A switched module keeps its parameters (the same tensors); only its class changes, and it gains a
table attribute (row class -> decision, :func:`gac.hardware.dispatch_table.choice`) and, where the
kernel needs them, zeroed counters as a non-persistent buffer.  Each class names the plain class it
came from (``plain``) and the table attributes it reads (``tables``): undoing the last of them
gives the module its plain class back.

* :class:`GemvLinear`: an ``nn.Linear`` whose decode-sized inputs take the Triton GEMV
  (:mod:`gac.kernels.gemv`) where ``gemv_table`` says so;
* :class:`FusedLowRankLinear`: a :class:`~gac.nn.FactorizedLinear` whose decode-sized inputs run both
  factors in one launch (:mod:`gac.kernels.lowrank_fused`) where ``lowrank_table`` says so;
* :class:`DispatchedGroup`: a fused first stage (:class:`~gac.nn.fused.FusedInputProjection`) with any
  of the three: its whole group in one launch (``lowrank_table``), else its first stage by the GEMV
  (``gemv_table``) and its members' second factors in parallel (``branch_table``,
  :mod:`gac.kernels.branches`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gac.hardware.dispatch_table import choice, rows_of
from gac.kernels.branches import apply_seconds
from gac.kernels.gemv import gemv
from gac.kernels.lowrank_fused import lowrank_fused
from gac.nn.factorized import FactorizedLinear
from gac.nn.fused import FusedInputProjection, aligned_split


def dispatch_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    table: dict[int, Any] | None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear``, or the Triton GEMV where ``table`` (row class -> config) says it was faster."""
    cfg = choice(table, rows_of(x))
    if cfg is not None:
        return gemv(x, w, b, tuple(cfg), counters)
    return F.linear(x, w, b)


class GemvLinear(nn.Linear):
    """An ``nn.Linear`` whose decode-sized inputs take the Triton GEMV where it was measured faster.

    Made in place from an ``nn.Linear`` by :func:`gac.runtime.gemv.use_triton_gemv_` (the class is
    swapped; the parameters are the same tensors), and back by :func:`gac.runtime.gemv.undo_triton_gemv_`.
    """

    plain = nn.Linear
    tables = ("gemv_table",)
    gemv_table: dict[int, Any] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch_linear(x, self.weight, self.bias, self.gemv_table, self._buffers.get("gemv_counters"))


class FusedLowRankLinear(FactorizedLinear):
    """A :class:`FactorizedLinear` whose decode-sized inputs run both factors in one launch.

    Made in place by :func:`gac.runtime.lowrank_fused.use_fused_lowrank_` (class swap plus a
    non-persistent counter buffer; the parameters are the same tensors) and undone by
    :func:`gac.runtime.lowrank_fused.undo_fused_lowrank_`.
    """

    plain = FactorizedLinear
    tables = ("lowrank_table",)
    lowrank_table: dict[int, Any] | None = None
    lowrank_counters: torch.Tensor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg = choice(self.lowrank_table, rows_of(x))
        if cfg is None:
            return super().forward(x)
        return lowrank_fused(
            x, self.v.weight, None, [self.u.weight], [self.u.bias], [self.rank], [self.out_features],
            self.lowrank_counters, cfg,
        )  # fmt: skip


class DispatchedGroup(FusedInputProjection):
    """A fused first stage that runs the kernels its tables name, at the row classes they name.

    ``lowrank_table``: every member's final output in one launch (its ``u`` included); else
    ``gemv_table``: the first stage by the Triton GEMV, and ``branch_table``: the factorized members'
    second factors as parallel stream branches (True) or one grouped launch (a configuration).  The
    members skip their ``u`` where the group has applied it (:meth:`applies_seconds`).
    """

    plain = FusedInputProjection
    tables = ("gemv_table", "lowrank_table", "branch_table")
    gemv_table: dict[int, Any] | None = None
    lowrank_table: dict[int, Any] | None = None
    branch_table: dict[int, Any] | None = None

    def applies_seconds(self, x: torch.Tensor) -> bool:
        rows = rows_of(x)
        return choice(self.lowrank_table, rows) is not None or choice(self.branch_table, rows) is not None

    def _products(self, x: torch.Tensor) -> list[torch.Tensor | None]:
        rows = rows_of(x)
        us = self.seconds
        cfg = choice(self.lowrank_table, rows)
        if cfg is not None:
            outs = [int(u.out_features) if u is not None else s for u, s in zip(us, self.splits, strict=True)]
            y = lowrank_fused(
                x, self.weight, self.bias, [u.weight if u is not None else None for u in us],
                [u.bias if u is not None else None for u in us], self.splits, outs, self.lowrank_counters, cfg,
            )  # fmt: skip
            return aligned_split(y, outs)
        y = dispatch_linear(x, self.weight, self.bias, self.gemv_table, self._buffers.get("gemv_counters"))
        how = choice(self.branch_table, rows)
        if how is None:
            return aligned_split(y, self.splits)
        # the factorized members' columns go to the branches whole (``y``): only the dense ones are sliced
        parts = aligned_split(y, self.splits, keep=[u is None for u in us])
        return apply_seconds(y, self.splits, parts, us, how)
