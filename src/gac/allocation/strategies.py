"""Allocation strategies: ``none``, ``round``, ``gac`` and ``gac-latency`` (pure numpy, no torch).

Every strategy starts from the compressor's native allocation (site name -> kept dim) and
returns an :class:`Allocation`: the dims it chose, what they cost against the budget, how many
are aligned under the hardware profile and the speedup that profile predicts.

* ``none``: the native allocation as is.
* ``round``: each dim to the nearest multiple of the profile's modulus (the naive fix); it
  may land over or under the budget, which the record reports.
* ``gac``: a multiple-choice knapsack (:func:`gac.allocation.knapsack.solve_mckp`). Candidates per
  site are the aligned dims near the native one that the profile marks fast
  (``profile.candidates``) plus "keep dense" (``d = site.max_dim``). The value is the
  compressor's loss curve ``loss(d)`` where it has one, else the published prototype's objective
  ``importance * (params(d) - params(d*))`` (negated, since the knapsack minimises). The budget
  is the native allocation's own total, so GAC never uses more parameters than ``none``.
  After the DP, a fill pass spends any leftover on the best affordable aligned up-steps, so at
  most one cost unit (the smallest aligned step of any site) stays unused.
* ``gac-latency``: the same knapsack with the profile's predicted latency as a second cost,
  handled by a Lagrange multiplier found by bisection: either the least quality loss whose
  predicted latency meets ``latency_target`` (a fraction of the sites' dense latency), or the
  lowest latency whose loss meets ``quality_target`` (default: the native allocation's loss).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gac.alignment import aligned_candidates, round_nearest
from gac.allocation.knapsack import DEFAULT_MAX_STATES, solve_mckp
from gac.errors import GacError
from gac.hardware.profile import Profile
from gac.sites import Site

STRATEGIES: tuple[str, ...] = ("none", "round", "gac", "gac-latency")
CANDIDATE_STEPS: tuple[str, ...] = ("modulus", "prefer")
#: Tokens per forward pass used by the latency model (a 1024-token prefill, as in the prototype).
DEFAULT_TOKENS = 1024


@dataclass
class SiteAllocation:
    """One site's dims and costs before (native) and after a strategy."""

    name: str
    op: str
    shape: list[int]
    max_dim: int
    native: int
    dim: int
    native_cost: int
    cost: int
    dense_cost: int
    aligned: bool
    dense: bool
    native_ms: float
    ms: float
    dense_ms: float


@dataclass
class Allocation:
    """The result of an allocation strategy.

    Attributes:
        strategy: ``none``, ``round``, ``gac`` or ``gac-latency``.
        profile_id: the hardware profile the dims were checked against.
        sites: per-site record (dims and costs before and after, predicted ms).
        budget: the parameter bound (the native allocation's total).
        cost: parameters of all sites after the strategy.
        native_cost: parameters of all sites under the native allocation.
        dense_cost: parameters of all sites uncompressed.
        cost_unit: the smallest aligned step of any compressed site (parameters); ``gac``
            leaves less than this unused.
        pct_aligned: % of compressed sites (``d < max_dim``) whose dim is aligned under the profile.
        pct_aligned_native: the same for the native allocation.
        predicted_ms / native_ms / dense_ms: summed predicted latency of the sites at ``tokens``.
        loss / native_loss: summed estimated quality loss (the knapsack's objective).
        solve_s: wall time of the strategy.
        notes: anything the user should know (quantized DP, unreachable targets...).
    """

    strategy: str
    profile_id: str
    sites: list[SiteAllocation]
    budget: int
    cost: int
    native_cost: int
    dense_cost: int
    cost_unit: int
    pct_aligned: float
    pct_aligned_native: float
    predicted_ms: float
    native_ms: float
    dense_ms: float
    loss: float
    native_loss: float
    tokens: int
    solve_s: float
    objective: str = "loss_curve"
    notes: list[str] = field(default_factory=list)

    @property
    def dims(self) -> dict[str, int]:
        return {s.name: s.dim for s in self.sites}

    @property
    def native_dims(self) -> dict[str, int]:
        return {s.name: s.native for s in self.sites}

    @property
    def budget_use(self) -> float:
        """Fraction of the budget used (> 1 means over budget, possible only for ``round``)."""
        return self.cost / self.budget if self.budget else math.nan

    @property
    def over_budget(self) -> int:
        """Parameters over (> 0) or under (< 0) the budget."""
        return self.cost - self.budget

    @property
    def predicted_speedup(self) -> float:
        """Predicted speedup of the sites over dense, from the profile."""
        return self.dense_ms / self.predicted_ms if self.predicted_ms > 0 else math.nan

    @property
    def predicted_speedup_vs_native(self) -> float:
        return self.native_ms / self.predicted_ms if self.predicted_ms > 0 else math.nan

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            budget_use=self.budget_use,
            over_budget=self.over_budget,
            predicted_speedup=self.predicted_speedup,
            predicted_speedup_vs_native=self.predicted_speedup_vs_native,
        )
        return d


