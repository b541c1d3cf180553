"""gac profile --refine: a synthetic GPU whose odd dims are 3x slower, and a profile that never measured them."""

from __future__ import annotations

import json

import pytest

from gac.errors import GacError
from gac.hardware.profile import OpRule, Profile, load_profile
from gac.hardware.refine import add_window, model_gemms, refine_profile, score
from gac.surgery.factorized import FactorizedLinear, replace_module
from gac.testing import tiny_model

PER_MS = 1e9  # FLOPs per ms of the synthetic GPU at full speed (1 TFLOP/s)
CONTEXT = {"gemm_n": {"M": 64, "K": 128}, "gemm_k": {"M": 64, "N": 128}, "lowrank_r": {"M": 32, "d": 128}}


def pen(x: int) -> float:
    return 3.0 if x % 2 else 1.0  # the cliff the profile does not know


def truth_gemm(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n / PER_MS * pen(n) * pen(k)


def truth_point(op: str, d: int) -> float:
    c = CONTEXT[op]
    if op == "gemm_n":
        return truth_gemm(c["M"], c["K"], d)
    if op == "gemm_k":
        return truth_gemm(c["M"], d, c["N"])
    return truth_gemm(c["M"], c["d"], d) + truth_gemm(c["M"], d, c["d"])


def coarse_profile() -> Profile:
    """Measured only at multiples of 8: odd dims look as fast as any other."""
    p = Profile(id="synthetic-gpu", ops={}, measured=True, label="synthetic", dtype="float32")
    for op, ctx in CONTEXT.items():
        p.ops[op] = OpRule(curve={"context": ctx, "lookahead": 64})
        add_window(p, op, {d: truth_point(op, d) for d in range(32, 129, 8)})
        p.ops[op].curve["refined_windows"] = []  # the coarse sweep is the profile's own, not a refinement
    return p


def model_with_odd_rank():
    m = tiny_model("llama")  # hidden 120, intermediate 200
    replace_module(m, "model.layers.0.self_attn.o_proj", FactorizedLinear(120, 37, 120))
    return m


def test_finds_the_cliff_measures_only_around_it_and_learns_it():
    prof, model = coarse_profile(), model_with_odd_rank()
    calls: list[tuple[str, int]] = []

    def point(op: str, d: int) -> float:
        calls.append((op, d))
        return truth_point(op, d)

    before = score(
        prof, model_gemms(model, 64), {g.key: truth_gemm(g.m, g.k, g.n) for g in model_gemms(model, 64)}
    )
    assert {(r["gemm"].k, r["gemm"].n) for r in before[:2]} == {
        (120, 37),
        (37, 120),
    }  # the rank-37 pair is worst
    new, hist = refine_profile(prof, model, truth_gemm, point, tokens=64, top=4, half_window=8, rounds=3)
    assert calls and {op for op, _ in calls} == {"lowrank_r", "gemm_k"}
    assert all(29 <= d <= 45 for _, d in calls) and len(calls) == len(set(calls))
    assert not any(d % 8 == 0 and 32 <= d <= 128 for _, d in calls)  # dims on the curve are not re-measured
    for op in ("lowrank_r", "gemm_k"):
        c = new.ops[op].curve
        assert [29, 45] in c["refined_windows"]
        w = max(c["window"])
        dims = [d for d, wi in zip(c["dims"], c["window"], strict=True) if wi == w]
        assert dims == sorted(set(dims))
        assert new.ops[op].class_efficiency["1"] < 0.5  # the odd-dim cliff, re-distilled
    rec = new.env["refinements"][-1]
    assert rec["max_score_before"] > 0.5 and rec["max_score_after"] < 0.1
    assert hist[0]["total_score_after"] < hist[0]["total_score_before"]
    assert (
        new.id == "synthetic-gpu-refined" and prof.ops["gemm_k"].class_efficiency["1"] == 1.0
    )  # input untouched
    # a second refinement against the same model has nothing left to learn
    again, hist2 = refine_profile(
        new, model, truth_gemm, lambda op, d: pytest.fail("measured again"), tokens=64
    )
    assert again.id == "synthetic-gpu-refined" and hist2[-1]["stopped"]


def test_rejects_an_update_that_fits_worse():
    prof, model = coarse_profile(), model_with_odd_rank()
    # the curve's new points exaggerate the cliff (odd dims 10x, not 3x): the new rules explain the model worse
    liar = lambda op, d: truth_point(op, d) * (10.0 / 3.0 if d % 2 else 1.0)  # noqa: E731
    new, hist = refine_profile(prof, model, truth_gemm, liar, tokens=64, top=4, half_window=4)
    assert "rejected" in hist[-1]["stopped"] and new.id == "synthetic-gpu"
    assert new.ops["lowrank_r"].curve["dims"] == prof.ops["lowrank_r"].curve["dims"]


def test_refine_bad_input():
    model = model_with_odd_rank()
    with pytest.raises(GacError, match="not measured"):
        refine_profile(load_profile("default"), model, truth_gemm, truth_point)
    with pytest.raises(GacError, match="top >= 1"):
        refine_profile(coarse_profile(), model, truth_gemm, truth_point, top=0)


def test_saved_refined_profile_loads(tmp_path):
    new, _ = refine_profile(coarse_profile(), model_with_odd_rank(), truth_gemm, truth_point, tokens=64)
    p = tmp_path / "refined.json"
    new.save(p)
    back = load_profile(str(p))
    assert (
        back.id == new.id and back.ops["lowrank_r"].class_efficiency == new.ops["lowrank_r"].class_efficiency
    )
    assert json.loads(p.read_text())["env"]["refinements"][-1]["tokens"] == 64


@pytest.mark.parametrize(
    "args, msg",
    [
        (["--refine", "shape:llama3-8b:1:8", "--profile", "default"], "not measured"),
        (
            ["--refine", "shape:llama3-8b:1:8", "--profile", "h200-bfloat16", "--top", "0"],
            "--top must be >= 1",
        ),
        (["--refine", "shape:llama3-8b:1:8", "--quick"], "does not take --quick"),
        (["--profile", "h200-bfloat16"], "use it with --refine"),
        (["--refine", "shape:gpt9", "--profile", "h200-bfloat16"], "unknown model shape"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, capsys, args, msg):
    from gac.cli import main

    out = tmp_path / "p.json"
    assert main(["profile", "--out", str(out), "--device", "cpu", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and msg in err[0] and not out.exists()
