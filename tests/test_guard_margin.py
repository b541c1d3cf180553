"""The latency guard's margin: an allocation must be predicted at least ``1 + m`` x dense at every serving
shape, ``m`` the latency model's measured error on the profile's GPU (or given), checked at the boundary,
resolved from the profile, validated, and carried through the config, the CLI, a plan and the saved model."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from gac.allocation import (
    DEFAULT_GUARD_MARGIN,
    GuardInfeasible,
    allocate,
    check_margin,
    resolve_margin,
    site_ms,
)
from gac.api import CompressConfig
from gac.cli import main
from gac.errors import GacError
from gac.hardware.latency import parse_serve
from gac.hardware.profile import default_profile, load_profile
from gac.sites import lowrank_site
from gac.testing import char_tokenizer, tiny_model

ROOT = Path(__file__).resolve().parents[1]
#: 5 us per GEMM launch, 1000 GB/s, a measured-looking profile with no margin of its own
PROF = dataclasses.replace(
    default_profile("bfloat16"), id="synthetic", measured=True, launch_us=5.0, copy_gbps=1000.0, aux_us=2.0
)
BIG = lowrank_site("big", 4096, 4096)
SERVE = parse_serve("decode:1")


def _speedup(d: int) -> float:
    t = SERVE[0].tokens
    return site_ms(PROF, BIG, BIG.max_dim, t) / site_ms(PROF, BIG, d, t)


def _boundary_rank() -> int:
    """The largest aligned rank of BIG predicted no slower than dense at one row (speedup just >= 1)."""
    return max(d for d in range(8, BIG.max_dim, 8) if _speedup(d) >= 1.0)


def test_margin_at_the_boundary():
    d = _boundary_rank()
    s0 = _speedup(d)
    assert 1.0 <= s0 < 1.01  # an allocation predicted at 1.00x dense
    curves = {"big": np.linspace(1.0, 0.0, BIG.max_dim + 1)}
    ok = allocate("gac", [BIG], {"big": d}, PROF, curves=curves, serve=SERVE, guard_margin=0.0)
    assert ok.dims == {"big": d} and ok.guard["margin"] == 0.0 and ok.worst_serve_speedup == pytest.approx(s0)
    # a margin above its clearance: the guard moves to a rank that clears 1 + m (one aligned step down,
    # the only one inside the default window that the budget allows) or refuses; never keeps 1.00x
    m = (s0 - 1.0) + 1e-3
    g = allocate("gac", [BIG], {"big": d}, PROF, curves=curves, serve=SERVE, guard_margin=m)
    assert g.dims["big"] < d and g.worst_serve_speedup >= 1.0 + m and g.guard["margin"] == m
    assert g.dims["big"] == d - 8 and _speedup(d - 8) >= 1.0 + m
    # a margin no candidate clears: refused, the message names the margin and the best speedup
    big_m = _speedup(d - 8) - 1.0 + 1e-3
    with pytest.raises(GuardInfeasible) as e:
        allocate("gac", [BIG], {"big": d}, PROF, curves=curves, serve=SERVE, guard_margin=big_m)
    assert f"at {1 + big_m:.3f}x dense (the guard's margin)" in str(e.value)
    assert e.value.shapes["decode_b1_kv512"] == pytest.approx(_speedup(d - 8))


def test_margin_is_whole_model_with_the_rest_of_the_model():
    """With the dense model's other launches (``other_ms``), 1 + m is the whole model's speedup."""
    d = _boundary_rank() - 64
    other = {"decode_b1_kv512": 0.2}
    dense = site_ms(PROF, BIG, BIG.max_dim, 1)
    whole = (other["decode_b1_kv512"] + dense) / (other["decode_b1_kv512"] + site_ms(PROF, BIG, d, 1))
    assert whole < _speedup(d)  # the other launches dilute the sites' gain
    m_ok, m_bad = whole - 1.0 - 1e-4, whole - 1.0 + 1e-4
    a = allocate("gac", [BIG], {"big": d}, PROF, serve=SERVE, other_ms=other, guard_margin=m_ok)
    assert a.dims == {"big": d} and a.worst_serve_speedup == pytest.approx(whole)
    b = None
    with contextlib.suppress(GuardInfeasible):
        b = allocate("gac", [BIG], {"big": d}, PROF, serve=SERVE, other_ms=other, guard_margin=m_bad)
    assert b is None or (b.dims["big"] < d and b.worst_serve_speedup >= 1.0 + m_bad)


def test_margin_resolution_and_validation():
    assert resolve_margin(PROF) == (DEFAULT_GUARD_MARGIN, "default (gac.allocation.DEFAULT_GUARD_MARGIN)")
    assert resolve_margin(PROF, 0.02) == (0.02, "given")
    own = dataclasses.replace(PROF, latency_fit={"guard_margin": {"value": 0.03, "source": "grid X"}})
    assert resolve_margin(own) == (0.03, "profile synthetic: grid X") and resolve_margin(own, 0.0)[0] == 0.0
    for bad in (-0.01, 1.0, 1.5, math.nan, math.inf, "0.1", True, None):
        with pytest.raises(GacError, match="guard margin must be a number in"):
            check_margin(bad)
    broken = dataclasses.replace(PROF, latency_fit={"guard_margin": {"value": -1}})
    with pytest.raises(GacError, match="latency_fit.guard_margin"):
        resolve_margin(broken)
    # unguarded strategies and --allow-slower record no margin
    a = allocate("gac", [BIG], {"big": 1024}, PROF, serve=SERVE, allow_slower=True, guard_margin=0.5)
    assert "margin" not in a.guard


def test_shipped_margins_are_the_committed_grids_worst_optimism():
    """The shipped profiles' margins are what benchmarks/tools/guard_margin.py measures on the committed
    grids they name (predicted / measured speedup, as gac report computes it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "guard_margin_tool", ROOT / "benchmarks/tools/guard_margin.py"
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for pid, grid in (("h100-bfloat16", "h100/speed-guarded"), ("h200-bfloat16", "h200/speed-final")):
        m, src = resolve_margin(load_profile(pid))
        rows = tool.grid_rows(ROOT / "benchmarks/results" / grid)
        worst = max(r["ratio"] for r in rows)
        assert m == math.ceil((worst - 1.0) * 1000 - 1e-9) / 1000 and grid in src
        assert all(r["ratio"] <= 1.0 + m for r in rows)  # every committed point within the margin
    assert (
        resolve_margin(load_profile("h100-bfloat16"))[0] == 0.071
    )  # with the GEMV and prefill attention fields


def test_config_round_trip_and_bad_values():
    c = CompressConfig(compressor="svd", guard_margin=0.05)
    assert CompressConfig.from_dict(c.to_dict()) == c and c.to_dict()["guard_margin"] == 0.05
    assert CompressConfig().guard_margin is None
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(GacError, match="guard margin"):
            CompressConfig(guard_margin=bad)


def test_plan_takes_guard_margin(tmp_path):
    from gac.plans.schema import load_plan

    text = """
[plan]
name = "m"
device = "cpu"
[axes]
models = ["tiny:llama"]
compressors = ["svd"]
ratios = [0.9]
align = ["gac"]
[compress]
guard_margin = {m}
"""
    p = tmp_path / "p.toml"
    p.write_text(text.format(m="0.02"))
    plan = load_plan(p)
    cell = next(c for c in plan.cells() if c.compressor == "svd")
    assert plan.compress_config(cell).guard_margin == 0.02
    p.write_text(text.format(m="1.5"))
    with pytest.raises(GacError, match="guard margin must be a number in"):
        load_plan(p)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("margin")
    tiny_model("llama").save_pretrained(root / "tiny")
    char_tokenizer().save_pretrained(root / "tiny")
    prof = dataclasses.replace(PROF, id="synthetic-margin", launch_us=20.0, copy_gbps=1.0, aux_us=0.5)
    prof.save(root / "p.json")
    return root


def _compress(root: Path, out: Path, *extra: str) -> int:
    return main(["compress", str(root / "tiny"), "-c", "svd", "-r", "0.5", "--profile", str(root / "p.json"),
                 "--serve", "decode:1x64,prefill:1x16", "--out", str(out), *extra])  # fmt: skip


@pytest.mark.parametrize("bad", ["-0.1", "1", "2.5"])
def test_cli_bad_margin_is_one_line_before_any_work(tiny, capsys, bad):
    out = tiny / f"bad{bad}"
    assert _compress(tiny, out, "--guard-margin", bad) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and err[0].startswith("error: guard margin must be a number in [0, 1)")
    assert not out.exists()


def test_cli_margin_saved_and_shown(tiny, capsys):
    out = tiny / "m0"
    assert _compress(tiny, out, "--guard-margin", "0.01") == 0
    cfg = json.loads((out / "gac_config.json").read_text())
    assert cfg["compress_config"]["guard_margin"] == 0.01
    assert cfg["guard"]["margin"] == 0.01 and cfg["guard"]["margin_source"] == "given"
    assert min(cfg["predicted_serve"].values()) >= 1.01
    capsys.readouterr()
    assert main(["analyze", str(out), "--profile", str(tiny / "p.json")]) == 0
    cap = capsys.readouterr()
    text, err = " ".join(cap.out.split()), " ".join(cap.err.split())
    assert "guarded (every shape predicted at least 1.010x dense: margin 0.010)" in text
    # the profile's own margin (it records none: the default), said before the analysis
    assert "latency guard margin: 0.080 (--align gac needs 1.080x dense; default" in err
