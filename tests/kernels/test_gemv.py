"""The Triton decode GEMV: against a float64 reference (Triton's CPU interpreter here, bf16 on a GPU),
its dispatch (only where a table says so, only for decode-sized inputs), and the round trip."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from gac.hardware.dispatch_table import row_class
from gac.kernels import gemv as G
from gac.runtime.gemv import GEMV, undo_triton_gemv_, use_triton_gemv_
from gac.runtime.modules import GemvLinear, dispatch_linear

from .interp import needs_triton, run_interpreted

# (rows, n, k): odd sizes, ragged tiles, K not a multiple of any BLOCK_K, both row classes
SHAPES = [(1, 37, 300), (1, 64, 128), (1, 5, 1000), (3, 50, 257), (16, 33, 129), (9, 100, 64), (2, 7, 16)]

INTERPRETED = textwrap.dedent(
    """
    import torch
    from torch import nn
    from gac.hardware.dispatch_table import row_class
    from gac.kernels import gemv as G
    from gac.nn.fused import fuse_projections_
    from gac.nn import FactorizedLinear
    from gac.runtime.gemv import GEMV, undo_triton_gemv_
    from gac.testing import assert_compiled_grads_match

    torch.manual_seed(0)
    worst = 0.0
    for dt in (torch.float32, torch.float16):
        for rows, n, k in SHAPES:
            x = torch.randn(rows, k, dtype=dt)
            w = torch.randn(n, k, dtype=dt) * k ** -0.5
            b = torch.randn(n, dtype=dt)
            ref = x.double() @ w.double().t() + b.double()
            counters = G.new_counters(n)
            # and, at 2..16 rows, the weight tile as tl.dot's left operand (SWAP), split or not
            swaps = [(32, 128, 4, 4, 2, 1), (64, 64, 4, 3, 1, 1)] if rows > 1 else []
            for cfg in list(G.CONFIGS[row_class(rows, G.CONFIGS)]) + swaps:
                y = torch.empty(rows, n, dtype=dt)
                G._launch(x, w, b, y, cfg, counters)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert err < (1e-6 if dt == torch.float32 else 2e-3), (dt, rows, n, k, cfg, err)
                assert not counters.any(), (cfg, counters)  # split-K tickets left zeroed
                worst = max(worst, err) if dt == torch.float32 else worst
            y = G.gemv(x.reshape(rows, 1, k), w, None)  # leading dims kept, no bias
            assert y.shape == (rows, 1, n)
            assert torch.allclose(y.double().reshape(rows, n), ref - b.double(), rtol=1e-2, atol=1e-2)

    # x's rows strided apart (a view): K, x's and w's row strides carry their common alignment, which
    # the kernel takes divided and multiplies back (8: 1744 and its stride 1752; 4: 1736 and 1740; 1)
    for k, pad, align in ((1744, 8, 8), (1736, 4, 4), (1037, 8, 1)):
        x = torch.randn(3, k + pad)[:, :k]
        w = torch.randn(40, k) * k ** -0.5
        assert G._align(k, x.stride(0), w.stride(0)) == align
        ref = x.double() @ w.double().t()
        for cfg in ((16, 256, 4, 3), (32, 128, 4, 4, 2), (64, 128, 4, 3, 2, 1)):
            y = torch.empty(3, 40)
            G._launch(x, w, None, y, cfg, G.new_counters(40))
            assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-6, (k, cfg)

    # a block with dense and factorized members, fused, every GEMV routed to the kernel
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj = nn.Linear(48, 40, bias=False)
            self.k_proj = FactorizedLinear(48, 7, 24)
            self.v_proj = nn.Linear(48, 24, bias=True)
            self.o_proj = FactorizedLinear(40, 9, 48)

        def forward(self, x):
            return self.o_proj(self.q_proj(x)) + torch.cat([self.k_proj(x), self.v_proj(x)], -1).sum(-1, keepdim=True)

    blk = Block().eval()
    x = torch.randn(3, 1, 48)
    with torch.no_grad():
        want = blk(x)
        fuse_projections_(blk)
        split = [c for c in G.CONFIGS[16] if G.split_of(c) > 1][0]  # split-K at 2..16 rows: counters per module
        table = {1: list(G.CONFIGS[1][1]), 16: list(split)}
        n = 0
        for _, m, _ in GEMV.sites(blk):  # every linear layer and the fused first stage
            GEMV.switch_(m, table)
            n += 1
        calls = []
        real = G.gemv_op
        G.gemv_op = lambda *a: calls.append(a[1].shape) or real(*a)
        got = blk(x)
        G.gemv_op = real
        assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
        assert len(calls) == 4, calls  # the fused q/k/v first stage, k's u, o's v and u
        f = torch.compile(blk, fullgraph=True)
        assert torch.allclose(f(x), want, atol=1e-5)
        tickets = [b for name, b in blk.named_buffers() if name.endswith("gemv_counters")]
        assert len(tickets) == 4 and not any(t.any() for t in tickets)  # buffers, left zeroed
        assert not any("gemv" in k for k in blk.state_dict())  # not persistent
        calls.clear()
        G.gemv_op = lambda *a: calls.append(1) or real(*a)
        long = torch.randn(2, 17, 48)  # 34 rows: prefill, cuBLAS
        blk(long)
        G.gemv_op = real
        assert calls == []
    # with autograd on (parameters that require grad, as a loaded model has them): the compiled
    # forward traces through the op's autograd formula, and its gradients are the linear layers'
    assert_compiled_grads_match(blk, x, want, undo_triton_gemv_)
    assert n == 4
    print("ok", worst)
    """
)


@needs_triton
def test_gemv_kernel_in_triton_interpreter_matches_float64_and_dispatches():
    # no Inductor caches (run_interpreted): a cached backward graph let a broken autograd formula pass
    run_interpreted(f"SHAPES = {SHAPES!r}\n" + INTERPRETED, threads=1)


def test_dispatch_without_table_or_for_prefill_is_f_linear():
    x = torch.randn(2, 1, 16)
    w, b = torch.randn(8, 16), torch.randn(8)
    assert torch.equal(dispatch_linear(x, w, b, None), torch.nn.functional.linear(x, w, b))
    long = torch.randn(1, 17, 16)  # 17 rows > 16: never the kernel, whatever the table says
    assert torch.equal(dispatch_linear(long, w, b, {1: [8, 256, 4, 3], 16: [16, 128, 4, 4, 2]}),
                       torch.nn.functional.linear(long, w, b))  # fmt: skip


def test_row_classes_and_split_k_needs_counters():
    assert [row_class(r, G.CONFIGS) for r in (1, 2, 16)] == [1, 16, 16]
    assert row_class(0, G.CONFIGS) is None and row_class(17, G.CONFIGS) is None
    with pytest.raises(ValueError, match="1 to 16 rows"):
        G.gemv(torch.randn(17, 32), torch.randn(8, 32))
    x, w = torch.randn(4, 32), torch.randn(200, 32)  # 200 rows: at least 2 blocks of any tile
    split = next(c for c in G.CONFIGS[16] if G.split_of(c) > 1)
    with pytest.raises(ValueError, match="zeroed counters"):
        G._launch(x, w, None, torch.empty(4, 200), split)
    with pytest.raises(ValueError, match="zeroed counters"):  # too few tickets for the blocks
        G._launch(x, w, None, torch.empty(4, 200), split, torch.zeros(1, dtype=torch.int32))
    assert all(c in G.CONFIGS for c in G.ROW_CLASSES)
    # one ticket per block of the smallest tile any configuration uses
    assert G.new_counters(1000).numel() == -(-1000 // min(c[0] for cs in G.CONFIGS.values() for c in cs))


def test_use_triton_gemv_leaves_a_cpu_model_alone():
    m = nn.Sequential(nn.Linear(16, 8), nn.Linear(8, 4))
    info = use_triton_gemv_(m)
    assert info["modules"] == 0 and "reason" in info
    assert all(type(x) is nn.Linear for x in m if isinstance(x, nn.Linear))
    assert undo_triton_gemv_(m) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(
    "shape",
    SHAPES + [(1, 4096, 1736), (16, 1736, 4096), (1, 14336, 2712), (4, 1024, 704), (16, 3133, 4096)],
)
def test_gemv_matches_float64_on_gpu(shape, dtype):
    from gac.kernels import gemv as G

    rows, n, k = shape
    g = torch.Generator(device="cuda").manual_seed(rows * 31 + n + 7 * k)
    x = torch.randn(rows, k, device="cuda", generator=g).to(dtype)
    w = (torch.randn(n, k, device="cuda", generator=g) * k**-0.5).to(dtype)
    ref = x.double() @ w.double().t()
    counters = G.new_counters(n, "cuda")
    for cfg in G.CONFIGS[row_class(rows, G.CONFIGS)]:
        y = torch.empty(rows, n, device="cuda", dtype=dtype)
        G._launch(x, w, None, y, cfg, counters)
        assert ((y.double() - ref).norm() / ref.norm()).item() < 1e-2, cfg
        assert not counters.any(), cfg
        # split-K adds its slices in a fixed order: the same inputs give the same bits every launch
        y2 = torch.empty_like(y)
        G._launch(x, w, None, y2, cfg, counters)
        assert torch.equal(y, y2), cfg


@pytest.mark.gpu
def test_use_triton_gemv_on_gpu_is_measured_cached_and_exact_under_graphs(tmp_path, monkeypatch):

    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    m = nn.Sequential(nn.Linear(4096, 1736, bias=False), nn.Linear(1736, 4096, bias=False)).cuda().half()
    x = torch.randn(1, 4096, device="cuda", dtype=torch.half)
    want = m(x)
    info = use_triton_gemv_(m)
    assert (tmp_path / "gemv_dispatch.json").exists()
    table = GEMV.measured(torch.half, x.device)
    assert {"4096x1736@1", "1736x4096@1", "4096x1736@16", "1736x4096@16"} <= set(table)
    for rec in table.values():
        assert rec["cublas_us"] > 0 and ("triton_us" not in rec or rec["triton_us"] > 0)
        assert rec["use"] == ("triton_us" in rec and rec["triton_us"] < 0.97 * rec["cublas_us"])
    assert info["modules"] == sum(type(x) is GemvLinear for x in m)
    for rows in (1, 5, 16):
        x = torch.randn(rows, 4096, device="cuda", dtype=torch.half)
        with torch.no_grad():
            want = torch.nn.functional.linear(torch.nn.functional.linear(x, m[0].weight), m[1].weight)
            graph = torch.cuda.CUDAGraph()
            m(x)
            torch.cuda.synchronize()
            with torch.cuda.graph(graph):
                out = m(x)
            for _ in range(3):  # replays reuse the split-K tickets: each must find them zeroed
                graph.replay()
            torch.cuda.synchronize()
        assert torch.allclose(out.float(), want.float(), rtol=1e-2, atol=1e-2), rows


def test_fused_lowrank_dispatch_remeasures_records_without_the_current_configurations():
    from gac.kernels import lowrank_fused as L
    from gac.runtime.lowrank_fused import LOWRANK_FUSED

    fresh = LOWRANK_FUSED.fresh
    now = [list(c) for c in L.CONFIGS[16]]
    assert fresh({"tried": now + [[9] * 8]}, 16)
    assert not fresh({"tried": now[1:]}, 16)  # one current configuration never tried
    assert not fresh({"use": False, "config": None}, 16)  # recorded before "tried" existed
    assert fresh({"tried": [list(c) for c in L.CONFIGS[1]]}, 1)  # records of bare configurations
    assert fresh({"tried": [[list(c), 9.0 if i else None] for i, c in enumerate(L.CONFIGS[1])]}, 1)
    assert not fresh({"tried": [[list(c), 9.0] for c in L.CONFIGS[1][1:]]}, 1)


def test_gemv_dispatch_remeasures_records_without_the_current_configurations():
    fresh = GEMV.fresh
    now = [[list(c), 5.0] for c in G.CONFIGS[16]]
    rev = {"revision": G.REVISION}
    assert fresh({"tried": now + [[[9, 9, 9, 9], None]], **rev}, 16)
    assert fresh({"tried": [[c, None] for c, _ in now], **rev}, 2)  # failed ones were tried too
    assert not fresh({"tried": now[1:], **rev}, 16)
    assert not fresh({"use": False, "config": [4, 512, 4, 3], **rev}, 1)  # before split-K: stale
    # every configuration, timed on the kernel before its alignment hints (no revision): stale
    assert not fresh({"tried": now}, 16)
    assert not fresh({"tried": now, "revision": G.REVISION - 1}, 16)


@pytest.mark.gpu
def test_split_k_gemv_compiled_and_captured_matches_and_leaves_tickets_zeroed(tmp_path, monkeypatch):
    """The inference path: modules switched to split-K configurations, torch.compile, a CUDA graph."""
    from gac.kernels import gemv as G

    monkeypatch.setenv("GAC_CACHE", str(tmp_path))
    torch.manual_seed(0)
    m = (
        nn.Sequential(nn.Linear(4096, 1032, bias=True), nn.Linear(1032, 4096, bias=False))
        .cuda()
        .half()
        .eval()
    )
    split = next(c for c in G.CONFIGS[16] if G.split_of(c) > 1)
    for lin in m:  # force the split-K path whatever this GPU's dispatch would choose
        GEMV.switch_(lin, {16: list(split)})
    assert all(type(lin) is GemvLinear and lin.gemv_counters.numel() for lin in m)
    f = torch.compile(m, dynamic=False)
    x = torch.randn(8, 4096, device="cuda", dtype=torch.half)
    with torch.no_grad():
        want = torch.nn.functional.linear(torch.nn.functional.linear(x, m[0].weight, m[0].bias), m[1].weight)
        f(x)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = f(x)
        outs = []
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            outs.append(out.clone())
    assert all(torch.equal(o, outs[0]) for o in outs)  # deterministic across replays
    assert torch.allclose(outs[0].float(), want.float(), rtol=1e-2, atol=1e-2)
    assert all(not lin.gemv_counters.any() for lin in m)


def test_measure_shape_disqualifies_wrong_results_and_tickets_left_set(monkeypatch):
    """A configuration is timed only after one checked run; a bad one never becomes the choice."""
    good, wrong, stuck, stuck_in_replay = (4, 64, 4, 3), (8, 64, 4, 3), (16, 64, 4, 3, 2), (32, 64, 4, 3, 2)
    us = {good: 9.0, wrong: 1.0, stuck: 2.0, stuck_in_replay: 3.0}  # cuBLAS: 10.0
    last, made = {}, []

    def launch(x, w, b, y, cfg, counters=None):
        last["cfg"] = tuple(cfg)
        y.copy_(torch.nn.functional.linear(x, w, b) * (2 if cfg == wrong else 1))
        if cfg == stuck:
            counters[0] = 1

    def bench(fn, reps=64, samples=15):  # stands in for the CUDA-graph timing
        fn(0)
        if last.get("cfg") == stuck_in_replay:
            made[0][1] = 1
        return us.get(last.get("cfg"), 10.0)

    real_new = G.new_counters
    monkeypatch.setattr(G, "new_counters", lambda n, d=None: made.append(real_new(n, d)) or made[-1])
    monkeypatch.setattr(G, "_launch", launch)
    monkeypatch.setattr(G, "bench_graph", bench)
    configs = (wrong, stuck, stuck_in_replay, good)
    rec = G.measure_shape(40, 64, 4, torch.float32, torch.device("cpu"), configs=configs)
    assert rec["config"] == list(good) and rec["triton_us"] == 9.0 and rec["use"] is True
    assert [t for _, t in rec["tried"]] == [None, None, None, 9.0]
    assert "rel err" in rec["failed"][0] and "tickets 1 left" in rec["failed"][1]
    assert "graph replay" in rec["failed"][2]
    assert not made[0].any()  # left zeroed for the next configuration
