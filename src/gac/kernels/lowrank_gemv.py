"""A fused low-rank GEMV for decode: ``y = (x · Vᵀ) · Uᵀ`` in one Triton launch.

Split over the rank: program ``(j, i)`` owns rank rows ``j*BLOCK_R ... +BLOCK_R`` and batch
rows ``i*BLOCK_M ...``.  It computes its slice ``t = x · V[j]ᵀ`` in registers (fp32
accumulation), then streams the matching rows of ``Uᵀ`` and atomically adds ``t · Uᵀ[j]``
into an fp32 output.  Every byte of ``V`` and ``U`` is read exactly once and the
intermediate never leaves the chip.  The caller zeroes the fp32 output first and casts it
back (two tiny launches); under CUDA graphs all three replay back to back.

:class:`TritonLowRankLinear` wraps a :class:`~gac.nn.FactorizedLinear`:
inputs with at most ``max_rows`` token rows (decode) take the kernel, longer ones (prefill)
take the two cuBLAS GEMMs.  ``Uᵀ`` is stored contiguous (``[rank, out]``) so the kernel's
loads are coalesced.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gac.errors import GacError
from gac.nn import FactorizedLinear, replace_module

try:  # Triton is optional: only the GPU path needs it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


if HAVE_TRITON:

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
            xb = tl.load(
                x_ptr + offs_m[:, None] * sxm + offs_k[None, :] * sxk,
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            vb = tl.load(
                v_ptr + offs_r[None, :] * svr + offs_k[:, None] * svk,
                mask=mask_r[None, :] & mask_k[:, None],
                other=0.0,
            )
            t += tl.dot(xb, vb)
        t_lp = t.to(ut_ptr.dtype.element_ty)
        for n0 in range(0, N, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < N
            ub = tl.load(
                ut_ptr + offs_r[:, None] * sur + offs_n[None, :] * sun,
                mask=mask_r[:, None] & mask_n[None, :],
                other=0.0,
            )
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


class TritonLowRankLinear(nn.Module):
    """A :class:`FactorizedLinear` whose short inputs (decode) run the fused kernel.

    Args:
        src: the factorized layer to take the factors from (they are copied, ``U`` transposed).
        max_rows: inputs with at most this many token rows use the kernel.
    """

    def __init__(self, src: FactorizedLinear, max_rows: int = 64) -> None:
        super().__init__()
        self.in_features = src.in_features
        self.out_features = src.out_features
        self.max_rows = max_rows
        self.v_weight = nn.Parameter(src.v.weight.detach().contiguous(), requires_grad=False)
        self.ut_weight = nn.Parameter(src.u.weight.detach().t().contiguous(), requires_grad=False)
        self.bias = (
            nn.Parameter(src.u.bias.detach().clone(), requires_grad=False) if src.u.bias is not None else None
        )

    @property
    def rank(self) -> int:
        return int(self.v_weight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.is_cuda and HAVE_TRITON and x2.shape[0] <= self.max_rows:
            y = lowrank_matmul(x2.contiguous(), self.v_weight, self.ut_weight)
        else:
            y = F.linear(x2, self.v_weight) @ self.ut_weight
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*lead, self.out_features)

    def to_factorized(self) -> FactorizedLinear:
        """The way back."""
        return FactorizedLinear.from_factors(self.ut_weight.detach().t(), self.v_weight.detach(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, rank={self.rank}, out_features={self.out_features}, max_rows={self.max_rows}"


def use_triton_lowrank_(model: nn.Module, max_rows: int = 64) -> int:
    """Swap every ``FactorizedLinear`` in ``model`` for a :class:`TritonLowRankLinear`. Returns the count."""

    names = [n for n, m in model.named_modules() if isinstance(m, FactorizedLinear)]
    for n in names:
        replace_module(model, n, TritonLowRankLinear(model.get_submodule(n), max_rows=max_rows))
    return len(names)
