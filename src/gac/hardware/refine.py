"""``gac profile --refine``: re-measure a profile around the cliffs a model actually hits.

A profile's curves cover a few windows of typical sizes; everywhere else its prediction comes
from the alignment class of a dim (``class_efficiency``).  A model whose dims sit on a cliff the
coarse curve never saw is then mispriced.  Refinement is deterministic:

1. list the distinct GEMM shapes of the model as the latency model prices them
   (:func:`model_gemms`: dense projections and ``lm_head`` as one GEMM under ``gemm_n``,
   a factorized pair as ``x @ V^T`` under ``lowrank_r`` then ``@ U^T`` under ``gemm_n``);
2. measure each one and compare with :meth:`Profile.gemm_ms` (:func:`disagreement`): the
   profile's absolute peak comes from other shapes, so each GEMM is scored by
   ``|log((measured/predicted) / median(measured/predicted))|``, its error after removing
   the global scale;
3. for the worst GEMMs scoring above the tolerance, take their least-aligned dim (smallest
   :func:`~gac.alignment.pow2_class`; N of a dense or second GEMM -> ``gemm_n``, N of a first
   factor GEMM -> ``lowrank_r``, K -> ``gemm_k``; N at M = 1 -> ``gemv`` when the profile has it),
   measure that operator's curve at stride 1 over ``[d - half_window, d + half_window]`` at the
   profile's own context (dims already on the curve are skipped), merge the points into the
   curve and re-distil that operator's rule (:func:`~gac.hardware.profiler.discover_rule`);
4. keep a round's update only if the model's GEMMs fit it better (summed score), and repeat for
   ``rounds`` rounds, or until no GEMM scores above the tolerance or nothing new is left to
   measure.  GEMMs whose dims are all multiples of 64 (:data:`FASTEST_CLASS`) are never refined:
   their disagreement comes from their shape, not from a cliff.

Merged points join the curve window they overlap (so their efficiencies are judged against
their measured neighbours); a window that overlaps none becomes a new window.  Every round is
recorded in ``profile.env["refinements"]`` and the profile id ends in ``-refined``.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn

from gac.alignment import pow2_class
from gac.errors import GacError
from gac.hardware.profile import Profile
from gac.hardware.profiler import Curve, discover_rule
from gac.hardware.sweeps import Config, op_point
from gac.hardware.sweeps import measure_point as measure_sweep_point
from gac.hardware.timing import bench, rotation_sets
from gac.models.adapters import get_adapter, in_features, out_features
from gac.models.loading import load_model
from gac.nn import FactorizedLinear
from gac.testing import FAMILIES, OTHER_FAMILIES, tiny_model

#: dims that are multiples of this are on every measured GPU's fastest path: a GEMM made only of
#: them that disagrees with the profile does so for its shape, not for a cliff (never refined)
FASTEST_CLASS = 64
MeasureGemm = Callable[[int, int, int], float]
MeasurePoint = Callable[[str, int], "float | None"]

#: the keys of ``curve["context"]`` each operator class needs to be measured again
CONTEXT_KEYS: dict[str, tuple[str, ...]] = {
    "gemm_n": ("M", "K"),
    "gemm_k": ("M", "N"),
    "gemv": ("K",),
    "sdpa_head_dim": ("B", "S", "H"),
    "lowrank_r": ("M", "d"),
}


# --------------------------------------------------------------------------- the model's GEMMs
@dataclass
class Gemm:
    """One distinct GEMM ``[m, k] @ [k, n]`` of a model, as the latency model prices it.

    ``op`` is the operator class of N in :func:`gac.surgery.repair.predicted_latency_ms`
    (``gemm_n``, or ``lowrank_r`` for the first GEMM of a factorized pair); ``role`` is
    ``dense``, ``lowrank_v`` (``x @ V^T``) or ``lowrank_u`` (``@ U^T``).
    """

    m: int
    k: int
    n: int
    op: str
    role: str
    fqns: list[str] = field(default_factory=list)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)

    @property
    def irregular(self) -> str:
        """``"N"`` or ``"K"``: the least-aligned dim (N on a tie)."""
        return "K" if pow2_class(self.k) < pow2_class(self.n) else "N"

    def label(self) -> str:
        return f"{self.m}x{self.k}x{self.n}"


def model_gemms(model: nn.Module, tokens: int) -> list[Gemm]:
    """The distinct GEMMs of a model's projections and ``lm_head`` for a ``tokens`` prefill.

    Deduplicated by ``(m, k, n, op, role)``; each keeps the module names that run it (a
    factorized site's two GEMMs are named ``<fqn>.v`` and ``<fqn>.u``).
    """
    if tokens < 1:
        raise GacError(f"--tokens must be a positive integer, got {tokens}")
    ad = get_adapter(model)
    fqns = [fqn for _, _, fqn in ad.all_projections()] + [ad.lm_head_fqn]
    out: dict[tuple[int, int, int, str, str], Gemm] = {}

    def add(k: int, n: int, op: str, role: str, name: str) -> None:
        key = (tokens, k, n, op, role)
        if key not in out:
            out[key] = Gemm(tokens, k, n, op, role)
        out[key].fqns.append(name)

    for fqn in fqns:
        mod = model.get_submodule(fqn)
        if isinstance(mod, FactorizedLinear):
            add(mod.in_features, mod.rank, "lowrank_r", "lowrank_v", f"{fqn}.v")
            add(mod.rank, mod.out_features, "gemm_n", "lowrank_u", f"{fqn}.u")
        else:
            add(in_features(mod), out_features(mod), "gemm_n", "dense", fqn)
    return list(out.values())


def n_op(profile: Profile, g: Gemm) -> str:
    """The operator class that prices N: ``gemv`` for a dense-style GEMM at M = 1 if measured."""
    if g.m == 1 and g.op == "gemm_n" and "gemv" in profile.ops:
        return "gemv"
    return g.op


def target_dim(profile: Profile, g: Gemm) -> tuple[str, int]:
    """``(op, dim)``: the curve to refine for a mispriced GEMM (its least-aligned dim)."""
    if g.irregular == "K" and "gemm_k" in profile.ops:
        return "gemm_k", g.k
    return n_op(profile, g), g.n


# --------------------------------------------------------------------------- scoring
def predicted_ms(profile: Profile, g: Gemm) -> float:
    return profile.gemm_ms(g.m, g.k, g.n, op=n_op(profile, g))


def disagreement(profile: Profile, gemms: list[Gemm], measured_ms: list[float]) -> dict[str, Any]:
    """Predicted vs measured time of each GEMM, scored after removing the global scale.

    Returns:
        ``{"rows": [...], "scale": median(measured/predicted), "predicted_total_ms",
        "measured_total_ms", "scaled_predicted_total_ms"}``; each row has the GEMM, its
        ``count`` (modules running it), ``predicted_ms``, ``measured_ms``, ``ratio`` and
        ``score`` = ``|log(ratio / scale)|``.  Totals weight each GEMM by its count.
    """
    if len(gemms) != len(measured_ms):
        raise ValueError("one measurement per GEMM")
    if not gemms:
        raise GacError("the model has no projection GEMMs to compare")
    pred = [predicted_ms(profile, g) for g in gemms]
    ratio = [m / p for m, p in zip(measured_ms, pred, strict=True)]
    srt = sorted(ratio)
    mid = len(srt) // 2
    scale = srt[mid] if len(srt) % 2 else math.sqrt(srt[mid - 1] * srt[mid])
    rows = []
    for g, p, m, r in zip(gemms, pred, measured_ms, ratio, strict=True):
        rows.append(
            {
                "gemm": g,
                "count": len(g.fqns),
                "predicted_ms": p,
                "measured_ms": float(m),
                "ratio": r,
                "score": abs(math.log(r / scale)),
            }
        )
    pt = sum(r["predicted_ms"] * r["count"] for r in rows)
    mt = sum(r["measured_ms"] * r["count"] for r in rows)
    return {
        "rows": rows,
        "scale": scale,
        "predicted_total_ms": pt,
        "measured_total_ms": mt,
        "scaled_predicted_total_ms": pt * scale,
    }


# --------------------------------------------------------------------------- curve surgery
def flops_fn(op: str, context: dict[str, Any]) -> Callable[[int], float]:
    """FLOPs of one point of ``op``'s curve at dim ``d`` under the curve's context."""
    need = CONTEXT_KEYS.get(op)
    if need is None:
        raise GacError(f"unknown operator class {op!r}")
    missing = [k for k in need if k not in context]
    if missing:
        raise GacError(
            f"the profile's {op} curve has no measurement context ({', '.join(missing)} missing); "
            "re-measure it with gac profile"
        )
    c = {k: int(context[k]) for k in need}
    if op == "gemm_n":
        return lambda d: 2.0 * c["M"] * c["K"] * d
    if op == "gemm_k":
        return lambda d: 2.0 * c["M"] * c["N"] * d
    if op == "gemv":
        return lambda d: 2.0 * c["K"] * d
    if op == "sdpa_head_dim":
        return lambda d: 4.0 * c["B"] * c["H"] * c["S"] * c["S"] * d
    return lambda d: 4.0 * c["M"] * c["d"] * d


def _spans(curve: dict[str, Any]) -> list[list[int]]:
    dims, win = curve["dims"], curve.get("window") or [0] * len(curve["dims"])
    n = max(win) + 1 if win else 0
    given = curve.get("windows") or []
    spans = []
    for w in range(n):
        ds = [d for d, wi in zip(dims, win, strict=True) if wi == w]
        lo, hi = (min(ds), max(ds)) if ds else (0, -1)
        if w < len(given):
            lo, hi = min(lo, int(given[w][0])), max(hi, int(given[w][1]))
        spans.append([lo, hi])
    return spans


def merge_points(
    curve: dict[str, Any], new: dict[int, float], lo: int, hi: int, flops: Callable[[int], float]
) -> dict[str, Any]:
    """A copy of ``curve`` with the points ``new`` (dim -> ms, measured over ``[lo, hi]``) added.

    The range joins every window it overlaps (or a new window); windows are renumbered in
    order of their dims, so the points end up sorted by dim, each dim once.  ``tflops`` of
    the new points come from ``flops``; their ``iqr_ms`` is None.  ``efficiency``,
    ``rule_evidence`` and cliffs are left for :func:`redistil_op`.
    """
    dims = list(curve["dims"])
    if set(new) & set(dims):
        raise ValueError("new points must not be on the curve already")
    n = len(dims)
    win = list(curve.get("window") or [0] * n)
    ms = list(curve["ms"])
    tf = list(curve.get("tflops") or [None] * n)
    iqr = list(curve.get("iqr_ms") or [None] * n)
    spans = _spans(curve)
    hit = [w for w, (a, b) in enumerate(spans) if a <= hi and lo <= b]
    joined = [min([lo] + [spans[w][0] for w in hit]), max([hi] + [spans[w][1] for w in hit])]
    keep = [s for w, s in enumerate(spans) if w not in hit] + [joined]
    order = sorted(range(len(keep)), key=lambda i: keep[i][0])
    new_spans = [keep[i] for i in order]
    # old window -> new index
    remap = {}
    for w, s in enumerate(spans):
        target = joined if w in hit else s
        remap[w] = new_spans.index(target)
    jw = new_spans.index(joined)
    pts = [(remap[w], d, t, f, q) for w, d, t, f, q in zip(win, dims, ms, tf, iqr, strict=True)]
    pts += [(jw, d, float(t), round(flops(d) / (t * 1e-3) / 1e12, 3), None) for d, t in new.items()]
    pts.sort(key=lambda p: (p[0], p[1]))
    out = dict(curve)
    out["window"] = [p[0] for p in pts]
    out["dims"] = [p[1] for p in pts]
    out["ms"] = [round(p[2], 6) for p in pts]
    out["tflops"] = [p[3] for p in pts]
    out["iqr_ms"] = [p[4] for p in pts]
    out["windows"] = new_spans
    out["refined"] = [*curve.get("refined", []), [lo, hi]]
    out["refined_dims"] = sorted(set(curve.get("refined_dims", [])) | set(new))
    return out


def redistil_op(profile: Profile, op: str) -> None:
    """Re-derive one operator's rule from its stored curve, in place (as :func:`redistil` does)."""
    r = profile.ops[op]
    c = r.curve
    la = int(c.get("lookahead", 64))
    rule = discover_rule(
        Curve(list(c["dims"]), list(c["ms"]), list(c.get("window") or [0] * len(c["dims"]))),
        tolerance=r.tolerance,
        lookahead=la,
    )
    if rule["dims"] != c["dims"]:  # merge_points keeps (window, dim) order, as discover_rule does
        raise AssertionError("curve not in (window, dim) order")
    c.update(efficiency=rule["efficiency"], rule_evidence=rule["rule_evidence"], lookahead=la)
    r.modulus, r.prefer = rule["modulus"], rule["prefer"]
    r.class_efficiency, r.cliffs = rule["class_efficiency"], rule["cliffs"]


# --------------------------------------------------------------------------- the loop
@dataclass
class RefineResult:
    """What :func:`refine_profile` did."""

    profile: Profile
    gemms: list[Gemm]
    before: dict[str, Any]  # disagreement under the input profile (first measurement)
    after: dict[str, Any]  # disagreement under the refined profile (last measurement)
    rounds: list[dict[str, Any]]
    points_measured: int
    stopped: str


def _check_profile(profile: Profile) -> None:
    if not profile.measured:
        raise GacError(
            f"profile {profile.id!r} is not measured (the built-in default has no curves to refine); "
            "measure one with gac profile --out P.json first"
        )


def _check_op(profile: Profile, op: str) -> None:
    r = profile.ops.get(op)
    if r is None or not r.curve.get("dims"):
        raise GacError(f"profile {profile.id!r} has no measured {op} curve to refine")
    flops_fn(op, r.curve.get("context") or {})


def _check_args(top: int, half_window: int, rounds: int, tol: float) -> None:
    if top < 1:
        raise GacError(f"--top must be at least 1, got {top}")
    if half_window < 0:
        raise GacError(f"--half-window must be >= 0, got {half_window}")
    if rounds < 1:
        raise GacError(f"--rounds must be at least 1, got {rounds}")
    if not tol > 0:
        raise GacError(f"--tolerance-refine must be positive, got {tol}")


def _pick_targets(
    prof: Profile, over: list[dict[str, Any]], top: int, half_window: int
) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The worst ``top`` GEMMs of ``over`` whose refinement window still has unmeasured dims, by
    ``(op, dim)`` to measure."""
    targets: dict[tuple[str, int], list[dict[str, Any]]] = {}
    picked = 0
    for r in over:
        if min(pow2_class(r["gemm"].n), pow2_class(r["gemm"].k)) >= FASTEST_CLASS:
            continue  # no cliff to find: it disagrees for its shape
        op, d = target_dim(prof, r["gemm"])
        _check_op(prof, op)
        if (op, d) not in targets:
            c = prof.ops[op].curve
            have = set(c["dims"]) | {int(x) for x in c.get("failed", [])}
            if all(x in have for x in range(max(1, d - half_window), d + half_window + 1)):
                continue
        targets.setdefault((op, d), []).append(r)
        picked += 1
        if picked == top:
            break
    return targets


def _measure_window(
    trial: Profile, op: str, d: int, half_window: int, measure_point: MeasurePoint
) -> tuple[dict[int, float], list[int], int]:
    """Measure ``op``'s unmeasured dims in ``[d - half_window, d + half_window]`` into ``trial`` (merged,
    the rule re-distilled): the new points, the failed dims and how many points were measured."""
    curve = trial.ops[op].curve
    lo, hi = max(1, d - half_window), d + half_window
    have = set(curve["dims"]) | {int(x) for x in curve.get("failed", [])}
    new: dict[int, float] = {}
    failed: list[int] = []
    n_points = 0
    for x in range(lo, hi + 1):
        if x in have:
            continue
        v = measure_point(op, x)
        n_points += 1
        if v is None or not math.isfinite(v) or v <= 0:
            failed.append(x)
        else:
            new[x] = float(v)
    if failed:
        curve["failed"] = sorted(set(curve.get("failed", [])) | set(failed))
    if new:
        trial.ops[op].curve = merge_points(curve, new, lo, hi, flops_fn(op, curve.get("context") or {}))
        redistil_op(trial, op)
    return new, failed, n_points


def _measure_targets(
    trial: Profile,
    targets: dict[tuple[str, int], list[dict[str, Any]]],
    half_window: int,
    measure_point: MeasurePoint,
    base: dict[str, Any],
) -> tuple[list[dict[str, Any]], int]:
    """Measure each target's window into ``trial``: one round record per target (``base`` plus what
    was measured) and the number of points measured."""
    recs = []
    n_points = 0
    for op, d in targets:
        new, failed, n = _measure_window(trial, op, d, half_window, measure_point)
        n_points += n
        recs.append(
            {
                **base,
                "op": op,
                "dim": d,
                "window": [max(1, d - half_window), d + half_window],
                "points_added": sorted(new),
                "points_failed": failed,
                "rule": {"modulus": trial.ops[op].modulus, "prefer": trial.ops[op].prefer},
            }
        )
    return recs, n_points


def _gemm_scores(rows: list[dict[str, Any]], score_after: dict[int, float]) -> list[dict[str, Any]]:
    """A round record's ``gemms``: each refined GEMM with its scores before and after."""
    return [
        {
            "shape": list(r["gemm"].shape),
            "role": r["gemm"].role,
            "fqns": r["gemm"].fqns[:4] + ([f"+{len(r['gemm'].fqns) - 4}"] if len(r["gemm"].fqns) > 4 else []),
            "predicted_ms": r["predicted_ms"],
            "measured_ms": r["measured_ms"],
            "score_before": round(r["score"], 4),
            "score_after": round(score_after[id(r["gemm"])], 4),
        }
        for r in rows
    ]


