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
import dataclasses
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
    check_margin,
    check_window,
    resolve_margin,
)
from gac.allocation.strategies import GuardInfeasible
from gac.errors import GacError
from gac.hardware.latency import (
    DEFAULT_SERVE,
    GROUPED_APART,
    Point,
    check_context,
    latent_site_pricing,
    parse_serve,
    serve_str,
)
from gac.hardware.profile import Profile, load_profile
from gac.sites import Site
from gac.utils import atomic_write_text, console, track

CONFIG_VERSION = 1
#: the windows (fractions of the native dim) the latency guard widens its candidates to, in turn,
#: when the configured window cannot meet every serving shape: compressing fewer sites deeper while
#: the rest stay dense (docs/allocation.md). Empty by default: on SmolLM2 (LLM-Pruner 10%, H200
#: profile) the widened guard met every shape at 1.84x knapsack's perplexity; a refusal that names the
#: budgets that can be met, and ``--window 0.25`` for users who accept that trade, say more.
GUARD_WINDOWS: tuple[float, ...] = ()
#: what :func:`compress_` may run after compressing (``CompressConfig.recover``)
RECOVERIES = ("none", "lora")


def _window_span(w: float) -> float:
    """How far a window reaches, comparable across kinds: steps (>= 1) reach less than fractions."""
    return w if w < 1 else w * 1e-3


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
        serve: the shapes the model will serve (``prefill:BxS`` and ``decode:B[xKV]``, comma-separated;
            :func:`gac.hardware.latency.parse_serve`), kept in its canonical spelling; None: the default
            grid (:data:`gac.hardware.latency.DEFAULT_SERVE`) less any shape beyond the model's context,
            while a given shape beyond it is refused. ``gac`` never
            picks an allocation the profile's latency model predicts slower than dense at any of them
            (the latency guard; docs/allocation.md).
        allow_slower: ``gac`` without the latency guard: the least loss at the budget, with the
            shapes where it is predicted slower than dense named.
        guard_margin: the guard's safety margin, in ``[0, 1)``: an allocation must be predicted at least
            ``1 + guard_margin`` x dense at every serving shape. None (the default): the latency model's
            worst optimistic error measured on the profile's GPU (its ``latency_fit.guard_margin``),
            else :data:`gac.allocation.DEFAULT_GUARD_MARGIN`.
        recover: ``none`` or ``lora``: after compressing, a short LoRA fine-tune on the calibration
            text, merged back (:func:`gac.recovery.recover_lora_`; needs peft).
        recover_steps / recover_rank / recover_lr: the LoRA recovery's optimizer steps, adapter
            rank and learning rate.
        verify: after compressing (GPU), time dense and compressed at the serving shapes on the
            default inference path (:func:`verify_serving`); recorded as the report's ``verify``.
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
    serve: str | None = None
    allow_slower: bool = False
    guard_margin: float | None = None
    recover: str = "none"
    recover_steps: int = 20
    recover_rank: int = 8
    recover_lr: float = 1e-4
    verify: bool = False
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
        if self.serve is not None:
            self.serve = serve_str(parse_serve(self.serve))
        if self.guard_margin is not None:
            self.guard_margin = check_margin(self.guard_margin)
        if self.allow_slower and self.align != "gac":
            raise GacError(
                f"--allow-slower lifts the latency guard of --align gac; --align {self.align} has no guard to lift"
            )
        if self.recover not in RECOVERIES:
            raise GacError(f"unknown recovery {self.recover!r}; choose none or lora")
        if self.recover == "lora":
            import importlib.util

            if importlib.util.find_spec("peft") is None:
                raise GacError("--recover lora needs peft: pip install 'gac[recover]' (or pip install peft)")
            if self.recover_steps < 1 or self.recover_rank < 1 or not self.recover_lr > 0:
                raise GacError("--recover-steps and --recover-rank must be >= 1 and --recover-lr > 0")
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
    #: per serving shape key: predicted ms of the dense model outside the sites
    other_ms: dict[str, float] | None = None
    #: the model the plan was made on (the budget search re-runs the native allocation on it)
    model: Any = field(default=None, repr=False)

    #: the last refusal's budget search: ``smaller`` and ``deeper`` feasible ratios (None: not found)
    searched: dict[str, float | None] | None = None
    #: the serving shapes the guard and the predictions use (see :func:`serving_shapes`)
    serve: list[Point] = field(default_factory=list)

    @property
    def guard_off(self) -> str | None:
        """Why the latency guard cannot run (None when it can)."""
        if not self.profile.measured:
            return f"profile {self.profile.id} is not measured (gac profile measures this GPU)"
        return None

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
        """Re-select the native dims with ``align`` (default: the config's).

        ``gac`` runs the latency guard at the config's serving shapes (unless ``allow_slower``, or
        the profile is not measured: then said in the notes and recorded in ``guard``). A budget
        the guard cannot meet raises a one-line :class:`GacError` naming the shapes and the largest
        reduction that meets them all (:meth:`largest_guarded_ratio`), before any factorization;
        ``explain=False`` skips that search (the :class:`GuardInfeasible` names only the shapes).
        """
        align = align or self.config.align
        allow = bool(kw.pop("allow_slower", self.config.allow_slower)) and align == "gac"
        explain = bool(kw.pop("explain", True))
        off = self.guard_off
        try:
            rec = self._guarded(align, self.native, None, allow or off is not None, **kw)
        except GuardInfeasible as e:
            if not explain:
                raise
            raise GacError(self._infeasible_line(e)) from None
        if rec.guard is not None:
            rec.guard["allow_slower"] = allow
            if off is not None and align == "gac" and not allow:
                rec.guard["off"] = off
                rec.notes.append(f"latency guard off: {off}")
            _note_latent_pricing(rec, self.profile, self.sites, self.serve)
        return rec

    def _guarded(
        self, align: str, native: dict[str, int], budget: int | None, allow_slower: bool, **kw: Any
    ) -> Allocation:
        """:meth:`_allocate`; where the guard cannot meet every shape inside the configured window,
        again with the wider windows of :data:`GUARD_WINDOWS` (said in the notes, recorded as
        ``guard["window"]``) before giving up."""
        guarded = align == "gac" and not allow_slower and "window" not in kw
        try:
            return self._allocate(align, native, budget, allow_slower, **kw)
        except GuardInfeasible as e:
            w0 = self.config.window
            wider = [w for w in GUARD_WINDOWS if _window_span(w) > _window_span(w0)]
            if not guarded or not wider:
                raise
            err = e
        for w in wider:
            try:
                rec = self._allocate(align, native, budget, False, window=w, **kw)
            except GuardInfeasible as e:
                err = e
                continue
            except GacError:  # this window holds no candidates that meet the budget (tiny dims)
                continue
            rec.guard["window"] = w
            rec.notes.append(
                f"latency guard: candidates widened to ±{100 * w:.0f}% of the native dims (the window of "
                f"{w0:g} cannot meet every serving shape)"
            )
            return rec
        raise err

    def _allocate(
        self, align: str, native: dict[str, int], budget: int | None, allow_slower: bool, **kw: Any
    ) -> Allocation:
        curves = self.curves() if align in KNAPSACK_STRATEGIES else None
        opts = dict(
            tokens=self.config.tokens,
            candidates=self.config.candidates,
            objective=self.config.objective,
            window=self.config.window,
            latency_target=self.config.latency_target,
            quality_target=self.config.quality_target,
            serve=self.serve,
            other_ms=self.other_ms,
            guard_margin=self.config.guard_margin,
        )
        opts.update(kw)
        return allocate(
            align,
            self.sites,
            native,
            self.profile,
            curves=curves,
            importance=self._importance if curves is not None else None,
            budget=budget,
            allow_slower=allow_slower,
            **opts,
        )

    def at(self, ratio: float | None = None, serve: str | None = None) -> Plan:
        """This plan at another ``param_ratio`` (the compressor's native allocation at that budget)
        and/or other serving shapes, sharing the calibration and the loss curves."""
        cfg = copy.copy(self.config)
        if ratio is not None:
            cfg.param_ratio = float(ratio)
        if serve is not None:
            cfg.serve = serve
        cfg.validate()
        budget, native = self.budget, self.native
        if ratio is not None:
            budget = int(math.floor(cfg.param_ratio * self.targeted_dense))
            if budget < sum(s.cost(s.min_dim) for s in self.sites):
                raise GacError(
                    f"param ratio {cfg.param_ratio:g} cannot be met: even the smallest dims cost more"
                )
            got = self.compressor.native_allocation(self.model, self.sites, budget)
            native = {k: int(v) for k, v in got.items()}
        pts, other = self.serve, self.other_ms
        if serve is not None:
            pts, _ = serving_shapes(serve, self.model)
            other = outside_sites_ms(self.model, self.sites, self.profile, pts)
        self.curves()
        return dataclasses.replace(self, config=cfg, budget=budget, native=native, serve=pts, other_ms=other)

    def guard_feasible(self, ratio: float, **kw: Any) -> bool:
        """Whether guarded ``gac`` meets every serving shape at ``param_ratio`` ``ratio``
        (the compressor's native allocation at that budget, re-selected)."""
        if ratio >= 1.0:
            return True
        try:
            q = self.at(ratio)
        except GacError:
            return False
        kw.setdefault("max_states", 5_000)  # a yes/no answer: coarser DP costs (the budget bound stays exact)
        # the widest window's candidates hold every narrower one's (unless the dims are so small that
        # a fraction of them holds no aligned dim: then the configured window's are tried too)
        widest = max((*GUARD_WINDOWS, self.config.window), key=_window_span)
        for w in dict.fromkeys((kw.pop("window", widest), self.config.window)):
            try:
                q._allocate("gac", q.native, q.budget, False, window=w, **kw)
            except GuardInfeasible:
                return False
            except GacError:
                continue
            return True
        return False

    def largest_guarded_ratio(self, step: float = 0.01, **kw: Any) -> float:
        """The smallest ``param_ratio`` above the config's (the largest reduction below the one asked)
        at which guarded ``gac`` meets every serving shape; 1.0 when none does.

        Feasibility is not monotone in the ratio (a smaller reduction leaves factorized sites nearer
        their break-even rank, where the second launch outweighs the bytes saved), so the ratios are
        scanned upwards in steps of ``step`` and the first feasible one is refined by bisection.
        """
        r = self._scan(float(self.config.param_ratio), step, 1.0, **kw)
        return 1.0 if r is None else r

    def deeper_guarded_ratio(self, step: float = 0.025, floor: float = 0.4, **kw: Any) -> float | None:
        """The largest ``param_ratio`` below the config's (down to ``floor``) at which guarded ``gac``
        meets every serving shape: a deeper factorization whose saved bytes pay for the second
        launch. None when none does."""
        return self._scan(float(self.config.param_ratio), -step, floor, **kw)

    def _scan(self, r0: float, step: float, end: float, **kw: Any) -> float | None:
        prev, hit = r0, None
        for k in range(1, int(math.ceil(abs(end - r0) / abs(step) - 1e-9))):
            r = r0 + k * step
            if self.guard_feasible(r, **kw):
                hit = r
                break
            prev = r
        if hit is None:
            return None
        bad, good = prev, hit
        while abs(good - bad) > 0.000625:
            mid = (bad + good) / 2
            if self.guard_feasible(mid, **kw):
                good = mid
            else:
                bad = mid
        shown = (math.ceil(good * 1000 - 1e-9) if step > 0 else math.floor(good * 1000 + 1e-9)) / 1000
        return shown if self.guard_feasible(shown, **kw) else good

    def _infeasible_line(self, e: GuardInfeasible) -> str:
        r = self.config.param_ratio
        best = self.largest_guarded_ratio() if self.model is not None else None
        if best is None:
            where = ""
        elif best >= 1.0:
            where = "; no smaller reduction meets them all"
        else:
            where = (
                f"; the largest smaller reduction that meets them all is {100 * (1 - best):.1f}% "
                f"(--param-ratio {best:.3f})"
            )
        deeper = self.deeper_guarded_ratio() if self.model is not None else None
        self.searched = {"smaller": best, "deeper": deeper}
        if deeper is not None:
            where += f"; a deeper one does: {100 * (1 - deeper):.1f}% (--param-ratio {deeper:.3f})"
        shapes = ", ".join(f"{k} ({v:.4f}x)" for k, v in e.shapes.items())
        m, src = resolve_margin(self.profile, self.config.guard_margin)
        below = (
            "slower than dense"
            if m <= 0
            else f"below {1 + m:.3f}x dense (the guard's margin {m:.3f} for the latency model's error: {src})"
        )
        hint = self.compressor.refusal()
        return (
            f"--param-ratio {r:g} cannot be met without a slowdown: predicted {below} at "
            f"{shapes}{where}; or pass --allow-slower, or --serve the shapes you run, or a wider "
            f"--window (e.g. 0.25: fewer sites compressed deeper, at a quality cost)"
            + (f"; {hint}" if hint else "")
        )


