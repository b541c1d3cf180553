"""Parallel second stages of fused groups (gac.kernels.branches): the streams op against F.linear, the
grouped Triton launch against float64 (in Triton's CPU interpreter), a switched block against the
unswitched one (eager, compiled, with gradients), dispatch by row class, the record round trip, the
latency model's launch count, and on a GPU both paths inside a CUDA graph."""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from gac.hardware.dispatch_table import choice, row_class
from gac.kernels import branches as B
from gac.kernels import gemv as G
from gac.kernels.lowrank_fused import site_key
from gac.nn.fused import FusedInputProjection, fuse_projections_
from gac.runtime import branches as RB
from gac.runtime.step import capture_graph

from .interp import HAVE_TRITON, needs_triton, run_interpreted
from .test_lowrank_fused import BLOCK_SCRIPT, Block, switched_on_gpu


def _block(d: int = 48, seed: int = 0) -> Block:
    torch.manual_seed(seed)
    blk = Block(d).eval()
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.2)
    return blk


def test_branch_linears_equals_f_linear_on_the_members_columns_with_and_without_bias():
    torch.manual_seed(0)
    t = torch.randn(5, 7 + 5 + 13 + 29)  # columns 7..12 belong to a dense member: not read
    offs = [0, 12, 25]
    ws = [torch.randn(40, 7), torch.randn(24, 13), torch.randn(70, 29)]
    bs = [torch.empty(0), torch.randn(24), torch.randn(70)]  # empty: no bias
    got = B.branch_linears(t, offs, ws, bs)
    for g, o, w, b in zip(got, offs, ws, bs, strict=True):
        assert g.shape == (5, w.shape[0])
        want = F.linear(t[:, o : o + w.shape[1]], w, b if b.numel() else None)
        assert torch.allclose(g, want, atol=1e-6)
    with pytest.raises(ValueError, match="do not fit"):
        B.branch_linears(t, [0, 12, 26], ws, bs)  # the last member would run past t
    with pytest.raises(ValueError, match="2 offsets for 3 weights"):
        B.branch_linears(t, [0, 12], ws, bs)


def test_members_at_odd_offsets_get_the_sequential_paths_aligned_copies():
    from gac.nn.fused import aligned_split

    t = torch.randn(3, 8 + 8 + 16, dtype=torch.bfloat16)  # rows of 64 bytes
    assert B._aligned(t[:, 8:16]).data_ptr() == t[:, 8:16].data_ptr()  # 16-byte offset: a view
    odd = B._aligned(t[:, 7:15])  # 14-byte offset: copied, as aligned_split copies it
    assert odd.is_contiguous() and torch.equal(odd, t[:, 7:15])
    parts = aligned_split(t, [7, 9, 16])
    assert parts[1].is_contiguous() and parts[1].data_ptr() != t[:, 7:16].data_ptr()
    # the branched path leaves the factorized members' slices to the op: not sliced, not copied
    kept = aligned_split(t, [7, 9, 16], keep=[True, False, True])
    assert kept[1] is None and kept[0].data_ptr() == t.data_ptr() and torch.equal(kept[2], parts[2])
    u = torch.randn(3, 21 + 5, dtype=torch.bfloat16)  # rows of 52 bytes: every row but one misaligned
    assert B._aligned(u[:, :8]).is_contiguous() and B._aligned(u[:1, :8]).data_ptr() == u.data_ptr()


def test_branch_linears_gradients_match_the_sequential_layers():
    torch.manual_seed(1)
    t = torch.randn(6, 30, dtype=torch.float64, requires_grad=True)
    ws = [torch.randn(9, 10, dtype=torch.float64, requires_grad=True),
          torch.randn(4, 12, dtype=torch.float64, requires_grad=True)]  # fmt: skip
    bs = [torch.empty(0, dtype=torch.float64), torch.randn(4, dtype=torch.float64, requires_grad=True)]
    offs = [0, 18]  # columns 10..17: a dense member's, gradient zero here
    ys = B.branch_linears(t, offs, ws, bs)
    (ys[0].sin().sum() + ys[1].pow(2).sum()).backward()
    got = [t.grad, ws[0].grad, ws[1].grad, bs[1].grad]
    for p in (t, *ws, bs[1]):
        p.grad = None
    y0 = F.linear(t[:, :10], ws[0])
    y1 = F.linear(t[:, 18:30], ws[1], bs[1])
    (y0.sin().sum() + y1.pow(2).sum()).backward()
    for g, w in zip(got, [t.grad, ws[0].grad, ws[1].grad, bs[1].grad], strict=True):
        assert torch.allclose(g, w, atol=1e-12)
    assert torch.equal(got[0][:, 10:18], torch.zeros(6, 8, dtype=torch.float64))


