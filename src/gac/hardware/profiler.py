"""Distil measured sweeps into a :class:`~gac.hardware.profile.Profile` (``gac profile``).

For each operator class the profiler measures a curve near typical LLM sizes and derives
the rule from it.  The method, in the order the code runs:

1. **Coarse sweep** of each window at an odd stride (3 for a full profile, 5 for
   ``--quick``), so that the coarse grid meets every residue class mod 2^k, plus the
   multiples of 8 (so a fast aligned dim is never hidden between two slow coarse points).
2. **Refinement.**  Between two consecutive coarse points whose work-normalized cost
   (ms per unit of dim) differs by more than ``1 + 2*tolerance``, every dim is measured
   (stride 1).  The intervals refined are stored with the curve.
3. **Efficiency of a dim** (stored in the curve): the best latency reachable by padding
   it to any measured dim at most ``lookahead`` larger, over its own latency.  Aligned
   dims score ~1; a dim on the slow side of a cliff scores its penalty (e.g. 0.43 for
   SDPA head_dim 107 when 112 runs 2.3x faster).
4. **Rule.**  ``modulus`` = the smallest power of two m such that the multiples of m
   run within ``tolerance`` of the best nearby dim, *nearby* meaning up to the next
   multiple of max(m, 8) (i.e. padding one more step would not buy more than the
   tolerance; a wider look-ahead would mistake tile quantization and cuBLAS heuristic
   jitter between aligned dims for misalignment).  Multiples with no measured dim in
   that reach are no evidence and are skipped.  This is checked
   separately for each alignment class of multiples (class 8, 16, ...): all of a class
   when it has fewer than 10 measured dims, else at least 90% of them (a robustness
   margin against timing noise; the dims that fall short are listed in
   ``rule_evidence.exceptions``).  When no modulus passes, the modulus is 1 and
   ``rule_evidence.no_modulus_passed`` is set (padding is not predicted to help).  ``prefer`` = the smallest m >= modulus whose multiples
   reach (within 2%) the best mean throughput relative to their window's best.
5. **class_efficiency**: the median efficiency of the dims of each alignment class
   (largest power of two dividing the dim, capped at 128); a class without points takes
   the nearest lower class's value.
6. **Cliffs**: each fast dim next to a slower neighbour (d +- 1) by more than
   ``1 + 4*tolerance`` per unit of work (``kind: "alignment"``), and each step of the
   same size between consecutive multiples of the modulus (``kind: "boundary"``: a kernel
   template or tile boundary, such as SDPA head_dim 128 -> 136).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from gac.alignment import pow2_class
from gac.errors import GacError
from gac.guard import atomic_savefig
from gac.hardware.profile import OPS, SCHEMA, OpRule, Profile
from gac.hardware.sweeps import Config, append_jsonl, measure_point, op_point
from gac.hardware.timing import dtype_name, environment, gpu_slug, resolve_device, resolve_dtype
from gac.utils import atomic_write_text, console, progress, track

MODULI: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)
CLASSES: tuple[int, ...] = MODULI


# --------------------------------------------------------------------------- pure logic
def coarse_grid(lo: int, hi: int, stride: int, anchor: int = 8) -> list[int]:
    """``lo, lo+stride, ...``, ``hi``, and every multiple of ``anchor`` in between.

    The odd stride meets every residue class; the multiples of ``anchor`` make sure that
    fast aligned points are never hidden between two slow coarse points.

    >>> coarse_grid(1000, 1016, 5)
    [1000, 1005, 1008, 1010, 1015, 1016]
    """
    g = set(range(lo, hi + 1, stride)) | {hi}
    g |= set(range(-(-lo // anchor) * anchor, hi + 1, anchor))
    return sorted(g)


def jumps(dims: list[int], ms: list[float], tolerance: float = 0.05) -> list[tuple[int, int]]:
    """Consecutive pairs whose cost per unit of dim differs by more than ``1 + 2*tolerance``.

    >>> jumps([8, 13, 18], [1.0, 4.875, 6.75])
    [(8, 13)]
    """
    out = []
    for a, b, ma, mb in zip(dims, dims[1:], ms, ms[1:], strict=False):
        ca, cb = ma / a, mb / b
        if max(ca, cb) / max(min(ca, cb), 1e-12) > 1.0 + 2.0 * tolerance and b - a > 1:
            out.append((a, b))
    return out


def efficiencies(dims: list[int], ms: list[float], lookahead: int = 64) -> list[float]:
    """Best latency reachable by padding each dim (to a measured dim <= d + lookahead) over its own.

    >>> efficiencies([7, 8, 9, 16], [3.0, 1.0, 3.0, 1.5])
    [0.3333333333333333, 1.0, 0.5, 1.0]
    """
    out = []
    for d, m in zip(dims, ms, strict=True):
        best = min(mj for dj, mj in zip(dims, ms, strict=True) if d <= dj <= d + lookahead)
        out.append(best / m if m > 0 else 1.0)
    return out


@dataclass
class Curve:
    """A measured curve over one or more windows (each window analysed on its own)."""

    dims: list[int]
    ms: list[float]
    window: list[int]  # window index of each point
    tflops: list[float | None] = field(default_factory=list)
    iqr_ms: list[float] = field(default_factory=list)


def discover_rule(
    curve: Curve, tolerance: float = 0.05, lookahead: int = 64, min_pass: float = 0.9
) -> dict[str, Any]:
    """Derive modulus, prefer, efficiencies, class efficiencies and cliffs from a curve.

    Returns:
        ``{"modulus", "prefer", "efficiency" (per dim), "class_efficiency", "cliffs",
        "rule_evidence"}``.
    """
    if not curve.dims:
        raise GacError("cannot discover a rule from an empty curve (every point failed?)")
    order = sorted(range(len(curve.dims)), key=lambda i: (curve.window[i], curve.dims[i]))
    dims = [curve.dims[i] for i in order]
    ms = [curve.ms[i] for i in order]
    win = [curve.window[i] for i in order]
    eff: list[float] = [0.0] * len(dims)
    tput_rel: list[float] = [0.0] * len(dims)
    for w in sorted(set(win)):
        idx = [i for i in range(len(dims)) if win[i] == w]
        e = efficiencies([dims[i] for i in idx], [ms[i] for i in idx], lookahead)
        tp = [dims[i] / ms[i] for i in idx]
        best_tp = max(tp)
        for j, i in enumerate(idx):
            eff[i] = e[j]
            tput_rel[i] = tp[j] / best_tp
    evidence: dict[str, Any] = {}
    modulus = _modulus(dims, ms, win, tolerance, min_pass, evidence)
    return {
        "modulus": int(modulus),
        "prefer": int(_prefer(dims, tput_rel, modulus, evidence)),
        "dims": dims,
        "ms": ms,
        "window": win,
        "efficiency": [round(x, 4) for x in eff],
        "class_efficiency": _class_efficiency(dims, eff, evidence),
        "cliffs": _cliffs(dims, ms, win, modulus, tolerance),
        "rule_evidence": evidence,
    }


def _modulus(
    dims: list[int], ms: list[float], win: list[int], tolerance: float, min_pass: float, evidence: dict
) -> int:
    """The smallest power of two whose multiples run near the best nearby dim, class by class (step 4)."""
    modulus = None
    for m in MODULI:
        members = [i for i, d in enumerate(dims) if d % m == 0]
        if not members:
            continue
        # how close each multiple runs to the best dim up to the next multiple of max(m, 8)
        reach = max(m, 8)
        eff_m = {}
        for i in members:
            near = [j for j in range(len(dims)) if win[j] == win[i] and dims[i] < dims[j] <= dims[i] + reach]
            if near:  # a multiple with nothing measured after it is no evidence either way
                eff_m[i] = min(ms[i], *(ms[j] for j in near)) / ms[i]
        members = [i for i in members if i in eff_m]
        if not members:
            continue
        ok = True
        fracs = {}
        for c in CLASSES:
            if c < m:
                continue
            cls = [i for i in members if pow2_class(dims[i]) == c]
            if not cls:
                continue
            frac = sum(eff_m[i] >= 1.0 - tolerance for i in cls) / len(cls)
            fracs[str(c)] = round(frac, 4)
            if frac < (1.0 if len(cls) < 10 else min_pass):
                ok = False
        evidence[str(m)] = {"multiples": len(members), "pass_fraction_by_class": fracs}
        if ok and modulus is None:
            modulus = m
            evidence["exceptions"] = [
                {"dim": dims[i], "vs_next_step": round(eff_m[i], 4)}
                for i in members
                if eff_m[i] < 1.0 - tolerance
            ]
    if modulus is None:
        # no power of two makes its multiples reliably fast (e.g. decode GEMV on H200, where
        # cuBLAS runs N % 8 == 0 slower than odd N): padding is not predicted to help
        modulus = 1
        evidence["no_modulus_passed"] = True
    return modulus


def _prefer(dims: list[int], tput_rel: list[float], modulus: int, evidence: dict) -> int:
    """The smallest multiple of ``modulus`` whose multiples reach the best mean relative throughput."""
    scores = {}
    for m in MODULI:
        if m < modulus:
            continue
        members = [i for i, d in enumerate(dims) if d % m == 0]
        if len(members) >= 2 or (m == modulus and members):
            scores[m] = float(np.mean([tput_rel[i] for i in members]))
    best_score = max(scores.values()) if scores else 1.0
    prefer = min((m for m, s in scores.items() if s >= best_score - 0.02), default=modulus)
    evidence["prefer_scores"] = {str(k): round(v, 4) for k, v in scores.items()}
    return prefer


def _class_efficiency(dims: list[int], eff: list[float], evidence: dict) -> dict[str, float]:
    """The median efficiency per alignment class; a class without points takes the nearest lower one's."""
    ce: dict[str, float] = {}
    for c in CLASSES:
        vals = [eff[i] for i, d in enumerate(dims) if pow2_class(d) == c]
        if vals:
            ce[str(c)] = round(float(np.median(vals)), 4)
    filled: dict[str, float] = {}
    for c in CLASSES:
        if str(c) in ce:
            filled[str(c)] = ce[str(c)]
        else:
            lower = [x for x in CLASSES if x < c and str(x) in ce]
            higher = [x for x in CLASSES if x > c and str(x) in ce]
            src = lower[-1] if lower else (higher[0] if higher else None)
            filled[str(c)] = ce[str(src)] if src is not None else 1.0
    evidence["classes_measured"] = sorted(int(c) for c in ce)
    return filled


