"""PaLU's latent attention: the exact rank padding here; the module types live in :mod:`gac.nn.latent`.

:class:`~gac.nn.latent.LatentAttention`, :class:`~gac.nn.latent.LatentProjection`,
:class:`~gac.nn.latent.LatentCache` and the RoPE helpers moved to :mod:`gac.nn.latent`;
:func:`~gac.models.adapters.model_rotary` to :mod:`gac.models.adapters`;
:func:`~gac.models.inventory.kv_bytes_per_token` to :mod:`gac.models.inventory`. Every moved name is
re-exported here: saved PaLU models record the class path ``gac.surgery.latent_attention:LatentAttention``
in ``gac_config.json`` and keep loading through it.
"""

from __future__ import annotations

import torch
from torch import nn

from gac.errors import GacError
from gac.models.adapters import model_rotary
from gac.models.inventory import kv_bytes_per_token
from gac.nn.latent import (
    SPEC_VERSION,
    SWITCHED_OFF,
    LatentAttention,
    LatentCache,
    LatentProjection,
    apply_rope,
    latent_attention_paths,
    latent_modules,
    rotate_half,
)

__all__ = [
    "SPEC_VERSION",
    "SWITCHED_OFF",
    "LatentAttention",
    "LatentCache",
    "LatentProjection",
    "apply_rope",
    "kv_bytes_per_token",
    "latent_attention_paths",
    "latent_modules",
    "model_rotary",
    "pad_latent_rank_",
    "rotate_half",
]


@torch.no_grad()
def pad_latent_rank_(attn: LatentAttention, kind: str, group: int, r_new: int) -> None:
    """Zero-pad group ``group``'s ``kind`` (``"k"``/``"v"``) latent rank to ``r_new``, exactly.

    The new latent dims have zero down-projection rows (they cache zeros) and zero up-projection
    columns (and, for folded values, zero ``o_proj`` columns), so every output is unchanged.
    """
    proj = attn.k_proj if kind == "k" else attn.v_proj
    r, off = proj.ranks[group], proj.offsets()[group]
    if r_new < r:
        raise GacError(f"cannot pad latent rank {r} down to {r_new}")
    if r_new == r:
        return
    extra = r_new - r
    w = proj.down.weight
    rows = torch.zeros(extra, w.shape[1], device=w.device, dtype=w.dtype)
    new_down = nn.Linear(w.shape[1], w.shape[0] + extra, bias=False, device=w.device, dtype=w.dtype)
    new_down.weight.copy_(torch.cat([w[: off + r], rows, w[off + r :]]))
    proj.down = new_down
    up = proj.ups[group]
    new_up = nn.Linear(r_new, up.out_features, bias=up.bias is not None, device=w.device, dtype=w.dtype)
    new_up.weight.zero_()
    new_up.weight[:, :r].copy_(up.weight)
    if up.bias is not None:
        new_up.bias.copy_(up.bias)
    proj.ups[group] = new_up
    if kind == "v" and attn.folded:
        o = attn.o_proj
        cols, at = [], 0
        ranks_before = [proj.ranks[g] if g != group else r for g in range(len(proj.ranks))]
        for h in range(attn.heads):
            g = (h // attn.num_key_value_groups) // attn.group_kv_v
            width = ranks_before[g]
            cols.append(o.weight[:, at : at + width])
            if g == group:
                cols.append(torch.zeros(o.weight.shape[0], extra, device=w.device, dtype=w.dtype))
            at += width
        new_o = nn.Linear(
            sum(c.shape[1] for c in cols),
            o.out_features,
            bias=o.bias is not None,
            device=w.device,
            dtype=w.dtype,
        )
        new_o.weight.copy_(torch.cat(cols, dim=1))
        if o.bias is not None:
            new_o.bias.copy_(o.bias)
        attn.o_proj = new_o
    attn.__dict__.pop("_pack_key", None)