def profile_for(model: nn.Module, spec: str | None, profile: Profile | None) -> Profile:
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

    config.validate()
    timings: dict[str, float] = {}
    comp = get_compressor(config.compressor, **config.options)
    prof = profile_for(model, config.profile, profile)
    sites = comp.sites(model)
    if config.max_gpu_memory is not None and _sequential(model, comp, config):
        comp.exec_device = "cuda" if torch.cuda.is_available() else "cpu"
        timings["sequential"] = 1.0
    if not sites:
        raise GacError(f"{config.compressor}: no compressible sites in {type(model).__name__}")
    serve, dropped = serving_shapes(config.serve, model)
    if dropped:
        console.print(
            f"serving shapes: the default's {dropped} exceed the model's context; not guarded", markup=False
        )
    # a compressor's bounds from the profile (palu's kernel rank caps), before the budget's checks
    bind_profile = getattr(comp, "bind_profile", None)
    note = bind_profile(sites, prof, config.align) if bind_profile is not None else None
    if note:
        console.print(note, markup=False)
    budget = _budget(sites, config, comp, prof)
    t0 = time.perf_counter()
    calib_info = _calibrate(model, comp, config, tokenizer, calib_batches)
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
        other_ms=outside_sites_ms(model, sites, prof, serve),
        model=model,
        serve=serve,
    )


