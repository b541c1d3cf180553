"""Allocation strategies: ``none``, ``round``, ``knapsack``, ``gac`` and ``gac-latency`` (pure numpy).

Every strategy starts from the compressor's native allocation (site name -> kept dim) and
returns an :class:`Allocation`: the dims it chose, what they cost against the budget, how many
are aligned under the hardware profile and the speedup that profile predicts.

* ``none``: the native allocation as is.
* ``round``: each dim to the nearest multiple of the profile's modulus (the naive fix), or of
  the compressor's own reference rounding where a site names one (``Site.meta["round_multiple"]``:
  PaLU's 32, half to even); it may land over or under the budget, which the record reports.
* ``gac``: a multiple-choice knapsack (:func:`gac.allocation.knapsack.solve_mckp`). Candidates per
  site are the aligned dims (multiples of the profile's modulus for the site's operator class; for
  PaLU's rebuilt keys also of the decode kernel's rank tile where the profile's latent class shows it,
  :func:`gac.hardware.latency.site_modulus`) inside the site's *window* around the native dim
  (:func:`candidate_range`). The budget is the native allocation's own total, so GAC never uses more
  parameters than ``none``. After the DP,
  a fill pass spends any leftover on the best affordable aligned up-steps, so at most one cost
  unit (the smallest aligned step of any site) stays unused.
* ``knapsack``: the unaligned control: the same knapsack, objective, window and fill pass as
  ``gac`` but with every integer dim of the window as a candidate (modulus 1); for PaLU's rebuilt
  keys on the kernel's rank tile, the window of their projection's modulus (:func:`_candidates`). ``gac`` vs
  ``knapsack`` is what alignment costs; ``knapsack`` vs ``none`` is what re-allocation does.

The knapsack's value (``objective``, minimised):

* ``paper`` (default): the GAC paper's first-order value, ``-sensitivity x (params(d) - params(d*))``
  with ``d*`` the native dim: parameters move from insensitive to sensitive sites, within the
  window only. A site's sensitivity is the slope (loss per parameter) of the compressor's loss
  curve across the window, so the value is that curve's linearisation at the native dim; a site
  without a curve uses the compressor's scalar ``importance``. Candidates: the window (plus the
  dense dim only where the window reaches it).
* ``curve``: the compressor's whole loss curve ``loss(d)`` as the value, with "keep dense"
  (``d = site.max_dim``) as an extra candidate. It trusts the curve's values across sites;
  ``benchmarks/tools/quality_smollm2.py`` measures where that holds (docs/allocation.md).
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

from gac.alignment import round_down, round_nearest, round_up
from gac.allocation.knapsack import DEFAULT_MAX_STATES, solve_mckp
from gac.errors import GacError
from gac.hardware.latency import RAW_KEY_SHARE, Point, latent_rank, site_cache_ms, site_modulus
from gac.hardware.profile import Profile
from gac.sites import Site

STRATEGIES: tuple[str, ...] = ("none", "round", "knapsack", "gac", "gac-latency")
#: Strategies that re-select dims with the knapsack (and so use objective, window and curves).
KNAPSACK_STRATEGIES: tuple[str, ...] = ("knapsack", "gac", "gac-latency")
CANDIDATE_STEPS: tuple[str, ...] = ("modulus", "prefer")
OBJECTIVES: tuple[str, ...] = ("paper", "curve")
#: Default window: one modulus step on each side of the native dim (the aligned dims next to it).
DEFAULT_WINDOW = 1.0
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
    #: weight parameters at ``dim`` (``cost`` unless the budget counts something else, e.g. PaLU)
    params: int | None = None


@dataclass
class Allocation:
    """The result of an allocation strategy.

    Attributes:
        strategy: one of :data:`STRATEGIES`.
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
        loss / native_loss: summed loss-curve value of the chosen / native dims (the compressor's
            own estimate, whatever the knapsack's objective).
        objective: ``native`` (``none``/``round``) or ``OBJECTIVE:SOURCE`` for the knapsack
            strategies (``paper:loss_curve``, ``curve:loss_curve``, ``paper:importance``...).
        window: the candidate window the knapsack strategies used.
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
    window: float = DEFAULT_WINDOW
    #: per serving shape: ``point``, ``tokens``, predicted ``dense_ms``, ``ms`` and ``speedup``
    #: (:func:`serve_prediction`); empty without serving shapes.
    serve: list[dict[str, Any]] = field(default_factory=list)
    #: the latency guard: ``guarded``, ``allow_slower``, ``slower`` (shapes predicted slower).
    guard: dict[str, Any] | None = None

    @property
    def worst_serve_speedup(self) -> float:
        """The least predicted speedup over dense across the serving shapes (nan without any)."""
        return min((r["speedup"] for r in self.serve), default=math.nan)

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
            worst_serve_speedup=self.worst_serve_speedup,
        )
        return d


# ---------------------------------------------------------------------------- latency model
def one_gemm_site(site: Site, d: int, tokens: int) -> bool:
    """Whether a site of grouped up-projections (``meta["one_gemm"]``: ``max_macs``, ``groups``, ``width``) rebuilds
    ``tokens`` rows in one block-diagonal GEMM at kept dim ``d``: :func:`gac.nn.latent.one_gemm`'s rule with every
    group of the projection at ``d`` (the allocator prices one site at a time).

    >>> s = Site("k:g0", "lowrank_r", 256, 1, 256, meta={"one_gemm": {"max_macs": 1 << 29, "groups": 4, "width": 256}})
    >>> one_gemm_site(s, 128, 128), one_gemm_site(s, 128, 16384)
    (True, False)
    """
    og = site.meta.get("one_gemm")
    return bool(og) and og["groups"] > 1 and tokens * og["groups"] * d * og["width"] <= og["max_macs"]


