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
    gac = allocate("gac", sites, native, prof, curves, objective="curve")
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
    # The predicted latency is the profile's efficiency model plus its launch term, recomputed
    # here independently: launches x launch_us + max(FLOP time, bytes / BW), the FLOP time
    # 2 * tokens * params / (peak * efficiency of the rank's power-of-two class); a factorized
    # site is two launches, a dense one one.
    peak = max(max(r.curve.get("tflops") or [0.0]) for r in prof.ops.values()) or 100.0
    eff = prof.ops["lowrank_r"].class_efficiency
    t, bw, launch = gac.tokens, prof.copy_gbps_or_default * 1e9, prof.launch_us_or_default * 1e-3

    def ms(s, d):
        io = t * (s.shape[0] + s.shape[1])
        if d >= s.max_dim:
            nbytes = 2 * (s.shape[0] * s.shape[1] + io)
            return launch + max(prof.gemm_ms(t, s.shape[1], s.shape[0]), nbytes / bw * 1e3)
        cls = next(c for c in (128, 64, 32, 16, 8, 4, 2, 1) if d % c == 0)
        nbytes = 2 * (s.cost(d) + io + 2 * t * d)
        return 2 * launch + max(2.0 * t * s.cost(d) / (peak * 1e12 * eff[str(cls)]) * 1e3, nbytes / bw * 1e3)

    assert gac.predicted_ms == pytest.approx(sum(ms(s, gac.dims[s.name]) for s in sites))
    assert none.predicted_ms == pytest.approx(sum(ms(s, native[s.name]) for s in sites))


def test_gac_is_optimal_on_a_small_instance():
    """Brute force over the same candidate sets: the knapsack finds the least loss."""
    sites, curves, native = _sites_and_curves(
        1, {"q": (120, 120), "k": (24, 120), "gate": (200, 120)}, keep=0.6
    )
    prof = default_profile()
    gac = allocate("gac", sites, native, prof, curves, objective="curve", window=4)
    cand = []
    for s in sites:
        m = prof.modulus(s.op)
        lo, hi = _expected_range(native[s.name], m, 4, s.min_dim, s.max_dim - 1)
        cand.append([d for d in range(lo, hi + 1) if d % m == 0] + [s.max_dim])
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
    assert gac.objective == "paper:importance"
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
    gac = allocate("gac", sites, native, prof, curves, objective="curve")
    lat = allocate("gac-latency", sites, native, prof, curves, objective="curve")
    assert lat.cost <= lat.budget
    assert lat.loss <= lat.native_loss * (1 + 1e-9)
    assert lat.predicted_ms <= gac.predicted_ms * (1 + 1e-9)
    assert lat.pct_aligned == 100.0  # misaligned dims are never candidates


def test_gac_latency_latency_mode_meets_the_target():
    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = _profile(8)
    gac = allocate("gac", sites, native, prof, curves, objective="curve")
    target = 0.97 * gac.predicted_ms / gac.dense_ms
    lat = allocate("gac-latency", sites, native, prof, curves, latency_target=target, objective="curve")
    assert lat.predicted_ms <= target * lat.dense_ms * (1 + 1e-9)
    assert lat.cost <= lat.budget
    assert lat.loss >= gac.loss - 1e-12  # gac is the least-loss allocation


def test_site_ms_prefers_aligned_ranks():
    s = lowrank_site("x", 4096, 4096)
    prof = _profile(64)
    assert site_ms(prof, s, 1024) < site_ms(prof, s, 1023)
    # one launch plus the GEMM (FLOP-bound at 1024 rows)
    dense = prof.launch_us_or_default * 1e-3 + prof.gemm_ms(1024, 4096, 4096)
    assert site_ms(prof, s, s.max_dim) == pytest.approx(dense)


def test_site_ms_decode_regime_pays_the_second_launch():
    """At one row (decode) a site is bytes + launches: factorizing at a rank that saves fewer bytes
    than one launch streams is slower than dense; a deep cut is faster."""
    s = lowrank_site("x", 4096, 4096)
    prof = _profile(64)
    prof.launch_us, prof.copy_gbps = 5.0, 4500.0
    dense = site_ms(prof, s, s.max_dim, tokens=1)
    assert dense == pytest.approx(5e-3 + 2 * (4096 * 4096 + 8192) / 4500e9 * 1e3)
    near = site_ms(prof, s, 2040, tokens=1)  # saves 2 * 4096 * 8 * 2 bytes = 0.06 us < 5 us
    assert near > dense
    assert site_ms(prof, s, 512, tokens=1) < dense  # saves 29 MB = 6.5 us > one launch
    # the launch term is what separates them: without it the factorized site is always cheaper
    prof.launch_us = 0.0
    assert site_ms(prof, s, 2040, tokens=1) < site_ms(prof, s, s.max_dim, tokens=1)


