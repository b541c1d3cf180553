"""``gac profile --refine``: re-measure a profile around the dims where it mispredicts a model.

The prototype let LLM agents decide what to measure next. This is the deterministic counterpart:

1. list the distinct GEMMs of a model as gac's latency model prices them (every projection and the
   output head at ``tokens`` rows; a factorized layer is two GEMMs, ``x @ Bᵀ`` whose N is the rank,
   under ``lowrank_r``, then ``@ Aᵀ`` whose K is the rank);
2. measure each on this GPU and compare with :meth:`Profile.gemm_ms`. The profile's absolute peak
   is measured at other shapes, so a GEMM's *disagreement* is ``|log(r / median r)|`` with
   ``r = measured / predicted``: how far it sits from the model's common scale;
3. for the worst ``top`` GEMMs above ``tolerance``, take the dim that makes the GEMM irregular (the
   least-aligned of its N and K) and sweep the profile's own curve of that operator class at stride 1
   over ``dim ± half_window``, at the profile's context (its M, K, N...), as a new window;
4. re-distil the rule of every operator class that got points (modulus, class efficiencies, cliffs:
   :func:`gac.hardware.profiler.discover_rule`), re-score, and repeat for ``rounds``.

Every round is recorded in ``profile.env["refinements"]`` and the id gets a ``-refined`` suffix.
The measurements are injectable (``measure_gemm``, ``measure_point``) so the logic is tested
without a GPU; :func:`real_measures` gives the real ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from torch import nn

from gac.alignment import pow2_class
from gac.errors import GacError
from gac.hardware.profile import Profile

#: dims that are multiples of this are on every measured GPU's fastest path; a GEMM made only of
#: them that disagrees with the profile does so for its shape, not for a cliff.
FASTEST_CLASS = 64
MeasureGemm = Callable[[int, int, int], float | None]
MeasurePoint = Callable[[str, int], float | None]


@dataclass
class Gemm:
    """One distinct GEMM ``[m, k] @ [k, n]`` of a model, priced under operator class ``op``."""

    m: int
    k: int
    n: int
    op: str  # the class the latency model prices it under: gemm_n or lowrank_r
    fqns: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[int, int, int, str]:
        return (self.m, self.k, self.n, self.op)

    def responsible(self) -> tuple[str, int]:
        """The operator class and dim that make this GEMM irregular (its least-aligned dim)."""
        n_op = "gemv" if self.m == 1 else self.op
        cands = [(pow2_class(self.n), 0, n_op, self.n), (pow2_class(self.k), 1, "gemm_k", self.k)]
        _, _, op, d = min(cands)
        return op, d

    @property
    def near_cliff(self) -> bool:
        """Whether a dim of this GEMM is off the fastest alignment class (a multiple of 64 is not):
        only there can re-measuring a curve around it explain a disagreement."""
        return min(pow2_class(self.n), pow2_class(self.k)) < FASTEST_CLASS


def model_gemms(model: nn.Module, tokens: int) -> list[Gemm]:
    """The distinct GEMMs of ``model``'s projections and output head at ``tokens`` rows."""
    from gac.models.adapters import get_adapter, in_features, out_features
    from gac.surgery.factorized import FactorizedLinear

    ad = get_adapter(model)
    mods = [fqn for _, _, fqn in ad.all_projections()] + [ad.lm_head_fqn]
    out: dict[tuple[int, int, int, str], Gemm] = {}

    def add(m: int, k: int, n: int, op: str, fqn: str) -> None:
        g = out.setdefault((m, k, n, op), Gemm(m, k, n, op))
        g.fqns.append(fqn)

    for fqn in mods:
        mod = model.get_submodule(fqn)
        if isinstance(mod, FactorizedLinear):
            add(tokens, mod.in_features, mod.rank, "lowrank_r", fqn)
            add(tokens, mod.rank, mod.out_features, "gemm_n", fqn)
        else:
            add(tokens, in_features(mod), out_features(mod), "gemm_n", fqn)
    return list(out.values())


def score(profile: Profile, gemms: list[Gemm], measured: dict[tuple, float]) -> list[dict[str, Any]]:
    """Predicted vs measured per GEMM, with its disagreement (see the module docstring)."""
    rows = []
    for g in gemms:
        ms = measured.get(g.key)
        if ms is None:
            continue
        rows.append({"gemm": g, "predicted_ms": profile.gemm_ms(g.m, g.k, g.n, op=g.op), "measured_ms": ms})
    if not rows:
        return []
    scale = float(np.median([r["measured_ms"] / r["predicted_ms"] for r in rows]))
    for r in rows:
        r["ratio"] = r["measured_ms"] / r["predicted_ms"] / scale
        r["score"] = abs(math.log(r["ratio"]))
    return sorted(rows, key=lambda r: -r["score"])