def site_ms(profile: Profile, site: Site, d: int, tokens: int = DEFAULT_TOKENS, kv: int = 0) -> float:
    """Predicted time (ms) of one site's matmuls at kept dim ``d`` for ``tokens`` rows.

    ``launches x launch_us + max(FLOP time, bytes / copy_gbps)`` (the launch constants of the
    profile, :mod:`gac.hardware.latency`; documented defaults where it has none):

    * FLOP time: a dense (``d >= max_dim``) low-rank site is one ``[tokens, in] @ [in, out]`` GEMM
      priced by :meth:`Profile.gemm_ms`; any other site does ``2 * tokens * cost(d)`` FLOPs at the
      profile's peak scaled by the efficiency of its kept dim under its operator class
      (``lowrank_r`` for a factorized pair). A site whose cost is not parameters (PaLU's latent
      cache dims) names its weight parameters per kept dim in ``meta["flops_per_dim"]``.
    * bytes: the weights (2 bytes per parameter) plus the activations in and out (and the rank-``d``
      intermediate of a factorized pair).
    * launches: one GEMM per member weight (``site.members``), two for a factorized low-rank site;
      a site whose module runs otherwise declares its count in ``meta["gemm_launches"]``
      (``{"dense", "prefill", "decode"}``: kept dense, compressed at a prefill, compressed at a decode
      step; PaLU's groups share their projection's GEMM and rebuild keys inside the decode kernel; and
      ``"prefill_one_gemm"``, a prompt of few rows whose groups rebuild in one block-diagonal GEMM,
      :func:`one_gemm_site`, whose up-projection does ``groups`` times its work, plus the site's share of the
      kernel that builds that weight at the profile's ``aux_us``).
      Where the profile knows a fused low-rank kernel at ``tokens`` rows (``Profile.fused_lowrank``:
      both factors in one launch, its own fixed time and bandwidth), a factorized site costs the
      cheaper of the two, as the inference path's dispatch picks the faster.

    ``tokens`` is the rows of every GEMM: the prompt tokens of a prefill, or the batch of a decode
    step (``tokens=1``: one sequence), where the bytes and the launches dominate and a factorized
    site pays its second launch (or the fused kernel's one).

    ``kv`` (a decode step's cached tokens; 0 at prefill): a site whose kept dims are cached per
    token (PaLU's key and value groups) also pays its share of the attention's cache read and, for
    keys, their rebuild (:func:`gac.hardware.latency.site_cache_ms`: the profile's
    ``latent_attention`` class, else its roofline).
    """
    elem = 2
    members = max(len(site.members), 1)
    per_dim = site.meta.get("flops_per_dim")  # sites whose cost is not parameters (PaLU: cache dims)
    two_d = len(site.shape) == 2
    act = tokens * (site.shape[0] + site.shape[1]) * members if two_d else 0
    if d >= site.max_dim and two_d and site.op == "lowrank_r":
        out_f, in_f = site.shape
        flop_ms = profile.gemm_ms(tokens, in_f, out_f)
        nbytes, launches, fused = (out_f * in_f + act) * elem, members, None
    else:
        params = d * per_dim if per_dim else site.cost(d)
        flop_ms = (
            2.0 * tokens * params / (profile.peak_tflops() * 1e12 * profile.efficiency(site.op, d)) * 1e3
        )
        factorized = site.op == "lowrank_r" and d < site.max_dim
        nbytes = (params + act + (2 * tokens * d * members if factorized else 0)) * elem
        launches = members * (2 if factorized else 1)
        fused = profile.fused_lowrank_at(tokens) if factorized else None
    declared = site.meta.get("gemm_launches")  # the compressor's count, where its module runs otherwise
    aux_ms = 0.0
    if declared is not None:
        phase = "dense" if d >= site.max_dim else ("decode" if kv > 0 else "prefill")
        if phase == "prefill" and "prefill_one_gemm" in declared and one_gemm_site(site, d, tokens):
            phase = "prefill_one_gemm"
            # the block-diagonal GEMM's zeros (the up-projection's work, groups - 1 times), and the site's share of
            # the kernel that builds that weight (a non-GEMM launch)
            og = site.meta["one_gemm"]
            zeros = 2.0 * tokens * d * og["width"] * (og["groups"] - 1)
            flop_ms += zeros / (profile.peak_tflops() * 1e12 * profile.efficiency(site.op, d)) * 1e3
            aux_ms = profile.aux_us_or_default * 1e-3 / og["groups"]
        launches, fused = float(declared[phase]), None
    byte_ms = nbytes / (profile.copy_gbps_or_default * 1e9) * 1e3
    ms = launches * profile.launch_us_or_default * 1e-3 + aux_ms + max(flop_ms, byte_ms)
    if fused is not None:  # one fused launch per member, where that beats two launches
        ms = min(ms, members * fused[0] * 1e-3 + max(flop_ms, nbytes / (fused[1] * 1e9) * 1e3))
    return ms + site_cache_ms(profile, site, d, tokens, kv)


# --------------------------------------------------------------------------- latency guard
#: a serving shape counts as slower than dense when its predicted speedup is below ``1 - SLOWER_TOL``
SLOWER_TOL = 1e-9
#: The guard's margin where the profile records none (``latency_fit.guard_margin``) and none is given:
#: the latency model's worst optimistic error measured on any committed speed grid, rounded up
#: (H100, prefill B1x512: predicted 1.052x against 0.978x measured, 7.6%; docs/allocation.md).
DEFAULT_GUARD_MARGIN = 0.08


def check_margin(margin: Any) -> float:
    """A guard margin: a number in ``[0, 1)`` (the fraction by which the predicted speedup must clear 1).

    >>> check_margin(0.05), check_margin(0)
    (0.05, 0.0)
    >>> check_margin(1.0)
    Traceback (most recent call last):
    ...
    gac.errors.GacError: guard margin must be a number in [0, 1) (e.g. 0.05: predicted >= 1.05x dense), got 1.0
    """
    ok = isinstance(margin, (int, float)) and not isinstance(margin, bool)
    if not ok or not math.isfinite(margin) or not 0.0 <= float(margin) < 1.0:
        raise GacError(
            f"guard margin must be a number in [0, 1) (e.g. 0.05: predicted >= 1.05x dense), got {margin!r}"
        )
    return float(margin)