def _stamp(prof: Profile, records: list[dict[str, Any]]) -> None:
    """Record the rounds in ``prof.env["refinements"]`` and mark the profile refined."""
    env = prof.env
    env.setdefault("refinements", [])
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    command = " ".join(shlex.quote(a) for a in sys.argv)
    for rec in records:
        env["refinements"].append({**rec, "timestamp": stamp, "command": command})
    if not prof.id.endswith("-refined"):
        prof.id = f"{prof.id}-refined"
        prof.label = f"{prof.label}, refined against models"


def refine_profile(
    profile: Profile,
    model: nn.Module,
    tokens: int,
    measure_gemm: MeasureGemm,
    measure_point: MeasurePoint,
    top: int = 4,
    half_window: int = 8,
    rounds: int = 2,
    tol: float = 0.1,
    model_spec: str = "",
    on_round: Callable[[dict[str, Any]], None] | None = None,
) -> RefineResult:
    """Re-measure ``profile`` around the dims where it misprices ``model``'s GEMMs.

    Args:
        profile: a measured profile (not modified; the result holds a refined copy).
        model: the model whose GEMMs are compared (see :func:`model_gemms`).
        tokens: prefill length (M of every GEMM).
        measure_gemm: ``(m, k, n) -> ms`` of ``[m, k] @ [k, n]``.
        measure_point: ``(op, dim) -> ms`` (None if it failed) of one point of ``op``'s curve at
            the profile's own context.
        top: GEMMs refined per round (the worst scoring above ``tol``).
        half_window: each refined dim ``d`` measures ``[d - half_window, d + half_window]``.
        rounds: most rounds (each measures every GEMM again).
        tol: scores at most this are agreement.
        model_spec: recorded with each round.
        on_round: called with each round's record.
    """
    _check_args(top, half_window, rounds, tol)
    _check_profile(profile)
    prof = Profile.from_dict(profile.to_dict())
    gemms = model_gemms(model, tokens)
    records: list[dict[str, Any]] = []
    first: dict[str, Any] | None = None
    dis: dict[str, Any] = {}
    n_points = 0
    changed = False
    stopped = f"{rounds} round(s) done"
    for rnd in range(1, rounds + 1):
        meas = [float(measure_gemm(g.m, g.k, g.n)) for g in gemms]
        bad = [(g, x) for g, x in zip(gemms, meas, strict=True) if not (math.isfinite(x) and x > 0)]
        if bad:
            raise GacError(f"measuring GEMM {bad[0][0].label()} gave {bad[0][1]!r}")
        dis = disagreement(prof, gemms, meas)
        if first is None:
            first = dis
        over = sorted(
            (r for r in dis["rows"] if r["score"] > tol), key=lambda r: (-r["score"], r["gemm"].shape)
        )
        if not over:
            stopped = f"round {rnd}: every GEMM within tolerance {tol}"
            break
        targets = _pick_targets(prof, over, top, half_window)
        if not targets:
            stopped = (
                f"round {rnd}: nothing new to measure for the {len(over)} GEMM(s) above tolerance "
                f"(windows measured already, or every dim a multiple of {FASTEST_CLASS})"
            )
            break
        trial = Profile.from_dict(prof.to_dict())
        round_recs, n = _measure_targets(
            trial, targets, half_window, measure_point, {"model": model_spec, "tokens": tokens, "round": rnd}
        )
        n_points += n
        added_round = sum(len(rec["points_added"]) for rec in round_recs)
        after = disagreement(trial, gemms, meas)
        total_before = sum(r["score"] for r in dis["rows"])
        total_after = sum(r["score"] for r in after["rows"])
        rejected = total_after > total_before
        score_after = {id(r["gemm"]): r["score"] for r in after["rows"]}
        for rec, rows in zip(round_recs, targets.values(), strict=True):
            rec["gemms"] = _gemm_scores(rows, score_after)
            rec["total_score_before"] = round(total_before, 4)
            rec["total_score_after"] = round(total_after, 4)
            rec["rejected"] = rejected
            records.append(rec)
            if on_round is not None:
                on_round(rec)
        if rejected:
            # the new points explain the model's GEMMs worse (e.g. timing noise): keep the profile
            stopped = f"round {rnd}: rejected: the refined rules fit the model's GEMMs worse"
            break
        prof, dis = trial, after
        changed = changed or any(rec["points_added"] or rec["points_failed"] for rec in round_recs)
        if added_round == 0:
            stopped = f"round {rnd}: nothing new to measure"
            break
    assert first is not None
    if changed:
        _stamp(prof, records)
    return RefineResult(prof, gemms, first, dis, records, n_points, stopped)


