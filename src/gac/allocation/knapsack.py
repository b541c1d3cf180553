"""The multiple-choice knapsack solver behind ``--align gac`` (pure numpy).

Each group (site) must pick exactly one candidate; candidate ``j`` of group ``i`` has an
integer cost ``costs[i][j]`` (parameters) and a value ``values[i][j]`` (estimated quality
loss, lower is better). The solver minimises the summed value with the summed cost
``<= budget``.

The DP runs over the budget *slack*: every group's cheapest candidate is taken as its base,
so the state space is ``budget - sum(base)`` rather than the whole budget. The slack is then
divided by the greatest common divisor of all relative costs, which is exact: a total of
relative costs that are all multiples of ``g`` fits ``slack`` if and only if it fits
``floor(slack / g) * g``. If that still leaves more than ``max_states`` states, relative costs
are rounded *up* to a coarser unit, which can only over-estimate a total, so the budget bound
stays exact and only a little budget may go unused (reported as ``exact=False``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gac.errors import GacError

DEFAULT_MAX_STATES = 200_000


@dataclass
class KnapsackSolution:
    """The chosen candidate index per group and how the DP was set up.

    Attributes:
        choice: index of the chosen candidate in each group.
        cost: total cost of the choice.
        value: total value of the choice.
        unit: the cost quantum of the DP (gcd of relative costs, or the coarser rounding unit).
        states: number of DP states (budget slack / unit + 1).
        exact: True when the quantization was the exact gcd (no rounding of costs).
    """

    choice: list[int]
    cost: int
    value: float
    unit: int
    states: int
    exact: bool


def solve_mckp(
    costs: list[np.ndarray],
    values: list[np.ndarray],
    budget: int,
    max_states: int = DEFAULT_MAX_STATES,
) -> KnapsackSolution:
    """Minimise ``sum(values[i][j_i])`` subject to ``sum(costs[i][j_i]) <= budget``.

    Args:
        costs: per group, integer candidate costs (1-D).
        values: per group, float candidate values (same shapes; ``inf`` forbids a candidate).
        budget: the cost bound (inclusive).
        max_states: largest DP table width before costs are rounded up to a coarser unit.

    Returns:
        The optimal choice (optimal up to the cost rounding when ``exact`` is False).

    Raises:
        GacError: when even the cheapest candidate of every group exceeds the budget.

    >>> s = solve_mckp([np.array([1, 2, 3])] * 2, [np.array([5.0, 2.0, 0.0])] * 2, budget=4)
    >>> s.choice, s.cost, s.value
    ([1, 1], 4, 4.0)
    """
    n = len(costs)
    if n != len(values):
        raise ValueError("costs and values must have one entry per group")
    if n == 0:
        return KnapsackSolution([], 0, 0.0, 1, 1, True)
    cs = [np.asarray(c, dtype=np.int64) for c in costs]
    vs = [np.asarray(v, dtype=np.float64) for v in values]
    for c, v in zip(cs, vs, strict=True):
        if c.ndim != 1 or c.shape != v.shape or c.size == 0:
            raise ValueError(
                "each group needs a non-empty 1-D cost array and a value array of the same shape"
            )
    base = np.array([int(c.min()) for c in cs], dtype=np.int64)
    slack = int(budget) - int(base.sum())
    if slack < 0:
        raise GacError(
            f"the budget of {int(budget):,} parameters cannot be met: the cheapest candidates already need "
            f"{int(base.sum()):,}"
        )
    rel = [c - b for c, b in zip(cs, base, strict=True)]
    # Candidates that alone exceed the slack can never be chosen.
    vs = [np.where(r <= slack, v, np.inf) for r, v in zip(rel, vs, strict=True)]
    nonzero = np.concatenate([r[(r > 0) & (r <= slack)] for r in rel] + [np.zeros(0, np.int64)])
    unit = int(np.gcd.reduce(nonzero)) if nonzero.size else 1
    unit = max(unit, 1)
    exact = True
    if slack // unit + 1 > max_states:
        unit = max(unit, math.ceil(slack / (max_states - 1)))
        exact = False
    k_max = slack // unit
    # Exact division when unit is the gcd; ceil (never under-estimates) otherwise.
    q = [np.where(r <= slack, -(-r // unit), k_max + 1) for r in rel]

    width = k_max + 1
    f = np.zeros(width, dtype=np.float64)  # f[k]: best value with relative cost <= k*unit
    choices = np.zeros((n, width), dtype=np.uint16 if max(len(c) for c in cs) > 255 else np.uint8)
    for i in range(n):
        new = np.full(width, np.inf)
        ch = choices[i]
        for j in range(len(q[i])):
            r = int(q[i][j])
            v = vs[i][j]
            if r >= width or not np.isfinite(v):
                continue
            cand = f[: width - r] + v
            seg = new[r:]
            better = cand < seg
            seg[better] = cand[better]
            ch[r:][better] = j
        f = new
    if not np.isfinite(f[k_max]):
        raise GacError(f"the budget of {int(budget):,} parameters cannot be met with the allowed candidates")
    choice = [0] * n
    k = k_max
    for i in range(n - 1, -1, -1):
        j = int(choices[i, k])
        choice[i] = j
        k -= int(q[i][j])
    total_cost = int(sum(int(cs[i][j]) for i, j in enumerate(choice)))
    total_value = float(sum(float(vs[i][j]) for i, j in enumerate(choice)))
    return KnapsackSolution(choice, total_cost, total_value, unit, width, exact)
