"""One device and dtype parser for the package: every command and the measurement code agree."""

from __future__ import annotations

import pytest
import torch

from gac.errors import GacError
from gac.hardware.timing import resolve_dtype
from gac.utils import parse_dtype, resolve_device_dtype


@pytest.mark.parametrize(
    ("device", "want"), [("cpu", torch.float32), ("cuda", torch.bfloat16), ("cuda:1", torch.bfloat16)]
)
def test_auto_is_bfloat16_on_a_gpu_and_float32_elsewhere(device, want):
    assert parse_dtype("auto", device) is want


def test_names_and_short_spellings_mean_the_same_on_every_device():
    for names, want in (
        (("float32", "fp32", "float"), torch.float32),
        (("bfloat16", "bf16", " BFloat16 "), torch.bfloat16),
        (("float16", "fp16", "half"), torch.float16),
    ):
        for name in names:
            assert parse_dtype(name, "cpu") is want and parse_dtype(name, "cuda") is want


@pytest.mark.parametrize("bad", ["int8", "fp8", "", "float64", "torch.float32"])
def test_unknown_dtypes_are_one_clear_error(bad):
    with pytest.raises(GacError, match=rf"^unknown dtype {bad!r}; use auto, float32, bfloat16, float16$"):
        parse_dtype(bad)


def test_the_measurement_code_reads_dtypes_the_same_way():
    cpu = torch.device("cpu")
    for name in ("auto", "float32", "bf16", "half"):
        assert resolve_dtype(name, cpu) is parse_dtype(name, "cpu")
    with pytest.raises(GacError, match="unknown dtype 'int8'"):
        resolve_dtype("int8", cpu)


def test_resolve_device_dtype_on_cpu():
    assert resolve_device_dtype("cpu", "auto") == ("cpu", torch.float32)
    assert resolve_device_dtype("cpu", "bf16") == ("cpu", torch.bfloat16)
    with pytest.raises(GacError, match="unknown device 'tpu'"):
        resolve_device_dtype("tpu", "auto")