def _sequential(model: nn.Module, comp: Any, config: CompressConfig) -> bool:
    """Whether the model exceeds ``config.max_gpu_memory`` (then it is compressed layer by layer)."""
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if need <= config.max_gpu_memory * 2**30:
        return False
    if not comp.supports_sequential:
        raise GacError(
            f"{config.compressor}: the model ({need / 2**30:.2f} GiB) exceeds --max-gpu-memory "
            f"{config.max_gpu_memory:g} GiB, and its calibration needs whole-model passes; "
            "layer-by-layer compression supports svd and svd-llm"
        )
    return True


def _budget(sites: list[Site], config: CompressConfig, comp: Any, prof: Profile) -> int:
    """The parameter budget of ``config.param_ratio``, refused where even the smallest dims exceed it."""
    dense = sum(s.dense_cost for s in sites)
    budget = int(math.floor(config.param_ratio * dense))
    floor_cost = sum(s.cost(s.min_dim) for s in sites)
    if floor_cost > budget:
        raise GacError(
            f"param ratio {config.param_ratio} cannot be met: even the smallest dims cost "
            f"{floor_cost:,} of {dense:,} parameters ({floor_cost / dense:.4f})"
        )
    check_budget = getattr(comp, "check_budget", None)  # a compressor's own budget bounds (palu)
    if check_budget is not None:
        check_budget(sites, budget, prof, config.align)
    return budget


