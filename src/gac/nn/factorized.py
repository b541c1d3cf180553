"""Factorized (low-rank) linear layers: W ~= U @ V, stored as two linear layers.

A module type, low in the house: it imports nothing of gac. Operations on it (padding, repair)
live in :mod:`gac.surgery`.
"""

from __future__ import annotations

import torch
from torch import nn


class FactorizedLinear(nn.Module):
    """``y = u(v(x))`` with ``v: in -> rank`` (no bias) and ``u: rank -> out`` (bias optional).

    The state-dict keys are ``v.weight``, ``u.weight`` and ``u.bias``; a saved gac model
    records each site's (in, rank, out) so the skeleton can be rebuilt before loading.
    """

    def __init__(
        self,
        in_features: int,
        rank: int,
        out_features: int,
        bias: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if rank <= 0:
            raise ValueError(f"rank must be positive, got {rank}")
        self.in_features = in_features
        self.out_features = out_features
        self.v = nn.Linear(in_features, rank, bias=False, device=device, dtype=dtype)
        self.u = nn.Linear(rank, out_features, bias=bias, device=device, dtype=dtype)

    @property
    def rank(self) -> int:
        return self.v.out_features

    @property
    def weight(self) -> torch.Tensor:
        """The dense equivalent ``U @ V`` (computed; used by code that inspects ``.weight``)."""
        return self.u.weight @ self.v.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.u.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.u(self.v(x))

    @classmethod
    def from_factors(
        cls, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None
    ) -> FactorizedLinear:
        """Build from ``u [out, r]``, ``v [r, in]`` and an optional bias, keeping device and dtype."""
        out_f, r = u.shape
        r2, in_f = v.shape
        if r != r2:
            raise ValueError(f"factor shapes disagree: u {tuple(u.shape)}, v {tuple(v.shape)}")
        m = cls(in_f, r, out_f, bias=bias is not None, device=u.device, dtype=u.dtype)
        with torch.no_grad():
            m.u.weight.copy_(u)
            m.v.weight.copy_(v)
            if bias is not None:
                m.u.bias.copy_(bias)
        return m

    def to_linear(self) -> nn.Linear:
        """The dense layer this factorization equals (the way back)."""
        lin = nn.Linear(
            self.in_features,
            self.out_features,
            bias=self.bias is not None,
            device=self.u.weight.device,
            dtype=self.u.weight.dtype,
        )
        with torch.no_grad():
            lin.weight.copy_(self.weight)
            if self.bias is not None:
                lin.bias.copy_(self.bias)
        return lin

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, rank={self.rank}, out_features={self.out_features}, bias={self.bias is not None}"
