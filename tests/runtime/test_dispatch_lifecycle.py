"""The dispatch base (gac.runtime.dispatch) over a toy kernel: the whole lifecycle every dispatch gets.

The toy "kernel" is a torch op (``torch.addmm``) standing in for a Triton one, on CPU; its subclass is
all a new kernel writes: sites, key, measure, module class.  Measured once per shape and row class,
cached to disk, reloaded by a new dispatch object, swapped in at the rows it won, and undone to the
exact original modules.
"""

from __future__ import annotations

import json
from collections.abc import Hashable
from typing import Any

import pytest
import torch
from torch import nn

from gac.hardware.dispatch_table import choice, rows_of
from gac.runtime.dispatch import Dispatch, Site, cache_key

CALLS: list[int] = []  # rows of each call that took the toy kernel


class ToyLinear(nn.Linear):
    """An ``nn.Linear`` whose inputs take the toy kernel where its table names a decision."""

    plain = nn.Linear
    tables = ("toy_table",)
    toy_table: dict[int, Any] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = rows_of(x)
        if choice(self.toy_table, rows) is None:
            return super().forward(x)
        CALLS.append(rows)
        self.toy_counters += 1  # a buffer the kernel owns (as split-K tickets)
        y = torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight.t())
        return y.reshape(*x.shape[:-1], -1)


class ToyDispatch(Dispatch):
    """Sites: every ``nn.Linear``; the kernel "wins" at one row where the weight has 6 output rows."""

    what = "toy dispatch"
    cache = "toy_dispatch.json"
    classes = (1, 16)
    attr = "toy_table"
    buffer = "toy_counters"
    needs_triton = False
    swaps = {nn.Linear: ToyLinear}

    def __init__(self, revision: int = 1) -> None:
        self.revision = revision
        self.measured_shapes: list[tuple[str, int]] = []

    def unavailable(self, param: torch.Tensor | None) -> str | None:
        return None if param is not None else "no parameters"  # the toy runs on CPU

    def sites(self, model: nn.Module) -> list[Site]:
        return [(n, m, tuple(m.weight.shape)) for n, m in model.named_modules() if isinstance(m, nn.Linear)]

    def key(self, shape: Hashable) -> str:
        n, k = shape  # type: ignore[misc]
        return f"{n}x{k}"

    def measure(self, shape: Hashable, rows: int, dtype: torch.dtype, device: torch.device) -> dict[str, Any]:
        self.measured_shapes.append((self.key(shape), rows))
        if shape == (0, 0):  # the measurement is interrupted here
            raise RuntimeError("interrupted")
        use = shape[0] == 6 and rows == 1  # type: ignore[index]
        return {"use": use, "config": [rows, 4] if use else None, "revision": self.revision}

    def fresh(self, rec: dict[str, Any], rows: int) -> bool:
        return rec.get("revision") == self.revision

    def counters(self, module: nn.Module, table: dict[int, Any]) -> torch.Tensor | None:
        return torch.zeros(1, dtype=torch.int32)


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 5))


def _snapshot(model: nn.Module) -> list[tuple[str, type, dict[str, Any], list[str]]]:
    """Each module's class, its attributes (values by identity) and its buffers."""
    return [
        (n, type(m), {k: id(v) for k, v in vars(m).items()}, sorted(m._buffers))
        for n, m in model.named_modules()
    ]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    return tmp_path / ToyDispatch.cache