def _cliffs(dims: list[int], ms: list[float], win: list[int], modulus: int, tolerance: float) -> list[dict]:
    """Alignment cliffs (a dim next to a slower neighbour) and boundary steps between multiples."""
    cliffs: list[dict[str, Any]] = []
    pos = {(win[i], dims[i]): i for i in range(len(dims))}
    thr = 1.0 + 4.0 * tolerance
    for i, d in enumerate(dims):
        cost = ms[i] / d
        worst = None
        for nb in (d - 1, d + 1):
            j = pos.get((win[i], nb))
            if j is None:
                continue
            r = (ms[j] / dims[j]) / cost
            if r > thr and (worst is None or r > worst[1]):
                worst = (dims[j], r)
        if worst is not None:
            cliffs.append({"dim": worst[0], "fast_dim": d, "ratio": round(worst[1], 3), "kind": "alignment"})
    for w in sorted(set(win)):
        mem = [i for i in range(len(dims)) if win[i] == w and dims[i] % modulus == 0]
        for a, b in zip(mem, mem[1:], strict=False):
            r = (ms[b] / dims[b]) / (ms[a] / dims[a])
            if r > thr or r < 1.0 / thr:
                cliffs.append({"dim": dims[a], "next": dims[b], "ratio": round(r, 3), "kind": "boundary"})
    return cliffs


# --------------------------------------------------------------------------- measuring
@dataclass
class OpPlan:
    """What to sweep for one operator class."""

    op: str
    windows: list[tuple[int, int]]
    cfg: Config
    context: dict[str, Any]


