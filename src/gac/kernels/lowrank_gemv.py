"""A fused low-rank GEMV for decode: ``y = (x · Vᵀ) · Uᵀ`` in one Triton launch.

Split over the rank: program ``(j, i)`` owns rank rows ``j*BLOCK_R ... +BLOCK_R`` and batch
rows ``i*BLOCK_M ...``.  It computes its slice ``t = x · V[j]ᵀ`` in registers (fp32
accumulation), then streams the matching rows of ``Uᵀ`` and atomically adds ``t · Uᵀ[j]``
into an fp32 output.  Every byte of ``V`` and ``U`` is read exactly once and the
intermediate never leaves the chip.  The caller zeroes the fp32 output first and casts it
back (two tiny launches); under CUDA graphs all three replay back to back.

:class:`gac.runtime.lowrank_gemv.TritonLowRankLinear` wraps a :class:`~gac.nn.FactorizedLinear`
(``gac.llm_run --triton``): inputs with at most ``max_rows`` token rows (decode) take the kernel,
longer ones (prefill) take the two cuBLAS GEMMs.  ``Uᵀ`` is stored contiguous (``[rank, out]``) so
the kernel's loads are coalesced.  The one-launch kernel of :mod:`gac.kernels.lowrank_fused`
replaced it on the default path.
"""

from __future__ import annotations

import torch

from gac.errors import GacError
from gac.kernels.jit import HAVE_TRITON, tl, triton

if HAVE_TRITON:

    @triton.jit
    def _tile(ptr, offs_a, offs_b, sa, sb, mask_a, mask_b):
        """The ``[len(offs_a), len(offs_b)]`` tile at ``ptr + a * sa + b * sb`` (zero outside the masks)."""
        return tl.load(
            ptr + offs_a[:, None] * sa + offs_b[None, :] * sb,
            mask=mask_a[:, None] & mask_b[None, :],
            other=0.0,
        )

    @triton.jit
    def _lowrank_kernel(
        x_ptr,
        v_ptr,
        ut_ptr,
        y_ptr,
        M,
        K,
        R,
        N,
        sxm,
        sxk,
        svr,
        svk,
        sur,
        sun,
        sym,
        syn,
        BLOCK_M: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        pid_r = tl.program_id(0)
        pid_m = tl.program_id(1)
        offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
        mask_m = offs_m < M
        mask_r = offs_r < R
        t = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            xb = _tile(x_ptr, offs_m, offs_k, sxm, sxk, mask_m, mask_k)
            vb = _tile(v_ptr, offs_k, offs_r, svk, svr, mask_k, mask_r)  # [BLOCK_K, BLOCK_R]: V transposed
            t += tl.dot(xb, vb)
        t_lp = t.to(ut_ptr.dtype.element_ty)
        for n0 in range(0, N, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < N
            ub = _tile(ut_ptr, offs_r, offs_n, sur, sun, mask_r, mask_n)
            yb = tl.dot(t_lp, ub)
            tl.atomic_add(
                y_ptr + offs_m[:, None] * sym + offs_n[None, :] * syn,
                yb,
                mask=mask_m[:, None] & mask_n[None, :],
            )


def lowrank_matmul(
    x: torch.Tensor,
    v: torch.Tensor,
    ut: torch.Tensor,
    *,
    block_r: int = 16,
    block_k: int = 128,
    block_n: int = 128,
) -> torch.Tensor:
    """``(x @ vᵀ) @ ut`` for ``x [M, K]``, ``v [R, K]``, ``ut [R, N]`` in one fused launch.

    The rank intermediate is accumulated in fp32 and rounded once to the input dtype before
    the second product (as two back-to-back GEMMs in that dtype would); the output sum is
    fp32 and is rounded once at the end.

    Raises:
        GacError: no Triton, not on CUDA, or shapes that disagree.
    """
    if not HAVE_TRITON:
        raise GacError("the fused low-rank kernel needs Triton (pip install triton)")
    if not x.is_cuda:
        raise GacError("the fused low-rank kernel runs on CUDA only")
    if x.dim() != 2 or v.dim() != 2 or ut.dim() != 2 or x.shape[1] != v.shape[1] or v.shape[0] != ut.shape[0]:
        raise GacError(
            f"shapes disagree: x {tuple(x.shape)}, v {tuple(v.shape)}, ut {tuple(ut.shape)} (want [M,K],[R,K],[R,N])"
        )
    M, K = x.shape
    R, N = ut.shape
    y = torch.zeros((M, N), device=x.device, dtype=torch.float32)
    block_m = 16
    grid = (triton.cdiv(R, block_r), triton.cdiv(M, block_m))
    _lowrank_kernel[grid](
        x,
        v,
        ut,
        y,
        M,
        K,
        R,
        N,
        x.stride(0),
        x.stride(1),
        v.stride(0),
        v.stride(1),
        ut.stride(0),
        ut.stride(1),
        y.stride(0),
        y.stride(1),
        BLOCK_M=block_m,
        BLOCK_R=block_r,
        BLOCK_K=block_k,
        BLOCK_N=block_n,
    )
    return y.to(x.dtype)
