"""Timing harness: device events on CUDA, wall clock on CPU, median and IQR over trials.

Every measurement in gac goes through :func:`bench`.  On a CUDA device each call of the
timed function is bracketed by its own pair of CUDA events, so the statistics are over
device time per call (launch gaps included, host overhead hidden by the asynchronous
queue).  Before timing, the function is warmed up (module load, cuBLAS heuristics,
autotuning, handle creation) for ``warmup_ms``; the number of timed repetitions then
follows from the per-call estimate so that each point costs about ``rep_ms``.

Inputs that fit in L2 would be timed hot: callers pass ``n_sets`` input sets (see
:func:`rotation_sets`) and the timed function receives the call index, so it can rotate
among them.  On CPU the harness falls back to ``time.perf_counter`` around each call and
every record is labelled ``"CPU"``.

The kernels' dispatch measurements (and ``gac profile``'s launch constants) time a call 64 times
captured in one CUDA graph over weight copies rotated past L2 (:func:`bench_graph`,
:func:`copies_past_l2`): what a launch costs inside a captured decode step.
"""

from __future__ import annotations

import math
import os
import platform
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from gac.errors import GacError


@dataclass
class Timing:
    """Statistics of one timed point (milliseconds per call)."""

    median_ms: float
    iqr_ms: float
    q25_ms: float
    q75_ms: float
    min_ms: float
    reps: int
    method: str  # "cuda_events" or "wall_clock"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """The device to measure on: ``cuda`` when available (or asked for), else ``cpu``."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str):
        from gac.guard import parse_device

        device = parse_device(device)  # "tpu", "cuda:x": one line, not torch's RuntimeError
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise GacError("--device cuda asked for, but no CUDA device is available")
    if dev.type not in ("cuda", "cpu"):
        raise GacError(f"unsupported device {str(device)!r}; use cuda or cpu")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Map a dtype name to a torch dtype (:func:`gac.utils.parse_dtype`), checking that ``device``
    can run matmuls in it.

    Raises:
        GacError: unknown name, or a dtype the device does not support.
    """
    from gac.utils import parse_dtype

    dt = parse_dtype(name, device.type)
    key = dtype_name(dt)
    if device.type == "cuda" and dt == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise GacError(f"dtype bfloat16 is not supported on {torch.cuda.get_device_name(device)}")
    try:
        a = torch.ones(8, 8, device=device, dtype=dt)
        (a @ a).sum().item()
    except (RuntimeError, TypeError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GacError(f"dtype {key} is not supported on {device.type}: {first}") from None
    return dt


def dtype_name(dt: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dt).removeprefix("torch.")


def l2_bytes(device: torch.device) -> int | None:
    """Size of the GPU's L2 cache in bytes (None on CPU or when unknown)."""
    if device.type != "cuda":
        return None
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or None


def rotation_sets(bytes_per_set: int, device: torch.device, cap: int = 16) -> int:
    """How many input sets to rotate among so that repeated calls do not run out of L2.

    One set when a set is at least twice the L2 size; otherwise enough sets to cover
    four L2 sizes (at most ``cap``).  CPU: always one (wall-clock timing of small CPU
    kernels is dominated by other effects; records are labelled CPU).
    """
    l2 = l2_bytes(device)
    if not l2 or bytes_per_set <= 0 or bytes_per_set >= 2 * l2:
        return 1
    return int(min(cap, math.ceil(4 * l2 / bytes_per_set)))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench(
    fn: Callable[[int], Any],
    device: torch.device,
    *,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 5,
    max_reps: int = 1000,
) -> Timing:
    """Time ``fn(i)`` (``i`` = call index, for input rotation) and summarize.

    Args:
        fn: the work to time; called with a running index.
        device: where it runs (CUDA events) or CPU (wall clock).
        warmup_ms: minimum warm-up time before timing (at least two calls).
        rep_ms: approximate time budget of the timed repetitions.
        min_reps: fewest timed calls.
        max_reps: most timed calls.

    Returns:
        The median, inter-quartile range, quartiles and minimum, in ms per call.
    """
    # warm-up, and an estimate of the per-call time
    i = 0
    _sync(device)
    t0 = time.perf_counter()
    while True:
        fn(i)
        i += 1
        if i >= 2:
            _sync(device)
            if (time.perf_counter() - t0) * 1e3 >= warmup_ms:
                break
    est_ms = max((time.perf_counter() - t0) * 1e3 / i, 1e-4)
    reps = int(min(max_reps, max(min_reps, rep_ms / est_ms)))
    return _timed(fn, device, i, reps)


