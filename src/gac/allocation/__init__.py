"""Allocation: choose each site's kept dim under a parameter budget (pure numpy, no torch).

See :func:`allocate` for the strategies ``none``, ``round``, ``gac`` and ``gac-latency``.
"""

from __future__ import annotations

from gac.allocation.knapsack import KnapsackSolution, solve_mckp
from gac.allocation.strategies import (
    CANDIDATE_STEPS,
    DEFAULT_TOKENS,
    STRATEGIES,
    Allocation,
    SiteAllocation,
    allocate,
    site_ms,
)

__all__ = [
    "CANDIDATE_STEPS",
    "DEFAULT_TOKENS",
    "STRATEGIES",
    "Allocation",
    "KnapsackSolution",
    "SiteAllocation",
    "allocate",
    "site_ms",
    "solve_mckp",
]