def test_site_ms_decode_takes_the_fused_kernel_where_the_profile_has_it():
    """At the fused kernel's rows a factorized site costs the cheaper of two launches and the kernel's
    one (its own fixed time and bandwidth); elsewhere, and for dense sites, nothing changes."""
    s = lowrank_site("x", 4096, 4096)
    prof = _profile(64)
    prof.launch_us, prof.copy_gbps = 5.0, 4500.0
    before = {(d, t): site_ms(prof, s, d, tokens=t) for d in (2040, 512, s.max_dim) for t in (1, 16)}
    prof.fused_lowrank = {"launch_us": 6.5, "gbps": 4000.0, "rows": [1]}
    nbytes = (2040 * 8192 + 8192 + 2 * 2040) * 2
    assert site_ms(prof, s, 2040, tokens=1) == pytest.approx(6.5e-3 + nbytes / 4000e9 * 1e3)
    assert site_ms(prof, s, 2040, tokens=1) < before[(2040, 1)]  # one launch instead of two
    # a near-native rank still loses to dense (the kernel streams slower than copy bandwidth); a deep
    # cut wins by more than before
    assert site_ms(prof, s, 2040, tokens=1) > site_ms(prof, s, s.max_dim, tokens=1)
    dense = site_ms(prof, s, s.max_dim, tokens=1)
    assert dense - site_ms(prof, s, 512, tokens=1) > dense - before[(512, 1)] > 0
    for d, t in ((2040, 16), (512, 16), (s.max_dim, 1), (s.max_dim, 16)):
        assert site_ms(prof, s, d, tokens=t) == before[(d, t)]
    prof.fused_lowrank = {"launch_us": 50.0, "gbps": 4000.0, "rows": [1]}  # a kernel slower than two launches
    assert site_ms(prof, s, 512, tokens=1) == before[(512, 1)]


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


# ------------------------------------------------------------------ candidates, knapsack control
def _expected_range(native: int, m: int, window: float, lo_min: int, hi_max: int) -> tuple[int, int]:
    """The window written out independently of gac.allocation (steps of m, or a fraction)."""
    if window >= 1:
        lo, hi = native - int(window) * m, native + int(window) * m
    else:
        half = max(1, int(window * native + 0.5))
        lo, hi = native - half, native + half
    return max(lo, lo_min, 1), min(hi, hi_max)


@pytest.mark.parametrize("seed", range(6))
def test_candidates_are_exactly_the_aligned_dims_of_the_window(seed):
    from gac.allocation.strategies import _candidates

    rng = np.random.default_rng(seed)
    prof = default_profile()
    for _ in range(40):
        out_f, in_f = int(rng.integers(16, 700)), int(rng.integers(16, 700))
        s = lowrank_site("x", out_f, in_f)
        native = int(rng.integers(1, s.max_dim + 1))
        m = int(rng.choice([1, 8, 16, 64]))
        prof.ops["lowrank_r"] = OpRule(modulus=m, prefer=m)
        window = float(rng.choice([1, 2, 4, 12, 0.05, 0.3]))
        lo, hi = _expected_range(min(native, s.max_dim), m, window, s.min_dim, s.max_dim - 1)
        aligned = set(range(lo, hi + 1)) & {d for d in range(1, s.max_dim) if d % m == 0}
        got = _candidates(prof, s, native, window, keep_dense=True)
        if aligned:
            assert set(got) == aligned | {s.max_dim}
        else:  # nothing aligned in a narrow window: the multiples around the native dim
            assert set(got) - {s.max_dim} <= {native - native % m, native - native % m + m}
        every = _candidates(prof, s, native, window, aligned=False, keep_dense=False)
        assert set(every) - {s.max_dim} == set(range(lo, hi + 1))


def test_window_must_be_steps_or_a_fraction():
    sites, curves, native = _sites_and_curves(1, TINY)
    for bad in (0, -1, 1.5, float("nan")):
        with pytest.raises(GacError, match="window"):
            allocate("gac", sites, native, default_profile(), curves, window=bad)
    with pytest.raises(GacError, match="objective"):
        allocate("gac", sites, native, default_profile(), curves, objective="nope")


