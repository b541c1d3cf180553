"""Decode attention over a PaLU latent KV cache: a split-KV flash-decoding kernel.

As the reference's kernel (``kernel/abx_rope.py``: ``A·B·X`` with RoPE), the keys are never
stored at full width. For one new token per sequence, program ``(b·key_groups + g, split)``
walks its share of the valid cached tokens in ``BLOCK_T`` tiles and, per tile,

1. loads the key latents ``X [BLOCK_T, r_g]`` of key group ``g`` once for all the group's KV
   heads (and so for all their ``n_rep`` query heads), and rebuilds each KV head's keys on chip
   with tensor-core dots, ``K_j = X·U_jᵀ`` (``BLOCK_R``-wide rank chunks, fp32 accumulation);
2. adds the key bias (``k_proj`` with a bias: the Qwen2 layout), RMS-normalizes each key row
   (``k_norm``: Qwen3, Gemma-3, OLMo-2), then applies RoPE at each cached token's position (slot
   ``t`` holds position ``t``) by angle addition: the split start's ``cos``/``sin`` from the rotary
   ``inv_freq``, rotated by one tile step per tile, times the in-tile offsets' (:func:`gac.nn.latent.rope_table`,
   the decode pack's ``rope``), so no sine or cosine is evaluated in the loop;
3. scores every query head of the group against its KV head's keys (the group's query heads are
   the rows of one ``[MQ, BLOCK_T]`` tile) and updates an online softmax;
4. accumulates ``P·Z_v`` on tensor cores over the value latents (each query head through its
   value group's latent slice; a value group may be wider or narrower than the key group). At 128-token
   tiles the product is accumulated transposed, the value latents the Hopper dot's shared-memory operand,
   loaded by the tensor-memory accelerator where the ranks are aligned to 8 (:func:`value_descriptor`).

A layer whose key groups are all kept at full width caches its keys raw (``RAW_K``: the up-projections are the
identity): step 1 then loads each KV head's keys from its own latent columns and rebuilds nothing.

The splits' partial outputs (with their running max and sum) go to a small fp32 buffer and a
second kernel reduces them; the output stays a latent per query head, which the caller maps
through the value up-projection once. The loop bounds come from the valid length read in device
memory, so one CUDA graph serves every decode position, and no score ever reaches HBM.
Both kernels sit behind one ``torch.library`` custom op (``gac::latent_decode``): opaque to
``torch.compile``, captured by CUDA graphs.
"""

from __future__ import annotations

import functools
import logging
import math
import os
from typing import Any

import torch

from gac.alignment import next_pow2, vector_align
from gac.kernels import latent_gluon

try:  # Triton is optional: only the GPU path needs it.
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

#: the most query rows (KV heads a program x query heads each, padded to a power of two) of a program of more
#: than two KV heads whose tile start's RoPE turns the queries rather than the keys (``Q_ROT`` in the flash
#: kernel): past it the row spilled all the same and the turn did not pay. The profile's ``latent_attention``
#: class keeps ``wide`` rows for calls past it (:meth:`gac.hardware.profile.Profile.latent_rates`).
QROT_ROWS = 16
#: token tiles of at least this many (the launch table's key-group-4 row, 8 warps) accumulate ``P·Z_v`` transposed
#: (``V_T`` in the flash kernel) and read their value latents through a tensor descriptor where the GPU and the cache
#: allow (:func:`value_descriptor`); the same tiles turn the queries by the tile start at one or two KV heads a program
#: (``Q_ROT``). With 64 here, the GPU tests' forced key-group-4 launch of 64-token tiles in 4 warps (Llama-3-8B
#: attention, bf16) hit an illegal memory access on an H100; at 128 every GPU kernel test passes
#: (``benchmarks/results/h100/palu-kernel/v12/diag_vt.txt``, ``../palu-default/run14/gpu-tests/``)
VALUE_T_TILE = 128
#: in programs of part of a key group past two (the table's key-group-4 row split by :func:`raw_program_heads`:
#: Qwen2.5-7B's two KV heads a program) whose key rank takes more than one rank chunk, rebuild each KV head's keys as
#: one ``[BLOCK_T, head_dim]`` tensor-core dot a rank chunk, its halves interleaved (``PAIRED`` in the flash kernel,
#: :func:`_paired_head_scores`), where it took two dots of ``head_dim / 2`` columns, each waited on. Compiled for
#: sm_90 (Triton 3.6, Qwen2.5-7B's programs at key rank 256, with its bias) the tile's tensor-core waits fall from 11
#: to 6 and the stack from 40 to 32 bytes a thread (255 registers either way). On an H200, the kernel alone (the
#: table's launch, B 16/64 x KV 4096/32768) took 0.93-0.96x the unpaired time on the Qwen2.5-7B shape at key/value
#: rank 256/256 and 192/320. A whole group of
#: four a program (Llama-3-8B) took 0.99-1.00x at 256 and 1.00-1.03x at 192, and one 128-wide chunk (key rank 128)
#: 1.01-1.04x on both, so those stay unpaired (``benchmarks/results/h200/palu-default/call19/``, ``call20/``).
PAIRED_KEYS = True
#: the smallest head_dim the paired rebuild serves. At head_dim 32 (halves of 16), bf16, 128-token tiles in 4 warps
#: and programs of two KV heads, Triton 3.6's build of it was wrong on an H200 (relative error 5.3 against float64,
#: 0.0034 unpaired); every other launch tried at head_dim 32, 64 and 128 (4 and 8 warps, 16- and 128-token tiles,
#: programs of two and four KV heads) matched the unpaired one (``call20/paired_diag.json``).
PAIRED_MIN_HEAD_DIM = 64


