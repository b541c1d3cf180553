"""The earlier low-rank decode kernel's module (:mod:`gac.kernels.lowrank_gemv`), swapped in by ``gac.llm_run --triton``.

Not measured and not on the default path: every factorized layer is swapped, and inputs of at most
``max_rows`` token rows take the kernel.  The one-launch kernel of :mod:`gac.runtime.lowrank_fused`
replaced it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gac.kernels.jit import HAVE_TRITON
from gac.kernels.lowrank_gemv import lowrank_matmul
from gac.nn import FactorizedLinear, replace_module


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
