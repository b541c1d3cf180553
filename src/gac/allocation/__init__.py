"""Allocation: choose each site's kept dim under a parameter budget (pure numpy, no torch).

See :func:`allocate` for the strategies ``none``, ``round``, ``knapsack``, ``gac`` and ``gac-latency``.
"""

from __future__ import annotations

from gac.allocation.knapsack import KnapsackSolution, solve_mckp
from gac.allocation.strategies import (
    CANDIDATE_STEPS,
    DEFAULT_GUARD_MARGIN,
    DEFAULT_TOKENS,
    DEFAULT_WINDOW,
    KNAPSACK_STRATEGIES,
    OBJECTIVES,
    SLOWER_TOL,
    STRATEGIES,
    Allocation,
    GuardInfeasible,
    SiteAllocation,
    allocate,
    candidate_range,
    check_margin,
    check_window,
    guarded_knapsack,
    resolve_margin,
    serve_prediction,
    site_ms,
)

__all__ = [
    "CANDIDATE_STEPS",
    "DEFAULT_GUARD_MARGIN",
    "DEFAULT_TOKENS",
    "DEFAULT_WINDOW",
    "SLOWER_TOL",
    "GuardInfeasible",
    "KNAPSACK_STRATEGIES",
    "OBJECTIVES",
    "STRATEGIES",
    "Allocation",
    "KnapsackSolution",
    "SiteAllocation",
    "allocate",
    "candidate_range",
    "check_margin",
    "check_window",
    "guarded_knapsack",
    "resolve_margin",
    "serve_prediction",
    "site_ms",
    "solve_mckp",
]