def resolve_margin(profile: Profile, margin: float | None = None) -> tuple[float, str]:
    """The guard's margin and where it comes from: ``margin`` if given, else the profile's measured one
    (``latency_fit["guard_margin"]``: ``{"value", "source", ...}``), else :data:`DEFAULT_GUARD_MARGIN`."""
    if margin is not None:
        return check_margin(margin), "given"
    rec = (profile.latency_fit or {}).get("guard_margin")
    if isinstance(rec, dict) and "value" in rec:
        try:
            return check_margin(
                rec["value"]
            ), f"profile {profile.id}: {rec.get('source', 'no source recorded')}"
        except GacError as e:
            raise GacError(f"profile {profile.id!r}: latency_fit.guard_margin: {e}") from None
    return DEFAULT_GUARD_MARGIN, "default (gac.allocation.DEFAULT_GUARD_MARGIN)"


class GuardInfeasible(GacError):
    """No allocation meets both the budget and the latency guard (see :func:`guarded_knapsack`).

    Attributes:
        shapes: the serving shape keys that cannot be met, with the best predicted speedup there.
    """

    def __init__(self, message: str, shapes: dict[str, float]):
        super().__init__(message)
        self.shapes = shapes


def _shape_deltas(
    sites: list[Site], cands: list[list[int]], profile: Profile, serve: list[Point]
) -> dict[str, list[dict[int, float]]]:
    """Per site, per serving shape: each candidate's predicted ms minus the dense site's."""
    out: dict[str, list[dict[int, float]]] = {}
    for s, c in zip(sites, cands, strict=True):
        rows = []
        for p in serve:
            dense = site_ms(profile, s, s.max_dim, p.tokens, p.kv)
            rows.append({int(d): site_ms(profile, s, int(d), p.tokens, p.kv) - dense for d in c})
        out[s.name] = rows
    return out


def _shapes_line(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['point']} ({r['speedup']:.3f}x)" for r in rows)


