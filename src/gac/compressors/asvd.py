"""``asvd`` (Yuan et al. 2023, "ASVD: activation-aware singular value decomposition").

Scaling: ``S = diag(mean|x|^α)`` per input channel (``α = 0.5``), accumulated over the calibration
tokens. The SVD is taken of ``W·S``, truncated to rank ``d`` and ``S⁻¹`` is folded into the right
factor: ``W' = (U_d Σ_d^{1/2}) (Σ_d^{1/2} V_dᵀ S⁻¹)``; at full rank ``W' = W`` exactly.

Native allocation (the paper's sensitivity-based truncation-rank search):

1. For every projection alone, truncate it at each probe parameter ratio (0.4 ... 0.9 by
   default, the reference code's current ``param_ratio_candidates``; the paper's 0.1 ... 0.9 is
   :data:`PAPER_PROBE_RATIOS`) and measure the perplexity on the calibration windows (the rest of
   the model dense), as the reference does on all of its calibration windows.
2. Sort all ``(projection, ratio, ppl)`` probes by perplexity and binary-search the loosest
   global perplexity threshold for which "every projection takes the smallest probed ratio whose
   perplexity is under the threshold (dense if none)" meets the parameter budget.

The probes re-run only the decoder layers from the probed one onward, from cached layer inputs
(checked once against a full forward; a full forward is used when the check fails).

Loss curve (``curve="sensitivity"``, the default): the calibration-perplexity increase of the site
alone, ``ppl(d) − ppl(dense)``. Single-site probes are noisy (a probe can land below the dense
perplexity, or above a deeper cut), so the points are *smoothed*, not clamped one by one: an
isotonic (non-increasing in ``d``) least-squares fit through them and ``(max_dim, 0)`` pools
disagreeing neighbours into their mean, and only then is the fit floored at 0. The curve is linear
between the fitted points and extrapolated below the smallest probe with the first segment's
slope. It is the same measurement the paper's allocation ranks. ``curve="spectrum"`` exposes the truncated ``σ²`` of ``W·S``
instead (cheaper: no probes, but not comparable across layers of different scale).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.compressors.base import register_compressor
from gac.compressors.calibration import LinearStats, collect_stats, model_device
from gac.compressors.lowrank import LowRankCompressor, ratio_rank, tail_energy_curve
from gac.data import nll_from_logits
from gac.errors import GacError
from gac.models.adapters import get_adapter
from gac.nn import FactorizedLinear, replace_module
from gac.sites import Site
from gac.utils import console, track

log = logging.getLogger(__name__)

#: The ASVD paper's probe ratios.
PAPER_PROBE_RATIOS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
#: The reference code's current probe ratios (``param_ratio_candidates`` of hahnyuan/ASVD4LLM's
#: ``sensitivity.py``): the default.
REFERENCE_PROBE_RATIOS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


# ----------------------------------------------------------------------------- math
def asvd_scale(abs_mean: torch.Tensor, alpha: float = 0.5, eps: float = 1e-6) -> torch.Tensor:
    """``diag(S) = max(mean|x|, eps)^α`` (the floor avoids dividing by a dead channel)."""
    return abs_mean.to(torch.float64).clamp_min(eps) ** alpha


def threshold_allocation(
    sites: Sequence[Site], sensitivity: dict[str, dict[float, float]], budget: int
) -> dict[str, int]:
    """The paper's binary search over a global perplexity threshold.

    Each site takes the smallest probed ratio whose perplexity is <= the threshold (dense when
    none is); the loosest threshold (fewest compressed sites) that fits ``budget`` wins.

    Raises:
        GacError: when even every site at its smallest probed ratio exceeds the budget.
    """
    by_name = {s.name: s for s in sites}
    entries = sorted(
        (ppl, name, r) for name, probes in sensitivity.items() if name in by_name for r, ppl in probes.items()
    )

    def dims(k: int) -> dict[str, int]:
        ratio = {s.name: 1.0 for s in sites}
        for _, name, r in entries[:k]:
            ratio[name] = min(ratio[name], r)
        return {s.name: max(ratio_rank(s, ratio[s.name]), s.min_dim) for s in sites}

    def cost(k: int) -> int:
        return sum(s.cost(d) for s, d in zip(sites, dims(k).values(), strict=True))

    if cost(0) <= budget:
        return dims(0)
    if cost(len(entries)) > budget:
        raise GacError(
            f"budget of {budget:,} parameters cannot be met by ASVD's probed ratios: the smallest "
            f"costs {cost(len(entries)):,}; add smaller probe ratios or raise the ratio"
        )
    lo, hi = 0, len(entries)  # cost(lo) > budget >= cost(hi); cost is non-increasing in k
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if cost(mid) <= budget:
            hi = mid
        else:
            lo = mid
    return dims(hi)


def isotonic_decreasing(y: np.ndarray) -> np.ndarray:
    """Least-squares non-increasing fit of ``y`` (pool-adjacent-violators, equal weights).

    >>> isotonic_decreasing(np.array([3.0, 1.0, 2.0, 0.0])).tolist()
    [3.0, 1.5, 1.5, 0.0]
    """
    blocks: list[list[float]] = []  # [sum, count]
    for v in np.asarray(y, dtype=float):
        blocks.append([v, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] < blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    return np.concatenate([np.full(int(c), s / c) for s, c in blocks])


def sensitivity_curve(site: Site, probes: dict[float, float], base_ppl: float) -> np.ndarray:
    """Calibration-ppl increase as a function of the kept rank ``d`` (see the module docstring)."""
    pts: dict[int, list[float]] = {}
    for r, ppl in probes.items():
        d = ratio_rank(site, r)
        if d < site.max_dim:
            pts.setdefault(d, []).append(ppl - base_ppl if math.isfinite(ppl) else 1e6)
    xs = np.array(sorted(pts) + [site.max_dim], dtype=float)
    raw = np.array([float(np.mean(pts[int(x)])) for x in xs[:-1]] + [0.0])
    ys = np.maximum(isotonic_decreasing(raw), 0.0)
    ys[-1] = 0.0
    grid = np.arange(site.max_dim + 1, dtype=float)
    out = np.interp(grid, xs, ys)
    if len(xs) >= 2:
        slope = (ys[1] - ys[0]) / (xs[1] - xs[0])
        below = grid < xs[0]
        out[below] = ys[0] + slope * (grid[below] - xs[0])
    out[site.max_dim] = 0.0
    return out


# ----------------------------------------------------------------------------- probing
class SuffixRunner:
    """Calibration NLL of a model, re-running only the decoder layers from ``start`` on.

    One clean forward caches the input (and keyword arguments) of every decoder layer for each
    batch; a probe of layer ``i`` then runs layers ``i..`` + final norm + LM head. The shortcut is
    verified once against the full forward and disabled if it disagrees.
    """

    def __init__(self, model: nn.Module, batches: Sequence[torch.Tensor]) -> None:
        self.model = model
        self.batches = list(batches)
        self.dev = model_device(model)
        self.layers: list[nn.Module] | None = None
        self.cache: list[list[tuple[torch.Tensor, dict[str, Any]]]] = []
        try:
            ad = get_adapter(model)
            layers = ad.layers
            norm = model.get_submodule(ad.final_norm_fqn)
            head = model.get_submodule(ad.lm_head_fqn)
        except (GacError, AttributeError):
            layers = None
        if layers is None:
            self.base_nll = self._full()
            return
        self.cache = [[] for _ in layers]
        handles = []

        def make(i: int):
            def pre(_mod, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
                self.cache[i].append((hidden, kw, args[1:]))

            return pre

        for i, layer in enumerate(layers):
            handles.append(layer.register_forward_pre_hook(make(i), with_kwargs=True))
        try:
            self.base_nll = self._full()
        finally:
            for h in handles:
                h.remove()
        self.layers, self.norm, self.head = layers, norm, head
        check = self.nll(0)
        if not math.isclose(check, self.base_nll, rel_tol=1e-4, abs_tol=1e-6):
            log.info("asvd: layer-suffix probing disagrees with a full forward; using full forwards")
            self.layers, self.cache = None, []

    @torch.no_grad()
    def _full(self) -> float:
        nll, count = 0.0, 0
        for b in self.batches:
            s, c = nll_from_logits(self.model(input_ids=b.to(self.dev), use_cache=False).logits, b)
            nll, count = nll + s, count + c
        return nll / count

    @torch.no_grad()
    def nll(self, start: int | None) -> float:
        """Mean calibration NLL with the current weights, when only layers ``start..`` changed."""
        if self.layers is None or start is None:
            return self._full()
        nll, count = 0.0, 0
        for bi, b in enumerate(self.batches):
            h = self.cache[start][bi][0]
            for j in range(start, len(self.layers)):
                _, kw, rest = self.cache[j][bi]
                out = self.layers[j](h, *rest, **kw)
                h = out[0] if isinstance(out, tuple) else out
            s, c = nll_from_logits(self.head(self.norm(h)), b)
            nll, count = nll + s, count + c
        return nll / count


# ----------------------------------------------------------------------------- compressor
@register_compressor("asvd")
class AsvdCompressor(LowRankCompressor):
    """Activation-aware SVD with the paper's sensitivity-based rank allocation.

    Args:
        alpha: exponent of the activation scaling (0.5 in the paper).
        probe_ratios: parameter ratios probed per projection for the sensitivity.
        sensitivity_samples: calibration windows used for the probes (None: all of them).
        curve: ``sensitivity`` (default) or ``spectrum`` (see the module docstring).
        svd_dtype: ``float32`` or ``float64`` (default: float64 on CPU, float32 on GPU).
    """

    def __init__(
        self,
        alpha: float = 0.5,
        probe_ratios: Sequence[float] = REFERENCE_PROBE_RATIOS,
        sensitivity_samples: int | None = None,
        curve: str = "sensitivity",
        svd_dtype: str | None = None,
    ) -> None:
        super().__init__(svd_dtype)
        if not 0 < alpha <= 1:
            raise GacError(f"asvd alpha must be in (0, 1], got {alpha}")
        ratios = tuple(sorted(float(r) for r in probe_ratios))
        if not ratios or any(not 0 < r < 1 for r in ratios):
            raise GacError(f"asvd probe ratios must lie in (0, 1), got {list(probe_ratios)}")
        if curve not in ("sensitivity", "spectrum"):
            raise GacError(f"asvd curve must be 'sensitivity' or 'spectrum', got {curve!r}")
        self.alpha = alpha
        self.probe_ratios = ratios
        self.sensitivity_samples = sensitivity_samples
        self.curve = curve
        self._stats: dict[str, LinearStats] = {}
        self._probe_batches: list[torch.Tensor] = []
        self._sens: dict[str, dict[float, float]] | None = None
        self._base_ppl: float | None = None

    def calibrate(self, model: nn.Module, batches: Iterable[torch.Tensor]) -> None:
        """Accumulate ``mean|x|`` per input channel; keep the token ids for the probes."""
        self._model = model
        if not self._groups:
            self.sites(model)
        batches = list(batches)
        leaders: dict[str, str] = {}
        for name, group in self._groups.items():
            leaders.setdefault(group, name)
        mods = {g: model.get_submodule(n) for g, n in leaders.items()}
        self._stats = collect_stats(model, mods, batches, gram=False, description="asvd: calibration")
        rows = torch.cat([b.cpu() for b in batches])
        if self.sensitivity_samples is not None:
            rows = rows[: self.sensitivity_samples]
        self._probe_batches = list(rows.split(max(batches[0].shape[0], 1)))
        self._sens = None
        self._spectra.clear()

    def scaling(self, site: Site, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        group = self._groups.get(site.name)
        if group is None or group not in self._stats:
            raise GacError(f"asvd: no calibration statistics for {site.name}; call calibrate() first")
        return {"diag": asvd_scale(self._stats[group].abs_mean, self.alpha).to(weight.device)}

    # -- sensitivity ------------------------------------------------------------------
    def sensitivity(self, model: nn.Module, sites: Sequence[Site]) -> dict[str, dict[float, float]]:
        """``site -> {ratio: calibration ppl}`` with only that site truncated (cached)."""
        if self._sens is not None and all(s.name in self._sens for s in sites):
            return self._sens
        if not self._probe_batches:
            raise GacError("asvd: call calibrate() before the sensitivity-based allocation")
        t0 = time.perf_counter()
        runner = SuffixRunner(model, self._probe_batches)
        full_s = time.perf_counter() - t0  # one full forward over the probe windows
        self._base_ppl = math.exp(runner.base_nll)
        sens: dict[str, dict[float, float]] = {}
        n_sites, n_r, n_w = len(sites), len(self.probe_ratios), len(self._probe_batches)
        est_s = full_s * n_sites * n_r / 2  # a probe re-runs the layers from its site on: half on average
        if est_s > 120:
            console.print(
                f"[yellow]asvd sensitivity: about {est_s / 60:.0f} min at this machine's speed[/yellow] "
                f"({n_sites * n_r:,} probes); fewer probe windows (now {n_w}) or probe ratios make it "
                "shorter: options sensitivity_samples and probe_ratios (gac compress: -O KEY=VALUE; "
                "gac demo: --probe-samples, --probe-ratios)"
            )
        desc = (
            f"asvd sensitivity: {n_sites:,} sites x {n_r} ratios = {n_sites * n_r:,} probes "
            f"of {n_w} calibration window(s)"
        )
        for site in track(list(sites), desc):
            lin = model.get_submodule(site.name)
            u, s, vh, sc = self.decompose(site, lin)
            probes: dict[float, float] = {}
            for r in self.probe_ratios:
                d = ratio_rank(site, r)
                if d >= site.max_dim or d < site.min_dim:
                    continue
                a, b = self.factors(u, s, vh, sc, d)
                w = lin.weight
                bias = None if lin.bias is None else lin.bias.detach()
                replace_module(
                    model, site.name, FactorizedLinear.from_factors(a.to(w.dtype), b.to(w.dtype), bias)
                )
                try:
                    nll = runner.nll(site.meta.get("layer"))
                finally:
                    replace_module(model, site.name, lin)
                probes[r] = math.exp(nll) if math.isfinite(nll) else float("inf")
            sens[site.name] = probes
        self._sens = sens
        return sens

    def native_allocation(self, model: nn.Module, sites: list[Site], budget: int) -> dict[str, int]:
        """The paper's sensitivity-based allocation (binary search over a ppl threshold)."""
        return threshold_allocation(sites, self.sensitivity(model, sites), budget)

    def loss_curve(self, site: Site) -> np.ndarray | None:
        if self.curve == "spectrum":
            return tail_energy_curve(self._spectrum(site), site.max_dim)
        sens = self._sens
        if sens is None or site.name not in sens:
            sens = self.sensitivity(self._model, getattr(self, "_all_sites", None) or [site])
        return sensitivity_curve(site, sens[site.name], self._base_ppl or 0.0)

    def importance(self, site: Site) -> float:
        if self._sens is None or site.name not in self._sens or self._base_ppl is None:
            return super().importance(site)
        probes = self._sens[site.name]
        return float(np.mean([max(p - self._base_ppl, 0.0) for p in probes.values()])) if probes else 0.0

    def release(self) -> None:
        self._stats.clear()
        self._probe_batches = []

    def options(self) -> dict[str, Any]:
        return {
            **super().options(),
            "alpha": self.alpha,
            "probe_ratios": list(self.probe_ratios),
            "sensitivity_samples": self.sensitivity_samples,
            "curve": self.curve,
            "base_calibration_ppl": self._base_ppl,
        }