def plans(device: torch.device, quick: bool) -> list[OpPlan]:
    """The sweeps of a profile: typical LLM sizes on CUDA, tiny ones on CPU."""
    if device.type != "cuda":
        c = Config.cpu()
        c.warmup_ms, c.rep_ms, c.max_reps = 1.0, 3.0, 10
        return _op_plans(c, [(48, 80)], [(48, 80)], [(48, 80)], [(16, 40)], [(16, 48)])
    c = Config.gpu()
    if quick:
        c.warmup_ms, c.rep_ms, c.min_reps = 5.0, 12.0, 5
        c.seq = 1024
        c.lowrank_m = 2048
        return _op_plans(c, [(992, 1056)], [(96, 160)], [(992, 1056)], [(96, 136)], [(992, 1056)])
    c.warmup_ms, c.rep_ms, c.min_reps = 10.0, 30.0, 10
    return _op_plans(
        c,
        [(992, 1088), (4032, 4160)],
        [(96, 192), (992, 1088)],
        [(992, 1088), (4032, 4160)],
        [(64, 256)],
        [(224, 320), (992, 1088)],
    )


def _op_plans(c: Config, gemm_n, gemm_k, gemv, sdpa_head_dim, lowrank_r) -> list[OpPlan]:
    """One plan per operator class: its windows, at the shapes of ``c``."""
    return [
        OpPlan("gemm_n", gemm_n, c, {"M": c.m, "K": c.k}),
        OpPlan("gemm_k", gemm_k, c, {"M": c.m, "N": c.n}),
        OpPlan("gemv", gemv, c, {"M": 1, "K": c.gemv_k}),
        OpPlan("sdpa_head_dim", sdpa_head_dim, c, {"B": c.batch, "S": c.seq, "H": c.heads}),
        OpPlan("lowrank_r", lowrank_r, c, {"M": c.lowrank_m, "d": c.lowrank_d}),
    ]


Measure = Callable[[str, int], float | None]


def sweep(
    op: str,
    windows: list[tuple[int, int]],
    measure: Measure,
    stride: int,
    tolerance: float = 0.05,
    on_point: Callable[[], None] | None = None,
) -> tuple[Curve, list[list[int]], list[int]]:
    """Coarse sweep of each window, then stride-1 refinement between jumps.

    Args:
        op: operator class (passed to ``measure``).
        windows: inclusive ``(lo, hi)`` ranges.
        measure: ``measure(op, dim) -> ms`` (None when the point could not run).
        stride: coarse stride.
        tolerance: rule tolerance (jump threshold is ``1 + 2*tolerance``).
        on_point: called after each measured point (progress).

    Returns:
        The curve, the refined intervals and the dims that failed.
    """
    curve = Curve([], [], [])
    refined: list[list[int]] = []
    failed: list[int] = []
    for wi, (lo, hi) in enumerate(windows):
        got: dict[int, float] = {}

        def take(d: int, wi: int = wi, got: dict[int, float] = got) -> None:
            if d in got or d in failed:
                return
            v = measure(op, d)
            if on_point:
                on_point()
            if v is None or not np.isfinite(v) or v <= 0:
                failed.append(d)
            else:
                got[d] = float(v)

        for d in coarse_grid(lo, hi, stride):
            take(d)
        cd = sorted(got)
        for a, b in jumps(cd, [got[d] for d in cd], tolerance):
            refined.append([a, b])
            for d in range(a + 1, b):
                take(d)
        for d in sorted(got):
            curve.dims.append(d)
            curve.ms.append(got[d])
            curve.window.append(wi)
    return curve, refined, failed


def build_profile(
    dtype: str = "bfloat16",
    quick: bool = False,
    device: str | torch.device | None = None,
    results_dir: str | Path | None = None,
    tolerance: float = 0.05,
    lookahead: int = 64,
    measure: Measure | None = None,
    op_plans: list[OpPlan] | None = None,
    command: str | None = None,
) -> Profile:
    """Measure the sweeps and distil a profile (see the module docstring for the method).

    Args:
        dtype: ``float16`` or ``bfloat16`` (``float32`` too).
        quick: smaller windows, coarser stride, shorter timing (< 60 s on an H100/H200).
        device: ``cuda``/``cpu``/None (auto).
        results_dir: where the raw points go, one JSON line each, as they are measured.
        tolerance: the rule's tolerance (0.05 = within 5% of the best nearby).
        lookahead: how far (in dims) padding may look for a faster dim.
        measure: replaces the real measurement ``(op, dim) -> ms`` (tests).
        op_plans: replaces the default sweeps.
        command: the command line to record.
    """
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    dname = dtype_name(dt)
    env = environment(dev, dt)
    command = command or " ".join(shlex.quote(a) for a in sys.argv)
    pl = op_plans or plans(dev, quick)
    stride = 5 if quick else 3
    t0 = time.time()
    points: dict[str, dict[str, Any]] = {}  # the real measurements, per op and dim
    ops: dict[str, OpRule] = {}
    raw_name = f"profile-{dname}{'-quick' if quick else ''}.jsonl"
    meta = {"type": "meta", "env": env, "command": command, "quick": quick}
    with _raw_log(results_dir, raw_name, meta) as raw_f, progress() as bar:
        est = sum(len(range(lo, hi + 1)) for p in pl for lo, hi in p.windows)
        task = bar.add_task(f"profile {env['gpu']} {dname}{' (quick)' if quick else ''}", total=est)
        for plan in pl:
            if plan.op not in OPS:
                raise GacError(f"unknown operator class {plan.op!r}")
            m = _point_measure(plan, measure, raw_f, points, dev, dt)
            curve, refined, failed = sweep(
                plan.op, plan.windows, m, stride, tolerance, on_point=lambda: bar.advance(task)
            )
            rule = discover_rule(curve, tolerance=tolerance, lookahead=lookahead)
            iqr = [points.get(plan.op, {}).get(str(d), {}).get("iqr_ms") for d in rule["dims"]]
            sweep_info = {
                "coarse_stride": stride,
                "refined": refined,
                "failed": failed,
                "lookahead": lookahead,
            }
            ops[plan.op] = _op_rule(plan, rule, iqr, tolerance, sweep_info)
    env["profile_elapsed_s"] = round(time.time() - t0, 2)
    env["profile_quick"] = quick
    env["command"] = command
    prof = _measured_profile(env, dname, quick, ops)
    if dev.type == "cuda" and measure is None:
        measure_latency_fields_(prof, dev, dt, latent_budget_s=20.0 if quick else 60.0)
    return prof


#: the latency fields of a profile, as :func:`measure_latency_fields_` names them
LATENCY_FIELDS: tuple[str, ...] = (
    "launch", "fused_lowrank", "latent_attention", "gemv_kernel", "prefill_attention",
)  # fmt: skip