def serve_prediction(
    sites: list[Site],
    dims: dict[str, int],
    profile: Profile,
    serve: list[Point],
    other_ms: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    """Predicted ms of dense and of ``dims`` at each serving shape, and the speedup.

    The sites are priced by :func:`site_ms`; ``other_ms`` (per shape key: the dense model's
    launches outside the sites, which the sites' dims do not change) is added to both sides, so
    the speedup is the whole model's; without it, the sites' own.
    """
    out = []
    for p in serve:
        dense = sum(site_ms(profile, s, s.max_dim, p.tokens, p.kv) for s in sites)
        ms = sum(site_ms(profile, s, dims[s.name], p.tokens, p.kv) for s in sites)
        base = float((other_ms or {}).get(p.key, 0.0))
        out.append({
            "point": p.key, "tokens": p.tokens, "dense_ms": base + dense, "ms": base + ms,
            "speedup": (base + dense) / (base + ms) if base + ms > 0 else math.nan,
            "whole_model": other_ms is not None and p.key in other_ms,
        })  # fmt: skip
    return out


def guarded_knapsack(
    sites: list[Site],
    cands: list[list[int]],
    costs: list[np.ndarray],
    losses: list[np.ndarray],
    budget: int,
    profile: Profile,
    serve: list[Point],
    max_states: int = DEFAULT_MAX_STATES,
    other_ms: dict[str, float] | None = None,
    margin: float = 0.0,
) -> tuple[dict[str, int], list[str]]:
    """The least-loss allocation within ``budget`` predicted at least ``1 + margin`` x dense at every shape.

    The sites' summed predicted ms (:func:`site_ms`, one fixed launch cost per GEMM) minus the
    dense sites' at each serving shape must be ``<= 0``: the launches outside the sites are the
    same for both, so that is the whole model ``>= 1.00x`` dense. One knapsack per shape constraint
    would multiply the DP; instead the constraints enter the value with Lagrange multipliers
    (as ``gac-latency``'s one): ``loss + sum_k mu_k * excess_k`` with ``excess_k`` a candidate's ms over
    its dense site, relative to the dense sites' ms at shape ``k``. Multipliers grow on the shapes
    the solution still violates until one satisfies them all (the fastest feasible); a bisection on
    their common scale then finds the least loss that stays feasible. Every returned allocation is
    checked against every shape; the multipliers may miss a feasible allocation of slightly lower
    loss, never return an infeasible one.

    ``margin`` (:func:`resolve_margin`: the latency model's measured error on this GPU) asks for
    ``(other + dense) / (other + ms) >= 1 + margin`` at each shape (the whole model's where ``other_ms``
    gives the rest of the dense model, else the sites'): the sites' ms over dense must then be at most
    ``-margin / (1 + margin) x (other + dense)``.

    Raises:
        GuardInfeasible: no allocation found within the budget meets every shape; the message
            names the shapes that cannot be met and the best predicted speedup there (the whole
            model's where ``other_ms`` gives the dense model's ms outside the sites).
    """
    k_n = len(serve)
    dense_k = np.array([sum(site_ms(profile, s, s.max_dim, p.tokens, p.kv) for s in sites) for p in serve])
    limit = _limits(dense_k, serve, other_ms, margin) / dense_k  # allowed excess, relative to dense_k
    deltas = _shape_deltas(sites, cands, profile, serve)
    rel = [
        np.array([[row[int(d)] for d in c] for row in deltas[s.name]]) / dense_k[:, None]
        for s, c in zip(sites, cands, strict=True)
    ]
    loss_scale = max(sum(float(np.max(np.abs(lo))) for lo in losses), 1e-30)
    tol = 1e-12
    coarse = min(max_states, 20_000)  # the multiplier search; the final solve at full resolution

    def solve(mu: np.ndarray, states: int = coarse) -> tuple[list[int], np.ndarray]:
        vals = [lo / loss_scale + mu @ r for lo, r in zip(losses, rel, strict=True)]
        choice = solve_mckp(costs, vals, budget, max_states=states).choice
        return choice, np.sum([r[:, j] for r, j in zip(rel, choice, strict=True)], axis=0) - limit

    def dims_of(choice: list[int]) -> dict[str, int]:
        return {s.name: int(c[j]) for s, c, j in zip(sites, cands, choice, strict=True)}

    choice, over = solve(np.zeros(k_n), max_states)
    if np.all(over <= tol):
        return dims_of(choice), [
            f"latency guard: the least-loss allocation is predicted at least {1 + margin:.3f}x dense at every shape"
        ]
    big = 1e4
    w = (over > tol).astype(np.float64)
    found = None
    for _ in range(4 * k_n):
        choice, over = solve(big * w)
        viol = over > tol
        if not viol.any():
            found = choice
            break
        w = w / w.max() + viol  # more weight where it is still slower
    if found is None:
        # the shapes no allocation meets on their own; else the ones the joint search left slower
        def speedup(k: int, o: float) -> float:
            base = float((other_ms or {}).get(serve[k].key, 0.0))
            return (base + dense_k[k]) / (base + dense_k[k] * (1.0 + o + limit[k]))

        alone = {}
        for k in range(k_n):
            _, o = solve(big * np.eye(k_n)[k])
            if o[k] > tol:
                alone[serve[k].key] = float(speedup(k, o[k]))
        if not alone:
            alone = {serve[k].key: float(speedup(k, over[k])) for k in range(k_n) if over[k] > tol}
        shapes = ", ".join(f"{k} (at best {v:.3f}x)" for k, v in alone.items())
        need = "without a slowdown" if margin <= 0 else f"at {1 + margin:.3f}x dense (the guard's margin)"
        raise GuardInfeasible(
            f"the budget of {int(budget):,} parameters cannot be met {need} at {shapes}", alone
        )

    def feasible(e: float) -> tuple[list[int], bool]:
        ch, o = solve(10**e * w)
        return ch, bool(np.all(o <= tol))

    hi, best = _bisect(feasible, found, -6.0, math.log10(big), steps=24, width=0.05)
    fine, o = solve(10**hi * w, max_states)
    if np.all(o <= tol):
        best = fine
    kept = sum(c[j] >= s.max_dim for s, c, j in zip(sites, cands, best, strict=True))
    return dims_of(best), [
        f"latency guard: {kept} of {len(sites)} sites kept dense so that every serving shape is predicted "
        f"at least {1 + margin:.3f}x dense"
    ]


def _limits(
    dense_k: np.ndarray, serve: list[Point], other_ms: dict[str, float] | None, margin: float
) -> np.ndarray:
    """Per shape, the most the sites' predicted ms may exceed the dense sites' (``<= 0``): 0 without a
    margin, else ``-margin / (1 + margin) x`` the dense model's ms there (the sites' without ``other_ms``)."""
    base = np.array([float((other_ms or {}).get(p.key, 0.0)) for p in serve])
    return -margin / (1.0 + margin) * (base + dense_k)


# ------------------------------------------------------------------------------- helpers
def _is_aligned(profile: Profile, site: Site, d: int) -> bool:
    return d >= site.max_dim or d % site_modulus(profile, site) == 0


def _pct_aligned(profile: Profile, sites: list[Site], dims: dict[str, int]) -> float:
    comp = [s for s in sites if dims[s.name] < s.max_dim]
    if not comp:
        return 100.0
    return 100.0 * sum(_is_aligned(profile, s, dims[s.name]) for s in comp) / len(comp)


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


def check_window(window: float) -> float:
    """Validate a window: an integer >= 1 (modulus steps) or a fraction in (0, 1) of the native dim."""
    w = float(window)
    if not math.isfinite(w) or w <= 0 or (w >= 1 and w != int(w)):
        raise GacError(
            f"window must be a whole number of modulus steps (>= 1) or a fraction in (0, 1) of the "
            f"native dim, got {window}"
        )
    return w


def candidate_range(site: Site, native: int, m: int, window: float = DEFAULT_WINDOW) -> tuple[int, int]:
    """The dims ``[lo, hi]`` a re-selection may pick for ``site`` (``hi < site.max_dim``).

    ``window >= 1``: ``d* ± window · m`` (``m`` the site's modulus); the default 1 keeps ``gac`` to
    the aligned dims next to the native one, the GAC paper's candidates. ``0 < window < 1``:
    ``d* ± window · d*`` (at least ±1). The range is centred on the native dim, not on an aligned
    dim, so the unaligned ``knapsack`` control can land anywhere in it.

    >>> from gac.sites import Site
    >>> s = Site("x", "lowrank_r", max_dim=64, unit_cost=128, dense_cost=8192)
    >>> candidate_range(s, 37, 8), candidate_range(s, 37, 8, window=4), candidate_range(s, 40, 8, 0.1)
    ((29, 45), (5, 63), (36, 44))
    """
    d = min(int(native), site.max_dim)
    w = check_window(window)
    half = int(w) * m if w >= 1 else max(1, int(w * d + 0.5))  # round half up
    return max(d - half, site.min_dim, 1), min(d + half, site.max_dim - 1)


def _candidates(
    profile: Profile,
    site: Site,
    native: int,
    window: float = DEFAULT_WINDOW,
    step: str = "modulus",
    aligned: bool = True,
    keep_dense: bool = True,
) -> list[int]:
    """Candidate dims of one site: aligned dims (or, ``aligned=False``, every dim) in its window.

    The window (:func:`candidate_range`) steps by the site's modulus (:func:`gac.hardware.latency.site_modulus`)
    for the aligned strategies, and by its operator class's (:meth:`Profile.modulus`) for the unaligned control.
    The two differ only for PaLU's rebuilt keys on a profile whose latent class puts them on the kernel's rank
    tile: there the control keeps the projection's window, because every integer rank within a tile of the
    native one let the linear ``paper`` objective drive key ranks to their extremes (1 to 192 of 192:
    perplexity 397 on SmolLM2 at KV 0.5 against 35 with the projection's window).
    """
    d = min(native, site.max_dim)
    m = site_modulus(profile, site)
    w = m if aligned else profile.modulus(site.op)
    if step == "prefer" and aligned:
        # Multiples of the modulus at which the profile measured the best throughput; a site too
        # small to hold any falls back to the (finer) modulus.
        mp = profile.prefer(site.op)
        lo, hi = candidate_range(site, d, mp, window)
        cands = {c for c in range(round_up(lo, mp), hi + 1, mp)}
        if cands:
            m = w = mp
    lo, hi = candidate_range(site, d, w, window)
    if not aligned:
        cands = set(range(lo, hi + 1))
    elif not (step == "prefer" and cands):
        cands = set(range(round_up(lo, m), hi + 1, m))
        if not cands:  # a narrow fractional window between two multiples: the two around d*
            cands = {c for c in (round_down(d, m), round_up(d, m)) if site.min_dim <= c < site.max_dim}
    if d >= site.max_dim or keep_dense or hi >= site.max_dim - 1 or not cands:
        cands.add(site.max_dim)  # keep dense: leaves the original dims
    if site.meta.get("rebuild_flops_per_dim_per_cached_token"):
        cands = raw_key_candidates(profile, site, cands)
    cap = site.meta.get("rank_max")  # a compressor's own bound (PaLU's key_rank_max / value_rank_max)
    if cap is not None and cap < site.max_dim:
        kept = {c for c in cands if c <= cap or c >= site.max_dim}
        top = round_down(int(cap), m) if aligned else int(cap)
        if kept != cands and top >= max(site.min_dim, 1):
            kept.add(top)
        cands = kept
    return sorted(cands)


def raw_key_candidates(profile: Profile, site: Site, cands: set[int]) -> set[int]:
    """``cands`` of a rebuilt-key site (PaLU's key groups) without the ranks the latent kernel is not known to
    run well, the full width (keys cached raw) added in their place:

    * the ranks past :data:`RAW_KEY_SHARE` of its width predicted slower than the keys cached raw. At full width
      the group's keys are cached as they are (the identity up-projection: nothing is rebuilt,
      :func:`gac.nn.latent.raw_key_groups`). A rank ``d`` rebuilds ``2 · G·hd · d`` FLOPs per cached token where
      the raw keys read ``2 · G·hd`` bytes, so past ``d* ≈ FLOP/s ÷ bytes/s`` of the latent attention class
      (:func:`gac.hardware.latency.site_cache_ms`: about 81 at key group 4 on the shipped H100 profile) a latent
      is slower to attend than the raw keys. Past 7/8 of the width it saves under 1/8 of the group's cache for a
      rebuild of nearly the whole width (the first layer of the Llama-3-8B and Qwen2.5-7B shapes: rank 496 of
      512, 0.23-0.77x dense decode attention on an H100, its raw keys 0.96-1.85x:
      ``benchmarks/results/h100/palu-kernel/v9/``): there the knapsack is offered the raw keys.
    * on a measured class, the ranks the kernel would run (:func:`gac.hardware.latency.latent_rank`) past the
      largest its calls timed for the key group (:meth:`Profile.timed_key_rank`; ``gac profile``
      times ``G·hd/2``, 256 at key group 4 and head_dim 128): the class cannot price them, and the kernel slows
      sharply past it. On an H200 key rank 384 (values 128) ran 0.44-0.48x dense decode attention from 16
      sequences where 256 ran 0.78-0.83x and 128 (values 384) 0.90-0.96x, at the same latent bytes
      (``benchmarks/results/h200/palu-default/call5/ranks/``); with 64-rank candidates
      (:func:`gac.hardware.latency.site_modulus`)
      the first layer's near-full key groups were otherwise offered 448, and took the Llama-3-8B shape's
      decode from 0.89x dense to 0.76x (``benchmarks/results/h200/palu-default/call6/``).

    >>> from gac.hardware.profile import default_profile
    >>> s = Site("k:g0", "lowrank_r", max_dim=512, unit_cost=1, dense_cost=512,
    ...          meta={"rebuild_flops_per_dim_per_cached_token": 1024, "head_dim": 128, "group_kv": 4})
    >>> sorted(raw_key_candidates(default_profile("bfloat16"), s, {432, 448, 464, 480, 496}))
    [432, 448, 512]
    """
    raw = site_cache_ms(profile, site, site.max_dim, 1, 1)
    g = int(site.meta.get("key_group") or site.meta.get("group_kv") or 1)
    rows = int(site.meta.get("query_rows") or 0)
    top = profile.timed_key_rank(g, rows)
    rates = profile.latent_rates(g, rows)
    out = {
        c
        for c in cands
        if c >= site.max_dim
        or (
            (top is None or latent_rank(rates, c) <= top)
            and (c <= RAW_KEY_SHARE * site.max_dim or site_cache_ms(profile, site, c, 1, 1) <= raw)
        )
    }
    return out if out == cands else out | {site.max_dim}


def _sensitivity(site: Site, loss, importance: float, lo: int, hi: int, has_curve: bool) -> float:
    """Loss per parameter across ``[lo, hi]`` (the loss curve's slope there), or the scalar importance."""
    if not has_curve:
        return float(importance)
    dc = site.cost(hi) - site.cost(lo)
    if dc <= 0:
        return 0.0
    v = loss(np.array([lo, hi]))
    return max(float(v[0] - v[1]), 0.0) / dc


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
    window: float = DEFAULT_WINDOW,
    candidates: str = "modulus",
    objective: str = "paper",
    latency_target: float | None = None,
    quality_target: float | None = None,
    max_states: int = DEFAULT_MAX_STATES,
    serve: list[Point] | None = None,
    allow_slower: bool = False,
    other_ms: dict[str, float] | None = None,
    guard_margin: float | None = None,
) -> Allocation:
    """Re-select the kept dims of ``sites`` according to ``strategy``.

    Args:
        strategy: one of :data:`STRATEGIES`.
        sites: the compressor's sites.
        native: the compressor's native allocation (site name -> kept dim).
        profile: the hardware profile that says which dims are aligned and fast.
        curves: per site, the compressor's loss curve (length ``max_dim + 1``) or None.
        importance: per site, the scalar importance used when a site has no curve (default 1).
        budget: parameter bound for the knapsack strategies (default and maximum: the native total).
        tokens: rows per forward pass for the latency model.
        window: how far from the native dim a knapsack strategy may move a site
            (:func:`candidate_range`): whole modulus steps (default 1) or a fraction of the dim.
        candidates: ``modulus`` (multiples of the profile's rule: finest aligned steps, best
            quality) or ``prefer`` (multiples of the modulus with the best measured throughput,
            e.g. 64 for low-rank pairs on the H200: coarser steps, faster kernels).
        objective: ``paper`` (sensitivity x parameter change) or ``curve`` (the loss curve).
        latency_target: ``gac-latency`` only: predicted latency bound as a fraction of dense.
        quality_target: ``gac-latency`` only: loss bound (default: the native allocation's loss).
        max_states: DP width before the costs are quantized more coarsely.
        serve: the serving shapes (:func:`gac.hardware.latency.parse_serve`). With ``gac``, the
            latency guard (:func:`guarded_knapsack`): every site may also stay dense, and only
            allocations predicted no slower than dense at every shape are feasible; none
            feasible raises :class:`GuardInfeasible`. Every strategy records its per-shape
            prediction (``Allocation.serve``).
        allow_slower: ``gac`` without the guard (the least loss at the budget), naming the
            shapes where the result is predicted slower than dense.
        other_ms: per serving shape key, the predicted ms of the dense model outside the sites
            (attention, norms, head...: unchanged by the sites' dims), so that ``Allocation.serve``
            gives whole-model speedups; without it, the sites' own.
        guard_margin: the guard asks for a predicted speedup of at least ``1 + guard_margin`` at every
            shape (:func:`resolve_margin`; None: the profile's measured margin, else
            :data:`DEFAULT_GUARD_MARGIN`); recorded as ``guard["margin"]`` and its ``margin_source``.
    """
    t0 = time.perf_counter()
    _check_name("align strategy", strategy, STRATEGIES)
    _check_name("objective", objective, OBJECTIVES)
    window = check_window(window)
    margin, margin_src = resolve_margin(profile, guard_margin)
    _validate(sites, native)
    curves = curves or {}
    importance = importance or {}
    native_cost = sum(s.cost(native[s.name]) for s in sites)
    budget = native_cost if budget is None else budget
    budget = min(int(budget), native_cost) if strategy in KNAPSACK_STRATEGIES else int(budget)
    curve_loss = {
        s.name: _loss_fn(s, curves.get(s.name), importance.get(s.name, 1.0), native[s.name]) for s in sites
    }
    has = [curves.get(s.name) is not None for s in sites]
    source = "loss_curve" if all(has) else ("importance" if not any(has) else "mixed")
    notes: list[str] = []
    if strategy == "none":
        dims = dict(native)
    elif strategy == "round":
        dims = _round_dims(sites, native, profile)
    else:
        _check_name("candidate step", candidates, CANDIDATE_STEPS)
        aligned = strategy != "knapsack"
        loss = curve_loss
        if objective == "paper":
            loss = _paper_loss(sites, native, profile, window, curve_loss, importance, has)
        step = candidates if aligned else "modulus"
        r = _Reselect(sites, native, profile, loss, budget, max_states, window, step, aligned)
        if strategy == "gac-latency":
            dims = _latency_knapsack(r, objective == "curve", tokens, latency_target, quality_target, notes)
        elif strategy == "gac" and serve and not allow_slower:
            dims = _guarded(r, objective, serve, other_ms, notes, margin)
        else:
            dims = _knapsack(r, objective == "curve", notes)
        raw = [  # key groups at full width whose native rank the rule took away
            s.name
            for s in sites
            if s.meta.get("rebuild_flops_per_dim_per_cached_token")
            and dims[s.name] >= s.max_dim
            and raw_key_candidates(profile, s, {native[s.name]}) != {native[s.name]}
        ]
        if raw:
            notes.append(
                f"{len(raw)} key group(s) kept at full width and cached raw ({', '.join(raw[:3])}"
                f"{', ...' if len(raw) > 3 else ''}): their ranks were past {RAW_KEY_SHARE:g} of the width and "
                "predicted slower to attend than the raw keys, or past the largest key rank the profile's "
                "latent_attention class timed"
            )
        tiled = [s for s in sites if aligned and site_modulus(profile, s) > profile.modulus(s.op)]
        if tiled:
            notes.append(
                f"{len(tiled)} key group(s) ranked in whole {site_modulus(profile, tiled[0])}-rank tiles of the "
                f"latent decode kernel: profile {profile.id}'s latent_attention class timed a key rank short of "
                "the tile no faster than the tile"
            )
    label = "native" if strategy in ("none", "round") else f"{objective}:{source}"
    solve_s = time.perf_counter() - t0
    rec = _record(strategy, sites, native, dims, profile, budget, curve_loss, tokens, solve_s, label, notes)
    rec.window = window
    if serve:
        _judge_serve(rec, sites, dims, profile, serve, other_ms, strategy == "gac", allow_slower)
        if rec.guard["guarded"]:
            rec.guard.update(margin=margin, margin_source=margin_src)
    return rec


