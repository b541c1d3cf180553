"""Allocation strategies and the knapsack solver: optimality, budgets, alignment, speed."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from gac.allocation import allocate, site_ms, solve_mckp
from gac.errors import GacError
from gac.hardware.profile import OpRule, Profile, default_profile
from gac.sites import lowrank_site


def _brute(costs, values, budget):
    best = (np.inf, None)
    for combo in itertools.product(*[range(len(c)) for c in costs]):
        c = sum(costs[i][j] for i, j in enumerate(combo))
        v = sum(values[i][j] for i, j in enumerate(combo))
        if c <= budget and v < best[0]:
            best = (v, combo)
    return best


@pytest.mark.parametrize("seed", range(8))
def test_knapsack_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 5
    costs = [np.sort(rng.choice(np.arange(1, 60) * 6, size=4, replace=False)) for _ in range(n)]
    values = [np.sort(rng.random(4))[::-1] * 10 for _ in range(n)]
    budget = int(sum(c.mean() for c in costs))
    sol = solve_mckp(costs, values, budget)
    best_v, _ = _brute(costs, values, budget)
    assert sol.exact and sol.unit % 6 == 0
    assert sol.cost <= budget
    assert sol.value == pytest.approx(best_v)


def test_knapsack_coarse_quantization_keeps_the_bound():
    rng = np.random.default_rng(1)
    costs = [rng.integers(1000, 2000, size=5) + rng.integers(0, 7, size=5) for _ in range(5)]  # gcd 1
    values = [rng.random(5) for _ in range(5)]
    budget = int(sum(np.median(c) for c in costs))
    sol = solve_mckp(costs, values, budget, max_states=50)
    assert not sol.exact and sol.cost <= budget
    best_v, _ = _brute(costs, values, budget)
    assert sol.value >= best_v - 1e-12


def test_knapsack_infeasible_budget_is_a_gac_error():
    with pytest.raises(GacError, match="cannot be met"):
        solve_mckp([np.array([10, 20])], [np.array([1.0, 0.0])], budget=5)


def _sites_and_curves(n_layers: int, shapes, keep: float = 0.85, seed: int = 0):
    """Low-rank sites with exponentially decaying spectra whose decay varies per layer."""
    rng = np.random.default_rng(seed)
    sites, curves, native = [], {}, {}
    for layer in range(n_layers):
        tau = rng.uniform(0.1, 0.6)
        for role, (out_f, in_f) in shapes.items():
            s = lowrank_site(f"layers.{layer}.{role}", out_f, in_f)
            full = min(out_f, in_f)
            sig2 = np.exp(-2 * np.arange(full) / (tau * full))
            tail = np.concatenate([np.cumsum(sig2[::-1])[::-1], [0.0]])  # tail[d] = sum_{i>=d} sigma_i^2
            curve = tail[: s.max_dim + 1].copy()
            curve[s.max_dim] = 0.0
            sites.append(s)
            curves[s.name] = curve
            native[s.name] = int(keep * s.max_dim) - int(rng.integers(0, 5))  # irregular, like ASVD
    return sites, curves, native


LLAMA3_8B = {
    "q": (4096, 4096),
    "k": (1024, 4096),
    "v": (1024, 4096),
    "o": (4096, 4096),
    "gate": (14336, 4096),
    "up": (14336, 4096),
    "down": (4096, 14336),
}
TINY = {
    "q": (120, 120),
    "k": (24, 120),
    "v": (24, 120),
    "o": (120, 120),
    "gate": (200, 120),
    "up": (200, 120),
    "down": (120, 200),
}


def _profile(mod: int) -> Profile:
    p = default_profile()
    p.ops["lowrank_r"] = OpRule(
        modulus=mod,
        prefer=mod,
        class_efficiency={
            "1": 0.3,
            "2": 0.4,
            "4": 0.5,
            "8": 0.7,
            "16": 0.8,
            "32": 0.9,
            "64": 1.0,
            "128": 1.0,
        },
    )
    p.id = f"test-mod{mod}"
    return p


@pytest.mark.parametrize("mod", [8, 64])
def test_gac_respects_budget_aligns_everything_and_beats_rounding(mod):
    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = _profile(mod)
    none = allocate("none", sites, native, prof, curves)
    rnd = allocate("round", sites, native, prof, curves)
    gac = allocate("gac", sites, native, prof, curves)
    assert none.pct_aligned < 50  # irregular native dims
    assert gac.pct_aligned == 100.0 and rnd.pct_aligned == 100.0
    assert all(d % mod == 0 or d == s.max_dim for s, d in zip(sites, gac.dims.values(), strict=True))
    assert gac.budget == none.cost
    assert gac.cost <= gac.budget
    assert gac.budget - gac.cost < gac.cost_unit  # uses the budget to within one cost unit
    # Among allocations within budget, gac has the least loss: round-down of every site is one of them.
    down = {s.name: (native[s.name] // mod) * mod for s in sites}
    loss_down = sum(curves[s.name][down[s.name]] for s in sites)
    assert gac.loss <= loss_down + 1e-12
    if rnd.cost <= rnd.budget:
        assert gac.loss <= rnd.loss + 1e-12
    # the record is coherent
    assert gac.cost == sum(r.cost for r in gac.sites)
    assert gac.predicted_speedup_vs_native > 1.0


def test_gac_is_optimal_on_a_small_instance():
    """Brute force over the same candidate sets: the knapsack finds the least loss."""
    sites, curves, native = _sites_and_curves(
        1, {"q": (120, 120), "k": (24, 120), "gate": (200, 120)}, keep=0.6
    )
    prof = default_profile()
    gac = allocate("gac", sites, native, prof, curves)
    cand = []
    for s in sites:
        c = sorted(set(prof.candidates(s.op, native[s.name], lo=s.min_dim, hi=s.max_dim - 1)) | {s.max_dim})
        cand.append(c)
    best = min(
        sum(curves[s.name][d] for s, d in zip(sites, combo, strict=True))
        for combo in itertools.product(*cand)
        if sum(s.cost(d) for s, d in zip(sites, combo, strict=True)) <= gac.budget
    )
    assert gac.loss == pytest.approx(best)


def test_round_reports_over_or_under_budget():
    sites, curves, native = _sites_and_curves(2, TINY)
    rnd = allocate("round", sites, native, default_profile(), curves)
    assert rnd.over_budget == rnd.cost - rnd.budget
    assert rnd.budget_use == pytest.approx(rnd.cost / rnd.budget)


def test_importance_fallback_rounds_important_sites_up():
    sites, _, native = _sites_and_curves(2, TINY)
    imp = {s.name: (10.0 if s.name.endswith(".q") else 1.0) for s in sites}
    gac = allocate("gac", sites, native, default_profile(), curves=None, importance=imp)
    assert gac.objective == "importance_x_params"
    assert gac.pct_aligned == 100.0 and gac.cost <= gac.budget
    for r in gac.sites:
        if r.name.endswith(".q"):
            assert r.dim >= r.native  # the important sites are never rounded down


def test_gac_solves_llama3_8b_in_under_a_second():
    sites, curves, native = _sites_and_curves(32, LLAMA3_8B)
    assert len(sites) == 224
    t0 = time.perf_counter()
    gac = allocate("gac", sites, native, default_profile(), curves)
    dt = time.perf_counter() - t0
    assert dt < 1.0, f"took {dt:.2f} s"
    assert gac.pct_aligned == 100.0 and gac.cost <= gac.budget
    assert gac.budget - gac.cost < gac.cost_unit


def test_gac_latency_quality_mode_is_no_worse_than_native_and_faster_than_gac():
    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = _profile(8)
    gac = allocate("gac", sites, native, prof, curves)
    lat = allocate("gac-latency", sites, native, prof, curves)
    assert lat.cost <= lat.budget
    assert lat.loss <= lat.native_loss * (1 + 1e-9)
    assert lat.predicted_ms <= gac.predicted_ms * (1 + 1e-9)
    assert lat.pct_aligned == 100.0  # misaligned dims are never candidates


def test_gac_latency_latency_mode_meets_the_target():
    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = _profile(8)
    gac = allocate("gac", sites, native, prof, curves)
    target = 0.97 * gac.predicted_ms / gac.dense_ms
    lat = allocate("gac-latency", sites, native, prof, curves, latency_target=target)
    assert lat.predicted_ms <= target * lat.dense_ms * (1 + 1e-9)
    assert lat.cost <= lat.budget
    assert lat.loss >= gac.loss - 1e-12  # gac is the least-loss allocation


def test_site_ms_prefers_aligned_ranks():
    s = lowrank_site("x", 4096, 4096)
    prof = _profile(64)
    assert site_ms(prof, s, 1024) < site_ms(prof, s, 1023)
    assert site_ms(prof, s, s.max_dim) == pytest.approx(prof.gemm_ms(1024, 4096, 4096))


def test_bad_inputs():
    sites, curves, native = _sites_and_curves(1, TINY)
    prof = default_profile()
    with pytest.raises(GacError, match="unknown align strategy"):
        allocate("nearest", sites, native, prof, curves)
    with pytest.raises(GacError, match="no dim"):
        allocate("gac", sites, {}, prof, curves)
    bad = dict(curves)
    bad[sites[0].name] = bad[sites[0].name][:-1]
    with pytest.raises(GacError, match="loss curve"):
        allocate("gac", sites, native, prof, bad)
    # Native dims below one modulus everywhere: no aligned choice fits the budget.
    tiny_native = {s.name: 1 for s in sites}
    with pytest.raises(GacError, match="cannot be met"):
        allocate("gac", sites, tiny_native, prof, curves)


def test_allocation_is_torch_free():
    import subprocess
    import sys

    code = "import sys, gac.allocation; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_prefer_candidates_are_multiples_of_the_fastest_modulus():
    """``candidates="prefer"`` picks multiples of the profile's prefer modulus, within the same budget."""
    from gac.hardware.profile import default_profile

    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = default_profile()
    prof.ops["lowrank_r"].prefer = 64
    fine = allocate("gac", sites, native, prof, curves)
    coarse = allocate("gac", sites, native, prof, curves, candidates="prefer")
    for r in coarse.sites:
        assert r.dense or r.dim % 64 == 0
    assert coarse.cost <= fine.native_cost and fine.cost <= fine.native_cost
    assert any(not r.dense and r.dim % 64 != 0 for r in fine.sites)  # modulus steps are finer
    with pytest.raises(GacError, match="unknown candidate step"):
        allocate("gac", sites, native, prof, curves, candidates="nope")
