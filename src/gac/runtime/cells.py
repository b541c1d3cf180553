"""Recorded cells priced by the latency model: each cell's model rebuilt as its ``infer`` eval ran it.

A cell of ``gac run`` records the model spec, the kept dims and what its ``infer`` eval switched
(``gemv``, ``fused_lowrank`` and ``branches``: the shapes whose dispatch chose the kernel).
:func:`cell_skeleton` rebuilds that structure on the meta device (:func:`gac.hardware.latency.skeleton`)
and switches the recorded sites again (:meth:`gac.runtime.dispatch.Dispatch.switch_recorded_`:
measuring nothing), so :func:`gac.hardware.latency.predict` prices each switched site from its table;
:func:`compare_cells` sets predicted against measured speedups (``gac report``).
"""

from __future__ import annotations

from typing import Any

from gac.errors import GacError
from gac.hardware.latency import (
    infer_of,
    latent_apart_line,
    latent_beyond_line,
    latent_note,
    predict_pair,
    profile_of,
    skeleton,
    worst,
)
from gac.hardware.profile import Profile
from gac.runtime.branches import BRANCHES
from gac.runtime.gemv import GEMV
from gac.runtime.lowrank_fused import LOWRANK_FUSED


def cell_skeleton(cell: dict[str, Any]) -> Any:
    """:func:`~gac.hardware.latency.skeleton` of a recorded cell: its model spec, its kept dims, fused as its ``infer`` ran,
    with the weights its ``infer`` switched to the Triton decode GEMV, the sites it switched to the fused low-rank
    kernel, and the groups it switched to parallel second stages, switched again."""
    inf = infer_of(cell) or {}
    spec = str((cell.get("cell") or {}).get("model"))
    model = skeleton(spec, (cell.get("results") or {}).get("dims"), str(inf.get("dtype") or "bfloat16"),
                     fused=bool(inf.get("fused", True)))  # fmt: skip
    GEMV.switch_recorded_(model, (inf.get("gemv") or {}).get("shapes"))
    LOWRANK_FUSED.switch_recorded_(model, (inf.get("fused_lowrank") or {}).get("shapes"))
    BRANCHES.switch_recorded_(model, (inf.get("branches") or {}).get("shapes"))
    return model


def compare_cells(
    base: dict[str, Any], variants: list[dict[str, Any]], profile: Profile | None = None
) -> dict[str, Any]:
    """Predicted against measured speedups of recorded ``variants`` over their ``base`` cell.

    Returns ``{cell id: {"profile", "rows": predict_pair rows, "worst": worst row}}`` for every
    variant with an ``infer`` eval; a variant whose skeleton cannot be built gets ``"error"``.
    """
    binf = infer_of(base)
    out: dict[str, Any] = {}
    if binf is None:
        return out
    bskel = None
    for v in variants:
        inf = infer_of(v)
        if inf is None:
            continue
        prof = profile_of(v, profile)
        try:
            bskel = bskel if bskel is not None else cell_skeleton(base)
            vskel = cell_skeleton(v)
            rows = predict_pair(bskel, vskel, prof, binf, inf)
        except GacError as e:
            out[str(v.get("id"))] = {"profile": prof.id, "error": str(e), "rows": []}
            continue
        note = latent_note(vskel, prof) or {}
        beyond, apart = note.get("beyond_timed_rank"), note.get("grouped_apart")
        notes = [prof.latency_note(), latent_beyond_line(beyond) if beyond else None,
                 latent_apart_line(apart) if apart else None]  # fmt: skip
        notes = [n for n in notes if n]
        out[str(v.get("id"))] = {
            "profile": prof.id,
            "note": "; ".join(notes) or None,
            "rows": rows,
            "worst": worst(rows),
        }
    return out
