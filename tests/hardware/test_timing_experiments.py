"""Timing harness, experiments, CLI and bad input, on CPU at tiny sizes."""

from __future__ import annotations

import json

import pytest
import torch

import gac.hardware.sweeps as ex
import gac.hardware.timing as tm
from gac.cli import main
from gac.errors import GacError


def test_slug_and_env_cpu():
    assert tm.gpu_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert tm.gpu_slug("NVIDIA H200") == "h200"
    assert tm.gpu_slug("NVIDIA GH200 480GB") == "gh200"
    assert tm.gpu_slug("CPU") == "cpu"
    env = tm.environment("cpu", torch.bfloat16)
    assert env["gpu"] == "CPU" and env["timing"] == "wall_clock" and env["dtype"] == "bfloat16"
    assert set(env["sdpa_backends_enabled"]) >= {"flash", "efficient", "math"}
    assert tm.rotation_sets(1 << 20, torch.device("cpu")) == 1


def test_bench_statistics_cpu():
    x = torch.randn(64, 64)
    t = tm.bench(lambda i: x @ x, torch.device("cpu"), warmup_ms=1, rep_ms=3, min_reps=7, max_reps=20)
    assert t.method == "wall_clock" and 7 <= t.reps <= 20
    assert 0 < t.min_ms <= t.q25_ms <= t.median_ms <= t.q75_ms
    assert t.iqr_ms == pytest.approx(t.q75_ms - t.q25_ms)


def test_resolve_dtype_errors(monkeypatch):
    with pytest.raises(GacError, match="unknown dtype 'int8'"):
        tm.resolve_dtype("int8", torch.device("cpu"))
    assert tm.resolve_dtype("bf16", torch.device("cpu")) is torch.bfloat16

    def broken(*a, **k):
        raise RuntimeError("\"addmm_impl_cpu_\" not implemented for 'Half'\nmore")

    monkeypatch.setattr(tm.torch, "ones", broken)
    with pytest.raises(
        GacError, match=r"^dtype float16 is not supported on cpu: .*not implemented for 'Half'$"
    ):
        tm.resolve_dtype("float16", torch.device("cpu"))


def test_points_and_parse_dims():
    cfg = ex.Config.cpu()
    pts = ex.points_for("repair_kernels", cfg)
    sd = [p for p in pts if p["kind"] == "sdpa"]
    assert {p["logical_dim"] for p in sd} == {107, 114, 117, 120, 121, 125}
    assert {(p["variant"], p["dim"]) for p in sd if p["logical_dim"] == 107} == {
        ("original", 107),
        ("minimal", 112),
        ("optimal", 112),
    }
    assert all(p["dim"] % 16 == 0 for p in sd if p["variant"] == "optimal")
    gk = [p for p in pts if p["kind"] == "linear"]
    assert [p["K"] for p in gk] == [107, 112, 112]
    with pytest.raises(GacError, match="bad dims"):
        ex.parse_dims("64:32")
    with pytest.raises(GacError, match="unknown experiment 'nope'"):
        ex.points_for("nope", cfg)