# ---------------------------------------------------------------------------- latency model
def _peak_tflops(profile: Profile) -> float:
    peaks = [max(r.curve.get("tflops") or [0.0]) for r in profile.ops.values()]
    best = max(peaks, default=0.0)
    return best if best > 0 else 100.0


def site_ms(profile: Profile, site: Site, d: int, tokens: int = DEFAULT_TOKENS) -> float:
    """Predicted time (ms) of one site's matmuls at kept dim ``d`` for ``tokens`` rows.

    Dense (``d >= max_dim``) low-rank sites are one ``[tokens, in] @ [in, out]`` GEMM priced by
    :meth:`Profile.gemm_ms`. A compressed site does ``2 * tokens * cost(d)`` FLOPs at the
    profile's peak scaled by the efficiency of its kept dim under its operator class
    (``lowrank_r`` for a factorized pair).
    """
    if d >= site.max_dim and len(site.shape) == 2:
        out_f, in_f = site.shape
        return profile.gemm_ms(tokens, in_f, out_f)
    flops = 2.0 * tokens * site.cost(d)
    return flops / (_peak_tflops(profile) * 1e12 * profile.efficiency(site.op, d)) * 1e3


# ------------------------------------------------------------------------------- helpers
def _is_aligned(profile: Profile, site: Site, d: int) -> bool:
    return d >= site.max_dim or profile.is_aligned(site.op, d)


def _pct_aligned(profile: Profile, sites: list[Site], dims: dict[str, int]) -> float:
    comp = [s for s in sites if dims[s.name] < s.max_dim]
    if not comp:
        return 100.0
    return 100.0 * sum(profile.is_aligned(s.op, dims[s.name]) for s in comp) / len(comp)


def _loss_fn(site: Site, curve: np.ndarray | None, importance: float, native: int):
    """A vectorised loss(d) for one site (lower is better)."""
    if curve is not None:
        c = np.asarray(curve, dtype=np.float64)
        if c.ndim != 1 or c.shape[0] != site.max_dim + 1:
            raise GacError(
                f"loss curve of site {site.name} has shape {tuple(c.shape)}, expected ({site.max_dim + 1},)"
            )
        if not np.all(np.isfinite(c)):
            raise GacError(f"loss curve of site {site.name} has NaN or inf values")
        return lambda ds: c[np.minimum(np.asarray(ds), site.max_dim)]
    base = site.cost(native)
    imp = float(importance)
    # Prototype objective: maximise importance * (params(d) - params(d*)); we minimise its negation.
    return lambda ds: np.array(
        [-imp * (site.cost(int(d)) - base) for d in np.atleast_1d(ds)], dtype=np.float64
    )


