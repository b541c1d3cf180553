"""``svd``: plain truncated SVD, ``W ≈ U_r Σ_r V_rᵀ``, no calibration.

Stored as a :class:`~gac.nn.FactorizedLinear` with ``u = U_r Σ_r^{1/2}`` and
``v = Σ_r^{1/2} V_rᵀ``. The loss curve is the sum of the truncated squared singular values, which
equals ``‖W − W_r‖²_F`` exactly (Eckart-Young). Native allocation: one uniform parameter ratio.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from gac.compressors.base import register_compressor
from gac.compressors.lowrank import LowRankCompressor


@register_compressor("svd")
class SvdCompressor(LowRankCompressor):
    """Plain truncated SVD of each projection."""

    needs_calibration = False
    supports_sequential = True

    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
        """Nothing to collect: plain SVD ignores the data."""
        self._model = model