GROUPED = textwrap.dedent(
    """
    import torch
    from gac.hardware.dispatch_table import row_class
    from gac.kernels import branches as B, gemv as G
    from gac.nn.fused import FusedInputProjection, fuse_projections_
    from gac.kernels.lowrank_fused import site_key
    from gac.runtime import branches as RB
    from gac.testing import assert_compiled_grads_match

    torch.manual_seed(0)
    worst = 0.0
    # two and three members, at odd offsets and after a dense member's columns, bias on some; every
    # configuration of both row classes, float32 and float16, against float64
    for dt in (torch.float32, torch.float16):
        for rows in (1, 3, 16):
            for ks, ns, bias in (([7, 13], [40, 24], (0, 1)), ([64, 32, 40], [256, 64, 64], (1, 0, 1)),
                                 ([9, 5, 30], [33, 17, 8], (0, 0, 0))):
                width = sum(ks) + 11
                t = torch.randn(rows, width + 3, dtype=dt)[:, :width]  # rows strided apart
                offs = [2]
                for k in ks[:-1]:
                    offs.append(offs[-1] + k + (5 if len(offs) == 1 else 0))  # a dense member's 5 columns
                ws = [(torch.randn(n, k) * k ** -0.5).to(dt) for n, k in zip(ns, ks)]
                bs = [torch.randn(n, dtype=dt) if b else torch.empty(0, dtype=dt) for n, b in zip(ns, bias)]
                for cfg in G.GROUP_CONFIGS[row_class(rows, G.GROUP_CONFIGS)]:
                    got = B.second_stages(t, offs, ws, bs, list(cfg))
                    for y, o, w, b in zip(got, offs, ws, bs):
                        ref = t[:, o : o + w.shape[1]].double() @ w.double().t()
                        ref = ref + b.double() if b.numel() else ref
                        err = ((y.double() - ref).norm() / ref.norm()).item()
                        assert err < (1e-6 if dt == torch.float32 else 2e-3), (dt, rows, ks, cfg, err)
                        worst = max(worst, err) if dt == torch.float32 else worst
    try:
        G.group_launch(t, [0], ws[:1], [None], [torch.empty(16, 33)], G.GROUP_CONFIGS[16][0])
        raise AssertionError("one member accepted")
    except ValueError as e:
        assert "2 or 3 members" in str(e)

    # the dispatch's timing function computes the group's products (CPU: no timing)
    from gac.kernels.lowrank_fused import site_setup

    su = site_setup(48, [7, 13, 24], [40, 24, None], 3, torch.float32, torch.device("cpu"), l2_bytes=30_000)
    for cfg in G.GROUP_CONFIGS[16]:
        assert B._error(B.branched_fn(su, [7, 13, 24], [40, 24, None], list(cfg))(0), su.ref, [7, 13, 24], [40, 24, None]) < 1e-6
    assert B._error([y * 1.1 for y in B.branched_fn(su, [7, 13, 24], [40, 24, None], list(cfg))(0)], su.ref,
                    [7, 13, 24], [40, 24, None]) > 0.05  # a wrong product is seen

    # a block switched to the grouped launch at 2-16 rows: eager and compiled equal the unswitched
    # block, its gradients the layers' own
    blk = Block().eval()
    with torch.no_grad():
        for p in blk.parameters():
            p.normal_(0, 0.2)
    x16 = torch.randn(4, 4, 48)
    x1 = torch.randn(1, 1, 48)
    with torch.no_grad():
        fuse_projections_(blk)
        want16, want1 = blk(x16), blk(x1)
        cfg = list(G.GROUP_CONFIGS[16][-1])
        groups = RB.groups(blk)
        assert RB.BRANCHES.switch_sites_(groups, {site_key(k, list(sp), list(o)): {1: None, 16: cfg} for _, _, (k, sp, o) in groups}) == 2
        calls = []
        real = B.group_gemv
        B.group_gemv = lambda *a: calls.append(len(a[2])) or real(*a)
        got16 = blk(x16)
        got1 = blk(x1)
        B.group_gemv = real
        assert calls == [2, 2], calls  # q and k (v is dense), gate and up; none at one row
        assert torch.allclose(got16, want16, atol=1e-5) and torch.equal(got1, want1)
        f = torch.compile(blk, fullgraph=True)
        assert torch.allclose(f(x16), want16, atol=1e-5)
        assert all(m._parts == [] for m in blk.modules() if isinstance(m, FusedInputProjection))

    def undo(m):
        assert RB.undo_branches_(m) == 2

    assert_compiled_grads_match(blk, x16, want16, undo)
    print("ok", worst)
    """
)


