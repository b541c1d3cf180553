"""Inference sweep: prefill latency and decode throughput, next to the dense baseline.

* **Prefill**: one forward pass over ``B × S`` prompt tokens (no KV cache written, only the last
  position's logits computed, as a server does), timed per call.
* **Decode**: single-token steps against a :class:`transformers.StaticCache` of ``KV``
  positions filled with random keys and values (its cost does not depend on what the cache
  holds; a static cache attends over all ``KV`` slots under a mask).  On CUDA each step is
  captured once as a CUDA graph and replayed; successive replays are real successive decode
  steps (the cache's on-device position advances).  Tokens/s = ``B / step time``.
* **Bandwidth**: a large device-to-device copy on the same GPU (bytes read + written) is the
  ceiling; each decode point reports the weight bytes it must read per step, and the weight
  (and weight + KV) bytes/s achieved against that ceiling.
* **Method**: warm-up calls are excluded; statistics are the median, quartiles and minimum of
  the timed calls (CUDA events on GPU, wall clock on CPU).  A point that runs out of memory is
  recorded as ``"oom"`` and the sweep goes on.  Every variant is built, timed and freed in turn
  in one process, the dense baseline first.

Results: ``infer.json`` (schema ``gac.infer/1``), ``infer.csv`` and plots
(``prefill_latency.png``, ``decode_tps.png``), written atomically by :func:`write_results`.
Token ids are drawn at random: token values do not change the work of a forward pass.
"""

from __future__ import annotations

import csv
import functools
import gc
import io
import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from gac.errors import GacError
from gac.guard import atomic_savefig
from gac.hardware.timing import time_calls
from gac.kernels.attention import model_decode_modes
from gac.nn.latent import latent_attention_paths
from gac.runtime.fastpath import FastPath
from gac.runtime.step import (
    DecodeStep,
    capture_graph,
    compile_step,
    compiled_frames,
    resolve_fast_path,
    sync,
    use_decode_kernels_,
)
from gac.utils import atomic_write_text, console, progress

SCHEMA = "gac.infer/1"


@dataclass
class SweepConfig(FastPath):
    """What to measure, and on which path. Defaults are the issue's grid and the default fast path.

    The fast-path switches (``compile``, ``graphs``, ``compile_mode``, ``gqa_decode``, ``gemv``,
    ``fused_lowrank``, ``branches``, ``combo_kernels``) are :class:`gac.runtime.FastPath`'s fields,
    declared there once.  ``fuse`` and ``triton`` transform the model before it is timed: the
    caller applies them (``gac.llm_run``, a plan's infer eval) and they are recorded here.
    """

    prefill_batches: tuple[int, ...] = (1, 8)
    prefill_seqs: tuple[int, ...] = (128, 512, 1024, 2048)
    decode_batches: tuple[int, ...] = (1, 16, 64)
    decode_kv: tuple[int, ...] = (512, 4096)
    prefill_warmup: int = 2
    prefill_reps: int = 10
    decode_warmup: int = 5
    decode_reps: int = 30
    #: name the kernels of one prefill and one decode step with torch.profiler.
    profile_kernels: bool = True
    #: bytes of the copy used to measure the bandwidth ceiling (CUDA only).
    copy_bytes: int = 2 * 2**30
    #: capacity: the largest decode batch whose weights, KV cache and workspace fit the memory budget
    #: at this context length, and its decode speed (None: not measured; CUDA)
    capacity_context: int | None = None
    #: the capacity's memory budget in GiB (None: this GPU's free memory plus what this process holds)
    capacity_budget_gib: float | None = None


@dataclass
class Variant:
    """A model to time: ``build()`` returns it on the target device; it is freed after timing."""

    name: str
    build: Callable[[], nn.Module]
    meta: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------- helpers


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, torch.OutOfMemoryError):
        return True
    return isinstance(e, RuntimeError) and "out of memory" in str(e).lower()


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _peak_gib(device: torch.device, reset: bool = False) -> float | None:
    """The CUDA allocator's peak since its last reset (GiB; None off CUDA), then reset it if ``reset``.

    A point reads it after its setup (compile, autotune, graph capture) and resets it, so that its record keeps both
    the whole point's peak (``peak_mem_gib``) and the timed calls' alone (``steady_peak_mem_gib``): compilation's
    transient buffers depend on the compile cache's state. On an H200 the same dense cell peaked 60-120 MB lower
    compiled from a warm cache than from a cold one (``benchmarks/results/h200/palu-default/README.md``, call 59).
    """
    if device.type != "cuda":
        return None
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
    return peak


def _peaks(setup: float | None, steady: float | None) -> dict[str, float | None]:
    """A point's peak memory fields from its setup's peak and its timed calls' (:func:`_peak_gib`)."""
    whole = None if setup is None or steady is None else max(setup, steady)
    return {"peak_mem_gib": whole, "steady_peak_mem_gib": steady}


def _time_calls(fn: Callable[[], Any], device: torch.device, warmup: int, reps: int) -> dict[str, float]:
    """``fn`` timed by the one harness (:func:`gac.hardware.timing.time_calls`): ``warmup`` untimed calls,
    then ``reps`` each bracketed by CUDA events or the clock; the infer JSON's statistics."""
    t = time_calls(lambda _i: fn(), device, warmup, reps).to_dict()
    del t["method"]
    return t


def model_device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


