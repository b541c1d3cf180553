"""Decode attention over a PaLU latent KV cache: a Triton scores kernel plus one GEMM per group.

As the reference's kernel (``kernel/abx_rope.py``: ``A·B·X`` with RoPE), the keys are never
stored at full width. For one new token per sequence, program ``(b·kv_heads + h, t-block)``

1. loads the key latents ``X [BLOCK_T, r_g]`` of head ``h``'s group and reconstructs the head's
   keys on chip, ``K = X·U_hᵀ`` (in ``BLOCK_R``-wide rank chunks, fp32 accumulation);
2. applies RoPE at each cached token's position (slot ``t`` holds position ``t``), computing
   ``cos``/``sin`` from the rotary ``inv_freq`` in registers (no tables read);
3. scores the ``n_rep`` query heads of ``h`` against ``K`` and writes the scaled scores
   (``-inf`` past the valid tokens, whose count the kernel reads from device memory, so one
   CUDA graph serves every decode position).

The softmax and ``P·Z_v`` (one batched GEMM per group over the value latents) run in torch: the
attention output stays a latent, which the caller maps through the value up-projection.
(An earlier single-kernel flash-decoding variant that also accumulated ``P·Z_v`` on chip ran
8x slower than dense SDPA on an H100: register pressure; ``benchmarks/results/h100/latent_kernel``.)
"""

from __future__ import annotations

import os
from typing import Any

import torch

from gac.kernels.gemv import vector_align

try:  # Triton is optional: only the GPU path needs it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


if HAVE_TRITON:

    @triton.jit
    def _latent_scores_kernel(
        q_ptr,  # [B, H, HD] roped queries
        zk_ptr,  # [B, T, *] key latents of the layer
        uk_ptr,  # [KVH, HD, RK] packed key up-projections (zero past each head's rank)
        koff_ptr,  # [KVH] int32 latent offset of each KV head's group
        kr_ptr,  # [KVH] int32 key rank of each KV head's group
        inv_ptr,  # [HD/2] fp32 rotary inverse frequencies
        len_ptr,  # [1] valid cached tokens
        s_ptr,  # [B, H, T] fp32 scores (scaled; -inf past the valid tokens)
        sqb,
        sqh,
        szkb_,
        szkt_,
        suh_,
        sud_,
        ssb,
        ssh,
        T,
        KVH,
        scale,
        rope_scale,
        NREP: tl.constexpr,
        HALF: tl.constexpr,
        RK: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        RA: tl.constexpr,
    ):
        # the latent and up-projection strides arrive divided by RA, and every group's latent offset and
        # rank is a multiple of RA (:func:`latent_align`): multiplied back, the compiler can prove the
        # latent rows 16-byte aligned and load them as vectors (otherwise one 2-byte load per element)
        szkb = szkb_ * RA
        szkt = szkt_ * RA
        suh = suh_ * RA
        sud = sud_ * RA
        pid = tl.program_id(0)
        tb = tl.program_id(1)
        b = pid // KVH
        h = pid % KVH
        n_valid = tl.load(len_ptr).to(tl.int32)
        koff = tl.load(koff_ptr + h) // RA * RA
        kr = tl.load(kr_ptr + h) // RA * RA
        dt = q_ptr.dtype.element_ty
        offs_q = tl.arange(0, BLOCK_Q)
        offs_d = tl.arange(0, HALF)
        qmask = offs_q < NREP
        qbase = q_ptr + b * sqb + (h * NREP + offs_q)[:, None] * sqh
        q1 = tl.load(qbase + offs_d[None, :], mask=qmask[:, None], other=0.0)
        q2 = tl.load(qbase + (HALF + offs_d)[None, :], mask=qmask[:, None], other=0.0)
        inv = tl.load(inv_ptr + offs_d)
        offs_t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        tmask = offs_t < n_valid
        k1 = tl.zeros((BLOCK_T, HALF), tl.float32)
        k2 = tl.zeros((BLOCK_T, HALF), tl.float32)
        for r0 in range(0, RK, BLOCK_R):
            offs_r = r0 + tl.arange(0, BLOCK_R)
            rmask = offs_r < kr
            x = tl.load(
                zk_ptr + b * szkb + offs_t[:, None] * szkt + (koff + offs_r)[None, :],
                mask=tmask[:, None] & rmask[None, :],
                other=0.0,
            )
            ub = uk_ptr + h * suh + offs_r[None, :]
            u1 = tl.load(ub + offs_d[:, None] * sud, mask=rmask[None, :], other=0.0)
            u2 = tl.load(ub + (HALF + offs_d)[:, None] * sud, mask=rmask[None, :], other=0.0)
            k1 += tl.dot(x, tl.trans(u1))
            k2 += tl.dot(x, tl.trans(u2))
        ang = offs_t[:, None].to(tl.float32) * inv[None, :]
        c = tl.cos(ang) * rope_scale
        sn = tl.sin(ang) * rope_scale
        kr1 = (k1 * c - k2 * sn).to(dt)
        kr2 = (k2 * c + k1 * sn).to(dt)
        sc = tl.dot(kr1, tl.trans(q1)) + tl.dot(kr2, tl.trans(q2))  # [BLOCK_T, BLOCK_Q]
        sc = tl.where(tmask[:, None], sc * scale, float("-inf"))
        ptrs = s_ptr + b * ssb + (h * NREP + offs_q)[None, :] * ssh + offs_t[:, None]
        tl.store(ptrs, sc, mask=(offs_t < T)[:, None] & qmask[None, :])


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (int(n) - 1).bit_length())


