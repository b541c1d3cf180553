"""The decode step's kernel switches: a kernel that cannot serve a model on CUDA warns once and says why."""

from __future__ import annotations

import logging

from gac.runtime import step


def test_an_unserved_kernel_warns_once_per_reason(caplog, monkeypatch):
    monkeypatch.setattr(step, "_WARNED", set())
    info = {"modules": 0, "of": 0, "reason": "Triton is not installed"}
    with caplog.at_level(logging.WARNING, logger="gac.runtime.step"):
        step.note_unserved("gemv", info)
        step.note_unserved("gemv", dict(info))
        step.note_unserved("fused_lowrank", info)  # another kernel: its own warning
        step.note_unserved("branches", {"modules": 3, "of": 3, "shapes": {}})  # switched: nothing to say
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == [
        "decode kernels: gemv does not run: Triton is not installed (the existing path serves every site)",
        "decode kernels: fused_lowrank does not run: Triton is not installed (the existing path serves every site)",
    ]