def model_dtype(model: nn.Module) -> torch.dtype:
    return next(p for p in model.parameters() if p.is_floating_point()).dtype


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def weight_bytes_per_step(model: nn.Module) -> int:
    """Bytes of parameters one decode step must read: all of them except the input embedding table
    (a step reads only B rows of it), unless that table is tied to the output head."""
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    skip: set[int] = set()
    if emb is not None and (out is None or out.weight is not emb.weight):
        skip.add(id(emb.weight))
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) in seen or id(p) in skip:
            continue
        seen.add(id(p))
        total += p.numel() * p.element_size()
    return total


FLOPS_COUNTER = 2
"""Version of :func:`prefill_flops` written beside each prefill record's ``flops``. Version 1
(records without the key) missed the fused first stage of fused q/k/v and gate/up groups, so its
counts are only used for models that were not fused."""


def prefill_flops(model: nn.Module, batch: int, seq: int) -> float:
    """FLOPs of one prefill with ``logits_to_keep=1``: every linear layer of the decoder at every
    token (a factorized layer counts its two factors; a fused group of projections counts its
    concatenated first stage once), causal attention (``2·B·S²`` per query feature of each layer's
    ``q_proj``), and the output head at the last token only."""
    from gac.nn.fused import FusedInputProjection

    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    per_token, q_feats = 0, 0
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear) and m is not out:
            per_token += 2 * m.in_features * m.out_features
        elif isinstance(m, FusedInputProjection):
            per_token += 2 * m.weight.numel()
        if name.endswith("self_attn"):
            q = getattr(m, "q_proj", None)
            q_feats += int(getattr(q, "out_features", 0) or 0)
    head = 2 * out.in_features * out.out_features if isinstance(out, nn.Linear) else 0
    return float(batch * seq * per_token + 2 * batch * seq * seq * q_feats + batch * head)


def copy_bandwidth(device: torch.device, nbytes: int = 2 * 2**30, reps: int = 20) -> dict[str, Any]:
    """Device-to-device copy bandwidth (bytes read + bytes written per second), median of ``reps``."""
    if device.type != "cuda":
        return {"status": "skipped", "reason": "copy bandwidth is measured on CUDA only"}
    n = nbytes // 2
    bufs = [torch.empty(n, dtype=torch.bfloat16, device=device).normal_()]
    bufs.append(torch.empty_like(bufs[0]))

    def copy() -> None:
        bufs[1].copy_(bufs[0])

    st = _time_calls(copy, device, warmup=3, reps=reps)
    moved = 2 * n * 2
    st.update(bytes_moved=moved, buffer_bytes=n * 2, gbps=moved / (st["median_ms"] * 1e-3) / 1e9, status="ok")
    bufs.clear()
    _free(device)
    return st


# ------------------------------------------------------------------------- kernels

_ATTN_PATTERNS = (
    ("cudnn", re.compile(r"cudnn.*(attn|attention|sdpa|fmha|flash)", re.I)),
    ("flash", re.compile(r"flash", re.I)),
    ("efficient", re.compile(r"fmha|efficient_attention|mem_eff|cutlassF", re.I)),
)
_GEMM = re.compile(
    r"gemm|gemv|xmma|cutlass|nvjet|cublas|splitk|dot_kernel|lowrank|aten::(mm|addmm|bmm|linear|matmul)", re.I
)


def kernel_summary(fn: Callable[[], Any], device: torch.device, top: int = 12) -> dict[str, Any]:
    """Profile one call of ``fn``; name the SDPA backend and the GEMM kernels it ran.

    On CUDA the names are device kernels; on CPU they are ATen ops (the CPU has no kernels of
    its own to name).
    """
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    fn()
    sync(device)
    with profile(activities=acts) as prof:
        fn()
        sync(device)
    times: dict[str, float] = {}
    for evt in prof.events():
        if device.type == "cuda":
            if evt.device_type != torch.autograd.DeviceType.CUDA:
                continue
            t = getattr(evt, "device_time", None)
            if t is None:
                t = getattr(evt, "cuda_time", 0.0)
        else:
            if not evt.name.startswith("aten::"):
                continue
            t = evt.self_cpu_time_total
        times[evt.name] = times.get(evt.name, 0.0) + float(t)
    ranked = sorted(times.items(), key=lambda kv: -kv[1])
    backend = None
    for name, _ in ranked:
        for label, pat in _ATTN_PATTERNS:
            if pat.search(name):
                backend = label
                break
        if backend:
            break
    if backend is None:
        names = " ".join(times)
        if "scaled_dot_product" in names:
            m = re.search(r"_scaled_dot_product_(\w+?)_attention", names)
            backend = m.group(1) if m else "sdpa"
        elif re.search(r"softmax", names, re.I):
            backend = "math"
    total = sum(times.values()) or 1.0
    gemms = [{"name": n[:160], "share": round(t / total, 4)} for n, t in ranked if _GEMM.search(n)][:top]
    return {
        "sdpa_backend": backend or "unknown",
        "gemm_kernels": gemms,
        "top_kernels": [{"name": n[:160], "share": round(t / total, 4)} for n, t in ranked[:top]],
        "what": "cuda kernels" if device.type == "cuda" else "aten ops (cpu)",
    }


# --------------------------------------------------------------------------- points


def _vocab(model: nn.Module) -> int:
    return int(model.config.vocab_size)


