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