def time_calls(fn: Callable[[int], Any], device: torch.device, warmup: int, reps: int) -> Timing:
    """Time ``fn(i)`` a fixed number of times: ``warmup`` untimed calls, then ``reps`` timed ones.

    The same samples and statistics as :func:`bench`, for callers that fix the counts (the inference
    sweep's prefill steps and its copy-bandwidth probe).
    """
    for i in range(warmup):
        fn(i)
    _sync(device)
    return _timed(fn, device, warmup, reps)


def _timed(fn: Callable[[int], Any], device: torch.device, first: int, reps: int) -> Timing:
    """``reps`` calls ``fn(first + r)``, each bracketed by CUDA events (on CUDA) or the wall clock."""
    samples: list[float]
    if device.type == "cuda":
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        for r in range(reps):
            starts[r].record()
            fn(first + r)
            ends[r].record()
        torch.cuda.synchronize(device)
        samples = [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]
        method = "cuda_events"
    else:
        samples = []
        for r in range(reps):
            t = time.perf_counter()
            fn(first + r)
            samples.append((time.perf_counter() - t) * 1e3)
        method = "wall_clock"
    arr = np.asarray(samples, dtype=np.float64)
    q25, med, q75 = (float(x) for x in np.percentile(arr, [25, 50, 75]))
    return Timing(
        median_ms=med,
        iqr_ms=q75 - q25,
        q25_ms=q25,
        q75_ms=q75,
        min_ms=float(arr.min()),
        reps=reps,
        method=method,
    )


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
        line = out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""
        return line or None
    except (OSError, subprocess.SubprocessError):
        return None


def sdpa_backends_enabled() -> dict[str, bool]:
    """Which SDPA backends PyTorch's global switches allow (``torch.backends.cuda.*_sdp_enabled``)."""
    b = torch.backends.cuda
    out = {
        "flash": bool(b.flash_sdp_enabled()),
        "efficient": bool(b.mem_efficient_sdp_enabled()),
        "math": bool(b.math_sdp_enabled()),
    }
    if hasattr(b, "cudnn_sdp_enabled"):
        out["cudnn"] = bool(b.cudnn_sdp_enabled())
    return out


def environment(
    device: torch.device | str | None = None, dtype: torch.dtype | str | None = None
) -> dict[str, Any]:
    """A record of where and how a measurement was taken.

    On CUDA: GPU name, SM count, L2 size, memory, compute capability, driver, torch, CUDA,
    cuDNN, enabled SDPA backends.  On CPU the ``gpu`` field reads ``"CPU"`` and the timing
    method is wall clock.
    """
    dev = resolve_device(device)
    from gac import __version__

    env: dict[str, Any] = {
        "device": dev.type,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "gac": __version__,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "sdpa_backends_enabled": sdpa_backends_enabled(),
    }
    if dtype is not None:
        env["dtype"] = dtype if isinstance(dtype, str) else dtype_name(dtype)
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(
            gpu=torch.cuda.get_device_name(dev),
            # which card: a plan split over the GPUs of one host compares cells across cards
            gpu_uuid=str(getattr(props, "uuid", "") or "") or None,
            sm_count=int(props.multi_processor_count),
            l2_bytes=l2_bytes(dev),
            memory_gib=round(props.total_memory / 2**30, 1),
            compute_capability=f"{props.major}.{props.minor}",
            driver=_driver_version(),
            timing="cuda_events",
        )
    else:
        env.update(
            gpu="CPU",
            cpu=platform.processor() or platform.machine(),
            threads=torch.get_num_threads(),
            cpu_count=os.cpu_count(),
            timing="wall_clock",
        )
    return env


