"""Does the latency model's miss at prefill live in its GEMMs? Each grid cell re-priced with its GEMMs as measured alone (CPU).

``gpu_gemm_rows.py`` timed every distinct GEMM of the H100 guarded grids' cells alone, at 1-2048 rows, in a
CUDA graph (``benchmarks/results/h100/gemm-rows/gemm_rows.json``). This re-prices each cell and its dense base
at the prefill points whose rows were timed (B1 x 128/512/2048, B8 x 128 = 1024 rows) with every GEMM launch
at its measured time instead of the model's price (``launch_us + max(FLOP time, bytes / copy_gbps)``), the
other launches as priced, and puts both predicted speedups beside the measured one: if the model's misses
were its GEMM prices, the "oracle" would agree with measurement. Decode points are left out: at 1-64 rows the
default path runs the Triton GEMV, the fused low-rank kernel and parallel branches, not the cuBLAS GEMM timed.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tools/gemm_rows_oracle.py \\
        --out benchmarks/results/cpu/gemm_rows_oracle.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H = ROOT / "benchmarks/results/h100"
ROWS = H / "gemm-rows/gemm_rows.json"
#: (plan directory, model, compressed cells): the guarded grids, as their cells were measured
CELLS = [
    ("speed-guarded", "shape-llama3-8b-8", ["svd-llm-r0.85-gac", "asvd-r0.85-gac"]),
    ("speed-guarded", "shape-qwen2.5-7b-8", ["svd-llm-r0.85-gac", "asvd-r0.85-gac"]),
    ("speed-guarded-margin", "shape-llama3-8b-8", ["svd-llm-r0.718-gac"]),
    ("speed-guarded-margin", "shape-qwen2.5-7b-8", ["svd-llm-r0.769-gac"]),
    ("speed-guarded-margin/asvd-llama-0.787-rerun", "shape-llama3-8b-8", ["asvd-r0.787-gac"]),
    ("speed-guarded-margin/asvd-qwen-0.846", "shape-qwen2.5-7b-8", ["asvd-r0.846-gac"]),
    ("speed-guarded-pruner", "shape-llama3-8b-8", ["llm-pruner-r0.8-gac"]),
    ("speed-guarded-pruner", "shape-qwen2.5-7b-8", ["llm-pruner-r0.8-gac"]),
]


def gemm_keys(model) -> dict[str, tuple[int, int, bool]]:
    """``{module name: (k, n, first factor)}`` of every GEMM launch but the output head (as gpu_gemm_rows.py)."""
    from gac.nn import FactorizedLinear

    firsts = {id(m.v) for m in model.modules() if isinstance(m, FactorizedLinear)}
    emb, head = model.get_input_embeddings(), model.get_output_embeddings()
    out = {}
    for name, mod in model.named_modules():
        w = mod._parameters.get("weight")
        if w is None or w.ndim != 2 or mod is emb or mod is head:
            continue
        first = id(mod) in firsts or "factorized" in (getattr(mod, "kinds", None) or ())
        out[name or "model"] = (int(w.shape[1]), int(w.shape[0]), first)
    return out


def step_ms(model, profile, point, measured: dict | None) -> float:
    from gac.hardware.latency import launches

    keys = gemm_keys(model)
    total = 0.0
    for x in launches(model, profile, point):
        t = x.ms
        if measured is not None and x.kind == "gemm" and x.name in keys:
            r = measured.get((point.tokens, *keys[x.name]))
            if r is not None:
                t = r["measured_us"] * 1e-3
        total += t
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from gac.hardware.latency import Point, infer_of, profile_of
    from gac.runtime.cells import cell_skeleton
    from gac.utils import atomic_write_text

    doc = json.loads(ROWS.read_text())
    measured = {(r["rows"], r["k"], r["n"], r["first_factor"]): r for r in doc["records"]}
    rows = {r["rows"] for r in doc["records"]}
    points = [
        Point("prefill", b, seq=s) for b, s in ((1, 128), (1, 512), (1, 2048), (8, 128)) if b * s in rows
    ]
    out: dict = {"schema": "gac.gemm_rows_oracle/1", "source": str(ROWS.relative_to(ROOT)), "cells": {}}
    for plan, model, cells in CELLS:
        base = json.loads((H / plan / "cells" / model / "base.json").read_text())
        binf, bm = infer_of(base), cell_skeleton(base)
        bmeas = {(r["batch"], r["seq"]): r["median_ms"] for r in binf["prefill"]}
        for c in cells:
            cell = json.loads((H / plan / "cells" / model / f"{c}.json").read_text())
            cm, prof = cell_skeleton(cell), profile_of(cell)
            cmeas = {(r["batch"], r["seq"]): r["median_ms"] for r in infer_of(cell)["prefill"]}
            rec = {}
            for p in points:
                meas = bmeas[(p.batch, p.seq)] / cmeas[(p.batch, p.seq)]
                model_s = step_ms(bm, prof, p, None) / step_ms(cm, prof, p, None)
                oracle_s = step_ms(bm, prof, p, measured) / step_ms(cm, prof, p, measured)
                rec[p.key] = {"measured": meas, "model": model_s, "oracle": oracle_s,
                              "model_over_measured": model_s / meas, "oracle_over_measured": oracle_s / meas}  # fmt: skip
            out["cells"][f"{plan}/{model}/{c}"] = rec
            print(f"{plan}/{model}/{c}: " + ", ".join(
                f"{k} {v['model_over_measured']:.3f}/{v['oracle_over_measured']:.3f}" for k, v in rec.items()))  # fmt: skip
    summary = {}
    for p in points:
        m = [abs(c[p.key]["model_over_measured"] - 1) for c in out["cells"].values()]
        o = [abs(c[p.key]["oracle_over_measured"] - 1) for c in out["cells"].values()]
        summary[p.key] = {"model_worst": max(m), "model_within_5pct": sum(x <= 0.05 for x in m),
                          "oracle_worst": max(o), "oracle_within_5pct": sum(x <= 0.05 for x in o),
                          "model_median": statistics.median(m), "oracle_median": statistics.median(o), "cells": len(m)}  # fmt: skip
        print(p.key, {k: round(v, 3) if isinstance(v, float) else v for k, v in summary[p.key].items()})
    out["summary"] = summary
    atomic_write_text(args.out, json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