if HAVE_TRITON:
    _QROT_ROWS = tl.constexpr(QROT_ROWS)
    _VT_TILE = tl.constexpr(VALUE_T_TILE)

    @triton.jit
    def _key_chunk(zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_d, r0, HALF, BLOCK_R):
        """One rank chunk's share of one KV head's keys: ``X[:, r0:r0+BLOCK_R]·U`` for both halves."""
        offs_r = r0 + tl.arange(0, BLOCK_R)
        rmask = offs_r < kr
        x = tl.load(
            zk_b + offs_t[:, None] * szkt + (koff + offs_r)[None, :],
            mask=tmask[:, None] & rmask[None, :],
            other=0.0,
        )
        u1 = tl.load(ub + offs_r[:, None] + offs_d[None, :] * sud, mask=rmask[:, None], other=0.0)
        u2 = tl.load(ub + offs_r[:, None] + (HALF + offs_d)[None, :] * sud, mask=rmask[:, None], other=0.0)
        return tl.dot(x, u1), tl.dot(x, u2)

    @triton.jit
    def _chunked_keys(
        zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_d, HALF, RK, BLOCK_R, BLOCK_T, K_LOOP
    ):
        """One KV head's keys ``[BLOCK_T, HALF]`` x2 from its group's latents, in ``BLOCK_R`` rank chunks.

        ``K_LOOP``: the chunks as a loop the compiler software-pipelines (each chunk's latents and
        up-projection copied ahead into shared memory, as a GEMM's K loop), not unrolled.
        """
        k1 = tl.zeros((BLOCK_T, HALF), tl.float32)
        k2 = tl.zeros((BLOCK_T, HALF), tl.float32)
        if K_LOOP:
            for r0 in range(0, RK, BLOCK_R):
                d1, d2 = _key_chunk(zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_d, r0, HALF, BLOCK_R)
                k1 += d1
                k2 += d2
        else:
            for r0 in tl.static_range(0, RK, BLOCK_R):
                d1, d2 = _key_chunk(zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_d, r0, HALF, BLOCK_R)
                k1 += d1
                k2 += d2
        return k1, k2

    @triton.jit
    def _head_scores(k1, k2, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, HAS_BIAS, HAS_NORM):
        """Bias, RMSNorm and RoPE on one KV head's rebuilt keys, then their scores ``[BLOCK_T, MQ]``."""
        if HAS_BIAS:
            k1 += tl.load(kb_ptr + kvh * (2 * HALF) + offs_d).to(tl.float32)[None, :]
            k2 += tl.load(kb_ptr + kvh * (2 * HALF) + HALF + offs_d).to(tl.float32)[None, :]
        if HAS_NORM:
            ms = (tl.sum(k1 * k1, axis=1) + tl.sum(k2 * k2, axis=1)) / (2 * HALF)
            rs = 1.0 / tl.sqrt(ms + eps)
            k1 = k1 * rs[:, None] * tl.load(kn_ptr + offs_d).to(tl.float32)[None, :]
            k2 = k2 * rs[:, None] * tl.load(kn_ptr + HALF + offs_d).to(tl.float32)[None, :]
        dt = q1t.dtype
        kr1 = (k1 * c - k2 * sn).to(dt)
        kr2 = (k2 * c + k1 * sn).to(dt)
        return tl.dot(kr1, q1t) + tl.dot(kr2, q2t)

    @triton.jit
    def _chunked_head_scores(
        zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps,
        HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM, K_LOOP,
    ):  # fmt: skip
        """KV head ``kvh``'s scores ``[BLOCK_T, MQ]``, its keys rebuilt chunk by chunk (up-projection at ``ub``)."""
        k1, k2 = _chunked_keys(
            zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_d, HALF, RK, BLOCK_R, BLOCK_T, K_LOOP
        )
        return _head_scores(
            k1, k2, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, HAS_BIAS, HAS_NORM
        )

    @triton.jit
    def _paired_keys(zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_p, RK, BLOCK_R, BLOCK_T, HD):
        """One KV head's keys ``[BLOCK_T, HD]`` with their halves interleaved (column ``2i`` is ``d = i``, ``2i + 1`` is
        ``d = i + HD/2``: ``offs_p``), one tensor-core dot of ``HD`` columns per ``BLOCK_R`` rank chunk, chained on
        one accumulator."""
        k = tl.zeros((BLOCK_T, HD), tl.float32)
        for r0 in tl.static_range(0, RK, BLOCK_R):
            offs_r = r0 + tl.arange(0, BLOCK_R)
            rmask = offs_r < kr
            x = tl.load(
                zk_b + offs_t[:, None] * szkt + (koff + offs_r)[None, :],
                mask=tmask[:, None] & rmask[None, :],
                other=0.0,
            )
            u = tl.load(ub + offs_r[:, None] + offs_p[None, :] * sud, mask=rmask[:, None], other=0.0)
            k = tl.dot(x, u, k)
        return k

    @triton.jit
    def _paired_head_scores(
        zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, kvh, kb_ptr, kn_ptr, offs_d, c, sn, qp, eps,
        HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM,
    ):  # fmt: skip
        """:func:`_chunked_head_scores` with the halves interleaved (``PAIRED``): the rebuild is one ``[BLOCK_T, HD]``
        dot a rank chunk where the halves took two of ``HD/2`` columns, each waited on; the halves are split from the
        accumulator's column pairs (in the tensor-core layout a thread holds both of a pair), turned, joined back, and
        scored against the queries interleaved alike (``qp [HD, MQ]``) in one dot."""
        offs_p = (tl.arange(0, 2 * HALF) // 2) + (tl.arange(0, 2 * HALF) % 2) * HALF
        k = _paired_keys(zk_b, offs_t, tmask, szkt, koff, kr, ub, sud, offs_p, RK, BLOCK_R, BLOCK_T, 2 * HALF)
        k1, k2 = tl.split(tl.reshape(k, (BLOCK_T, HALF, 2)))
        if HAS_BIAS:
            k1 += tl.load(kb_ptr + kvh * (2 * HALF) + offs_d).to(tl.float32)[None, :]
            k2 += tl.load(kb_ptr + kvh * (2 * HALF) + HALF + offs_d).to(tl.float32)[None, :]
        if HAS_NORM:
            ms = (tl.sum(k1 * k1, axis=1) + tl.sum(k2 * k2, axis=1)) / (2 * HALF)
            rs = 1.0 / tl.sqrt(ms + eps)
            k1 = k1 * rs[:, None] * tl.load(kn_ptr + offs_d).to(tl.float32)[None, :]
            k2 = k2 * rs[:, None] * tl.load(kn_ptr + HALF + offs_d).to(tl.float32)[None, :]
        kr = tl.reshape(tl.join(k1 * c - k2 * sn, k2 * c + k1 * sn), (BLOCK_T, 2 * HALF)).to(qp.dtype)
        return tl.dot(kr, qp)

    @triton.jit
    def _raw_head_scores(
        zk_b, offs_t, tmask, szkt, koff_ptr, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps, RA,
        HALF, HAS_BIAS, HAS_NORM,
    ):  # fmt: skip
        """``RAW_K``: KV head ``kvh``'s scores from its keys as cached (pre-RoPE, its ``koff`` column), no rebuild."""
        kc = tl.load(koff_ptr + kvh) // RA * RA
        kp = zk_b + offs_t[:, None] * szkt + kc
        k1 = tl.load(kp + offs_d[None, :], mask=tmask[:, None], other=0.0).to(tl.float32)
        k2 = tl.load(kp + (HALF + offs_d)[None, :], mask=tmask[:, None], other=0.0).to(tl.float32)
        return _head_scores(
            k1, k2, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, HAS_BIAS, HAS_NORM
        )

    @triton.jit
    def _group_scores(
        zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr, kvh0, suh, sud, offs_r, rmask, u1a, u2a, u1b, u2b,
        kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, col_head, eps, koff_ptr, RA, qp,
        G, HALF, RK, MQ, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM, STAGE_U, UNROLL, K_LOOP, RAW_K, PAIRED,
    ):  # fmt: skip
        """One tile's scores ``[BLOCK_T, MQ]``: each column against its KV head's rebuilt keys.

        ``STAGE_U`` (unrolled only): the keys come from the staged up-projections ``u1a``..``u2b``
        and one load of the tile's key latents; otherwise rank chunk by rank chunk. ``RAW_K``: the
        cache holds the keys themselves (a key group kept at full width, its up-projection the
        identity): each KV head's are read at its own column, with no rebuild.
        """
        sc = tl.zeros((BLOCK_T, MQ), tl.float32)
        if RAW_K:
            for j in tl.static_range(G):
                sj = _raw_head_scores(
                    zk_b, offs_t, tmask, szkt, koff_ptr, kvh0 + j, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps,
                    RA, HALF, HAS_BIAS, HAS_NORM,
                )  # fmt: skip
                if G == 1:
                    sc = sj
                else:
                    sc += tl.where((col_head == j)[None, :], sj, 0.0)
        elif UNROLL:  # the group's heads unrolled: every load sits in the pipelined tile loop
            if STAGE_U:
                x = tl.load(
                    zk_b + offs_t[:, None] * szkt + (koff + offs_r)[None, :],
                    mask=tmask[:, None] & rmask[None, :],
                    other=0.0,
                )
            for j in tl.static_range(G):
                if STAGE_U:
                    if j == 0:
                        k1 = tl.dot(x, u1a)
                        k2 = tl.dot(x, u2a)
                    else:
                        k1 = tl.dot(x, u1b)
                        k2 = tl.dot(x, u2b)
                    kvh = kvh0 + j
                    sj = _head_scores(
                        k1, k2, kvh, kb_ptr, kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, HAS_BIAS, HAS_NORM
                    )
                elif PAIRED:
                    sj = _paired_head_scores(
                        zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr + (kvh0 + j) * suh, sud, kvh0 + j, kb_ptr,
                        kn_ptr, offs_d, c, sn, qp, eps, HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM,
                    )  # fmt: skip
                else:
                    sj = _chunked_head_scores(
                        zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr + (kvh0 + j) * suh, sud, kvh0 + j, kb_ptr,
                        kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM,
                        K_LOOP,
                    )  # fmt: skip
                if G == 1:
                    sc = sj
                else:
                    sc += tl.where((col_head == j)[None, :], sj, 0.0)
        else:
            for j in range(G):
                if PAIRED:
                    sj = _paired_head_scores(
                        zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr + (kvh0 + j) * suh, sud, kvh0 + j, kb_ptr,
                        kn_ptr, offs_d, c, sn, qp, eps, HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM,
                    )  # fmt: skip
                else:
                    sj = _chunked_head_scores(
                        zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr + (kvh0 + j) * suh, sud, kvh0 + j, kb_ptr,
                        kn_ptr, offs_d, c, sn, q1t, q2t, eps, HALF, RK, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM,
                        K_LOOP,
                    )  # fmt: skip
                sc += tl.where((col_head == j)[None, :], sj, 0.0)
        return sc

    @triton.jit
    def _value_tile(zv_b, zvd, b, t0, offs_t, tmask, szvt, voff, vr, v0, offs_v, V_DESC, BLOCK_T, VW):
        """The tile's value latents ``[BLOCK_T, VW]`` from latent column ``voff + v0`` (``offs_v``: ``0..VW``).

        ``V_DESC``: through the tensor-memory accelerator (``zvd``, a ``[B, T, Σ r_v]`` descriptor): the tile goes
        to shared memory without passing through registers, where a ``[128, 256]`` bf16 tile takes 64 of them a
        thread in 8 warps. Its rows past the valid length and its columns past the group's rank are not masked
        (rows past ``T`` read as zeros): their scores are zero, and the caller zeroes the columns at the store.
        """
        if V_DESC:
            zv = zvd.load([b, t0, voff + v0]).reshape(BLOCK_T, VW)
        else:
            zv = tl.load(
                zv_b + offs_t[:, None] * szvt + (voff + v0 + offs_v)[None, :],
                mask=tmask[:, None] & (v0 + offs_v < vr)[None, :],
                other=0.0,
            )
        return zv

    @triton.jit
    def _pv(zv, p, V_T):
        """The tile's ``P·Z_v`` of probabilities ``p [BLOCK_T, MQ]`` (``V_T``: transposed, ``[VW, MQ]``)."""
        out = tl.dot(tl.trans(zv), p) if V_T else tl.dot(tl.trans(p), zv)
        return out

    @triton.jit
    def _head_values(
        p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, j, offs_m, v0, offs_v, NREP, RAV, V_DESC,
        BLOCK_T, VW, V_T,
    ):  # fmt: skip
        """``P·Z_v`` over KV head ``kvh0 + j``'s value slice (latent columns ``v0 + offs_v``), for its query heads
        only."""
        voff = tl.load(voff_ptr + kvh0 + j) // RAV * RAV
        vr = tl.load(vr_ptr + kvh0 + j) // RAV * RAV
        zv = _value_tile(zv_b, zvd, b, t0, offs_t, tmask, szvt, voff, vr, v0, offs_v, V_DESC, BLOCK_T, VW)
        mine = offs_m // NREP == j
        if V_T:
            out = tl.where(mine[None, :], _pv(zv, p, V_T), 0.0)
        else:
            out = tl.where(mine[:, None], _pv(zv, p, V_T), 0.0)
        return out

    @triton.jit
    def _group_values(
        acc, p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, offs_m, v0, offs_v, G, NREP, RAV,
        V_SHARED, UNROLL, V_DESC, BLOCK_T, VW, V_T,
    ):  # fmt: skip
        """``acc`` plus the tile's ``P·Z_v`` over latent columns ``v0 + offs_v``, each query head through its value
        group's latent slice: ``[MQ, VW]``, or with ``V_T`` transposed, ``[VW, MQ]``. Transposed, the value latents
        are the dot's first operand, read from shared memory by the Hopper tensor-core dot; ``[MQ, BLOCK_T]·[BLOCK_T,
        VW]`` with 16 or 32 query rows is the Ampere dot, whose operands both sit in registers."""
        if V_SHARED:  # every KV head of the key group reads one value slice
            voff = tl.load(voff_ptr + kvh0) // RAV * RAV
            vr = tl.load(vr_ptr + kvh0) // RAV * RAV
            zv = _value_tile(zv_b, zvd, b, t0, offs_t, tmask, szvt, voff, vr, v0, offs_v, V_DESC, BLOCK_T, VW)
            acc += _pv(zv, p, V_T)
        elif UNROLL:
            for j in tl.static_range(G):
                acc += _head_values(
                    p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, j, offs_m, v0, offs_v, NREP,
                    RAV, V_DESC, BLOCK_T, VW, V_T,
                )  # fmt: skip
        else:
            for j in range(G):
                acc += _head_values(
                    p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, j, offs_m, v0, offs_v, NREP,
                    RAV, V_DESC, BLOCK_T, VW, V_T,
                )  # fmt: skip
        return acc

    @triton.jit
    def _split_range(len_ptr, split, NSPLIT, BLOCK_T):
        """The cached tokens ``[start, end)`` of split ``split``: whole tiles of the valid length read on device."""
        n_valid = tl.load(len_ptr).to(tl.int32)
        per = tl.cdiv(tl.cdiv(n_valid, NSPLIT), BLOCK_T) * BLOCK_T
        start = split * per
        return start, tl.minimum(start + per, n_valid)

    @triton.jit
    def _staged_up(uk_ptr, kvh0, suh, sud, kr, offs_d, G, HALF, BLOCK_R):
        """``STAGE_U``: one rank chunk of the key group's (at most two) up-projections, halves ``[BLOCK_R, HALF]``."""
        offs_r = tl.arange(0, BLOCK_R)
        rmask = offs_r < kr
        ub = uk_ptr + kvh0 * suh + offs_r[:, None]
        u1a = tl.load(ub + offs_d[None, :] * sud, mask=rmask[:, None], other=0.0)
        u2a = tl.load(ub + (HALF + offs_d)[None, :] * sud, mask=rmask[:, None], other=0.0)
        if G == 2:
            u1b = tl.load(ub + suh + offs_d[None, :] * sud, mask=rmask[:, None], other=0.0)
            u2b = tl.load(ub + suh + (HALF + offs_d)[None, :] * sud, mask=rmask[:, None], other=0.0)
        else:
            u1b = u1a
            u2b = u2a
        return offs_r, rmask, u1a, u2a, u1b, u2b

    @triton.jit
    def _tile_rope(cb, sb, ci, si, rope_scale):
        """The rotary ``cos``/``sin`` of a tile by angle addition: ``cb``/``sb`` the tile start's ``[HALF]``,
        ``ci``/``si`` the in-tile offsets' ``[BLOCK_T, HALF]``."""
        c0 = cb[None, :]
        s0 = sb[None, :]
        return (c0 * ci - s0 * si) * rope_scale, (s0 * ci + c0 * si) * rope_scale

    @triton.jit
    def _online_softmax(sc, tmask, qk_scale, m_i, l_i):
        """One tile's online-softmax step (log2 units): the new running max and sum, the accumulator's rescale
        ``alpha`` (a column's) and ``P``."""
        sc = tl.where(tmask[:, None], sc * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(sc - m_new[None, :])  # [BLOCK_T, MQ]
        l_i = l_i * alpha + tl.sum(p, axis=0)
        return m_new, l_i, alpha, p

    @triton.jit
    def _latent_flash_kernel(
        q_ptr,  # [B, H, HD] roped queries
        zk_ptr, zv_ptr,  # [B, T, *] key and value latents of the layer
        zvd,  # zv_ptr's tensor descriptor, blocks [1, BLOCK_T, RVP or RVP / 2] (unused without V_DESC)
        uk_ptr,  # [KVH, HD, RK] packed key up-projections (zero past each head's rank)
        koff_ptr, kr_ptr,  # [KVH] int32 latent offset and rank of each KV head's key group
        voff_ptr, vr_ptr,  # [KVH] int32 latent offset and rank of each KV head's value group
        kb_ptr,  # [KVH, HD] key bias (unused without HAS_BIAS)
        kn_ptr,  # [HD] key RMSNorm weight (unused without HAS_NORM)
        inv_ptr,  # [HD/2] fp32 rotary inverse frequencies
        rope_ptr,  # [2, ROPE_ROWS, HD/2] fp32 cos and sin of offsets 0.. (gac.nn.latent.rope_table; unused without ROPE_TAB)
        len_ptr,  # [1] valid cached tokens
        o_ptr,  # [B, H, NSPLIT, RVP] fp32 partial outputs
        ml_ptr,  # [B, H, NSPLIT, 2] fp32 running max (log2 units) and sum of each split
        sqb, sqh, szkb_, szkt_, szvb_, szvt_, suh_, sud_, sob, soh, sos, smb, smh,
        KGROUPS, NSPLIT,
        qk_scale,  # softmax scale times log2(e)
        rope_scale, eps,
        NREP: tl.constexpr, G: tl.constexpr, HALF: tl.constexpr, RK: tl.constexpr, RVP: tl.constexpr,
        MQ: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_R: tl.constexpr, HAS_BIAS: tl.constexpr,
        HAS_NORM: tl.constexpr, V_SHARED: tl.constexpr, STAGE_U: tl.constexpr, UNROLL: tl.constexpr,
        RA: tl.constexpr, RAV: tl.constexpr, K_LOOP: tl.constexpr = False, ROPE_TAB: tl.constexpr = False,
        ROPE_ROWS: tl.constexpr = 129, RAW_K: tl.constexpr = False, V_DESC: tl.constexpr = False,
        PAIRED: tl.constexpr = False,
    ):  # fmt: skip
        # the latent and up-projection strides arrive divided by RA (RAV for the values), and every
        # group's latent offset and rank is a multiple of it: multiplied back, the compiler can prove
        # the latent rows 16-byte aligned and load them as vectors
        szkb = szkb_ * RA
        szkt = szkt_ * RA
        suh = suh_ * RA
        sud = sud_ * RA
        szvb = szvb_ * RAV
        szvt = szvt_ * RAV
        pid = tl.program_id(0)
        split = tl.program_id(1)
        b = pid // KGROUPS
        kg = pid % KGROUPS
        start, end = _split_range(len_ptr, split, NSPLIT, BLOCK_T)
        dt = q_ptr.dtype.element_ty
        offs_m = tl.arange(0, MQ)
        mrow = offs_m < G * NREP
        col_head = offs_m // NREP  # the score column's KV head within the key group
        h0 = kg * G * NREP
        offs_d = tl.arange(0, HALF)
        # queries transposed, [HALF, MQ]: the scores are K·Qᵀ with the rebuilt keys as the register operand
        qbase = q_ptr + b * sqb + (h0 + offs_m)[None, :] * sqh
        q1t = tl.load(qbase + offs_d[:, None], mask=mrow[None, :], other=0.0)
        q2t = tl.load(qbase + (HALF + offs_d)[:, None], mask=mrow[None, :], other=0.0)
        inv = tl.load(inv_ptr + offs_d)
        # RoPE by angle addition, cos(a + b) = cos a cos b - sin a sin b. The in-tile offsets' cos/sin are
        # held over the loop: read from the ROPE_TAB table past two KV heads a program, computed here at one
        # or two (there the loaded tile took more registers, 236 against 167 a thread at key group 1 compiled
        # for sm_90 by Triton 3.9, and an H100 held two programs a multiprocessor instead of three: 1.05-1.13x
        # the time at B >= 16). With K_LOOP they are read from the table every tile
        # (two registers a cos/sin element fewer held; without the table, each position's computed per
        # tile). The tile start's by rotating the split start's one tile step per tile, so no sine or cosine
        # is evaluated in the loop (the step, BLOCK_T x inv, is exact in fp32: BLOCK_T is a power of two).
        offs_i = tl.arange(0, BLOCK_T)
        tab = rope_ptr + offs_i[:, None] * HALF + offs_d[None, :]
        if K_LOOP:
            ci, si = None, None
        elif ROPE_TAB and G > 2:
            ci = tl.load(tab)
            si = tl.load(tab + ROPE_ROWS * HALF)
        else:
            ang_i = offs_i[:, None].to(tl.float32) * inv[None, :]
            ci = tl.cos(ang_i)
            si = tl.sin(ang_i)
        a_s = inv * start.to(tl.float32)
        cb = tl.cos(a_s)
        sb = tl.sin(a_s)
        if ROPE_TAB:  # the table's row BLOCK_T: the tile step's
            cstep = tl.load(rope_ptr + BLOCK_T * HALF + offs_d)
            sstep = tl.load(rope_ptr + (ROPE_ROWS + BLOCK_T) * HALF + offs_d)
        else:
            a_step = inv * BLOCK_T
            cstep = tl.cos(a_step)
            sstep = tl.sin(a_step)
        kvh0 = kg * G
        koff = tl.load(koff_ptr + kvh0) // RA * RA
        kr = tl.load(kr_ptr + kvh0) // RA * RA
        # Tiles of VALUE_T_TILE tokens and more (the key-group-4 row, 8 warps) accumulate P·Z_v transposed (V_T): the value
        # latents, in shared memory, are the Hopper dot's first operand; [MQ, BLOCK_T]·[BLOCK_T, RVP] at 16 or 32
        # query rows was the Ampere dot, its [128, RVP] value tile held in registers (64 of them a thread at 256
        # columns in 8 warps, 128 at 512), and the row spilled. Past 256 columns in two halves of at most 256 (the
        # tensor descriptor's box, V_DESC). At 32-token tiles (4 warps) and in the pipelined rank loop (K_LOOP) the
        # transposed dot took more registers (transposed_values). On an H100 the row took 0.85-0.87x the time at
        # value rank 432 on Llama-3-8B (benchmarks/results/h100/palu-kernel/v12/table_rv432.json).
        V_T: tl.constexpr = BLOCK_T >= _VT_TILE and not K_LOOP
        V_HALF: tl.constexpr = V_T and RVP > 256
        VW: tl.constexpr = RVP // 2 if V_HALF else RVP
        offs_v = tl.arange(0, VW)
        # int64: at a long context and a large batch (the capacity search) b·stride passes 2^31
        zk_b = zk_ptr + b.to(tl.int64) * szkb
        zv_b = zv_ptr + b.to(tl.int64) * szvb
        if STAGE_U:  # one rank chunk of at most two KV heads: their up-projections stay on chip for the split
            offs_r, rmask, u1a, u2a, u1b, u2b = _staged_up(
                uk_ptr, kvh0, suh, sud, kr, offs_d, G, HALF, BLOCK_R
            )
        else:  # the keys are rebuilt rank chunk by rank chunk (_chunked_keys): nothing staged
            offs_r, rmask, u1a, u2a, u1b, u2b = None, None, None, None, None, None
        m_i = tl.full((MQ,), float("-inf"), tl.float32)
        l_i = tl.zeros((MQ,), tl.float32)
        if V_T:  # a latent column a row, a query head a column
            acc = tl.zeros((VW, MQ), tl.float32)
            if V_HALF:
                acc2 = tl.zeros((VW, MQ), tl.float32)
        else:
            acc = tl.zeros((MQ, VW), tl.float32)
        # Past two KV heads a program with at most 16 query rows (the key-group-4 row on Llama-3-8B: a
        # [BLOCK_T, HALF] rebuilt key tile in 8 warps), the tile start's rotation turns the group's queries instead
        # of the keys, R(t0 + j)·k · q = R(j)·k · R(-t0)·q: the keys take the held in-tile cos/sin as they are, and
        # no [BLOCK_T, HALF] cos/sin is formed per tile. That ends the row's register spills (compiled for sm_90
        # by Triton 3.6: a 256-byte stack a thread before, 32 after: benchmarks/results/cpu/latent_regs.json) and
        # took 0.88-0.91x the time from 16 sequences on an H100. With 32 query rows (Qwen2.5-7B's 4 x 7) the row
        # still spills and took 0.99-1.03x the time, so launch_config splits it into programs of two KV heads (14
        # rows), which turn their queries at 128-token tiles (VALUE_T_TILE); at one or two KV heads a program with
        # 32-token tiles the queries' turn cost more than it saved (benchmarks/results/h100/palu-kernel/v11/).
        Q_ROT: tl.constexpr = not K_LOOP and MQ <= _QROT_ROWS and (G > 2 or BLOCK_T >= _VT_TILE)
        if Q_ROT:
            ci = ci * rope_scale
            si = si * rope_scale
            q1f = q1t.to(tl.float32)
            q2f = q2t.to(tl.float32)
        for t0 in range(start, end, BLOCK_T):
            offs_t = t0 + offs_i
            tmask = offs_t < end
            qa = q1t
            qb = q2t
            if K_LOOP:
                if ROPE_TAB:
                    c, sn = _tile_rope(cb, sb, tl.load(tab), tl.load(tab + ROPE_ROWS * HALF), rope_scale)
                else:
                    ang = offs_t[:, None].to(tl.float32) * inv[None, :]
                    c = tl.cos(ang) * rope_scale
                    sn = tl.sin(ang) * rope_scale
            elif Q_ROT:
                c = ci
                sn = si
                qa = (q1f * cb[:, None] + q2f * sb[:, None]).to(dt)
                qb = (q2f * cb[:, None] - q1f * sb[:, None]).to(dt)
            else:
                c, sn = _tile_rope(cb, sb, ci, si, rope_scale)
            cb, sb = cb * cstep - sb * sstep, sb * cstep + cb * sstep
            # the queries' halves interleaved as the rebuilt keys' (_paired_head_scores), [HD, MQ]
            if PAIRED:  # noqa: SIM108
                qp = tl.reshape(tl.permute(tl.join(qa, qb), (0, 2, 1)), (2 * HALF, MQ))
            else:
                qp = None
            sc = _group_scores(
                zk_b, offs_t, tmask, szkt, koff, kr, uk_ptr, kvh0, suh, sud, offs_r, rmask, u1a, u2a, u1b, u2b,
                kb_ptr, kn_ptr, offs_d, c, sn, qa, qb, col_head, eps, koff_ptr, RA, qp,
                G, HALF, RK, MQ, BLOCK_R, BLOCK_T, HAS_BIAS, HAS_NORM, STAGE_U, UNROLL, K_LOOP, RAW_K, PAIRED,
            )  # fmt: skip
            m_i, l_i, alpha, p = _online_softmax(sc, tmask, qk_scale, m_i, l_i)
            p = p.to(dt)  # [BLOCK_T, MQ]
            acc = acc * alpha[None, :] if V_T else acc * alpha[:, None]
            acc = _group_values(
                acc, p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, offs_m,
                0, offs_v, G, NREP, RAV, V_SHARED, UNROLL, V_DESC, BLOCK_T, VW, V_T,
            )  # fmt: skip
            if V_HALF:
                acc2 = _group_values(
                    acc2 * alpha[None, :], p, zv_b, zvd, b, t0, offs_t, tmask, szvt, voff_ptr, vr_ptr, kvh0, offs_m,
                    VW, offs_v, G, NREP, RAV, V_SHARED, UNROLL, V_DESC, BLOCK_T, VW, V_T,
                )  # fmt: skip
        rows = h0 + offs_m
        if V_T:
            optr = o_ptr + b * sob + rows[None, :] * soh + split * sos + offs_v[:, None]
            if V_DESC:  # the descriptor's tile ran past the group's rank: zero those latent columns
                vr_col = (tl.load(vr_ptr + kvh0 + col_head, mask=mrow, other=0) // RAV * RAV)[None, :]
                acc = tl.where(offs_v[:, None] < vr_col, acc, 0.0)
                if V_HALF:
                    acc2 = tl.where((VW + offs_v)[:, None] < vr_col, acc2, 0.0)
            tl.store(optr, acc, mask=mrow[None, :])
            if V_HALF:
                tl.store(optr + VW, acc2, mask=mrow[None, :])
        else:
            optr = o_ptr + b * sob + rows[:, None] * soh + split * sos + offs_v[None, :]
            tl.store(optr, acc, mask=mrow[:, None])
        mlp = ml_ptr + b * smb + rows * smh + split * 2
        tl.store(mlp, m_i, mask=mrow)
        tl.store(mlp + 1, l_i, mask=mrow)

    @triton.jit
    def _latent_combine_kernel(
        o_ptr,  # [B, H, NSPLIT, RVP] fp32
        ml_ptr,  # [B, H, NSPLIT, 2] fp32
        out_ptr,  # [B, H, RVP]
        H,
        NSPLIT: tl.constexpr,
        SP: tl.constexpr,
        BS: tl.constexpr,
        RVP: tl.constexpr,
    ):
        pid = tl.program_id(0)  # b * H + h
        offs_s = tl.arange(0, SP)
        smask = offs_s < NSPLIT
        base = ml_ptr + pid * NSPLIT * 2
        m = tl.load(base + offs_s * 2, mask=smask, other=float("-inf"))
        lsum = tl.load(base + offs_s * 2 + 1, mask=smask, other=0.0)
        mx = tl.max(m, axis=0)
        total = tl.sum(tl.where(smask & (m > float("-inf")), tl.exp2(m - mx) * lsum, 0.0), axis=0)
        offs_v = tl.arange(0, RVP)
        acc = tl.zeros((RVP,), tl.float32)
        for s0 in tl.static_range(0, NSPLIT, BS):
            offs_b = s0 + tl.arange(0, BS)
            bmask = offs_b < NSPLIT
            mb = tl.load(base + offs_b * 2, mask=bmask, other=float("-inf"))
            w = tl.where(bmask & (mb > float("-inf")), tl.exp2(mb - mx), 0.0)
            o = tl.load(
                o_ptr + pid * NSPLIT * RVP + offs_b[:, None] * RVP + offs_v[None, :],
                mask=bmask[:, None],
                other=0.0,
            )
            acc += tl.sum(o * w[:, None], axis=0)
        tl.store(out_ptr + pid * RVP + offs_v, (acc / total).to(out_ptr.dtype.element_ty))


def transposed_values(block_t: int, kloop: bool) -> bool:
    """Whether a launch accumulates ``P·Z_v`` transposed (``V_T`` in the flash kernel), and so may read its value
    latents through a descriptor: tiles of at least :data:`VALUE_T_TILE` tokens outside the pipelined rank loop.
    Compiled for sm_90 by Triton 3.6, the transposed dot ended the key-group-4 row's spills at value tiles past 256
    and took more registers at 32-token tiles and in the rank loop
    (``benchmarks/results/cpu/latent_regs_v12.json``)."""
    return block_t >= VALUE_T_TILE and not kloop


def value_width(rvp: int) -> int:
    """Latent columns of one value tile of a transposed (``V_T``) flash kernel (``VW``): the value tile ``rvp``,
    in halves past 256."""
    return rvp // 2 if rvp > 256 else rvp


#: the most query heads one program scores (a key group's KV heads times ``n_rep``)
MAX_GROUP_HEADS = 64

#: what the decode kernel takes beyond plain RoPE'd keys (read by ``LatentAttention.decode_refusals``)
FEATURES = frozenset({"k_bias", "k_norm"})


def kernel_supported(head_dim: int, n_rep: int, key_group: int = 1) -> bool:
    """Triton present, an even power-of-two ``head_dim`` >= 32, at most :data:`MAX_GROUP_HEADS` query heads per key group."""
    return (
        HAVE_TRITON
        and head_dim >= 32
        and head_dim & (head_dim - 1) == 0
        and n_rep * key_group <= MAX_GROUP_HEADS
    )


def per_kv_head(pack: dict[str, Any], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, bool, int]:
    """Each KV head's value latent offset and rank (device int32), whether a key group shares one, the alignment.

    Built from the pack's host lists once and kept in the pack (the first call runs before any
    CUDA-graph capture: warm-up).
    """
    cached = pack.get("_vhead")
    if cached is not None and cached[0].device == device:
        return cached
    kvh, gk = int(pack["kv_heads"]), key_group(pack)
    voffs, vranks = list(pack["v_offsets"]), list(pack["v_ranks"])
    gv = kvh // len(vranks)
    off = [voffs[h // gv] for h in range(kvh)]
    rk = [vranks[h // gv] for h in range(kvh)]
    shared = all(len({off[h] for h in range(g * gk, (g + 1) * gk)}) == 1 for g in range(kvh // gk))
    out = (
        torch.tensor(off, dtype=torch.int32, device=device),
        torch.tensor(rk, dtype=torch.int32, device=device),
        shared,
        vector_align(*voffs, *vranks),
    )
    pack["_vhead"] = out
    return out


def key_group(pack: dict[str, Any]) -> int:
    """KV heads per key group: ``pack["k_group"]``, else the value groups' size (one grouping)."""
    if pack.get("k_group"):
        return int(pack["k_group"])
    return int(pack["kv_heads"]) // len(pack["v_ranks"])


def latent_decode_attention(
    q: torch.Tensor,
    zk: torch.Tensor,
    zv: torch.Tensor,
    pack: dict[str, Any],
    cache_len: torch.Tensor,
    inv_freq: torch.Tensor,
    scale: float,
    rope_scale: float = 1.0,
    whole: bool = False,
) -> list[torch.Tensor] | torch.Tensor:
    """Per-value-group latent attention outputs of one new token: ``[B, H_g, r_g]`` for each value group ``g``
    (``whole``: the kernel's output ``[B, H, R]`` itself, ``R`` >= every value rank, zero past a group's).

    Args:
        q: roped queries ``[B, H, HD]`` of the new token.
        zk, zv: the layer's key and value latents ``[B, T, Σ r]`` (static cache buffers).
        pack: from :meth:`gac.nn.latent.LatentAttention.decode_pack`: ``uk``
            ``[KVH, HD, RK]``, ``koff``/``kr`` (device int32 per KV head), ``rk_max``, ``kv_heads``,
            ``align``, ``v_offsets``/``v_ranks`` (host lists per value group), and optionally
            ``k_group`` (KV heads per key group; default: the value groups' size), ``k_bias``
            ``[KVH, HD]``, ``k_norm`` ``[HD]`` with ``k_norm_eps``.
        cache_len: valid tokens (device tensor, read in the kernel).
        inv_freq: the rotary inverse frequencies ``[HD/2]`` (fp32).
        scale: softmax scale; rope_scale: the rotary ``attention_scaling``.
    """
    voff, vr, shared, valign = per_kv_head(pack, q.device)
    out = torch.ops.gac.latent_decode(
        q,
        zk,
        zv,
        pack["uk"],
        pack["koff"],
        pack["kr"],
        voff,
        vr,
        pack.get("k_bias"),
        pack.get("k_norm"),
        inv_freq,
        cache_len,
        float(scale),
        float(rope_scale),
        float(pack.get("k_norm_eps") or 1e-6),
        int(pack["rk_max"]),
        int(max(pack["v_ranks"])),
        int(pack["kv_heads"]),
        key_group(pack),
        bool(shared),
        int(pack.get("align", 1)),
        int(valign),
        pack.get("rope"),
        bool(pack.get("k_raw")),
    )
    if whole:
        return out
    hv = q.shape[1] // len(pack["v_ranks"])
    return [out[:, g * hv : (g + 1) * hv, :r] for g, r in enumerate(pack["v_ranks"])]


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
    k_bias: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    inv_freq: torch.Tensor,
    cache_len: torch.Tensor,
    scale: float,
    rope_scale: float,
    eps: float,
    rk_max: int,
    rv_max: int,
    kv_heads: int,
    k_group: int,
    v_shared: bool,
    align: int,
    valign: int,
    rope: torch.Tensor | None,
    k_raw: bool = False,
) -> torch.Tensor:
    return _launch(
        q, zk, zv, uk, koff, kr, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps,
        rk_max, rv_max, kv_heads, k_group, v_shared, align, valign, rope=rope, raw=k_raw,
    )  # fmt: skip


@_latent_decode_op.register_fake
def _(q, zk, zv, uk, koff, kr, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps,
      rk_max, rv_max, kv_heads, k_group, v_shared, align, valign, rope, k_raw=False):  # fmt: skip
    b, h, _ = q.shape
    return q.new_empty(b, h, next_pow2(rv_max))


#: the alignment of the latents' offsets, ranks and strides (what _launch calls)
latent_align = vector_align

#: launch parameters by key group size: rows ``(max_key_group, block_t, block_r, num_warps, num_stages, waves)``,
#: the first row that covers a launch applies; the cache is split so that the programs fill the GPU
#: ``waves`` times, then (:func:`balanced_splits`) so that the last wave of programs is nearly full. Chosen on
#: an H100 from the configuration with the best geometric mean against dense over the grid (Llama-3-8B and
#: Qwen2.5-7B shapes, B 1/16/64 x KV 4096/16384/32768: ``benchmarks/results/h100/palu-kernel/latent_kernel_v3.json``);
#: the key-group-1 row from the sweep after the value latents loaded as 16-byte vectors
#: (``benchmarks/results/h100/palu-kernel/v4/``: its 64-wide rank tile ran 1.21-1.33x dense at B16 x 16384
#: where the 128-wide one, padding rank 64, ran 1.04-1.08x). The environment variable
#: ``GAC_LATENT_LAUNCH="block_t,block_r,num_warps,num_stages,splits[,unroll[,kloop[,sub]]]"`` overrides every row
#: (``splits`` 0: from ``waves`` 2; ``unroll``: the largest key group whose heads are unrolled, default 2;
#: ``kloop`` 1: the rank chunks of a rebuilt key as a software-pipelined loop and RoPE's cos/sin computed per
#: position each tile, which frees the registers the unrolled chunks and the held in-tile angles took;
#: ``sub``: KV heads per program, dividing the key group, 0 for the whole group: :func:`program_heads`).
LAUNCH_TABLE: list[tuple[int, int, int, int, int, int]] = [
    (1, 32, 64, 4, 3, 2),
    (2, 32, 64, 4, 3, 4),
    (1 << 30, 128, 64, 8, 2, 2),
]
#: key groups past the unrolled ones (G > 2) with at most ``FEW_PROGRAMS[0]`` programs per split (one sequence:
#: B x key groups <= 4) launch ``(block_t, block_r, num_warps, num_stages, waves)`` = ``FEW_PROGRAMS[1:]`` with
#: ``kloop`` (the rank chunks as a pipelined loop, RoPE per position). On an H100 at key group 4, B=1, it took
#: 0.72-0.94x the time of the table's G=4 row (Llama-3-8B and Qwen2.5-7B shapes, KV 4096-32768), and
#: 1.01-1.26x the time at B=16 and 64 past KV 4096, where the row stays (0.76-0.87x at B=16 x 4096)
#: (``benchmarks/results/h100/palu-kernel/v5/``).
FEW_PROGRAMS = (4, 128, 64, 8, 3, 2)
#: one program per split at a key group past the unrolled ones (one sequence, one key group: Qwen2.5-7B's 4 KV
#: heads at G=4, B=1) launches ``(block_t, block_r, num_warps, num_stages, waves, sub)``: each KV head of the
#: group its own program (``sub`` 1, :func:`program_heads`), four times the programs on the same cache. On an
#: H100 (Qwen2.5-7B shape, key ranks 144/256/496, KV 4096-32768) it took 0.36-0.96x the time of the pipelined
#: rank loop (:data:`FEW_PROGRAMS`); at two key groups (Llama-3-8B, B=1) it was no faster (0.87-1.14x), so
#: the rank loop stays there (``benchmarks/results/h100/palu-kernel/v7/``).
ONE_PROGRAM = (32, 64, 4, 3, 2, 1)
#: a layer whose key groups are all kept at full width caches its keys raw (``k_raw`` in the decode pack: the
#: up-projections are the identity, so nothing is rebuilt, :func:`gac.nn.latent.raw_key_groups`) and launches
#: ``(block_t, block_r, num_warps, num_stages, waves, sub)`` (``block_r`` unused), one sequence (at most
#: ``FEW_PROGRAMS[0]`` programs a split) with one KV head a program (``sub`` 1), more with as many KV heads a
#: program as keep its query rows within :data:`RAW_ROWS` (:func:`raw_program_heads`).
#: On an H100 (Llama-3-8B shape's first layer: key group 4 raw, value rank 496; B 1/16/64 x KV 4096/32768) the
#: best of ten launches over the six points: 1.37-1.40x dense decode attention at B=1 (sub 1), 1.03-1.30x at
#: B >= 16, where the first guess (64, 64, 4, 2, 2) ran 0.57-0.77x
#: (``benchmarks/results/h100/palu-kernel/v9/raw_llama.json``). With the whole key group a program, the
#: Qwen2.5-7B shape (7 query heads a KV head: 28 rows, a ``[32, 512]`` fp32 accumulator) ran 0.42-0.65x at
#: B >= 16 (``v9/raw_table_call2.json``); two KV heads a program ran it at 0.96-1.46x (``v9/raw_table.json``).
RAW_LAUNCH = (32, 64, 4, 3, 2, 0)
RAW_FEW = (32, 64, 4, 3, 2, 1)
#: the widest rank chunk the table's key-group-4 row (key groups past the unrolled ones) takes: where every key
#: rank of the layer is past the row's 64 and at most this, the rank is one chunk, one tensor-core dot of that depth
#: per key half where there were two of 64, each with its own loads. A program of at most two KV heads (Qwen2.5-7B's
#: key group split, :func:`raw_program_heads`) then also pipelines three tiles instead of two. On an H200 at key
#: rank 128, value rank 384 (the kernel alone, B 16/64 x KV 4096/32768, the table's own splits): Qwen2.5-7B ran
#: 1.07-1.10x faster than with 64-rank chunks and two stages (1.05-1.07x with the one chunk and two stages), and the
#: Llama-3-8B shape (one program a key group) 1.01-1.03x (``benchmarks/results/h200/palu-default/call10/``).
ONE_CHUNK_RANK = 128
#: the most query rows (KV heads a program x query heads each, padded to a power of two) a raw-key program of
#: :data:`RAW_LAUNCH` holds: Llama-3-8B's key group of 4 x 4 query heads
RAW_ROWS = 16


def raw_program_heads(k_group: int, n_rep: int) -> int:
    """KV heads a raw-key program takes past one sequence, and a rebuilding program of the table's key-group-4 row:
    the most dividing ``k_group`` whose query rows (``heads x n_rep``, padded to a power of two) stay within
    :data:`RAW_ROWS` (= :data:`QROT_ROWS`), at least one. Qwen2.5-7B's key group of 4 (28 rows) so runs as programs
    of two KV heads: compiled for sm_90 by Triton 3.6, a 40-byte stack a thread against 520 at the whole group
    (``benchmarks/results/cpu/latent_regs_v12.json``); with the transposed values, on an H100, 0.88-1.05x the time
    of the whole-group program at value rank 256, 0.79-0.94x at 432 (``benchmarks/results/h100/palu-kernel/v12/``).

    >>> raw_program_heads(4, 4), raw_program_heads(4, 7), raw_program_heads(2, 16)
    (4, 2, 1)
    """
    best = 1
    for s in range(1, k_group + 1):
        if k_group % s == 0 and next_pow2(s * n_rep, 1) <= RAW_ROWS:
            best = s
    return best


_ENV = os.environ.get("GAC_LATENT_LAUNCH")


def program_heads(k_group: int, sub: int | None) -> int:
    """KV heads one program rebuilds keys for: ``sub`` (a launch's field), else the whole key group.

    A key group's KV heads all read the group's latents with their own up-projection, so any ``sub``
    dividing ``k_group`` computes the same thing: ``k_group / sub`` programs then share each latent tile
    (through L2), and each holds the up-projections of fewer heads.

    >>> program_heads(4, None), program_heads(4, 2), program_heads(2, 4)
    (4, 2, 2)
    """
    if not sub or sub >= k_group:
        return k_group
    if k_group % sub:
        raise ValueError(
            f"latent decode launch: {sub} KV heads per program do not divide key group {k_group}"
        )
    return int(sub)


def launch_config(
    ctas: int, t: int, k_group: int = 1, device: torch.device | None = None, raw: bool = False, n_rep: int = 1,
    rk: int = 0,
) -> dict[str, int]:  # fmt: skip
    """The launch of ``ctas`` (batch x key groups) programs per split over a cache of ``t`` slots
    (``raw``: keys cached raw, :data:`RAW_LAUNCH`, with ``n_rep`` query heads a KV head; ``rk``: the layer's
    largest key rank, 0 if unknown)."""
    if _ENV:
        vals = [int(x) for x in _ENV.split(",")]
        cfg = dict(
            zip(
                ("block_t", "block_r", "num_warps", "num_stages", "splits", "unroll", "kloop", "sub"),
                vals,
                strict=False,
            )
        )
        sub = program_heads(k_group, cfg.get("sub"))
        if not cfg.get("splits"):
            cfg["splits"] = num_splits(ctas * (k_group // sub), t, cfg["block_t"], device)
            cfg["auto_splits"] = 1
        return cfg
    if raw:
        bt, br, nw, ns, waves, sub = RAW_FEW if ctas <= FEW_PROGRAMS[0] else RAW_LAUNCH
        sub = sub or raw_program_heads(k_group, n_rep)
        sp = num_splits(ctas * (k_group // program_heads(k_group, sub)), t, bt, device, waves)
        return {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "splits": sp, "waves": waves,
                "auto_splits": 1, "sub": sub}  # fmt: skip
    if k_group > 2 and ctas == 1:
        bt, br, nw, ns, waves, sub = ONE_PROGRAM
        sp = num_splits(k_group // program_heads(k_group, sub), t, bt, device, waves)
        return {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "splits": sp, "waves": waves,
                "auto_splits": 1, "sub": sub}  # fmt: skip
    if k_group > 2 and ctas <= FEW_PROGRAMS[0]:
        bt, br, nw, ns, waves = FEW_PROGRAMS[1:]
        sp = num_splits(ctas, t, bt, device, waves)
        return {"block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "splits": sp, "waves": waves,
                "auto_splits": 1, "kloop": 1}  # fmt: skip
    for max_group, bt, br, nw, ns, waves in LAUNCH_TABLE:
        if k_group <= max_group:
            cfg = {
                "block_t": bt,
                "block_r": br,
                "num_warps": nw,
                "num_stages": ns,
                "waves": waves,
                "auto_splits": 1,
            }
            # a wide key group split: programs of at most QROT_ROWS query rows each, their heads not unrolled
            sub = raw_program_heads(k_group, n_rep) if k_group > 2 else k_group
            if sub < k_group:
                cfg.update(sub=sub, unroll=1)
            if k_group > 2 and br < rk <= ONE_CHUNK_RANK:  # the key rank as one chunk (ONE_CHUNK_RANK)
                cfg["block_r"] = ONE_CHUNK_RANK
                if sub <= 2:
                    cfg["num_stages"] = 3
            cfg["splits"] = num_splits(ctas * (k_group // sub), t, bt, device, waves)
            return cfg
    raise AssertionError("LAUNCH_TABLE must end with a catch-all row")


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_splits(ctas: int, t: int, block_t: int, device: torch.device | None, waves: int = 2) -> int:
    """Splits of the cache so that ``ctas`` programs per split fill the GPU ``waves`` times (a tile each at least)."""
    sms = _sm_count(device.index or 0) if device is not None and device.type == "cuda" else 4
    want = -(-waves * sms // max(ctas, 1))
    return max(1, min(want, -(-t // block_t), 256))


def balanced_splits(splits: int, ctas: int, t: int, block_t: int, slots: int, min_fill: float = 0.9) -> int:
    """``splits``, or more, so that the last of several waves of programs is nearly full.

    ``slots``: programs the GPU runs at once (multiprocessors x resident programs each). Where
    ``ctas x splits`` programs take more than one wave, the time is the number of waves (rounded up)
    times one program's share of the cache; the smallest split count from ``splits`` to ``4 x splits``
    whose waves are at least ``min_fill`` full is taken (e.g. 512 programs of 396 slots run as two
    waves, the second 29% full: three splits run 1536 programs in 3.88 waves). One wave or less is
    left alone (fewer, longer programs: no wave to fill).

    >>> balanced_splits(1, 512, 16384, 32, 396), balanced_splits(3, 128, 16384, 32, 396)
    (3, 3)
    """
    cap = min(-(-t // block_t), 256, 4 * splits)
    if slots <= 0 or ctas * splits <= slots:
        return splits
    for s in range(splits, cap + 1):
        w = ctas * s / slots
        if w / math.ceil(w) >= min_fill:
            return s
    return splits


#: resident programs per multiprocessor of each compiled launch (read off the kernel after its first launch)
_RESIDENT: dict[tuple, int] = {}


@functools.cache  # every launch asks (each decode step of each layer, when not replayed from a graph)
def resident_programs(n_regs: int, shared: int, num_warps: int, device: torch.device) -> int:
    """Programs of ``num_warps`` warps, ``n_regs`` registers a thread and ``shared`` bytes one
    multiprocessor holds at once (registers allocated per warp in 256s)."""
    props = torch.cuda.get_device_properties(device)
    regs = getattr(props, "regs_per_multiprocessor", 65536)
    smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
    threads = getattr(props, "max_threads_per_multi_processor", 2048)
    per_warp = -(-max(n_regs, 1) * 32 // 256) * 256
    by_regs = regs // (per_warp * num_warps)
    by_smem = smem // (shared + 1024) if shared else 32
    return max(1, min(by_regs, by_smem, threads // (32 * num_warps), 32))


#: the last launch (for benchmarks and reports): its parameters
LAST_LAUNCH: dict[str, Any] = {}

log = logging.getLogger(__name__)

#: launches that asked for more shared memory than the GPU has, by launch shape (device, constexprs,
#: asked launch), each with the smaller one that fit: ``{"key_group", "rk_max", "rv_max", "asked", "ran"}``
_FITTED: dict[tuple, dict[str, Any]] = {}


def shrunk_launches() -> list[dict[str, Any]]:
    """Every launch shape that ran smaller than asked (:func:`shrink`), once each (read by
    :func:`gac.nn.latent.latent_attention_paths`, so the infer and generate records say so)."""
    return [dict(r) for r in _FITTED.values()]


def shrink(cfg: dict[str, int], rank_loop: bool = False) -> dict[str, int] | None:
    """The next smaller launch after ``cfg`` ran out of shared memory; ``None`` past the smallest.

    With ``rank_loop`` (``_launch``: a table launch of a key group past the unrolled ones, G > 2; not one
    forced by ``GAC_LATENT_LAUNCH``, which keeps its form) it first takes the pipelined rank loop
    (``kloop``, the :data:`FEW_PROGRAMS` launch: its stages hold one rank chunk each, not every chunk of a
    tile); then, as for any launch, one pipeline stage fewer, then half the token tile (down to 16).

    On an H100 (232,448 B per block) the G=4 row at key rank 512 and a 512-wide value tile asks for
    397,312 B with two stages and 151,552 B with one (:func:`compiled_shared_bytes` with Triton 3.6;
    Triton 3.9: 282,624 and 151,552; ``benchmarks/results/cpu/latent_smem.json``). At key and value rank
    496 (the first layer of the pipeline's Llama-3-8B and Qwen2.5-7B shapes) the rank loop took 0.74-0.85x
    the one-stage row's time at every point timed (B 1/16/64 x KV 4096/32768;
    ``benchmarks/results/h100/palu-kernel/v6/lk_r496.json``).
    """
    if rank_loop and not cfg.get("kloop"):
        bt, br, nw, ns, _ = FEW_PROGRAMS[1:]
        return {**cfg, "block_t": bt, "block_r": br, "num_warps": nw, "num_stages": ns, "kloop": 1}
    if cfg["num_stages"] > 1:
        return {**cfg, "num_stages": cfg["num_stages"] - 1}
    if cfg["block_t"] > 16:
        return {**cfg, "block_t": cfg["block_t"] // 2}
    return None


#: what a launch record keeps of the launch that ran (:func:`shrunk_launches`)
_RAN_KEYS = ("block_t", "block_r", "num_warps", "num_stages", "kloop", "sub")


def compiled_kernel(
    key_group: int, rk: int, rvp: int, block_t: int, block_r: int, num_warps: int, num_stages: int,
    n_rep: int = 4, head_dim: int = 128, arch: int = 90, kloop: bool = False, rope_tab: bool = True,
    raw: bool = False, bias: bool = False, vdesc: bool = False, unroll: bool = False, paired: bool = False,
) -> Any:  # fmt: skip
    """The flash kernel compiled for ``sm_<arch>`` without a GPU (Triton's ``CompiledKernel``).

    bf16 operands with 16-byte aligned pointers (as Triton specializes them on the GPU: without that
    hint the loads are not pipelined and the count is far lower), values shared by the key group, the
    rebuild chunked by ``block_r`` (``kloop``: as a pipelined loop, RoPE per position; ``raw``: no rebuild, the
    keys read as cached); ``rk`` the padded key rank, ``rvp`` the value tile; ``bias``: a key bias (Qwen2);
    ``vdesc``: the value latents read through a tensor descriptor (``V_DESC``); ``unroll``: the key group's heads
    unrolled (``UNROLL``, the launch's default up to two heads).
    """
    import inspect

    if vdesc and not transposed_values(block_t, kloop):
        raise ValueError(
            f"value descriptors serve token tiles of {VALUE_T_TILE} and more outside the rank loop"
        )
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = _latent_flash_kernel
    params = list(inspect.signature(fn.fn).parameters)
    const = dict(NREP=n_rep, G=key_group, HALF=head_dim // 2, RK=rk, RVP=rvp, MQ=next_pow2(n_rep * key_group),
                 BLOCK_T=block_t, BLOCK_R=block_r, HAS_BIAS=bias, HAS_NORM=False, V_SHARED=True,
                 STAGE_U=False, UNROLL=unroll, RA=8, RAV=8, K_LOOP=kloop, ROPE_TAB=rope_tab, RAW_K=raw,
                 V_DESC=vdesc, PAIRED=paired)  # fmt: skip
    ptrs = {"q_ptr": "*bf16", "zk_ptr": "*bf16", "zv_ptr": "*bf16", "uk_ptr": "*bf16", "koff_ptr": "*i32",
            "kr_ptr": "*i32", "voff_ptr": "*i32", "vr_ptr": "*i32", "kb_ptr": "*bf16", "kn_ptr": "*bf16",
            "inv_ptr": "*fp32", "rope_ptr": "*fp32", "len_ptr": "*i32", "o_ptr": "*fp32", "ml_ptr": "*fp32",
            "zvd": f"tensordesc<bf16[1, {block_t}, {value_width(rvp)}]>" if vdesc else "*bf16"}  # fmt: skip
    floats = ("qk_scale", "rope_scale", "eps")
    sig = {p: "constexpr" if p in const else ptrs.get(p, "fp32" if p in floats else "i32") for p in params}
    src = ASTSource(
        fn=fn,
        signature=sig,
        constexprs={(params.index(k),): v for k, v in const.items()},
        attrs={(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if p in ptrs and p != "zvd"},
    )
    opts = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=opts)


def compiled_shared_bytes(*args: Any, **kwargs: Any) -> int:
    """Shared memory (bytes per block) of the flash kernel compiled for ``sm_<arch>``, without a GPU
    (:func:`compiled_kernel`'s arguments)."""
    return int(compiled_kernel(*args, **kwargs).metadata.shared)


def compiled_resources(*args: Any, **kwargs: Any) -> dict[str, int]:
    """Registers a thread, stack bytes a thread (register spills past the ABI's frame) and shared bytes a
    block of the flash kernel compiled for ``sm_<arch>`` (:func:`compiled_kernel`'s arguments), read from its
    cubin by the ``cuobjdump`` Triton ships (:func:`gac.kernels.jit.cubin_resources`). No GPU is needed."""
    from gac.kernels.jit import cubin_resources

    return cubin_resources(compiled_kernel(*args, **kwargs))


#: why launches read their value latents through registers on a GPU with the tensor-memory accelerator
#: (:func:`value_descriptor`; reported by :func:`gac.nn.latent.latent_attention_paths` as ``value_pointer_loads``)
_VALUE_PTR_REASONS: set[str] = set()


def value_pointer_reasons() -> list[str]:
    """Why launches of this process on a Hopper GPU (or the interpreter) loaded values without a descriptor."""
    return sorted(_VALUE_PTR_REASONS)


def _tma_capable(device: torch.device) -> bool:
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device.type == "cuda" and torch.cuda.get_device_capability(device)[0] >= 9


def value_descriptor(zv: torch.Tensor, block_t: int, rvp: int, rav: int) -> Any:
    """A tensor descriptor of the value latents ``[B, T, Σ r_v]`` for the flash kernel's ``V_DESC`` loads
    (blocks ``[1, block_t, value_width(rvp)]``), or None where the GPU has no tensor-memory accelerator or the
    cache cannot be described (warned once a reason, recorded in :func:`value_pointer_reasons`). ``rav``: what the
    value groups' latent offsets and the strides are multiples of (:data:`latent_align`); a descriptor's loads
    start at 16-byte multiples.

    Through the descriptor a value tile goes to shared memory without passing through registers; loaded
    through them, a ``[128, 512]`` bf16 tile (value ranks 288-496, the 8B shapes' first layers) took 128
    registers a thread in 8 warps, and the key-group-4 launch spilled (compiled for sm_90 by Triton 3.6:
    ``benchmarks/results/cpu/latent_regs_v12.json``). Rows past the valid length are read as cached: they must be
    finite (the static cache is zero-filled); their probabilities are zero.
    """
    if not _tma_capable(zv.device):
        return None
    vw = value_width(rvp)
    es = zv.element_size()
    why = None
    if zv.dim() != 3 or zv.stride(-1) != 1:
        why = (
            f"value latents of shape {tuple(zv.shape)} and strides {tuple(zv.stride())} (not [B, T, R] rows)"
        )
    elif vw > 256:
        why = f"a value tile of {vw} latent columns (the descriptor's box holds at most 256)"
    elif (rav * es) % 16 or zv.data_ptr() % 16:
        why = (
            f"value groups' latent offsets and rows aligned to {rav * es} bytes (the descriptor needs 16: "
            "ranks aligned to 8, as --align gac's are)"
        )
    if why is not None:
        if why not in _VALUE_PTR_REASONS:
            log.warning("latent decode kernel: value latents loaded through registers: %s", why)
            _VALUE_PTR_REASONS.add(why)
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor(zv, list(zv.shape), list(zv.stride()), [1, int(block_t), vw])


def _resplit(cfg: dict[str, int], ctas: int, t: int, device: torch.device) -> dict[str, int]:
    """``cfg`` with its splits recomputed for its token tile (a shrunk tile changes the tiles per split)."""
    return {**cfg, "splits": num_splits(ctas, t, cfg["block_t"], device, cfg.get("waves", 2))}


def _split_buffers(
    q: torch.Tensor, splits: int, rvp: int, poison: float | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A flash kernel's fp32 partial outputs ``[B, H, splits, rvp]`` and running max/sum ``[B, H, splits, 2]``, and
    the combined output ``[B, H, rvp]`` (``poison``, for tests: every element the kernels must write starts as it)."""
    b, h, _ = q.shape
    part = torch.empty(b, h, splits, rvp, device=q.device, dtype=torch.float32)
    ml = torch.empty(b, h, splits, 2, device=q.device, dtype=torch.float32)
    out = torch.empty(b, h, rvp, device=q.device, dtype=q.dtype)
    if poison is not None:
        for x in (part, ml, out):
            x.fill_(poison)
    return part, ml, out


def _combine(part: torch.Tensor, ml: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``out`` from the splits' partial outputs: the combine kernel, one program a (sequence, query head)."""
    b, h, splits, rvp = part.shape
    sp = next_pow2(splits, 2)
    _latent_combine_kernel[(b * h,)](
        part, ml, out, h, NSPLIT=splits, SP=sp, BS=min(sp, 16), RVP=rvp, num_warps=4
    )
    return out


#: which kernel serves a launch (``GAC_LATENT_KERNEL``): ``auto``, the Hopper kernel of :mod:`gac.kernels.latent_gluon`
#: wherever it serves the launch and the Triton flash kernel above elsewhere (the reason recorded: :data:`LAST_LAUNCH`'s
#: ``gluon_refused``, :func:`gluon_refusals`, warned once a reason where the GPU is a Hopper one); ``triton``, the
#: Triton kernel always. A launch forced by ``GAC_LATENT_LAUNCH`` or given its ``cfg`` is the Triton kernel's.
LATENT_KERNEL = os.environ.get("GAC_LATENT_KERNEL", "auto")
#: the Gluon kernel's splits fill the GPU this many times (one program a multiprocessor: 200 KiB of shared memory)
GLUON_WAVES = 2
#: why launches of this process took the Triton kernel where ``auto`` asked for the Gluon one
_GLUON_REFUSED: set[str] = set()
#: the kernels this process's launches took (``gluon``, ``triton``)
_KERNELS_RAN: set[str] = set()


def gluon_refusals() -> list[str]:
    """Why launches of this process took the Triton kernel where :data:`LATENT_KERNEL` asked for the Gluon one."""
    return sorted(_GLUON_REFUSED)


def kernels_ran() -> list[str]:
    """The latent kernels this process's launches took: ``gluon`` and/or ``triton``."""
    return sorted(_KERNELS_RAN)


def _launch_gluon(
    q, zk, zv, uk, koff, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps, kvh, pl, poison=None,
) -> torch.Tensor:  # fmt: skip
    """The Gluon kernel by the launch ``pl`` (:func:`gac.kernels.latent_gluon.plan`) and the Triton combine:
    :func:`_launch_once`'s output."""
    b, h, _ = q.shape
    t = zk.shape[1]
    ctas = b * (kvh // pl.g)
    bt, nw = pl.block_t, pl.num_warps
    # a program of two warpgroups (pl.ws) covers two splits, a tile of each at a time
    splits = num_splits(ctas, t, bt * pl.ws, q.device, GLUON_WAVES)
    key = ("gluon", q.device.index, h, kvh, k_bias is not None, k_norm is not None, pl)
    if key in _RESIDENT:
        splits = balanced_splits(splits, ctas, t, bt * pl.ws, _RESIDENT[key] * _sm_count(q.device.index or 0))
    part, ml, out = _split_buffers(q, splits * pl.ws, pl.rvo, poison)
    kern = latent_gluon.launch(
        q, zk, zv, uk, koff, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps, kvh, pl, part, ml
    )  # fmt: skip
    LAST_LAUNCH.clear()
    # block_r: the rank tile, as the Triton kernel's record names it (the profile's latent class reads it)
    LAST_LAUNCH.update(kernel="gluon", block_t=bt, block_r=latent_gluon.RANK_TILE, num_warps=nw, column_chunk=pl.qc,
                       x_registers=pl.xreg, stages=[pl.xs, pl.vs], key_boxes=[pl.rk1, pl.rk2],
                       value_boxes=[pl.rvl, pl.rvh], splits=splits, sub=pl.g, waves=GLUON_WAVES, rope_table=True,
                       raw_keys=False, value_tma=True, paired_keys=False, occupancy=pl.occ,
                       warpgroups=pl.ws)  # fmt: skip
    n_regs = getattr(kern, "n_regs", None)
    if n_regs:
        LAST_LAUNCH["registers"] = int(n_regs)
        LAST_LAUNCH["shared"] = int(kern.metadata.shared)
        LAST_LAUNCH["resident"] = resident_programs(n_regs, int(kern.metadata.shared), nw * pl.ws, q.device)
        _RESIDENT.setdefault(key, LAST_LAUNCH["resident"])
    _KERNELS_RAN.add("gluon")
    return _combine(part, ml, out)


def _launch(
    q, zk, zv, uk, koff, kr, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps,
    rk_max, rv_max, kvh, k_group, v_shared, align=1, valign=1, cfg: dict[str, int] | None = None, poison=None,
    rope: torch.Tensor | None = None, raw: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Launch the flash kernel and its combine; a launch that needs more shared memory than the GPU
    has is retried smaller (:func:`shrink`), warned once per launch shape and recorded in
    :data:`LAST_LAUNCH` (``shrunk_from``). With :data:`LATENT_KERNEL` ``auto``, the Gluon kernel where it serves."""
    from triton.runtime.errors import OutOfResources

    b, h, hd = q.shape
    t = zk.shape[1]
    n_rep, rk = h // kvh, int(rk_max)
    refused = None
    table = None  # the Triton kernel's launch, where the Gluon kernel's choice needed it
    if LATENT_KERNEL == "auto" and cfg is None and not _ENV:
        refused, pl = latent_gluon.refusal(
            q, zk, zv, uk, rk_max, rv_max, k_group, n_rep, v_shared, raw, rope_table=rope is not None
        )
        if refused is None:  # served, unless the Triton kernel was timed faster at this launch
            table = launch_config(b * (kvh // k_group), t, k_group, q.device, raw=raw, n_rep=n_rep, rk=rk)
            refused = latent_gluon.slower(k_group, b, pl, program_heads(k_group, table.get("sub")))
        if refused is None:
            return _launch_gluon(
                q, zk, zv, uk, koff, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps, kvh,
                pl, poison,
            )  # fmt: skip
        if refused not in _GLUON_REFUSED:
            _GLUON_REFUSED.add(refused)
            if q.device.type == "cuda" and torch.cuda.get_device_capability(q.device)[0] == 9:  # a Hopper GPU
                log.warning("latent decode: the Gluon kernel does not serve this launch (%s); the Triton kernel runs",
                            refused)  # fmt: skip
    cfg = dict(
        cfg or table or launch_config(b * (kvh // k_group), t, k_group, q.device, raw=raw, n_rep=n_rep, rk=rk)
    )
    sub = program_heads(k_group, cfg.get("sub"))
    ctas = b * (kvh // sub)
    key = (q.device.index, q.dtype, h, hd, kvh, k_group, rk_max, rv_max, k_bias is not None,
           k_norm is not None, bool(v_shared), align, valign, cfg["block_t"], cfg["block_r"],
           cfg["num_warps"], cfg["num_stages"], cfg.get("unroll", 2), cfg.get("kloop", 0), sub, raw,
           PAIRED_KEYS)  # fmt: skip
    asked = dict(cfg)
    if key in _FITTED:
        cfg = _resplit({**cfg, **_FITTED[key]["ran"]}, ctas, t, q.device)
    if cfg.get("auto_splits") and key in _RESIDENT:  # the last wave nearly full, once the occupancy is known
        slots = _RESIDENT[key] * _sm_count(q.device.index or 0)
        cfg["splits"] = balanced_splits(cfg["splits"], ctas, t, cfg["block_t"], slots)
    args = (q, zk, zv, uk, koff, kr, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps,
            rk_max, rv_max, kvh, k_group, v_shared, align, valign, poison, rope, raw)  # fmt: skip
    while True:
        try:
            out = _launch_once(*args, cfg)
        except OutOfResources as e:
            smaller = shrink(cfg, rank_loop=sub > 2 and not _ENV and not raw)
            if smaller is None:
                raise
            log.warning(
                "latent decode kernel: block_t %d, %d stage(s) needs more shared memory than this GPU has "
                "(%s); launching with block_t %d, %d stage(s)%s",
                cfg["block_t"], cfg["num_stages"], e, smaller["block_t"], smaller["num_stages"],
                ", the rank chunks as a pipelined loop" if smaller.get("kloop") and not cfg.get("kloop") else "",
            )  # fmt: skip
            cfg = _resplit(smaller, ctas, t, q.device) if smaller["block_t"] != cfg["block_t"] else smaller
            _FITTED[key] = {"key_group": k_group, "rk_max": int(rk_max), "rv_max": int(rv_max),
                            "asked": {"block_t": asked["block_t"], "num_stages": asked["num_stages"]},
                            "ran": {k: cfg[k] for k in _RAN_KEYS if k in cfg}}  # fmt: skip
            continue
        LAST_LAUNCH["kernel"] = "triton"
        _KERNELS_RAN.add("triton")
        if refused is not None:
            LAST_LAUNCH["gluon_refused"] = refused
        if key in _FITTED:
            LAST_LAUNCH["shrunk_from"] = dict(_FITTED[key]["asked"])
        if "resident" in LAST_LAUNCH:
            _RESIDENT.setdefault(key, int(LAST_LAUNCH["resident"]))
        return out


def _launch_once(
    q, zk, zv, uk, koff, kr, voff, vr, k_bias, k_norm, inv_freq, cache_len, scale, rope_scale, eps,
    rk_max, rv_max, kvh, k_group, v_shared, align, valign, poison, rope, raw, cfg: dict[str, int],
) -> torch.Tensor:  # fmt: skip
    b, h, hd = q.shape
    cfg = dict(cfg)
    g = program_heads(k_group, cfg.get("sub"))  # KV heads per program: the key group, or a part of it
    kgroups = kvh // g
    bt, br = cfg["block_t"], cfg["block_r"]
    rk = int(-(-rk_max // br) * br)
    if rk < br:
        br = rk
    splits = cfg["splits"]
    cfg.update(block_r=br)
    LAST_LAUNCH.clear()
    LAST_LAUNCH.update(cfg)
    rvp = next_pow2(rv_max)
    n_rep = h // kvh
    mq = next_pow2(g * n_rep)
    part, ml, out = _split_buffers(q, splits, rvp, poison)
    tab = (
        rope if rope is not None and bt < rope.shape[1] else None
    )  # rows 0..bt: the in-tile offsets and the step
    LAST_LAUNCH["rope_table"] = tab is not None
    LAST_LAUNCH["raw_keys"] = bool(raw)
    ra = latent_align(align, zk.stride(0), zk.stride(1), uk.stride(0), uk.stride(1))
    rav = latent_align(valign, zv.stride(0), zv.stride(1))
    kloop = bool(cfg.get("kloop", 0)) and not raw
    zvd = value_descriptor(zv, bt, rvp, rav) if transposed_values(bt, kloop) else None
    LAST_LAUNCH["value_tma"] = zvd is not None
    paired = (PAIRED_KEYS and not kloop and not raw and k_group > 2 and g < k_group and rk > br
              and hd >= PAIRED_MIN_HEAD_DIM)  # fmt: skip
    LAST_LAUNCH["paired_keys"] = paired
    kern = _latent_flash_kernel[(b * kgroups, splits)](
        q, zk, zv, zvd if zvd is not None else zv, uk, koff, kr, voff, vr,
        k_bias if k_bias is not None else uk,
        k_norm if k_norm is not None else uk,
        inv_freq, tab if tab is not None else inv_freq, cache_len, part, ml,
        q.stride(0), q.stride(1),
        zk.stride(0) // ra, zk.stride(1) // ra, zv.stride(0) // rav, zv.stride(1) // rav,
        uk.stride(0) // ra, uk.stride(1) // ra,
        part.stride(0), part.stride(1), part.stride(2),
        ml.stride(0), ml.stride(1),
        kgroups,
        splits,
        float(scale) * 1.4426950408889634,
        float(rope_scale),
        float(eps),
        NREP=n_rep, G=g, HALF=hd // 2, RK=rk, RVP=rvp, MQ=mq, BLOCK_T=bt, BLOCK_R=br,
        HAS_BIAS=k_bias is not None, HAS_NORM=k_norm is not None, V_SHARED=bool(v_shared), STAGE_U=g <= 2 and rk == br and not raw, UNROLL=g <= cfg.get("unroll", 2), RA=ra, RAV=rav,
        K_LOOP=kloop, ROPE_TAB=tab is not None,
        ROPE_ROWS=tab.shape[1] if tab is not None else 1, RAW_K=bool(raw), V_DESC=zvd is not None,
        PAIRED=paired,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )  # fmt: skip
    n_regs = getattr(kern, "n_regs", None)
    if n_regs and q.device.type == "cuda":  # what the GPU holds at once: _launch balances the splits by it
        LAST_LAUNCH["resident"] = resident_programs(
            n_regs, int(kern.metadata.shared), cfg["num_warps"], q.device
        )
    return _combine(part, ml, out)


def reference_latent_decode(
    q: torch.Tensor,
    zk: torch.Tensor,
    zv: torch.Tensor,
    pack: dict[str, Any],
    n_valid: int,
    inv_freq: torch.Tensor,
    scale: float,
    rope_scale: float = 1.0,
) -> torch.Tensor:
    """What :func:`latent_decode_attention` computes, in float64 torch, head by head: ``[B, H, max r_v]``.

    Each query head's keys are rebuilt from its key group's latents (with ``k_raw``: read as cached), then
    bias, RMSNorm and RoPE at slot positions ``0..n_valid-1``; softmaxed, and the weights applied to its
    value group's latents (zero past the group's rank). For tests and benchmarks.
    """
    b, h, hd = q.shape
    kvh = int(pack["kv_heads"])
    n_rep, gv = h // kvh, kvh // len(pack["v_ranks"])
    koff, kr = pack["koff"].tolist(), pack["kr"].tolist()

    def f(x: torch.Tensor) -> torch.Tensor:
        return x.detach().to(torch.float64)

    q, zk, zv, uk = f(q), f(zk[:, :n_valid]), f(zv[:, :n_valid]), f(pack["uk"])
    ang = torch.arange(n_valid, device=q.device, dtype=torch.float64)[:, None] * f(inv_freq)[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1) * rope_scale
    sin = torch.cat([ang.sin(), ang.sin()], -1) * rope_scale
    out = torch.zeros(b, h, max(pack["v_ranks"]), dtype=torch.float64, device=q.device)
    for k in range(kvh):
        if pack.get("k_raw"):  # the cache holds KV head k's keys at its column koff[k]
            keys = zk[..., koff[k] : koff[k] + hd]
        else:
            keys = zk[..., koff[k] : koff[k] + kr[k]] @ uk[k, :, : kr[k]].T  # [B, T, HD]
        if pack.get("k_bias") is not None:
            keys = keys + f(pack["k_bias"])[k]
        if pack.get("k_norm") is not None:
            ms = keys.pow(2).mean(-1, keepdim=True)
            keys = keys * torch.rsqrt(ms + float(pack.get("k_norm_eps") or 1e-6)) * f(pack["k_norm"])
        keys = keys * cos + torch.cat([-keys[..., hd // 2 :], keys[..., : hd // 2]], -1) * sin
        heads = slice(k * n_rep, (k + 1) * n_rep)
        p = (torch.einsum("bhd,btd->bht", q[:, heads], keys) * scale).softmax(-1)
        vo, vr = pack["v_offsets"][k // gv], pack["v_ranks"][k // gv]
        out[:, heads, :vr] = torch.einsum("bht,btr->bhr", p, zv[..., vo : vo + vr])
    return out
