"""Both stages of a factorized layer (or of a fused group of them) in one decode launch.

At decode every GEMV costs a fixed ~5 µs on top of its bytes (H200: ``5.0 µs + bytes / 4.49 TB/s``,
``benchmarks/results/h200/decode-diag/``), and a factorized layer ``y = (x Vᵀ) Uᵀ`` issues two of them.
:func:`lowrank_fused` runs both in one launch of a *persistent* Triton kernel: ``P`` programs (one or
two per SM, never more than can be resident at once) first stride over row blocks of ``V`` and write
their slice of ``t = x Vᵀ (+ b)`` (fp32) to a scratch buffer, meet at a grid-wide barrier, then stride
over row blocks of ``U`` and write ``y = t Uᵀ (+ b_u)``.

The barrier is two int32 counters per module (``arrive``, ``depart``): each program adds 1 to
``arrive`` (release, GPU scope) and spins until it reads ``P`` (acquire); each then adds 1 to
``depart``, and the program that brings it to ``P`` sets both back to 0, so the next launch (or the
next replay of a CUDA graph) finds them zeroed.  The op's net effect on the counters is therefore
nil, which is why it is declared functional (and can carry an autograd formula).  The spin is
bounded (``MAX_SPIN`` reads): if the programs were ever not co-resident, the waiting ones give up,
set ``counters[2]`` (:func:`barrier_timeouts`) and the launch completes with a wrong result instead
of hanging the GPU.

A *segmented* second stage serves the horizontally fused groups of
:mod:`gac.nn.fused` (q/k/v, gate/up): the first stage is the group's concatenated weight, and
the second computes up to three outputs, ``y_i = t[:, off_i : off_i + r_i] U_iᵀ (+ b_i)`` for a
factorized member and a copy of its slice of ``t`` for a dense one, into one ``[M, Σ out_i]``
tensor (the members take column slices of it).

``PHASE`` (constexpr) selects ``0``: both stages and the barrier (the GPU path); ``1``: the first
stage only; ``2``: the second only.  Triton's CPU interpreter runs programs one after another, so a
barrier would deadlock there: on CPU tensors the op runs phase 1 then phase 2 as two launches.

Dispatch (:func:`gac.runtime.lowrank_fused.use_fused_lowrank_`, on by default in the inference sweep
and ``gac generate``) is measured per site shape like :mod:`gac.kernels.gemv`'s: the existing path (cuBLAS) and a few
configurations of the fused kernel in a CUDA graph of 64 calls over weights rotated past L2, cached in
``$GAC_CACHE/lowrank_fused_dispatch.json``; the kernel is used only where it beat the existing path
by ``margin``.  Only the one-row class is measured by default (:data:`ROW_CLASSES`); inputs of more
rows keep the existing path.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from gac.hardware.dispatch_table import row_class
from gac.hardware.timing import bench_graph, copies_past_l2, time_configs
from gac.kernels.jit import HAVE_TRITON, tl, triton

MAX_ROWS = 64
#: row classes measured for dispatch: one token row only.  The kernel runs 2..64 rows
#: (``CONFIGS[16]``, ``CONFIGS[64]``, tested) but lost to the existing path there on the H200 (see
#: :data:`CONFIGS`); ``gac.runtime.lowrank_fused.LOWRANK_FUSED.decisions(..., row_classes=(1, 16, 64))``
#: measures them.
ROW_CLASSES = (1,)
MAX_SEGMENTS = 3
#: barrier reads before a program gives up (normal waits are a few hundred; ~0.1-1 s in all)
MAX_SPIN = 1 << 21
#: (BLOCK_R, BLOCK_K1, BLOCK_N, BLOCK_K2, num_warps, num_stages, programs per SM[, SPLIT]) tried
#: per site, per row class: ``1`` (M = 1), ``16`` (M in 2..16) and ``64`` (M in 17..64; ``tl.dot``
#: needs 16-wide tiles, the row tile is the next power of two).  ``SPLIT`` (default 1) cuts stage 1's
#: K into that many slices, each its own work item writing fp32 partial sums that stage 2 adds up.
#: A program keeps one tile of loads in flight at a time at M = 1 (Triton pipelines only the loads
#: that feed ``tl.dot``), so the M = 1 configurations trade tile size against programs per SM
#: (capped at what is co-resident) to keep ~32-64 KiB in flight per SM.  The M = 1 list holds the
#: three that won at least one of the 28 site shapes measured on the H200 (Llama-3-8B SVD-LLM and
#: ASVD allocations, ``benchmarks/results/h200/speed-fused/lowrank_fused_dispatch.json``); two more
#: that never won (``(16, 512, 16, 512, 8, 1, 2)``, ``(8, 512, 8, 512, 4, 1, 1)``) were dropped to
#: shorten the first-use measurement.
#:
#: With M > 1 every tile of stage 2 reloads its rows of ``t`` (fp32, from L2; once per K slice) and
#: every tile of stage 1 its slice of ``x``: per weight byte that is ``2 M SPLIT / BLOCK_N`` bytes of
#: ``t`` and ``M / BLOCK_R`` of ``x``.  The first 16-row configurations (16-wide tiles: twice the
#: weight bytes again, through L2) ran at 0.44-0.92x of the existing path on the H200.  Wider tiles
#: and K slices did better but did not win either: of 10 configurations at 16 rows the best (below,
#: first) ran at 0.60-0.91x, and at 64 rows 0.29-0.66x (3 of 5 did not fit in shared memory), at the
#: four Llama-3-8B SVD-LLM site shapes (``benchmarks/results/h200/lowrank_rows/``).  The lists below
#: keep the best of those runs; the classes stay unmeasured by default (:data:`ROW_CLASSES`).
CONFIGS = {
    1: (
        (4, 1024, 4, 1024, 4, 1, 8),
        (8, 1024, 8, 1024, 4, 1, 4),
        (2, 2048, 4, 2048, 4, 1, 8),
    ),
    16: (
        (32, 128, 128, 64, 4, 4, 2, 2),
        (64, 128, 128, 64, 8, 4, 1, 2),
        (16, 256, 16, 256, 4, 3, 2, 1),
    ),
    64: (
        (64, 64, 256, 32, 8, 4, 1, 2),
        (128, 64, 128, 64, 8, 3, 1, 2),
    ),
}
_PROGRAMS: dict[tuple, int] = {}  # (device, specialisation) -> programs that are co-resident

if HAVE_TRITON:
    from gac.kernels.gemv import gemv_tile  # the GEMV's tile loop (a JIT function, defined with Triton only)

    @triton.jit
    def _stage1_block(
        x_ptr,
        v_ptr,
        b_ptr,
        t_ptr,
        M,
        sxm,
        item,
        K: tl.constexpr,
        RT: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr,
        KS: tl.constexpr,
    ):
        # work item = (row block of V, slice of K): slice s writes its partial sums to t[s]
        blk = item // SPLIT
        s = item % SPLIT
        offs_r = blk * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_m = tl.arange(0, BLOCK_M)
        mask_r = offs_r < RT
        mask_m = offs_m < M
        # x[:, slice] @ V[block, slice]ᵀ: the GEMV's tile (M = 1: an elementwise fp32 accumulator, reduced once)
        acc = gemv_tile(
            x_ptr, v_ptr, offs_m, offs_r, mask_m, mask_r, K, sxm, K, s * KS, KS, BLOCK_M, BLOCK_R, BLOCK_K, False
        )  # fmt: skip
        if HAS_BIAS:  # once: in slice 0's partial sums
            bias = tl.load(b_ptr + offs_r, mask=mask_r, other=0.0).to(tl.float32)
            acc += tl.where(s == 0, bias, 0.0)[None, :]
        tl.store(
            t_ptr + s * (BLOCK_M * RT) + offs_m[:, None] * RT + offs_r[None, :],
            acc,
            mask=mask_m[:, None] & mask_r[None, :],
        )

    @triton.jit
    def _load_t(t_ptr, offs_m, offs_k, mask, RT: tl.constexpr, BLOCK_M: tl.constexpr, SPLIT: tl.constexpr):
        """``t``'s tile: the sum of the stage-1 slices' partial sums (fp32)."""
        # .cg: t was written by other SMs in this launch; read it from L2, never a stale L1
        tt = tl.load(
            t_ptr + offs_m[:, None] * RT + offs_k[None, :], mask=mask, other=0.0, cache_modifier=".cg"
        )
        for s in tl.static_range(1, SPLIT):
            tt += tl.load(
                t_ptr + s * (BLOCK_M * RT) + offs_m[:, None] * RT + offs_k[None, :],
                mask=mask,
                other=0.0,
                cache_modifier=".cg",
            )
        return tt

    @triton.jit
    def _stage2_block(
        t_ptr,
        u_ptr,
        b_ptr,
        y_ptr,
        M,
        blk,
        RT: tl.constexpr,
        NT: tl.constexpr,
        OFF: tl.constexpr,
        R: tl.constexpr,
        N: tl.constexpr,
        COL: tl.constexpr,
        KIND: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SPLIT: tl.constexpr,
    ):
        offs_n = blk * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        if KIND == 1:  # factorized member: its slice of t times its own U
            acc2 = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for k0 in range(0, R, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask_k = offs_k < R
                u = tl.load(
                    u_ptr + offs_n[:, None] * R + offs_k[None, :],
                    mask=mask_n[:, None] & mask_k[None, :],
                    other=0.0,
                )
                t = _load_t(
                    t_ptr + OFF, offs_m, offs_k, mask_m[:, None] & mask_k[None, :], RT, BLOCK_M, SPLIT
                )
                if BLOCK_M == 1:
                    acc2 += t * u.to(tl.float32)
                else:
                    acc += tl.dot(t.to(u_ptr.dtype.element_ty), tl.trans(u))
            if BLOCK_M == 1:
                acc = tl.sum(acc2, axis=1)[None, :]
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        else:  # dense member: its slice of t (bias included in stage 1) is its output
            acc = _load_t(t_ptr + OFF, offs_m, offs_n, mask_m[:, None] & mask_n[None, :], RT, BLOCK_M, SPLIT)
        tl.store(
            y_ptr + offs_m[:, None] * NT + COL + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )

    @triton.jit
    def _lowrank_fused_kernel(
        x_ptr,
        v_ptr,
        b1_ptr,
        t_ptr,
        cnt_ptr,
        y_ptr,
        u0_ptr,
        c0_ptr,
        u1_ptr,
        c1_ptr,
        u2_ptr,
        c2_ptr,
        M,
        sxm,
        K: tl.constexpr,
        RT: tl.constexpr,
        NT: tl.constexpr,
        HAS_B1: tl.constexpr,
        OFF0: tl.constexpr,
        R0: tl.constexpr,
        N0: tl.constexpr,
        COL0: tl.constexpr,
        KIND0: tl.constexpr,
        HB0: tl.constexpr,
        OFF1: tl.constexpr,
        R1: tl.constexpr,
        N1: tl.constexpr,
        COL1: tl.constexpr,
        KIND1: tl.constexpr,
        HB1: tl.constexpr,
        OFF2: tl.constexpr,
        R2: tl.constexpr,
        N2: tl.constexpr,
        COL2: tl.constexpr,
        KIND2: tl.constexpr,
        HB2: tl.constexpr,
        NB1: tl.constexpr,
        NBA: tl.constexpr,
        NBB: tl.constexpr,
        NBC: tl.constexpr,
        ITER1: tl.constexpr,
        ITER2: tl.constexpr,
        P: tl.constexpr,
        PHASE: tl.constexpr,
        SPIN: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K1: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K2: tl.constexpr,
        SPLIT: tl.constexpr,
        KS: tl.constexpr,
    ):
        pid = tl.program_id(0)
        if PHASE != 2:  # stage 1: (row block of V, K slice) items, round robin over the P programs
            for i in range(0, ITER1):
                item = pid + i * P
                if item < NB1 * SPLIT:
                    _stage1_block(
                        x_ptr, v_ptr, b1_ptr, t_ptr, M, sxm, item, K, RT, HAS_B1, BLOCK_M, BLOCK_R, BLOCK_K1,
                        SPLIT, KS,
                    )  # fmt: skip
        if PHASE == 0:  # grid-wide barrier (all P programs are resident: see _programs)
            tl.debug_barrier()  # every thread's stores of t precede the release below
            tl.atomic_add(cnt_ptr, 1, sem="release", scope="gpu")
            seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
            spins = pid * 0  # an int32 scalar, carried by the loop
            while (seen < P) & (spins < SPIN):
                seen = tl.atomic_add(cnt_ptr, 0, sem="acquire", scope="gpu")
                spins += 1
            if seen < P:  # gave up: flag it (sticky) rather than hang the GPU
                tl.atomic_xchg(cnt_ptr + 2, 1, sem="relaxed", scope="gpu")
            tl.debug_barrier()
            # the last program past the barrier zeroes both counters for the next launch / replay
            if tl.atomic_add(cnt_ptr + 1, 1, sem="acq_rel", scope="gpu") == P - 1:
                tl.atomic_xchg(cnt_ptr, 0, sem="relaxed", scope="gpu")
                tl.atomic_xchg(cnt_ptr + 1, 0, sem="relaxed", scope="gpu")
        if PHASE != 1:  # stage 2: row blocks of each member's U (never crossing members)
            for i in range(0, ITER2):
                g = pid + i * P
                if g < NBA:
                    _stage2_block(
                        t_ptr, u0_ptr, c0_ptr, y_ptr, M, g, RT, NT, OFF0, R0, N0, COL0, KIND0, HB0,
                        BLOCK_M, BLOCK_N, BLOCK_K2, SPLIT,
                    )  # fmt: skip
                elif g < NBA + NBB:  # noqa: SIM102
                    if KIND1 != 0:
                        _stage2_block(
                            t_ptr, u1_ptr, c1_ptr, y_ptr, M, g - NBA, RT, NT, OFF1, R1, N1, COL1, KIND1,
                            HB1, BLOCK_M, BLOCK_N, BLOCK_K2, SPLIT,
                        )  # fmt: skip
                elif g < NBA + NBB + NBC:  # noqa: SIM102 - constexpr test inside a runtime one
                    if KIND2 != 0:
                        _stage2_block(
                            t_ptr, u2_ptr, c2_ptr, y_ptr, M, g - NBA - NBB, RT, NT, OFF2, R2, N2, COL2,
                            KIND2, HB2, BLOCK_M, BLOCK_N, BLOCK_K2, SPLIT,
                        )  # fmt: skip


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def block_m(rows: int) -> int:
    """The kernel's row tile: 1 for one row (elementwise), else a power of two >= 16 (``tl.dot``)."""
    return 1 if rows == 1 else max(16, 1 << (rows - 1).bit_length())


