"""Decode attention over a PaLU latent KV cache in one Triton kernel (flash-decoding style).

For one new token per sequence, program ``(b·kv_heads + h, split)`` walks its share of the cached
tokens in blocks of ``BLOCK_T``. Per block it

1. loads the key latents ``X [BLOCK_T, r_g]`` of head ``h``'s group and reconstructs the head's
   keys on chip, ``K = X·U_hᵀ`` (in ``BLOCK_R``-wide rank chunks, fp32 accumulation);
2. applies RoPE at each cached token's position (slot ``t`` holds position ``t``), computing
   ``cos``/``sin`` from the rotary ``inv_freq`` in registers (no tables read);
3. scores the ``n_rep`` query heads of ``h`` against ``K`` and updates an online softmax;
4. accumulates ``P·Z_v`` with the value latents ``Z_v [BLOCK_T, r_v]``: the output stays a
   latent (the value up-projection is folded into ``o_proj``).

Full-width keys and values never reach memory: the kernel reads only latents (PaLU's saving).
The per-split partial results ``(m, l, acc)`` are merged by :func:`latent_decode_attention` in
torch (a few small ops that ``torch.compile`` fuses). The kernel reads ``cache_len`` from device
memory, so a CUDA graph captured once serves every decode position.
"""

from __future__ import annotations

import math

import torch

try:  # Triton is optional: only the GPU path needs it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False


if HAVE_TRITON:

    @triton.jit
    def _latent_decode_kernel(
        q_ptr,  # [B, H, HD] roped queries
        zk_ptr,  # [B, T, *] key latents of the layer
        zv_ptr,  # [B, T, *] value latents of the layer
        uk_ptr,  # [KVH, HD, RK] packed key up-projections (zero past each head's rank)
        koff_ptr,  # [KVH] int32 latent offset of each KV head's group
        kr_ptr,  # [KVH] int32 key rank of each KV head's group
        voff_ptr,
        vr_ptr,
        inv_ptr,  # [HD/2] fp32 rotary inverse frequencies
        len_ptr,  # [1] int32/int64 valid cached tokens
        m_ptr,  # [B, KVH, S, BQ] fp32
        l_ptr,  # [B, KVH, S, BQ] fp32
        acc_ptr,  # [B, KVH, S, BQ, BRV] fp32
        sqb,
        sqh,
        szkb,
        szkt,
        szvb,
        szvt,
        suh,
        sud,
        KVH,
        NSPLIT,
        scale,
        rope_scale,
        T_PER_SPLIT: tl.constexpr,
        NREP: tl.constexpr,
        HALF: tl.constexpr,
        RK: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_R: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_RV: tl.constexpr,
    ):
        pid = tl.program_id(0)
        sp = tl.program_id(1)
        b = pid // KVH
        h = pid % KVH
        n_valid = tl.load(len_ptr).to(tl.int32)
        koff = tl.load(koff_ptr + h)
        kr = tl.load(kr_ptr + h)
        voff = tl.load(voff_ptr + h)
        vr = tl.load(vr_ptr + h)
        dt = q_ptr.dtype.element_ty

        offs_q = tl.arange(0, BLOCK_Q)
        offs_d = tl.arange(0, HALF)
        qmask = offs_q < NREP
        qbase = q_ptr + b * sqb + (h * NREP + offs_q)[:, None] * sqh
        q1 = tl.load(qbase + offs_d[None, :], mask=qmask[:, None], other=0.0)
        q2 = tl.load(qbase + (HALF + offs_d)[None, :], mask=qmask[:, None], other=0.0)
        inv = tl.load(inv_ptr + offs_d)

        offs_rv = tl.arange(0, BLOCK_RV)
        rvmask = offs_rv < vr
        m_i = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_Q,), tl.float32)
        acc = tl.zeros((BLOCK_Q, BLOCK_RV), tl.float32)
        t_begin = sp * T_PER_SPLIT
        for i in range(0, T_PER_SPLIT, BLOCK_T):
            offs_t = t_begin + i + tl.arange(0, BLOCK_T)
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
            s = tl.sin(ang) * rope_scale
            kr1 = (k1 * c - k2 * s).to(dt)
            kr2 = (k2 * c + k1 * s).to(dt)
            sc = tl.dot(kr1, tl.trans(q1)) + tl.dot(kr2, tl.trans(q2))  # [BLOCK_T, BLOCK_Q]
            sc = tl.where(tmask[:, None], sc * scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(sc, axis=0))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp(sc - m_safe[None, :])
            alpha = tl.exp(m_i - m_safe)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            v = tl.load(
                zv_ptr + b * szvb + offs_t[:, None] * szvt + (voff + offs_rv)[None, :],
                mask=tmask[:, None] & rvmask[None, :],
                other=0.0,
            )
            acc = acc * alpha[:, None] + tl.dot(tl.trans(p).to(dt), v)
            m_i = m_new
        base = (b * KVH + h) * NSPLIT + sp
        tl.store(m_ptr + base * BLOCK_Q + offs_q, m_i)
        tl.store(l_ptr + base * BLOCK_Q + offs_q, l_i)
        tl.store(acc_ptr + (base * BLOCK_Q + offs_q)[:, None] * BLOCK_RV + offs_rv[None, :], acc)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, 1 << (int(n) - 1).bit_length())