def measure_latency_fields_(
    prof: Profile,
    device: torch.device,
    dtype: torch.dtype,
    fields: Iterable[str] = LATENCY_FIELDS,
    latent_budget_s: float = 60.0,
) -> Profile:
    """Measure this GPU's latency fields into ``prof``, in place: the fields the latency model and the
    guard price with.

    ``fields`` (default: all of :data:`LATENCY_FIELDS`): ``launch`` (the launch constants,
    :func:`measure_launch_constants`), ``fused_lowrank`` (:func:`measure_fused_lowrank`),
    ``latent_attention`` (:func:`measure_latent_attention`, its calls cut off after ``latent_budget_s``
    seconds: ``gac profile --quick`` gives it 20; then its ``wide`` rows on :data:`LATENT_WIDE_GEOMETRY`, cut
    off after a third of that), ``gemv_kernel`` (:func:`measure_gemv_kernel`), ``prefill_attention``
    (:func:`measure_prefill_attention`); the others are left as they are.
    """
    fields = list(fields)
    unknown = [f for f in fields if f not in LATENCY_FIELDS]
    if unknown or not fields:
        raise GacError(f"unknown latency field {unknown or fields!r}: known {', '.join(LATENCY_FIELDS)}")
    if "launch" in fields:
        lc = measure_launch_constants(device, dtype)
        prof.launch_us, prof.copy_gbps, prof.aux_us = lc["launch_us"], lc["copy_gbps"], lc["aux_us"]
        prof.latency_fit = lc["latency_fit"]
    if "fused_lowrank" in fields:
        prof.fused_lowrank = measure_fused_lowrank(device, dtype)
    if "latent_attention" in fields:
        prof.latent_attention = measure_latent_class(device, dtype, latent_budget_s)
    if "gemv_kernel" in fields:
        prof.gemv_kernel = measure_gemv_kernel(device, dtype)
    if "prefill_attention" in fields:
        prof.prefill_attention = measure_prefill_attention(device, dtype)
    return prof


@contextlib.contextmanager
def _raw_log(results_dir: str | Path | None, name: str, meta: dict[str, Any]) -> Iterator[IO[str] | None]:
    """The JSON-lines file of raw points under ``results_dir`` (its first line ``meta``); None without one."""
    if results_dir is None:
        yield None
        return
    rd = Path(results_dir)
    rd.mkdir(parents=True, exist_ok=True)
    with open(rd / name, "w") as f:
        append_jsonl(f, meta)
        yield f


def _point_measure(
    plan: OpPlan,
    measure: Measure | None,
    raw_f: IO[str] | None,
    points: dict,
    dev: torch.device,
    dt: torch.dtype,
) -> Measure:
    """``(op, dim) -> ms`` for :func:`sweep`: ``measure`` if given, else a real timed point of ``plan``.

    Each point goes to ``raw_f``; a real one's record also to ``points[op][str(dim)]``.
    """

    def m(op: str, d: int) -> float | None:
        if measure is not None:
            v = measure(op, d)
            if raw_f is not None:
                append_jsonl(raw_f, {"type": "point", "op": op, "dim": d, "median_ms": v})
            return v
        p = op_point("profile", plan.cfg, op, d, "profile")
        res = measure_point(p, dev, dt, plan.cfg)
        points.setdefault(op, {})[str(d)] = res
        if raw_f is not None:
            append_jsonl(raw_f, {"type": "point", **p, **res})
        return res.get("median_ms") if res.get("status") == "ok" else None

    return m


def _op_rule(
    plan: OpPlan, rule: dict[str, Any], iqr: list[float | None], tolerance: float, sweep_info: dict[str, Any]
) -> OpRule:
    """The rule of one operator class, with its curve (and how it was swept) for the record."""
    flops = _flops_fn(plan)
    tf = [flops(d) / (t * 1e-3) / 1e12 for d, t in zip(rule["dims"], rule["ms"], strict=True)]
    return OpRule(
        modulus=rule["modulus"],
        prefer=rule["prefer"],
        tolerance=tolerance,
        class_efficiency=rule["class_efficiency"],
        curve={
            "dims": rule["dims"],
            "ms": [round(x, 6) for x in rule["ms"]],
            "tflops": [round(x, 3) for x in tf],
            "efficiency": rule["efficiency"],
            "iqr_ms": [None if x is None else round(x, 6) for x in iqr],
            "window": rule["window"],
            "windows": [list(w) for w in plan.windows],
            "context": plan.context,
            **sweep_info,
            "rule_evidence": rule["rule_evidence"],
        },
        cliffs=rule["cliffs"],
    )


def _measured_profile(env: dict[str, Any], dname: str, quick: bool, ops: dict[str, OpRule]) -> Profile:
    """A measured profile named after the GPU, dtype, torch and CUDA of ``env``."""
    slug = gpu_slug(env["gpu"])
    tv = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    cu = env.get("cuda") or "cpu"
    date = datetime.now(timezone.utc).date().isoformat()
    return Profile(
        id=f"{slug}-{dname}-torch{tv}-cuda{cu}{'-quick' if quick else ''}",
        ops=ops,
        measured=True,
        label=f"{env['gpu']}, {dname}, torch {torch.__version__} (measured {date}{', quick' if quick else ''})",
        dtype=dname,
        env=env,
        schema=SCHEMA,
    )


#: GEMV shapes ``(N, K)`` timed for the launch fit: 2 MB to 1 GB of 2-byte weights (as issue 9's diag).
LAUNCH_SHAPES: tuple[tuple[int, int], ...] = (
    (1024, 1024), (4096, 1024), (4096, 4096), (14336, 4096), (28672, 4096), (128256, 4096),
)  # fmt: skip


