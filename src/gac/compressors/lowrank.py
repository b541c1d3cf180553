"""Shared machinery of the SVD family (``svd``, ``asvd``, ``svd-llm``).

All three factor a projection ``W [out, in]`` through a right scaling ``S [in, in]``:
``W·S = U Σ Vᵀ``, keep the top ``d`` singular triplets and fold ``S⁻¹`` back into the right
factor, so ``W ≈ (U_d Σ_d^{1/2}) (Σ_d^{1/2} V_dᵀ S⁻¹)``. ``S`` is the identity for plain SVD, the
diagonal ``diag(mean|x|^α)`` for ASVD and the Cholesky factor of the input Gram matrix for SVD-LLM.
Splitting ``sqrt(Σ)`` into both factors follows both reference implementations.

The pure tensor functions (:func:`truncated_factors`, :func:`uniform_ratio_dims`) carry the math;
:class:`LowRankCompressor` does the plumbing: sites from the model's family adapter, the
spectra cache, the uniform native allocation and the module swap.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.compressors.base import Compressor, bisect_fraction, kept_dim
from gac.errors import GacError
from gac.nn import FactorizedLinear, replace_module
from gac.sites import Site, lowrank_site
from gac.utils import track


# ----------------------------------------------------------------------------- math
def svd_dtype_for(device: torch.device, requested: str | None = None) -> torch.dtype:
    """float64 on CPU (cheap and exact enough for the loss-curve identities), float32 on GPU."""
    if requested is not None:
        try:
            return {"float32": torch.float32, "float64": torch.float64}[requested]
        except KeyError:
            raise GacError(f"svd_dtype must be float32 or float64, got {requested!r}") from None
    return torch.float64 if device.type == "cpu" else torch.float32


def truncated_factors(
    u: torch.Tensor,
    s: torch.Tensor,
    vh: torch.Tensor,
    d: int,
    scale_inv: torch.Tensor | None = None,
    scale_tril: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank-``d`` factors of ``W`` from an SVD of ``W·S``.

    Args:
        u, s, vh: ``torch.linalg.svd(W·S, full_matrices=False)``.
        d: kept rank.
        scale_inv: ``1 / diag(S)`` when ``S`` is diagonal (ASVD).
        scale_tril: the lower-triangular ``S`` itself (SVD-LLM); ``S⁻¹`` is applied with a
            triangular solve, never an explicit inverse.

    Returns:
        ``(A [out, d], B [d, in])`` with ``A @ B`` the rank-``d`` approximation of ``W``.
    """
    root = s[:d].sqrt()
    a = u[:, :d] * root
    b = root[:, None] * vh[:d]
    if scale_inv is not None:
        b = b * scale_inv[None, :]
    if scale_tril is not None:
        # B S⁻¹  <=>  solve X S = B for X
        b = torch.linalg.solve_triangular(scale_tril, b, upper=False, left=False)
    return a, b


def tail_energy_curve(s: torch.Tensor, max_dim: int) -> np.ndarray:
    """``loss[d] = Σ_{i>=d} σ_i²`` for ``d < max_dim`` and 0 at ``max_dim`` (the dense layer)."""
    sq = (s.detach().double().cpu() ** 2).numpy()
    tail = np.concatenate([np.cumsum(sq[::-1])[::-1], [0.0]])  # tail[d] = sum_{i>=d}
    out = np.zeros(max_dim + 1)
    out[:max_dim] = tail[:max_dim] if len(tail) >= max_dim else np.pad(tail, (0, max_dim - len(tail)))
    return out