# --------------------------------------------------------------------------- real measurements
def _timing_cfg(device: torch.device):
    if device.type == "cuda":
        c = Config.gpu()
        c.warmup_ms, c.rep_ms, c.min_reps = 10.0, 30.0, 10
    else:
        c = Config.cpu()
        c.warmup_ms, c.rep_ms, c.max_reps = 1.0, 3.0, 10
    return c


def real_measure_gemm(device: torch.device, dtype: torch.dtype) -> MeasureGemm:
    """``(m, k, n) -> ms`` of ``F.linear(x[m, k], w[n, k])`` timed with :func:`~gac.hardware.timing.bench`.

    Inputs rotate through enough sets to defeat the L2 cache (as ``gac bench`` does).
    """
    cfg = _timing_cfg(device)
    esize = torch.empty((), dtype=dtype).element_size()

    def f(m: int, k: int, n: int) -> float:
        sets = rotation_sets((m * k + n * k + m * n) * esize, device)
        xs = [
            (
                torch.randn(m, k, device=device, dtype=dtype) * 0.5,
                torch.randn(n, k, device=device, dtype=dtype) * 0.5,
            )
            for _ in range(sets)
        ]

        def fn(i: int) -> None:
            x, w = xs[i % sets]
            torch.nn.functional.linear(x, w)

        with torch.no_grad():
            t = bench(
                fn,
                device,
                warmup_ms=cfg.warmup_ms,
                rep_ms=cfg.rep_ms,
                min_reps=cfg.min_reps,
                max_reps=cfg.max_reps,
            )
        return t.median_ms

    return f