def _flops(op: str, context: dict[str, Any], d: int) -> float | None:
    c = context
    try:
        if op == "gemm_n":
            return 2.0 * c["M"] * c["K"] * d
        if op == "gemm_k":
            return 2.0 * c["M"] * c["N"] * d
        if op == "gemv":
            return 2.0 * c["K"] * d
        if op == "lowrank_r":
            return 4.0 * c["M"] * c["d"] * d
        if op == "sdpa_head_dim":
            return 4.0 * c["B"] * c["H"] * c["S"] * c["S"] * d
    except KeyError:
        return None
    return None


def add_window(profile: Profile, op: str, points: dict[int, float]) -> None:
    """Append ``points`` (dim -> ms) to ``op``'s curve as a new window and re-distil its rule, in place."""
    from gac.hardware.profiler import Curve, discover_rule

    r = profile.ops[op]
    c = dict(r.curve)
    dims, ms = list(c.get("dims") or []), list(c.get("ms") or [])
    win = list(c.get("window") or [0] * len(dims))
    tf = list(c.get("tflops") or [None] * len(dims))
    iqr = list(c.get("iqr_ms") or [None] * len(dims))
    w = max(win, default=-1) + 1
    for d in sorted(points):
        dims.append(d)
        ms.append(points[d])
        win.append(w)
        f = _flops(op, c.get("context") or {}, d)
        tf.append(None if f is None else round(f / (points[d] * 1e-3) / 1e12, 3))
        iqr.append(None)
    la = int(c.get("lookahead", 64))
    rule = discover_rule(Curve(dims, ms, win), tolerance=r.tolerance, lookahead=la)
    order = sorted(range(len(dims)), key=lambda i: (win[i], dims[i]))
    c.update(
        dims=rule["dims"],
        ms=[round(x, 6) for x in rule["ms"]],
        window=rule["window"],
        tflops=[tf[i] for i in order],
        iqr_ms=[iqr[i] for i in order],
        efficiency=rule["efficiency"],
        rule_evidence=rule["rule_evidence"],
        windows=[*c.get("windows", []), [min(points), max(points)]],
        refined_windows=[*c.get("refined_windows", []), [min(points), max(points)]],
    )
    r.curve = c
    r.modulus, r.prefer = rule["modulus"], rule["prefer"]
    r.class_efficiency, r.cliffs = rule["class_efficiency"], rule["cliffs"]