def test_backend_refusal_and_oom_are_cells(tmp_path, monkeypatch):
    cfg = ex.Config.cpu()
    cfg.dims = [20, 21]
    r = ex.run_experiment("sdpa_backend", dtype="float32", out=tmp_path, config=cfg, device="cpu", show=False)
    cells = {(x["dim"], x["series"]): x for x in r["records"]}
    assert len(cells) == 8
    assert cells[(21, "math")]["status"] == "ok"
    # the cuDNN backend cannot run on CPU: a recorded refusal with PyTorch's reason, not a crash
    assert cells[(21, "cudnn")]["status"] == "unsupported" and cells[(21, "cudnn")]["reason"]

    def oom(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(ex.F, "linear", oom)
    p = ex.op_point("t", cfg, "gemm_n", 61, "s")
    res = ex.measure_point(p, torch.device("cpu"), torch.float32, cfg)
    assert res == {"status": "oom", "reason": "CUDA out of memory. Tried to allocate 2.00 GiB"}


def test_interrupted_run_keeps_points_and_resumes(tmp_path):
    cfg = ex.Config.cpu()
    cfg.dims = [60, 61, 62, 63, 64]
    calls: list[int] = []

    def fake(p):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(p["dim"])
        return {"status": "ok", "median_ms": 1.0 + p["dim"] % 8, "tflops": 1.0}

    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment("lowrank", out=tmp_path, config=cfg, device="cpu", show=False, measure=fake)
    lines = [json.loads(x) for x in (tmp_path / "lowrank-bfloat16.jsonl").read_text().splitlines()]
    assert lines[0]["type"] == "meta" and [x["dim"] for x in lines[1:]] == [60, 61, 62]
    assert not (tmp_path / "lowrank-bfloat16.json").exists()  # final record only on completion
    calls.clear()
    r = ex.run_experiment(
        "lowrank", out=tmp_path, config=cfg, device="cpu", show=False, measure=fake, resume=True
    )
    assert calls == [63, 64]  # only the points not yet measured
    assert [x["dim"] for x in r["records"]] == [60, 61, 62, 63, 64]


def test_cli_bench_all_and_profile_quick_cpu(tmp_path, capsys):
    out = tmp_path / "res"
    rc = main(
        [
            "bench",
            "--experiment",
            "all",
            "--device",
            "cpu",
            "--out",
            str(out),
            "--dims",
            "20:25",
            "--seq-len",
            "32",
        ]
    )
    assert rc == 0
    for name in ex.EXPERIMENTS:
        full = json.loads((out / f"{name}-bfloat16.json").read_text())
        assert full["device_label"] == "CPU" and full["env"]["timing"] == "wall_clock"
        assert full["command"] and full["records"]
        assert (out / f"{name}-bfloat16.csv").read_text().count("\n") == len(full["records"]) + 1
        assert (out / f"{name}-bfloat16.png").stat().st_size > 1000
        ok = [r for r in full["records"] if r["status"] == "ok"]
        assert ok and all(r["median_ms"] > 0 for r in ok)
    sweep = json.loads((out / "sdpa_sweep-bfloat16.json").read_text())
    assert all(r["auto_backend"] in r["eligible"] for r in sweep["records"])
    prof = tmp_path / "p.json"
    rc = main(["profile", "--quick", "--device", "cpu", "--out", str(prof), "--raw-dir", str(out)])
    assert rc == 0
    d = json.loads(prof.read_text())
    assert d["measured"] and d["env"]["gpu"] == "CPU" and d["id"].startswith("cpu-bfloat16")
    assert set(d["ops"]) == {"gemm_k", "gemm_n", "gemv", "sdpa_head_dim", "lowrank_r"}
    assert (out / "profile-bfloat16-quick-timing.json").exists()
    assert (out / "profile-bfloat16-quick.jsonl").read_text().count('"point"') >= 50


@pytest.mark.parametrize(
    ("argv", "msg"),
    [
        (
            ["bench", "--experiment", "nope", "--device", "cpu"],
            "error: unknown experiment 'nope'; choose one of: sdpa_sweep",
        ),
        (
            ["bench", "--experiment", "gemv", "--dtype", "int8", "--device", "cpu"],
            "error: unknown dtype 'int8'",
        ),
        (["bench", "--experiment", "gemv", "--dims", "a:b", "--device", "cpu"], "error: bad dims 'a:b'"),
        (
            ["bench", "--experiment", "gemv", "--m", "0", "--device", "cpu"],
            "error: --m must be a positive integer",
        ),
        (["profile", "--out", "x.json", "--dtype", "fp8", "--device", "cpu"], "error: unknown dtype 'fp8'"),
        (
            ["profile", "--out", "x.json", "--tolerance", "2", "--device", "cpu"],
            "error: --tolerance must be in (0, 1)",
        ),
    ],
)
def test_cli_bad_input_one_line(argv, msg, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(msg) and "\n" not in err and "Traceback" not in err