def _calibration_config(model: nn.Module, config: CompressConfig) -> Any:
    """The :class:`~gac.compressors.calibration.CalibrationConfig` of ``config`` (defaults per device)."""
    from gac.compressors.calibration import CalibrationConfig, model_device

    d = CalibrationConfig.default(model_device(model), source=config.calib)
    return CalibrationConfig(
        source=config.calib,
        n_samples=config.n_samples or d.n_samples,
        seq_len=config.seq_len or d.seq_len,
        batch_size=config.batch_size,
        seed=config.calib_seed,
    )


def _calibrate(
    model: nn.Module,
    comp: Any,
    config: CompressConfig,
    tokenizer: Any,
    calib_batches: list[torch.Tensor] | None,
) -> dict[str, Any]:
    """Calibrate ``comp`` on ``calib_batches`` (else on ``config.calib`` text); what it used, for the record."""
    from gac.compressors.calibration import calibration_data

    if not comp.needs_calibration:
        comp.calibrate(model, [])
        return {"used": False}
    if calib_batches is None:
        if tokenizer is None:
            raise GacError(
                f"compressor {config.compressor!r} needs calibration data: pass a tokenizer or calib_batches"
            )
        if config.seq_len is not None:
            from gac.data import check_seq_len

            check_seq_len(model, config.seq_len)
        cc = _calibration_config(model, config)
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
    return calib_info


