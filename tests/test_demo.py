"""``gac demo``'s pieces that run without the embedded model: speed over dense, the CPU time limit."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from gac.commands.demo import CPU_LIMIT_S, CPU_SECONDS, GPU_DECODE, GPU_PREFILL, measure_speed
from gac.testing import tiny_model


def test_measure_speed_reports_prefill_and_decode_over_the_base(monkeypatch):
    """The GPU demo's speed columns: base 1.0 by definition, every point of the grid timed."""
    monkeypatch.setattr("gac.commands.demo.GPU_PREFILL", ((1, 16),))
    monkeypatch.setattr("gac.commands.demo.GPU_DECODE", ((1, 64),))
    torch.manual_seed(0)
    base = tiny_model("llama", hidden=64, layers=1, heads=4, kv_heads=2, head_dim=16, vocab=128)
    got = measure_speed({"base": base, "gac": copy.deepcopy(base)})
    assert set(got) == {"base", "gac"}
    assert got["base"]["prefill"] == pytest.approx(1.0) and got["base"]["decode"] == pytest.approx(1.0)
    assert got["gac"]["prefill"] > 0 and got["gac"]["decode"] > 0
    assert set(got["gac"]["prefill_ms"]) == {"1x16"} and set(got["gac"]["decode_ms"]) == {"1x64"}


def test_the_default_compressor_fits_the_cpu_limit_and_the_grid_is_the_documented_one():
    assert CPU_SECONDS["llm-pruner"] <= CPU_LIMIT_S < CPU_SECONDS["asvd"]
    assert GPU_PREFILL == ((1, 512), (8, 512)) and GPU_DECODE == ((1, 512),)


def test_gac_picks_one_thread_per_physical_core_unless_told(monkeypatch):
    from gac.utils import physical_cores, pick_threads

    n = physical_cores()
    assert 1 <= n <= (len(os.sched_getaffinity(0)))
    old = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        assert pick_threads() == n and torch.get_num_threads() == n
        assert os.environ["OMP_NUM_THREADS"] == str(n)
        monkeypatch.setenv("OMP_NUM_THREADS", "1")
        assert pick_threads() is None  # the user's setting stands
    finally:
        torch.set_num_threads(old)


def _row(variant, ppl, **kw):
    row = {"variant": variant, "params": 125_930_000, "targeted_ratio": 0.8989, "pct_aligned": 100.0,
           "ppl": ppl, "predicted_speedup": 1.02, "worst_serve_speedup": 1.001, "kv_bytes_per_token": 41_472}  # fmt: skip
    return {**row, **kw}


def test_demo_table_columns_on_a_gpu_and_on_cpu():
    """The GPU table shows measured speed (a '-' where a phase was not timed), the CPU table the predicted."""
    from rich.console import Console

    from gac.commands.demo import demo_table

    def text(t):
        c = Console(record=True, width=200)
        c.print(t)
        return c.export_text()

    rows = [
        _row("base", 45.348, pct_aligned=None, measured_prefill_speedup=1.0, measured_decode_speedup=1.0),
        _row("gac", 42.145, measured_prefill_speedup=1.2345, measured_decode_speedup=None),
    ]
    gpu = demo_table(rows, "llm-pruner", 0.9, measured=True)
    assert [c.header for c in gpu.columns] == [
        "variant",
        "params",
        "targeted",
        "aligned",
        "ppl",
        "prefill x",
        "decode x",
    ]
    out = text(gpu)
    assert "LLM-Pruner, 10% parameter reduction" in out and "1.234x" in out and "42.145" in out
    assert out.splitlines()[-2].split("│")[-2].strip() == "-"  # gac's decode was not timed
    cpu = demo_table(rows, "palu", 0.9, measured=False)
    assert [c.header for c in cpu.columns] == ["variant", "params", "targeted", "KV B/token", "aligned", "ppl", "pred. x", "worst x"]  # fmt: skip
    out = text(cpu)
    assert "PaLU, 10% KV-cache reduction" in out and "41,472" in out and "1.020x" in out and "1.001x" in out