def _check_name(what: str, name: str, choices: tuple[str, ...]) -> None:
    if name not in choices:
        raise GacError(f"unknown {what} {name!r}; choose one of: {', '.join(choices)}")


def _round_dims(sites: list[Site], native: dict[str, int], profile: Profile) -> dict[str, int]:
    """``round``: each dim to the nearest multiple of its modulus or of the site's own rounding."""
    dims = {}
    for s in sites:
        d = native[s.name]
        if d >= s.max_dim:
            dims[s.name] = s.max_dim
            continue
        rm = s.meta.get("round_multiple")
        if rm:  # the compressor's reference rounding (PaLU: Python's round, half to even)
            r = max(max(1, round(d / rm)) * rm, s.min_dim)
        else:
            r = max(round_nearest(d, site_modulus(profile, s)), s.min_dim)
        cap = s.meta.get("rank_max")  # a compressor's own bound: rounded down to it, never past it
        if cap is not None and cap < r < s.max_dim:
            r = round_down(int(cap), rm or site_modulus(profile, s)) or int(cap)
        dims[s.name] = s.max_dim if r >= s.max_dim else r
    return dims


def _paper_loss(sites, native, profile, window, curve_loss, importance, has) -> dict[str, Any]:
    """Per site, the paper's linear value at the native dim (:func:`_linear_loss`)."""
    loss = {}
    for s, h in zip(sites, has, strict=True):
        # one window per site for gac and knapsack alike, so both value a dim the same
        lo, hi = candidate_range(s, native[s.name], site_modulus(profile, s), window)
        sens = _sensitivity(s, curve_loss[s.name], importance.get(s.name, 1.0), lo, hi, h)
        loss[s.name] = _linear_loss(s, sens, native[s.name])
    return loss


