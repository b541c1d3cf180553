"""Decode GEMVs in Triton, used only at the shapes where they were measured faster than cuBLAS.

At decode every projection is a GEMV (``M`` = the batch: 1 to 16 token rows), bound by the
bytes of its weight.  cuBLAS runs the large ones near copy bandwidth (a 28672 x 4096 or the
128256 x 4096 head: 96-99% on an H200), but the mid-sized GEMVs a factorized model is made of
(``4096 x 1736``, ``1736 x 4096``, ``4096 x 2712``: the second factors of attention projections,
the first factors of ``o_proj``) run at 36-47% (``benchmarks/results/h200/decode-diag/``): its
kernels tile 64 output rows per CTA, so 1736 to 4096 rows fill fewer CTAs than the GPU has SMs.

:func:`gemv` tiles ``BLOCK_N`` (4 to 64) rows per program.  ``M = 1`` multiplies and adds into an
elementwise fp32 accumulator that is reduced once after the loop; ``2 <= M <= 16`` uses ``tl.dot`` on a
16-row tile.  Where ``N / BLOCK_N`` programs are too few to keep the GPU's memory busy, a configuration
may split ``K`` into ``SPLIT`` slices, each its own program, *in the same launch*: every slice stores its
fp32 partial sums, takes a ticket from its block's counter, and the slice that draws the last ticket
adds the partial sums in slice order (deterministic: the same inputs give the same bits whichever slice
arrives last), writes the output and zeroes the counter for the next launch or CUDA-graph replay.  The
counters (:func:`new_counters`) are a non-persistent buffer of each switched module (as
``gac::lowrank_fused``'s), so two launches in flight never share them, and the op leaves them as it
found them, hence it is declared functional.  It is registered as the custom op
``gac::gemv`` so that ``torch.compile`` keeps it as one opaque call and CUDA graphs capture it.

On the H200 (``benchmarks/results/h200/gemv-splitk/``, 49 shapes of the speed grid's models) the
kernel beat cuBLAS at 33 shapes at one row (e.g. ``4088 x 4096``: 11.0 against 12.7 µs) and at 21 at 16
rows (``3144 x 4096``: 10.1 against 11.8 µs, split four ways); at 64 and 128 rows at 2 and 0, so only
the two decode row classes are dispatched.  In whole compiled steps (``speed-gemv/``) it made dense
Qwen2.5-7B-shape decode 7.4% faster at B1 and cost dense Llama-3-8B 0.7% there: a cuBLAS GEMV that
follows the Triton ones ran slower in the step, which the isolated timing cannot see.

Revision 2 (``benchmarks/results/h200/speed-align/``): Triton proves a runtime integer a multiple of 16
or of nothing, so a ``K`` of 8 mod 16 (gac's multiples of 8: 1736, 2872, 1512) compiled to scalar 2-byte
loads of the weight, not pipelined.  K, N and the row strides now arrive divided by their alignment
(:func:`vector_align`).  Same machine, 38 shapes measured both ways: the 7 with such a K took 5-14% less time at
one row and 8-47% less at 16 rows (``18944 x 1512``: 41.2 → 21.7 µs), the other 31 within -2.3/+2.4%.  The
``SWAP`` configurations (see :data:`CONFIGS`) came with the same sweep.

Dispatch (:func:`gac.runtime.gemv.use_triton_gemv_`): for every linear layer of a model on CUDA (dense, each
factor of a factorized layer, each fused first stage) and each row class (``M = 1`` and
``2..16``), a few tile configurations and cuBLAS are timed alone, 64 calls to a CUDA graph over
weights rotated past L2; the Triton GEMV is used only where its best configuration beat cuBLAS by
``margin``.  Decisions are cached per GPU, torch, Triton and dtype in
``$GAC_CACHE/gemv_dispatch.json``, so a model's shapes are measured once per machine.  Prefill
(more than 16 rows) always takes cuBLAS.
"""