def test_toy_kernel_is_measured_once_cached_reloaded_swapped_in_and_undone_exactly(cache):
    model = _model()
    before = _snapshot(model)
    x1, x5 = torch.randn(1, 8), torch.randn(5, 8)
    with torch.no_grad():
        want1, want5 = model(x1), model(x5)
    toy = ToyDispatch()
    info = toy.use_(model)
    # measured once per shape and row class: 6x8, 6x6 (two modules), 5x6, each at 1 and 16 rows
    assert sorted(toy.measured_shapes) == sorted((k, r) for k in ("6x8", "6x6", "5x6") for r in (1, 16))
    assert info == {"modules": 3, "of": 4,
                    "shapes": {"6x6": {"1": [1, 4], "16": None}, "6x8": {"1": [1, 4], "16": None}}}  # fmt: skip
    # cached on disk under this machine's key, one record per shape and row class
    records = json.loads(cache.read_text())[cache_key(torch.device("cpu"), torch.float32)]
    assert sorted(records) == sorted(f"{k}@{r}" for k in ("6x8", "6x6", "5x6") for r in (1, 16))
    # swapped in where the shape won: a class swap, the same parameters, a full table, a buffer
    switched = [m for m in model if type(m) is ToyLinear]
    assert [model[i] for i in (0, 2, 3)] == switched and type(model[4]) is nn.Linear
    assert all(m.toy_table == {1: [1, 4], 16: None} for m in switched)
    assert not any("toy" in k for k in model.state_dict())  # the buffer is not persistent
    CALLS.clear()
    with torch.no_grad():
        got1, got5 = model(x1), model(x5)
    assert CALLS == [1, 1, 1]  # one row: the toy kernel at the three switched layers; five rows: none
    torch.testing.assert_close(got1, want1)
    assert torch.equal(got5, want5)
    # a new dispatch object (another process) reloads the decisions: nothing measured again
    again = ToyDispatch()
    other = _model()
    assert again.use_(other) == info and again.measured_shapes == []
    # and a recorded result switches a model without measuring
    third = ToyDispatch()
    rebuilt = _model()
    assert third.switch_recorded_(rebuilt, info["shapes"]) == 3 and third.measured_shapes == []
    assert [type(m) for m in rebuilt] == [type(m) for m in model]
    # undone: the exact original modules (class, attributes, buffers), twice is a no-op
    assert toy.undo_(model) == 3 and toy.undo_(model) == 0
    assert _snapshot(model) == before
    with torch.no_grad():
        assert torch.equal(model(x1), want1) and torch.equal(model(x5), want5)


def test_a_record_that_is_no_longer_fresh_is_measured_again(cache):
    ToyDispatch(revision=1).use_(_model())
    newer = ToyDispatch(revision=2)
    newer.use_(_model())
    assert len(newer.measured_shapes) == 3 * 2  # every record measured on revision 1: stale
    assert ToyDispatch(revision=2).decisions([(6, 8)], torch.float32, torch.device("cpu")) == {
        "6x8": {1: [1, 4], 16: None}
    }


def test_an_interrupted_measurement_keeps_what_it_measured(cache):
    toy = ToyDispatch()
    cpu = torch.device("cpu")
    with pytest.raises(RuntimeError, match="interrupted"):
        toy.decisions([(6, 8), (5, 6), (0, 0)], torch.float32, cpu)
    saved = json.loads(cache.read_text())[cache_key(cpu, torch.float32)]
    assert sorted(saved) == ["5x6@1", "5x6@16", "6x8@1", "6x8@16"]  # kept what was measured
    toy.measured_shapes.clear()
    assert toy.decisions([(6, 8), (5, 6)], torch.float32, cpu) == {
        "6x8": {1: [1, 4], 16: None}, "5x6": {1: None, 16: None},
    }  # fmt: skip
    assert toy.measured_shapes == []
    assert toy.decisions([(6, 8), (6, 6)], torch.float32, cpu, row_classes=(1,)) == {
        "6x8": {1: [1, 4]}, "6x6": {1: [1, 4]},
    }  # fmt: skip
    assert toy.measured_shapes == [("6x6", 1)]  # only what the cache lacked


def test_a_model_the_kernel_cannot_serve_is_left_alone_with_the_reason():
    class CudaOnly(ToyDispatch):
        unavailable = Dispatch.unavailable

    model = _model()
    before = _snapshot(model)
    assert CudaOnly().use_(model) == {"modules": 0, "of": 0, "reason": "not on CUDA"}
    assert _snapshot(model) == before