@pytest.mark.parametrize("objective", ["paper", "curve"])
@pytest.mark.parametrize("mod", [8, 16])
def test_knapsack_is_the_unaligned_control_of_gac(objective, mod):
    """Same window, objective and budget; every integer dim is a candidate, so its value is <= gac's."""
    sites, curves, native = _sites_and_curves(4, TINY | {"gate": (200, 120)}, keep=0.7)
    prof = _profile(mod)
    gac = allocate("gac", sites, native, prof, curves, objective=objective)
    knap = allocate("knapsack", sites, native, prof, curves, objective=objective)
    assert knap.budget == gac.budget == gac.native_cost
    assert knap.cost <= knap.budget and gac.cost <= gac.budget
    assert knap.budget - knap.cost < knap.cost_unit  # fill pass: steps of one rank
    assert knap.cost_unit == min(r.shape[0] + r.shape[1] for r in knap.sites if not r.dense)
    assert gac.pct_aligned == 100.0
    assert knap.pct_aligned < 100.0  # alignment is really off
    for r in knap.sites:  # the same window as gac
        s = next(x for x in sites if x.name == r.name)
        lo, hi = _expected_range(r.native, mod, 4, s.min_dim, s.max_dim - 1)
        assert r.dense or lo <= r.dim <= hi
    # The DP is exact and the candidates are a superset: its objective is never worse than gac's.
    from gac.allocation.strategies import _linear_loss, _sensitivity

    def value(alloc):
        if objective == "curve":
            return alloc.loss
        tot = 0.0
        for s in sites:
            lo, hi = _expected_range(native[s.name], mod, 4, s.min_dim, s.max_dim - 1)
            loss = lambda ds, c=curves[s.name]: c[np.minimum(ds, len(c) - 1)]  # noqa: E731
            sens = _sensitivity(s, loss, 1.0, lo, hi, True)
            tot += float(_linear_loss(s, sens, native[s.name])(alloc.dims[s.name])[0])
        return tot

    assert value(knap) <= value(gac) + 1e-9 * max(1.0, abs(value(gac)))


def test_paper_objective_moves_parameters_to_sensitive_sites():
    """Two sites, one with a steep loss curve: the paper value shifts params to it, within the window."""
    a, b = lowrank_site("a", 512, 512), lowrank_site("b", 512, 512)
    grid = np.arange(a.max_dim + 1, dtype=float)
    curves = {"a": 10.0 * (a.max_dim - grid), "b": 0.1 * (b.max_dim - grid)}  # a is 100x as sensitive
    native = {"a": 150, "b": 150}
    prof = _profile(8)
    gac = allocate("gac", [a, b], native, prof, curves)
    assert gac.objective == "paper:loss_curve"
    # default window 150 ± 8: aligned candidates 144 and 152; a rounds up, b pays by rounding down
    assert (gac.dims["a"], gac.dims["b"]) == (152, 144)
    wide = allocate("gac", [a, b], native, prof, curves, window=4)
    # window 150 ± 32 = 118..182: a takes the top multiple (176), b the bottom (120): 296 <= 300 ranks
    # (176 + 128 = 304 would exceed the budget)
    assert (wide.dims["a"], wide.dims["b"]) == (176, 120)
    assert gac.cost <= gac.budget and wide.cost <= wide.budget
    # With a fractional window of 2% (±3 ranks) neither site can move more than that.
    narrow = allocate("knapsack", [a, b], native, prof, curves, window=0.02)
    assert all(abs(narrow.dims[n] - 150) <= 3 for n in "ab")
    assert narrow.dims["a"] > 150 > narrow.dims["b"]


def test_gac_latency_at_decode_keeps_more_sites_dense():
    """At one token row a factorized site pays a second launch for few saved bytes: under the same
    budget and a wide window, ``gac-latency`` keeps more sites dense than at a 1024-token prefill."""
    sites, curves, native = _sites_and_curves(4, LLAMA3_8B)
    prof = _profile(8)
    dense = {}
    for tokens in (1024, 1):
        lat = allocate(
            "gac-latency", sites, native, prof, curves, objective="curve", tokens=tokens, window=0.5
        )
        assert lat.cost <= lat.budget and lat.loss <= lat.native_loss * (1 + 1e-9)
        dense[tokens] = sum(lat.dims[s.name] >= s.max_dim for s in sites)
    assert dense[1] > dense[1024]