@needs_triton
def test_grouped_second_stages_in_triton_interpreter_match_float64_and_the_unswitched_block():
    run_interpreted(BLOCK_SCRIPT + GROUPED, threads=2)


def test_decisions_round_trip_streams_and_grouped_configurations():
    how = RB.BRANCHES.value
    assert how(True) is True and how(None) is None and how(False) is None
    assert how((32, 128, 4, 4, 1, 1)) == [32, 128, 4, 4, 1, 1]
    table = {1: None, 16: [32, 128, 4, 4]}
    assert choice(table, 16) == [32, 128, 4, 4] and choice(table, 1) is None and choice(None, 16) is None
    assert choice({1: None, 16: True}, 17) is None  # past every row class
    blk = _block()
    fuse_projections_(blk)
    shapes = {site_key(k, list(sp), list(o)): {"1": True, "16": [16, 256, 4, 3]}
              for _, _, (k, sp, o) in RB.groups(blk)}  # fmt: skip
    assert RB.switch_recorded_(blk, shapes) == 2
    assert {str(m.branch_table) for m in blk.modules() if getattr(m, "branch_table", None)} == {
        "{1: True, 16: [16, 256, 4, 3]}"
    }


@pytest.mark.skipif(not HAVE_TRITON, reason="the grouped launch's configurations need Triton")
def test_branch_dispatch_remeasures_records_without_the_grouped_launch():
    old = {"sequential_us": 20.0, "branched_us": 15.0, "use": True, "config": True}  # streams only
    fresh = RB.BRANCHES.fresh
    assert not fresh(old, 16)
    tried = [[list(c), 9.0] for c in G.GROUP_CONFIGS[16]]
    assert fresh({**old, "revision": G.REVISION, "tried": tried}, 16)
    assert not fresh({**old, "revision": G.REVISION - 1, "tried": tried}, 16)
    assert not fresh({**old, "revision": G.REVISION, "tried": tried[:-1]}, 16)


def test_groups_need_two_factorized_members():
    blk = _block()
    fuse_projections_(blk)
    groups = RB.groups(blk)
    # q/k factorized with v dense, and gate/up: both groups qualify; o_proj/down_proj are no groups
    assert sorted(g[0] for g in groups) == ["fused_gate_up", "fused_q_k_v"]
    assert [g[2] for g in groups if g[0] == "fused_q_k_v"] == [(48, (7, 13, 24), (40, 24, None))]


def test_switched_block_equals_unswitched_only_at_the_row_classes_it_names():
    blk = _block()
    fuse_projections_(blk)
    keys = {site_key(k, list(sp), list(o)): True for _, _, (k, sp, o) in RB.groups(blk)}
    x1 = torch.randn(1, 1, 48)  # 1 row: a class the table leaves sequential
    x16 = torch.randn(4, 4, 48)  # 16 rows
    x40 = torch.randn(5, 8, 48)  # 40 rows: past every row class
    with torch.no_grad():
        want1, want16, want40 = blk(x1), blk(x16), blk(x40)
        assert RB.BRANCHES.switch_sites_(RB.groups(blk), {k: {1: None, 16: True} for k in keys}) == 2
        calls = []
        real = B.branch_linears
        B.branch_linears = lambda *a: calls.append(len(a[2])) or real(*a)
        try:
            got1 = blk(x1)
            n1 = list(calls)
            got16 = blk(x16)
            n16 = list(calls)
            calls.clear()
            got40 = blk(x40)
        finally:
            B.branch_linears = real
    assert n1 == [] and torch.equal(got1, want1)  # the table's 1-row decision is None: sequential
    assert n16 == [2, 2]  # q and k of the q/k/v group (v is dense), gate and up
    assert calls == []  # more rows than any class: the sequential path
    assert torch.allclose(got16, want16, atol=1e-6) and torch.equal(got40, want40)
    # every fused group's state is empty again (nothing kept between forwards)
    assert all(m._parts == [] for m in blk.modules() if isinstance(m, FusedInputProjection))