def refine_profile(
    profile: Profile,
    model: nn.Module,
    measure_gemm: MeasureGemm,
    measure_point: MeasurePoint,
    *,
    tokens: int = 2048,
    top: int = 4,
    half_window: int = 8,
    rounds: int = 2,
    tolerance: float = 0.1,
    model_spec: str = "",
    on_progress: Callable[[str], None] | None = None,
) -> tuple[Profile, list[dict[str, Any]]]:
    """Refine a copy of ``profile`` against ``model`` (see the module docstring).

    Returns:
        The refined profile and one record per round (what was worst, what was measured, and the
        disagreement of those GEMMs before and after).
    """
    if not profile.measured:
        raise GacError(
            f"profile {profile.id!r} is not measured (the built-in default): refine a measured profile"
        )
    if top < 1 or half_window < 0 or rounds < 1 or not tolerance > 0:
        raise GacError("refine: top >= 1, half_window >= 0, rounds >= 1 and tolerance > 0 are required")
    prof = Profile.from_dict(profile.to_dict())
    gemms = model_gemms(model, tokens)
    measured: dict[tuple, float] = {}
    for g in gemms:
        ms = measure_gemm(g.m, g.k, g.n)
        if ms is not None:
            measured[g.key] = ms
        if on_progress:
            on_progress("gemm")
    if not measured:
        raise GacError("refine: no GEMM of the model could be measured")
    history: list[dict[str, Any]] = []
    for rnd in range(1, rounds + 1):
        rows = score(prof, gemms, measured)
        worst = [r for r in rows if r["score"] > tolerance and r["gemm"].near_cliff][:top]
        added: dict[str, dict[int, float]] = {}
        for r in worst:
            op, d = r["gemm"].responsible()
            if op not in prof.ops or not prof.ops[op].curve.get("dims"):
                continue
            have = set(prof.ops[op].curve["dims"]) | set(added.get(op, {}))
            for x in range(max(1, d - half_window), d + half_window + 1):
                if x in have:
                    continue
                ms = measure_point(op, x)
                if on_progress:
                    on_progress("point")
                if ms is not None:
                    added.setdefault(op, {})[x] = ms
        if not added:
            history.append({"round": rnd, "worst": [_row(r) for r in worst], "added": {}, "stopped": (
                "no GEMM near a cliff disagrees by more than the tolerance" if not worst
                else "nothing new to measure")})  # fmt: skip
            break
        trial = Profile.from_dict(prof.to_dict())
        for op, pts in added.items():
            add_window(trial, op, pts)
        new_rows = score(trial, gemms, measured)
        after = {r["gemm"].key: r for r in new_rows}
        rec = {
            "round": rnd,
            "worst": [{**_row(r), "score_after": round(after[r["gemm"].key]["score"], 4)} for r in worst],
            "added": {op: [min(p), max(p), len(p)] for op, p in added.items()},
            "total_score_before": round(sum(r["score"] for r in rows), 4),
            "total_score_after": round(sum(r["score"] for r in new_rows), 4),
        }
        if rec["total_score_after"] > rec["total_score_before"]:
            # the new points do not explain the model better: keep the profile, say why, stop
            rec["stopped"] = "rejected: the refined rules fit the model's GEMMs worse"
            history.append(rec)
            break
        prof = trial
        history.append(rec)
    final = score(prof, gemms, measured)
    prof.env = dict(prof.env)
    prof.env.setdefault("refinements", []).append({
        "model": model_spec, "tokens": tokens, "top": top, "half_window": half_window, "tolerance": tolerance,
        "rounds": history, "max_score_before": round(score(profile, gemms, measured)[0]["score"], 4),
        "max_score_after": round(final[0]["score"], 4) if final else None,
    })  # fmt: skip
    if any(
        h.get("added") and "rejected" not in h.get("stopped", "") for h in history
    ) and not prof.id.endswith("-refined"):
        prof.id = f"{prof.id}-refined"
        prof.label = f"{prof.label}, refined"
    return prof, history


def _row(r: dict[str, Any]) -> dict[str, Any]:
    g: Gemm = r["gemm"]
    op, d = g.responsible()
    return {"m": g.m, "k": g.k, "n": g.n, "op": g.op, "dim_op": op, "dim": d, "layers": len(g.fqns),
            "predicted_ms": round(r["predicted_ms"], 6), "measured_ms": round(r["measured_ms"], 6),
            "score": round(r["score"], 4)}  # fmt: skip


def real_measures(profile: Profile, device: Any, dtype: Any) -> tuple[MeasureGemm, MeasurePoint]:
    """Measurements on ``device``: the model's GEMMs, and points of the profile's curves at their context."""
    from gac.hardware.experiments import Config, _op_pt, _pt
    from gac.hardware.experiments import measure_point as measure

    base = Config.default_for(device)

    def gemm(m: int, k: int, n: int) -> float | None:
        res = measure(
            _pt("refine", "gemm", "model", "model", n, "linear", M=m, K=k, N=n), device, dtype, base
        )
        return res.get("median_ms") if res.get("status") == "ok" else None

    def point(op: str, d: int) -> float | None:
        ctx = profile.ops[op].curve.get("context") or {}
        cfg = Config.default_for(device)
        for key, attr in (("B", "batch"), ("S", "seq"), ("H", "heads")):
            if key in ctx:
                setattr(cfg, attr, int(ctx[key]))
        if op in ("gemm_n", "gemm_k"):
            cfg.m = int(ctx.get("M", cfg.m))
            cfg.k = int(ctx.get("K", cfg.k))
            cfg.n = int(ctx.get("N", cfg.n))
        elif op == "gemv":
            cfg.gemv_k = int(ctx.get("K", cfg.gemv_k))
        elif op == "lowrank_r":
            cfg.lowrank_m, cfg.lowrank_d = int(ctx.get("M", cfg.lowrank_m)), int(ctx.get("d", cfg.lowrank_d))
        res = measure(_op_pt("refine", cfg, op, d, "refine"), device, dtype, cfg)
        return res.get("median_ms") if res.get("status") == "ok" else None

    return gemm, point
