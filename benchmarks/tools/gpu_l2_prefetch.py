"""Does prefetching the next weight into L2 shorten chains of small GEMMs? (H200 experiment)

The GEMMs of one decoder layer of the speed grid's shapes (Llama-3-8B, dense and SVD-LLM at 15% with
gac's ranks; the default path's order: fused first stages, then second stages), 8 layers of distinct
weights (GBs: every replay reads DRAM), captured as one CUDA graph of ``torch.mm`` calls and replayed.
Variants insert a prefetch launch (:func:`launch`) before GEMM ``i`` that prefetches the first
``P`` bytes of GEMM ``i+1``'s weight (same stream, or a side stream joined before GEMM ``i+1``), or,
for factorized sites only, the whole second factor before the first stage.  The prefetch kernels
(below) issue one ``prefetch.global.L2::evict_last`` per 128-byte line, or one
``cp.async.bulk.prefetch.L2`` per 16 KiB chunk (sm_90); they return nothing to registers.  Measured
slower everywhere (``benchmarks/results/h200/l2-prefetch/README.md``), so nothing of it is in gac.

    PYTHONPATH=src python3 benchmarks/tools/gpu_l2_prefetch.py --out $OUT/l2_prefetch.json

Regenerates ``benchmarks/results/h200/l2-prefetch/`` (docs/eval.md: L2 prefetch, measured slower, not kept).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl

MB = 2**20

LINE = 128  # bytes per L2 line
#: lines per program of the line kernel, bytes per lane of the bulk kernel
LINES_PER_PROGRAM = 256
BULK_CHUNK = 16384
BULK_LANES = 32


@triton.jit
def _prefetch_lines(ptr, nlines, LINES: tl.constexpr):
    idx = tl.program_id(0) * LINES + tl.arange(0, LINES)
    idx = tl.minimum(idx, nlines - 1).to(tl.int64)
    p = ptr.to(tl.pointer_type(tl.int8)) + idx * 128
    tl.inline_asm_elementwise(
        "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
        "=r,l",
        [p],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _prefetch_bulk(ptr, nbytes, CHUNK: tl.constexpr, LANES: tl.constexpr):
    lane = tl.program_id(0) * LANES + tl.arange(0, LANES)
    start = lane.to(tl.int64) * CHUNK
    size = tl.minimum(nbytes - start, CHUNK)
    ok = size > 0
    start = tl.where(ok, start, 0)
    size = tl.where(ok, size, 16).to(tl.int32)
    p = ptr.to(tl.pointer_type(tl.int8)) + start
    tl.inline_asm_elementwise(
        "cp.async.bulk.prefetch.L2.global [$1], $2;\n\tmov.u32 $0, 0;",
        "=r,l,r",
        [p, size],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


def launch(w: torch.Tensor, nbytes: int, kind: str = "lines") -> None:
    """Prefetch the first ``nbytes`` of contiguous ``w`` into L2."""
    nbytes = min(int(nbytes), w.numel() * w.element_size())
    if nbytes <= 0:
        return
    if kind == "bulk":
        nbytes -= nbytes % 16
        lanes = -(-nbytes // BULK_CHUNK)
        _prefetch_bulk[(-(-lanes // BULK_LANES),)](w, nbytes, CHUNK=BULK_CHUNK, LANES=BULK_LANES, num_warps=1)
    else:
        nlines = -(-nbytes // LINE)
        _prefetch_lines[(-(-nlines // LINES_PER_PROGRAM),)](w, nlines, LINES=LINES_PER_PROGRAM, num_warps=4)


# (name, N, K) per layer, in the default path's order
LLAMA_DENSE = [("qkv", 6144, 4096), ("o", 4096, 4096), ("gate_up", 28672, 4096), ("down", 4096, 14336)]
LLAMA_SVDLLM = [
    ("qkv.v", 1736 + 688 + 688, 4096),
    ("q.u", 4096, 1736),
    ("k.u", 1024, 688),
    ("v.u", 1024, 688),
    ("o.v", 1736, 4096),
    ("o.u", 4096, 1736),
    ("gate_up.v", 2704 * 2, 4096),
    ("gate.u", 14336, 2704),
    ("up.u", 14336, 2704),
    ("down.v", 2704, 14336),
    ("down.u", 4096, 2704),
]


def chain(shapes, layers, rows, dev, dtype):  # noqa: ANN001, ANN201
    ws, xs, ys = [], {}, {}
    for _ in range(layers):
        for name, n, k in shapes:
            ws.append((name, torch.randn(n, k, device=dev, dtype=dtype) * 0.02))
            xs.setdefault(k, torch.randn(rows, k, device=dev, dtype=dtype))
            ys.setdefault(n, torch.empty(rows, n, device=dev, dtype=dtype))
    return ws, xs, ys


def run_variant(ws, xs, ys, variant, side):  # noqa: ANN001, ANN201
    kind, p, where = variant.get("kind"), variant.get("bytes"), variant.get("where")
    main = torch.cuda.current_stream()
    for i, (name, w) in enumerate(ws):
        nxt = ws[i + 1][1] if i + 1 < len(ws) else None
        if where == "next" and nxt is not None:
            if variant.get("side"):
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    launch(nxt, p, kind)
            else:
                launch(nxt, p, kind)
        elif where == "u" and name.endswith(".v"):
            # the second factors that follow this first stage, whole (up to p bytes in all)
            left = p
            for uname, u in ws[i + 1 :]:
                if left <= 0 or not uname.endswith(".u"):
                    break
                launch(u, left, kind)
                left -= u.numel() * u.element_size()
        k = w.shape[1]
        torch.mm(xs[k], w.t(), out=ys[w.shape[0]])
        if variant.get("side") and where == "next":
            main.wait_stream(side)


def time_graph(fn, reps=20):  # noqa: ANN001, ANN201
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1000)
    del g
    return ts


def l2_proof(dev, dtype):  # noqa: ANN001, ANN201
    """mm at 16 rows over a 14 MB weight: cold, right after a prefetch of it, and the prefetch alone."""
    out = {}
    copies = 16
    ws = [torch.randn(4096, 1736, device=dev, dtype=dtype) for _ in range(copies)]
    x = torch.randn(16, 1736, device=dev, dtype=dtype)
    y = torch.empty(16, 4096, device=dev, dtype=dtype)
    nb = ws[0].numel() * 2
    for kind in ("lines", "bulk"):

        def cold():
            for w in ws:
                torch.mm(x, w.t(), out=y)

        def pf_then_mm(kind=kind):
            for w in ws:
                launch(w, nb, kind)
                torch.mm(x, w.t(), out=y)

        def pf_only(kind=kind):
            for w in ws:
                launch(w, nb, kind)

        def pf_all_then_mm(kind=kind):  # prefetch two ahead: the data has time to arrive
            for j, w in enumerate(ws):
                if j + 2 < copies:
                    launch(ws[j + 2], nb, kind)
                torch.mm(x, w.t(), out=y)

        for nm, fn in (
            ("cold", cold),
            ("pf_then_mm", pf_then_mm),
            ("pf_only", pf_only),
            ("pf_2ahead", pf_all_then_mm),
        ):
            if nm == "cold" and "cold" in out:
                continue
            key = nm if nm == "cold" else f"{nm}_{kind}"
            out[key] = statistics.median(time_graph(fn)) / copies
    out["ideal_us_per_weight"] = nb / 4.27e12 * 1e6
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,16,64,128")
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args()
    from gac.hardware.timing import environment

    dev, dtype = torch.device("cuda"), torch.bfloat16
    res = {"command": " ".join(sys.argv), "env": environment(dev, dtype), "gpu": torch.cuda.get_device_name()}
    t0 = time.time()
    res["l2_proof"] = l2_proof(dev, dtype)
    print("l2 proof", json.dumps({k: round(v, 2) for k, v in res["l2_proof"].items()}), flush=True)
    variants = [{"name": "base"}]
    for kind in ("lines", "bulk"):
        for p in (4, 16, 48):
            variants.append({"name": f"next{p}MB_{kind}", "where": "next", "bytes": p * MB, "kind": kind})
    variants.append(
        {"name": "next16MB_lines_side", "where": "next", "bytes": 16 * MB, "kind": "lines", "side": True}
    )
    variants.append(
        {"name": "next16MB_bulk_side", "where": "next", "bytes": 16 * MB, "kind": "bulk", "side": True}
    )
    variants.append({"name": "u48MB_lines", "where": "u", "bytes": 48 * MB, "kind": "lines"})
    variants.append({"name": "u48MB_bulk", "where": "u", "bytes": 48 * MB, "kind": "bulk"})
    side = torch.cuda.Stream()
    res["chains"] = []
    for model, shapes in (("llama_dense", LLAMA_DENSE), ("llama_svdllm", LLAMA_SVDLLM)):
        for rows in [int(r) for r in a.rows.split(",")]:
            ws, xs, ys = chain(shapes, a.layers, rows, dev, dtype)
            nbytes = sum(w.numel() * 2 for _, w in ws)
            row = {"model": model, "rows": rows, "weight_bytes": nbytes, "gemms": len(ws), "variants": {}}
            order = variants + [variants[0]]  # base again at the end: the spread
            for j, v in enumerate(order):
                if v.get("where") == "u" and model == "llama_dense":
                    continue
                ts = time_graph(lambda v=v, c=(ws, xs, ys): run_variant(*c, v, side))
                key = v["name"] + ("_again" if j == len(order) - 1 else "")
                row["variants"][key] = {
                    "median_us": statistics.median(ts),
                    "min_us": min(ts),
                    "max_us": max(ts),
                }
            b = row["variants"]["base"]["median_us"]
            row["bytes_ideal_us"] = nbytes / 4.27e12 * 1e6
            print(
                model, rows, f"base {b:.1f} us (ideal {row['bytes_ideal_us']:.1f})",
                " ".join(f"{k}={v['median_us'] / b:.3f}" for k, v in row["variants"].items() if k != "base"),
                flush=True,
            )  # fmt: skip
            res["chains"].append(row)
            del ws, xs, ys
            torch.cuda.empty_cache()
    res["wall_s"] = time.time() - t0
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