@torch.no_grad()
def prefill_point(
    model: nn.Module,
    batch: int,
    seq: int,
    cfg: SweepConfig,
    forward: Callable[..., Any] | None = None,
    graphs: bool = False,
) -> dict[str, Any]:
    """Latency of one prompt forward pass at ``batch × seq`` (last-position logits only).

    ``forward`` (e.g. a compiled ``model.forward``) replaces the eager call; ``graphs`` captures
    the step at this static shape as a CUDA graph.  The first call (compile, autotune, capture)
    is timed apart as ``setup_s`` and never counted in the latency.
    """
    dev = model_device(model)
    g = torch.Generator(device="cpu").manual_seed(batch * 100003 + seq)
    ids = torch.randint(0, _vocab(model), (batch, seq), generator=g).to(dev)
    fwd = forward or model

    def eager() -> Any:
        return fwd(input_ids=ids, use_cache=False, logits_to_keep=1).logits

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    frames0 = compiled_frames()
    t0 = time.perf_counter()
    step, close = capture_graph(eager, dev) if graphs else (eager, lambda: None)
    step()
    sync(dev)
    setup_s = time.perf_counter() - t0
    setup_peak = _peak_gib(dev, reset=True)
    try:
        st = _time_calls(step, dev, cfg.prefill_warmup, cfg.prefill_reps)
    finally:
        close()
    peaks = _peaks(setup_peak, _peak_gib(dev))
    rec: dict[str, Any] = {"phase": "prefill", "batch": batch, "seq": seq, "status": "ok", **st}
    rec["tokens_per_s"] = batch * seq / (st["median_ms"] * 1e-3)
    rec.update(graphs=graphs, compiled=forward is not None, setup_s=setup_s)
    rec["compiles"] = compiled_frames() - frames0 if forward is not None else 0
    rec.update(peaks)
    return rec


@torch.no_grad()
def decode_point(
    model: nn.Module,
    batch: int,
    kv: int,
    cfg: SweepConfig,
    graphs: bool,
    wbytes: int,
    copy_gbps: float | None,
    forward: Callable[..., Any] | None = None,
) -> dict[str, Any]:
    """Per-token latency and tokens/s of decode steps at ``batch`` against ``kv`` cached positions."""
    dev = model_device(model)
    n = cfg.decode_warmup + cfg.decode_reps
    if n > kv:
        raise GacError(f"decode needs warmup + reps ({n}) <= KV length ({kv})")
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    alloc0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0
    frames0 = compiled_frames()
    t0 = time.perf_counter()
    step = DecodeStep(model, batch, kv, graphs, forward=forward)  # compile + capture happen here
    if not graphs:
        step()  # the compile of an uncaptured step, also outside the latency
    sync(dev)
    setup_s = time.perf_counter() - t0
    setup_peak = _peak_gib(dev, reset=True)
    try:
        step.set_position(kv - n)  # the timed steps end on the cache's last slot
        st = _time_calls(step, dev, cfg.decode_warmup, cfg.decode_reps)
        kvb = step.kv_bytes
        peaks = _peaks(setup_peak, _peak_gib(dev))
    finally:
        step.close()
    sec = st["median_ms"] * 1e-3
    rec: dict[str, Any] = {
        "phase": "decode",
        "batch": batch,
        "kv": kv,
        "status": "ok",
        "graphs": graphs,
        "compiled": forward is not None,
        "setup_s": setup_s,
        "compiles": compiled_frames() - frames0 if forward is not None else 0,
        **st,
    }
    rec.update(
        tokens_per_s=batch / sec,
        ms_per_token=st["median_ms"],
        weight_bytes=wbytes,
        kv_bytes=kvb,
        weight_gbps=wbytes / sec / 1e9,
        total_gbps=(wbytes + kvb) / sec / 1e9,
    )
    if copy_gbps:
        rec["weight_bw_frac"] = rec["weight_gbps"] / copy_gbps
        rec["total_bw_frac"] = rec["total_gbps"] / copy_gbps
    rec.update(peaks)
    rec["held_before_gib"] = alloc0 / 2**30  # allocated when the point began (the weights, and anything kept)
    modes = model_decode_modes(model, batch, kv)  # gac_sdpa's decode attention (decode_mode); none off it
    if modes:
        rec["decode_attention"] = modes[0] if len(modes) == 1 else modes
    return rec


def _capacity_budget(model: nn.Module, cfg: SweepConfig) -> dict[str, int]:
    """The budget, weight bytes and KV bytes per token of a capacity run; bad input raises before any work."""
    from gac.models.inventory import kv_bytes_per_token

    dev = model_device(model)
    ctx = int(cfg.capacity_context or 0)
    if ctx < cfg.decode_warmup + cfg.decode_reps:
        raise GacError(
            f"capacity context must be >= warm-up + reps ({cfg.decode_warmup + cfg.decode_reps}), got {ctx}"
        )
    if cfg.capacity_budget_gib is not None:
        budget = int(cfg.capacity_budget_gib * 2**30)
    elif dev.type == "cuda":
        budget = int(torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev))
    else:
        raise GacError("capacity on the CPU needs a memory budget (--max-gpu-memory GiB)")
    weights = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
    kv_tok = kv_bytes_per_token(model)["cache"]
    if budget < weights + kv_tok * ctx:
        raise GacError(
            f"memory budget {budget / 2**30:.2f} GiB is smaller than the weights ({weights / 2**30:.2f} GiB) "
            f"plus one sequence at context {ctx} ({kv_tok * ctx / 2**30:.2f} GiB)"
        )
    return {"budget": budget, "weights": weights, "kv_per_token": kv_tok, "context": ctx}


