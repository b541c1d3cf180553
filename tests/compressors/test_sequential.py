"""Layer-by-layer calibration and compression (``CompressConfig.max_gpu_memory``) equals the all-in-memory path."""

from __future__ import annotations

import copy

import pytest
import torch

from gac.api import CompressConfig, apply_, plan
from gac.errors import GacError
from gac.nn import FactorizedLinear
from gac.testing import tiny_model


def _batches():
    g = torch.Generator().manual_seed(1)
    return [torch.randint(3, 240, (2, 24), generator=g) for _ in range(3)]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_sequential_svd_llm_matches_in_memory(family):
    base = tiny_model(family, layers=4).double()
    results = {}
    for name, budget in (("memory", None), ("sequential", 1e-6)):  # 1 KiB: forces layer by layer
        m = copy.deepcopy(base)
        cfg = CompressConfig(compressor="svd-llm", param_ratio=0.6, align="gac", max_gpu_memory=budget)
        p = plan(m, cfg, calib_batches=_batches())
        alloc = p.allocation()
        apply_(m, p, alloc)
        results[name] = (p, alloc, m)
    (pm, am, mm), (ps, as_, ms) = results["memory"], results["sequential"]
    assert ps.compressor.exec_device is not None and pm.compressor.exec_device is None
    info = ps.compressor.sequential_info
    assert info.layers == 4
    # one decoder layer (+ embedding) resident at a time, not the model
    layer_bytes = sum(p.numel() * p.element_size() for p in base.model.layers[0].parameters())
    embed_bytes = base.model.embed_tokens.weight.numel() * 8
    assert info.peak_param_bytes == layer_bytes + embed_bytes < info.model_param_bytes / 2
    assert pm.native == ps.native and am.dims == as_.dims
    ids = torch.randint(3, 240, (2, 16), generator=torch.Generator().manual_seed(2))
    for (n1, a), (n2, b) in zip(mm.named_modules(), ms.named_modules(), strict=True):
        assert n1 == n2 and type(a) is type(b)
        if isinstance(a, FactorizedLinear):
            assert torch.allclose(a.weight, b.weight, atol=1e-10, rtol=0)
    with torch.no_grad():
        assert torch.allclose(mm(ids).logits, ms(ids).logits, atol=1e-9, rtol=0)


def test_model_within_budget_stays_in_memory():
    m = tiny_model("llama", layers=2)
    p = plan(
        m, CompressConfig(compressor="svd-llm", param_ratio=0.6, max_gpu_memory=64), calib_batches=_batches()
    )
    assert p.compressor.exec_device is None


@pytest.mark.parametrize("compressor", ["asvd", "palu", "llm-pruner"])
def test_whole_model_calibrations_are_refused(compressor):
    m = tiny_model("llama", layers=2)
    with pytest.raises(GacError, match="layer-by-layer compression supports svd and svd-llm"):
        plan(
            m,
            CompressConfig(compressor=compressor, param_ratio=0.6, max_gpu_memory=1e-6),
            calib_batches=_batches(),
        )


def test_bad_budget():
    with pytest.raises(GacError, match="max GPU memory must be a positive number"):
        CompressConfig(compressor="svd-llm", max_gpu_memory=0)