@dataclass
class _Reselect:
    """A knapsack re-selection's setting: the sites, their losses, the budget and the candidate grid."""

    sites: list[Site]
    native: dict[str, int]
    profile: Profile
    loss: dict[str, Any]  # per site, a vectorised loss(d)
    budget: int
    max_states: int
    window: float
    step: str
    aligned: bool

    def grid(self, keep_dense: bool) -> tuple[list[list[int]], list[np.ndarray], list[np.ndarray]]:
        """Per site: the candidate dims, their parameter costs and their losses."""
        cands = [
            _candidates(
                self.profile, s, self.native[s.name], self.window, self.step, self.aligned, keep_dense
            )
            for s in self.sites
        ]
        costs = [
            np.array([s.cost(d) for d in c], dtype=np.int64) for s, c in zip(self.sites, cands, strict=True)
        ]
        losses = [self.loss[s.name](np.array(c)) for s, c in zip(self.sites, cands, strict=True)]
        return cands, costs, losses

    def dims(self, cands: list[list[int]], choice: list[int]) -> dict[str, int]:
        return {s.name: c[j] for s, c, j in zip(self.sites, cands, choice, strict=True)}

    def fill(self, dims: dict[str, int], cands: list[list[int]], guard=None) -> dict[str, int]:
        """The fill pass (:func:`_fill`); ``guard``: ``(per-site shape deltas, per-shape limits)``."""
        return _fill(
            self.sites,
            dims,
            self.loss,
            self.profile,
            self.budget,
            self.step,
            cands,
            self.aligned,
            guard=guard,
        )


