"""The per-grid-point latency model (gac.hardware.latency) and the profile's launch constants."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gac.errors import GacError
from gac.hardware.latency import Point, fit_launch, launches, predict, skeleton
from gac.hardware.profile import (
    DEFAULT_COPY_GBPS,
    DEFAULT_LAUNCH_US,
    Profile,
    default_profile,
    load_profile,
)
from gac.nn import FactorizedLinear, replace_module
from gac.nn.fused import fuse_projections_
from gac.testing import tiny_model

ROOT = Path(__file__).resolve().parents[2]


def _prof(launch_us: float = 5.0, copy_gbps: float = 4500.0, aux_us: float = 2.0) -> Profile:
    p = default_profile("bfloat16")
    p.launch_us, p.copy_gbps, p.aux_us = launch_us, copy_gbps, aux_us
    return p


def _gemms(model, point=Point("decode", 1, kv=64)) -> int:
    return predict(model, _prof(), point)["gemm_launches"]


def _factorize(model, fqn: str, rank: int) -> None:
    lin = model.get_submodule(fqn)
    replace_module(model, fqn, FactorizedLinear(lin.in_features, rank, lin.out_features))


def test_launch_counting_fused_factorized_dense():
    m = tiny_model()  # 2 layers, 7 projections each, misaligned dims (hidden 120, MLP 200)
    assert _gemms(m) == 2 * 7 + 1  # + lm_head
    _factorize(m, "model.layers.0.self_attn.q_proj", 13)
    assert _gemms(m) == 2 * 7 + 2  # a factorized layer is two launches
    fuse_projections_(m)
    # per layer: q/k/v first stages one launch, o, gate/up one launch, down; + q's own u factor
    assert _gemms(m) == 2 * 4 + 1 + 1
    d = tiny_model()
    fuse_projections_(d)
    assert _gemms(d) == 2 * 4 + 1  # a dense slice of a fused group launches nothing


def test_sites_on_the_fused_low_rank_kernel_are_one_launch_where_their_row_class_is():
    from gac.runtime.lowrank_fused import decode_sites, switch_

    m = tiny_model()
    for li in range(2):
        for p in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.down_proj"):
            _factorize(m, f"model.layers.{li}.{p}", 11)
    fuse_projections_(m)
    dec = Point("decode", 1, kv=64)
    # per layer: q/k/v first stage + q's u + k's u, o (2), gate/up (1), down (2) = 8; + lm_head
    assert _gemms(m, dec) == 2 * 8 + 1
    before = predict(m, _prof(), dec)
    for _, mod, _ in decode_sites(m):  # the kernel measured faster at 1 row only
        switch_(mod, {1: [4, 1024, 4, 1024, 4, 1, 8], 16: None})
    after = predict(m, _prof(), dec)
    assert after["gemm_launches"] == 2 * 4 + 1  # each site one launch, as many as dense
    # the same bytes, four fewer fixed costs per layer
    assert after["ms"] == pytest.approx(before["ms"] - 2 * 4 * 5.0e-3, rel=1e-9)
    assert _gemms(m, Point("decode", 16, kv=64)) == 2 * 8 + 1  # 16 rows: the existing path
    assert _gemms(m, Point("prefill", 1, seq=32)) == 2 * 8 + 1
    # a profile that knows the kernel prices its launches with the kernel's own fit
    p = _prof()
    p.fused_lowrank = {"launch_us": 7.0, "gbps": 2000.0, "rows": [1]}
    own = [x for x in launches(m, p, dec) if x.kind == "gemm" and x.fixed_us == 7.0]
    assert len(own) == 2 * 3  # the three switched sites of each layer (q/k/v, o, down)
    assert all(x.byte_ms == pytest.approx(x.bytes / 2000e9 * 1e3) for x in own)
    assert predict(m, p, dec)["ms"] > after["ms"]  # a slower kernel than one GEMM launch at copy bandwidth
    assert not [x for x in launches(m, p, Point("decode", 16, kv=64)) if x.fixed_us == 7.0]


def test_fused_launch_costs_the_concatenated_gemm():
    m = tiny_model()
    fuse_projections_(m)
    ls = [x for x in launches(m, _prof(), Point("prefill", 2, seq=16)) if x.name.endswith("fused_q_k_v")]
    assert len(ls) == 2  # one per layer
    w = m.model.layers[0].self_attn.fused_q_k_v.weight
    assert ls[0].flops == 2.0 * 32 * w.shape[0] * w.shape[1]


def test_more_bytes_more_time():
    m, p = tiny_model(), _prof()
    dec = [
        predict(m, p, Point("decode", b, kv=kv))["ms"] for b, kv in ((1, 64), (1, 512), (8, 512), (64, 512))
    ]
    assert dec == sorted(dec) and dec[0] < dec[-1]
    pre = [predict(m, p, Point("prefill", b, seq=s))["ms"] for b, s in ((1, 16), (1, 128), (8, 128))]
    assert pre == sorted(pre) and pre[0] < pre[-1]
    big = tiny_model(intermediate=400)
    assert predict(big, p, Point("decode", 1, kv=64))["ms"] > predict(m, p, Point("decode", 1, kv=64))["ms"]
    slow = _prof(copy_gbps=1000.0)
    assert predict(m, slow, Point("decode", 1, kv=64))["ms"] > predict(m, p, Point("decode", 1, kv=64))["ms"]


def test_decode_is_bytes_and_launches_prefill_is_flops():
    m = skeleton("shape:llama3-8b:1")
    p = load_profile("h200-bfloat16")
    dec = launches(m, p, Point("decode", 1, kv=512))
    gemm = [x for x in dec if x.kind in ("gemm", "head")]
    assert all(x.byte_ms > x.flop_ms for x in gemm)
    total = sum(x.ms for x in dec)
    assert sum(x.fixed_us * 1e-3 + x.byte_ms for x in dec) == pytest.approx(total)
    pre = launches(m, p, Point("prefill", 8, seq=2048))
    big = [x for x in pre if x.kind == "gemm"]
    assert all(x.flop_ms > x.byte_ms for x in big)
    flop_share = sum(x.flop_ms for x in pre if x.flop_ms >= x.byte_ms) / sum(x.ms for x in pre)
    assert flop_share > 0.8


def test_decode_with_repeat_kv_reads_the_cache_expanded():
    m = skeleton("shape:llama3-8b:1")
    p = load_profile("h200-bfloat16")
    pt = Point("decode", 16, kv=4096)
    att = lambda g: sum(x.byte_ms for x in launches(m, p, pt, gqa_decode=g) if x.kind == "attention")  # noqa: E731
    assert att(False) == pytest.approx(att(True) * (1 + 2 * 4))  # 32 query heads over 8 KV heads


def test_compiled_path_prices_gemms_at_padded_dims():
    m = skeleton("shape:llama3-8b:1", {"model.layers.0.mlp": 12100})
    p = load_profile("h200-bfloat16")
    pt = Point("prefill", 8, seq=2048)
    eager = predict(m, p, pt, compiled=False)["ms"]
    comp = predict(m, p, pt, compiled=True)["ms"]
    assert comp < 0.8 * eager  # 12100 is a class-4 dim: slow eager, padded to 12104 by Inductor


def test_skeleton_applies_dims():
    pruned = {"model.layers.0.mlp": 12000, "model.layers.0.self_attn": 7}  # LLM-Pruner's sites
    m = skeleton("shape:llama3-8b:1", pruned, fused=False)
    a, mlp = m.model.layers[0].self_attn, m.model.layers[0].mlp
    assert a.q_proj.out_features == 7 * 4 * 128 and a.k_proj.out_features == 7 * 128
    assert a.o_proj.in_features == 7 * 4 * 128
    assert mlp.gate_proj.out_features == mlp.up_proj.out_features == mlp.down_proj.in_features == 12000
    lowrank = {
        "model.layers.0.self_attn.q_proj": 1000,  # factorized
        "model.layers.0.self_attn.v_proj": 819,  # the break-even rank of 1024 x 4096: stays dense
    }
    m2 = skeleton("shape:llama3-8b:1", lowrank, fused=False)
    assert isinstance(m2.model.layers[0].self_attn.q_proj, FactorizedLinear)
    assert type(m2.model.layers[0].self_attn.v_proj).__name__ == "Linear"
    assert all(p.device.type == "meta" for p in m2.parameters())
    with pytest.raises(GacError, match="no config"):
        skeleton("no/such-model-anywhere")
    # a recorded cell's dtype, as infer writes it or as torch prints it; an unknown one is refused, not read as bf16
    assert next(skeleton("shape:llama3-8b:1", dtype="torch.float16").parameters()).dtype == torch.float16
    with pytest.raises(GacError, match="unknown dtype 'int9'"):
        skeleton("shape:llama3-8b:1", dtype="int9")


def test_fit_recovers_intercept_and_bandwidth():
    rng = np.random.default_rng(0)
    nbytes = np.geomspace(1e6, 1e9, 21)
    us = 5.0 + nbytes / 4.49e6 * (1 + rng.normal(0, 0.01, nbytes.size))  # 4.49 TB/s = 4.49e6 bytes/us
    t0, gbps = fit_launch(nbytes, us)
    assert t0 == pytest.approx(5.0, abs=0.5) and gbps == pytest.approx(4490, rel=0.02)
    with pytest.raises(GacError):
        fit_launch([1e6], [5.0])


def test_shipped_h200_constants_come_from_the_committed_gemv_table():
    diag = json.loads((ROOT / "benchmarks/results/h200/decode-diag/diag.json").read_text())
    rows = [v for v in diag["gemv_table"].values() if v["rows"] == 1]
    # fitted unweighted (before the fit weighted relative error; 0.5% apart on these 21 shapes)
    t0, gbps = fit_launch([2 * v["n"] * v["k"] for v in rows], [v["cublas_us"] for v in rows], relative=False)
    for dt in ("bfloat16", "float16"):
        p = load_profile(f"h200-{dt}")
        assert (p.launch_us, p.copy_gbps) == (t0, gbps)
        assert p.latency_note() is None and "diag.json" in p.latency_fit["source"]
    h100 = load_profile("h100-bfloat16")  # measured by benchmarks/tools/gpu_launch_constants.py
    pts = h100.latency_fit["points"]
    assert (h100.launch_us, h100.copy_gbps) == fit_launch([q["bytes"] for q in pts], [q["us"] for q in pts])


def test_profile_round_trip_with_and_without_launch_constants(tmp_path):
    old = default_profile()
    d = old.to_dict()
    assert "launch_us" not in d and "copy_gbps" not in d
    back = Profile.from_dict(json.loads(json.dumps(d)))
    assert back.launch_us is None and back.launch_us_or_default == DEFAULT_LAUNCH_US
    assert back.copy_gbps_or_default == DEFAULT_COPY_GBPS and "defaults" in back.latency_note()
    new = _prof(4.0, 3000.0, 1.5)
    new.latency_fit = {"source": "test"}
    f = tmp_path / "p.json"
    new.save(f)
    got = load_profile(f)
    assert (got.launch_us, got.copy_gbps, got.aux_us) == (4.0, 3000.0, 1.5)
    assert got.latency_fit == {"source": "test"} and got.latency_note() is None
    assert got.ops.keys() == new.ops.keys()
    assert (
        got.fused_lowrank == {} and got.fused_lowrank_at(1) is None and "fused_lowrank" not in got.to_dict()
    )
    new.fused_lowrank = {"launch_us": 6.5, "gbps": 4000.0, "rows": [1], "fit": {"points": 3}}
    new.save(f)
    got = load_profile(f)
    assert got.fused_lowrank == new.fused_lowrank
    assert got.fused_lowrank_at(1) == (6.5, 4000.0) and got.fused_lowrank_at(16) is None


@pytest.mark.parametrize(
    "field, entry",
    [("fused_lowrank", e) for e in (
        {"launch_us": 6.5, "rows": [1]}, {"launch_us": 6.5, "gbps": 0, "rows": [1]},
        {"launch_us": 6.5, "gbps": 4000.0, "rows": []}, {"launch_us": "x", "gbps": 4000.0, "rows": [1]})]
    + [("latent_attention", e) for e in (
        {"groups": {}}, {"groups": {"1": {"gbps": 800.0, "tflops": 1.0}}},
        {"groups": {"1": {"launch_us": 5.0, "gbps": 0.0, "tflops": 1.0}}},
        {"groups": {"1": {"launch_us": 5.0, "gbps": 800.0, "tflops": -1.0}}},
        {"groups": {"x": {"launch_us": 5.0, "gbps": 800.0, "tflops": 1.0}}}, {"launch_us": 5.0})],
)  # fmt: skip
def test_profile_with_a_bad_latency_entry_is_refused_in_one_line(field, entry):
    d = default_profile().to_dict()
    d[field] = entry
    with pytest.raises(GacError, match=field) as e:
        Profile.from_dict(d)
    assert "\n" not in str(e.value)


def test_committed_h200_profiles_know_the_fused_low_rank_kernel_at_one_row():
    for name in ("h200-bfloat16", "h200-float16"):
        fl = load_profile(name).fused_lowrank
        assert (
            fl["rows"] == [1]
            and fl["fit"]["points"] >= 20
            and "lowrank_fused_dispatch" in fl["fit"]["source"]
        )
        assert 3.0 < fl["launch_us"] < 10.0 and 3000.0 < fl["gbps"] < 5000.0


def _cell(cid: str, compressor: str, dims: dict | None, ms: dict[str, float]) -> tuple:
    infer = {
        "dtype": "bfloat16",
        "fused": 2,
        "config": {"gqa_decode": True},
        "prefill": [{"phase": "prefill", "batch": 1, "seq": 64, "status": "ok", "median_ms": ms["p"]}],
        "decode": [{"phase": "decode", "batch": 1, "kv": 128, "status": "ok", "median_ms": ms["d"]}],
    }
    d = {
        "id": cid,
        "status": "ok",
        "cell": {"model": "tiny:llama"},
        "env": {"gpu": "NVIDIA H200"},
        "results": {"dims": dims, "evals": {"infer": infer, "predict": {"profile": "h200-bfloat16"}}},
    }
    return SimpleNamespace(id=cid, model="tiny:llama", compressor=compressor, bench=None), d


def test_report_shows_predicted_and_measured_speedup():
    from gac.plans.report import infer_predictions, prediction_lines

    cells = [
        _cell("tiny/base", "base", None, {"p": 1.0, "d": 1.0}),
        _cell(
            "tiny/svd",
            "svd",
            {"model.layers.0.self_attn.q_proj": 8, "model.layers.0.mlp.up_proj": 16},
            {"p": 0.9, "d": 1.2},
        ),  # fmt: skip
    ]
    pred = infer_predictions(cells)
    rows = pred["tiny:llama"]["tiny/svd"]["rows"]
    assert {r["point"] for r in rows} == {"prefill_b1_s64", "decode_b1_kv128"}
    dec = next(r for r in rows if r["phase"] == "decode")
    assert dec["measured_speedup"] == pytest.approx(1 / 1.2)
    assert dec["ratio"] == pytest.approx(dec["predicted_speedup"] / dec["measured_speedup"])
    assert dec["predicted_speedup"] < 1  # two extra launches at one row: slower than dense
    text = "\n".join(prediction_lines("tiny:llama", pred["tiny:llama"]))
    assert "predicted / measured" in text and "| tiny/svd |" in text
    assert f"{dec['predicted_speedup']:.3f} / {dec['measured_speedup']:.3f} ({dec['ratio']:.2f})" in text
    assert "Worst disagreement over the grid" in text


def test_redistil_keeps_the_launch_constants_and_cpu_refuses_to_measure_them():
    from gac.hardware.profiler import measure_launch_constants, redistil

    p = load_profile("h200-bfloat16")
    q = redistil(p)
    assert (q.launch_us, q.copy_gbps, q.aux_us, q.latency_fit) == (
        p.launch_us,
        p.copy_gbps,
        p.aux_us,
        p.latency_fit,
    )
    assert q.fused_lowrank == p.fused_lowrank and q.fused_lowrank_at(1) is not None
    with pytest.raises(GacError, match="CUDA only"):
        measure_launch_constants(torch.device("cpu"), torch.bfloat16)


def test_fused_lowrank_fit_uses_the_winning_shapes_only():
    from gac.hardware.latency import fit_fused_lowrank

    line = lambda b: 6.5 + b / 4.0e6  # noqa: E731 - us at 4000 GB/s (4e6 bytes per us)
    recs = [{"bytes": b, "fused_us": line(b), "use": True, "rows": 1} for b in (1.7e7, 1e8, 2.7e8)]
    recs.append({"bytes": 5e7, "fused_us": 400.0, "use": False, "rows": 1})  # lost: not what runs
    fit = fit_fused_lowrank(recs, "test")
    assert (fit["launch_us"], fit["gbps"], fit["rows"]) == (6.5, 4000.0, [1])
    assert fit["fit"]["points"] == 3 and fit["fit"]["of"] == 4 and fit["fit"]["source"] == "test"
    assert fit_fused_lowrank(recs[:1] + recs[3:], "test") == {}  # one winner: nothing assumed
    p = default_profile()
    p.fused_lowrank = fit
    assert Profile.from_dict(json.loads(json.dumps(p.to_dict()))).fused_lowrank_at(1) == (6.5, 4000.0)


def test_fused_lowrank_is_measured_on_cuda_only():
    from gac.hardware.profiler import measure_fused_lowrank

    with pytest.raises(GacError, match="CUDA only"):
        measure_fused_lowrank(torch.device("cpu"), torch.bfloat16)


@pytest.mark.gpu
def test_fused_lowrank_measured_on_the_gpu_fits_its_winning_shapes(tmp_path, monkeypatch):
    from gac.hardware.profiler import FUSED_SHAPES, measure_fused_lowrank

    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    fit = measure_fused_lowrank(torch.device("cuda"), torch.bfloat16)
    if not fit:  # no entry only where the kernel won at fewer than two shapes on this GPU
        from gac.kernels import lowrank_fused as L

        won = [L.measure_site(k, list(s), list(o), 1, torch.bfloat16, torch.device("cuda"))["use"]
               for k, s, o in FUSED_SHAPES]  # fmt: skip
        assert sum(won) < 2, won
        return
    sites = fit["fit"]["sites"]
    assert len(sites) == len(FUSED_SHAPES) and fit["fit"]["points"] == sum(s["use"] for s in sites)
    assert fit["rows"] == [1] and fit["launch_us"] > 0 and fit["gbps"] > 500
    for s in sites:  # every winning shape within 25% of the fitted line
        if s["use"]:
            assert (
                abs(fit["launch_us"] + s["bytes"] / fit["gbps"] / 1e3 - s["fused_us"]) < 0.25 * s["fused_us"]
            )


def test_a_recorded_cell_is_priced_with_the_sites_its_infer_switched_to_the_fused_kernel():
    from gac.kernels.lowrank_fused import site_key
    from gac.runtime.cells import cell_skeleton
    from gac.runtime.lowrank_fused import decode_sites

    dims = {"model.layers.0.self_attn.q_proj": 8, "model.layers.0.mlp.down_proj": 16}
    _, plain = _cell("tiny/svd", "svd", dims, {"p": 1.0, "d": 1.0})
    _, switched = _cell("tiny/svd", "svd", dims, {"p": 1.0, "d": 1.0})
    keys = [site_key(k, list(s), list(o)) for _, _, (k, s, o) in decode_sites(cell_skeleton(plain))]
    assert len(keys) == 2  # layer 0's q/k/v group (q factorized) and its down_proj
    # as use_fused_lowrank_ records it: JSON keys, the 16-row class not measured or not faster
    switched["results"]["evals"]["infer"]["fused_lowrank"] = {
        "modules": 1, "of": 2, "shapes": {keys[0]: {"1": [4, 1024, 4, 1024, 4, 1, 8]}},
    }  # fmt: skip
    dec, pre = Point("decode", 1, kv=128), Point("prefill", 1, seq=64)
    a, b = predict(cell_skeleton(plain), _prof(), dec), predict(cell_skeleton(switched), _prof(), dec)
    assert b["gemm_launches"] == a["gemm_launches"] - 1  # q's u joins its group's launch; down stays two
    assert b["ms"] == pytest.approx(a["ms"] - 5.0e-3, rel=1e-9)
    assert (
        predict(cell_skeleton(switched), _prof(), pre)["ms"]
        == predict(cell_skeleton(plain), _prof(), pre)["ms"]
    )


def test_report_states_dense_decode_share_of_copy_bandwidth(tmp_path):
    import json
    import shutil
    from pathlib import Path

    from gac.plans.report import bandwidth_line, render_plan

    src = Path(__file__).resolve().parents[2] / "benchmarks/results/h200/speed-gemv"
    base = json.loads((src / "cells/shape-llama3-8b-8/base.json").read_text())
    line = bandwidth_line(base["results"]["evals"]["infer"])
    assert "(4274 GB/s)" in line and "B1 KV512 76.1%" in line and "B64 KV4096 28.4%" in line
    assert (
        bandwidth_line(None) is None and bandwidth_line({"decode": [], "copy_bandwidth": {"gbps": 1}}) is None
    )
    root = tmp_path / "speed"
    shutil.copytree(src / "cells", root / "cells")
    shutil.copy(src / "plan.json", root / "plan.json")
    text = render_plan(root).read_text()
    assert text.count("Dense decode moves its weights") == 2  # one per model of the plan
    assert "B1 KV512 81.3%" in text  # the Qwen2.5-7B shape's dense step