def _candidates(profile: Profile, site: Site, native: int, window: int, step: str = "modulus") -> list[int]:
    hi = site.max_dim - 1
    d = min(native, site.max_dim)
    cands: set[int] = set()
    if step == "prefer":
        # Multiples of the modulus at which the profile measured the best throughput; a site too
        # small to hold any falls back to the (finer) modulus.
        m = profile.prefer(site.op)
        cands = set(aligned_candidates(d, m, lo=site.min_dim, hi=hi, window=window))
    if not cands:
        cands = set(profile.candidates(site.op, d, lo=site.min_dim, hi=hi, window=window))
    cands.add(site.max_dim)  # keep dense: leaves the original dims
    return sorted(cands)


def _validate(sites: list[Site], native: dict[str, int]) -> None:
    names = {s.name for s in sites}
    if len(names) != len(sites):
        raise GacError("duplicate site names in the allocation input")
    missing = names - set(native)
    if missing:
        raise GacError(
            f"the native allocation has no dim for {len(missing)} site(s), e.g. {sorted(missing)[0]}"
        )
    for s in sites:
        d = native[s.name]
        if not (s.min_dim <= d <= s.max_dim):
            raise GacError(f"native dim {d} of site {s.name} is outside [{s.min_dim}, {s.max_dim}]")


# ------------------------------------------------------------------------------- strategies
def allocate(
    strategy: str,
    sites: list[Site],
    native: dict[str, int],
    profile: Profile,
    curves: dict[str, np.ndarray | None] | None = None,
    importance: dict[str, float] | None = None,
    budget: int | None = None,
    tokens: int = DEFAULT_TOKENS,
    window: int = 4,
    candidates: str = "modulus",
    latency_target: float | None = None,
    quality_target: float | None = None,
    max_states: int = DEFAULT_MAX_STATES,
) -> Allocation:
    """Re-select the kept dims of ``sites`` according to ``strategy``.

    Args:
        strategy: one of :data:`STRATEGIES`.
        sites: the compressor's sites.
        native: the compressor's native allocation (site name -> kept dim).
        profile: the hardware profile that says which dims are aligned and fast.
        curves: per site, the compressor's loss curve (length ``max_dim + 1``) or None.
        importance: per site, the scalar importance used when a site has no curve (default 1).
        budget: parameter bound for ``gac``/``gac-latency`` (default and maximum: the native total).
        tokens: rows per forward pass for the latency model.
        window: aligned candidates on each side of the native dim.
        candidates: ``modulus`` (multiples of the profile's rule: finest aligned steps, best
            quality) or ``prefer`` (multiples of the modulus with the best measured throughput,
            e.g. 64 for low-rank pairs on the H200: coarser steps, faster kernels).
        latency_target: ``gac-latency`` only: predicted latency bound as a fraction of dense.
        quality_target: ``gac-latency`` only: loss bound (default: the native allocation's loss).
        max_states: DP width before the costs are quantized more coarsely.
    """
    t0 = time.perf_counter()
    if strategy not in STRATEGIES:
        raise GacError(f"unknown align strategy {strategy!r}; choose one of: {', '.join(STRATEGIES)}")
    _validate(sites, native)
    curves = curves or {}
    importance = importance or {}
    native_cost = sum(s.cost(native[s.name]) for s in sites)
    if budget is None:
        budget = native_cost
    budget = min(int(budget), native_cost) if strategy in ("gac", "gac-latency") else int(budget)
    loss = {
        s.name: _loss_fn(s, curves.get(s.name), importance.get(s.name, 1.0), native[s.name]) for s in sites
    }
    objective = (
        "loss_curve"
        if all(curves.get(s.name) is not None for s in sites)
        else ("importance_x_params" if not any(curves.get(s.name) is not None for s in sites) else "mixed")
    )
    notes: list[str] = []

    if strategy == "none":
        dims = dict(native)
    elif strategy == "round":
        dims = {}
        for s in sites:
            d = native[s.name]
            if d >= s.max_dim:
                dims[s.name] = s.max_dim
                continue
            r = max(round_nearest(d, profile.modulus(s.op)), s.min_dim)
            dims[s.name] = s.max_dim if r >= s.max_dim else r
    else:
        if candidates not in CANDIDATE_STEPS:
            raise GacError(
                f"unknown candidate step {candidates!r}; choose one of: {', '.join(CANDIDATE_STEPS)}"
            )
        cands = [_candidates(profile, s, native[s.name], window, candidates) for s in sites]
        costs = [np.array([s.cost(d) for d in c], dtype=np.int64) for s, c in zip(sites, cands, strict=True)]
        losses = [loss[s.name](np.array(c)) for s, c in zip(sites, cands, strict=True)]
        if strategy == "gac":
            sol = solve_mckp(costs, losses, budget, max_states=max_states)
            dims = {s.name: c[j] for s, c, j in zip(sites, cands, sol.choice, strict=True)}
            if not sol.exact:
                notes.append(
                    f"DP costs rounded up to units of {sol.unit:,} parameters ({sol.states:,} states)"
                )
            dims = _fill(sites, dims, loss, profile, budget, candidates)
        else:
            dims, note = _latency_knapsack(
                sites,
                cands,
                costs,
                losses,
                budget,
                profile,
                tokens,
                latency_target,
                quality_target,
                native,
                loss,
                max_states,
            )
            notes.extend(note)

    return _record(
        strategy,
        sites,
        native,
        dims,
        profile,
        budget,
        loss,
        tokens,
        time.perf_counter() - t0,
        objective,
        notes,
    )