def _coresident(compiled: Any, warps: int, device: torch.device) -> int:
    """How many programs of ``compiled`` one SM holds at once (conservative; 1 if unknown)."""
    try:
        if hasattr(compiled, "_init_handles"):
            compiled._init_handles()
        regs = int(compiled.n_regs)
        smem = int(compiled.metadata.shared)
    except Exception:  # noqa: BLE001 - another Triton's metadata: assume one per SM
        return 1
    props = torch.cuda.get_device_properties(device)
    regs_sm = int(getattr(props, "regs_per_multiprocessor", 65536))
    threads_sm = int(getattr(props, "max_threads_per_multi_processor", 2048))
    # per SM >= per block (opt-in): the smaller is the safe side when the first is not reported
    smem_sm = int(
        getattr(props, "shared_memory_per_multiprocessor", 0)
        or getattr(props, "shared_memory_per_block_optin", 0)
        or 48 * 1024
    )
    warp_regs = _cdiv(max(regs, 1) * 32, 256) * 256  # registers are allocated per warp, by 256
    # registers live in 4 sub-partitions; count a program's warps as spread over them unevenly
    by_regs = min(regs_sm // (warp_regs * warps), (regs_sm // 4) // (warp_regs * _cdiv(warps, 4)))
    by_threads = threads_sm // (32 * warps)
    by_smem = smem_sm // (smem + 1024)  # 1 KiB reserved per block
    return max(1, min(by_regs, by_threads, by_smem, 32))


def _launch(
    x: torch.Tensor,
    v: torch.Tensor,
    b1: torch.Tensor | None,
    us: list[torch.Tensor | None],
    ubs: list[torch.Tensor | None],
    splits: list[int],
    outs: list[int],
    y: torch.Tensor,
    counters: torch.Tensor,
    cfg: tuple[int, ...] | list[int],
    phases: tuple[int, ...] | None = None,
    programs: int | None = None,
) -> int:
    """``y[:, col_i : col_i + outs_i] = (x vᵀ + b1)[:, segment i] u_iᵀ (+ ub_i)`` for each member ``i``.

    ``x [M <= MAX_ROWS, K]`` (rows contiguous), ``v [Σ splits, K]``, ``u_i [outs_i, splits_i]`` (None for a
    dense member: ``outs_i == splits_i``), ``y [M, Σ outs]``, ``counters``: int32, at least 3, zeroed.
    ``phases``: ``(0,)`` on CUDA (one launch with the barrier), ``(1, 2)`` elsewhere (the interpreter).
    ``programs`` overrides ``P`` (CPU tests; on CUDA it is capped at what is co-resident).
    Returns ``P``, the programs launched.
    """
    block_r, block_k1, block_n, block_k2, warps, stages, per_sm = (int(c) for c in cfg[:7])
    split = int(cfg[7]) if len(cfg) > 7 else 1
    m, k = x.shape
    rt, nt = int(v.shape[0]), int(y.shape[1])
    if not 1 <= len(splits) <= MAX_SEGMENTS or len(outs) != len(splits) or sum(splits) != rt:
        raise ValueError(f"bad segments: splits {splits}, outs {outs}, v rows {rt}")
    if sum(outs) != nt or m > MAX_ROWS or v.shape[1] != k:
        raise ValueError(f"shapes disagree: x {tuple(x.shape)}, v {tuple(v.shape)}, y {tuple(y.shape)}")
    bm = block_m(m)
    seg: dict[str, Any] = {}
    ptrs: list[torch.Tensor] = []
    off = col = 0
    nbs = []
    for i in range(MAX_SEGMENTS):
        if i < len(splits):
            u = us[i]
            r, n = int(splits[i]), int(outs[i])
            if u is None and n != r:
                raise ValueError(f"dense member {i}: out {n} != split {r}")
            if u is not None and tuple(u.shape) != (n, r):
                raise ValueError(f"member {i}: u {tuple(u.shape)}, want {(n, r)}")
            kind, hb = (1 if u is not None else 2), ubs[i] is not None and u is not None
            ptrs += [u if u is not None else v, ubs[i] if hb else v]
            nbs.append(_cdiv(n, block_n))
        else:
            r = n = kind = 0
            hb = False
            ptrs += [v, v]
            nbs.append(0)
        seg.update({f"OFF{i}": off, f"R{i}": r, f"N{i}": n, f"COL{i}": col, f"KIND{i}": kind, f"HB{i}": hb})
        off += r
        col += n
    nb1 = _cdiv(rt, block_r)
    on_gpu = x.device.type == "cuda"
    if phases is None:
        phases = (0,) if on_gpu else (1, 2)
    ks = _cdiv(_cdiv(k, split), block_k1) * block_k1  # each K slice a whole number of tiles
    t = torch.empty((split, bm, rt), device=x.device, dtype=torch.float32)
    args = (x, v, b1 if b1 is not None else v, t, counters, y, *ptrs, m, x.stride(0))
    meta = dict(
        K=k, RT=rt, NT=nt, HAS_B1=b1 is not None, **seg, NB1=nb1, NBA=nbs[0], NBB=nbs[1], NBC=nbs[2],
        SPIN=MAX_SPIN, BLOCK_M=bm, BLOCK_R=block_r, BLOCK_K1=block_k1, BLOCK_N=block_n, BLOCK_K2=block_k2,
        SPLIT=split, KS=ks, num_warps=warps, num_stages=stages,
    )  # fmt: skip
    if on_gpu:  # never more programs than are resident together (the barrier waits for all of them)
        cap = _programs(args, meta, per_sm, x.device)
        p = min(programs, cap) if programs else cap
    else:
        p = programs or 4
    meta.update(P=p, ITER1=_cdiv(nb1 * split, p), ITER2=_cdiv(sum(nbs), p))
    for ph in phases:
        _lowrank_fused_kernel[(p,)](*args, PHASE=ph, **meta)
    return p


def _programs(args: tuple, meta: dict[str, Any], per_sm: int, device: torch.device) -> int:
    """``per_sm`` programs per SM, fewer if that many cannot be resident together (cached)."""
    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    if per_sm <= 1:
        return sms
    key = (str(device), tuple(sorted((k, v) for k, v in meta.items())), str(args[0].dtype), per_sm)
    if key not in _PROGRAMS:
        want = per_sm
        try:
            # compile without running (the specialisation the launch will use: P is a constexpr) and
            # read its resources; if fewer fit, check the variant for that many too
            for _ in range(3):
                p = want * sms
                compiled = _lowrank_fused_kernel.warmup(
                    *args, grid=(p,), P=p, ITER1=_cdiv(meta["NB1"] * meta["SPLIT"], p),
                    ITER2=_cdiv(meta["NBA"] + meta["NBB"] + meta["NBC"], p), PHASE=0, **meta,
                )  # fmt: skip
                fit = _coresident(compiled, int(meta["num_warps"]), device)
                if fit >= want:
                    break
                want = fit
            else:
                want = 1
        except Exception:  # noqa: BLE001 - unknown resources: one program per SM is always resident
            want = 1
        _PROGRAMS[key] = sms * max(1, min(per_sm, want))
    return _PROGRAMS[key]


@torch.library.custom_op("gac::lowrank_fused", mutates_args=())
def lowrank_fused_op(
    x: torch.Tensor,
    v: torch.Tensor,
    b1: torch.Tensor | None,
    counters: torch.Tensor,
    u0: torch.Tensor | None,
    ub0: torch.Tensor | None,
    u1: torch.Tensor | None,
    ub1: torch.Tensor | None,
    u2: torch.Tensor | None,
    ub2: torch.Tensor | None,
    splits: list[int],
    outs: list[int],
    cfg: list[int],
) -> torch.Tensor:
    """``[M, Σ outs]``: each member's ``(x vᵀ + b1)[:, seg] uᵀ (+ ub)`` side by side, in one launch.

    Functional: ``counters`` is back to zero when the kernel ends (see the module docstring).
    """
    y = torch.empty((x.shape[0], sum(outs)), device=x.device, dtype=x.dtype)
    n = len(splits)
    _launch(x, v, b1, [u0, u1, u2][:n], [ub0, ub1, ub2][:n], splits, outs, y, counters, cfg)
    return y


@lowrank_fused_op.register_fake
def _(x, v, b1, counters, u0, ub0, u1, ub1, u2, ub2, splits, outs, cfg):  # noqa: ANN001, ANN202
    return x.new_empty((x.shape[0], sum(outs)))


def _setup(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    x, v, b1, _, u0, ub0, u1, ub1, u2, ub2, splits, outs, _ = inputs
    ctx.save_for_backward(x, v, b1, u0, u1, u2)
    ctx.has_ub = [ub0 is not None, ub1 is not None, ub2 is not None]
    ctx.splits, ctx.outs = list(splits), list(outs)


def _backward(ctx, gy: torch.Tensor):  # noqa: ANN001, ANN202
    # an inference kernel, but torch.compile traces a model whose parameters require grad with
    # autograd in view: give it the two linear layers' gradients (cuBLAS)
    x, v, b1, *us = ctx.saved_tensors
    need = ctx.needs_input_grad
    t = x @ v.t()
    if b1 is not None:
        t = t + b1
    gys = gy.split(ctx.outs, dim=-1)
    ts = t.split(ctx.splits, dim=-1)
    gts, gus, gubs = [], [None] * 3, [None] * 3
    for i, (g, ti) in enumerate(zip(gys, ts, strict=True)):
        u = us[i]
        if u is None:
            gts.append(g)
            continue
        gts.append(g @ u)
        if need[4 + 2 * i]:
            gus[i] = g.t() @ ti
        if ctx.has_ub[i] and need[5 + 2 * i]:
            gubs[i] = g.sum(0)
    gt = torch.cat(gts, dim=-1)
    gx = gt @ v if need[0] else None
    gv = gt.t() @ x if need[1] else None
    gb1 = gt.sum(0) if b1 is not None and need[2] else None
    return gx, gv, gb1, None, gus[0], gubs[0], gus[1], gubs[1], gus[2], gubs[2], None, None, None


lowrank_fused_op.register_autograd(_backward, setup_context=_setup)


def lowrank_fused(
    x: torch.Tensor,
    v: torch.Tensor,
    b1: torch.Tensor | None,
    us: list[torch.Tensor | None],
    ubs: list[torch.Tensor | None],
    splits: list[int],
    outs: list[int],
    counters: torch.Tensor,
    cfg: tuple[int, ...] | list[int] | None = None,
) -> torch.Tensor:
    """Every member's output side by side, ``[..., Σ outs]``, for inputs of at most MAX_ROWS (64) token rows.

    Args:
        x: ``[..., K]``.
        v: the first stage, ``[Σ splits, K]`` (a factorized layer's ``v.weight``, a fused group's weight).
        b1: the first stage's bias (a fused group's, for its dense members) or None.
        us, ubs: per member its ``u.weight [outs_i, splits_i]`` and ``u.bias``; None for a dense member.
        splits, outs: per member its rows of ``v`` and its output features.
        counters: the module's zeroed int32 barrier counters (:func:`new_counters`).
        cfg: a tile configuration (a row of :data:`CONFIGS`); default the first of the row class.

    Raises:
        ValueError: no Triton, more than MAX_ROWS rows, or shapes that disagree.
    """
    if not HAVE_TRITON:
        raise ValueError("the fused low-rank kernel needs Triton (pip install triton)")
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS or x2.shape[0] == 0:
        raise ValueError(f"lowrank_fused takes 1 to {MAX_ROWS} rows; got x {tuple(x.shape)}")
    cfg = list(cfg or CONFIGS[row_class(x2.shape[0], CONFIGS)][0])
    n = len(splits)
    pad = [None] * (MAX_SEGMENTS - n)
    u0, u1, u2 = [u.contiguous() if u is not None else None for u in us] + pad
    ub0, ub1, ub2 = list(ubs) + pad
    y = lowrank_fused_op(
        x2.contiguous(),
        v.contiguous(),
        b1,
        counters,
        u0,
        ub0,
        u1,
        ub1,
        u2,
        ub2,
        list(splits),
        list(outs),
        cfg,
    )
    return y.reshape(*lead, y.shape[-1])


def new_counters(device: torch.device | str | None = None) -> torch.Tensor:
    """Zeroed barrier counters: ``[arrive, depart, timed out, unused]``."""
    return torch.zeros(4, dtype=torch.int32, device=device)


# ------------------------------------------------------------------------------ measuring


def site_key(k: int, splits: list[int], outs: list[int | None]) -> str:
    """``"4096:1736x4096+704x1024"``: in features, then per member rank x out (``"4096d"``: dense)."""
    parts = [f"{r}x{n}" if n is not None else f"{r}d" for r, n in zip(splits, outs, strict=True)]
    return f"{k}:" + "+".join(parts)


def _weights(k: int, splits: list[int], outs: list[int | None], dtype: torch.dtype, device: torch.device):
    v = torch.randn(sum(splits), k, device=device, dtype=dtype) * k**-0.5
    us = [
        (torch.randn(n, r, device=device, dtype=dtype) * r**-0.5) if n is not None else None
        for r, n in zip(splits, outs, strict=True)
    ]
    return v, us


def site_setup(
    k: int,
    splits: list[int],
    outs: list[int | None],
    rows: int,
    dtype: torch.dtype,
    device: torch.device,
    l2_bytes: int = 128 * 2**20,
) -> SimpleNamespace:
    """One site's timing setup (the dispatch's, and ``benchmarks/tools/gpu_lowrank_fused.py``'s).

    Random weights in enough copies to rotate past ``l2_bytes`` of L2 (``ws``: ``(v, us)`` per copy),
    an input ``x`` of ``rows`` rows, ``existing(i)``: the existing path (cuBLAS: first stage into ``t``,
    then each member's ``u`` on its slice ``t[:, offs[j]:offs[j] + splits[j]]``) over copy ``i``, ``ref``:
    its float64 result on copy 0, ``nbytes`` (weights of one copy), ``real`` (each member's output
    features).  ``outs[i]`` None marks a dense member.
    """
    esize = torch.tensor([], dtype=dtype).element_size()
    nbytes = esize * (
        k * sum(splits) + sum(r * n for r, n in zip(splits, outs, strict=True) if n is not None)
    )
    copies = copies_past_l2(nbytes, l2_bytes)
    ws = [_weights(k, splits, outs, dtype, device) for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    t = torch.empty(rows, sum(splits), device=device, dtype=dtype)
    real = [n if n is not None else r for r, n in zip(splits, outs, strict=True)]
    ys = [torch.empty(rows, n, device=device, dtype=dtype) for n in real]
    offs = [sum(splits[:i]) for i in range(len(splits))]

    def existing(i: int) -> None:
        v, us = ws[i % copies]
        torch.mm(x, v.t(), out=t)
        for j, u in enumerate(us):
            if u is not None:
                torch.mm(t[:, offs[j] : offs[j] + splits[j]], u.t(), out=ys[j])

    v0, us0 = ws[0]
    t64 = x.double() @ v0.double().t()
    ref = torch.cat(
        [(t64[:, o : o + r] @ u.double().t()) if u is not None else t64[:, o : o + r]
         for o, r, u in zip(offs, splits, us0, strict=True)], -1,
    )  # fmt: skip
    return SimpleNamespace(
        nbytes=nbytes, copies=copies, ws=ws, x=x, t=t, offs=offs, real=real, existing=existing, ref=ref
    )


def measure_site(
    k: int,
    splits: list[int],
    outs: list[int | None],
    rows: int,
    dtype: torch.dtype,
    device: torch.device,
    margin: float = 0.97,
    configs: tuple[tuple[int, ...], ...] | None = None,
) -> dict[str, Any]:
    """Time the existing path (cuBLAS: first stage, then each member's ``u``) and each kernel config.

    ``outs[i]`` None marks a dense member.  Every configuration is first run once and checked: a
    barrier that timed out or counters left non-zero disqualify it, as does a wrong result.
    """
    su = site_setup(k, splits, outs, rows, dtype, device)
    ws, copies, x, real, ref = su.ws, su.copies, su.x, su.real, su.ref
    configs = configs or CONFIGS[row_class(rows, CONFIGS)]
    rec: dict[str, Any] = {"site": site_key(k, splits, outs), "rows": rows, "bytes": su.nbytes}
    rec["existing_us"] = bench_graph(su.existing)
    v0, us0 = ws[0]
    y = torch.empty(rows, sum(real), device=device, dtype=dtype)
    counters = new_counters(device)
    nones = [None] * len(splits)

    def check(cfg: tuple[int, ...]) -> str | None:
        _launch(x, v0, None, us0, nones, splits, real, y, counters, cfg)
        torch.cuda.synchronize(device)
        c = counters.tolist()
        err = ((y.double() - ref).norm() / ref.norm()).item()
        if c[:3] != [0, 0, 0] or not err < 2e-2:
            counters.zero_()
            return f"counters {c}, rel err {err:.2e}"
        return None

    def after() -> str | None:
        if counters.tolist()[:3] != [0, 0, 0]:
            counters.zero_()
            return "counters not reset under graph replay"
        return None

    def timed(cfg: tuple[int, ...]) -> Callable[[int], Any]:
        return lambda i: _launch(
            x, ws[i % copies][0], None, ws[i % copies][1], nones, splits, real, y, counters, cfg
        )

    best = time_configs(configs, check, timed, rec, after, bench_graph)
    if best is not None:
        rec["fused_us"], rec["config"] = best[0], list(best[1])
    rec["use"] = best is not None and best[0] < margin * rec["existing_us"]
    ws.clear()
    return rec