def _knapsack(r: _Reselect, keep_dense: bool, notes: list[str]) -> dict[str, int]:
    """``gac`` and ``knapsack``: the least loss within the budget, then the fill pass."""
    cands, costs, losses = r.grid(keep_dense)
    sol = solve_mckp(costs, losses, r.budget, max_states=r.max_states)
    if not sol.exact:
        notes.append(f"DP costs rounded up to units of {sol.unit:,} parameters ({sol.states:,} states)")
    return r.fill(r.dims(cands, sol.choice), cands)


def _guarded(
    r: _Reselect, objective: str, serve: list[Point], other_ms, notes: list[str], margin: float = 0.0
) -> dict[str, int]:
    """``gac`` under the latency guard (:func:`guarded_knapsack`), every site may also stay dense."""
    if objective != "curve":
        # today's gac (no keep-dense candidates) first: where it already meets every serving
        # shape, the guard costs nothing. Keep-dense candidates only enter where it does not (the
        # loss estimates can favour keeping a site dense and cutting others deeper: on SmolLM2,
        # LLM-Pruner 10%, that cost 1.86x the perplexity of an allocation the guard accepts too)
        d0 = _knapsack(r, False, notes=[])  # its DP note would describe a solve that is not kept
        pred = serve_prediction(r.sites, d0, r.profile, serve, other_ms)
        if all(x["speedup"] >= 1.0 + margin for x in pred):
            notes.append("latency guard: the unguarded allocation already meets every serving shape")
            return d0
    cands, costs, losses = r.grid(keep_dense=True)
    dims, note = guarded_knapsack(
        r.sites, cands, costs, losses, r.budget, r.profile, serve, r.max_states, other_ms, margin
    )
    notes.extend(note)
    dense_k = np.array(
        [sum(site_ms(r.profile, s, s.max_dim, p.tokens, p.kv) for s in r.sites) for p in serve]
    )
    limit = _limits(dense_k, serve, other_ms, margin)
    return r.fill(dims, cands, guard=(_shape_deltas(r.sites, cands, r.profile, serve), limit))


def _judge_serve(
    rec: Allocation, sites, dims, profile, serve, other_ms, is_gac: bool, allow_slower: bool
) -> None:
    """Record the per-shape prediction of ``dims`` and the latency guard's verdict on ``rec``."""
    rec.serve = serve_prediction(sites, dims, profile, serve, other_ms)
    slower = [r for r in rec.serve if r["speedup"] < 1.0 - SLOWER_TOL]
    rec.guard = {
        "guarded": is_gac and not allow_slower,
        "allow_slower": bool(allow_slower),
        "slower": [r["point"] for r in slower],
    }
    if slower and is_gac:
        rec.notes.append("predicted slower than dense at " + _shapes_line(slower) + " (--allow-slower)")


def _bisect(
    feasible, choice: list[int], lo: float, hi: float, steps: int, width: float
) -> tuple[float, list[int]]:
    """Bisect an exponent in ``[lo, hi]`` for the smallest one whose solve is feasible.

    ``feasible(e)`` returns ``(choice, ok)``; ``choice`` is the answer while none is. Returns the
    last feasible exponent and its choice.
    """
    for _ in range(steps):
        mid = (lo + hi) / 2
        ch, ok = feasible(mid)
        if ok:
            hi, choice = mid, ch
        else:
            lo = mid
        if hi - lo < width:
            break
    return hi, choice


