"""Exact zero-padding primitives: grow a layer's input, output or inner rank with zeros.

Each function takes a *placement*: a 1-D ``LongTensor`` that says where old index ``j`` goes in
the padded dim (``placement[j]``); every other new index is zero.  End padding is
``torch.arange(old)``; the RoPE-preserving head layout is :func:`rope_head_placement`.

A zero output row gives an exact zero (plus a zero bias); a zero input column ignores whatever
the padded input holds, so outputs are unchanged bit-for-bit up to float summation order.
"""

from __future__ import annotations

import torch
from torch import nn

from gac.nn import FactorizedLinear


def end_placement(old: int) -> torch.Tensor:
    """Old index ``j`` stays at ``j`` (the new entries are appended)."""
    return torch.arange(old)


def rope_head_placement(heads: int, d: int, d_new: int) -> torch.Tensor:
    """Placement of ``heads`` heads of width ``d`` into heads of width ``d_new`` that keeps RoPE pairs.

    Hugging Face's ``rotate_half`` pairs dim ``i`` with ``i + d/2``; padded heads pair ``i`` with
    ``i + d_new/2``.  So each half moves separately: ``[h0 (d/2), 0, h1 (d/2), 0]``.

    >>> rope_head_placement(1, 4, 8).tolist()
    [0, 1, 4, 5]
    >>> rope_head_placement(2, 4, 8).tolist()
    [0, 1, 4, 5, 8, 9, 12, 13]
    """
    if d % 2 or d_new % 2 or d_new < d:
        raise ValueError(f"RoPE head padding needs even widths with d_new >= d, got {d} -> {d_new}")
    half, half_new = d // 2, d_new // 2
    j = torch.arange(d)
    within = torch.where(j < half, j, j - half + half_new)
    return (torch.arange(heads)[:, None] * d_new + within[None, :]).reshape(-1)


def head_end_placement(heads: int, d: int, d_new: int) -> torch.Tensor:
    """Placement of ``heads`` heads of width ``d`` into width ``d_new``, zeros at the end of each head.

    >>> head_end_placement(2, 3, 4).tolist()
    [0, 1, 2, 4, 5, 6]
    """
    return (torch.arange(heads)[:, None] * d_new + torch.arange(d)[None, :]).reshape(-1)


def _check(placement: torch.Tensor, old: int, new: int) -> torch.Tensor:
    placement = placement.to(torch.long).cpu()
    if placement.numel() != old or (old and int(placement.max()) >= new) or placement.unique().numel() != old:
        raise ValueError(f"bad placement for {old} -> {new}")
    return placement


def _scatter_rows(w: torch.Tensor, new: int, placement: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((new, *w.shape[1:]), dtype=w.dtype, device=w.device)
    out[placement.to(w.device)] = w
    return out


def _scatter_cols(w: torch.Tensor, new: int, placement: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((w.shape[0], new), dtype=w.dtype, device=w.device)
    out[:, placement.to(w.device)] = w
    return out


@torch.no_grad()
def pad_linear_out_(lin: nn.Linear, new: int, placement: torch.Tensor | None = None) -> None:
    """Grow ``lin``'s output to ``new`` features in place (zero rows, zero bias entries)."""
    old = lin.out_features
    placement = _check(end_placement(old) if placement is None else placement, old, new)
    lin.weight = nn.Parameter(_scatter_rows(lin.weight.data, new, placement), lin.weight.requires_grad)
    if lin.bias is not None:
        lin.bias = nn.Parameter(_scatter_rows(lin.bias.data, new, placement), lin.bias.requires_grad)
    lin.out_features = new


@torch.no_grad()
def pad_linear_in_(lin: nn.Linear, new: int, placement: torch.Tensor | None = None) -> None:
    """Grow ``lin``'s input to ``new`` features in place (zero weight columns)."""
    old = lin.in_features
    placement = _check(end_placement(old) if placement is None else placement, old, new)
    lin.weight = nn.Parameter(_scatter_cols(lin.weight.data, new, placement), lin.weight.requires_grad)
    lin.in_features = new


def pad_out_(mod: nn.Module, new: int, placement: torch.Tensor | None = None) -> None:
    """:func:`pad_linear_out_` for an ``nn.Linear`` or a ``FactorizedLinear`` (pads ``u``)."""
    _pad_side_(mod, new, placement, "out")


def pad_in_(mod: nn.Module, new: int, placement: torch.Tensor | None = None) -> None:
    """:func:`pad_linear_in_` for an ``nn.Linear`` or a ``FactorizedLinear`` (pads ``v``)."""
    _pad_side_(mod, new, placement, "in")


def _pad_side_(mod: nn.Module, new: int, placement: torch.Tensor | None, side: str) -> None:
    pad, inner, what = {"out": (pad_linear_out_, "u", "output"), "in": (pad_linear_in_, "v", "input")}[side]
    if isinstance(mod, FactorizedLinear):
        pad(getattr(mod, inner), new, placement)
        setattr(mod, f"{side}_features", new)
    elif isinstance(mod, nn.Linear):
        pad(mod, new, placement)
    else:
        raise TypeError(f"cannot pad the {what} of {type(mod).__name__}")


def pad_rank_(mod: FactorizedLinear, new: int) -> None:
    """Grow the inner rank of ``u(v(x))`` to ``new``: zero rows of ``v``, zero columns of ``u``."""
    old = mod.rank
    if new < old:
        raise ValueError(f"cannot pad rank {old} down to {new}")
    pad_linear_out_(mod.v, new)
    pad_linear_in_(mod.u, new)


@torch.no_grad()
def pad_embedding_(emb: nn.Embedding, new: int) -> None:
    """Grow the embedding dim to ``new`` (zero columns at the end)."""
    w = emb.weight.data
    emb.weight = nn.Parameter(_scatter_cols(w, new, end_placement(w.shape[1])), emb.weight.requires_grad)
    emb.embedding_dim = new


@torch.no_grad()
def pad_rmsnorm_(norm: nn.Module, new: int, placement: torch.Tensor | None = None) -> None:
    """Grow an RMSNorm from ``d`` to ``new`` channels so that its output on the real channels is unchanged.

    With zeros in the padded channels, ``mean(x^2)`` over ``new`` channels is ``d/new`` times the
    mean over ``d``.  Scaling ``eps`` by ``d/new`` and the weight by ``sqrt(d/new)`` gives back
    ``w * x / sqrt(mean_d(x^2) + eps)`` exactly (padded weights are 0).
    """
    w = norm.weight.data
    old = w.shape[0]
    placement = _check(end_placement(old) if placement is None else placement, old, new)
    ratio = old / new
    scaled = (w.double() * ratio**0.5).to(w.dtype)
    norm.weight = nn.Parameter(_scatter_rows(scaled, new, placement), norm.weight.requires_grad)
    for attr in ("variance_epsilon", "eps"):
        if hasattr(norm, attr) and isinstance(getattr(norm, attr), float):
            setattr(norm, attr, getattr(norm, attr) * ratio)