def test_switched_block_compiles_whole_with_the_layers_gradients():
    from gac.testing import assert_compiled_grads_match

    blk = _block()
    x = torch.randn(2, 8, 48)
    with torch.no_grad():
        want = blk(x)
        fuse_projections_(blk)
        table = {site_key(k, list(sp), list(o)): {16: True} for _, _, (k, sp, o) in RB.groups(blk)}
        RB.BRANCHES.switch_sites_(RB.groups(blk), table)

    def undo(m):
        assert RB.undo_branches_(m) == 2

    assert_compiled_grads_match(blk, x, want, undo)


def test_recorded_switch_round_trip_and_cpu_model_left_alone():
    blk = _block()
    fuse_projections_(blk)
    assert RB.use_branches_(blk) == {"modules": 0, "of": 0, "reason": "not on CUDA"}
    assert all(getattr(m, "branch_table", None) is None for m in blk.modules())
    shapes = {site_key(k, list(sp), list(o)): {"16": True} for _, _, (k, sp, o) in RB.groups(blk)}
    assert RB.switch_recorded_(blk, shapes) == 2
    assert {m.branch_table[16] for m in blk.modules() if getattr(m, "branch_table", None)} == {True}
    assert RB.undo_branches_(blk) == 2 and RB.undo_branches_(blk) == 0


def test_latency_model_prices_a_branched_group_as_one_second_stage_launch():
    from gac.hardware.latency import Point, predict
    from gac.hardware.profile import default_profile
    from gac.testing import factorize_at_odd_ranks, tiny_model

    model = factorize_at_odd_ranks(tiny_model("llama"))
    fuse_projections_(model)
    prof = default_profile()
    point = Point("decode", batch=16, kv=64)
    before = predict(model, prof, point)
    groups = RB.groups(model)
    branched = sum(sum(o is not None for o in g[2][2]) - 1 for g in groups)
    assert groups and branched > 0
    RB.BRANCHES.switch_sites_(
        groups, {site_key(k, list(sp), list(o)): {16: True} for _, _, (k, sp, o) in groups}
    )
    after = predict(model, prof, point)
    assert after["gemm_launches"] == before["gemm_launches"] - branched
    assert after["ms"] < before["ms"]
    # at a row class without a decision nothing changes
    p64 = Point("decode", batch=64, kv=64)
    RB.undo_branches_(model)
    ref64 = predict(model, prof, p64)
    RB.BRANCHES.switch_sites_(
        groups, {site_key(k, list(sp), list(o)): {16: True} for _, _, (k, sp, o) in groups}
    )
    assert predict(model, prof, p64)["gemm_launches"] == ref64["gemm_launches"]


def test_the_dispatch_times_a_branched_path_that_matches_the_float64_reference():
    from gac.kernels.lowrank_fused import site_setup

    torch.manual_seed(0)
    su = site_setup(48, [7, 13, 24], [40, 24, None], 3, torch.float32, torch.device("cpu"), l2_bytes=30_000)
    branched = B.branched_fn(su, [7, 13, 24], [40, 24, None])
    for i in (0, su.copies):  # copy 0, and copy 0 again after a full rotation
        y_q, y_k = branched(i)
        got = torch.cat([y_q, y_k, su.t[:, 20:]], -1)  # the dense member's output is its slice
        assert ((got.double() - su.ref).norm() / su.ref.norm()).item() < 1e-6
    y_q1, _ = branched(1)  # another weight copy: another product
    assert not torch.allclose(y_q1, y_q)


def test_row_classes_cover_decode_batches_of_up_to_16_rows_only():
    assert RB.BRANCHES.classes == B.ROW_CLASSES
    assert [row_class(r, B.ROW_CLASSES) for r in (1, 2, 16)] == [1, 16, 16]
    # more rows keep the sequential path (branches lost in whole compiled steps at 64 and 128 rows)
    assert all(row_class(r, B.ROW_CLASSES) is None for r in (0, 17, 64, 128, 2048, 4096))