def measure_launch_constants(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """``launch_us``, ``copy_gbps`` and ``aux_us`` of this GPU (CUDA only; about a second).

    Each GEMV of :data:`LAUNCH_SHAPES` at one row is timed 64 times in a CUDA graph (over weight
    copies that do not fit in L2, :func:`gac.hardware.timing.bench_graph`, the dispatch's cuBLAS timing), and
    ``t = launch_us + bytes / copy_gbps`` is fitted (:func:`gac.hardware.latency.fit_launch`);
    ``aux_us`` is the time of a small elementwise kernel (``x.mul_(1)`` on 4096 elements) in a graph.
    """
    from gac.hardware.latency import fit_launch
    from gac.hardware.timing import bench_graph, copies_past_l2

    if device.type != "cuda":
        raise GacError("the launch constants are measured on CUDA only")
    elem = torch.tensor([], dtype=dtype).element_size()
    nbytes, us = [], []
    for n, k in LAUNCH_SHAPES:
        w_bytes = n * k * elem
        copies = copies_past_l2(w_bytes)
        try:
            ws = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(copies)]
        except torch.OutOfMemoryError:
            continue
        x = torch.randn(1, k, device=device, dtype=dtype)
        y = torch.empty(1, n, device=device, dtype=dtype)
        us.append(bench_graph(lambda i, ws=ws, x=x, y=y: torch.mm(x, ws[i % len(ws)].t(), out=y)))
        nbytes.append(w_bytes)
        del ws
        torch.cuda.empty_cache()
    t0, gbps = fit_launch(nbytes, us)
    z = torch.randn(4096, device=device, dtype=dtype)
    aux = bench_graph(lambda i: z.mul_(1.0))
    return {
        "launch_us": t0,
        "copy_gbps": gbps,
        "aux_us": round(aux, 3),
        "latency_fit": {
            "source": "gac profile (gac.hardware.profiler.measure_launch_constants)",
            "method": "least squares t = launch_us + weight bytes / copy_gbps over cuBLAS GEMVs at 1 row, "
            "64 calls per CUDA graph; aux_us: x.mul_(1) on 4096 elements in a CUDA graph",
            "points": [{"bytes": b, "us": round(t, 3)} for b, t in zip(nbytes, us, strict=True)],
        },
    }


#: site shapes ``(in, ranks, outs)`` timed for the fused low-rank kernel's fit: Llama-3-8B-sized
#: factorized layers and fused groups at 15% (17 to 200 MB of 2-byte weights)
FUSED_SHAPES: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...] = (
    (4096, (1024,), (4096,)),
    (4096, (1736,), (4096,)),
    (14336, (2712,), (4096,)),
    (4096, (1736, 704, 704), (4096, 1024, 1024)),
    (4096, (2704, 2704), (14336, 14336)),
    (14336, (3584,), (4096,)),
)


def _measured_each(
    items: Iterable[Any], label: str, measure: Callable[[Any], dict[str, Any]]
) -> list[dict[str, Any]]:
    """``measure(item)`` for every item with a progress bar; an item that runs out of GPU memory is skipped."""
    recs = []
    for x in track(list(items), label):
        try:
            recs.append(measure(x))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
    return recs


def measure_fused_lowrank(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The profile's ``fused_lowrank`` entry on this GPU: the fused low-rank kernel's launch fit.

    Each site of :data:`FUSED_SHAPES` is measured as the dispatch measures it
    (:func:`gac.kernels.lowrank_fused.measure_site`: the two-launch path and each one-row
    configuration, checked, in CUDA graphs), and :func:`gac.hardware.latency.fit_fused_lowrank` fits
    the shapes where the kernel won.  ``{}`` without Triton, or where it won at fewer than two shapes.
    """
    from gac.hardware.latency import fit_fused_lowrank
    from gac.kernels import lowrank_fused as L

    if device.type != "cuda":
        raise GacError("the fused low-rank kernel is measured on CUDA only")
    if not L.HAVE_TRITON:
        console.print("[yellow]note:[/yellow] no Triton: the profile gets no fused low-rank entry")
        return {}
    recs = _measured_each(FUSED_SHAPES, "fused low-rank kernel: launch fit",
                          lambda x: L.measure_site(x[0], list(x[1]), list(x[2]), 1, dtype, device))  # fmt: skip
    fit = fit_fused_lowrank(recs, "gac profile (gac.hardware.profiler.measure_fused_lowrank)")
    if fit:
        fit["fit"]["sites"] = [{k: r.get(k) for k in ("site", "bytes", "existing_us", "fused_us", "use")}
                               for r in recs]  # fmt: skip
    return fit


#: weights ``(out, in)`` timed for the Triton decode GEMV's fit: Llama-3-8B's projections, fused groups and head
GEMV_SHAPES: tuple[tuple[int, int], ...] = (
    (1024, 4096), (4096, 4096), (6144, 4096), (4096, 14336), (14336, 4096), (28672, 4096), (128256, 4096),
)  # fmt: skip


def measure_gemv_kernel(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The profile's ``gemv_kernel`` entry on this GPU: the Triton decode GEMV's launch fit per row class.

    Each weight of :data:`GEMV_SHAPES` at each row class of the GEMV's dispatch is measured as the dispatch
    measures it (:func:`gac.kernels.gemv.measure_shape`: cuBLAS and every configuration, checked, in CUDA
    graphs), and :func:`gac.hardware.latency.fit_gemv_kernel` fits the shapes where the kernel won. ``{}``
    without Triton, or where it won at fewer than two shapes of every row class.
    """
    from gac.hardware.latency import fit_gemv_kernel
    from gac.kernels import gemv as G

    if device.type != "cuda":
        raise GacError("the Triton GEMV is measured on CUDA only")
    if not G.HAVE_TRITON:
        console.print("[yellow]note:[/yellow] no Triton: the profile gets no gemv_kernel entry")
        return {}
    recs = _measured_each([(s, r) for s in GEMV_SHAPES for r in G.ROW_CLASSES], "Triton GEMV: launch fit",
                          lambda x: G.measure_shape(x[0][0], x[0][1], x[1], dtype, device))  # fmt: skip
    return fit_gemv_kernel(recs, "gac profile (gac.hardware.profiler.measure_gemv_kernel)")


#: prefill attention's timed grid: Llama-3-8B's geometry (query heads, KV heads, head_dim), batches, sequences
PREFILL_GEOMETRY: tuple[int, int, int] = (32, 8, 128)
PREFILL_BATCHES: tuple[int, ...] = (1, 8)
PREFILL_SEQS: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096)