def _linear_loss(site: Site, sensitivity: float, native: int):
    """The paper's value as a loss: ``-sensitivity x (params(d) - params(d*))``."""
    base = site.cost(native)
    return lambda ds: np.array(
        [-sensitivity * (site.cost(int(d)) - base) for d in np.atleast_1d(ds)], dtype=np.float64
    )


def _fill(
    sites: list[Site],
    dims: dict[str, int],
    loss,
    profile: Profile,
    budget: int,
    step: str = "modulus",
    cands: list[list[int]] | None = None,
    aligned: bool = True,
    guard: tuple[dict[str, list[dict[int, float]]], np.ndarray] | None = None,
) -> dict[str, int]:
    """Spend leftover budget on up-steps to the next candidate (largest loss drop per parameter first).

    An up-step is never taken when it raises the loss, so it never hurts quality; this closes the
    gap left by ties and by coarse DP quantization. Steps go to the next larger candidate of the
    site (``cands``), so a site stays inside its window and, for ``gac``, aligned (on the prefer
    grid with ``step="prefer"``); without ``cands``, to the next multiple of the modulus (1 when
    ``aligned`` is False). With ``guard`` (per site, per serving shape, each candidate's predicted
    ms over dense, :func:`_shape_deltas`; and per shape the most the sum may reach, :func:`_limits`),
    an up-step that would take any shape past its limit is not taken.
    """
    dims = dict(dims)
    if guard is not None:
        guard, limit = guard
        over = np.sum([[g[dims[s.name]] for g in guard[s.name]] for s in sites], axis=0) - limit
    by_site = {s.name: c for s, c in zip(sites, cands, strict=True)} if cands is not None else {}
    used = sum(s.cost(dims[s.name]) for s in sites)
    while True:
        best, best_gain = None, -math.inf
        for s in sites:
            d = dims[s.name]
            if d >= s.max_dim:
                continue
            if s.name in by_site:
                up = [c for c in by_site[s.name] if c > d]
                if not up:
                    continue
                nxt = up[0]
            else:
                m = site_modulus(profile, s) if aligned else 1
                if step == "prefer" and d % profile.prefer(s.op) == 0:
                    m = profile.prefer(s.op)
                nxt = min((d // m + 1) * m, s.max_dim)
            extra = s.cost(nxt) - s.cost(d)
            if extra <= 0 or used + extra > budget:
                continue
            if guard is not None:
                g = guard[s.name]
                new = over + np.array([x[nxt] - x[d] for x in g])
                if np.any((new > 0) & (new > over)):
                    continue
            drop = float(loss[s.name](np.array([d]))[0] - loss[s.name](np.array([nxt]))[0])
            if drop < 0:
                continue
            gain = drop / extra
            if gain > best_gain:
                best, best_gain = (s, nxt, extra), gain
        if best is None:
            return dims
        s, nxt, extra = best
        if guard is not None:
            over = over + np.array([x[nxt] - x[dims[s.name]] for x in guard[s.name]])
        dims[s.name] = nxt
        used += extra


def _latency_knapsack(
    r: _Reselect, keep_dense: bool, tokens: int, latency_target, quality_target, notes: list[str]
) -> dict[str, int]:
    """``gac-latency``: bisection on a Lagrange multiplier that trades latency against loss."""
    sites, profile = r.sites, r.profile
    cands, costs, losses = r.grid(keep_dense)
    lat = [np.array([site_ms(profile, s, d, tokens) for d in c]) for s, c in zip(sites, cands, strict=True)]
    dense_ms = sum(site_ms(profile, s, s.max_dim, tokens) for s in sites)

    def solve(w_loss: float, w_lat: float):
        vals = [w_loss * lo + w_lat * la for lo, la in zip(losses, lat, strict=True)]
        sol = solve_mckp(costs, vals, r.budget, max_states=r.max_states)
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
        choice = best[0]
        if best[2] > target:
            notes.append(
                f"latency target {latency_target:.3f} x dense unreachable; returning the fastest allocation"
            )
        else:

            def fast_enough(e: float) -> tuple[list[int], bool]:
                ch, _, t = solve(1.0 / loss_scale, 10**e / lat_scale)
                return ch, t <= target

            _, choice = _bisect(fast_enough, choice, -12.0, 9.0, steps=40, width=1e-3)
        notes.append(f"gac-latency: least loss with predicted latency <= {latency_target:.3f} x dense")
    else:
        if quality_target is None:
            quality_target = float(sum(r.loss[s.name](np.array([r.native[s.name]]))[0] for s in sites))
            what = "the native allocation's loss"
        else:
            what = f"loss {quality_target:.6g}"
        tol = 1e-9 * loss_scale
        # minimise lat/lat_scale + mu * loss/loss_scale; larger mu -> better quality.
        best = solve(1e9 / loss_scale, 1.0 / lat_scale)
        choice = best[0]
        if best[1] > quality_target + tol:
            notes.append(f"quality target ({what}) unreachable; returning the least-loss allocation")
        else:

            def good_enough(e: float) -> tuple[list[int], bool]:
                ch, q, _ = solve(10**e / loss_scale, 1.0 / lat_scale)
                return ch, q <= quality_target + tol

            _, choice = _bisect(good_enough, choice, -12.0, 9.0, steps=40, width=1e-3)
        notes.append(f"gac-latency: lowest predicted latency with loss <= {what}")
    return r.dims(cands, choice)


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
                params=s.params(d),
            )
        )
    comp = [s for s in sites if dims[s.name] < s.max_dim]
    step = (lambda s: 1) if strategy == "knapsack" else (lambda s: site_modulus(profile, s))
    unit = min((s.unit_cost * step(s) for s in comp), default=0)
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
