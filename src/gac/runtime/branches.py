"""The parallel second stages' dispatch (:mod:`gac.kernels.branches`): stream branches or one grouped launch.

Every fused group with at least two factorized members is timed once per machine at each row class
(the whole group, first stage included: sequential against branched and against the grouped launch
in each configuration of :data:`gac.kernels.gemv.GROUP_CONFIGS`, :func:`gac.kernels.branches.measure_group`)
and takes the faster parallel path only at the row classes where it beat the sequential one by the
margin.  Decisions are cached in ``$GAC_CACHE/branch_dispatch.json`` per GPU, torch, Triton and dtype.
An input of more rows than the largest class keeps the sequential path.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch import nn

from gac.kernels import branches as B
from gac.kernels.gemv import GROUP_CONFIGS, REVISION
from gac.kernels.jit import HAVE_TRITON
from gac.nn.fused import FusedInputProjection
from gac.runtime.dispatch import Dispatch, Site, row_class, tried_all
from gac.runtime.lowrank_fused import LOWRANK_FUSED, decode_sites
from gac.runtime.modules import DispatchedGroup


def groups(model: nn.Module) -> list[Site]:
    """:func:`~gac.runtime.lowrank_fused.decode_sites` entries of fused groups with at least two factorized members."""
    return [s for s in decode_sites(model)
            if isinstance(s[1], FusedInputProjection) and sum(o is not None for o in s[2][2]) >= 2]  # fmt: skip


class BranchesDispatch(Dispatch):
    """Sites: :func:`groups`; a decision is True (streams), a grouped launch's configuration, or None."""

    what = "parallel second stages"
    cache = "branch_dispatch.json"
    classes = B.ROW_CLASSES
    attr = "branch_table"
    needs_triton = False  # stream branches are cuBLAS calls
    swaps = {FusedInputProjection: DispatchedGroup}

    def sites(self, model: nn.Module) -> list[Site]:
        return groups(model)

    def key(self, shape: Hashable) -> str:
        return LOWRANK_FUSED.key(shape)

    def measure(self, shape: Hashable, rows: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        k, splits, outs = shape  # type: ignore[misc]
        return B.measure_group(k, list(splits), list(outs), rows, dtype, device)

    def fresh(self, rec: dict[str, Any], rows: int) -> bool:
        """A record that timed the grouped launch of this GEMV revision in every configuration
        :data:`~gac.kernels.gemv.GROUP_CONFIGS` now lists (older records, streams only, are measured again)."""
        if not HAVE_TRITON:
            return True
        return rec.get("revision") == REVISION and tried_all(
            rec, GROUP_CONFIGS[row_class(rows, GROUP_CONFIGS)]
        )

    def value(self, decision: Any) -> Any:
        """A configuration list, True (streams) or None, as :func:`gac.kernels.branches.second_stages` takes it."""
        if isinstance(decision, (list, tuple)):
            return [int(c) for c in decision]
        return True if decision else None

    def recorded_row(self, row: dict[int, Any]) -> dict[str, Any]:
        return {str(r): v for r, v in row.items() if v}


BRANCHES = BranchesDispatch()


def use_branches_(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Run the second stages of each fused group in parallel at the row classes measured faster.

    In place: a :class:`~gac.nn.fused.FusedInputProjection` with two or more factorized members becomes
    a :class:`~gac.runtime.modules.DispatchedGroup` with a ``branch_table``; its members then take their
    finished outputs from the group.  Returns ``{"modules": switched, "of": groups, "shapes": {key: {row
    class: true | configuration}}}``; a model not on CUDA switches nothing (``"reason"`` says why).
    Groups whose qualified name ends with one of ``skip`` are left alone.
    """
    return BRANCHES.use_(model, skip)


def undo_branches_(model: nn.Module) -> int:
    """Back to sequential second stages everywhere. Returns the groups changed."""
    return BRANCHES.undo_(model)


def switch_recorded_(model: nn.Module, shapes: dict[str, dict[str, Any]] | None) -> int:
    """Switch the groups a recorded :func:`use_branches_` result switched (its ``"shapes"``), measuring nothing."""
    return BRANCHES.switch_recorded_(model, shapes)


def measured(dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
    """The cached measurements of this GPU (for reports)."""
    return BRANCHES.measured(dtype, device)