def serving_shapes(spec: str | None, model: nn.Module) -> tuple[list[Point], str]:
    """The serving shapes of ``spec`` for ``model`` and the default's shapes dropped (``""`` if none).

    A given shape beyond the model's maximum context is refused; the default grid
    (``spec`` None) keeps only the shapes that fit it.
    """
    ctx = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if spec is not None:
        pts = parse_serve(spec)
        check_context(pts, ctx)
        return pts, ""
    pts = parse_serve(DEFAULT_SERVE)
    keep = [p for p in pts if not ctx or (p.seq if p.phase == "prefill" else p.kv + 1) <= ctx]
    return keep, serve_str([p for p in pts if p not in keep])


def _note_latent_pricing(rec: Allocation, profile: Profile, sites: list[Site], serve: list[Point]) -> None:
    """Record (and note, at the roofline) how the guard priced a latent cache's attention."""
    how = latent_site_pricing(profile, sites, serve or [])
    if how is None or rec.guard.get("off"):
        return
    rec.guard["latent_attention"] = how
    if how == GROUPED_APART:
        rec.notes.append(
            f"latency guard: profile {profile.id!r} timed latent attention with values grouped as the keys; "
            "these keys and values are grouped apart, priced from the key group's row with the values read once "
            "per key group (untimed for this grouping: the latency model predicted such cells at 0.81-1.15x "
            "their measured speedup on an H100 and an H200, benchmarks/results/h100/palu-default/keygroup/)"
        )
    elif how != "measured":
        rec.notes.append(
            f"latency guard: latent attention priced at the roofline of profile {profile.id!r} (it has no "
            "latent_attention class: benchmarks/tools/gpu_launch_constants.py --fields latent_attention)"
        )


