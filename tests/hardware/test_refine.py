"""``gac profile --refine`` in a synthetic measurement world (no real timing), plus one CPU run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gac.cli import main
from gac.errors import GacError
from gac.hardware import refine as rf
from gac.hardware.profile import load_profile
from gac.hardware.profiler import _flops_fn, build_profile, plans
from gac.nn import FactorizedLinear, replace_module
from gac.testing import tiny_model

PEAK = 2e12  # FLOP/s of the synthetic GPU
CLIFF = (96, 112)  # N = 4 (mod 8) runs 3x slower in here; the profile's curves never see it
RANK = 100


def slow(d: int) -> float:
    return 3.0 if d % 8 == 4 and CLIFF[0] <= d <= CLIFF[1] else 1.0


def world():
    """Ground truth: every op at full speed, except output dims in the hidden cliff."""
    cpu_plans = {p.op: p for p in plans(torch.device("cpu"), quick=False)}
    calls: list[tuple[str, int]] = []

    def point(op: str, d: int) -> float:
        calls.append((op, d))
        t = _flops_fn(cpu_plans[op])(d) / PEAK * 1e3
        return t * (slow(d) if op in ("gemm_n", "lowrank_r", "gemv") else 1.0)

    def gemm(m: int, k: int, n: int) -> float:
        return 2.0 * m * k * n / PEAK * 1e3 * slow(n)

    return point, gemm, calls


def coarse_profile():
    """A 'measured' CPU profile built from the world at the CPU plans' windows (context and all)."""
    point, _, _ = world()
    return build_profile(dtype="float32", device="cpu", measure=point, command="test")


def factorized_model():
    model = tiny_model("llama")
    fqn = "model.layers.0.mlp.down_proj"  # 200 -> 120
    old = model.get_submodule(fqn)
    replace_module(model, fqn, FactorizedLinear(old.in_features, RANK, old.out_features))
    return model


def test_model_gemms_dedupe_and_factorized_pair():
    gemms = rf.model_gemms(factorized_model(), tokens=64)
    shapes = {(g.shape, g.op, g.role) for g in gemms}
    assert ((64, 200, RANK), "lowrank_r", "lowrank_v") in shapes
    assert ((64, RANK, 120), "gemm_n", "lowrank_u") in shapes
    assert ((64, 120, 250), "gemm_n", "dense") in shapes  # lm_head
    dense_down = next(g for g in gemms if g.shape == (64, 200, 120))
    assert dense_down.fqns == ["model.layers.1.mlp.down_proj"]  # layer 0's is factorized
    q = next(g for g in gemms if g.shape == (64, 120, 120))
    assert len(q.fqns) == 4  # q and o of both layers: one shape, one row
    assert len({(g.shape, g.op, g.role) for g in gemms}) == len(gemms)
    assert sum(len(g.fqns) for g in gemms) == 2 * 7 + 1 + 1  # 14 projections, +1 factor, lm_head


def test_disagreement_removes_the_global_scale():
    prof = coarse_profile()
    gemms = rf.model_gemms(tiny_model("llama"), tokens=64)
    pred = [rf.predicted_ms(prof, g) for g in gemms]
    d = rf.disagreement(prof, gemms, [5.0 * p for p in pred])
    assert d["scale"] == pytest.approx(5.0)
    assert max(r["score"] for r in d["rows"]) == pytest.approx(0.0, abs=1e-9)
    assert d["measured_total_ms"] == pytest.approx(d["scaled_predicted_total_ms"])