#: climbs above the first batch that fits, each priced by the bytes a sequence took at the last that fit, before one
#: misses
CAPACITY_PROBES = 3
#: after a miss, the search halves the gap until it is at most this share of the batch that fit (at least one
#: sequence), within :data:`CAPACITY_MAX_PROBES` tries above the first fit in all
CAPACITY_RESOLUTION = 0.02
CAPACITY_MAX_PROBES = 8


def largest_fitting_batch(
    fits: Callable[[int], int | None],
    predicted: int,
    budget: int,
    held: int,
    probes: int = CAPACITY_PROBES,
    resolution: float = CAPACITY_RESOLUTION,
    max_probes: int = CAPACITY_MAX_PROBES,
) -> int:
    """The largest batch the capacity search saw fit: ``fits(b)`` runs batch ``b`` and returns its peak bytes, or
    ``None`` where it ran out of memory or past ``budget``. 0 where none down to 1 fits.

    Down from ``predicted`` (5% steps, at least one) until a batch fits; then up. Until a batch misses, at most
    ``probes`` climbs, each priced by the bytes one sequence took at the last batch that fit (its peak beyond
    ``held``, divided by the batch; the fixed workspace folded in, so an over-count). After a miss, each try goes
    at most halfway to the smallest batch that missed, until that gap is within ``resolution`` of the batch that
    fit (at least one sequence), ``max_probes`` tries above the first fit in all. The workspace measured at batch 1
    and 2, which ``predicted`` extrapolates, need not grow linearly: on an H100 the Llama-3-8B shape's predicted
    batch at 32k context peaked 17 GiB under a 78.6 GiB budget (``benchmarks/results/h100/palu-default/run8/``);
    climbing found 72 sequences where 56 were predicted (``capacity-climb/``). With three tries and no closing
    of the gap, an H200's dense search stopped at 117 sequences below a miss at 133 where an earlier run fit 132
    (``benchmarks/results/h200/palu-default/call8/``), and the capacity ratio against it read 2.21x for 1.95x.
    """
    b, best, peak = predicted, 0, None
    while b >= 1 and peak is None:
        peak = fits(b)
        best = b if peak is not None else 0
        b = min(b - 1, int(b * 0.95))
    hi = None  # the smallest batch seen not to fit above the best
    climbs = 0
    for _ in range(max_probes if best else 0):
        if hi is None:
            if climbs >= probes:
                break
            climbs += 1
            guess = int((budget - held) // max(1.0, (peak - held) / best))
        else:  # after a miss: halfway to it, until the gap is within the resolution
            if hi - best <= max(1, int(resolution * best)):
                break
            guess = (best + hi) // 2
        if guess <= best:
            break
        p = fits(guess)
        if p is None:
            hi = guess
        else:
            best, peak = guess, p
    return best


#: what :func:`capacity_point` keeps of the decode points at batch 1 and 2 it reads the workspace from
WORKSPACE_FIELDS = ("batch", "peak_mem_gib", "steady_peak_mem_gib", "held_before_gib", "kv_bytes")


def workspace(points: list[dict[str, Any]]) -> tuple[float, float]:
    """The fixed workspace and what one sequence adds, in bytes, from decode points at batch 1 and 2 (each point's
    peak beyond what was allocated when it began and its cache).

    What a sequence adds is read off the timed steps' peaks (``steady_peak_mem_gib``; the whole peaks where a point
    lacks it): the whole point's peak also holds its compile's and capture's transient buffers, which need not grow
    with the batch. Dense Llama-3-8B at 32k on an H200 took 134 MB a sequence from whole peaks in call 60 and 1.1 GB
    in call 69, where 132 sequences fit both times, and the search began at 118 and at 65
    (``benchmarks/results/h200/palu-default/capacity-call60/``, ``capacity-call69/``). The fixed part keeps batch 1's
    whole peak.

    >>> gib = 2**30
    >>> pts = [{"peak_mem_gib": 7.0, "steady_peak_mem_gib": 6.1, "held_before_gib": 5.0, "kv_bytes": gib},
    ...        {"peak_mem_gib": 9.1, "steady_peak_mem_gib": 7.2, "held_before_gib": 5.0, "kv_bytes": 2 * gib}]
    >>> [round(x / gib, 3) for x in workspace(pts)]
    [0.9, 0.1]
    """

    def beyond(p: dict[str, Any], key: str) -> float:
        return (float(p[key]) - float(p["held_before_gib"])) * 2**30 - float(p["kv_bytes"])

    whole = [beyond(p, "peak_mem_gib") for p in points]
    key = (
        "steady_peak_mem_gib"
        if all(p.get("steady_peak_mem_gib") is not None for p in points)
        else "peak_mem_gib"
    )
    grow = [beyond(p, key) for p in points]
    per_seq = max(0.0, grow[1] - grow[0])
    return max(0.0, whole[0] - per_seq), per_seq


def capacity_point(
    model: nn.Module,
    cfg: SweepConfig,
    graphs: bool,
    wbytes: int,
    copy_gbps: float | None,
    forward: Callable[..., Any] | None,
    plan: dict[str, int],
) -> dict[str, Any]:
    """The largest decode batch that fits ``plan``'s budget at its context, and its measured speed.

    ``max batch = (budget - held - workspace₀) // (KV bytes per token x context + workspace per sequence)``
    (``held``: what is allocated when the search begins, the weights at least),
    with the workspace (activations, logits, compile and graph pools) from the peak memory of decode
    steps at batch 1 and 2 beyond what was allocated when each began and the cache (what a sequence adds from their
    timed steps' peaks, the fixed part from batch 1's whole peak); from that batch
    :func:`largest_fitting_batch` searches down until one fits, then up (each try recorded: batch, status,
    direction, peak).
    """
    dev = model_device(model)
    if dev.type != "cuda":
        raise GacError("capacity needs a GPU: its workspace and the batch that fits are measured")
    ctx, w, seq = plan["context"], plan["weights"], plan["kv_per_token"] * plan["context"]
    _free(dev)
    # what stays allocated between points: the weights, and anything the process keeps beyond them (a
    # sweep's earlier points can leave more than the weights; each try's peak counts it too)
    held = max(int(torch.cuda.memory_allocated(dev)), w)
    points = []
    for b in (1, 2):
        r = decode_point(model, b, ctx, cfg, graphs, wbytes, copy_gbps, forward)
        points.append({k: r.get(k) for k in WORKSPACE_FIELDS})
        _free(dev)
    fixed, per_seq = workspace(points)
    predicted = int((plan["budget"] - held - fixed) // (seq + per_seq))
    if predicted < 1:  # the measured workspace leaves no room for one sequence
        raise GacError(
            f"memory budget {plan['budget'] / 2**30:.2f} GiB holds no sequence at context {ctx}: held "
            f"{held / 2**30:.2f} GiB (weights {w / 2**30:.2f}) + measured workspace {fixed / 2**30:.2f} GiB "
            f"+ one sequence {(seq + per_seq) / 2**30:.2f} GiB"
        )
    out: dict[str, Any] = {
        "context": ctx,
        "budget_gib": plan["budget"] / 2**30,
        "weight_bytes": w,
        "held_bytes": held,
        "kv_bytes_per_token": plan["kv_per_token"],
        "workspace_fixed_bytes": fixed,
        "workspace_per_seq_bytes": per_seq,
        "workspace_points": points,  # the decode points at batch 1 and 2 the workspace was read from
        "predicted_max_batch": predicted,
        "tries": [],
    }
    runs: dict[int, dict[str, Any]] = {}

    def fits(b: int) -> int | None:
        """Run batch ``b`` (each try recorded); its peak bytes where it ran within the budget."""
        try:
            r = decode_point(model, b, ctx, cfg, graphs, wbytes, copy_gbps, forward)
        except Exception as e:  # noqa: BLE001 - an OOM is a measured "does not fit"
            if not _is_oom(e):
                raise
            r = None
        _free(dev)
        try_ = {"batch": b, "status": "oom", "direction": "up" if runs else "down"}
        out["tries"].append(try_)
        if r is None:
            return None
        try_["peak_gib"] = r["peak_mem_gib"]
        if r["peak_mem_gib"] * 2**30 > plan["budget"]:  # ran, but past the budget: the estimate was short
            try_["status"] = "over_budget"
            return None
        try_["status"] = "ok"
        runs[b] = r
        return int(r["peak_mem_gib"] * 2**30)

    b = largest_fitting_batch(fits, predicted, plan["budget"], held)
    if not b:  # every batch down to 1 ran out of memory or past the budget: none fits, said so in the record
        out.update(max_batch=0, tokens_per_s=None, ms_per_token=None, peak_mem_gib=None)
    else:
        r = runs[b]
        missed = [t["batch"] for t in out["tries"] if t["status"] != "ok" and t["batch"] > b]
        out.update(
            max_batch=b,
            # the smallest batch tried that did not fit, above the largest that did (None: none was tried)
            first_miss=min(missed) if missed else None,
            tokens_per_s=r["tokens_per_s"],
            ms_per_token=r["ms_per_token"],
            peak_mem_gib=r["peak_mem_gib"],
        )
    _free(dev)
    return out


# ---------------------------------------------------------------------------- sweep


def _guard(point: Callable[[], dict[str, Any]], key: dict[str, Any], dev: torch.device) -> dict[str, Any]:
    try:
        return point()
    except GacError:
        raise
    except Exception as e:  # noqa: BLE001 - a failing point is recorded and the sweep goes on
        msg = (str(e).splitlines()[0] if str(e) else type(e).__name__)[:300]
        _free(dev)
        if _is_oom(e):
            return {**key, "status": "oom", "error": msg}
        console.print(f"[yellow]warning[/yellow]: {key} failed: {type(e).__name__}: {msg}")
        return {**key, "status": "error", "error": f"{type(e).__name__}: {msg}"}


def _reason(e: BaseException) -> str:
    """``Type: first line`` of an exception, for a notice and a record's ``fallback``."""
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


#: PyTorch's message for a guard that fails on the frame it was just compiled for (an internal bug)
DYNAMO_GUARD_BUG = "Guard failed on the same frame it was created"


def _fast_or_eager(
    point: Callable[[Callable[..., Any] | None, bool], dict[str, Any]],
    forward: Callable[..., Any] | None,
    graphs: bool,
    what: str,
    dev: torch.device,
) -> dict[str, Any]:
    """``point(forward, graphs)``; where the compiled or captured step fails (not for lack of
    memory), a one-line notice names the reason and the point is timed eager, labelled
    ``fallback``. A Dynamo guard that fails on the frame that created it (a PyTorch bug: it hit one
    decode point of an ASVD cell on an H100, ``benchmarks/results/h100/speed-guarded-margin/``) is
    retried once after ``torch._dynamo.reset()`` before that, and the record says ``retried``."""
    try:
        return point(forward, graphs)
    except GacError:
        raise
    except Exception as e:  # noqa: BLE001 - any compile/capture failure falls back to eager
        if _is_oom(e) or (forward is None and not graphs):
            raise
        reason = _reason(e)
        if forward is not None and DYNAMO_GUARD_BUG in str(e):
            _free(dev)
            console.print(f"notice: {what}: {reason}; resetting Dynamo and compiling it once more",
                          soft_wrap=True, markup=False)  # fmt: skip
            torch._dynamo.reset()
            try:
                rec = point(forward, graphs)
            except GacError:
                raise
            except Exception as e2:  # noqa: BLE001 - the second failure falls back as the first would
                if _is_oom(e2):
                    raise
                reason = f"{_reason(e2)} (after a retry)"
            else:
                rec["retried"] = reason
                return rec
        _free(dev)
        console.print(
            f"notice: {what} could not be compiled/captured ({reason}); timing it eager (labelled fallback)",
            soft_wrap=True,
            markup=False,
        )
        rec = point(None, False)
        rec["fallback"] = f"eager: {reason}"
        return rec


def sweep_model(
    model: nn.Module, cfg: SweepConfig, copy_gbps: float | None = None, label: str = "model"
) -> dict[str, Any]:
    """Run the prefill and decode grids on one model. OOM points are recorded, not raised."""
    dev = model_device(model)
    cap_plan = _capacity_budget(model, cfg) if cfg.capacity_context else None
    graphs, compile_ = resolve_fast_path(cfg, dev)
    model.eval()
    kernels = use_decode_kernels_(model, cfg.gqa_decode, cfg.gemv, cfg.fused_lowrank, cfg.branches)
    wbytes = weight_bytes_per_step(model)
    out: dict[str, Any] = {
        "params": param_count(model),
        "weight_bytes_per_step": wbytes,
        "dtype": str(model_dtype(model)).removeprefix("torch."),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        **kernels,
        "graphs": graphs,
        "prefill": [],
        "decode": [],
    }
    forward = _compiled_forward(model, cfg, compile_, out)
    grid_p = [(b, s) for b in cfg.prefill_batches for s in cfg.prefill_seqs]
    grid_d = [(b, k) for b in cfg.decode_batches for k in cfg.decode_kv]
    points = [
        ("prefill", {"batch": b, "seq": s}, f"prefill B={b} S={s}",
         lambda f, g, b=b, s=s: prefill_point(model, b, s, cfg, f, g))
        for b, s in grid_p
    ] + [
        ("decode", {"batch": b, "kv": k}, f"decode B={b} KV={k}",
         lambda f, g, b=b, k=k: decode_point(model, b, k, cfg, g, wbytes, copy_gbps, f))
        for b, k in grid_d
    ]  # fmt: skip
    with progress() as p:
        task = p.add_task(f"{label}: prefill + decode", total=len(points))
        for phase, key, what, point in points:
            run = functools.partial(_fast_or_eager, point, forward, graphs, what, dev)
            out[phase].append(_guard(run, {"phase": phase, **key}, dev))
            p.advance(task)
            _free(dev)
    if cap_plan is not None:
        out["capacity"] = capacity_point(model, cfg, graphs, wbytes, copy_gbps, forward, cap_plan)
    for r in out["prefill"]:
        r["flops"] = prefill_flops(model, r["batch"], r["seq"])
        r["flops_counter"] = FLOPS_COUNTER
    # PaLU: the decode path each latent-attention layer took (kernel or reference, and why)
    out["latent_attention_path"] = latent_attention_paths(model)
    ok = [r for r in out["prefill"] + out["decode"] if r.get("status") == "ok"]
    out["setup_s_total"] = sum(r.get("setup_s", 0.0) for r in ok)  # compile + capture, not in latency
    out["compiles_total"] = sum(r.get("compiles", 0) for r in ok)
    out["fallbacks"] = [
        f"{r['phase']} {r['batch']}x{r.get('seq', r.get('kv'))}" for r in ok if r.get("fallback")
    ]
    if cfg.profile_kernels:
        out["kernels"] = _kernel_names(model, forward, grid_p[:1], grid_d[:1], dev)
        _free(dev)
    return out


def _compiled_forward(
    model: nn.Module, cfg: SweepConfig, compile_: bool, out: dict[str, Any]
) -> Callable[..., Any] | None:
    """The sweep's compiled forward (None without ``compile_``); records how it compiled in ``out``."""
    if cfg.compile_mode in ("reduce-overhead", "max-autotune"):
        raise GacError(
            f"compile mode {cfg.compile_mode!r} captures CUDA graphs itself; "
            "use 'default' or 'max-autotune-no-cudagraphs' (the decode step is captured by the sweep)"
        )
    mode = None if cfg.compile_mode in (None, "default") else cfg.compile_mode
    if compile_:
        # each variant compiles twice (before and after the lazy KV-cache allocation); without a
        # reset, the variants of one sweep add up to Dynamo's recompile limit and fall back to eager
        torch._dynamo.reset()
        # one static-shape compile per grid point (and two per decode point, before and after the
        # lazy cache allocation): more than Dynamo's default limit of 8 per code object
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
    forward = compile_step(model.forward, mode, cfg.combo_kernels, dynamic=False) if compile_ else None
    out["compiled_decode"] = compile_
    out["compiled_prefill"] = compile_
    out["compile_mode"] = mode or ("default" if compile_ else None)
    out["combo_kernels"] = bool(compile_ and cfg.combo_kernels)
    return forward


def _kernel_names(
    model: nn.Module,
    forward: Callable[..., Any] | None,
    grid_p: list[tuple[int, int]],
    grid_d: list[tuple[int, int]],
    dev: torch.device,
) -> dict[str, Any]:
    """The kernels one prefill point and one decode step ran (:func:`kernel_summary`); ``error`` on OOM."""
    names: dict[str, Any] = {}
    with torch.no_grad():
        try:
            for b, s in grid_p:  # a grid may be decode only, or prefill only
                ids = torch.randint(0, _vocab(model), (b, s)).to(dev)
                names["prefill"] = {
                    "batch": b,
                    "seq": s,
                    **kernel_summary(
                        lambda ids=ids: (forward or model)(input_ids=ids, use_cache=False, logits_to_keep=1),
                        dev,
                    ),
                }
            for b, k in grid_d:
                step = DecodeStep(model, b, k, graphs=False, forward=forward)
                step.set_position(k // 2)
                names["decode"] = {"batch": b, "kv": k, **kernel_summary(step, dev)}
                step.close()
        except Exception as e:  # noqa: BLE001 - kernel names are a nice-to-have; record why not
            if not _is_oom(e):
                raise
            names["error"] = "oom"
    return names


def run_sweep(
    variants: list[Variant], cfg: SweepConfig, device: torch.device | str | None = None
) -> dict[str, Any]:
    """Build, time and free each variant in turn (the dense baseline first) and add speedups."""
    from gac.hardware.timing import environment, resolve_device

    dev = resolve_device(device)
    res: dict[str, Any] = {"schema": SCHEMA, "env": environment(dev), "config": cfg.to_dict()}
    res["copy_bandwidth"] = copy_bandwidth(dev, cfg.copy_bytes)
    copy_gbps = res["copy_bandwidth"].get("gbps")
    res["variants"] = {}
    for v in variants:
        console.print(f"[bold]building[/bold] {v.name}")
        model = v.build()
        try:
            rec = sweep_model(model, cfg, copy_gbps, label=v.name)
        finally:
            del model
            _free(dev)
        rec["meta"] = v.meta
        res["variants"][v.name] = rec
    add_speedups(res)
    return res


def _flops_valid(r: dict[str, Any], variant: dict[str, Any]) -> bool:
    """Whether a prefill record's ``flops`` can be trusted (see :data:`FLOPS_COUNTER`)."""
    return bool(r.get("flops")) and (r.get("flops_counter", 1) >= 2 or not variant.get("fused"))


def add_speedups(res: dict[str, Any], baseline: str | None = None) -> None:
    """Speedups of every variant over the first (or ``baseline``) at each point, and the bytes-ideal ratio."""
    names = list(res["variants"])
    if not names:
        return
    base = baseline or names[0]
    res["baseline"] = base
    b = res["variants"][base]
    bp = {(r["batch"], r["seq"]): r for r in b["prefill"]}
    bd = {(r["batch"], r["kv"]): r for r in b["decode"]}
    for name in names:
        v = res["variants"][name]
        for r in v["prefill"]:
            ref = bp.get((r["batch"], r["seq"]))
            if r.get("status") == "ok" and ref and ref.get("status") == "ok":
                r["speedup"] = ref["median_ms"] / r["median_ms"]
                if _flops_valid(r, v) and _flops_valid(ref, b):
                    r["flop_ideal_speedup"] = ref["flops"] / r["flops"]
                    r["speedup_vs_ideal"] = r["speedup"] / r["flop_ideal_speedup"]
        for r in v["decode"]:
            ref = bd.get((r["batch"], r["kv"]))
            if r.get("status") == "ok" and ref and ref.get("status") == "ok":
                r["speedup"] = ref["median_ms"] / r["median_ms"]
                r["bytes_ideal_speedup"] = (ref["weight_bytes"] + ref["kv_bytes"]) / (
                    r["weight_bytes"] + r["kv_bytes"]
                )
                r["speedup_vs_ideal"] = r["speedup"] / r["bytes_ideal_speedup"]
        cap, ref = v.get("capacity"), b.get("capacity")
        if cap and ref and cap.get("tokens_per_s") and ref.get("tokens_per_s") and ref.get("max_batch"):
            cap["tokens_per_s_vs_baseline"] = cap["tokens_per_s"] / ref["tokens_per_s"]
            cap["max_batch_vs_baseline"] = cap["max_batch"] / ref["max_batch"]


# ---------------------------------------------------------------------------- output

CSV_FIELDS = (
    "variant", "phase", "batch", "seq", "kv", "status", "median_ms", "q25_ms", "q75_ms", "min_ms", "reps",
    "tokens_per_s", "speedup", "weight_gbps", "weight_bw_frac", "bytes_ideal_speedup", "flop_ideal_speedup",
    "speedup_vs_ideal", "peak_mem_gib", "steady_peak_mem_gib", "flops",
)  # fmt: skip


def to_csv(res: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore")
    w.writeheader()
    for name, v in res["variants"].items():
        for r in v["prefill"] + v["decode"]:
            w.writerow({"variant": name, **{k: _fmt(r.get(k)) for k in CSV_FIELDS if k != "variant"}})
    return buf.getvalue()


def _fmt(x: Any) -> Any:
    if isinstance(x, float):
        return f"{x:.6g}"
    return "" if x is None else x


def plot(res: dict[str, Any], out: Path) -> list[Path]:
    """Prefill latency against prompt length (one line per variant and batch) and decode tokens/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for name, v in res["variants"].items():
        for b in sorted({r["batch"] for r in v["prefill"]}):
            pts = [
                (r["seq"], r["median_ms"])
                for r in v["prefill"]
                if r["batch"] == b and r.get("status") == "ok"
            ]
            if pts:
                xs, ys = zip(*sorted(pts), strict=True)
                ax.plot(xs, ys, marker="o", label=f"{name} B={b}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt length S (tokens)")
    ax.set_ylabel("prefill latency (ms, median)")
    ax.set_title(f"Prefill latency — {res['env'].get('gpu', '?')}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    p = out / "prefill_latency.png"
    atomic_savefig(fig, p, dpi=120)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    names = list(res["variants"])
    keys = sorted({(r["batch"], r["kv"]) for v in res["variants"].values() for r in v["decode"]})
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        rec = {(r["batch"], r["kv"]): r for r in res["variants"][name]["decode"]}
        ys = [
            rec[k].get("tokens_per_s", 0.0) if k in rec and rec[k].get("status") == "ok" else 0.0
            for k in keys
        ]
        ax.bar(np.arange(len(keys)) + i * width, ys, width, label=name)
    ax.set_xticks(np.arange(len(keys)) + width * (len(names) - 1) / 2)
    ax.set_xticklabels([f"B={b}\nKV={k}" for b, k in keys], fontsize=8)
    ax.set_ylabel("decode tokens/s (median)")
    ax.set_yscale("log")
    ax.set_title(f"Decode throughput — {res['env'].get('gpu', '?')}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    p = out / "decode_tps.png"
    atomic_savefig(fig, p, dpi=120)
    plt.close(fig)
    paths.append(p)
    return paths


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


def write_results(res: dict[str, Any], out: str | Path, plots: bool = True) -> Path:
    """Write ``infer.json``, ``infer.csv`` and the plots into the directory ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "infer.json", json.dumps(res, indent=1, default=_json_default))
    atomic_write_text(out / "infer.csv", to_csv(res))
    if plots:
        plot(res, out)
    return out / "infer.json"


# ------------------------------------------------------------------------ serving-shape check
def check_verify(device: str) -> None:
    """Refuse ``--verify`` where no GPU will time the model (before any work)."""
    if not str(device).startswith("cuda") or not torch.cuda.is_available():
        raise GacError(
            f"--verify times the model at its serving shapes on a GPU; device {device} is not one "
            "(CUDA is not available here)"
            if not torch.cuda.is_available()
            else f"--verify times the model on a GPU; pass --device cuda, not {device}"
        )


def serve_sweep_config(points: list[Any], **kw: Any) -> SweepConfig:
    """The sweep grid covering serving ``points`` (:class:`gac.hardware.latency.Point`): every
    batch x seq of the prefill shapes and batch x KV of the decode shapes (a superset where the
    shapes are not a grid; :func:`serve_speedups` reads back only the shapes)."""
    pre = [p for p in points if p.phase == "prefill"]
    dec = [p for p in points if p.phase == "decode"]
    return SweepConfig(
        prefill_batches=tuple(sorted({p.batch for p in pre})),
        prefill_seqs=tuple(sorted({p.seq for p in pre})),
        decode_batches=tuple(sorted({p.batch for p in dec})),
        decode_kv=tuple(sorted({p.kv for p in dec})),
        profile_kernels=False,
        **kw,
    )


def serve_speedups(res: dict[str, Any], points: list[Any], variant: str) -> list[dict[str, Any]]:
    """Measured speedup of ``variant`` over the sweep's baseline at each serving shape, with its
    quartile interval ``[base q25 / variant q75, base q75 / variant q25]``; ``slower``: the whole
    interval lies below 1.00 (slower beyond the run's measured spread)."""
    base = res["variants"][res["baseline"]]
    var = res["variants"][variant]

    def at(v: dict[str, Any], p: Any) -> dict[str, Any] | None:
        key = "seq" if p.phase == "prefill" else "kv"
        want = p.seq if p.phase == "prefill" else p.kv
        return next((r for r in v[p.phase] if r["batch"] == p.batch and r.get(key) == want), None)

    rows = []
    for p in points:
        b, r = at(base, p), at(var, p)
        if not b or not r or b.get("status") != "ok" or r.get("status") != "ok":
            rows.append({"point": p.key, "status": (r or {}).get("status", "missing")})
            continue
        lo, hi = b["q25_ms"] / r["q75_ms"], b["q75_ms"] / r["q25_ms"]
        rows.append({
            "point": p.key, "status": "ok", "dense_ms": b["median_ms"], "ms": r["median_ms"],
            "speedup": b["median_ms"] / r["median_ms"], "interval": [lo, hi], "slower": hi < 1.0,
        })  # fmt: skip
    return rows
