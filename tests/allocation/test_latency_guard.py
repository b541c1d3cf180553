"""The latency guard of ``--align gac`` on synthetic sites and a synthetic profile (pure numpy)."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from gac.allocation import GuardInfeasible, allocate, site_ms
from gac.hardware.latency import parse_serve, serve_str
from gac.hardware.profile import default_profile
from gac.sites import lowrank_site

#: a measured-looking profile: 5 us per GEMM launch, 1000 GB/s: a 64x64 weight's second launch
#: costs far more than its bytes save, a 4096x4096 weight's bytes pay for it
PROF = dataclasses.replace(
    default_profile("bfloat16"), id="synthetic", measured=True, launch_us=5.0, copy_gbps=1000.0, aux_us=2.0,
    latency_fit={"guard_margin": {"value": 0.0, "source": "synthetic: the model is exact here"}},
)  # fmt: skip
BIG = lowrank_site("big", 4096, 4096)
SMALL = lowrank_site("small", 64, 64)
CURVES = {
    "big": np.linspace(1.0, 0.0, BIG.max_dim + 1) * 10,  # sensitive
    "small": np.linspace(1.0, 0.0, SMALL.max_dim + 1) * 1e-6,  # all but free to compress
}


def test_slow_site_stays_dense():
    serve = parse_serve("decode:1")
    native = {"big": 1696, "small": 24}  # aligned, so the budget is spent exactly
    free = allocate("gac", [BIG, SMALL], native, PROF, curves=CURVES, serve=serve, allow_slower=True)
    assert free.dims == native  # today's gac: both factorized...
    assert free.guard["slower"] == ["decode_b1_kv512"] and free.worst_serve_speedup < 1.0
    assert any("predicted slower than dense at decode_b1_kv512" in n for n in free.notes)
    g = allocate("gac", [BIG, SMALL], native, PROF, curves=CURVES, serve=serve)
    assert g.dims["small"] == SMALL.max_dim  # ...the guard keeps the slow one dense
    assert g.dims["big"] < native["big"] and g.dims["big"] % 8 == 0  # and pays for it in the big site
    assert g.cost <= g.budget == free.budget
    assert g.guard == {"guarded": True, "allow_slower": False, "slower": [], "margin": 0.0,
                       "margin_source": "profile synthetic: synthetic: the model is exact here"}  # fmt: skip
    t = serve[0].tokens
    total = sum(site_ms(PROF, s, g.dims[s.name], t) for s in (BIG, SMALL))
    assert total <= sum(site_ms(PROF, s, s.max_dim, t) for s in (BIG, SMALL))
    assert g.serve[0]["speedup"] >= 1.0


def test_infeasible_budget_names_the_shapes():
    with pytest.raises(GuardInfeasible) as e:
        allocate(
            "gac", [SMALL], {"small": 24}, PROF, curves=CURVES, serve=parse_serve("decode:1,prefill:1x16")
        )
    assert set(e.value.shapes) == {"decode_b1_kv512", "prefill_b1_s16"}
    assert all(v < 1.0 for v in e.value.shapes.values())
    assert "cannot be met without a slowdown at decode_b1_kv512" in str(e.value)


def test_other_strategies_record_predictions_without_guard():
    serve = parse_serve("decode:1,prefill:8x512")
    a = allocate("none", [BIG, SMALL], {"big": 1696, "small": 24}, PROF, serve=serve)
    assert [r["point"] for r in a.serve] == ["decode_b1_kv512", "prefill_b8_s512"]
    assert a.guard["guarded"] is False and a.dims == {"big": 1696, "small": 24}


@pytest.mark.parametrize("seed", range(6))
def test_guard_is_feasible_whenever_brute_force_is(seed):
    """On small random problems (two shapes), the guard returns an allocation that is feasible by the
    model whenever one exists among the candidates, and refuses only when none does."""
    rng = np.random.default_rng(seed)
    sites = [lowrank_site(f"s{i}", int(o), int(k)) for i, (o, k) in
             enumerate(rng.choice([64, 256, 1024, 2048, 4096], size=(4, 2)))]  # fmt: skip
    native = {s.name: int(s.max_dim * rng.uniform(0.5, 0.9)) // 8 * 8 for s in sites}
    curves = {s.name: np.linspace(1.0, 0.0, s.max_dim + 1) * rng.uniform(0.1, 10) for s in sites}
    serve = parse_serve("decode:1,prefill:1x128")
    budget = sum(s.cost(native[s.name]) for s in sites)

    def ok(dims):
        return all(
            sum(
                site_ms(PROF, s, dims[s.name], p.tokens) - site_ms(PROF, s, s.max_dim, p.tokens)
                for s in sites
            )
            <= 1e-15
            for p in serve
        )

    from gac.allocation.strategies import _candidates

    cands = [_candidates(PROF, s, native[s.name], keep_dense=True) for s in sites]
    exists = any(
        ok(d) and sum(s.cost(d[s.name]) for s in sites) <= budget
        for d in (dict(zip([s.name for s in sites], c, strict=True)) for c in itertools.product(*cands))
    )
    try:
        g = allocate("gac", sites, native, PROF, curves=curves, serve=serve)
    except GuardInfeasible:
        assert not exists
        return
    assert ok(g.dims) and g.cost <= budget


def test_serve_syntax_round_trips():
    s = "prefill:1x128,prefill:8x2048,decode:1,decode:16x4096"
    pts = parse_serve(s)
    assert [p.key for p in pts] == [
        "prefill_b1_s128",
        "prefill_b8_s2048",
        "decode_b1_kv512",
        "decode_b16_kv4096",
    ]
    assert parse_serve(serve_str(pts)) == pts
    assert len(parse_serve(None)) == 9  # the default grid: 2 x 3 prefill + 3 decode
