"""Second stages of a fused group in parallel (CUDA streams or one grouped launch), where measured faster.

A fused q/k/v (or gate/up) group of factorized members (:mod:`gac.nn.fused`) runs one GEMM
for the members' first factors, then one GEMM per member for its second factor ``u``.  Those are
independent of each other, yet a captured decode step runs them one after the other, and at 2 to a
few hundred token rows each is a small, latency-bound launch: the k and v ones (``rank x 1024``)
fill a few of the GPU's SMs and each costs ≈ 5 µs beyond its bytes on an H200
(``benchmarks/results/h200/decode-diag/``).  SVD-LLM's allocation factorizes every site, so a Llama
decode step launches 89 GEMMs against dense's 33, and at 16 rows (where the one-launch kernel of
:mod:`gac.kernels.lowrank_fused` loses to cuBLAS) that is what keeps it below dense.

:func:`branch_linears` (the custom op ``gac::branch_linears``) runs the members' second factors as
parallel branches: member 0 on the current stream, each other member on a side stream that waits
for the first stage and is joined back before anything reads the outputs.  A CUDA graph captures
them as parallel nodes, so their kernels overlap.  The products are cuBLAS's, the same calls as
the sequential path (exact: nothing is reordered inside a GEMM; a member that the sequential path
would route to the Triton GEMV of :mod:`gac.kernels.gemv` takes cuBLAS in a branch, and the dispatch's
sequential timing is cuBLAS throughout).  On CPU the op runs them in turn.

Measured on the H200 (``benchmarks/results/h200/speed-branches/``): at 16 rows the SVD-LLM q/k/v
groups of the Llama-3-8B shape took 22.5 instead of 28.5 µs, and whole decode steps at B16 gained
2.8% (Llama) and 4.4% (Qwen2.5) in a same-machine A/B of eager steps; at 64 and 128 rows the isolated
measurement chose branches that cost the eager Llama step 0.9% and 1.6% (Qwen's gained); in compiled
steps they cost three of the four speed-grid cells 0.4-2.1% at 64 and 128 rows, so only decode
batches of up to 16 rows are branched (:data:`ROW_CLASSES`).  The op takes
the first stage whole (see :func:`branch_linears`); when it took the members' slices, the compiled step
copied each first, and dropping those copies shortened the compiled SVD-LLM steps at B16/B64 by 1.4-4.4%
(``benchmarks/results/h200/decode-trace/``, ``speed-branches-t/``).

:func:`group_gemv` (the custom op ``gac::group_gemv``) is the other parallel path: the members' second
factors as one Triton launch (:func:`gac.kernels.gemv.group_launch`: each program computes a block of one
member's output, so the small k and v products share the grid with q's instead of each filling a
launch of its own).  Its sums are the kernel's own, not cuBLAS's (checked against float64 in the tests).
On an H100 (``benchmarks/results/h100/grouped-ab/``) it made compiled Qwen2.5-7B-shape SVD-LLM decode steps
at B16 3.4% shorter than streams did (its q/k/v groups 18.6 against 19.8 µs, gate/up 83.3 against
87.8); in the Llama-3-8B cell cuBLAS's parallel gate/up calls stayed faster and the step gained 0.2%.

Dispatch (:func:`gac.runtime.branches.use_branches_`): every fused group with at least two factorized members is timed
once per machine at each row class of :data:`ROW_CLASSES` (the whole group, first stage included,
sequential against branched and against the grouped launch in each configuration of
:data:`gac.kernels.gemv.GROUP_CONFIGS`, 64 calls to a CUDA graph over weights rotated past L2) and takes
the faster parallel path only at the row classes where it beat the sequential one by ``margin``.  Decisions are cached in
``$GAC_CACHE/branch_dispatch.json`` per GPU, torch, Triton and dtype.  An input of more rows than
the largest class keeps the sequential path (compute-bound GEMMs gain nothing from overlap).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gac.hardware.dispatch_table import row_class
from gac.hardware.timing import bench_graph, time_configs
from gac.kernels.gemv import GROUP_CONFIGS, REVISION, group_launch, swap_of
from gac.kernels.jit import HAVE_TRITON
from gac.kernels.lowrank_fused import site_setup

#: row classes measured per group shape: an input of ``rows`` token rows takes the decision of the
#: smallest class ``>= rows``; more rows than 16 keep the sequential path.  The isolated timing also
#: chose branches at 64 to 2048 rows, but in whole compiled, captured steps
#: (``benchmarks/results/h200/speed-rows/branches_ab_compiled.json``) they cost 1.1-2.1% at 128 rows
#: (prefill B1 x 128) in three of the four speed-grid cells (the fourth: 0.0%) and 0.4-1.5% at 64 rows
#: (decode B64) in three (Qwen2.5 SVD-LLM gained 0.9%), while at 16 rows all four gained 0.9-4.9%.
ROW_CLASSES = (1, 16)
_STREAMS: dict[tuple[str, int | None], list[torch.cuda.Stream]] = {}


def _side_streams(device: torch.device, n: int) -> list[torch.cuda.Stream]:
    """``n`` side streams of ``device``, created once and reused (a graph replays the ones it captured)."""
    key = (device.type, device.index if device.index is not None else torch.cuda.current_device())
    got = _STREAMS.setdefault(key, [])
    while len(got) < n:
        got.append(torch.cuda.Stream(device))
    return got[:n]


@torch.library.custom_op("gac::branch_linears", mutates_args=())
def branch_linears(
    t: torch.Tensor, offs: list[int], ws: list[torch.Tensor], bs: list[torch.Tensor]
) -> list[torch.Tensor]:
    """``[F.linear(t[:, o : o + w.shape[1]], w, b) for ...]`` with each product after the first on its own CUDA stream.

    ``t`` is the group's first-stage output, 2-D ``[M, R]`` (any row stride); member ``i`` reads
    the ``ws[i].shape[1]`` columns of ``t`` from ``offs[i]``.  The op takes ``t`` whole, not the
    members' slices: ``torch.compile`` materialises each strided slice handed to a custom op as a
    contiguous copy (one small kernel per member, on the H200 ~1.6 µs with its launch gap: more than
    the branches saved at some row classes), while a slice taken inside the op is a free view (a
    member at an odd offset is copied there, as the sequential path copies it: :func:`_aligned`).
    ``ws[i]`` is ``[N_i, K_i]``, ``bs[i]`` ``[N_i]`` or empty for no bias (a list of optional tensors
    does not survive the op's autograd).  The outputs are allocated on the current stream before the
    fork, every side stream waits for the current one and the current one waits for every side
    stream at the end: inputs and outputs are never used or freed while a branch may still run.
    """
    xs = [_aligned(x) for x in _slices(t, offs, ws)]
    outs = [torch.empty((t.shape[0], w.shape[0]), device=t.device, dtype=t.dtype) for w in ws]
    if t.device.type != "cuda":
        for x, w, b, y in zip(xs, ws, bs, outs, strict=True):
            y.copy_(F.linear(x, w, b if b.numel() else None))
        return outs
    main = torch.cuda.current_stream(t.device)
    side = _side_streams(t.device, len(xs) - 1)
    for s in side:
        s.wait_stream(main)
    for s, x, w, b, y in zip(side, xs[1:], ws[1:], bs[1:], outs[1:], strict=True):
        with torch.cuda.stream(s):
            _mm(x, w, b, y)
    _mm(xs[0], ws[0], bs[0], outs[0])
    for s in side:
        main.wait_stream(s)
    return outs


def _slices(t: torch.Tensor, offs: list[int], ws: list[torch.Tensor]) -> list[torch.Tensor]:
    if len(offs) != len(ws) or not ws:
        raise ValueError(f"branch_linears: {len(offs)} offsets for {len(ws)} weights")
    xs = [t[:, o : o + w.shape[1]] for o, w in zip(offs, ws, strict=True)]
    for o, x, w in zip(offs, xs, ws, strict=True):
        if o < 0 or x.shape[1] != w.shape[1]:
            raise ValueError(
                f"branch_linears: columns {o}..{o + w.shape[1]} do not fit t of width {t.shape[1]}"
            )
    return xs


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """``x``, or a contiguous copy where its data or its rows do not start on 16-byte boundaries.

    The rule of :func:`gac.nn.fused.aligned_split` for the sequential path's slices (a member at
    an odd offset: ranks not multiples of 8), so both paths hand cuBLAS the same operands and give the
    same bits; with ``--align gac`` ranks nothing is copied.
    """
    rows_aligned = x.shape[0] == 1 or (x.stride(0) * x.element_size()) % 16 == 0
    return x if x.data_ptr() % 16 == 0 and rows_aligned else x.contiguous()


def _mm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor) -> None:
    if not b.numel():
        torch.mm(x, w.t(), out=y)
    else:
        torch.addmm(b, x, w.t(), out=y)


@branch_linears.register_fake
def _(t, offs, ws, bs):  # noqa: ANN001, ANN202 - shapes only
    _slices(t, offs, ws)
    return [t.new_empty((t.shape[0], w.shape[0])) for w in ws]


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    t, offs, ws, bs = inputs
    ctx.save_for_backward(t, *ws)
    ctx.offs = list(offs)
    ctx.has_bias = [b.numel() > 0 for b in bs]


def _backward(ctx, gys: list[torch.Tensor]):  # noqa: ANN001, ANN202
    # an inference op, but a model whose parameters require grad is traced by torch.compile with
    # autograd in view: the linear layers' gradients, computed in turn
    t, *ws = ctx.saved_tensors
    xs = _slices(t, ctx.offs, ws)
    gt = torch.zeros_like(t)
    for o, gy, w in zip(ctx.offs, gys, ws, strict=True):
        gt[:, o : o + w.shape[1]] += gy @ w
    gws = [gy.t() @ x for gy, x in zip(gys, xs, strict=True)]
    gbs = [gy.sum(0) if hb else None for gy, hb in zip(gys, ctx.has_bias, strict=True)]
    return gt, None, gws, gbs


branch_linears.register_autograd(_backward, setup_context=_setup)


@torch.library.custom_op("gac::group_gemv", mutates_args=())
def group_gemv(
    t: torch.Tensor,
    offs: list[int],
    ws: list[torch.Tensor],
    bs: list[torch.Tensor],
    block_n: int,
    block_k: int,
    warps: int,
    stages: int,
    swap: int,
) -> list[torch.Tensor]:
    """What :func:`branch_linears` computes, as one Triton launch (:func:`gac.kernels.gemv.group_launch`).

    Two or three members, ``t`` of at most 16 rows; the arguments are :func:`branch_linears`'s and a
    configuration of :data:`gac.kernels.gemv.GROUP_CONFIGS`.  Every member is a block-row range of one
    grid: the k and v second factors (``rank x 1024``) no longer occupy a launch of their own with a
    few SMs busy, and nothing waits for a side stream.  Members at any offset are read in place (the
    kernel is told their alignment), so none is copied.
    """
    _slices(t, offs, ws)
    outs = [torch.empty((t.shape[0], w.shape[0]), device=t.device, dtype=t.dtype) for w in ws]
    group_launch(
        t if t.stride(-1) == 1 else t.contiguous(), list(offs), [w.contiguous() for w in ws],
        [b if b.numel() else None for b in bs], outs, (block_n, block_k, warps, stages, 1, swap),
    )  # fmt: skip
    return outs


@group_gemv.register_fake
def _(t, offs, ws, bs, block_n, block_k, warps, stages, swap):  # noqa: ANN001, ANN202 - shapes only
    _slices(t, offs, ws)
    return [t.new_empty((t.shape[0], w.shape[0])) for w in ws]


def _group_setup(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    _setup(ctx, inputs[:4], output)


def _group_backward(ctx, gys: list[torch.Tensor]):  # noqa: ANN001, ANN202
    return (*_backward(ctx, gys), None, None, None, None, None)


group_gemv.register_autograd(_group_backward, setup_context=_group_setup)


def second_stages(
    t: torch.Tensor, offs: list[int], ws: list[torch.Tensor], bs: list[torch.Tensor], how: Any
) -> list[torch.Tensor]:
    """The members' second factors by the path ``how`` names: True, parallel streams
    (:func:`branch_linears`); a configuration (list), one grouped launch (:func:`group_gemv`)."""
    if isinstance(how, (list, tuple)):  # a configuration of ints (:func:`_how`)
        return group_gemv(t, offs, ws, bs, *how[:4], swap_of(how))
    return branch_linears(t, offs, ws, bs)


def apply_seconds(
    y: torch.Tensor,
    splits: list[int],
    parts: list[torch.Tensor | None],
    seconds: list[nn.Module | None],
    how: Any = True,
) -> list[torch.Tensor | None]:
    """Each factorized member's ``u`` applied to its columns of ``y``, all in one :func:`second_stages` call.

    ``y`` is the fused first stage's output (members' widths ``splits``, in order); ``seconds[i]``
    member ``i``'s ``u``, or None for a dense member, whose slice ``parts[i]`` is its output already
    and is passed through (a factorized member's entry of ``parts`` is replaced, and may be None).
    ``how``: the group's decision at this row class (:func:`second_stages`).
    """
    idx = [i for i, u in enumerate(seconds) if u is not None]
    offs = [sum(splits[:i]) for i in idx]
    ws = [seconds[i].weight for i in idx]  # type: ignore[union-attr]
    bs = [
        seconds[i].bias if seconds[i].bias is not None else w.new_empty(0)
        for i, w in zip(idx, ws, strict=True)
    ]  # type: ignore[union-attr]
    ys = second_stages(y.reshape(-1, y.shape[-1]), offs, ws, bs, how)
    out = list(parts)
    for i, o in zip(idx, ys, strict=True):
        out[i] = o.reshape(*y.shape[:-1], o.shape[-1])
    return out


# ------------------------------------------------------------------------------ measuring


def measure_group(
    k: int, splits: list[int], outs: list[int | None], rows: int, dtype: torch.dtype, device: torch.device,
    margin: float = 0.97,
) -> dict[str, Any]:  # fmt: skip
    """Time one group's shape at ``rows`` rows: sequential second stages, branched ones, and one grouped
    launch in each configuration of :data:`gac.kernels.gemv.GROUP_CONFIGS` (each first checked against the
    float64 reference: a wrong result disqualifies it).  The faster parallel path is used where it beat
    the sequential one by ``margin``: ``config`` True (streams) or the grouped launch's configuration."""
    s = site_setup(k, splits, outs, rows, dtype, device)
    branched = branched_fn(s, splits, outs)
    rec: dict[str, Any] = {"k": k, "splits": list(splits), "outs": list(outs), "rows": rows,
                           "revision": REVISION}  # fmt: skip
    rec["sequential_us"] = bench_graph(s.existing)
    rec["branched_us"] = bench_graph(branched)
    best: tuple[float, Any] = (rec["branched_us"], True)

    def check(cfg: Any) -> str | None:
        err = _error(branched_fn(s, splits, outs, list(cfg))(0), s.ref, splits, outs)
        return None if err < 2e-2 else f"rel err {err:.2e}"

    configs = GROUP_CONFIGS[row_class(rows, GROUP_CONFIGS)] if HAVE_TRITON else ()
    grouped = time_configs(configs, check, lambda cfg: branched_fn(s, splits, outs, list(cfg)), rec)
    if grouped is not None and grouped[0] < best[0]:
        best = (grouped[0], list(grouped[1]))
    rec["best_us"] = best[0]
    rec["use"] = best[0] < margin * rec["sequential_us"]
    rec["config"] = best[1]
    s.ws.clear()
    return rec


def _error(ys: list[torch.Tensor], ref: torch.Tensor, splits: list[int], outs: list[int | None]) -> float:
    """Relative error of the factorized members' outputs ``ys`` against their columns of ``ref``."""
    cols, off, got = [], 0, iter(ys)
    for r, n in zip(splits, outs, strict=True):
        width = n if n is not None else r
        if n is not None:
            cols.append((next(got).double(), ref[:, off : off + width]))
        off += width
    num = sum(((y - want) ** 2).sum() for y, want in cols)
    den = sum((want**2).sum() for _, want in cols)
    return float((num / den.clamp_min(1e-60)).sqrt())


def branched_fn(s: Any, splits: list[int], outs: list[int | None], how: Any = True) -> Any:
    """``branched(i)``: a :func:`~gac.kernels.lowrank_fused.site_setup` site's first stage over weight
    copy ``i``, then its factorized members' second stages as one :func:`second_stages` call by the path
    ``how`` (True: streams; a configuration: the grouped launch), their outputs returned in member order."""
    factorized = [j for j, n in enumerate(outs) if n is not None]
    offs = [int(s.offs[j]) for j in factorized]
    no_bias = [s.x.new_empty(0)] * len(factorized)

    def branched(i: int) -> list[torch.Tensor]:
        v, us = s.ws[i % s.copies]
        torch.mm(s.x, v.t(), out=s.t)
        return second_stages(s.t, offs, [us[j] for j in factorized], no_bias, how)

    return branched
