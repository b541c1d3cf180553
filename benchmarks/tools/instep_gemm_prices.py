"""Each GEMM of a compiled prefill step as it ran inside the step, beside the latency model's price for it (CPU).

``gpu_decode_trace.py`` records the first traced replay's kernel sequence (``first_step``) of a cell's model.
This pairs that sequence's GEMM kernels, in order, with the latency model's GEMM launches of the same cell
(:func:`gac.hardware.latency.launches` on :func:`gac.runtime.cells.cell_skeleton`, put in execution order: a
block's fused first stage runs before the second stages it feeds), checks that the counts agree, and sums
priced and in-step microseconds per kind of launch (the module path without its layer) and per model, with the
times ``gpu_gemm_rows.py`` measured for the same shapes alone where it has them.

    PYTHONPATH=src python benchmarks/tools/instep_gemm_prices.py --out benchmarks/results/h100/svdllm-trace/instep_gemms.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
H = ROOT / "benchmarks/results/h100"
TR = H / "svdllm-trace"
M = H / "speed-guarded-margin/cells"
#: (trace file, model in it, cell JSON, prefill rows)
RUNS = [
    (TR / "trace_svdllm_llama_prefill.json", "dense", M / "shape-llama3-8b-8/base.json", 512),
    (TR / "trace_svdllm_llama_prefill.json", "svd-llm", M / "shape-llama3-8b-8/svd-llm-r0.718-gac.json", 512),
    (TR / "trace_svdllm_qwen_prefill.json", "dense", M / "shape-qwen2.5-7b-8/base.json", 512),
    (TR / "trace_svdllm_qwen_prefill.json", "svd-llm", M / "shape-qwen2.5-7b-8/svd-llm-r0.769-gac.json", 512),
    (TR / "trace_svdllm_llama_prefill.json", "dense", M / "shape-llama3-8b-8/base.json", 128),
    (TR / "trace_svdllm_llama_prefill.json", "svd-llm", M / "shape-llama3-8b-8/svd-llm-r0.718-gac.json", 128),
]
#: cuBLAS GEMM kernels; left out: the rotary frequencies' fp32 ``simt_sgemm`` and split-K reductions
GEMM = re.compile(r"nvjet|gemm|cutlass|xmma", re.I)
NOT_GEMM = re.compile(r"simt_sgemm|splitKreduce", re.I)


def execution_order(names: list[str]) -> list[int]:
    """Indices of ``names`` (``named_modules`` order) in the order a step runs them: within each attention or MLP
    block, the fused first stage (``fused_*``) first."""
    blocks: dict[str, list[int]] = {}
    for i, n in enumerate(names):
        m = re.match(r"(.*?\.layers\.\d+\.[^.]+)\.", n)  # the layer's attention or MLP block
        blocks.setdefault(m.group(1) if m else n, []).append(i)
    order: list[int] = []
    for idx in blocks.values():
        order += sorted(idx, key=lambda i: ".fused_" not in names[i])
    return order


def kind(name: str) -> str:
    return re.sub(r"^model\.layers\.\d+\.", "", name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    from gac.guard import atomic_write_text
    from gac.hardware.latency import Point, launches, profile_of
    from gac.runtime.cells import cell_skeleton

    alone: dict[tuple[int, int, int], float] = {}
    rows_file = H / "gemm-rows/gemm_rows.json"
    for r in json.loads(rows_file.read_text())["records"]:
        alone[(r["rows"], r["k"], r["n"])] = r["measured_us"]
    res: dict = {"schema": "gac.instep_gemms/1", "command": " ".join(["python", *sys.argv]), "runs": []}
    for trace, name, cellf, rows in RUNS:
        cell = json.loads(cellf.read_text())
        model = cell_skeleton(cell)
        shapes = {n: (int(m.weight.shape[1]), int(m.weight.shape[0])) for n, m in model.named_modules()
                  if getattr(m, "weight", None) is not None and m.weight.ndim == 2}  # fmt: skip
        priced = [x for x in launches(model, profile_of(cell), Point("prefill", 1, rows)) if x.kind == "gemm"]
        priced = [priced[i] for i in execution_order([x.name for x in priced])]
        tr = json.loads(trace.read_text())
        pt = next(p for p in tr["models"][name]["points"] if p["phase"] == "prefill" and p["seq"] == rows)
        ran = [
            k for k in pt["trace"]["first_step"] if GEMM.search(k["name"]) and not NOT_GEMM.search(k["name"])
        ]
        if len(ran) != len(priced):
            raise SystemExit(f"{trace.name} {name}: {len(ran)} GEMM kernels traced, {len(priced)} priced")
        by: dict[str, dict] = {}
        for x, k in zip(priced, ran, strict=True):
            s = by.setdefault(kind(x.name), {"n": 0, "priced_us": 0.0, "instep_us": 0.0, "alone_us": 0.0})
            kn = shapes.get(x.name)
            s["n"] += 1
            s["priced_us"] += x.ms * 1e3
            s["instep_us"] += k["us"]
            s["alone_us"] = None if s["alone_us"] is None or kn is None or (rows, *kn) not in alone else (
                s["alone_us"] + alone[(rows, *kn)])  # fmt: skip
            s["shape"] = kn
        tot = {f: sum(s[f] for s in by.values()) if all(s[f] is not None for s in by.values()) else None
               for f in ("priced_us", "instep_us", "alone_us")}  # fmt: skip
        res["runs"].append({"trace": str(trace.relative_to(ROOT)), "model": name, "cell": str(cellf.relative_to(ROOT)),
                            "rows": rows, "step_median_us": pt["median_ms"] * 1e3, "gemms": len(ran),
                            "total": tot, "by_kind": by})  # fmt: skip
        print(
            f"{cellf.parent.name} {name} B1x{rows}: {len(ran)} GEMMs, priced {tot['priced_us']:.0f} us, "
            f"in step {tot['instep_us']:.0f} us, alone {tot['alone_us'] or float('nan'):.0f} us",
            file=sys.stderr,
        )
        for kd, s in by.items():
            print(
                f"  {kd:34s} {str(s['shape']):14s} x{s['n']}: priced {s['priced_us']:7.1f} in step "
                f"{s['instep_us']:7.1f} ({s['instep_us'] / s['priced_us']:.2f}) alone "
                f"{s['alone_us'] if s['alone_us'] is not None else float('nan'):7.1f}",
                file=sys.stderr,
            )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(a.out, json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