# ------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["streams", "grouped"])
@pytest.mark.parametrize("rows", [1, 16])
def test_branches_in_a_cuda_graph_equal_the_sequential_path(rows, how):
    from gac.testing import factorize_at_odd_ranks, tiny_model

    torch.manual_seed(0)
    model = factorize_at_odd_ranks(tiny_model("llama", dtype=torch.bfloat16).cuda())
    fuse_projections_(model)
    ids = torch.randint(0, 250, (rows, 1), device="cuda")
    path = True if how == "streams" else list(G.GROUP_CONFIGS[row_class(rows, G.GROUP_CONFIGS)][-1])
    with torch.no_grad():
        want = model(ids, use_cache=False).logits
        # the compiled model without branches: bf16 logits of a compiled step differ from eager ones
        # (on the H200 by up to 1.01e-2 relative), not from each other with and without branches
        torch._dynamo.reset()
        want_c = torch.compile(model, dynamic=False)(ids, use_cache=False).logits.clone()
        torch._dynamo.reset()
        groups = RB.groups(model)
        assert RB.BRANCHES.switch_sites_(groups, {site_key(k, list(sp), list(o)): {c: path for c in B.ROW_CLASSES}
                                  for _, _, (k, sp, o) in groups}) == len(groups) > 0  # fmt: skip
        eager = model(ids, use_cache=False).logits
        if how == "streams":
            assert torch.equal(eager, want)  # the same cuBLAS calls
        else:  # another kernel's fp32 sums, rounded to bf16 once per product
            assert ((eager.double() - want.double()).norm() / want.double().norm()).item() < 1e-2
        f = torch.compile(model, dynamic=False)
        replay, _ = capture_graph(lambda: f(ids, use_cache=False).logits, ids.device)  # the sweep's capture
        for _ in range(10):
            out = replay()
            torch.cuda.synchronize()
            err = ((out.double() - want_c.double()).norm() / want_c.double().norm()).item()
            assert err < (1e-3 if how == "streams" else 1e-2), err
            err = ((out.double() - want.double()).norm() / want.double().norm()).item()
            assert err < 2e-2, err


@pytest.mark.gpu
def test_use_branches_on_gpu_is_measured_cached_and_exact(tmp_path, monkeypatch):
    blk, info, want, got = switched_on_gpu(tmp_path, monkeypatch, RB.use_branches_, (4, 4))
    assert (tmp_path / RB.BRANCHES.cache).exists() and info["of"] == 2
    table = RB.measured(torch.half, want.device)
    assert len(table) == len(B.ROW_CLASSES) * 2
    for rec in table.values():
        assert rec["sequential_us"] > 0 and rec["branched_us"] > 0 and RB.BRANCHES.fresh(rec, rec["rows"])
        times = [rec["branched_us"]] + [us for _, us in rec["tried"] if us is not None]
        assert len(times) > 1 and rec["best_us"] == min(times)  # the grouped launch ran in some configuration
        assert rec["use"] == (rec["best_us"] < 0.97 * rec["sequential_us"])
    paths = [v for m in blk.modules() for v in (getattr(m, "branch_table", None) or {}).values() if v]
    if any(isinstance(v, list) for v in paths):
        assert torch.allclose(got.float(), want.float(), rtol=1e-2, atol=1e-2)
    else:
        assert torch.equal(got, want)  # streams: the same cuBLAS calls


class _AlignedQKV(torch.nn.Module):
    """A q/k/v group factorized at ranks that are multiples of 8 (what ``--align gac`` selects)."""

    def __init__(self, d: int = 256) -> None:
        super().__init__()
        from gac.nn import FactorizedLinear

        self.q_proj = FactorizedLinear(d, 64, 256)
        self.k_proj = FactorizedLinear(d, 32, 64)
        self.v_proj = FactorizedLinear(d, 40, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], -1)


@pytest.mark.gpu
def test_compiled_branched_group_hands_the_first_stage_to_the_op_uncopied():
    # On the H200 (torch 2.11) the op once took the members' slices, and Inductor copied each into a
    # contiguous buffer by a kernel of its own (`triton_poi_fused__unsafe_view_branch_linears_split_...`,
    # 40 a decode step of the Llama SVD-LLM cell): no kernel may feed the op now.
    import re

    from torch._inductor.utils import run_and_get_code

    torch.manual_seed(0)
    m = _AlignedQKV().to("cuda", torch.bfloat16).eval()
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        want = m(x)
        fuse_projections_(m)
        groups = RB.groups(m)
        assert (
            RB.BRANCHES.switch_sites_(
                groups, {site_key(k, list(sp), list(o)): {16: True} for _, _, (k, sp, o) in groups}
            )
            == 1
        )
        torch._dynamo.reset()
        got, codes = run_and_get_code(torch.compile(m, dynamic=False), x)
    torch.testing.assert_close(got, want)
    code = "\n".join(codes)
    assert "gac.branch_linears" in code
    assert re.search(r"triton_\w*branch_linears\w*\s*=\s*async_compile", code) is None
