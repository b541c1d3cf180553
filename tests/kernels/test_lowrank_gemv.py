"""The fused Triton low-rank GEMV against a float64 reference (GPU only)."""

from __future__ import annotations

import pytest
import torch

from gac.nn import FactorizedLinear

pytestmark = pytest.mark.gpu

SHAPES = [  # (M, K, R, N): odd ranks, ragged edges, decode and small-batch rows
    (1, 4096, 1741, 4096),
    (1, 4096, 697, 1024),
    (3, 4096, 2709, 14336),
    (16, 14336, 1001, 4096),
    (1, 120, 7, 200),
    (5, 333, 1, 77),
    (64, 576, 97, 1536),
    (17, 1000, 33, 999),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", SHAPES)
def test_lowrank_matmul_matches_float64(shape, dtype):
    from gac.kernels.lowrank_gemv import lowrank_matmul

    m, k, r, n = shape
    g = torch.Generator(device="cuda").manual_seed(m * 31 + k + r * 7 + n)
    x = torch.randn(m, k, device="cuda", generator=g).to(dtype)
    v = (torch.randn(r, k, device="cuda", generator=g) * k**-0.5).to(dtype)
    ut = (torch.randn(r, n, device="cuda", generator=g) * r**-0.5).to(dtype)
    ref = (x.double() @ v.double().t()) @ ut.double()
    y = lowrank_matmul(x, v, ut)
    assert y.dtype == dtype and y.shape == (m, n)
    assert torch.isfinite(y).all()
    rel = (y.double() - ref).norm() / ref.norm()
    assert rel < 1e-2, rel.item()


def test_triton_module_matches_factorized_and_falls_back_for_prefill():
    from gac.runtime.lowrank_gemv import TritonLowRankLinear, use_triton_lowrank_

    fl = FactorizedLinear(512, 37, 300, bias=True, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        for p in fl.parameters():
            p.normal_(0, 0.1)
    tl = TritonLowRankLinear(fl)
    for rows in (1, 8, 200):  # 200 > max_rows: the cuBLAS path
        x = torch.randn(1, rows, 512, device="cuda", dtype=torch.bfloat16)
        ref = torch.nn.functional.linear(
            torch.nn.functional.linear(x.double(), fl.v.weight.double()),
            fl.u.weight.double(),
            fl.u.bias.double(),
        )
        rel = (tl(x).double() - ref).norm() / ref.norm()
        assert rel < 1e-2
    back = tl.to_factorized()
    torch.testing.assert_close(back.u.weight, fl.u.weight)
    model = torch.nn.Sequential(fl)
    assert use_triton_lowrank_(model) == 1 and isinstance(model[0], TritonLowRankLinear)


def test_decode_graph_replay_matches_eager():
    """A captured decode step gives the eager step's logits (tiny model, float32)."""
    from gac.runtime.step import DecodeStep
    from gac.testing import tiny_model

    model = tiny_model("llama").cuda()
    eager = DecodeStep(model, 2, 64, graphs=False)
    graph = DecodeStep(model, 2, 64, graphs=True)
    for layer_e, layer_g in zip(eager.cache.layers, graph.cache.layers, strict=True):
        layer_g.keys.copy_(layer_e.keys)
        layer_g.values.copy_(layer_e.values)
    graph.ids.copy_(eager.ids)
    for pos in (10, 11, 12):
        eager.set_position(pos)
        graph.set_position(pos)
        torch.testing.assert_close(graph().clone(), eager(), rtol=1e-4, atol=1e-4)