def kernel_supported(head_dim: int, n_rep: int) -> bool:
    """Triton present, an even power-of-two ``head_dim`` >= 32 and at most 16 query heads per KV head."""
    return HAVE_TRITON and head_dim >= 32 and head_dim & (head_dim - 1) == 0 and n_rep <= 16


def latent_decode_attention(
    q: torch.Tensor,
    zk: torch.Tensor,
    zv: torch.Tensor,
    pack: dict[str, Any],
    cache_len: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    rope_scale: float = 1.0,
) -> list[torch.Tensor]:
    """Per-group latent attention outputs of one new token: ``[B, H_g, r_g]`` for each group ``g``.

    Args:
        q: roped queries ``[B, H, HD]`` of the new token.
        zk, zv: the layer's key and value latents ``[B, T, Σ r]`` (static cache buffers).
        pack: from :meth:`gac.surgery.latent_attention.LatentAttention.decode_pack`.
        cache_len: valid tokens (device tensor, read in the kernel).
        inv_freq: the rotary inverse frequencies ``[HD/2]`` (fp32).
        scale: softmax scale; rope_scale: the rotary ``attention_scaling``.

    The scores come from the Triton kernel (a ``torch.library`` custom op: opaque to
    ``torch.compile``, captured by CUDA graphs); the softmax and ``P·Z_v`` per group are torch
    (one batched GEMM per group that reads each value latent once).
    """
    scores = torch.ops.gac.latent_scores(
        q,
        zk,
        pack["uk"],
        pack["koff"],
        pack["kr"],
        inv_freq,
        cache_len,
        float(scale),
        float(rope_scale),
        int(pack["rk_max"]),
        int(pack["kv_heads"]),
        int(pack.get("align", 1)),
    )
    p = torch.softmax(scores, dim=-1).to(zv.dtype)  # [B, H, T]
    outs = []
    hg = q.shape[1] // len(pack["v_ranks"])
    for g, (off, r) in enumerate(zip(pack["v_offsets"], pack["v_ranks"], strict=True)):
        outs.append(torch.matmul(p[:, g * hg : (g + 1) * hg], zv[:, :, off : off + r]))
    return outs


@torch.library.custom_op("gac::latent_scores", mutates_args=())
def _latent_scores_op(
    q: torch.Tensor,
    zk: torch.Tensor,
    uk: torch.Tensor,
    koff: torch.Tensor,
    kr: torch.Tensor,
    inv_freq: torch.Tensor,
    cache_len: torch.Tensor,
    scale: float,
    rope_scale: float,
    rk_max: int,
    kv_heads: int,
    align: int,
) -> torch.Tensor:
    return _launch(q, zk, uk, koff, kr, inv_freq, cache_len, scale, rope_scale, rk_max, kv_heads, align)


@_latent_scores_op.register_fake
def _(q, zk, uk, koff, kr, inv_freq, cache_len, scale, rope_scale, rk_max, kv_heads, align):
    b, h, _ = q.shape
    return q.new_empty(b, h, zk.shape[1], dtype=torch.float32)


#: the alignment of the key latents' offsets, ranks and strides (what _launch calls;
#: ``benchmarks/tools/gpu_latent_kernel.py --no-align-hint`` replaces it)
latent_align = vector_align

#: launch parameters (swept on an H100 with ``benchmarks/tools/gpu_latent_kernel.py``); the environment
#: variable ``GAC_LATENT_LAUNCH="block_t,block_r,num_warps,num_stages"`` overrides them
LAUNCH = {"block_t": 128, "block_r": 64, "num_warps": 8, "num_stages": 2}
if os.environ.get("GAC_LATENT_LAUNCH"):
    LAUNCH.update(zip(LAUNCH, (int(x) for x in os.environ["GAC_LATENT_LAUNCH"].split(",")), strict=False))


def _launch(
    q, zk, uk, koff, kr, inv_freq, cache_len, scale, rope_scale, rk_max, kvh, align=1,
    block_t: int | None = None,
    block_r: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:  # fmt: skip
    block_t = block_t or LAUNCH["block_t"]
    block_r = block_r or LAUNCH["block_r"]
    num_warps = num_warps or LAUNCH["num_warps"]
    num_stages = num_stages or LAUNCH["num_stages"]
    b, h, hd = q.shape
    t = zk.shape[1]
    scores = torch.empty(b, h, t, device=q.device, dtype=torch.float32)
    # ``align`` divides every group's latent offset and rank (the pack's, from the host)
    ra = latent_align(align, zk.stride(0), zk.stride(1), uk.stride(0), uk.stride(1))
    _latent_scores_kernel[(b * kvh, triton.cdiv(t, block_t))](
        q,
        zk,
        uk,
        koff,
        kr,
        inv_freq,
        cache_len,
        scores,
        q.stride(0),
        q.stride(1),
        zk.stride(0) // ra,
        zk.stride(1) // ra,
        uk.stride(0) // ra,
        uk.stride(1) // ra,
        scores.stride(0),
        scores.stride(1),
        t,
        kvh,
        float(scale),
        float(rope_scale),
        NREP=h // kvh,
        HALF=hd // 2,
        RK=int(-(-rk_max // block_r) * block_r),
        BLOCK_T=block_t,
        BLOCK_R=block_r,
        BLOCK_Q=16,
        RA=ra,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return scores