def measure_prefill_attention(
    device: torch.device,
    dtype: torch.dtype,
    geometry: tuple[int, int, int] = PREFILL_GEOMETRY,
    batches: Iterable[int] = PREFILL_BATCHES,
    seqs: Iterable[int] = PREFILL_SEQS,
) -> dict[str, Any]:
    """The profile's ``prefill_attention`` entry on this GPU: one layer's prefill attention, timed as the
    compiled prefill step runs it.

    transformers' SDPA attention (``sdpa_attention_forward``, which ``gac_sdpa`` hands every prompt to) over
    ``[B, H, S, D]`` queries and ``[B, KV, S, D]`` keys and values, with the causal mask as a boolean ``[B, 1, S,
    S]`` tensor: under ``torch.compile`` before torch 2.14 transformers materializes the mask rather than pass
    ``is_causal`` (``masking_utils._ignore_causal_mask_sdpa``), so SDPA attends every position and expands the KV
    heads. Each point is timed in a CUDA graph (:func:`gac.hardware.timing.graph_timings`, median).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from gac.hardware.timing import graph_timings

    if device.type != "cuda":
        raise GacError("prefill attention is measured on CUDA only")
    h, kvh, d = geometry
    mod = torch.nn.Module()
    mod.num_key_value_groups, mod.is_causal = h // kvh, True
    pts = []
    for b, s in track([(b, s) for b in batches for s in seqs], "prefill attention"):
        q = torch.randn(b, h, s, d, device=device, dtype=dtype)
        k, v = (torch.randn(b, kvh, s, d, device=device, dtype=dtype) for _ in range(2))
        mask = torch.ones(s, s, dtype=torch.bool, device=device).tril().expand(b, 1, s, s).contiguous()
        est_us = 4.0 * b * h * s * s * d / 200e12 * 1e6 + 20.0
        reps = int(min(64, max(4, 2e4 // est_us)))
        call = lambda i, q=q, k=k, v=v, m=mask: sdpa_attention_forward(mod, q, k, v, m, scaling=d**-0.5)  # noqa: E731
        ts = graph_timings(call, reps, 7)
        pts.append({"batch": b, "seq": s, "us": round(ts[len(ts) // 2], 3)})
        del q, k, v, mask
        torch.cuda.empty_cache()
    return {
        "geometry": [h, kvh, d],
        "points": pts,
        "mask": "bool [B, 1, S, S] (transformers' causal mask under torch.compile before torch 2.14)",
        "fit": {
            "source": "gac profile (gac.hardware.profiler.measure_prefill_attention)",
            "method": "median time of one layer's transformers sdpa_attention_forward with a materialized causal "
            "mask, in CUDA graphs",
            "torch": torch.__version__,
        },  # fmt: skip
    }


#: the attention the latent class is timed on: (query heads, KV heads, head_dim), Llama-3-8B's
LATENT_GEOMETRY: tuple[int, int, int] = (32, 8, 128)
#: calls timed for the latent class: ``(key group size G, key rank per group, batch, KV[, value rank per group])``,
#: values grouped alike, at the key's rank where no value rank is given. Per ``G``: the rank of KV 0.5 (``G·hd/2``),
#: of KV 0.25, and one misaligned (``G·hd/2 - 8``: :meth:`gac.hardware.profile.Profile.key_rank_tile` reads the
#: kernel's key rank tile off it), each at four serving shapes: one sequence at 4k and 32k, 16 at 16k, 64 at 4k (the
#: key group sizes interleaved, so that a call cut by the time budget leaves each a row); then, at KV 0.5's bytes,
#: the keys at ``G·hd/4`` and the values at ``3·G·hd/4``, so that the rebuild's FLOPs vary apart from the bytes and
#: the fit can tell them apart (with keys and values at one rank they rise together: on an H200, keys at 128 and
#: values at 384 took 0.86-0.89x the time of 256 and 256 on Llama-3-8B from 16 sequences,
#: ``benchmarks/results/h200/palu-default/call5/ranks/``). 48 calls.
LATENT_SHAPES: tuple[tuple[int, ...], ...] = tuple(
    (g, f * g - d, b, kv)
    for f, d in ((64, 0), (32, 0), (64, 8))
    for b, kv in ((1, 4096), (1, 32768), (16, 16384), (64, 4096))
    for g in (1, 2, 4)
) + tuple(
    (g, 32 * g, b, kv, 96 * g)
    for b, kv in ((1, 4096), (1, 32768), (16, 16384), (64, 4096))
    for g in (1, 2, 4)
)


#: the geometry the latent class's ``wide`` rows are timed on: Qwen2.5-7B's (28 query heads, 4 KV heads, head_dim
#: 128), whose key group of 4 has 28 query rows, past the kernel's ``QROT_ROWS`` (the kernel runs it as programs of
#: two KV heads, :func:`gac.kernels.latent_attention.raw_program_heads`); the key-group-4
#: calls of :data:`LATENT_SHAPES` (16)
LATENT_WIDE_GEOMETRY: tuple[int, int, int] = (28, 4, 128)
LATENT_WIDE_SHAPES: tuple[tuple[int, ...], ...] = tuple(s for s in LATENT_SHAPES if s[0] == 4)


def measure_latent_attention(
    device: torch.device,
    dtype: torch.dtype,
    shapes: Iterable[tuple[int, ...]] = LATENT_SHAPES,
    budget_s: float = 60.0,
    geometry: tuple[int, int, int] = LATENT_GEOMETRY,
    bench: Callable[[Callable[[int], Any]], float] | None = None,
) -> dict[str, Any]:
    """The profile's ``latent_attention`` class on this GPU: PaLU's latent decode kernel, timed and fitted.

    Each call of ``shapes`` (:data:`LATENT_SHAPES` on :data:`LATENT_GEOMETRY`) runs the kernel the
    default decode path runs (:func:`gac.kernels.latent_attention.latent_decode_attention`: the
    split-KV kernel and its combine, at the launch its table picks) 64 times in a CUDA graph over
    latent caches rotated past L2 (:func:`gac.hardware.timing.bench_graph`); each record keeps the
    call's latent bytes, its executed key-rebuild FLOPs (every group at the kernel's padded rank tile)
    and the achieved latent GB/s and rebuild TFLOP/s. :func:`gac.hardware.latency.fit_latent_attention`
    fits them. Calls past ``budget_s`` seconds are skipped (and counted). ``{}`` without Triton.
    ``bench`` replaces the CUDA-graph timing (``bench(fn) -> µs``; tests run the kernel in Triton's
    interpreter on the CPU with it); without it the device must be CUDA.
    """
    from gac.hardware.latency import VALUES_AS_KEYS, fit_latent_attention
    from gac.hardware.timing import bench_graph, copies_past_l2
    from gac.kernels import latent_attention as kl
    from gac.testing import latent_decode_inputs

    if device.type != "cuda" and bench is None:
        raise GacError("the latent attention class is measured on CUDA only")
    if not kl.HAVE_TRITON:
        console.print("[yellow]note:[/yellow] no Triton: the profile gets no latent_attention class")
        return {}
    bench = bench or bench_graph
    heads, kvh, hd = geometry
    elem = torch.tensor([], dtype=dtype).element_size()
    shapes = list(shapes)
    recs: list[dict[str, Any]] = []
    skipped = 0
    t0 = time.time()
    for g, r, b, kv, *rest in track(shapes, "latent attention kernel: rebuild rate and latent bandwidth"):
        if time.time() - t0 > budget_s:
            skipped += 1
            continue
        rv = int(rest[0]) if rest else r
        ranks, vranks = [r] * (kvh // g), [rv] * (kvh // g)
        q, _, _, pack, inv = latent_decode_inputs(b, heads, kvh, hd, 1, g, g, ranks, vranks, dtype=dtype,
                                                  device=device)  # fmt: skip
        nbytes = b * kv * (sum(ranks) + sum(vranks)) * elem
        try:
            n = copies_past_l2(nbytes)
            zks = [torch.randn(b, kv, sum(ranks), device=device, dtype=dtype) for _ in range(n)]
            zvs = [torch.randn(b, kv, sum(vranks), device=device, dtype=dtype) for _ in range(n)]
        except torch.OutOfMemoryError:
            _free(device)
            skipped += 1
            continue
        clen = torch.tensor([kv], device=device, dtype=torch.int64)

        def call(i: int, zks=zks, zvs=zvs, q=q, pack=pack, inv=inv, clen=clen) -> Any:
            return kl.latent_decode_attention(
                q, zks[i % len(zks)], zvs[i % len(zvs)], pack, clen, inv, hd**-0.5
            )

        us = bench(call)
        launch = dict(kl.LAST_LAUNCH)
        rk = -(-int(pack["rk_max"]) // launch["block_r"]) * launch["block_r"]  # the kernel's RK tile
        flops = 2.0 * b * kv * hd * kvh * rk
        useful = 2.0 * b * kv * hd * kvh * r
        recs.append({
            "key_group": g, "rank": r, "rank_v": rv, "batch": b, "kv": kv, "us": round(us, 3), "bytes": nbytes,
            "flops": flops, "rank_run": rk, "block_r": launch["block_r"], "launch": launch,
            "gbps": round(nbytes / us / 1e3, 1), "rebuild_tflops": round(useful / us / 1e6, 2),
            "executed_tflops": round(flops / us / 1e6, 2),
        })  # fmt: skip
        del zks, zvs
        _free(device)
    fit = fit_latent_attention(recs, "gac profile (gac.hardware.profiler.measure_latent_attention)")
    fit["fit"].update(
        geometry={"heads": heads, "kv_heads": kvh, "head_dim": hd, "value_group": VALUES_AS_KEYS},
        calls=recs,
        skipped_over_budget=skipped,
        elapsed_s=round(time.time() - t0, 1),
    )
    return fit


def measure_latent_class(device: torch.device, dtype: torch.dtype, budget_s: float = 60.0) -> dict[str, Any]:
    """The profile's whole ``latent_attention`` class: :func:`measure_latent_attention` on
    :data:`LATENT_GEOMETRY` (cut off after ``budget_s`` seconds), then its ``wide`` rows on
    :data:`LATENT_WIDE_GEOMETRY` (a third of that): key groups of more query rows than the kernel's
    ``QROT_ROWS`` run otherwise (:func:`gac.kernels.latent_attention.raw_program_heads`). ``{}`` where the first
    timed nothing."""
    cls = measure_latent_attention(device, dtype, budget_s=budget_s)
    if cls:
        from gac.kernels.latent_attention import QROT_ROWS

        wide = measure_latent_attention(device, dtype, LATENT_WIDE_SHAPES, budget_s / 3, LATENT_WIDE_GEOMETRY)
        if wide:
            cls["wide"] = {**wide, "rows_over": QROT_ROWS}
    return cls


def write_latent_bench(result: dict[str, Any], out_dir: Path, dtype: str, env: dict[str, Any]) -> Path:
    """``gac bench -e latent_attention``'s files from :func:`measure_latent_class`'s ``result``:
    ``latent_attention-<dtype>.json`` (the fitted rows, every call, its ``wide`` rows' calls marked ``rows:
    wide``, the environment and the command),
    ``.csv`` (one row per call) and ``.png`` (achieved latent GB/s and key-rebuild TFLOP/s per call, by
    key group, beside the fit's prediction); each written to a temporary sibling and renamed."""
    import csv
    import io

    if not result.get("fit", {}).get("calls"):
        raise GacError("the latent attention sweep timed no call (no Triton, or every call over its budget)")
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"latent_attention-{dtype}"
    rows = []
    for part, cls in (("class", result), ("wide", result.get("wide") or {})):  # the wide rows: their own fit
        # the fit's time of each call, from the relative errors the fit kept per group (in the calls' order)
        errs = {g: iter(row["rel_err"]) for g, row in (cls.get("groups") or {}).items()}
        geo = (cls.get("fit") or {}).get("geometry") or {}
        for c in (cls.get("fit") or {}).get("calls", []):
            e = next(errs[str(c["key_group"])], None) if str(c["key_group"]) in errs and c.get("us") else None
            fit = round(c["us"] * (1 + e), 3) if e is not None else None
            rows.append({"rows": part, "heads": geo.get("heads"), "kv_heads": geo.get("kv_heads")}
                        | {k: v for k, v in c.items() if k != "launch"}
                        | {"launch": json.dumps(c["launch"], sort_keys=True), "fit_us": fit})  # fmt: skip
    doc = {"schema": "gac.bench/1", "experiment": "latent_attention", "dtype": dtype, "env": env,
           "command": shlex.join(["gac", *sys.argv[1:]]), "latent_attention": result, "records": rows}  # fmt: skip
    atomic_write_text(stem.with_suffix(".json"), json.dumps(doc, indent=1, default=float) + "\n")
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    atomic_write_text(stem.with_suffix(".csv"), buf.getvalue())
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for part, g in sorted({(c["rows"], c["key_group"]) for c in rows}):
        mine = [c for c in rows if c["key_group"] == g and c["rows"] == part]
        xs = range(len(mine))
        label = f"key group {g}" + (f", {mine[0]['heads']} query heads (wide)" if part == "wide" else "")
        axes[0].plot(xs, [c["gbps"] for c in mine], "o-" if part == "class" else "s--", label=label)
        axes[1].plot(xs, [c["rebuild_tflops"] for c in mine], "o-" if part == "class" else "s--", label=label)
    axes[0].set(title="latent bytes / time", ylabel="GB/s", xlabel="call (rank, batch, KV)")
    axes[1].set(title="useful key-rebuild FLOPs / time", ylabel="TFLOP/s", xlabel="call (rank, batch, KV)")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"PaLU latent decode kernel, {env.get('gpu', '?')} {dtype}")
    fig.tight_layout()
    atomic_savefig(fig, stem.with_suffix(".png"))
    plt.close(fig)
    return stem.with_suffix(".json")


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _flops_fn(plan: OpPlan) -> Callable[[int], float]:
    c = plan.cfg
    if plan.op == "gemm_n":
        return lambda d: 2.0 * c.m * c.k * d
    if plan.op == "gemm_k":
        return lambda d: 2.0 * c.m * c.n * d
    if plan.op == "gemv":
        return lambda d: 2.0 * c.gemv_k * d
    if plan.op == "sdpa_head_dim":
        return lambda d: 4.0 * c.batch * c.heads * c.seq * c.seq * d
    return lambda d: 4.0 * c.lowrank_m * c.lowrank_d * d


