"""Decode attention over a grouped-query KV cache without copying the cache.

With grouped-query attention (Llama-3, Mistral, Qwen2: 8 KV heads for 32 query heads) and an
attention mask, transformers' ``sdpa`` path expands every layer's cached keys and values to the
query heads (``repeat_kv``) before calling SDPA: at each decode step the whole cache is read
once, written ``n_rep`` times and read ``n_rep`` times again.  (transformers only passes
``enable_gqa`` to SDPA when there is no mask, and newer versions' single-token ``pack_gqa``
branch is skipped under ``torch.compile``.)

``gac_sdpa`` is ``sdpa`` with one change: a single-token query is regrouped as
``[batch, kv_heads, n_rep, head_dim]`` (query head ``h`` belongs to KV head ``h // n_rep``,
the order ``repeat_kv`` uses), so the ``n_rep`` queries of a group attend to their shared KV
head directly and the cache is read once.  The mask of a single-token query is the same for
every head and broadcasts over the group.  The result is the same attention (summation order
aside).  Every other case (prefill, no GQA, per-head masks) is transformers' own ``sdpa``.

:func:`use_gqa_decode_` switches a model to it; the inference sweep and ``gac generate`` do so
by default on the models they time.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

NAME = "gac_sdpa"
#: how a grouped single-token query attends: ``"sdpa"`` (SDPA on the grouped query), ``"matmul"``
#: (two batched GEMMs and a float32 softmax, as transformers' eager attention computes it),
#: ``"stock"`` (transformers' own ``sdpa``: the cache expanded to the query heads) or ``"auto"``
#: (:func:`decode_mode`).
DECODE_MODE = "auto"


def decode_mode(batch: int, kv_heads: int, kv_len: int) -> str:
    """The decode attention :data:`DECODE_MODE` ``"auto"`` picks for one step.

    >>> decode_mode(1, 8, 512), decode_mode(16, 8, 32768), decode_mode(64, 8, 32768), decode_mode(128, 8, 32768)
    ('matmul', 'matmul', 'matmul', 'sdpa')
    """
    if DECODE_MODE != "auto":
        return DECODE_MODE
    # SDPA's fused kernels run one CTA per (batch, KV head, query block): a grouped single-token
    # query at batch 1 is 8 CTAs on a 132-SM GPU (80 µs per layer at KV 4096 on an H200).  Two
    # batched GEMMs were faster at every point measured up to KV 4096 (Llama-3-8B shape, H200: B 1-64,
    # dense decode steps 2-28% shorter, ``benchmarks/results/h200/decode-diag/diag.json``) and past it, in whole
    # compiled steps at B 1/4/16 x KV 8192/32768 (8 KV heads): on the H200 at all six points (B1 x KV
    # 32768: 1.90 against 6.40 ms; B16 x KV 32768: 5.80 against 6.68), on an H100 at four, tied at B16 x
    # KV 8192 and 4% slower at B16 x KV 32768 (``benchmarks/results/{h200,h100}/decode-attention/``).
    # Past 128 pairs, at B 32/64/128 x KV 8192/16384/32768 on the H200 (Llama-3-8B and Qwen2.5-7B shapes), the
    # GEMMs took 0.81-0.89x SDPA's step on Llama and 0.86-0.96x on Qwen, up to 2^24 cached (sequence, KV head,
    # token) slots. At Llama B128 x KV 32768 (2^25) they ran out of memory where SDPA fit: that cache fills 128 of
    # the H200's 139 GiB and the GEMMs' step needs about 4 GiB more (``benchmarks/results/h200/palu-default/call21/``,
    # ``call22/``), so past MATMUL_MAX_SLOTS, where such caches fill the GPU, SDPA stays.
    if (
        kv_len <= MATMUL_MAX_KV
        or batch * kv_heads <= MATMUL_MAX_CTAS
        or batch * kv_heads * kv_len <= MATMUL_MAX_SLOTS
    ):
        return "matmul"
    return "sdpa"


#: up to this cache length the ``"auto"`` decode mode always attends with two batched GEMMs.
MATMUL_MAX_KV = 4096
#: past :data:`MATMUL_MAX_KV`, the two GEMMs up to this many (batch x KV head) pairs, SDPA's CTAs
#: (the measured range: B16 x 8 KV heads) at any cache length
MATMUL_MAX_CTAS = 128
#: and up to this many cached (batch x KV head x token) slots: B64 x 8 KV heads x 32768, B128 x 8 x 16384, B128 x 4
#: x 32768 (the measured range on the H200; an H100 is unmeasured past 128 pairs)
MATMUL_MAX_SLOTS = 1 << 24


def gqa_sdpa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """``sdpa`` attention, with single-token GQA queries grouped onto their KV heads."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    n_rep = int(getattr(module, "num_key_value_groups", 1) or 1)
    b, h, q_len, d = query.shape
    plain = (
        n_rep == 1
        or q_len != 1
        or key.shape[1] * n_rep != h
        or (attention_mask is not None and (attention_mask.dim() != 4 or attention_mask.shape[1] != 1))
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("softcap") is not None
        or dropout != 0.0
    )
    mode = "stock" if plain else decode_mode(b, key.shape[1], key.shape[2])
    if mode == "stock":
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    q = query.reshape(b, key.shape[1], n_rep, d)
    if mode == "matmul":
        s = torch.matmul(q, key.transpose(-1, -2)) * (scaling if scaling is not None else d**-0.5)
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                s = s.masked_fill(~attention_mask, float("-inf"))
            else:
                s = s + attention_mask
        p = torch.softmax(s, dim=-1, dtype=torch.promote_types(s.dtype, torch.float32)).to(value.dtype)
        out = torch.matmul(p, value)
    else:
        out = torch.nn.functional.scaled_dot_product_attention(
            q, key, value, attn_mask=attention_mask, dropout_p=0.0, scale=scaling, is_causal=False
        )
    return out.reshape(b, h, 1, value.shape[-1]).transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``gac_sdpa`` with transformers' attention and mask interfaces (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, gqa_sdpa_attention_forward)
    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME


def model_decode_modes(model: nn.Module, batch: int, kv_len: int) -> list[str]:
    """The decode attention :func:`gqa_sdpa_attention_forward` takes at a single-token step of ``batch`` sequences
    over ``kv_len`` cached tokens, each distinct one over ``model``'s layers (sorted); none where the model does not
    attend with ``gac_sdpa``, and none of layers that declare ``attention_interface = False`` (PaLU's latent
    attention). Derived from each layer's KV heads (its ``k_proj`` width over ``head_dim``) as the
    forward derives them from its cache, so the step itself records nothing (a set mutated in the forward made
    ``torch.compile`` recompile the step on its second call)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) != NAME:
        return []
    modes = set()
    for m in model.modules():
        n_rep, hd = getattr(m, "num_key_value_groups", None), getattr(m, "head_dim", 0)
        width = getattr(getattr(m, "k_proj", None), "out_features", None)
        if n_rep and hd and width and getattr(m, "attention_interface", True):
            modes.add("stock" if int(n_rep) == 1 else decode_mode(batch, int(width) // int(hd), kv_len))
    return sorted(modes)


def use_gqa_decode_(model: nn.Module) -> bool:
    """Switch ``model`` from ``sdpa`` to ``gac_sdpa`` in place when it uses grouped-query attention.

    Returns whether it switched: models on another attention implementation (eager, flash, a
    custom one such as PaLU's latent attention) or without grouped KV heads are left alone.
    """
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "_attn_implementation", None) != "sdpa":
        return False
    heads = getattr(cfg, "num_attention_heads", None)
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if not heads or not kv or kv == heads:
        return False
    register()
    for m in model.modules():  # every config of a composite model reads the same implementation
        c = getattr(m, "config", None)
        if c is not None and getattr(c, "_attn_implementation", None) == "sdpa":
            c._attn_implementation = NAME
    return True


def undo_gqa_decode_(model: nn.Module) -> None:
    """Back to transformers' ``sdpa``."""
    for m in model.modules():
        c = getattr(m, "config", None)
        if c is not None and getattr(c, "_attn_implementation", None) == NAME:
            c._attn_implementation = "sdpa"