def context_config(profile: Profile, op: str, device: torch.device):
    """The :class:`~gac.hardware.sweeps.Config` whose ``op`` point matches the profile's context."""
    ctx = profile.ops[op].curve.get("context") or {}
    flops_fn(op, ctx)  # refuses a curve without its context
    c = _timing_cfg(device)
    if op == "gemm_n":
        c.m, c.k = int(ctx["M"]), int(ctx["K"])
    elif op == "gemm_k":
        c.m, c.n = int(ctx["M"]), int(ctx["N"])
    elif op == "gemv":
        c.gemv_k = int(ctx["K"])
    elif op == "sdpa_head_dim":
        c.batch, c.seq, c.heads = int(ctx["B"]), int(ctx["S"]), int(ctx["H"])
    else:
        c.lowrank_m, c.lowrank_d = int(ctx["M"]), int(ctx["d"])
    return c


def real_measure_point(profile: Profile, device: torch.device, dtype: torch.dtype) -> MeasurePoint:
    """``(op, dim) -> ms`` of one profile point at the profile's context (``gac profile``'s measurement)."""
    cfgs: dict[str, Any] = {}

    def f(op: str, d: int) -> float | None:
        if op not in cfgs:
            cfgs[op] = context_config(profile, op, device)
        p = op_point("profile", cfgs[op], op, d, "refine")
        res = measure_sweep_point(p, device, dtype, cfgs[op])
        return res.get("median_ms") if res.get("status") == "ok" else None

    return f


def check_device(profile: Profile, device: torch.device) -> None:
    """Refuse to mix measurements of another device into ``profile``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    want = str(profile.env.get("gpu", ""))
    if want and want != name:
        raise GacError(f"profile {profile.id!r} was measured on {want}; this device is {name}")


def load_refine_model(spec: str) -> nn.Module:
    """A model for :func:`model_gemms`: ``tiny:<family>`` (built in code) or anything ``load_model`` takes."""
    m = re.match(r"^tiny:([a-z0-9_]+)$", spec)
    if m:
        if m.group(1) not in FAMILIES + OTHER_FAMILIES:
            raise GacError(
                f"unknown tiny model family {m.group(1)!r}; known: {', '.join(FAMILIES + OTHER_FAMILIES)}"
            )
        return tiny_model(m.group(1))
    # a real model's shape (``shape:NAME``) needs no weights: build it on the meta device
    return load_model(spec, device="meta" if spec.startswith("shape:") else "cpu").model