def plot_profile(profile: Profile, path: Path) -> None:
    """One PNG: each op's curve (ms per unit dim), multiples of the modulus marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = [o for o in OPS if o in profile.ops]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.6 * len(ops), 3.6), squeeze=False)
    for ax, op in zip(axes.flat, ops, strict=False):
        r = profile.ops[op]
        dims, ms = r.curve.get("dims", []), r.curve.get("ms", [])
        wins = r.curve.get("window", [0] * len(dims))
        spans = r.curve.get("windows") or []
        refined = {tuple(x) for x in r.curve.get("refined_windows", [])}
        for w in sorted(set(wins)):
            xs = [d for d, wi in zip(dims, wins, strict=True) if wi == w]
            ys = [t for t, wi in zip(ms, wins, strict=True) if wi == w]
            is_refined = w < len(spans) and tuple(spans[w]) in refined
            ax.plot(xs, ys, "-", linewidth=1.2 if is_refined else 0.8, color="C2" if is_refined else "C0",
                    label="refined (gac profile --refine)" if is_refined else None)  # fmt: skip
            al = [(x, y) for x, y in zip(xs, ys, strict=True) if x % r.modulus == 0]
            if al:
                ax.scatter(*zip(*al, strict=True), s=12, color="C3", zorder=3)
        extra = set(r.curve.get("refined_dims") or [])
        if extra:  # points added by ``gac profile --refine``
            pts = [(x, y) for x, y in zip(dims, ms, strict=True) if x in extra]
            ax.scatter(*zip(*pts, strict=True), s=14, marker="x", color="C2", zorder=4, label="--refine")
            ax.legend(fontsize=7)
        ax.set_title(f"{op}: modulus {r.modulus}, prefer {r.prefer}", fontsize=9)
        ax.set_xlabel(f"dim (red: multiples of {r.modulus})")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if r.curve.get("refined_windows"):
            ax.legend(fontsize=7)
    fig.suptitle(profile.label, fontsize=9)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def write_profile_outputs(profile: Profile, out: Path, results_dir: Path | None) -> None:
    """Save the profile; record its timing, a copy and a plot under ``results_dir``."""
    profile.save(out)
    if results_dir is None:
        return
    quick = bool(profile.env.get("profile_quick"))
    stem = f"profile-{profile.dtype}{'-quick' if quick else ''}"
    profile.save(results_dir / f"{stem}.json")
    timing = {
        "profile_id": profile.id,
        "gpu": profile.env.get("gpu"),
        "dtype": profile.dtype,
        "quick": quick,
        "elapsed_s": profile.env.get("profile_elapsed_s"),
        "command": profile.env.get("command"),
        "torch": profile.env.get("torch"),
        "timestamp": profile.env.get("timestamp"),
    }
    atomic_write_text(results_dir / f"{stem}-timing.json", json.dumps(timing, indent=1))
    plot_profile(profile, results_dir / f"{stem}.png")
    console.print(f"[green]wrote[/] {results_dir / stem}.{{json,png,jsonl}} and {stem}-timing.json")


def redistil(profile: Profile, tolerance: float | None = None, lookahead: int | None = None) -> Profile:
    """Re-derive every rule of a measured profile from its stored curves (no measuring).

    Distillation is deterministic, so this reproduces :func:`build_profile`'s rules for
    the same curves; use it after a change of the distillation method or tolerance.
    """
    ops: dict[str, OpRule] = {}
    for op, r in profile.ops.items():
        c = r.curve
        if not c.get("dims"):
            ops[op] = r
            continue
        tol = r.tolerance if tolerance is None else tolerance
        la = int(c.get("lookahead", 64)) if lookahead is None else lookahead
        rule = discover_rule(
            Curve(list(c["dims"]), list(c["ms"]), list(c.get("window") or [0] * len(c["dims"]))),
            tolerance=tol,
            lookahead=la,
        )
        curve = dict(c)
        curve.update(efficiency=rule["efficiency"], rule_evidence=rule["rule_evidence"], lookahead=la)
        ops[op] = OpRule(
            modulus=rule["modulus"],
            prefer=rule["prefer"],
            tolerance=tol,
            class_efficiency=rule["class_efficiency"],
            curve=curve,
            cliffs=rule["cliffs"],
        )
    return Profile(
        id=profile.id,
        ops=ops,
        measured=profile.measured,
        label=profile.label,
        dtype=profile.dtype,
        env=dict(profile.env),
        schema=profile.schema,
        launch_us=profile.launch_us,
        copy_gbps=profile.copy_gbps,
        aux_us=profile.aux_us,
        latency_fit=dict(profile.latency_fit),
        fused_lowrank=dict(profile.fused_lowrank),
        latent_attention=dict(profile.latent_attention),
    )
