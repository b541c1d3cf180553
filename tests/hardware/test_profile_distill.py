"""Rule discovery on synthetic curves, profile building and the shipped measured profiles."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.hardware.profile import OPS, load_profile, shipped_profiles
from gac.hardware.profiler import Curve, OpPlan, build_profile, discover_rule, redistil, sweep
from gac.hardware.sweeps import Config


def period(m: int, slow: float = 3.0, boundary: int | None = None, after: float = 1.5):
    """ms(d): proportional to d, ``slow`` times slower off multiples of m, ``after`` past a boundary."""

    def f(op: str, d: int) -> float:
        t = d * 1e-3 * (1.0 if d % m == 0 else slow)
        if boundary is not None and d > boundary:
            t *= after
        return t

    return f


def test_planted_cliff_mod8_refines_to_stride1():
    curve, refined, failed = sweep("gemm_n", [(1000, 1064)], period(8), stride=5)
    assert refined and not failed
    assert all(1 < b - a <= 5 for a, b in refined)
    # stride-1 refinement happened: consecutive dims inside the refined intervals
    a, b = refined[0]
    assert all(d in curve.dims for d in range(a, b + 1))
    rule = discover_rule(curve)
    assert rule["modulus"] == 8
    assert rule["class_efficiency"]["1"] == pytest.approx(1 / 3, rel=0.02)
    assert rule["class_efficiency"]["8"] == pytest.approx(1.0)
    cl = [c for c in rule["cliffs"] if c["kind"] == "alignment"]
    assert cl and all(c["fast_dim"] % 8 == 0 and c["ratio"] == pytest.approx(3.0, rel=0.01) for c in cl)


def test_period16_case():
    curve, refined, _ = sweep("sdpa_head_dim", [(64, 160)], period(16, slow=2.5), stride=3)
    rule = discover_rule(curve)
    assert refined and rule["modulus"] == 16
    # a dim of class 8 costs 2.5x, minus the padding to the next multiple of 16
    assert 0.4 < rule["class_efficiency"]["8"] < 0.45


def test_template_boundary_case():
    """All dims past 128 run 1.5x slower per unit of work: a boundary, not a misalignment."""
    dims = list(range(96, 193))
    f = period(8, boundary=128)
    rule = discover_rule(Curve(dims, [f("x", d) for d in dims], [0] * len(dims)))
    assert rule["modulus"] == 8
    b = [c for c in rule["cliffs"] if c["kind"] == "boundary"]
    assert b == [
        {"dim": 128, "next": 136, "ratio": pytest.approx(1.5 * 128 / 128, rel=0.01), "kind": "boundary"}
    ]


def test_flat_curve_and_empty():
    dims = list(range(50, 80))
    rule = discover_rule(Curve(dims, [d * 1e-3 for d in dims], [0] * len(dims)))
    assert rule["modulus"] == 1 and rule["cliffs"] == []
    with pytest.raises(GacError, match="empty curve"):
        discover_rule(Curve([], [], []))


def test_noise_exception_is_tolerated_and_listed():
    dims = list(range(800, 1100))
    ms = [d * 1e-3 * (1.0 if d % 8 == 0 else 3.0) for d in dims]
    ms[dims.index(904)] *= 1.2  # one noisy multiple of 8 among > 10 of its class
    rule = discover_rule(Curve(dims, ms, [0] * len(dims)))
    assert rule["modulus"] == 8
    assert [e["dim"] for e in rule["rule_evidence"]["exceptions"]] == [904]


def test_build_profile_roundtrip_with_fake_measure(tmp_path):
    cfg = Config.cpu()
    plans = [OpPlan(op, [(40, 72)], cfg, {"fake": True}) for op in OPS]
    prof = build_profile(
        dtype="bfloat16",
        device="cpu",
        measure=period(8),
        op_plans=plans,
        results_dir=tmp_path,
        command="test",
    )
    assert prof.measured and prof.env["gpu"] == "CPU"
    for op in OPS:
        assert prof.modulus(op) == 8
        r = prof.rule(op)
        assert r.curve["refined"] and len(r.curve["dims"]) == len(r.curve["efficiency"])
    assert prof.repair_target("lowrank_r", 61) == 64
    assert prof.penalty("gemm_n", 61) == pytest.approx(3.0 * 61 / 64, rel=1e-3)  # padding to 64 included
    path = tmp_path / "p.json"
    prof.save(path)
    q = load_profile(path)
    assert q.to_dict() == prof.to_dict()
    assert redistil(q).to_dict()["ops"]["gemm_n"]["rule"] == q.to_dict()["ops"]["gemm_n"]["rule"]
    assert (tmp_path / "profile-bfloat16.jsonl").read_text().count('"point"') > 5 * 10


def test_shipped_h200_profiles():
    stems = {p.stem for p in shipped_profiles()}
    assert {"h200-bfloat16", "h200-float16"} <= stems
    for dt in ("bfloat16", "float16"):
        p = load_profile(None, dtype=dt, gpu="NVIDIA H200")
        assert p.measured and p.dtype == dt and p.env["gpu"] == "NVIDIA H200"
        assert set(p.ops) == set(OPS)
        # the reference cliffs: misaligned GEMM N/K, SDPA head_dim and low-rank r are far slower than %8
        for op in ("gemm_n", "gemm_k", "sdpa_head_dim", "lowrank_r"):
            ce = p.rule(op).class_efficiency
            assert ce["1"] < 0.5 < 0.9 < ce["8"], (op, ce)
            assert p.modulus(op) % 8 == 0
        assert p.modulus("gemm_n") == 8
    # unknown GPU: the labelled built-in default
    assert not load_profile(None, gpu="Imaginary GPU").measured
    assert torch.__version__  # profiles load without CUDA