from __future__ import annotations

from typing import Any

import torch

from gac.alignment import vector_align
from gac.hardware.dispatch_table import row_class
from gac.hardware.timing import bench_graph, copies_past_l2, time_configs
from gac.kernels.jit import HAVE_TRITON, tl, triton

MAX_ROWS = 16
#: row classes measured for dispatch: ``M = 1`` and ``2 <= M <= 16``.  At 64 and 128 rows the kernel
#: beat cuBLAS at 2 and 0 of 49 shapes (``benchmarks/results/h200/gemv-splitk/``): prefill and
#: larger decode batches keep cuBLAS.
ROW_CLASSES = (1, 16)
#: tile configurations tried per shape and row class: ``(BLOCK_N, BLOCK_K, num_warps, num_stages[,
#: SPLIT[, SWAP]])``.  ``M = 1`` multiplies and sums (an elementwise fp32 accumulator, reduced once after
#: the loop), ``M > 1`` uses ``tl.dot`` on a 16-row tile.  ``SPLIT`` (default 1) cuts K into that many
#: slices, each its own program (see the kernel).  ``SWAP`` (default 0) puts the weight tile on
#: ``tl.dot``'s left, ``[BLOCK_N, BLOCK_K] @ [BLOCK_K, 16]``: on sm_90 a ``wgmma m64n16k16`` reading both
#: tiles from shared memory instead of ``mma.sync m16n8k16`` from registers.  The M = 1 list is the greedy
#: pick from a sweep of 15 configurations over 49 shapes of the speed grid's models
#: (``gemv-splitk/sweep.json``, again optimal after revision 2: ``speed-align/sweep_after.json``); the
#: M = 16 list from 25 configurations (14 plain, 11 SWAP) over 98 shapes after revision 2
#: (``speed-align/sweep_swap.json``): these seven bring the mean of (chosen / best of all, cuBLAS
#: included) to 1.0005, where the seven plain ones before held 1.0054.
CONFIGS = {
    1: ((4, 512, 4, 3), (8, 512, 4, 3), (8, 512, 4, 3, 4), (8, 512, 4, 3, 2), (4, 512, 4, 3, 2)),
    16: ((64, 128, 4, 4, 4, 1), (16, 256, 4, 3), (64, 128, 4, 3, 1, 1), (32, 128, 4, 4, 4),
         (64, 128, 4, 3, 4, 1), (16, 128, 4, 4), (32, 128, 4, 4, 2)),
}  # fmt: skip
#: the kernel's revision, recorded with each dispatch measurement: a record of another revision was
#: timed on other code and is measured again.  2: K, N and the row strides carry their alignment
#: (:func:`vector_align`).
REVISION = 2