def test_refine_finds_the_cliff_and_fixes_the_prediction(tmp_path):
    prof = coarse_profile()
    point, gemm, calls = world()
    model = factorized_model()
    before_curve = list(prof.ops["lowrank_r"].curve["dims"])
    assert prof.modulus("lowrank_r") == 1  # the coarse curve is flat: no cliff known
    res = rf.refine_profile(
        prof, model, 64, gemm, point, top=4, half_window=8, rounds=2, tol=0.1, model_spec="m"
    )
    # the worst GEMM is the first factor GEMM, at rank 100 (= 4 mod 8, in the cliff)
    worst = max(res.before["rows"], key=lambda r: r["score"])
    assert worst["gemm"].shape == (64, 200, RANK) and worst["score"] == pytest.approx(math.log(3), rel=1e-6)
    assert sorted(r["score"] for r in res.before["rows"])[-2] < 1e-9  # nothing else disagrees
    # only the op and dims of the half-window were measured, each once
    assert calls == [("lowrank_r", d) for d in range(RANK - 8, RANK + 9)]
    assert res.points_measured == 17
    c = res.profile.ops["lowrank_r"].curve
    assert c["dims"] == sorted(set(c["dims"])) == sorted(set(before_curve) | set(range(92, 109)))
    assert c["refined_dims"] == list(range(92, 109)) and [92, 108] in c["refined"]
    assert len(c["ms"]) == len(c["tflops"]) == len(c["efficiency"]) == len(c["window"]) == len(c["dims"])
    assert all(
        t == pytest.approx(PEAK / 1e12 / slow(d), rel=1e-3)
        for d, t in zip(c["dims"], c["tflops"], strict=True)
    )
    # the refined profile prices that GEMM within the tolerance; the rule was re-distilled
    after = {r["gemm"].shape: r["score"] for r in res.after["rows"]}
    assert max(after.values()) < 0.1
    assert res.profile.modulus("lowrank_r") == 8
    assert res.profile.efficiency("lowrank_r", RANK) == pytest.approx(
        101 / 300, rel=1e-3
    )  # 101 is fast in this world
    assert prof.modulus("lowrank_r") == 1 and prof.id == res.profile.id.removesuffix(
        "-refined"
    )  # input untouched
    assert res.stopped.startswith("round 2: every GEMM within tolerance")
    rec = res.profile.env["refinements"]
    assert len(rec) == 1 and rec[0]["op"] == "lowrank_r" and rec[0]["window"] == [92, 108]
    assert rec[0]["gemms"][0]["score_before"] > 1.0 > 0.1 > rec[0]["gemms"][0]["score_after"]
    # saved JSON loads; a second refinement with the same model measures nothing new
    path = tmp_path / "r.json"
    res.profile.save(path)
    again = load_profile(path)
    assert again.to_dict() == res.profile.to_dict()
    calls.clear()
    res2 = rf.refine_profile(again, model, 64, gemm, point)
    assert calls == [] and res2.points_measured == 0 and not res2.rounds
    assert res2.profile.id == again.id and res2.profile.id.count("-refined") == 1
    # still mispriced, but its window is measured already: nothing new, the profile unchanged
    res3 = rf.refine_profile(
        again, model, 64, lambda m, k, n: gemm(m, k, n) * (10.0 if n == RANK else 1.0), point
    )
    assert calls == [] and res3.stopped.startswith("round 1: nothing new to measure")
    assert res3.profile.to_dict() == again.to_dict()


def test_refine_merges_into_an_overlapping_window():
    prof = coarse_profile()
    point, gemm, calls = world()
    c = prof.ops["lowrank_r"].curve
    lo, hi = c["windows"][0]
    have = set(c["dims"])
    new = {d: 1.0 for d in range(hi - 3, hi + 6) if d not in have}
    merged = rf.merge_points(c, new, hi - 3, hi + 5, lambda d: 1e9)
    assert merged["windows"] == [[lo, hi + 5]] and set(merged["window"]) == {0}
    assert merged["dims"] == sorted(have | set(new))
    far = rf.merge_points(merged, {5: 1.0}, 3, 7, lambda d: 1e9)  # below every window: renumbered first
    assert far["windows"][0] == [3, 7] and far["dims"] == sorted(far["dims"]) and far["window"][0] == 0


def test_least_aligned_dim_picks_the_op():
    prof = coarse_profile()
    g = rf.Gemm(64, 100, 120, "gemm_n", "lowrank_u")
    assert rf.target_dim(prof, g) == ("gemm_k", 100)
    assert rf.target_dim(prof, rf.Gemm(64, 128, 100, "lowrank_r", "lowrank_v")) == ("lowrank_r", 100)
    assert rf.target_dim(prof, rf.Gemm(1, 128, 100, "gemm_n", "dense")) == ("gemv", 100)
    assert rf.target_dim(prof, rf.Gemm(64, 128, 128, "gemm_n", "dense")) == ("gemm_n", 128)


def test_refine_refuses_bad_input():
    point, gemm, _ = world()
    model = tiny_model("llama")
    with pytest.raises(GacError, match="not measured"):
        rf.refine_profile(load_profile("default"), model, 64, gemm, point)
    prof = coarse_profile()
    for kw, msg in (
        ({"top": 0}, "--top"),
        ({"half_window": -1}, "--half-window"),
        ({"rounds": 0}, "--rounds"),
    ):
        with pytest.raises(GacError, match=msg):
            rf.refine_profile(prof, model, 64, gemm, point, **kw)
    del prof.ops["lowrank_r"].curve["context"]
    with pytest.raises(GacError, match="no measurement context"):
        rf.refine_profile(prof, factorized_model(), 64, gemm, point)


