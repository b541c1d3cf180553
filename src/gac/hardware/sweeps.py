"""The named shape experiments behind ``gac bench`` (and the sweeps behind ``gac profile``).

=================  ===========================================================================
name               what it measures
=================  ===========================================================================
``sdpa_sweep``     SDPA latency over head_dim (AUTO backend), recording the backend chosen
``sdpa_backend``   the same at chosen dims for each backend (flash, efficient, cudnn, math)
``gemm_projection`` ``F.linear`` sweeps of N, K and M at stride 1 around LLM sizes, TFLOP/s
``gemv``           the same at M=1 (decode): N and K sweeps, GB/s
``lowrank``        x -> r -> d factorized pairs over the inner rank r
``padding_rescue`` misaligned logical dims padded to the next multiple of 8/16/32/64:
                   latency against memory overhead
``repair_kernels`` SDPA at logical head_dims {107,114,117,120,121,125}: original vs minimal
                   (multiple of 8) vs optimal (multiple of 16) repair; GEMM K=107 likewise
``latent_attention`` PaLU's latent decode kernel (CUDA): latent GB/s and key-rebuild TFLOP/s per call,
                   the profile's ``latent_attention`` class (run by ``gac bench`` through
                   :func:`gac.hardware.profiler.measure_latent_attention`, not here)
``all``            all of the above
=================  ===========================================================================

Which backend AUTO chose: PyTorch's own dispatcher function ``torch._fused_sdp_choice``
is called on the very tensors that are timed; it returns the backend that
``scaled_dot_product_attention`` dispatches to under the current global switches.  Each
point also records which backends are *eligible* (each one run alone under
``torch.nn.attention.sdpa_kernel``; a refusal is kept with PyTorch's reason).

Every point is one JSON line appended (and flushed) to ``<name>-<dtype>.jsonl`` as soon as it
is measured, so an interrupted run keeps what it measured; ``resume=True`` skips points
already there.  At the end of an experiment the full record (with the environment and the
command line) is written as JSON, the points as CSV, the staircase plot as PNG, and a short
table is printed.  A point that cannot run (a backend refusing a shape, out of memory, a
dtype the kernel lacks) becomes a recorded cell with status ``unsupported``/``oom``/``error``
and its reason, never a crash.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from gac.alignment import pow2_class, round_up
from gac.errors import GacError
from gac.guard import atomic_savefig
from gac.hardware.timing import (
    bench,
    dtype_name,
    environment,
    gpu_slug,
    resolve_device,
    resolve_dtype,
    rotation_sets,
)
from gac.utils import atomic_write_text, console, progress

SCHEMA = "gac.bench/1"
EXPERIMENTS: tuple[str, ...] = (
    "sdpa_sweep",
    "sdpa_backend",
    "gemm_projection",
    "gemv",
    "lowrank",
    "padding_rescue",
    "repair_kernels",
)
#: experiments ``gac bench`` runs outside this module (they time gac's own kernels, which sit above it)
KERNEL_EXPERIMENTS: tuple[str, ...] = ("latent_attention",)
SDPA_BACKENDS: tuple[str, ...] = ("flash", "efficient", "cudnn", "math")


def unknown_experiment(name: str) -> GacError:
    """The one-line error for an experiment ``gac bench`` does not know."""
    known = ", ".join((*EXPERIMENTS, *KERNEL_EXPERIMENTS, "all"))
    return GacError(f"unknown experiment {name!r}; choose one of: {known}")


_BACKEND_ENUM = {
    "flash": "FLASH_ATTENTION",
    "efficient": "EFFICIENT_ATTENTION",
    "cudnn": "CUDNN_ATTENTION",
    "math": "MATH",
}


def align_label(d: int) -> str:
    """Alignment class of a dim as a label: ``odd``, ``%2``, ``%4`` ... ``%128``.

    >>> align_label(107), align_label(112), align_label(1024)
    ('odd', '%16', '%128')
    """
    c = pow2_class(d)
    return "odd" if c == 1 else f"%{c}"


def parse_dims(spec: str) -> list[int]:
    """Parse ``"64:256"``, ``"64:256:8"``, ``"107,112,128"`` or a mix (``"64:72,107"``).

    Ranges are inclusive.

    >>> parse_dims("1,3:5,10:20:5")
    [1, 3, 4, 5, 10, 15, 20]
    """
    out: list[int] = []
    try:
        for part in str(spec).split(","):
            part = part.strip()
            if not part:
                continue
            if ":" in part:
                bits = [int(x) for x in part.split(":")]
                if len(bits) not in (2, 3):
                    raise ValueError(part)
                lo, hi = bits[0], bits[1]
                step = bits[2] if len(bits) == 3 else 1
                if step <= 0 or hi < lo:
                    raise ValueError(part)
                out.extend(range(lo, hi + 1, step))
            else:
                out.append(int(part))
    except ValueError:
        raise GacError(f"bad dims {spec!r}: use e.g. '64:256', '64:256:8' or '107,112,128'") from None
    if not out or min(out) < 1:
        raise GacError(f"bad dims {spec!r}: need at least one positive dim")
    return sorted(set(out))


@dataclass
class Config:
    """Sizes of the experiments.  :meth:`gpu` is the default on CUDA, :meth:`cpu` on CPU."""

    batch: int = 4
    seq: int = 2048
    heads: int = 32
    head_dims: list[int] = field(default_factory=lambda: list(range(64, 257)))
    backend_dims: list[int] = field(
        default_factory=lambda: [64, 96, 104, 107, 112, 113, 120, 121, 125, 128, 160, 256]
    )
    m: int = 8192
    k: int = 4096
    n: int = 4096
    centers: list[int] = field(default_factory=lambda: [1024, 4096])
    half_window: int = 24
    gemv_k: int = 4096
    lowrank_m: int = 4096
    lowrank_d: int = 4096
    lowrank_centers: list[int] = field(default_factory=lambda: [1024, 2048])
    rescue_cases: list[tuple[str, int]] = field(
        default_factory=lambda: [
            ("sdpa_head_dim", 107),
            ("sdpa_head_dim", 121),
            ("gemm_n", 1001),
            ("gemm_k", 1001),
            ("gemv", 1037),
            ("lowrank_r", 1003),
        ]
    )
    rescue_moduli: list[int] = field(default_factory=lambda: [8, 16, 32, 64])
    repair_head_dims: list[int] = field(default_factory=lambda: [107, 114, 117, 120, 121, 125])
    repair_gemm_k: int = 107
    repair_gemm_mn: int = 8192
    dims: list[int] | None = None  # explicit override of every swept dim list
    warmup_ms: float = 25.0
    rep_ms: float = 80.0
    min_reps: int = 5
    max_reps: int = 1000

    @classmethod
    def gpu(cls) -> Config:
        return cls()

    @classmethod
    def cpu(cls) -> Config:
        """Tiny sizes that run in seconds on a CPU (labelled CPU in every output)."""
        return cls(
            batch=1,
            seq=64,
            heads=2,
            head_dims=list(range(16, 41)),
            backend_dims=[16, 20, 21, 24, 32],
            m=64,
            k=128,
            n=128,
            centers=[64],
            half_window=6,
            gemv_k=256,
            lowrank_m=32,
            lowrank_d=128,
            lowrank_centers=[32],
            rescue_cases=[
                ("sdpa_head_dim", 21),
                ("gemm_n", 61),
                ("gemm_k", 61),
                ("gemv", 61),
                ("lowrank_r", 29),
            ],
            repair_head_dims=[107, 114, 117, 120, 121, 125],
            repair_gemm_k=107,
            repair_gemm_mn=64,
            warmup_ms=2.0,
            rep_ms=6.0,
            min_reps=3,
            max_reps=20,
        )

    @classmethod
    def default_for(cls, device: torch.device) -> Config:
        return cls.gpu() if device.type == "cuda" else cls.cpu()

    def window(self, center: int) -> list[int]:
        if self.dims is not None:
            return list(self.dims)
        return list(range(max(1, center - self.half_window), center + self.half_window + 1))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# --------------------------------------------------------------------------- points
def _pt(
    experiment: str, op: str, group: str, series: str, dim: int, kind: str, **shape: Any
) -> dict[str, Any]:
    return {
        "experiment": experiment,
        "op": op,
        "group": group,
        "series": series,
        "dim": int(dim),
        "align": align_label(int(dim)),
        "kind": kind,
        **shape,
    }


def _sdpa_pt(exp: str, cfg: Config, dim: int, series: str, op: str = "sdpa_head_dim", **extra: Any) -> dict:
    group = extra.pop("group", f"B{cfg.batch} S{cfg.seq} H{cfg.heads}")
    return _pt(exp, op, group, series, dim, "sdpa", B=cfg.batch, H=cfg.heads, S=cfg.seq, D=dim, **extra)


def op_point(
    exp: str, cfg: Config, op: str, dim: int, series: str, group: str | None = None, **extra: Any
) -> dict:
    """A point of operator class ``op`` with its swept dim set to ``dim``."""
    if op == "sdpa_head_dim":
        return _sdpa_pt(
            exp, cfg, dim, series, group=group or f"B{cfg.batch} S{cfg.seq} H{cfg.heads}", **extra
        )
    if op == "gemm_n":
        g = group or f"N (M={cfg.m}, K={cfg.k})"
        return _pt(exp, op, g, series, dim, "linear", M=cfg.m, K=cfg.k, N=dim, **extra)
    if op == "gemm_k":
        g = group or f"K (M={cfg.m}, N={cfg.n})"
        return _pt(exp, op, g, series, dim, "linear", M=cfg.m, K=dim, N=cfg.n, **extra)
    if op == "gemm_m":
        g = group or f"M (K={cfg.k}, N={cfg.n})"
        return _pt(exp, op, g, series, dim, "linear", M=dim, K=cfg.k, N=cfg.n, **extra)
    if op in ("gemv", "gemv_n"):
        g = group or f"N (M=1, K={cfg.gemv_k})"
        return _pt(exp, "gemv", g, series, dim, "linear", M=1, K=cfg.gemv_k, N=dim, **extra)
    if op == "gemv_k":
        g = group or f"K (M=1, N={cfg.gemv_k})"
        return _pt(exp, op, g, series, dim, "linear", M=1, K=dim, N=cfg.gemv_k, **extra)
    if op == "lowrank_r":
        g = group or f"r (M={cfg.lowrank_m}, d={cfg.lowrank_d})"
        return _pt(exp, op, g, series, dim, "lowrank", M=cfg.lowrank_m, D=cfg.lowrank_d, R=dim, **extra)
    raise GacError(f"unknown operator class {op!r}")


def points_for(name: str, cfg: Config) -> list[dict[str, Any]]:
    """The measurement points of one experiment (no measuring)."""
    pts: list[dict[str, Any]] = []
    if name == "sdpa_sweep":
        for d in cfg.dims or cfg.head_dims:
            pts.append(_sdpa_pt(name, cfg, d, "auto", backend="auto"))
    elif name == "sdpa_backend":
        for d in cfg.dims or cfg.backend_dims:
            for be in SDPA_BACKENDS:
                pts.append(_sdpa_pt(name, cfg, d, be, backend=be))
    elif name == "gemm_projection":
        for op in ("gemm_n", "gemm_k", "gemm_m"):
            for c in cfg.centers if cfg.dims is None else [0]:
                letter = op[-1].upper()
                for d in cfg.window(c):
                    grp = f"{letter}~{c}" if cfg.dims is None else letter
                    p = op_point(name, cfg, op, d, "linear")
                    p["group"] = f"{grp} " + p["group"].split(" ", 1)[1]
                    pts.append(p)
    elif name == "gemv":
        for op in ("gemv_n", "gemv_k"):
            for c in cfg.centers if cfg.dims is None else [0]:
                for d in cfg.window(c):
                    p = op_point(name, cfg, op, d, "M=1")
                    p["group"] = (f"~{c} " if cfg.dims is None else "") + p["group"]
                    pts.append(p)
    elif name == "lowrank":
        for c in cfg.lowrank_centers if cfg.dims is None else [0]:
            for d in cfg.window(c):
                p = op_point(name, cfg, "lowrank_r", d, "x->r->d")
                p["group"] = (f"~{c} " if cfg.dims is None else "") + p["group"]
                pts.append(p)
    elif name == "padding_rescue":
        cases = (
            cfg.rescue_cases
            if cfg.dims is None
            else [(op, d) for op, _ in cfg.rescue_cases for d in cfg.dims]
        )
        for op, logical in cases:
            grp = f"{op} {logical}"
            variants = [("original", logical)] + [
                (f"pad{m}", round_up(logical, m)) for m in cfg.rescue_moduli
            ]
            for var, d in variants:
                pts.append(
                    op_point(
                        name,
                        cfg,
                        op,
                        d,
                        var,
                        group=grp,
                        variant=var,
                        logical_dim=logical,
                        mem_overhead_pct=round(100.0 * (d - logical) / logical, 3),
                    )
                )
    elif name == "repair_kernels":
        for logical in cfg.dims or cfg.repair_head_dims:
            for var, d in (
                ("original", logical),
                ("minimal", round_up(logical, 8)),
                ("optimal", round_up(logical, 16)),
            ):
                pts.append(
                    _sdpa_pt(
                        name,
                        cfg,
                        d,
                        var,
                        group=f"sdpa head_dim {logical}",
                        variant=var,
                        logical_dim=logical,
                        backend="auto",
                        scale=1.0 / math.sqrt(logical),
                        mem_overhead_pct=round(100.0 * (d - logical) / logical, 3),
                    )
                )
        k = cfg.repair_gemm_k
        mn = cfg.repair_gemm_mn
        for var, d in (("original", k), ("minimal", round_up(k, 8)), ("optimal", round_up(k, 16))):
            pts.append(
                _pt(
                    name,
                    "gemm_k",
                    f"gemm K {k} (M=N={mn})",
                    var,
                    d,
                    "linear",
                    M=mn,
                    K=d,
                    N=mn,
                    variant=var,
                    logical_dim=k,
                    mem_overhead_pct=round(100.0 * (d - k) / k, 3),
                )
            )
    else:
        raise unknown_experiment(name)
    return pts


def point_key(p: dict[str, Any]) -> str:
    """Identity of a point inside one experiment (used to resume)."""
    return "|".join(str(p.get(k)) for k in ("op", "group", "series", "dim", "variant"))


def _shape_key(p: dict[str, Any]) -> str:
    keys = ("kind", "B", "H", "S", "D", "M", "K", "N", "R", "backend", "scale")
    return "|".join(str(p.get(k)) for k in keys)


# --------------------------------------------------------------------------- measuring
def _first_line(msg: str) -> str:
    lines = [x.strip() for x in str(msg).strip().splitlines() if x.strip()]
    return lines[0] if lines else "unknown reason"


def _warning_reasons(caught: Iterable[warnings.WarningMessage]) -> str:
    out = []
    for w in caught:
        s = _first_line(str(w.message))
        if s and s not in out:
            out.append(s)
    return "; ".join(out)[:400]


def _sdpa_backend_enum(name: str):
    from torch.nn.attention import SDPBackend

    return getattr(SDPBackend, _BACKEND_ENUM[name])


def _auto_choice(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None) -> str | None:
    """The backend ``scaled_dot_product_attention`` dispatches to for these tensors (AUTO)."""
    fn = getattr(torch, "_fused_sdp_choice", None)
    if fn is None:
        return None
    try:
        from torch.nn.attention import SDPBackend

        idx = fn(q, k, v, None, 0.0, False, scale=scale)
        name = SDPBackend(int(idx)).name
    except Exception:  # noqa: BLE001 - introspection only; the timing still stands
        return None
    inv = {v: k for k, v in _BACKEND_ENUM.items()}
    return inv.get(name, name.lower())


def _eligible(q, k, v, scale: float | None) -> tuple[list[str], dict[str, str]]:
    """Backends that accept these tensors when forced alone, and the refusals' reasons."""
    from torch.nn.attention import sdpa_kernel

    ok: list[str] = []
    refused: dict[str, str] = {}
    for be in ("flash", "efficient", "cudnn"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with sdpa_kernel([_sdpa_backend_enum(be)]):
                    F.scaled_dot_product_attention(q, k, v, scale=scale)
                ok.append(be)
            except RuntimeError as e:
                refused[be] = _warning_reasons(caught) or _first_line(str(e))
    ok.append("math")
    return ok, refused


def _randn(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    # Never time on zeros: random normal inputs (scaled to keep fp16 finite).
    return torch.randn(shape, device=device, dtype=dtype) * 0.5


class _Unsupported(Exception):
    """A forced SDPA backend refused the point's shape (the reason names why)."""


def measure_point(p: dict[str, Any], device: torch.device, dtype: torch.dtype, cfg: Config) -> dict[str, Any]:
    """Measure one point; returns the result fields (``status`` plus timing or a reason)."""
    kind = p["kind"]
    esize = torch.empty((), dtype=dtype).element_size()
    timing_kw = {
        "warmup_ms": cfg.warmup_ms,
        "rep_ms": cfg.rep_ms,
        "min_reps": cfg.min_reps,
        "max_reps": cfg.max_reps,
    }
    res: dict[str, Any] = {}
    tensors: list[Any] = []
    try:
        if kind not in _TIMERS:
            raise GacError(f"unknown point kind {kind!r}")
        t, n_sets, flops, moved = _TIMERS[kind](p, device, dtype, esize, timing_kw, tensors, res)
        res.update(status="ok", n_sets=n_sets, **t.to_dict())
        res["tflops"] = flops / (t.median_ms * 1e-3) / 1e12 if t.median_ms > 0 else None
        res["gbps"] = moved / (t.median_ms * 1e-3) / 1e9 if t.median_ms > 0 else None
        return res
    except _Unsupported as e:
        return {"status": "unsupported", "reason": str(e)}
    except torch.cuda.OutOfMemoryError as e:
        return {"status": "oom", "reason": _first_line(str(e))[:300]}
    except (RuntimeError, NotImplementedError, ValueError, TypeError) as e:
        msg = _first_line(str(e))[:300]
        low = msg.lower()
        unsupported = ("not implemented", "not supported", "no available kernel", "unsupported")
        return {"status": "unsupported" if any(s in low for s in unsupported) else "error", "reason": msg}
    finally:
        tensors.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def _time_sdpa(p, device, dtype, esize, timing_kw, tensors, res) -> tuple[Any, int, float, int]:
    """Time SDPA at ``p``'s ``B, H, S, D`` (``backend``: ``auto``, recording its choice, or one forced)."""
    B, H, S, D = p["B"], p["H"], p["S"], p["D"]
    scale = p.get("scale")
    set_bytes = 4 * B * H * S * D * esize
    n_sets = rotation_sets(set_bytes, device)
    sets = [tuple(_randn((B, H, S, D), device, dtype) for _ in range(3)) for _ in range(n_sets)]
    tensors.append(sets)
    q, k, v = sets[0]
    backend = p.get("backend", "auto")
    if backend == "auto":
        res["auto_backend"] = _auto_choice(q, k, v, scale)
        res["eligible"], refused = _eligible(q, k, v, scale)
        if refused:
            res["refused"] = refused

        def fn(i: int) -> None:
            a, b, c = sets[i % n_sets]
            F.scaled_dot_product_attention(a, b, c, scale=scale)

        return bench(fn, device, **timing_kw), n_sets, 4.0 * B * H * S * S * D, 4 * B * H * S * D * esize
    from torch.nn.attention import sdpa_kernel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([_sdpa_backend_enum(backend)]):
                F.scaled_dot_product_attention(q, k, v, scale=scale)
        except RuntimeError as e:
            if isinstance(e, torch.cuda.OutOfMemoryError):
                raise
            raise _Unsupported(_warning_reasons(caught) or _first_line(str(e))) from None

    def forced(i: int) -> None:
        a, b, c = sets[i % n_sets]
        with sdpa_kernel([_sdpa_backend_enum(backend)]):
            F.scaled_dot_product_attention(a, b, c, scale=scale)

    return bench(forced, device, **timing_kw), n_sets, 4.0 * B * H * S * S * D, 4 * B * H * S * D * esize


def _time_linear(p, device, dtype, esize, timing_kw, tensors, res) -> tuple[Any, int, float, int]:
    """Time ``F.linear`` of ``[M, K]`` by ``[N, K]``."""
    M, K, N = p["M"], p["K"], p["N"]
    set_bytes = (M * K + N * K + M * N) * esize
    n_sets = rotation_sets(set_bytes, device)
    sets = [(_randn((M, K), device, dtype), _randn((N, K), device, dtype)) for _ in range(n_sets)]
    tensors.append(sets)

    def fn(i: int) -> None:
        x, w = sets[i % n_sets]
        F.linear(x, w)

    return bench(fn, device, **timing_kw), n_sets, 2.0 * M * N * K, set_bytes


def _time_lowrank(p, device, dtype, esize, timing_kw, tensors, res) -> tuple[Any, int, float, int]:
    """Time the low-rank pair ``x [M, D] -> [M, R] -> [M, D]``."""
    M, D, R = p["M"], p["D"], p["R"]
    set_bytes = (M * D + R * D + D * R + M * R + M * D) * esize
    n_sets = rotation_sets(set_bytes, device)
    sets = [
        (_randn((M, D), device, dtype), _randn((R, D), device, dtype), _randn((D, R), device, dtype))
        for _ in range(n_sets)
    ]
    tensors.append(sets)

    def fn(i: int) -> None:
        x, v_, u_ = sets[i % n_sets]
        F.linear(F.linear(x, v_), u_)

    return bench(fn, device, **timing_kw), n_sets, 4.0 * M * D * R, set_bytes


#: how :func:`measure_point` times each point kind
_TIMERS = {"sdpa": _time_sdpa, "linear": _time_linear, "lowrank": _time_lowrank}


# --------------------------------------------------------------------------- outputs
def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by an interruption
        if rec.get("type") == "point":
            out.append(rec)
    return out


def append_jsonl(f: io.TextIOBase, rec: dict[str, Any]) -> None:
    f.write(json.dumps(rec) + "\n")
    f.flush()
    os.fsync(f.fileno())


def write_csv(path: Path, records: list[dict[str, Any]]) -> None:
    """Write records as CSV (union of keys, nested values as JSON), atomically."""
    keys: list[str] = []
    for r in records:
        for k in r:
            if k not in keys and k != "type":
                keys.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    for r in records:
        w.writerow(
            {k: (json.dumps(v) if isinstance(v, dict | list) else v) for k, v in r.items() if k != "type"}
        )
    atomic_write_text(path, buf.getvalue())


def plot_staircase(path: Path, name: str, records: list[dict[str, Any]], title: str) -> None:
    """One PNG: latency against dim per group (subplot) and series (line); %8 points marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(r["group"], []).append(r)
    n = max(1, len(groups))
    cols = min(3, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.6 * rows), squeeze=False)
    for ax, (g, recs) in zip(axes.flat, groups.items(), strict=False):
        series: dict[str, list[dict[str, Any]]] = {}
        for r in recs:
            series.setdefault(r["series"], []).append(r)
        bar_like = name in ("padding_rescue", "repair_kernels")
        for si, (s, rs) in enumerate(series.items()):
            ok = sorted((r for r in rs if r.get("status") == "ok"), key=lambda r: r["dim"])
            bad = [r for r in rs if r.get("status") != "ok"]
            if bar_like:
                xs = [r["dim"] for r in ok]
                ax.bar([si], [r["median_ms"] for r in ok][:1] or [0], label=f"{s} ({xs[0] if xs else '-'})")
                continue
            xs = [r["dim"] for r in ok]
            ys = [r["median_ms"] for r in ok]
            (line,) = ax.step(xs, ys, where="mid", label=s, linewidth=1.0)
            al = [(x, y) for x, y in zip(xs, ys, strict=True) if x % 8 == 0]
            if al:
                ax.scatter(*zip(*al, strict=True), s=14, color=line.get_color(), marker="o", zorder=3)
            for r in bad:
                ax.axvline(r["dim"], color="grey", alpha=0.25, linewidth=0.8)
        if bar_like:
            ax.set_xticks(range(len(series)))
            ax.set_xticklabels(list(series), fontsize=8)
            ax.set_ylabel("ms")
        else:
            ax.set_xlabel("dim (dots: multiples of 8; grey: unsupported)")
            ax.set_ylabel("ms (median)")
        ax.set_title(g, fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    atomic_savefig(fig, path, dpi=110)
    plt.close(fig)


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


def summarize(name: str, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Short per-group summary rows (also stored in the JSON)."""
    rows: list[dict[str, Any]] = []
    if name in ("padding_rescue", "repair_kernels"):
        for r in records:
            rows.append(
                {
                    "group": r["group"],
                    "variant": r.get("variant"),
                    "dim": r["dim"],
                    "status": r.get("status"),
                    "ms": r.get("median_ms"),
                    "speedup": r.get("speedup"),
                    "mem_overhead_pct": r.get("mem_overhead_pct"),
                    "backend": r.get("auto_backend"),
                }
            )
        return rows
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["group"], r["series"]), []).append(r)
    for (g, s), rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        al = [r["median_ms"] / r["dim"] for r in ok if r["dim"] % 8 == 0]
        mis = [r["median_ms"] / r["dim"] for r in ok if r["dim"] % 8 != 0]
        ma, mm = _median(al), _median(mis)
        backends = sorted({str(r.get("auto_backend")) for r in ok if r.get("auto_backend")})
        rows.append(
            {
                "group": g,
                "series": s,
                "points": len(rs),
                "ok": len(ok),
                "best_tflops": max((r["tflops"] for r in ok if r.get("tflops")), default=None),
                "ms_per_dim_aligned8": ma,
                "ms_per_dim_misaligned": mm,
                "misaligned_slowdown": (mm / ma) if (ma and mm) else None,
                "auto_backends": backends or None,
            }
        )
    return rows


