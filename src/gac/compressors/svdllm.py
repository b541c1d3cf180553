"""``svd-llm`` (Wang et al. 2024, "SVD-LLM: truncation-aware singular value decomposition").

Truncation-aware data whitening: with the Gram matrix ``G = XᵀX`` of a projection's calibration
inputs (``X [tokens, in]``) and its Cholesky factor ``G = S Sᵀ`` (``S`` lower-triangular), take the
SVD ``W·S = UΣVᵀ``, keep the top ``d`` triplets and fold ``S⁻¹`` into the right factor:
``W' = (U_d Σ_d^{1/2}) (Σ_d^{1/2} V_dᵀ S⁻¹)``. Then ``(W − W')S = Σ_{i>=d} σ_i u_i v_iᵀ`` and

    ‖(W − W') Xᵀ‖²_F = tr((W − W') G (W − W')ᵀ) = ‖(W − W') S‖²_F = Σ_{i>=d} σ_i²,

so every truncated singular value maps directly to compression loss. The loss curve exposed to
the allocator is exactly that sum, divided by the number of calibration tokens (a mean squared
output error per token, comparable across sites that see the same tokens).

When ``G`` is not positive-definite (dead input channels, too few tokens), the whitening falls
back to ``G + λI`` with ``λ`` starting at ``1e-8 · mean(diag G)`` and growing tenfold until the
Cholesky factorization succeeds, and logs a warning; an all-zero Gram falls back to plain SVD. Then
the loss curve is ``‖(W − W')Xᵀ‖²_F + λ‖W − W'‖²_F``. Native allocation: one uniform parameter
ratio over all projections, as in the paper. (The paper's optional LoRA/sequential update step is
not part of this compressor.)
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from gac.compressors.base import register_compressor
from gac.compressors.calibration import LinearStats, collect_stats, collect_stats_sequential
from gac.compressors.lowrank import LowRankCompressor
from gac.errors import GacError
from gac.sites import Site

log = logging.getLogger(__name__)


def whitening_factor(gram: torch.Tensor, name: str = "?") -> tuple[torch.Tensor | None, float]:
    """The lower Cholesky factor ``S`` of ``gram`` (``S Sᵀ = gram``), with a stable fallback.

    Returns:
        ``(S, λ)``: ``λ`` is the diagonal jitter that was needed (0 when ``gram`` is
        positive-definite). ``S`` is None when the Gram is zero or not finite (use plain SVD).
    """
    g = gram.to(torch.float64)
    g = (g + g.T) / 2
    if not torch.isfinite(g).all():
        _warn(f"{name}: Gram matrix has NaN/inf entries; falling back to plain SVD")
        return None, float("nan")
    chol, info = torch.linalg.cholesky_ex(g)
    if int(info) == 0:
        return chol, 0.0
    scale = float(torch.diagonal(g).mean())
    if scale <= 0:
        _warn(f"{name}: Gram matrix is zero (no signal on this input); falling back to plain SVD")
        return None, float("nan")
    eye = torch.eye(g.shape[0], dtype=g.dtype, device=g.device)
    lam = 1e-8 * scale
    while lam <= 1e4 * scale:
        chol, info = torch.linalg.cholesky_ex(g + lam * eye)
        if int(info) == 0:
            _warn(
                f"{name}: Gram matrix not positive-definite; whitening with G + {lam:.3g}·I "
                f"({lam / scale:.0e} x mean diagonal)"
            )
            return chol, lam
        lam *= 10
    _warn(f"{name}: Gram matrix could not be regularized; falling back to plain SVD")
    return None, float("nan")


def _warn(msg: str) -> None:
    log.warning(msg)


@register_compressor("svd-llm")
class SvdLlmCompressor(LowRankCompressor):
    """Truncation-aware whitening with the Cholesky factor of the input Gram matrix."""

    supports_sequential = True

    def __init__(self, svd_dtype: str | None = None) -> None:
        super().__init__(svd_dtype)
        self._stats: dict[str, LinearStats] = {}
        self._chol: dict[str, tuple[torch.Tensor | None, float]] = {}
        self._fallbacks: dict[str, float] = {}

    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
        """Accumulate ``XᵀX`` (float64) once per group of projections sharing an input."""
        self._model = model
        if not self._groups:
            self.sites(model)
        leaders: dict[str, str] = {}
        for name, group in self._groups.items():
            leaders.setdefault(group, name)
        mods = {g: model.get_submodule(n) for g, n in leaders.items()}
        if self.exec_device is not None:  # one decoder layer at a time (CompressConfig.max_gpu_memory)
            self._stats, self.sequential_info = collect_stats_sequential(
                model, mods, batches, self.exec_device, gram=True, description="svd-llm: calibration"
            )
        else:
            self._stats = collect_stats(model, mods, batches, gram=True, description="svd-llm: calibration")
        self._chol.clear()
        self._spectra.clear()

    def _group_stats(self, site: Site) -> LinearStats:
        group = self._groups.get(site.name)
        if group is None or group not in self._stats:
            raise GacError(f"svd-llm: no calibration statistics for {site.name}; call calibrate() first")
        return self._stats[group]

    def whitening(self, site: Site) -> tuple[torch.Tensor | None, float]:
        """``(S, λ)`` for ``site`` (cached per input group)."""
        group = self._groups[site.name]
        if group not in self._chol:
            st = self._group_stats(site)
            self._chol[group] = whitening_factor(st.gram, site.name)
            if self._chol[group][1] != 0.0:
                self._fallbacks[group] = self._chol[group][1]
        return self._chol[group]

    def scaling(self, site: Site, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        chol, _ = self.whitening(site)
        return {} if chol is None else {"tril": chol.to(weight.device)}

    def loss_scale(self, site: Site) -> float:
        return 1.0 / max(self._group_stats(site).n_tokens, 1)

    def release(self) -> None:
        self._stats.clear()
        self._chol.clear()

    def options(self) -> dict[str, Any]:
        return {
            **super().options(),
            "whitening": "cholesky",
            "fallback_groups": {g: (None if lam != lam else lam) for g, lam in self._fallbacks.items()},
        }