@pytest.fixture
def cpu_profile(tmp_path):
    path = tmp_path / "p.json"
    coarse_profile().save(path)
    return path


@pytest.mark.parametrize(
    ("extra", "msg"),
    [
        (["--refine", "./nope"], "error: ./nope is not a model"),
        (["--refine", "tiny:nope"], "error: unknown tiny model family 'nope'"),
        (
            ["--refine", "tiny:llama", "--profile", "default"],
            "error: profile 'builtin-default-bfloat16' is not",
        ),
        (["--refine", "tiny:llama", "--top", "0"], "error: --top must be at least 1"),
        (["--refine", "tiny:llama", "--half-window", "-1"], "error: --half-window must be at least 0"),
        (["--refine", "tiny:llama", "--rounds", "0"], "error: --rounds must be at least 1"),
        (["--refine", "tiny:llama", "--quick"], "error: --refine and --quick do not go together"),
        (["--refine", "shape:gpt9"], "error: unknown model shape"),
        ([], "error: --profile is only used with --refine MODEL"),
        (["--refine", "tiny:llama", "--out", "exists.json"], "error: output exists.json already exists"),
    ],
)
def test_cli_refine_bad_input_one_line(extra, msg, cpu_profile, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exists.json").write_text("{}")
    argv = ["profile", "--device", "cpu", "--out", "new.json", "--profile", str(cpu_profile), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(msg) and "\n" not in err and "Traceback" not in err, err
    assert not (tmp_path / "new.json").exists()


def test_cli_refine_real_cpu_timing(cpu_profile, tmp_path):
    """End to end with real CPU timing: the synthetic profile disagrees with this CPU, so it refines."""
    out = tmp_path / "refined.json"
    argv = ["profile", "--refine", "tiny:llama", "--profile", str(cpu_profile), "--device", "cpu"]
    argv += ["--out", str(out), "--tokens", "16", "--rounds", "1", "--top", "1", "--half-window", "2"]
    assert main(argv) == 0
    p = load_profile(out)
    assert p.id.endswith("-refined") and len(p.env["refinements"]) == 1
    rec = p.env["refinements"][0]
    c = p.ops[rec["op"]].curve
    assert set(rec["points_added"]) <= set(c["refined_dims"]) <= set(c["dims"])
    assert all(rec["window"][0] <= d <= rec["window"][1] for d in rec["points_added"])
    assert out.with_suffix(".png").stat().st_size > 1000
    assert json.loads(out.read_text())["schema"] == "gac.profile/1"


def test_real_measurements_use_the_profile_context():
    """The CUDA path's plumbing, run on CPU: each op's point is built from ``curve.context``."""
    from gac.hardware.sweeps import op_point

    prof = coarse_profile()
    dev = torch.device("cpu")
    for op in ("gemm_n", "gemm_k", "gemv", "sdpa_head_dim", "lowrank_r"):
        old = prof.ops[op].curve["context"]  # other sizes than Config.cpu()'s, so the mapping shows
        ctx = {k: 1 if (op, k) == ("gemv", "M") else 9 + j for j, k in enumerate(old)}
        prof.ops[op].curve["context"] = ctx
        p = op_point("profile", rf.context_config(prof, op, dev), op, 21, "refine")
        assert all(p[k if k != "d" else "D"] == v for k, v in ctx.items()), (op, p)
        ms = rf.real_measure_point(prof, dev, torch.float32)(op, 21)
        assert ms is not None and ms > 0
    assert rf.real_measure_gemm(dev, torch.float32)(8, 24, 20) > 0
    rf.check_device(prof, dev)
    prof.env["gpu"] = "NVIDIA H200"
    with pytest.raises(GacError, match="measured on NVIDIA H200; this device is CPU"):
        rf.check_device(prof, dev)


# ----------------------------------------------------------------------------- a second world
# (from the first --refine on main): odd N and K 3x slower everywhere, a profile measured only at
# multiples of 8, and a factorized o_proj of rank 37, so that both GEMMs of the pair are mispriced.
PER_MS = 1e9  # FLOPs per ms at full speed
ODD_CONTEXT = {"gemm_n": {"M": 64, "K": 128}, "gemm_k": {"M": 64, "N": 128}, "lowrank_r": {"M": 32, "d": 128}}


def pen(x: int) -> float:
    return 3.0 if x % 2 else 1.0


def odd_gemm(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n / PER_MS * pen(n) * pen(k)


def odd_point(op: str, d: int) -> float:
    c = ODD_CONTEXT[op]
    if op == "gemm_n":
        return odd_gemm(c["M"], c["K"], d)
    if op == "gemm_k":
        return odd_gemm(c["M"], d, c["N"])
    return odd_gemm(c["M"], c["d"], d) + odd_gemm(c["M"], d, c["d"])


def multiples_of_8_profile():
    from gac.hardware.profile import OpRule, Profile

    p = Profile(id="synthetic-gpu", ops={}, measured=True, label="synthetic", dtype="float32")
    for op, ctx in ODD_CONTEXT.items():
        pts = {d: odd_point(op, d) for d in range(32, 129, 8)}
        c = rf.merge_points({"dims": [], "ms": [], "context": ctx}, pts, 32, 128, rf.flops_fn(op, ctx))
        c.update(refined=[], refined_dims=[])  # the profile's own sweep, not a refinement
        p.ops[op] = OpRule(curve=c)
        rf.redistil_op(p, op)
    return p


def odd_rank_model():
    m = tiny_model("llama")
    replace_module(m, "model.layers.0.self_attn.o_proj", FactorizedLinear(120, 37, 120))
    return m


def test_odd_world_refines_both_factor_gemms():
    prof, model = multiples_of_8_profile(), odd_rank_model()
    assert prof.ops["gemm_k"].class_efficiency["1"] == 1.0  # odd dims look fast
    calls: list[tuple[str, int]] = []

    def point(op: str, d: int) -> float:
        calls.append((op, d))
        return odd_point(op, d)

    res = rf.refine_profile(prof, model, 64, odd_gemm, point, top=4, half_window=8, rounds=3)
    worst = sorted(res.before["rows"], key=lambda r: -r["score"])[:2]
    assert {r["gemm"].shape for r in worst} == {(64, 120, 37), (64, 37, 120)}
    assert {op for op, _ in calls} == {"lowrank_r", "gemm_k"} and len(calls) == len(set(calls))
    assert all(29 <= d <= 45 and d not in (32, 40) for _, d in calls)  # dims on the curve are skipped
    for op in ("lowrank_r", "gemm_k"):
        c = res.profile.ops[op].curve
        assert c["windows"] == [[29, 128]] and c["dims"] == sorted(set(c["dims"]))  # joined its window
        assert res.profile.ops[op].class_efficiency["1"] < 0.5  # the odd-dim cliff, re-distilled
    assert max(r["score"] for r in res.after["rows"]) < 0.1
    assert res.profile.id == "synthetic-gpu-refined"
    again = rf.refine_profile(res.profile, model, 64, odd_gemm, lambda op, d: pytest.fail("measured again"))
    assert again.profile.to_dict() == res.profile.to_dict()


def test_an_update_that_fits_worse_is_rejected():
    prof, model = multiples_of_8_profile(), odd_rank_model()

    def liar(op: str, d: int) -> float:  # the new points exaggerate the cliff (10x, not 3x)
        return odd_point(op, d) * (10.0 / 3.0 if d % 2 else 1.0)

    res = rf.refine_profile(prof, model, 64, odd_gemm, liar, half_window=4)
    assert "rejected" in res.stopped and res.rounds and all(r["rejected"] for r in res.rounds)
    assert res.profile.to_dict() == prof.to_dict()  # unchanged: same id, curves and env


def test_gemms_of_multiples_of_64_are_never_refined():
    prof = coarse_profile()
    point, gemm, calls = world()
    model = tiny_model("llama", hidden=128, intermediate=256, heads=2, kv_heads=1)  # head_dim 64

    def odd_shape(m: int, k: int, n: int) -> float:  # gate/up run 3x slower: a shape effect
        return gemm(m, k, n) * (3.0 if (k, n) == (128, 256) else 1.0)

    res = rf.refine_profile(prof, model, 64, odd_shape, point)
    assert max(r["score"] for r in res.before["rows"]) > 1.0
    assert calls == [] and res.stopped.startswith("round 1: nothing new to measure")


@pytest.mark.gpu
def test_cli_refine_on_this_gpu(tmp_path):
    """On CUDA: refine this GPU's shipped profile against a tiny factorized-free model (a smoke run)."""
    if not load_profile(None, dtype="bfloat16").measured:
        pytest.skip("no shipped profile for this GPU")
    out = tmp_path / "refined.json"
    argv = ["profile", "--refine", "tiny:llama", "--device", "cuda", "--out", str(out)]
    argv += ["--tokens", "256", "--rounds", "1", "--top", "2", "--half-window", "2"]
    assert main(argv) == 0
    p = load_profile(out)
    assert p.measured and p.env["gpu"] == torch.cuda.get_device_name()