def _print_table(name: str, rows: list[dict[str, Any]], env: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{name} on {env.get('gpu')} ({env.get('dtype')})", title_style="bold")
    if not rows:
        Console().print(t)
        return
    if name in ("padding_rescue", "repair_kernels"):
        cols = ["group", "variant", "dim", "status", "ms", "speedup", "mem_overhead_pct", "backend"]
    else:
        cols = ["group", "series", "ok", "best_tflops", "misaligned_slowdown", "auto_backends"]
    for c in cols:
        t.add_column(c)
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if c == "ok":
                v = f"{r['ok']}/{r['points']}"
            cells.append(f"{v:.3f}" if isinstance(v, float) else ("-" if v is None else str(v)))
        t.add_row(*cells)
    Console(width=160).print(t)


def _postprocess(name: str, records: list[dict[str, Any]]) -> None:
    """Speed-ups against the original variant (padding_rescue, repair_kernels)."""
    if name not in ("padding_rescue", "repair_kernels"):
        return
    base = {
        r["group"]: r.get("median_ms")
        for r in records
        if r.get("variant") == "original" and r.get("status") == "ok"
    }
    for r in records:
        b = base.get(r["group"])
        r["speedup"] = (
            (b / r["median_ms"]) if (b and r.get("status") == "ok" and r.get("median_ms")) else None
        )


# --------------------------------------------------------------------------- runner
def default_out_dir(device: torch.device) -> Path:
    """``benchmarks/results/<gpu slug>/`` under the current directory."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    return Path("benchmarks") / "results" / gpu_slug(name)


def _run_points(
    pts: list[dict[str, Any]],
    jsonl: Path,
    resume: bool,
    meta: dict[str, Any],
    measure: Callable[[dict[str, Any]], dict[str, Any]],
    title: str,
) -> list[dict[str, Any]]:
    """Measure each point, appending its record to ``jsonl`` as it comes (``meta`` first in a new file).

    With ``resume``, the points already in ``jsonl`` are kept, not measured; points of one shape
    (:func:`_shape_key`) are measured once and the record marked ``reused_measurement``.
    """
    done = {point_key(r): r for r in _read_jsonl(jsonl)} if resume else {}
    mode = "a" if resume and jsonl.exists() else "w"
    cache: dict[str, dict[str, Any]] = {}
    records: list[dict[str, Any]] = []
    with open(jsonl, mode) as f, progress() as bar:
        if mode == "w":
            append_jsonl(f, meta)
        task = bar.add_task(title, total=len(pts))
        for p in pts:
            key = point_key(p)
            if key in done:
                records.append(done[key])
                bar.advance(task)
                continue
            sk = _shape_key(p)
            if sk in cache:
                res = {k: v for k, v in cache[sk].items()}
                res["reused_measurement"] = True
            else:
                res = measure(p)
                cache[sk] = res
            rec = {"type": "point", **p, **res}
            append_jsonl(f, rec)
            records.append(rec)
            bar.advance(task)
    return records


def run_experiment(
    name: str,
    *,
    dtype: str = "bfloat16",
    out: str | Path | None = None,
    config: Config | None = None,
    device: str | torch.device | None = None,
    resume: bool = False,
    command: str | None = None,
    show: bool = True,
    measure: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run one named experiment (or ``"all"``) and write JSON, CSV, PNG and JSONL.

    Args:
        name: an experiment of :data:`EXPERIMENTS`, or ``"all"``.
        dtype: ``float16``, ``bfloat16`` (or ``float32``).
        out: output directory (default ``benchmarks/results/<gpu>/``).
        config: sizes (default: :meth:`Config.default_for` the device).
        device: ``cuda``/``cpu``/None (auto).
        resume: keep and skip points already in the experiment's JSONL.
        command: the command line to record (default: ``sys.argv``).
        show: print the console table.
        measure: replaces the real measurement (tests).

    Returns:
        The full record (for ``all``: ``{"experiments": {name: record}}``).
    """
    if name != "all" and name not in EXPERIMENTS:
        raise unknown_experiment(name)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    cfg = config or Config.default_for(dev)
    out_dir = Path(out) if out is not None else default_out_dir(dev)
    command = command or " ".join(shlex.quote(a) for a in sys.argv)
    if name == "all":
        kw = dict(
            dtype=dtype, config=cfg, device=dev, resume=resume, command=command, show=show, measure=measure
        )
        return {"experiments": {n: run_experiment(n, out=out_dir, **kw) for n in EXPERIMENTS}}
    dname = dtype_name(dt)
    env = environment(dev, dt)
    stem = f"{name}-{dname}"
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    meta = {"type": "meta", "experiment": name, "dtype": dname, "env": env, "command": command}
    records = _run_points(
        points_for(name, cfg),
        out_dir / f"{stem}.jsonl",
        resume,
        {**meta, "config": cfg.to_dict()},
        lambda p: measure(p) if measure is not None else measure_point(p, dev, dt, cfg),
        f"{name} ({env['gpu']}, {dname})",
    )
    _postprocess(name, records)
    rows = summarize(name, records)
    full = {
        "schema": SCHEMA,
        "experiment": name,
        "dtype": dname,
        "device_label": env["gpu"],
        "env": env,
        "command": command,
        "config": cfg.to_dict(),
        "elapsed_s": round(time.time() - t_start, 3),
        "summary": rows,
        "records": [{k: v for k, v in r.items() if k != "type"} for r in records],
    }
    atomic_write_text(out_dir / f"{stem}.json", json.dumps(full, indent=1))
    write_csv(out_dir / f"{stem}.csv", full["records"])
    plot_staircase(
        out_dir / f"{stem}.png", name, records, f"{name} - {env['gpu']} - {dname} - torch {env['torch']}"
    )
    if show:
        _print_table(name, rows, env)
    console.print(f"[green]wrote[/] {out_dir / stem}.{{json,csv,png,jsonl}}")
    return full