def _fill(
    sites: list[Site], dims: dict[str, int], loss, profile: Profile, budget: int, step: str = "modulus"
) -> dict[str, int]:
    """Spend leftover budget on aligned up-steps (largest loss drop per parameter first).

    Loss curves are non-increasing, so an up-step never hurts quality; this closes the gap
    left by ties and by coarse DP quantization. With ``step="prefer"`` a site on the prefer grid
    stays on it (the leftover is then below one prefer step).
    """
    dims = dict(dims)
    used = sum(s.cost(dims[s.name]) for s in sites)
    while True:
        best, best_gain = None, -math.inf
        for s in sites:
            d = dims[s.name]
            if d >= s.max_dim:
                continue
            m = profile.modulus(s.op)
            if step == "prefer" and d % profile.prefer(s.op) == 0:
                m = profile.prefer(s.op)
            nxt = (d // m + 1) * m
            if nxt >= s.max_dim:
                nxt = s.max_dim
            extra = s.cost(nxt) - s.cost(d)
            if extra <= 0 or used + extra > budget:
                continue
            drop = float(loss[s.name](np.array([d]))[0] - loss[s.name](np.array([nxt]))[0])
            gain = drop / extra
            if gain > best_gain:
                best, best_gain = (s, nxt, extra), gain
        if best is None:
            return dims
        s, nxt, extra = best
        dims[s.name] = nxt
        used += extra


def _latency_knapsack(
    sites,
    cands,
    costs,
    losses,
    budget,
    profile,
    tokens,
    latency_target,
    quality_target,
    native,
    loss,
    max_states,
) -> tuple[dict[str, int], list[str]]:
    """Bisection on a Lagrange multiplier that trades latency against loss."""
    lat = [np.array([site_ms(profile, s, d, tokens) for d in c]) for s, c in zip(sites, cands, strict=True)]
    dense_ms = sum(site_ms(profile, s, s.max_dim, tokens) for s in sites)
    notes: list[str] = []

    def solve(w_loss: float, w_lat: float):
        vals = [w_loss * lo + w_lat * la for lo, la in zip(losses, lat, strict=True)]
        sol = solve_mckp(costs, vals, budget, max_states=max_states)
        tot_loss = float(sum(lo[j] for lo, j in zip(losses, sol.choice, strict=True)))
        tot_lat = float(sum(la[j] for la, j in zip(lat, sol.choice, strict=True)))
        return sol.choice, tot_loss, tot_lat

    loss_scale = max(sum(float(np.max(np.abs(lo))) for lo in losses), 1e-30)
    lat_scale = max(dense_ms, 1e-30)

    if latency_target is not None:
        if not (latency_target > 0):
            raise GacError(
                f"latency target must be a positive fraction of dense latency, got {latency_target}"
            )
        target = latency_target * dense_ms
        # minimise loss/loss_scale + lam * lat/lat_scale; larger lam -> faster.
        best = solve(1.0 / loss_scale, 1e9 / lat_scale)
        if best[2] > target:
            notes.append(
                f"latency target {latency_target:.3f} x dense unreachable; returning the fastest allocation"
            )
            choice = best[0]
        else:
            lo_l, hi_l = -12.0, 9.0
            choice = best[0]
            for _ in range(40):
                mid = (lo_l + hi_l) / 2
                ch, _, t = solve(1.0 / loss_scale, 10**mid / lat_scale)
                if t <= target:
                    hi_l, choice = mid, ch
                else:
                    lo_l = mid
                if hi_l - lo_l < 1e-3:
                    break
        notes.append(f"gac-latency: least loss with predicted latency <= {latency_target:.3f} x dense")
    else:
        if quality_target is None:
            quality_target = float(sum(loss[s.name](np.array([native[s.name]]))[0] for s in sites))
            what = "the native allocation's loss"
        else:
            what = f"loss {quality_target:.6g}"
        tol = 1e-9 * loss_scale
        # minimise lat/lat_scale + mu * loss/loss_scale; larger mu -> better quality.
        best = solve(1e9 / loss_scale, 1.0 / lat_scale)
        if best[1] > quality_target + tol:
            notes.append(f"quality target ({what}) unreachable; returning the least-loss allocation")
            choice = best[0]
        else:
            lo_m, hi_m = -12.0, 9.0
            choice = best[0]
            for _ in range(40):
                mid = (lo_m + hi_m) / 2
                ch, q, _ = solve(10**mid / loss_scale, 1.0 / lat_scale)
                if q <= quality_target + tol:
                    hi_m, choice = mid, ch
                else:
                    lo_m = mid
                if hi_m - lo_m < 1e-3:
                    break
        notes.append(f"gac-latency: lowest predicted latency with loss <= {what}")
    return {s.name: c[j] for s, c, j in zip(sites, cands, choice, strict=True)}, notes


def _record(
    strategy, sites, native, dims, profile, budget, loss, tokens, solve_s, objective, notes
) -> Allocation:
    rows = []
    for s in sites:
        d, dn = int(dims[s.name]), int(native[s.name])
        rows.append(
            SiteAllocation(
                name=s.name,
                op=s.op,
                shape=list(s.shape),
                max_dim=s.max_dim,
                native=dn,
                dim=d,
                native_cost=s.cost(dn),
                cost=s.cost(d),
                dense_cost=s.dense_cost,
                aligned=_is_aligned(profile, s, d),
                dense=d >= s.max_dim,
                native_ms=site_ms(profile, s, dn, tokens),
                ms=site_ms(profile, s, d, tokens),
                dense_ms=site_ms(profile, s, s.max_dim, tokens),
            )
        )
    comp = [s for s in sites if dims[s.name] < s.max_dim]
    unit = min((s.unit_cost * profile.modulus(s.op) for s in comp), default=0)
    return Allocation(
        strategy=strategy,
        profile_id=profile.id,
        sites=rows,
        budget=int(budget),
        cost=sum(r.cost for r in rows),
        native_cost=sum(r.native_cost for r in rows),
        dense_cost=sum(r.dense_cost for r in rows),
        cost_unit=int(unit),
        pct_aligned=_pct_aligned(profile, sites, dims),
        pct_aligned_native=_pct_aligned(profile, sites, native),
        predicted_ms=sum(r.ms for r in rows),
        native_ms=sum(r.native_ms for r in rows),
        dense_ms=sum(r.dense_ms for r in rows),
        loss=float(sum(loss[s.name](np.array([dims[s.name]]))[0] for s in sites)),
        native_loss=float(sum(loss[s.name](np.array([native[s.name]]))[0] for s in sites)),
        tokens=tokens,
        solve_s=solve_s,
        objective=objective,
        notes=notes,
    )