def outside_sites_ms(
    model: nn.Module, sites: list[Site], profile: Profile, serve: list[Point]
) -> dict[str, float]:
    """Per serving shape: the dense model's predicted ms (:func:`gac.hardware.latency.predict`)
    less its sites' (:func:`gac.allocation.site_ms`): the launches the sites' dims do not change."""
    from gac.allocation import site_ms
    from gac.hardware.latency import predict

    out = {}
    for p in serve:
        whole = predict(model, profile, p)["ms"]
        out[p.key] = max(whole - sum(site_ms(profile, s, s.max_dim, p.tokens, p.kv) for s in sites), 0.0)
    return out


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
        recovery: what the LoRA recovery did (``CompressConfig.recover``; None: none ran).
        verify: the measured serving shapes (``CompressConfig.verify``; None: not verified).
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
    recovery: dict[str, Any] | None = None
    verify: dict[str, Any] | None = None

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
        for k in ("recovery", "verify"):  # only when they ran
            if d[k] is None:
                del d[k]
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
            *self._serve_rows(),
        ]

    def _serve_rows(self) -> list[tuple[str, str]]:
        rows = self.allocation.get("serve") or []
        if not rows:
            return []
        w = min(rows, key=lambda r: r["speedup"])
        g = self.allocation.get("guard") or {}
        how = "guarded" if g.get("guarded") and not g.get("off") else "not guarded"
        if how == "guarded" and g.get("margin"):
            how += f", margin {g['margin']:.3f}"
        return [
            (
                "serving shapes (predicted)",
                f"{len(rows)} shapes, worst {w['speedup']:.3f}x dense at {w['point']} ({how})",
            )
        ]

    def print(self, per_site: bool = True, max_rows: int | None = None, to: Any = None) -> None:
        """Print the per-site table (dims before/after) and the summary (to stderr, or ``to``)."""
        from rich.table import Table

        con = to if to is not None else console

        if per_site:
            from gac.sites import short_name

            t = Table(title="per-site dims", show_lines=False, padding=(0, 1))
            for col in ("site", "shape", "max", "native", "chosen", "aligned", "params"):
                t.add_column(
                    col,
                    justify="right" if col not in ("site", "aligned") else "left",
                    no_wrap=True,
                    overflow="ellipsis",
                )
            rows = self.allocation["sites"]
            for s in rows if max_rows is None else rows[:max_rows]:
                ok = "dense" if s["dense"] else ("yes" if s["aligned"] else "[red]no[/red]")
                params = s.get("params")
                t.add_row(
                    short_name(s["name"]),
                    "x".join(map(str, s["shape"])),
                    str(s["max_dim"]),
                    str(s["native"]),
                    str(s["dim"]),
                    ok,
                    f"{s['cost'] if params is None else params:,}",
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
    cfg["serve"] = serve_str(plan.serve)  # the shapes guarded and predicted (the default resolved)
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


def preflight(
    config: CompressConfig, device: str, out: str | Path | None = None, overwrite: bool = False
) -> None:
    """Everything cheap, before a model is loaded or calibrated: the compressor and its options,
    the output directory, ``config.verify``'s GPU and the profile spec (each a one-line GacError)."""
    from gac.compressors.base import available_compressors, get_compressor
    from gac.guard import check_out

    config.validate()
    if config.compressor not in available_compressors():
        raise GacError(
            f"unknown compressor {config.compressor!r}; available: {', '.join(available_compressors())}"
        )
    get_compressor(config.compressor, **config.options)  # option names and types fail now, not after loading
    if out is not None:
        check_out(out, overwrite)
    if config.verify:
        from gac.eval.infer import check_verify

        check_verify(device)
    if config.profile is not None:
        load_profile(config.profile)  # a bad spec fails now, not after calibration


def check_not_compressed(model: nn.Module, name: str | None = None) -> None:
    """Refuse a model that already holds factorized layers (compress its base model instead)."""
    from gac.io import factorized_sites

    if factorized_sites(model):
        name = name or getattr(model, "name_or_path", None) or type(model).__name__
        raise GacError(f"{name} is already compressed; compress its base model instead")


def place_(model: nn.Module, max_gpu_memory: float, device: str) -> bool:
    """Move ``model`` onto ``device`` when its parameters fit ``max_gpu_memory`` GiB (True); else leave
    it where it is, to be calibrated and factorized one decoder layer at a time (said; False)."""
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    if need <= max_gpu_memory * 2**30:
        model.to(device)
        return True
    console.print(
        f"the model ({need / 2**30:.2f} GiB) exceeds --max-gpu-memory {max_gpu_memory:g} GiB: "
        f"calibrating and factorizing one decoder layer at a time on {device}",
        markup=False,
    )
    return False


def recover_(
    model: nn.Module,
    config: CompressConfig,
    tokenizer: Any | None = None,
    calib_batches: list[torch.Tensor] | None = None,
) -> dict[str, Any] | None:
    """``config.recover``'s step on a compressed ``model`` (in place): ``lora`` fine-tunes LoRA
    adapters on the calibration text (``calib_batches``, else ``config.calib`` through ``tokenizer``)
    and merges them. Returns ``{"method", ...}`` (:func:`gac.recovery.recover_lora_`), None for ``none``."""
    if config.recover == "none":
        return None
    from gac.compressors.calibration import calibration_batches
    from gac.recovery import recover_lora_

    if calib_batches is None:
        calib_batches = calibration_batches(tokenizer, _calibration_config(model, config))
    info = recover_lora_(
        model, calib_batches, steps=config.recover_steps, rank=config.recover_rank, lr=config.recover_lr
    )
    console.print(f"LoRA recovery: loss {info['loss_first']:.3f} -> {info['loss_last']:.3f}")
    return {"method": "lora", **info}


def compress_(
    model: nn.Module,
    config: CompressConfig,
    tokenizer: Any | None = None,
    calib_batches: list[torch.Tensor] | None = None,
    profile: Profile | None = None,
    *,
    device: str | None = None,
    dense: Any | None = None,
) -> CompressionReport:
    """Compress ``model`` in place: sites -> calibrate -> budget -> native allocation -> align -> apply,
    then ``config.recover`` and ``config.verify``.

    A model that already holds factorized layers is refused. With ``config.max_gpu_memory`` and
    ``model`` in CPU memory, the model moves onto the GPU (``device``) when it fits the budget, and
    otherwise is calibrated and factorized there one decoder layer at a time.

    Args:
        model: a Hugging Face causal LM.
        config: what to do (:class:`CompressConfig`).
        tokenizer: builds calibration batches from ``config.calib`` when needed.
        calib_batches: explicit calibration token batches.
        profile: the hardware profile (default: from ``config.profile`` or auto).
        device: the GPU that ``config.max_gpu_memory`` and ``config.verify`` mean (default: ``cuda``
            when available, else where ``model`` is).
        dense: ``config.verify``: builds the dense model to time against (default: a copy of
            ``model`` taken before compressing, kept in CPU memory).

    Returns:
        The :class:`CompressionReport` (per-site dims, alignment, params, predicted speedup, and the
        recovery's and verification's records when they ran).
    """
    from gac.compressors.calibration import model_device

    config.validate()
    check_not_compressed(model)
    dev = device or ("cuda" if torch.cuda.is_available() else str(model_device(model)))
    if config.verify:
        from gac.eval.infer import check_verify

        check_verify(dev)
    if config.recover != "none" and tokenizer is None and calib_batches is None:
        raise GacError(
            f"--recover {config.recover} needs calibration text: pass a tokenizer or calib_batches"
        )
    if config.verify and dense is None:
        snapshot = copy.deepcopy(model).to("cpu")
        dense = lambda: snapshot.to(dev)  # noqa: E731
    if config.max_gpu_memory is not None and dev.startswith("cuda") and model_device(model).type == "cpu":
        place_(model, config.max_gpu_memory, dev)
    p = plan(model, config, tokenizer=tokenizer, calib_batches=calib_batches, profile=profile)
    report = apply_(model, p, p.allocation())
    report.recovery = recover_(model, config, tokenizer, calib_batches)
    if config.verify:
        # on a copy: the inference path fuses projections, and ``model`` stays as compressed
        report.verify = verify_serving(copy.deepcopy(model), dense, report)
    return report


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
        "serve": report.config.get("serve"),
        "guard": a.get("guard"),
        "predicted_serve": {r["point"]: r["speedup"] for r in a.get("serve") or []},
        **({"recovery": report.recovery} if report.recovery is not None else {}),
    }


