"""Each GEMM of the speed grid's cells, timed alone at the grid's row counts, against its latency-model price.

The H100 guarded grid's latency model is 7.6% optimistic at prefill B1x512 (docs/allocation.md, "Where the
latency model is optimistic"): every compressed cell there ran 4.3-5.4 us per extra GEMM launch slower than
priced at 512 rows, about 1 us at 64 rows, under 1 us at 128. Whether that is a per-GEMM cost of the shapes at
those rows (a rows-aware term the model could take from the profile) or only appears in the whole compiled
step is what this measures: every distinct GEMM of the given cells' structures (the dense base and each
compressed cell, q/k/v and gate/up fused as ``gac eval infer`` runs them; factorized sites as their two
factors) at each ``--rows``, ``x[rows, k] @ W[n, k]^T`` timed 64 times in a CUDA graph over weight copies
past L2 (:func:`gac.hardware.timing.bench_graph`, as ``gac profile``'s launch constants), beside the price
:func:`gac.hardware.latency.launches` gives it (launch_us + max(FLOP time, bytes / copy_gbps)). Per row
count: the median excess (measured - priced) of the dense-shaped and of the factor-shaped GEMMs, and the
fixed cost a fit ``t = t0 + priced variable time`` gives.

GPU (60 shapes x 7 row counts, a few minutes; JSON under $OUT)::

    PYTHONPATH=src python benchmarks/tools/gpu_gemm_rows.py --out $OUT/gemm_rows.json \\
        benchmarks/results/h100/speed-guarded/cells/shape-llama3-8b-8/{base,svd-llm-r0.85-gac,asvd-r0.85-gac}.json \\
        benchmarks/results/h100/speed-guarded/cells/shape-qwen2.5-7b-8/{base,svd-llm-r0.85-gac}.json

CPU smoke run (wall-clock, so the numbers mean nothing): ``--device cpu --rows 4 --limit 3``. The output head
(run at B rows, not B x S) is left out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def gemm_shapes(cell: dict) -> dict[tuple[int, int, bool], str]:
    """``{(k, n, first_factor): module name}`` of every GEMM of a recorded cell's structure."""
    from gac.nn import FactorizedLinear
    from gac.runtime.cells import cell_skeleton

    model = cell_skeleton(cell)
    emb, head = (
        model.get_input_embeddings(),
        model.get_output_embeddings(),
    )  # the head runs at B rows: left out
    firsts = {id(m.v) for m in model.modules() if isinstance(m, FactorizedLinear)}
    out: dict[tuple[int, int, bool], str] = {}
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight")
        if w is None or w.ndim != 2 or mod is emb or mod is head:
            continue
        first = id(mod) in firsts or "factorized" in (getattr(mod, "kinds", None) or ())
        out.setdefault((int(w.shape[1]), int(w.shape[0]), first), name)
    return out


def priced_us(profile, k: int, n: int, first: bool, rows: int) -> tuple[float, float]:
    """``(launch µs, variable µs)`` the latency model gives one ``[rows, k] @ [k, n]`` GEMM."""
    import torch
    from torch import nn

    from gac.hardware.latency import Point, launches
    from gac.nn import FactorizedLinear

    with torch.device("meta"):
        holder = nn.Module()
        holder.f = (
            FactorizedLinear(k, n, n, dtype=torch.bfloat16)
            if first
            else nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        )
    if first:  # the first factor [n, k] of a pair, priced as such (lowrank_r); its second factor dropped
        holder.f.u = nn.Identity()
    x = next(x for x in launches(holder, profile, Point("prefill", 1, seq=rows)) if x.kind == "gemm")
    return x.fixed_us, max(x.flop_ms, x.byte_ms) * 1e3


def measure(k: int, n: int, rows: int, device, dtype) -> float:
    import torch

    from gac.hardware.timing import bench, bench_graph, copies_past_l2

    elem = torch.tensor([], dtype=dtype).element_size()
    ws = [torch.randn(n, k, device=device, dtype=dtype) for _ in range(copies_past_l2(n * k * elem))]
    x = torch.randn(rows, k, device=device, dtype=dtype)
    y = torch.empty(rows, n, device=device, dtype=dtype)

    def fn(i: int) -> None:
        torch.mm(x, ws[i % len(ws)].t(), out=y)

    if device.type == "cuda":
        return bench_graph(fn)
    return bench(fn, device, warmup_ms=1.0, rep_ms=5.0).median_ms * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", type=Path, help="gac run cell JSONs (a base and compressed cells)")
    ap.add_argument("--rows", default="1,16,64,128,512,1024,2048")
    ap.add_argument("--profile", default=None, help="profile spec (default: this GPU's shipped one)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--limit", type=int, default=0, help="at most this many shapes (smoke runs)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    import torch

    from gac.hardware.latency import profile_of
    from gac.hardware.profile import load_profile
    from gac.hardware.timing import environment
    from gac.utils import atomic_write_text

    device, dtype = torch.device(args.device), torch.bfloat16
    cells = [json.loads(p.read_text()) for p in args.cells]
    prof = load_profile(args.profile) if args.profile else profile_of(cells[-1])
    shapes: dict[tuple[int, int, bool], list[str]] = {}
    for p, c in zip(args.cells, cells, strict=True):
        for key, name in gemm_shapes(c).items():
            shapes.setdefault(key, []).append(f"{p.parent.name}/{p.stem}:{name}")
    keys = sorted(shapes)[: args.limit or None]
    rows_list = [int(r) for r in args.rows.split(",")]
    recs = []
    for rows in rows_list:
        for k, n, first in keys:
            fixed, var = priced_us(prof, k, n, first, rows)
            us = measure(k, n, rows, device, dtype)
            recs.append({"rows": rows, "k": k, "n": n, "first_factor": first, "where": shapes[(k, n, first)],
                         "measured_us": us, "priced_us": fixed + var, "priced_fixed_us": fixed,
                         "excess_us": us - fixed - var})  # fmt: skip
            print(f"rows {rows:5d} {k:6d}x{n:<6d} {'v' if first else ' '} measured {us:8.2f} us, "
                  f"priced {fixed + var:8.2f} (excess {us - fixed - var:+7.2f})", flush=True)  # fmt: skip
    summary = {}
    for rows in rows_list:
        at = [r for r in recs if r["rows"] == rows]
        dense = [r["excess_us"] for r in at if not r["first_factor"] and r["k"] * r["n"] >= 4096 * 4096]
        small = [r["excess_us"] for r in at if r["first_factor"] or r["k"] * r["n"] < 4096 * 4096]
        summary[str(rows)] = {
            "median_excess_us_large": statistics.median(dense) if dense else None,
            "median_excess_us_small_or_first_factor": statistics.median(small) if small else None,
            "fixed_us_fit": statistics.median(r["measured_us"] - (r["priced_us"] - r["priced_fixed_us"]) for r in at),
        }  # fmt: skip
        print(rows, summary[str(rows)])
    doc = {"schema": "gac.gemm_rows/1", "env": environment(), "profile": prof.id, "dtype": "bfloat16",
           "cells": [str(p) for p in args.cells], "summary": summary, "records": recs}  # fmt: skip
    atomic_write_text(args.out, json.dumps(doc, indent=1, default=str))


if __name__ == "__main__":
    main()