def kernel_supported(head_dim: int, n_rep: int) -> bool:
    """Triton present, an even power-of-two ``head_dim`` >= 32 and at most 16 query heads per KV head."""
    return HAVE_TRITON and head_dim >= 32 and head_dim & (head_dim - 1) == 0 and n_rep <= 16


def latent_decode_attention(
    q: torch.Tensor,
    zk: torch.Tensor,
    zv: torch.Tensor,
    pack: dict[str, torch.Tensor | int],
    cache_len: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    rope_scale: float = 1.0,
) -> torch.Tensor:
    """Per-query-head latent outputs ``[B, H, BRV]`` (fp32 merge, cast to ``q``'s dtype).

    Args:
        q: roped queries ``[B, H, HD]`` of the new token.
        zk, zv: the layer's key and value latents ``[B, T, Σ r]`` (static cache buffers).
        pack: from :meth:`gac.surgery.latent_attention.LatentAttention.decode_pack`.
        cache_len: valid tokens (device tensor, read in the kernel).
        inv_freq: the rotary inverse frequencies ``[HD/2]`` (fp32).
        scale: softmax scale; rope_scale: the rotary ``attention_scaling``.

    The launch is a ``torch.library`` custom op, so ``torch.compile`` treats it as one opaque
    call (and CUDA graphs capture it) instead of re-compiling the Triton source.
    """
    return torch.ops.gac.latent_decode(
        q,
        zk,
        zv,
        pack["uk"],
        pack["koff"],
        pack["kr"],
        pack["voff"],
        pack["vr"],
        inv_freq,
        cache_len,
        float(scale),
        float(rope_scale),
        int(pack["rk_max"]),
        int(pack["block_rv"]),
        int(pack["kv_heads"]),
    )


@torch.library.custom_op("gac::latent_decode", mutates_args=())
def _latent_decode_op(
    q: torch.Tensor,
    zk: torch.Tensor,
    zv: torch.Tensor,
    uk: torch.Tensor,
    koff: torch.Tensor,
    kr: torch.Tensor,
    voff: torch.Tensor,
    vr: torch.Tensor,
    inv_freq: torch.Tensor,
    cache_len: torch.Tensor,
    scale: float,
    rope_scale: float,
    rk_max: int,
    block_rv: int,
    kv_heads: int,
) -> torch.Tensor:
    return _launch(
        q, zk, zv, uk, koff, kr, voff, vr, inv_freq, cache_len, scale, rope_scale, rk_max, block_rv, kv_heads
    )


@_latent_decode_op.register_fake
def _(q, zk, zv, uk, koff, kr, voff, vr, inv_freq, cache_len, scale, rope_scale, rk_max, block_rv, kv_heads):
    b, h, _ = q.shape
    return q.new_empty(b, h, block_rv)


#: launch parameters (measured on an H100 with ``benchmarks/gpu_latent_kernel.py``)
LAUNCH = {"block_t": 32, "block_r": 32, "num_warps": 4, "num_stages": 2, "waves": 4}


def _launch(
    q, zk, zv, uk, koff, kr, voff, vr, inv_freq, cache_len, scale, rope_scale, rk_max, brv, kvh,
    block_t: int | None = None,
    block_r: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    waves: int | None = None,
) -> torch.Tensor:  # fmt: skip
    block_t = block_t or LAUNCH["block_t"]
    block_r = block_r or LAUNCH["block_r"]
    num_warps = num_warps or LAUNCH["num_warps"]
    num_stages = num_stages or LAUNCH["num_stages"]
    waves = waves or LAUNCH["waves"]
    b, h, hd = q.shape
    n_rep = h // kvh
    t = zk.shape[1]
    bq = 16
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 132
    n_split = max(1, min(math.ceil(t / block_t), math.ceil(waves * sms / max(b * kvh, 1))))
    per = math.ceil(math.ceil(t / n_split) / block_t) * block_t
    n_split = math.ceil(t / per)
    dev = q.device
    m = torch.empty(b, kvh, n_split, bq, device=dev, dtype=torch.float32)
    l_ = torch.empty_like(m)
    acc = torch.empty(b, kvh, n_split, bq, brv, device=dev, dtype=torch.float32)
    _latent_decode_kernel[(b * kvh, n_split)](
        q,
        zk,
        zv,
        uk,
        koff,
        kr,
        voff,
        vr,
        inv_freq,
        cache_len,
        m,
        l_,
        acc,
        q.stride(0),
        q.stride(1),
        zk.stride(0),
        zk.stride(1),
        zv.stride(0),
        zv.stride(1),
        uk.stride(0),
        uk.stride(1),
        kvh,
        n_split,
        float(scale),
        float(rope_scale),
        T_PER_SPLIT=per,
        NREP=n_rep,
        HALF=hd // 2,
        RK=int(-(-rk_max // block_r) * block_r),
        BLOCK_T=block_t,
        BLOCK_R=block_r,
        BLOCK_Q=bq,
        BLOCK_RV=brv,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    mx = m.amax(dim=2, keepdim=True)
    w = torch.exp(m - mx)  # [B, KVH, S, BQ]
    num = (w.unsqueeze(-1) * acc).sum(2)  # [B, KVH, BQ, BRV]
    den = (w * l_).sum(2)
    out = num[:, :, :n_rep] / den[:, :, :n_rep, None]
    return out.reshape(b, h, brv).to(q.dtype)