def verify_serving(
    model: nn.Module, build_dense: Any, report: CompressionReport, out: str | Path | None = None
) -> dict[str, Any]:
    """Time ``model`` against dense at its serving shapes on the default inference path (GPU).

    The sweep is :func:`gac.eval.infer.run_sweep` (q/k/v and gate/up fused, compiled steps, CUDA
    graphs, the decode kernels), dense first (``build_dense()`` loads it), over the grid covering
    ``report``'s serving shapes. Each shape gets its measured speedup, quartile interval and the
    predicted speedup; a shape whose whole interval lies below 1.00 is warned about. With ``out``
    (a saved model directory) the result goes into its ``gac_report.json`` as ``verify``.
    """
    from gac.eval.infer import Variant, model_device, run_sweep, serve_speedups, serve_sweep_config
    from gac.nn.fused import fuse_projections_

    pts = parse_serve(report.config["serve"])
    cfg = serve_sweep_config(pts)

    def fused(m: nn.Module) -> nn.Module:
        fuse_projections_(m)
        return m

    res = run_sweep(
        [Variant("dense", lambda: fused(build_dense())), Variant("compressed", lambda: fused(model))],
        cfg,
        model_device(model),
    )
    rows = serve_speedups(res, pts, "compressed")
    predicted = {r["point"]: r["speedup"] for r in report.allocation.get("serve") or []}
    for r in rows:
        r["predicted_speedup"] = predicted.get(r["point"])
        if r.get("status") != "ok":
            console.print(f"[yellow]warning:[/yellow] --verify: {r['point']} not measured ({r['status']})")
        elif r["slower"]:
            console.print(
                f"[yellow]warning:[/yellow] --verify: {r['point']} measured {r['speedup']:.3f}x dense "
                f"(quartiles {r['interval'][0]:.3f}-{r['interval'][1]:.3f}): slower beyond the run's spread"
            )
    rec = {"schema": "gac.verify/1", "shapes": rows, "env": res.get("env"), "config": res.get("config"),
           "copy_bandwidth": res.get("copy_bandwidth")}  # fmt: skip
    ok = [r for r in rows if r.get("status") == "ok"]
    if ok:
        w = min(ok, key=lambda r: r["speedup"])
        console.print(f"--verify: worst serving shape {w['point']} at {w['speedup']:.3f}x dense (measured)")
    if out is not None:
        f = Path(out) / "gac_report.json"
        doc = json.loads(f.read_text())
        doc["verify"] = rec
        atomic_write_text(f, json.dumps(doc, indent=1, default=_json_default))
    return rec