def ratio_rank(site: Site, ratio: float) -> int:
    """The rank that keeps ``ratio`` of a site's weight parameters (the references' rule).

    ``rank = floor(ratio * out * in / (out + in))``; ``ratio >= 1`` means dense (``max_dim``).
    """
    if ratio >= 1.0:
        return site.max_dim
    weight = site.dense_cost - site.fixed_cost
    return min(int(weight * ratio) // site.unit_cost, site.max_dim)


def uniform_ratio_dims(sites: list[Site], budget: int) -> dict[str, int]:
    """One parameter ratio for every site, the largest whose total cost fits ``budget``.

    Raises:
        GacError: when even rank ``min_dim`` everywhere exceeds the budget.
    """
    if not sites:
        return {}

    def dims_at(r: float) -> dict[str, int]:
        return {s.name: max(ratio_rank(s, r), s.min_dim) for s in sites}

    def cost(dims: dict[str, int]) -> int:
        return sum(s.cost(dims[s.name]) for s in sites)

    if cost(dims_at(1.0)) <= budget:
        return dims_at(1.0)
    if cost(dims_at(0.0)) > budget:
        raise GacError(
            f"budget of {budget:,} parameters cannot be met: rank {sites[0].min_dim} at every site "
            f"costs {cost(dims_at(0.0)):,}"
        )
    return dims_at(bisect_fraction(lambda r: cost(dims_at(r)) <= budget, fits_high=False))


# ----------------------------------------------------------------------------- plumbing
def linear_sites(model: nn.Module) -> tuple[list[Site], dict[str, str]]:
    """One low-rank site per decoder projection, and ``site name -> input-sharing group``.

    Uses the family adapter (roles q, k, v, o, gate, up, down); q/k/v share their input, and
    so do gate/up, which lets calibration keep one statistic per group. Models without an
    adapter fall back to every ``nn.Linear`` under ``model.model.layers`` (no sharing).
    """
    from gac.models.adapters import get_adapter

    pairs: list[tuple[str, str, dict[str, Any]]] = []
    try:
        ad = get_adapter(model)
    except GacError:
        ad = None
    if ad is not None:
        for i, role, fqn in ad.all_projections():
            group = {"q": "qkv", "k": "qkv", "v": "qkv", "gate": "gateup", "up": "gateup"}.get(role, role)
            pairs.append((fqn, f"{i}.{group}", {"layer": i, "role": role}))
    else:
        layers = getattr(getattr(model, "model", None), "layers", None)
        if layers is None:
            raise GacError(f"cannot find decoder layers in {type(model).__name__} (no model.model.layers)")
        for name, mod in model.named_modules():
            if name.startswith("model.layers.") and isinstance(mod, nn.Linear):
                pairs.append((name, name, {}))
    sites, groups = [], {}
    for fqn, group, meta in pairs:
        mod = model.get_submodule(fqn)
        if not isinstance(mod, nn.Linear):
            raise GacError(f"{fqn} is a {type(mod).__name__}, not a dense nn.Linear; compress the base model")
        site = lowrank_site(fqn, mod.out_features, mod.in_features, bias=mod.bias is not None)
        sites.append(dataclasses.replace(site, meta=meta))
        groups[fqn] = group
    if not sites:
        raise GacError(f"no linear projections found in {type(model).__name__}")
    return sites, groups


class LowRankCompressor(Compressor):
    """Common base: ``W·S = UΣVᵀ``, truncate, fold ``S⁻¹``. Subclasses define the scaling."""

    def __init__(self, svd_dtype: str | None = None) -> None:
        self.svd_dtype = svd_dtype
        self._groups: dict[str, str] = {}
        self._spectra: dict[str, torch.Tensor] = {}

    # -- protocol -----------------------------------------------------------------
    def sites(self, model: nn.Module) -> list[Site]:
        sites, self._groups = linear_sites(model)
        self._model = model
        self._all_sites = sites
        return sites

    def native_allocation(self, model: nn.Module, sites: list[Site], budget: int) -> dict[str, int]:
        """One uniform parameter ratio over all sites (the SVD and SVD-LLM papers' setting)."""
        return uniform_ratio_dims(sites, budget)

    def loss_curve(self, site: Site) -> np.ndarray | None:
        """Sum of the truncated squared singular values of ``W·S`` (0 at ``max_dim``)."""
        return tail_energy_curve(self._spectrum(site), site.max_dim) * self.loss_scale(site)

    def importance(self, site: Site) -> float:
        s = self._spectrum(site).double()
        return float((s**2).sum()) * self.loss_scale(site)

    def apply(self, model: nn.Module, sites: list[Site], dims: dict[str, int]) -> None:
        todo = []
        for site in sites:
            d = kept_dim(site, dims)
            if d < site.max_dim:
                todo.append((site, d))
        for site, d in track(todo, f"{self.name}: factorizing layers"):
            lin = model.get_submodule(site.name)
            if not isinstance(lin, nn.Linear):
                raise GacError(f"{site.name} is already factorized ({type(lin).__name__})")
            replace_module(model, site.name, self.factorize(site, lin, d))
            self._spectra.pop(site.name, None)
        self.release()

    def options(self) -> dict[str, Any]:
        return {"svd_dtype": self.svd_dtype}

    # -- hooks for subclasses -------------------------------------------------------
    def scaling(self, site: Site, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """The right scaling of ``site``: ``{}`` (identity), ``{"diag": s}`` or ``{"tril": L}``."""
        return {}

    def loss_scale(self, site: Site) -> float:
        """Factor applied to the spectral loss (e.g. 1/tokens to make it a per-token loss)."""
        return 1.0

    def release(self) -> None:
        """Free calibration statistics after ``apply``."""

    # -- helpers --------------------------------------------------------------------
    def _weight(self, lin: nn.Linear) -> torch.Tensor:
        dev = torch.device(self.exec_device) if self.exec_device else lin.weight.device
        return lin.weight.detach().to(device=dev, dtype=svd_dtype_for(dev, self.svd_dtype))

    def _scaled(self, site: Site, lin: nn.Linear) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        w = self._weight(lin)
        sc = self.scaling(site, w)
        if "diag" in sc:
            w = w * sc["diag"].to(w)[None, :]
        elif "tril" in sc:
            w = w @ sc["tril"].to(w)
        return w, sc

    def decompose(self, site: Site, lin: nn.Linear):
        """``(u, s, vh, scaling)`` of the scaled weight of ``site``."""
        w, sc = self._scaled(site, lin)
        u, s, vh = torch.linalg.svd(w, full_matrices=False)
        self._spectra[site.name] = s.detach().cpu()
        return u, s, vh, sc

    def factors(self, u, s, vh, sc: dict[str, torch.Tensor], d: int) -> tuple[torch.Tensor, torch.Tensor]:
        diag = sc.get("diag")
        tril = sc.get("tril")
        return truncated_factors(
            u,
            s,
            vh,
            d,
            scale_inv=None if diag is None else 1.0 / diag.to(vh),
            scale_tril=None if tril is None else tril.to(vh),
        )

    def factorize(self, site: Site, lin: nn.Linear, d: int) -> FactorizedLinear:
        u, s, vh, sc = self.decompose(site, lin)
        a, b = self.factors(u, s, vh, sc, d)
        w = lin.weight
        bias = None if lin.bias is None else lin.bias.detach()
        return FactorizedLinear.from_factors(a.to(w), b.to(w), bias)

    def _spectrum(self, site: Site) -> torch.Tensor:
        if site.name not in self._spectra:
            model = getattr(self, "_model", None)
            if model is None:
                raise GacError(f"{self.name}: call sites() and calibrate() before loss_curve()")
            w, _ = self._scaled(site, model.get_submodule(site.name))
            self._spectra[site.name] = torch.linalg.svdvals(w).detach().cpu()
        return self._spectra[site.name]
