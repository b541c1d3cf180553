"""Decode GEMVs in Triton, used only at the shapes where they were measured faster than cuBLAS.

At decode every projection is a GEMV (``M`` = the batch: 1 to 16 token rows), bound by the
bytes of its weight.  cuBLAS runs the large ones near copy bandwidth (a 28672 x 4096 or the
128256 x 4096 head: 96-99% on an H200), but the mid-sized GEMVs a factorized model is made of
(``4096 x 1736``, ``1736 x 4096``, ``4096 x 2712``: the second factors of attention projections,
the first factors of ``o_proj``) run at 36-47% (``benchmarks/results/h200/issue9/``): its
kernels tile 64 output rows per CTA, so 1736 to 4096 rows fill fewer CTAs than the GPU has SMs.

:func:`gemv` tiles ``BLOCK_N`` (4 to 32) rows per program and streams the whole ``K`` through
each, accumulating in fp32 (one launch, no split-K workspace, no atomics).  ``M = 1`` reduces
with a multiply-sum, ``2 <= M <= 16`` with ``tl.dot`` on a 16-row tile.  It is registered as the
custom op ``gac::gemv`` so that ``torch.compile`` keeps it as one opaque call and CUDA graphs
capture it.

Dispatch (:func:`use_triton_gemv_`): for every linear layer of a model on CUDA (dense, each
factor of a factorized layer, each fused first stage) and each row class (``M = 1`` and
``2..16``), a few tile configurations and cuBLAS are timed alone, 64 calls to a CUDA graph over
weights rotated past L2; the Triton GEMV is used only where its best configuration beat cuBLAS by
``margin``.  Decisions are cached per GPU, torch, Triton and dtype in
``$GAC_CACHE/gemv_dispatch.json``, so a model's shapes are measured once per machine.  Prefill
(more than 16 rows) always takes cuBLAS.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

try:  # Triton is optional: only the GPU path needs it (and the CPU interpreter in tests).
    import triton
    import triton.language as tl

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - depends on the install
    HAVE_TRITON = False

MAX_ROWS = 16
#: tile configurations tried per shape: (BLOCK_N, BLOCK_K, num_warps, num_stages) for M = 1 and
#: for M in 2..16 (``tl.dot`` needs 16-wide tiles).
CONFIGS = {
    1: ((4, 512, 4, 3), (8, 512, 4, 3), (8, 256, 4, 4), (16, 256, 4, 3), (16, 512, 8, 3), (32, 256, 8, 3)),
    16: ((16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 8, 3), (64, 128, 4, 3)),
}
_LOCK = threading.Lock()

if HAVE_TRITON:

    @triton.jit
    def _gemv_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        M,
        N,
        sxm,
        swn,
        sym,
        K: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        pid = tl.program_id(0)
        offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        offs_m = tl.arange(0, BLOCK_M)
        mask_n = offs_n < N
        mask_m = offs_m < M
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask_k = offs_k < K
            w = tl.load(
                w_ptr + offs_n[:, None] * swn + offs_k[None, :],
                mask=mask_n[:, None] & mask_k[None, :],
                other=0.0,
            )
            x = tl.load(
                x_ptr + offs_m[:, None] * sxm + offs_k[None, :],
                mask=mask_m[:, None] & mask_k[None, :],
                other=0.0,
            )
            if BLOCK_M == 1:
                acc += tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=1)[None, :]
            else:
                acc += tl.dot(x, tl.trans(w))
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=mask_n, other=0.0).to(tl.float32)[None, :]
        tl.store(
            y_ptr + offs_m[:, None] * sym + offs_n[None, :],
            acc.to(y_ptr.dtype.element_ty),
            mask=mask_m[:, None] & mask_n[None, :],
        )


def _launch(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, y: torch.Tensor, cfg: tuple[int, ...]
) -> None:
    block_n, block_k, warps, stages = cfg
    m, k = x.shape
    n = w.shape[0]
    _gemv_kernel[(triton.cdiv(n, block_n),)](
        x,
        w,
        b if b is not None else w,
        y,
        m,
        n,
        x.stride(0),
        w.stride(0),
        y.stride(0),
        K=k,
        HAS_BIAS=b is not None,
        BLOCK_M=1 if m == 1 else 16,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
        num_warps=warps,
        num_stages=stages,
    )


@torch.library.custom_op("gac::gemv", mutates_args=())
def gemv_op(
    x: torch.Tensor,
    w: torch.Tensor,
    b: torch.Tensor | None,
    block_n: int,
    block_k: int,
    warps: int,
    stages: int,
) -> torch.Tensor:
    """``x @ wᵀ (+ b)`` for ``x [M <= 16, K]`` (contiguous rows), ``w [N, K]``: one Triton launch."""
    y = torch.empty((x.shape[0], w.shape[0]), device=x.device, dtype=x.dtype)
    _launch(x, w, b, y, (block_n, block_k, warps, stages))
    return y


@gemv_op.register_fake
def _(x, w, b, block_n, block_k, warps, stages):  # noqa: ANN001, ANN202 - shapes only
    return x.new_empty((x.shape[0], w.shape[0]))


def _gemv_setup(ctx, inputs, output) -> None:  # noqa: ANN001 - torch.library's signature
    x, w, b = inputs[:3]
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None


def _gemv_backward(ctx, gy: torch.Tensor):  # noqa: ANN001, ANN202
    # the op is an inference kernel, but a model whose parameters require grad is traced by
    # torch.compile with autograd in view: give it the linear layer's gradients (cuBLAS)
    x, w = ctx.saved_tensors
    gx = gy @ w if ctx.needs_input_grad[0] else None
    gw = gy.t() @ x if ctx.needs_input_grad[1] else None
    gb = gy.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
    return gx, gw, gb, None, None, None, None


gemv_op.register_autograd(_gemv_backward, setup_context=_gemv_setup)


def gemv(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None, cfg: tuple[int, ...] | None = None
) -> torch.Tensor:
    """``F.linear(x, w, b)`` through the Triton GEMV for inputs of at most 16 token rows.

    Raises:
        ValueError: no Triton, more than 16 rows, or shapes that disagree.
    """
    if not HAVE_TRITON:
        raise ValueError("the Triton GEMV needs Triton (pip install triton)")
    lead, k = x.shape[:-1], x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.shape[0] > MAX_ROWS or w.shape[1] != k:
        raise ValueError(
            f"gemv takes at most {MAX_ROWS} rows of w's in_features; got x {tuple(x.shape)}, w {tuple(w.shape)}"
        )
    cfg = cfg or CONFIGS[1 if x2.shape[0] == 1 else 16][0]
    y = gemv_op(x2.contiguous(), w.contiguous(), b, *cfg)
    return y.reshape(*lead, w.shape[0])


def dispatch_linear(
    x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, table: dict[int, Any] | None
) -> torch.Tensor:
    """``F.linear``, or the Triton GEMV where ``table`` (row class -> config) says it was faster."""
    if table:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 0 < rows <= MAX_ROWS:
            cfg = table.get(1 if rows == 1 else 16)
            if cfg is not None:
                return gemv(x, w, b, tuple(cfg))
    return F.linear(x, w, b)


class GemvLinear(nn.Linear):
    """An ``nn.Linear`` whose decode-sized inputs take the Triton GEMV where it was measured faster.

    Made in place from an ``nn.Linear`` by :func:`use_triton_gemv_` (the class is swapped; the
    parameters are the same tensors), and back by :func:`undo_triton_gemv_`.
    """

    gemv_table: dict[int, Any]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dispatch_linear(x, self.weight, self.bias, self.gemv_table)


# ------------------------------------------------------------------------------ measuring


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


def _bench_graph(fn: Callable[[int], Any], reps: int = 64, samples: int = 15) -> float:
    """Median µs per call of ``fn(i)`` captured ``reps`` times in a CUDA graph (:func:`graph_timings`)."""
    ts = graph_timings(fn, reps, samples)
    return ts[len(ts) // 2]


def measure_shape(
    n: int, k: int, rows: int, dtype: torch.dtype, device: torch.device, margin: float = 0.97
) -> dict[str, Any]:
    """Time cuBLAS and each Triton configuration at ``[rows, k] @ [n, k]ᵀ``; pick the winner."""
    w_bytes = n * k * torch.tensor([], dtype=dtype).element_size()
    copies = copies_past_l2(w_bytes)
    ws = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(copies)]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    y = torch.empty(rows, n, device=device, dtype=dtype)
    rec: dict[str, Any] = {"n": n, "k": k, "rows": rows}
    rec["cublas_us"] = _bench_graph(lambda i: torch.mm(x, ws[i % copies].t(), out=y))
    best = None
    for cfg in CONFIGS[1 if rows == 1 else 16]:
        try:
            t = _bench_graph(lambda i, cfg=cfg: _launch(x, ws[i % copies], None, y, cfg))
        except Exception as e:  # noqa: BLE001 - a configuration that does not compile/fit is skipped
            rec.setdefault("failed", []).append(f"{cfg}: {type(e).__name__}")
            continue
        if best is None or t < best[0]:
            best = (t, cfg)
    if best is not None:
        rec["triton_us"], rec["config"] = best[0], list(best[1])
    rec["use"] = best is not None and best[0] < margin * rec["cublas_us"]
    ws.clear()
    return rec


def _cache_path(name: str = "gemv_dispatch.json") -> Path:
    from gac.models.loading import cache_root

    return cache_root() / name


def _cache_key(device: torch.device, dtype: torch.dtype) -> str:
    name = torch.cuda.get_device_name(device).replace(" ", "-")
    return f"{name}|torch{torch.__version__}|triton{triton.__version__}|{str(dtype).removeprefix('torch.')}"


def _load_cache(name: str = "gemv_dispatch.json") -> dict[str, Any]:
    """A per-machine dispatch cache under ``$GAC_CACHE`` ({} when absent or unreadable)."""
    p = _cache_path(name)
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(data: dict[str, Any], name: str = "gemv_dispatch.json") -> None:
    p = _cache_path(name)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, p)
    except OSError:  # a read-only cache costs a re-measure next time, nothing else
        pass


def cached_decisions(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    keys: list[str],
    measure: Callable[[str, int], dict[str, Any]],
    row_classes: tuple[int, ...],
    what: str,
    fresh: Callable[[dict[str, Any], int], bool] | None = None,
) -> dict[str, dict[int, Any]]:
    """Per key ``{rows: config | None}`` from the per-machine cache ``name`` (None = the existing path).

    What the cache lacks is measured (``measure(key, rows)``, a record with ``use`` and ``config``)
    under a progress bar, and saved after each measurement, so an interrupted run keeps what it
    measured.  A cached record for which ``fresh(record, rows)`` is false (measured with another
    set of configurations) is measured again.
    """
    with _LOCK:
        data = _load_cache(name)
        table = data.setdefault(_cache_key(device, dtype), {})
        missing = [
            (k, r)
            for k in keys
            for r in row_classes
            if f"{k}@{r}" not in table or (fresh is not None and not fresh(table[f"{k}@{r}"], r))
        ]
        if missing:
            from gac.utils import track

            for k, r in track(missing, f"{what}: measuring {len(missing)} shape(s) once on this GPU"):
                table[f"{k}@{r}"] = measure(k, r)
                _save_cache(data, name)
        out: dict[str, dict[int, Any]] = {}
        for k in keys:
            out[k] = {r: (table[f"{k}@{r}"]["config"] if table[f"{k}@{r}"].get("use") else None)
                      for r in row_classes}  # fmt: skip
        return out


def decisions(
    shapes: list[tuple[int, int]], dtype: torch.dtype, device: torch.device
) -> dict[tuple[int, int], dict[int, Any]]:
    """Per ``(n, k)``: ``{1: config | None, 16: config | None}`` (None = cuBLAS), measured once per machine."""
    keys = {f"{n}x{k}": (n, k) for n, k in shapes}
    got = cached_decisions(
        "gemv_dispatch.json", device, dtype, list(keys),
        lambda key, rows: measure_shape(*keys[key], rows, dtype, device), (1, 16), "Triton GEMV dispatch",
    )  # fmt: skip
    return {keys[k]: row for k, row in got.items()}


def measured(dtype: torch.dtype, device: torch.device, name: str = "gemv_dispatch.json") -> dict[str, Any]:
    """The cached measurements of this GPU in the dispatch cache ``name`` (for reports)."""
    return dict(_load_cache(name).get(_cache_key(device, dtype), {}))


def use_triton_gemv_(model: nn.Module, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Route every decode-sized GEMV of ``model`` that the Triton kernel runs faster to it, in place.

    Every ``nn.Linear`` (dense, or a factor of a factorized layer) and every fused first stage
    (:class:`~gac.kernels.fusion.FusedInputProjection`) is looked up in the dispatch table of its
    ``(out, in)`` shape (measured on first use, :func:`decisions`); where neither row class wins,
    the module is left as it is.  Modules whose qualified name ends with one of ``skip`` are left
    alone.  Returns ``{"modules": switched, "of": linear layers seen, "shapes": {..}}``; a model
    not on CUDA, or no Triton, switches nothing (``"reason"`` says why).
    """
    from gac.kernels.fusion import FusedInputProjection

    p = next(model.parameters(), None)
    if p is None or p.device.type != "cuda":
        return {"modules": 0, "of": 0, "reason": "not on CUDA"}
    if not HAVE_TRITON:
        return {"modules": 0, "of": 0, "reason": "Triton is not installed"}
    mods = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, (nn.Linear, FusedInputProjection)) and not name.endswith(skip or ("\0",))
    ]
    shapes = sorted({tuple(m.weight.shape) for _, m in mods})
    table = decisions(shapes, p.dtype, p.device)
    n = 0
    for _, m in mods:
        row = table[tuple(m.weight.shape)]
        if not any(v is not None for v in row.values()):
            continue
        m.gemv_table = row
        if type(m) is nn.Linear:
            m.__class__ = GemvLinear
        n += 1
    used = {
        f"{a}x{b}": {str(r): c for r, c in row.items()} for (a, b), row in table.items() if any(row.values())
    }
    return {"modules": n, "of": len(mods), "shapes": used}


def undo_triton_gemv_(model: nn.Module) -> int:
    """Back to cuBLAS everywhere. Returns the modules changed."""
    n = 0
    for m in model.modules():
        if getattr(m, "gemv_table", None) is not None:
            m.gemv_table = None
            if type(m) is GemvLinear:
                m.__class__ = nn.Linear
            n += 1
    return n
