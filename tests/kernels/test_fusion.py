"""Horizontal fusion is exact (CPU, float32 and float64) and reversible."""

from __future__ import annotations

import pytest
import torch

from gac.nn import FactorizedLinear, replace_module
from gac.nn.fused import FusedInputProjection, FusedSlice, fuse_projections_, unfuse_projections_
from gac.testing import tiny_model


def _factorize_some(model, ranks=(7, 13, 5, 31, 3)):
    """Replace some projections by random factorized layers of odd ranks (mixed dense/low-rank groups)."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "layers" in n]
    for i, n in enumerate(names):
        if i % 2 == 0:
            lin = model.get_submodule(n)
            r = ranks[i % len(ranks)]
            u = torch.randn(lin.out_features, r, dtype=lin.weight.dtype) * r**-0.5
            v = torch.randn(r, lin.in_features, dtype=lin.weight.dtype) * lin.in_features**-0.5
            replace_module(model, n, FactorizedLinear.from_factors(u, v, lin.bias))
    return model


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("lowrank", [False, True])
def test_fusion_is_exact_on_logits(family, lowrank):
    model = tiny_model(family, dtype=torch.float64)
    if lowrank:
        _factorize_some(model)
    ids = torch.randint(0, 250, (2, 17))
    with torch.no_grad():
        ref = model(ids).logits
        groups = fuse_projections_(model)
        assert len(groups) == 2 * 2  # (qkv, gate/up) x 2 layers
        got = model(ids).logits
    assert sum(isinstance(m, FusedSlice) for m in model.modules()) == 2 * 5
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    # the fused weight holds exactly the first-stage rows of the members
    g = next(m for m in model.modules() if isinstance(m, FusedInputProjection))
    assert g.weight.shape[0] == sum(g.splits)
    # and the way back restores stand-alone modules with the same outputs
    assert unfuse_projections_(model) == 4
    assert not any(isinstance(m, (FusedSlice, FusedInputProjection)) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref, rtol=1e-12, atol=1e-12)


def test_fusion_float32_close_and_no_activation_kept():
    model = _factorize_some(tiny_model("llama"))
    ids = torch.randint(0, 250, (1, 9))
    with torch.no_grad():
        ref = model(ids).logits
        fuse_projections_(model)
        got = model(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    for m in model.modules():
        if isinstance(m, FusedInputProjection):
            assert m._parts == [] and m._x is None  # every slice was consumed


def test_fused_group_recomputes_for_a_new_input():
    a = torch.nn.Linear(8, 3, bias=True).double()
    b = FactorizedLinear.from_factors(torch.randn(5, 2).double(), torch.randn(2, 8).double())
    g = FusedInputProjection([a, b])
    sa, sb = FusedSlice(g, 0, a), FusedSlice(g, 1, b)
    x1, x2 = torch.randn(4, 8).double(), torch.randn(4, 8).double()
    torch.testing.assert_close(sa(x1), a(x1))
    torch.testing.assert_close(sa(x2), a(x2))  # x1's slice of b never taken: recomputed for x2
    torch.testing.assert_close(sb(x2), b(x2))


def test_fusion_rejects_mismatched_inputs():
    with pytest.raises(ValueError, match="in_features"):
        FusedInputProjection([torch.nn.Linear(8, 3), torch.nn.Linear(9, 3)])


def test_fused_block_compiles_in_one_graph_without_recompiles():
    """torch.compile traces a fused layer whole (no graph break) and reuses it for new inputs."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounter

    model = _factorize_some(tiny_model("llama", dtype=torch.float32))
    layer = model.model.layers[0]
    fuse_projections_(layer)
    torch._dynamo.reset()
    counter = CompileCounter()
    mlp = torch.compile(layer.mlp, backend=counter, fullgraph=True, dynamic=False)
    with torch.no_grad():
        for seed in range(4):
            x = torch.randn(
                2, 3, layer.mlp.gate_proj.in_features, generator=torch.Generator().manual_seed(seed)
            )
            torch.testing.assert_close(mlp(x), layer.mlp(x), rtol=0, atol=0)
    assert counter.frame_count == 1  # compiled once, no recompile for later inputs
    assert layer.mlp.fused_gate_up._x is None and layer.mlp.fused_gate_up._parts == []
    torch._dynamo.reset()


@pytest.mark.parametrize("rows", [1, 3])
def test_aligned_split_copies_exactly_the_slices_off_a_16_byte_boundary(rows):
    from gac.nn.fused import aligned_split

    y = torch.randn(rows, 7 + 37 + 20 + 8, dtype=torch.bfloat16)
    parts = aligned_split(y, [7, 37, 20, 8])
    for p, want in zip(parts, y.split([7, 37, 20, 8], -1), strict=True):
        assert torch.equal(p, want)
        assert p.data_ptr() % 16 == 0 or p.data_ptr() == y.data_ptr()
    # rows of 72 bf16 = 144 bytes: a 16-byte multiple, so only the offsets decide
    assert [
        p.data_ptr() == w.data_ptr() for p, w in zip(parts, y.split([7, 37, 20, 8], -1), strict=True)
    ] == [
        True,
        False,
        False,
        True,
    ]
    odd = torch.randn(
        rows, 8 + 8 + 3, dtype=torch.bfloat16
    )  # rows of 38 bytes: every row start but the first is off
    views = [
        p.data_ptr() == w.data_ptr()
        for p, w in zip(aligned_split(odd, [8, 8, 3]), odd.split([8, 8, 3], -1), strict=True)
    ]
    assert views == ([True, True, True] if rows == 1 else [False, False, False])
    f32 = torch.randn(rows, 4 + 8, dtype=torch.float32)  # 16 bytes per 4 float32
    assert all(
        p.data_ptr() == w.data_ptr()
        for p, w in zip(aligned_split(f32, [4, 8]), f32.split([4, 8], -1), strict=True)
    )


def test_fusion_at_odd_ranks_hands_out_aligned_slices_and_stays_exact():
    from gac.testing import factorize_at_odd_ranks

    torch.manual_seed(0)
    m = factorize_at_odd_ranks(tiny_model("llama", dtype=torch.bfloat16))
    ids = torch.randint(0, 250, (3, 5))
    with torch.no_grad():
        want = m(ids, use_cache=False).logits
        fuse_projections_(m)
        seen = []
        for mod in m.modules():
            if isinstance(mod, FusedInputProjection):

                def record(x, orig=mod._products):
                    parts = orig(x)
                    seen.append(list(parts))  # the group empties its own list as members take their slices
                    return parts

                mod._products = record
        got = m(ids, use_cache=False).logits
    assert torch.equal(got, want)
    assert len(seen) == 4  # q/k/v and gate/up of two layers
    for parts in seen:  # q at 0, k at 7, v at 44 elements: k and v are copies on 16-byte boundaries
        assert all(p.data_ptr() % 16 == 0 for p in parts)