if HAVE_TRITON:

    @triton.jit
    def _gemv_epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, sym, HAS_BIAS: tl.constexpr):
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + offs_m[:, None] * sym + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )

    @triton.jit
    def gemv_tile(
        x_ptr, w_ptr, offs_m, offs_n, mask_m, mask_n, K, sxm, swn, k_lo, ks,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SWAP: tl.constexpr,
    ):  # fmt: skip
        # fp32 ``x[rows, k_lo : k_lo + ks] @ w[offs_n, same]ᵀ`` as a [BLOCK_M, BLOCK_N] tile (K masked); also
        # the first stage of gac::lowrank_fused (constexpr arguments stay constants in the inlined call)
        acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)  # M = 1: reduced once, after the loop
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)  # SWAP: the weight tile as the left operand
        for k0 in range(0, ks, BLOCK_K):
            offs_k = k_lo + k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            w = tl.load(
                w_ptr + offs_n[:, None] * swn + offs_k[None, :],
                mask=mask_n[:, None] & mask_k[None, :],
                other=0.0,
            )
            x = tl.load(
                x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            if BLOCK_M == 1:
                acc2 += x.to(tl.float32) * w.to(tl.float32)
            elif SWAP:
                acc_t += tl.dot(w, tl.trans(x))
            else:
                acc += tl.dot(x, tl.trans(w))
        if BLOCK_M == 1:
            acc = tl.sum(acc2, axis=1)[None, :]
        elif SWAP:
            acc = tl.trans(acc_t)
        return acc

    @triton.jit
    def _gemv_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        p_ptr,
        c_ptr,
        M,
        n_,
        k_,
        sxm_,
        swn_,
        sym_,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr,
        KA: tl.constexpr,
        NA: tl.constexpr,
        SWAP: tl.constexpr,
    ):
        # K and the row strides of x and w arrive divided by KA, N and y's row stride by NA (see
        # :func:`vector_align`): the products tell the compiler they are multiples of KA / NA elements
        K = k_ * KA
        sxm = sxm_ * KA
        swn = swn_ * KA
        N = n_ * NA
        sym = sym_ * NA
        # program (n block, K slice): the slice's partial sums of y[:, block]
        pid = tl.program_id(0)
        s = tl.program_id(1)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        ks = tl.cdiv(tl.cdiv(K, SPLIT), BLOCK_K) * BLOCK_K  # each slice a whole number of tiles
        acc = gemv_tile(
            x_ptr, w_ptr, offs_m, offs_n, mask_m, mask_n, K, sxm, swn, s * ks, ks, BLOCK_M, BLOCK_N, BLOCK_K, SWAP
        )  # fmt: skip
        if SPLIT == 1:
            _gemv_epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, sym, HAS_BIAS)
        else:
            # split-K without a second launch: every slice stores its partial sums (fp32), the last
            # slice of a block to arrive (a ticket counter per block) adds them up in slice order
            # (deterministic) and writes y, then zeroes the counter for the next launch / replay
            mask = mask_m[:, None] & mask_n[None, :]
            part = p_ptr + offs_m[:, None] * N + offs_n[None, :]
            tl.store(part + s * M * N, acc, mask=mask)
            tl.debug_barrier()  # every thread's stores precede the release below
            if tl.atomic_add(c_ptr + pid, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
                tot = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for j in tl.static_range(SPLIT):
                    # .cg: written by other SMs in this launch; read from L2, never a stale L1
                    tot += tl.load(part + j * M * N, mask=mask, other=0.0, cache_modifier=".cg")
                tl.atomic_xchg(c_ptr + pid, 0, sem="relaxed", scope="gpu")
                _gemv_epilogue(tot, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, sym, HAS_BIAS)

    @triton.jit
    def _group_member(
        x_ptr, w_ptr, b_ptr, y_ptr, blk, M, sxm, K, N,
        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        SWAP: tl.constexpr,
    ):  # fmt: skip
        # block ``blk`` of one member: y[:, block] = x @ w[block]ᵀ (+ b), w contiguous [N, K], y [M, N]
        offs_n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        ks = tl.cdiv(K, BLOCK_K) * BLOCK_K
        acc = gemv_tile(
            x_ptr, w_ptr, offs_m, offs_n, mask_m, mask_n, K, sxm, K, 0, ks, BLOCK_M, BLOCK_N, BLOCK_K, SWAP
        )
        _gemv_epilogue(acc, b_ptr, y_ptr, offs_m, offs_n, mask_m, mask_n, N, HAS_BIAS)

    @triton.jit
    def _group_gemv_kernel(
        x_ptr, w0, w1, w2, b0, b1, b2, y0, y1, y2, M, sxm_, o0_, o1_, o2_, k0_, k1_, k2_, n0_, n1_, n2_, T0, T1,
        B0: tl.constexpr, B1: tl.constexpr, B2: tl.constexpr, MEMBERS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        KA: tl.constexpr, NA: tl.constexpr, SWAP: tl.constexpr,
    ):  # fmt: skip
        # two or three independent products in one launch, member i reading columns o_i.. of x:
        # programs 0..T0-1 compute member 0's blocks, the next T1 member 1's, the rest member 2's.
        # Sizes, offsets and x's row stride arrive divided by KA / NA (see :func:`vector_align`).
        pid = tl.program_id(0)
        sxm = sxm_ * KA
        if pid < T0:
            _group_member(x_ptr + o0_ * KA, w0, b0, y0, pid, M, sxm, k0_ * KA, n0_ * NA,
                          B0, BLOCK_M, BLOCK_N, BLOCK_K, SWAP)  # fmt: skip
        elif pid < T0 + T1:
            _group_member(x_ptr + o1_ * KA, w1, b1, y1, pid - T0, M, sxm, k1_ * KA, n1_ * NA,
                          B1, BLOCK_M, BLOCK_N, BLOCK_K, SWAP)  # fmt: skip
        else:
            if MEMBERS == 3:
                _group_member(x_ptr + o2_ * KA, w2, b2, y2, pid - T0 - T1, M, sxm, k2_ * KA, n2_ * NA,
                              B2, BLOCK_M, BLOCK_N, BLOCK_K, SWAP)  # fmt: skip


_align = vector_align  # what _launch calls (benchmarks/tools/gpu_gemv_sweep.py --no-align-hint replaces it)


def split_of(cfg: tuple[int, ...] | list[int]) -> int:
    """How many K slices a configuration cuts (its fifth entry), else 1."""
    return int(cfg[4]) if len(cfg) > 4 else 1


def swap_of(cfg: tuple[int, ...] | list[int]) -> int:
    """1 where a configuration swaps the roles of the tile axes (its sixth entry), else 0."""
    return int(cfg[5]) if len(cfg) > 5 else 0


def new_counters(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Zeroed split-K tickets for a weight of ``n`` output rows (one per block of the smallest tile)."""
    return torch.zeros(
        -(-n // min(c[0] for cs in CONFIGS.values() for c in cs)), dtype=torch.int32, device=device
    )


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    y: torch.Tensor,
    cfg: tuple[int, ...],
    counters: torch.Tensor | None = None,
) -> None:
    block_n, block_k, warps, stages = cfg[:4]
    split = split_of(cfg)
    m, k = x.shape
    n = w.shape[0]
    blocks = -(-n // block_n)
    if split > 1:
        if counters is None or counters.numel() < blocks:
            raise ValueError(f"split-K gemv needs {blocks} zeroed counters (new_counters); got {counters}")
        part = torch.empty((split, m, n), device=x.device, dtype=torch.float32)
    else:
        part = counters = y  # unused
    ka, na = _align(k, x.stride(0), w.stride(0)), _align(n, y.stride(0))
    _gemv_kernel[(blocks, split)](
        x,
        w,
        b if b is not None else w,
        y,
        part,
        counters,
        m,
        n // na,
        k // ka,
        x.stride(0) // ka,
        w.stride(0) // ka,
        y.stride(0) // na,
        HAS_BIAS=b is not None,
        BLOCK_M=1 if m == 1 else max(16, 1 << (m - 1).bit_length()),
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        SPLIT=split,
        KA=ka,
        NA=na,
        SWAP=bool(swap_of(cfg)) and m > 1,
        num_warps=warps,
        num_stages=stages,
    )


#: configurations of :func:`group_launch` per row class: :data:`CONFIGS` without split-K (a grouped launch
#: has enough blocks), plus 32-row tiles at 2-16 rows (192 programs for a Llama-3-8B q/k/v group's
#: second factors, 4096 + 2 x 1024 rows).
GROUP_CONFIGS = {
    1: tuple(c for c in CONFIGS[1] if split_of(c) == 1),
    16: tuple(c for c in CONFIGS[16] if split_of(c) == 1) + ((32, 128, 4, 4), (32, 128, 4, 4, 1, 1)),
}


def group_launch(
    x: torch.Tensor,
    offs: list[int],
    ws: list[torch.Tensor],
    bs: list[torch.Tensor | None],
    ys: list[torch.Tensor],
    cfg: tuple[int, ...] | list[int],
) -> None:
    """``ys[i] = x[:, offs[i] : offs[i] + K_i] @ ws[i]ᵀ (+ bs[i])`` for two or three members, one launch.

    ``x`` is ``[M <= 16, ·]`` with unit column stride, ``ws[i]`` contiguous ``[N_i, K_i]``, ``ys[i]``
    contiguous ``[M, N_i]``; ``cfg`` a configuration of :data:`GROUP_CONFIGS` (no split).
    """
    n_m = len(ws)
    if not 2 <= n_m <= 3 or not len(offs) == len(bs) == len(ys) == n_m:
        raise ValueError(f"group_launch takes 2 or 3 members; got {len(offs)} offsets, {n_m} weights")
    block_n, block_k, warps, stages = (int(c) for c in cfg[:4])
    if split_of(cfg) != 1:
        raise ValueError(f"group_launch has no split-K; got configuration {list(cfg)}")
    m = x.shape[0]
    ks, ns = [int(w.shape[1]) for w in ws], [int(w.shape[0]) for w in ws]
    ka = _align(*ks, *offs, x.stride(0))
    na = _align(*ns)
    pad = 3 - n_m
    w3, b3 = list(ws) + [ws[-1]] * pad, [b if b is not None else w for b, w in zip(bs, ws, strict=True)]
    b3 += [b3[-1]] * pad
    y3, o3, k3, n3 = list(ys) + [ys[-1]] * pad, list(offs) + [0] * pad, ks + [ka] * pad, ns + [na] * pad
    tiles = [-(-n // block_n) for n in ns]
    has_b = [b is not None for b in bs] + [False] * pad
    _group_gemv_kernel[(sum(tiles),)](
        x, *w3, *b3, *y3, m, x.stride(0) // ka, *(o // ka for o in o3), *(k // ka for k in k3),
        *(n // na for n in n3), tiles[0], tiles[1],
        B0=has_b[0], B1=has_b[1], B2=has_b[2], MEMBERS=n_m,
        BLOCK_M=1 if m == 1 else max(16, 1 << (m - 1).bit_length()), BLOCK_N=block_n, BLOCK_K=block_k,
        KA=ka, NA=na, SWAP=bool(swap_of(cfg)) and m > 1, num_warps=warps, num_stages=stages,
    )  # fmt: skip


@torch.library.custom_op("gac::gemv", mutates_args=())
def gemv_op(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    counters: torch.Tensor | None,
    block_n: int,
    block_k: int,
    warps: int,
    stages: int,
    split: int,
    swap: int,
) -> torch.Tensor:
    """``x @ wᵀ (+ b)`` for ``x [M <= 16, K]`` (unit column stride), ``w [N, K]``: one Triton launch.

    With ``split > 1`` the launch updates ``counters`` and leaves them zeroed as it found them: its net
    effect is nil, hence a functional op (as ``gac::lowrank_fused``'s barrier counters).
    """
    y = torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=x.dtype)
    _launch(x, w, b, y, (block_n, block_k, warps, stages, split, swap), counters)
    return y


@gemv_op.register_fake
def _(x, w, b, counters, block_n, block_k, warps, stages, split, swap):  # noqa: ANN001, ANN202 - shapes only
    return x.new_empty((x.shape[0], w.shape[0]))


def _gemv_setup(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None


def _gemv_backward(ctx, gy: torch.Tensor):  # noqa: ANN001, ANN202
    # the op is an inference kernel, but a model whose parameters require grad is traced by
    # torch.compile with autograd in view: give it the linear layer's gradients (cuBLAS)
    x, w = ctx.saved_tensors
    gx = gy @ w if ctx.needs_input_grad[0] else None
    gw = gy.t() @ x if ctx.needs_input_grad[1] else None
    gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb, None, None, None, None, None, None, None


gemv_op.register_autograd(_gemv_backward, setup_context=_gemv_setup)


def gemv(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None = None,
    cfg: tuple[int, ...] | None = None,
    counters: torch.Tensor | None = None,
) -> torch.Tensor:
    """``F.linear(x, w, b)`` through the Triton GEMV for inputs of at most 16 token rows.

    ``cfg``: ``(BLOCK_N, BLOCK_K, num_warps, num_stages[, SPLIT[, SWAP]])`` (:data:`CONFIGS`); a
    split-K configuration needs ``counters`` (:func:`new_counters`, one set per weight: two launches in
    flight at once must not share them).

    Raises:
        ValueError: no Triton, more than 16 rows, shapes that disagree, or a split without counters.
    """
    if not HAVE_TRITON:
        raise ValueError("the Triton GEMV needs Triton (pip install triton)")
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if not 0 < x2.shape[0] <= MAX_ROWS or w.shape[1] != k:
        raise ValueError(
            f"gemv takes 1 to {MAX_ROWS} rows of w's in_features; got x {tuple(x.shape)}, w {tuple(w.shape)}"
        )
    cfg = tuple(cfg or next(c for c in CONFIGS[row_class(x2.shape[0], CONFIGS)] if split_of(c) == 1))
    y = gemv_op(
        x2 if x2.stride(-1) == 1 else x2.contiguous(),
        w.contiguous(),
        b,
        counters,
        *cfg[:4],
        split_of(cfg),
        swap_of(cfg),
    )
    return y.reshape(*lead, w.shape[0])


# ------------------------------------------------------------------------------ measuring


def measure_shape(
    n: int,
    k: int,
    rows: int,
    dtype: torch.dtype,
    device: torch.device,
    margin: float = 0.97,
    configs: tuple[tuple[int, ...], ...] | None = None,
) -> dict[str, Any]:
    """Time cuBLAS and each Triton configuration at ``[rows, k] @ [n, k]ᵀ``; pick the winner.

    Every configuration is first run once and checked against cuBLAS's product: a wrong result or
    split-K tickets left non-zero (once, or after the timed graph replays) disqualify it.  The record
    lists every configuration ``tried`` with its µs (``None``: it failed, did not compile or fit).
    """
    w_bytes = n * k * torch.tensor([], dtype=dtype).element_size()
    copies = copies_past_l2(w_bytes)
    ws = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    y = torch.empty(rows, n, device=device, dtype=dtype)
    counters = new_counters(n, device)
    rec: dict[str, Any] = {"n": n, "k": k, "rows": rows, "bytes": w_bytes, "revision": REVISION}
    rec["cublas_us"] = bench_graph(lambda i: torch.mm(x, ws[i % copies].t(), out=y))
    ref = (x @ ws[0].t()).float()

    def check(cfg: tuple[int, ...]) -> str | None:
        _launch(x, ws[0], None, y, cfg, counters)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        err = ((y.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
        if counters.any() or not err < 2e-2:
            left = counters.count_nonzero().item()
            counters.zero_()
            return f"tickets {left} left, rel err {err:.2e}"
        return None

    def after() -> str | None:
        if counters.any():
            counters.zero_()
            return "tickets not reset under graph replay"
        return None

    timed = lambda cfg: lambda i: _launch(x, ws[i % copies], None, y, cfg, counters)  # noqa: E731
    best = time_configs(configs or CONFIGS[row_class(rows, CONFIGS)], check, timed, rec, after, bench_graph)
    if best is not None:
        rec["triton_us"], rec["config"] = best[0], list(best[1])
    rec["use"] = best is not None and best[0] < margin * rec["cublas_us"]
    ws.clear()
    return rec