def gpu_slug(name: str | None = None) -> str:
    """Short directory name for a device: ``"h100"``, ``"h200"``, ``"cpu"``, else a sanitized name.

    >>> gpu_slug("NVIDIA H100 80GB HBM3"), gpu_slug("NVIDIA H200"), gpu_slug("CPU")
    ('h100', 'h200', 'cpu')
    >>> gpu_slug("NVIDIA GeForce RTX 4090")
    'geforce-rtx-4090'
    """
    if name is None:
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    low = name.lower()
    for known in ("h100", "h200", "h20", "b200", "gh200", "a100", "l40s", "l4"):
        if re.search(rf"\b{known}\b", low):
            return known
    if low.strip() in ("cpu", ""):
        return "cpu"
    low = low.replace("nvidia", "")
    return re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "gpu"


# ------------------------------------------------------------------------ CUDA-graph timing
def copies_past_l2(nbytes: int, total: int = 128 * 2**20, most: int = 64) -> int:
    """How many copies of ``nbytes`` of weights to rotate through so a timed loop reads them from DRAM."""
    return max(2, min(most, -(-total // max(nbytes, 1))))


def graph_timings(
    fn: Callable[[int], Any], reps: int = 64, samples: int = 15, wait: Callable[[str], None] | None = None
) -> list[float]:
    """Sorted µs per call of ``fn(i)``, ``i`` = 0..reps-1 captured in one CUDA graph, over ``samples`` replays.

    Eager warm-up calls and one warm-up replay come first.  ``wait(what)`` waits for the GPU
    (default: synchronize); a caller that must not block forever passes one with a deadline.
    """

    def sync(_: str) -> None:
        torch.cuda.synchronize()

    wait = wait or sync
    for i in range(reps):
        fn(i)
    wait("warm-up calls")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fn(i)
    g.replay()
    wait("first graph replay")
    ts = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        wait("graph replay")
        ts.append(a.elapsed_time(b) * 1e3 / reps)
    return sorted(ts)


def bench_graph(fn: Callable[[int], Any], reps: int = 64, samples: int = 15) -> float:
    """Median µs per call of ``fn(i)`` captured ``reps`` times in a CUDA graph (:func:`graph_timings`).

    The timing of the kernels' dispatch measurements (:mod:`gac.kernels`) and of ``gac profile``'s launch
    constants: weights rotated past L2 (:func:`copies_past_l2`), 64 calls per graph.
    """
    ts = graph_timings(fn, reps, samples)
    return ts[len(ts) // 2]


def time_configs(
    configs: Iterable[Sequence[int]],
    check: Callable[[Sequence[int]], str | None],
    timed: Callable[[Sequence[int]], Callable[[int], Any]],
    rec: dict[str, Any],
    after: Callable[[], str | None] = lambda: None,
    bench: Callable[[Callable[[int], Any]], float] | None = None,
) -> tuple[float, Sequence[int]] | None:
    """Time each configuration of a kernel after one checked run: the fastest ``(µs, config)``, or None.

    ``check(cfg)`` runs it once and says what is wrong with its result (None: right); only then is
    ``timed(cfg)`` (a function of the call index) timed by ``bench`` (default :func:`bench_graph`), and
    ``after()`` says what the timed replays left wrong (None: nothing, e.g. counters back to zero).  A
    configuration that raises (does not compile, does not fit) is skipped.  ``rec`` gets ``tried``
    (``[config, µs | None]`` for each) and ``failed`` (why, for each that failed).
    """
    bench = bench or bench_graph
    best: tuple[float, Sequence[int]] | None = None
    tried: list[list[Any]] = []
    for cfg in configs:
        tried.append([list(cfg), None])
        try:
            bad = check(cfg)
            if bad is None:
                us = bench(timed(cfg))
                bad = after()
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile/fit is skipped
            bad = f"{type(e).__name__}: {str(e)[:120]}"
        if bad is not None:
            rec.setdefault("failed", []).append(f"{list(cfg)}: {bad}")
            continue
        tried[-1][1] = us
        if best is None or us < best[0]:
            best = (us, cfg)
    rec["tried"] = tried
    return best
