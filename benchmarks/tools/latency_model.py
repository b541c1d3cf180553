"""Predicted against measured speedups from committed H200 results (issue 9, item 4). CPU only.

1. ``--fit-profiles``: fit the launch constants of the H200 profiles from the committed issue-9
   diagnostic (``benchmarks/results/h200/decode-diag/diag.json``): ``launch_us`` and ``copy_gbps`` by
   least squares of ``t = launch_us + bytes / copy_gbps`` over the cuBLAS time of every GEMV shape
   at one row (``gemv_table``, timed in a CUDA graph), ``aux_us`` = the median time of the
   non-GEMM kernels of the dense model's traced decode step; ``fused_lowrank`` (the fused low-rank
   kernel's ``t = launch_us + bytes / gbps`` at one token row) from its dispatch measurements of 48
   site shapes (``benchmarks/results/h200/speed-grid/lowrank_fused_dispatch.json``); written into
   ``src/gac/profiles/h200-{bfloat16,float16}.json`` with their provenance.
2. The comparison: the latency model (:mod:`gac.hardware.latency`) at every measured grid point of
   (a) the diagnostic's decode grid (dense against SVD-LLM 15% gac, default path), (b) every plan
   directory given (``cells/<model>/*.json``: each cell against its model's ``base`` cell).
   Writes ``latency_model.json`` and ``latency_model.md`` into ``--out``.

  OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/tools/latency_model.py --fit-profiles \\
      --out benchmarks/results/h200/decode-diag benchmarks/results/h200/speed benchmarks/results/h200/paper

Regenerates the launch constants of ``src/gac/profiles/h200-*.json`` (``--fit-profiles``) and ``benchmarks/results/h200/decode-diag/latency_model.{json,md}`` (docs/eval.md, docs/hardware.md: predicted against measured speedup).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DIAG = ROOT / "benchmarks/results/h200/decode-diag/diag.json"
DIMS = ROOT / "benchmarks/results/h200/speed/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json"
FUSED = ROOT / "benchmarks/results/h200/speed-grid/lowrank_fused_dispatch.json"
PROFILES = [ROOT / "src/gac/profiles/h200-bfloat16.json", ROOT / "src/gac/profiles/h200-float16.json"]
GEMM = re.compile(r"nvjet|gemm|gemv|splitK|cutlass|xmma", re.I)
TOL = 0.15


def fit_from_diag(diag: dict) -> dict:
    from gac.hardware.latency import fit_launch

    rows = [v for v in diag["gemv_table"].values() if v["rows"] == 1 and v.get("cublas_us")]
    nbytes = [2 * v["n"] * v["k"] for v in rows]  # bf16 weights; the vector is negligible
    # unweighted, as the shipped H200 profiles were fitted (tests/hardware/test_latency.py checks they match)
    t0, gbps = fit_launch(nbytes, [v["cublas_us"] for v in rows], relative=False)
    seq = diag["models"]["dense"]["trace"][0]["sequence"]
    aux = [r["us"] for r in seq if not r["name"].startswith("##") and not GEMM.search(r["name"])]
    return {
        "launch_us": t0,
        "copy_gbps": gbps,
        "aux_us": round(statistics.median(aux), 3),
        "latency_fit": {
            "source": "benchmarks/results/h200/decode-diag/diag.json (NVIDIA H200, bfloat16, torch 2.11.0+cu130)",
            "method": "launch_us, copy_gbps: least squares t = launch_us + weight bytes / copy_gbps over the "
            "cuBLAS time of each GEMV shape at 1 row, 64 calls per CUDA graph (gemv_table); aux_us: median "
            "time of the non-GEMM kernels of one traced compiled decode step of the dense model "
            "(models.dense.trace, profiler-timed)",
            "gemv_points": len(rows),
            "bytes_range": [min(nbytes), max(nbytes)],
            "aux_kernels": len(aux),
            "command": "PYTHONPATH=src python3 benchmarks/tools/latency_model.py --fit-profiles",
        },
    }


def fused_from_dispatch(dispatch: dict) -> dict:
    """``fused_lowrank`` of the profile from the committed dispatch table of one machine."""
    from gac.hardware.latency import fit_fused_lowrank

    (key, table), *rest = dispatch.items()
    if rest:
        raise SystemExit(f"{FUSED}: one machine's table expected, found {len(rest) + 1}")
    recs = [r for k, r in table.items() if k.endswith("@1")]
    fit = fit_fused_lowrank(recs, f"{FUSED.relative_to(ROOT)} ({key})")
    fit["fit"]["command"] = "PYTHONPATH=src python3 benchmarks/tools/latency_model.py --fit-profiles"
    return fit


def write_profiles(fit: dict) -> None:
    for p in PROFILES:
        d = json.loads(p.read_text())
        ops = d.pop("ops")
        margin = (d.get("latency_fit") or {}).get("guard_margin")  # benchmarks/tools/guard_margin.py's
        d.update(fit)
        if margin is not None:
            d["latency_fit"] = {**d["latency_fit"], "guard_margin": margin}
        if d.get("dtype") != "bfloat16":
            note = "measured in bfloat16 on the same GPU; float16 moves the same bytes per element"
            d["latency_fit"] = {**d["latency_fit"], "note": note}
            d["fused_lowrank"] = {
                **fit["fused_lowrank"],
                "fit": {**fit["fused_lowrank"]["fit"], "note": note},
            }
        d["ops"] = ops
        p.write_text(json.dumps(d, indent=1) + "\n")
        fl = fit["fused_lowrank"]
        print(f"wrote {p.relative_to(ROOT)}: launch_us={fit['launch_us']} copy_gbps={fit['copy_gbps']} "
              f"aux_us={fit['aux_us']}; fused_lowrank launch_us={fl['launch_us']} gbps={fl['gbps']}")  # fmt: skip


def diag_rows(diag: dict, profile) -> list[dict]:
    from gac.hardware.latency import predict_pair, skeleton

    spec = diag["spec"]["spec"]
    dims = json.loads(DIMS.read_text())["results"]["dims"]
    best = diag["best_attn"]

    def default_path(name: str) -> dict:
        recs = [r for r in diag["models"][name]["decode"]
                if r.get("attn") == best[f"{r['batch']}x{r['kv']}"] and r.get("gemv")]  # fmt: skip
        return {"decode": recs, "prefill": [], "config": {"gqa_decode": True}}

    return predict_pair(skeleton(spec), skeleton(spec, dims), profile, default_path("dense"),
                        default_path("svd-llm-gac"))  # fmt: skip


def plan_rows(plan: Path) -> dict:
    from gac.runtime.cells import compare_cells

    out = {}
    for mdir in sorted((plan / "cells").iterdir()):
        cells = {p.stem: json.loads(p.read_text()) for p in sorted(mdir.glob("*.json"))}
        base = cells.pop("base", None)
        if base is None or not cells:
            continue
        for cid, r in compare_cells(base, list(cells.values())).items():
            out[cid] = r
    return out


def fmt(x, f=".3f"):
    return "–" if x is None else format(x, f)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("plans", nargs="*", type=Path, help="plan directories with cells/<model>/*.json")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/h200/decode-diag")
    ap.add_argument(
        "--fit-profiles", action="store_true", help="write the fitted constants into the H200 profiles"
    )
    a = ap.parse_args()
    from gac.hardware.profile import load_profile

    diag = json.loads(DIAG.read_text())
    fit = fit_from_diag(diag)
    fit["fused_lowrank"] = fused_from_dispatch(json.loads(FUSED.read_text()))
    if a.fit_profiles:
        write_profiles(fit)
    prof = load_profile("h200-bfloat16")
    if prof.launch_us is None:
        print("note:", prof.latency_note())
    res = {
        "schema": "gac.latency-model/1",
        "command": "OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/tools/latency_model.py "
        + " ".join(sys.argv[1:]),
        "fit": fit,
        "profile": prof.id,
        "constants": {
            "launch_us": prof.launch_us_or_default,
            "copy_gbps": prof.copy_gbps_or_default,
            "aux_us": prof.aux_us_or_default,
            "fused_lowrank": prof.fused_lowrank,
        },  # fmt: skip
        "tolerance": TOL,
        "groups": {},
    }
    res["groups"]["issue9-diag: svd-llm-r0.85-gac"] = {"rows": diag_rows(diag, prof), "profile": prof.id}
    for plan in a.plans:
        for cid, r in plan_rows(plan).items():
            res["groups"][f"{plan.relative_to(ROOT) if plan.is_absolute() else plan}: {cid}"] = r
    allrows = [(g, r) for g, v in res["groups"].items() for r in v.get("rows", [])]
    bad = [(g, r) for g, r in allrows if abs(r["ratio"] - 1) > TOL]
    w = max(allrows, key=lambda gr: abs(math.log(gr[1]["ratio"])), default=None)
    res["summary"] = {
        "points": len(allrows),
        "within_tolerance": len(allrows) - len(bad),
        "worst": None if w is None else {"group": w[0], **w[1]},
        "median_abs_error": statistics.median(abs(r["ratio"] - 1) for _, r in allrows) if allrows else None,
    }
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "latency_model.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        "# Latency model: predicted against measured speedup (H200, bf16)",
        "",
        f"`{res['command']}`",
        "",
        f"Profile `{prof.id}`: launch_us = {prof.launch_us_or_default}, copy_gbps = {prof.copy_gbps_or_default:g}, "
        f"aux_us = {prof.aux_us_or_default} (fitted from `diag.json`: {fit['latency_fit']['gemv_points']} GEMV "
        f"shapes, {fit['latency_fit']['aux_kernels']} traced non-GEMM kernels). Model: `gac.hardware.latency`.",
        "",
        "Fused low-rank kernel (one launch per switched site at its rows): "
        + (
            f"launch_us = {prof.fused_lowrank['launch_us']}, gbps = {prof.fused_lowrank['gbps']:g}, rows "
            f"{prof.fused_lowrank['rows']} (fitted from {prof.fused_lowrank['fit']['points']} site shapes of "
            f"`{prof.fused_lowrank['fit']['source'].split(' ')[0]}`)."
            if prof.fused_lowrank
            else "not in the profile: priced as one GEMM launch (launch_us, copy_gbps)."
        ),
        "",
        f"{len(allrows) - len(bad)} of {len(allrows)} points within {TOL:.0%}; worst: "
        + ("–" if w is None else f"{w[0]} {w[1]['point']} (predicted / measured = {w[1]['ratio']:.3f})"),
        "",
        "| variant over base | point | measured ms (base, variant) | predicted ms (base, variant) | measured speedup "
        "| predicted speedup | predicted / measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for g, r in allrows:
        flag = "" if abs(r["ratio"] - 1) <= TOL else " **>15%**"
        lines.append(
            f"| {g} | {r['point']} | {r['measured_ms'][0]:.3f}, {r['measured_ms'][1]:.3f} | "
            f"{r['predicted_ms'][0]:.3f}, {r['predicted_ms'][1]:.3f} | {r['measured_speedup']:.3f} | "
            f"{r['predicted_speedup']:.3f} | {r['ratio']:.3f}{flag} |"
        )
    (a.out / "latency_model.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[6:]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
