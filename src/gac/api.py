"""The Python API: ``compress_(model, CompressConfig(...))`` shrinks a model in place.

The pipeline (each step a public function, so callers can reuse the expensive ones)::

    plan = gac.api.plan(model, config, tokenizer)    # sites -> calibration -> budget -> native allocation
    alloc = plan.allocation("gac")                   # re-select dims per align strategy (pure numpy)
    report = gac.api.apply_(model, plan, alloc)      # swap in factorized layers, report

``compress_`` runs the three in a row. :func:`plan` never modifies the model, so one plan
(one calibration) can serve several align strategies on deep copies of the model (``gac demo``).
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.allocation import (
    CANDIDATE_STEPS,
    DEFAULT_TOKENS,
    DEFAULT_WINDOW,
    KNAPSACK_STRATEGIES,
    OBJECTIVES,
    STRATEGIES,
    Allocation,
    allocate,
    check_window,
)
from gac.errors import GacError
from gac.hardware.profile import Profile, load_profile
from gac.sites import Site
from gac.utils import atomic_write_text, console, track

CONFIG_VERSION = 1


@dataclass
class CompressConfig:
    """How to compress (versioned; round-trips through :meth:`to_dict` / :meth:`from_dict`).

    Attributes:
        compressor: a registered compressor name (``svd``, ``asvd``, ``svd-llm``...).
        param_ratio: fraction of the targeted weights' parameters to keep, in (0, 1).
        align: ``none``, ``round``, ``knapsack`` (the unaligned control), ``gac`` or ``gac-latency``.
        profile: hardware profile spec (path, shipped id, ``default``; None: auto).
        calib: calibration text source (see :func:`gac.data.load_text`; its train split).
        calib_seed: 0 takes the first calibration windows, another value a seeded random choice.
        n_samples: calibration windows (None: 256 on GPU, 32 on CPU).
        seq_len: tokens per calibration window (None: 2048 on GPU, 256 on CPU).
        batch_size: calibration windows per forward pass.
        options: compressor options (passed to its constructor).
        latency_target: ``gac-latency``: predicted latency bound as a fraction of dense.
        quality_target: ``gac-latency``: loss bound (None: the native allocation's loss).
        tokens: rows per forward pass in the profile's latency model.
        candidates: ``gac``/``gac-latency`` candidate step: ``modulus`` (the profile's rule,
            finest aligned steps) or ``prefer`` (the modulus of best measured throughput).
        objective: the knapsack's value: ``paper`` (sensitivity x parameter change, the GAC
            paper's) or ``curve`` (the compressor's loss curve); see :mod:`gac.allocation.strategies`.
        window: how far the knapsack strategies may move a dim from the native one: whole
            modulus steps (default 1) or a fraction in (0, 1) of the native dim.
        max_gpu_memory: GiB the model may occupy on the GPU. A model whose parameters exceed it
            is calibrated and factorized one decoder layer at a time on the GPU (or the CPU when
            there is none) while it stays where it was loaded (compressors with
            ``supports_sequential``: ``svd``, ``svd-llm``).
    """

    compressor: str = "asvd"
    param_ratio: float = 0.85
    align: str = "gac"
    profile: str | None = None
    calib: str = "britannica"
    n_samples: int | None = None
    seq_len: int | None = None
    batch_size: int = 4
    options: dict[str, Any] = field(default_factory=dict)
    latency_target: float | None = None
    quality_target: float | None = None
    tokens: int = DEFAULT_TOKENS
    candidates: str = "modulus"
    objective: str = "paper"
    window: float = DEFAULT_WINDOW
    calib_seed: int = 0
    max_gpu_memory: float | None = None
    version: int = CONFIG_VERSION

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise :class:`GacError` on a bad value (ratio, align, sizes)."""
        r = self.param_ratio
        if not isinstance(r, (int, float)) or not math.isfinite(r) or not 0.0 < float(r) < 1.0:
            raise GacError(f"param ratio must lie strictly between 0 and 1 (the fraction kept), got {r}")
        if self.align not in STRATEGIES:
            raise GacError(f"unknown align strategy {self.align!r}; choose one of: {', '.join(STRATEGIES)}")
        for name in ("n_samples", "seq_len"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise GacError(f"{name.replace('_', '-')} must be positive, got {v}")
        if self.seq_len is not None and self.seq_len < 2:
            raise GacError(f"seq-len must be at least 2, got {self.seq_len}")
        if self.batch_size < 1:
            raise GacError(f"batch size must be positive, got {self.batch_size}")
        if self.tokens < 1:
            raise GacError(f"tokens must be positive, got {self.tokens}")
        if self.candidates not in CANDIDATE_STEPS:
            raise GacError(
                f"unknown candidate step {self.candidates!r}; choose one of: {', '.join(CANDIDATE_STEPS)}"
            )
        if self.objective not in OBJECTIVES:
            raise GacError(f"unknown objective {self.objective!r}; choose one of: {', '.join(OBJECTIVES)}")
        check_window(self.window)
        m = self.max_gpu_memory
        if m is not None and (not isinstance(m, (int, float)) or not math.isfinite(m) or m <= 0):
            raise GacError(f"max GPU memory must be a positive number of GiB, got {m}")
        if not isinstance(self.calib_seed, int) or self.calib_seed < 0:
            raise GacError(f"calibration seed must be a non-negative integer, got {self.calib_seed}")
        if self.version != CONFIG_VERSION:
            raise GacError(
                f"CompressConfig version {self.version} is not supported (this gac writes {CONFIG_VERSION})"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompressConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise GacError(f"unknown CompressConfig field(s): {', '.join(sorted(unknown))}")
        return cls(**d)


# ---------------------------------------------------------------------------------- plan
@dataclass
class Plan:
    """Everything :func:`apply_` needs, computed once: calibrated compressor, sites, budget, native dims."""

    config: CompressConfig
    compressor: Any
    sites: list[Site]
    native: dict[str, int]
    budget: int
    profile: Profile
    model_params: int
    calibration: dict[str, Any]
    timings: dict[str, float]
    _curves: dict[str, np.ndarray | None] | None = None
    _importance: dict[str, float] | None = None

    @property
    def targeted_dense(self) -> int:
        return sum(s.dense_cost for s in self.sites)

    def curves(self) -> dict[str, np.ndarray | None]:
        """The compressor's loss curve per site (computed once, with a progress bar)."""
        if self._curves is None:
            t0 = time.perf_counter()
            self._curves = {
                s.name: self.compressor.loss_curve(s)
                for s in track(self.sites, f"{self.compressor.name}: loss curves")
            }
            self._importance = {
                s.name: float(self.compressor.importance(s))
                for s in self.sites
                if self._curves[s.name] is None
            }
            self.timings["curves_s"] = time.perf_counter() - t0
        return self._curves

    def use_curves(self, curves: dict[str, np.ndarray | None]) -> None:
        """Supply precomputed loss curves (e.g. from known spectra) instead of the compressor's."""
        missing = [s.name for s in self.sites if s.name not in curves]
        if missing:
            raise GacError(f"no loss curve given for site {missing[0]}")
        self._curves = dict(curves)
        self._importance = {s.name: 1.0 for s in self.sites if curves[s.name] is None}

    def allocation(self, align: str | None = None, **kw: Any) -> Allocation:
        """Re-select the native dims with ``align`` (default: the config's)."""
        align = align or self.config.align
        curves = self.curves() if align in KNAPSACK_STRATEGIES else None
        opts = dict(
            tokens=self.config.tokens,
            candidates=self.config.candidates,
            objective=self.config.objective,
            window=self.config.window,
            latency_target=self.config.latency_target,
            quality_target=self.config.quality_target,
        )
        opts.update(kw)
        return allocate(
            align,
            self.sites,
            self.native,
            self.profile,
            curves=curves,
            importance=self._importance if curves is not None else None,
            **opts,
        )


def _profile_for(model: nn.Module, spec: str | None, profile: Profile | None) -> Profile:
    if profile is not None:
        return profile
    dt = next(model.parameters()).dtype
    name = {torch.float16: "float16", torch.bfloat16: "bfloat16"}.get(dt, "bfloat16")
    return load_profile(spec, dtype=name)


def _param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def plan(
    model: nn.Module,
    config: CompressConfig,
    tokenizer: Any | None = None,
    calib_batches: list[torch.Tensor] | None = None,
    profile: Profile | None = None,
) -> Plan:
    """Sites, calibration, budget and the compressor's native allocation (the model is unchanged).

    Args:
        model: a causal LM (Llama, Mistral, Qwen2, Qwen3 families).
        config: the compression config.
        tokenizer: used to build calibration batches from ``config.calib`` when ``calib_batches``
            is None and the compressor needs calibration.
        calib_batches: token-id batches ``[batch, seq]`` (overrides ``config.calib``).
        profile: the hardware profile (default: ``config.profile``, or auto).

    Raises:
        GacError: unknown compressor, no sites, missing calibration data, unmeetable budget.
    """
    from gac.compressors.base import get_compressor
    from gac.compressors.calibration import CalibrationConfig, calibration_data, model_device

    config.validate()
    timings: dict[str, float] = {}
    comp = get_compressor(config.compressor, **config.options)
    prof = _profile_for(model, config.profile, profile)
    sites = comp.sites(model)
    if config.max_gpu_memory is not None:
        need = sum(p.numel() * p.element_size() for p in model.parameters())
        if need > config.max_gpu_memory * 2**30:
            if not comp.supports_sequential:
                raise GacError(
                    f"{config.compressor}: the model ({need / 2**30:.2f} GiB) exceeds --max-gpu-memory "
                    f"{config.max_gpu_memory:g} GiB, and its calibration needs whole-model passes; "
                    "layer-by-layer compression supports svd and svd-llm"
                )
            comp.exec_device = "cuda" if torch.cuda.is_available() else "cpu"
            timings["sequential"] = 1.0
    if not sites:
        raise GacError(f"{config.compressor}: no compressible sites in {type(model).__name__}")
    dense = sum(s.dense_cost for s in sites)
    budget = int(math.floor(config.param_ratio * dense))
    floor_cost = sum(s.cost(s.min_dim) for s in sites)
    if floor_cost > budget:
        raise GacError(
            f"param ratio {config.param_ratio} cannot be met: even the smallest dims cost "
            f"{floor_cost:,} of {dense:,} parameters ({floor_cost / dense:.4f})"
        )
    calib_info: dict[str, Any] = {"used": False}
    t0 = time.perf_counter()
    if comp.needs_calibration:
        if calib_batches is None:
            if tokenizer is None:
                raise GacError(
                    f"compressor {config.compressor!r} needs calibration data: pass a tokenizer or calib_batches"
                )
            d = CalibrationConfig.default(model_device(model), source=config.calib)
            if config.seq_len is not None:
                from gac.data import check_seq_len

                check_seq_len(model, config.seq_len)
            cc = CalibrationConfig(
                source=config.calib,
                n_samples=config.n_samples or d.n_samples,
                seq_len=config.seq_len or d.seq_len,
                batch_size=config.batch_size,
                seed=config.calib_seed,
            )
            calib_batches, part = calibration_data(tokenizer, cc)
            calib_info = {
                "used": True,
                "source": cc.source,
                "n_samples": cc.n_samples,
                "seq_len": cc.seq_len,
                "seed": cc.seed,
                "text": part.describe(),
            }
        else:
            calib_batches = list(calib_batches)
            calib_info = {
                "used": True,
                "source": "batches",
                "n_samples": int(sum(b.shape[0] for b in calib_batches)),
                "seq_len": int(calib_batches[0].shape[-1]) if calib_batches else 0,
            }
        calib_info["tokens"] = int(sum(b.numel() for b in calib_batches))
        if calib_info["tokens"] == 0:
            raise GacError(f"compressor {config.compressor!r} needs calibration data; got no tokens")
        comp.calibrate(model, calib_batches)
    else:
        comp.calibrate(model, [])
    timings["calibrate_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    native = {k: int(v) for k, v in comp.native_allocation(model, sites, budget).items()}
    timings["native_s"] = time.perf_counter() - t0
    missing = [s.name for s in sites if s.name not in native]
    if missing:
        raise GacError(f"{config.compressor}: native allocation gave no dim for {missing[0]}")
    native_cost = sum(s.cost(native[s.name]) for s in sites)
    if native_cost > budget:
        raise GacError(
            f"{config.compressor}: native allocation costs {native_cost:,} > budget {budget:,} (compressor bug)"
        )
    return Plan(
        config=config,
        compressor=comp,
        sites=sites,
        native=native,
        budget=budget,
        profile=prof,
        model_params=_param_count(model),
        calibration=calib_info,
        timings=timings,
    )


# ------------------------------------------------------------------------------- report
@dataclass
class CompressionReport:
    """What a compression did (printed as a table, saved as JSON).

    Attributes:
        config: the :class:`CompressConfig` as a dict.
        compressor_options: the compressor's recorded options.
        allocation: the :class:`~gac.allocation.Allocation` as a dict (per-site dims before/after).
        budget: ``floor(param_ratio * targeted_dense)``, the compressor's budget.
        targeted_dense / targeted_after: parameters of the targeted weights before and after.
        model_params_before / model_params_after: parameters of the whole model.
        profile: id, label and whether measured.
        calibration: source, windows, tokens.
        timings: seconds per phase.
    """

    config: dict[str, Any]
    compressor_options: dict[str, Any]
    allocation: dict[str, Any]
    budget: int
    targeted_dense: int
    targeted_after: int
    model_params_before: int
    model_params_after: int
    profile: dict[str, Any]
    calibration: dict[str, Any]
    timings: dict[str, float]
    schema: str = "gac.compress_report/1"

    @property
    def targeted_ratio(self) -> float:
        return self.targeted_after / self.targeted_dense

    @property
    def model_ratio(self) -> float:
        return self.model_params_after / self.model_params_before

    @property
    def pct_aligned(self) -> float:
        return float(self.allocation["pct_aligned"])

    @property
    def predicted_speedup(self) -> float:
        return float(self.allocation["predicted_speedup"])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["targeted_ratio"] = self.targeted_ratio
        d["model_ratio"] = self.model_ratio
        return d

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1, default=_json_default))
        return path

    def summary_rows(self) -> list[tuple[str, str]]:
        a = self.allocation
        # PaLU's budget is the KV cache (latent dims per token), not parameters
        kv = "budget_unit" in self.compressor_options
        targeted = "targeted KV latent dims" if kv else "targeted params"
        budget = "KV-ratio budget" if kv else "param-ratio budget"
        return [
            ("compressor", f"{self.config['compressor']} (align {a['strategy']})"),
            ("profile", f"{self.profile['id']}{'' if self.profile['measured'] else ' (NOT measured)'}"),
            ("sites", f"{len(a['sites'])} ({sum(not s['dense'] for s in a['sites'])} compressed)"),
            (
                "aligned (compressed sites)",
                f"{a['pct_aligned']:.1f}% (native {a['pct_aligned_native']:.1f}%)",
            ),
            (
                targeted,
                f"{self.targeted_after:,} / {self.targeted_dense:,} = {self.targeted_ratio:.4f}",
            ),
            ("budget (native total)", f"{a['cost']:,} of {a['budget']:,} = {a['budget_use']:.6f}"),
            (budget, f"{self.budget:,} ({self.config['param_ratio']})"),
            (
                "whole model params",
                f"{self.model_params_after:,} / {self.model_params_before:,} = {self.model_ratio:.4f}",
            ),
            (
                "predicted speedup (sites)",
                f"{a['predicted_speedup']:.3f}x vs dense, {a['predicted_speedup_vs_native']:.3f}x vs native"
                f" @ {a['tokens']} tokens",
            ),
        ]

    def print(self, per_site: bool = True, max_rows: int | None = None, to: Any = None) -> None:
        """Print the per-site table (dims before/after) and the summary (to stderr, or ``to``)."""
        from rich.table import Table

        con = to if to is not None else console

        if per_site:
            t = Table(title="per-site dims", show_lines=False)
            for col in ("site", "shape", "max", "native", "chosen", "aligned", "params"):
                t.add_column(col, justify="right" if col not in ("site", "aligned") else "left")
            rows = self.allocation["sites"]
            for s in rows if max_rows is None else rows[:max_rows]:
                ok = "dense" if s["dense"] else ("yes" if s["aligned"] else "[red]no[/red]")
                t.add_row(
                    s["name"],
                    "x".join(map(str, s["shape"])),
                    str(s["max_dim"]),
                    str(s["native"]),
                    str(s["dim"]),
                    ok,
                    f"{s['cost']:,}",
                )
            if max_rows is not None and len(rows) > max_rows:
                t.add_row(f"... {len(rows) - max_rows} more", "", "", "", "", "", "")
            con.print(t)
        t = Table(title="compression report")
        t.add_column("")
        t.add_column("")
        for k, v in self.summary_rows():
            t.add_row(k, v)
        con.print(t)
        for n in self.allocation.get("notes", []):
            con.print(f"note: {n}")


def _stderr_console() -> Any:

    return console


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


# -------------------------------------------------------------------------------- apply
def _fork(compressor: Any) -> Any:
    """A copy of a calibrated compressor whose containers are copied (tensors shared).

    ``apply`` may free statistics (``release``) or pop caches; forking first lets one plan
    serve several align strategies.
    """
    c = copy.copy(compressor)
    for k, v in vars(compressor).items():
        if isinstance(v, (dict, list, set)):
            setattr(c, k, copy.copy(v))
    return c


def apply_(model: nn.Module, plan: Plan, allocation: Allocation | None = None) -> CompressionReport:
    """Shrink ``model`` in place to ``allocation`` (default: ``plan.allocation()``).

    ``model`` may be ``plan``'s model or a deep copy of it (site names are the same).
    """
    t0 = time.perf_counter()
    if allocation is None:
        allocation = plan.allocation()
    alloc_s = time.perf_counter() - t0
    comp = _fork(plan.compressor)
    t0 = time.perf_counter()
    comp.apply(model, plan.sites, allocation.dims)
    apply_s = time.perf_counter() - t0
    cfg = plan.config.to_dict()
    cfg["align"] = allocation.strategy
    return CompressionReport(
        config=cfg,
        compressor_options=dict(comp.options()),
        allocation=allocation.to_dict(),
        budget=plan.budget,
        targeted_dense=plan.targeted_dense,
        targeted_after=allocation.cost,
        model_params_before=plan.model_params,
        model_params_after=_param_count(model),
        profile={"id": plan.profile.id, "label": plan.profile.label, "measured": plan.profile.measured},
        calibration=dict(plan.calibration),
        timings={**plan.timings, "allocate_s": allocation.solve_s + alloc_s, "apply_s": apply_s},
    )


def compress_(
    model: nn.Module,
    config: CompressConfig,
    tokenizer: Any | None = None,
    calib_batches: list[torch.Tensor] | None = None,
    profile: Profile | None = None,
) -> CompressionReport:
    """Compress ``model`` in place: sites -> calibrate -> budget -> native allocation -> align -> apply.

    Args:
        model: a Hugging Face causal LM.
        config: what to do (:class:`CompressConfig`).
        tokenizer: builds calibration batches from ``config.calib`` when needed.
        calib_batches: explicit calibration token batches.
        profile: the hardware profile (default: from ``config.profile`` or auto).

    Returns:
        The :class:`CompressionReport` (per-site dims, alignment, params, predicted speedup).
    """
    p = plan(model, config, tokenizer=tokenizer, calib_batches=calib_batches, profile=profile)
    return apply_(model, p, p.allocation())


def gac_config_for_save(report: CompressionReport, source: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``gac_config.json`` content of a compressed model (see :func:`gac.io.save`)."""
    a = report.allocation
    src = source or {}
    return {
        "compressor": report.config["compressor"],
        "param_ratio": report.config["param_ratio"],
        "align": a["strategy"],
        "compress_config": report.config,
        "compressor_options": report.compressor_options,
        "profile_id": report.profile["id"],
        "base_model": {"id": src.get("id"), "revision": src.get("revision"), "kind": src.get("kind")},
        "sites": [
            {"name": s["name"], "native": s["native"], "dim": s["dim"], "max_dim": s["max_dim"]}
            for s in a["sites"]
        ],
        "calibration": report.calibration,
        "targeted_ratio": report.targeted_ratio,
        "model_ratio": report.model_ratio,
        "pct_aligned": a["pct_aligned"],
        "predicted_speedup": a["predicted_speedup"],
    }
