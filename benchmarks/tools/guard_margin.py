"""The latency model's error on committed speed grids, and the latency guard's margin from it (CPU only).

For every plan directory given (``cells/<model>/*.json``, each compressed cell against its model's
``base`` cell, rebuilt on the meta device as ``gac report`` does: :func:`gac.runtime.cells.compare_cells`)
the ratio predicted / measured speedup at every grid point; per grid the worst ``|ratio - 1|``, the
points within 5%, the median error and the most optimistic ratio (the model predicting faster than
measured: what the guard's margin must cover).

``--wave TMxTN`` re-prices every GEMM launch with a wave-quantization term (output tiles of TM x TN
on the profile GPU's SM count; the efficiency at the launch's rows over that at the row count the
profile's curve was measured at) and prints the same statistics: the rows-aware term tried in
docs/allocation.md ("Where the latency model is optimistic"). It is not in the model.

The shipped margins come from the grids run without a margin (``speed-guarded``, ``speed-final``); the
H100 margin grid (``speed-guarded-margin``, run with it) is judged beside them: priced as it ran, its most
optimistic ratio, 1.077 (SVD-LLM on Llama-3-8B at prefill B1×512), was 0.001 over the 0.076 it ran with; re-priced
with the profile's GEMV and prefill-attention fields it is 1.061, and the grid run under them
(``speed-guarded-v2``, margin 0.071) 1.067; with the split-K reductions and bias copies priced too, the two pairs
rerun under them (``speed-guarded-v3``) are within 5% everywhere, worst 1.049 (docs/allocation.md). Those two
launch kinds leave the H100 margin at 0.071 and take the H200's from 0.039 to 0.038.

Points where a cell or its base fell back from the default path (timed eager, ``fallback`` in the record)
are left out: they are not what the model prices.

``--write GRID[+GRID...]=PROFILE.json`` (repeatable) stores the guard's margin measured on those grids in the
profile: ``latency_fit.guard_margin = {"value": most optimistic ratio - 1, rounded up to 0.001, "source", ...}``
(read by :func:`gac.allocation.resolve_margin`). The margins shipped in ``src/gac/profiles/``::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tools/guard_margin.py \\
        benchmarks/results/h100/speed-guarded benchmarks/results/h100/speed-guarded-margin \\
        benchmarks/results/h100/speed-guarded-margin/asvd-llama-0.787 \\
        benchmarks/results/h100/speed-guarded-margin/asvd-llama-0.787-rerun \\
        benchmarks/results/h100/speed-guarded-margin/asvd-qwen-0.846 benchmarks/results/h100/speed-guarded-pruner \\
        benchmarks/results/h100/speed-guarded-v2/{svd-llm-llama,svd-llm-qwen,asvd-llama,asvd-qwen} \\
        benchmarks/results/h100/speed-guarded-v3/{svd-llm-qwen,asvd-llama} \\
        benchmarks/results/h200/speed-final \\
        --write benchmarks/results/h100/speed-guarded=src/gac/profiles/h100-bfloat16.json \\
        --write benchmarks/results/h200/speed-final=src/gac/profiles/h200-bfloat16.json \\
        --write benchmarks/results/h200/speed-final=src/gac/profiles/h200-float16.json --wave 64x64,64x128,128x128 \\
        --out benchmarks/results/cpu/guard_margin.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = "PYTHONPATH=src python benchmarks/tools/guard_margin.py"


def _fell_back(cell: dict) -> set[str]:
    """The points of a cell's ``infer`` record that were not timed on the default path (``fallback``)."""
    from gac.hardware.latency import Point, infer_of

    inf = infer_of(cell) or {}
    return {
        Point.from_record(r).key for r in inf.get("prefill", []) + inf.get("decode", []) if r.get("fallback")
    }


def grid_rows(grid: Path) -> list[dict]:
    """predict_pair rows of every compressed cell of ``grid`` against its model's base cell; a point where
    either cell fell back from the default path (timed eager: ``fallback`` in its record) is left out."""
    from gac.runtime.cells import compare_cells

    out = []
    for mdir in sorted((grid / "cells").iterdir()):
        cells = {p.stem: json.loads(p.read_text()) for p in sorted(mdir.glob("*.json"))}
        base = cells.pop("base", None)
        if base is None:
            continue
        ok = [c for c in cells.values() if c.get("status") == "ok"]
        fell = {str(c["id"]): _fell_back(c) | _fell_back(base) for c in ok}
        for cid, r in compare_cells(base, ok).items():
            out += [
                {**row, "cell": cid} for row in r.get("rows", []) if row["point"] not in fell.get(cid, ())
            ]
    return out


def stats(rows: list[dict]) -> dict:
    err = [abs(r["ratio"] - 1) for r in rows]
    worst = max(rows, key=lambda r: abs(math.log(r["ratio"])))
    opt = max(rows, key=lambda r: r["ratio"])
    pick = ("cell", "point", "predicted_speedup", "measured_speedup", "ratio")
    return {
        "points": len(rows),
        "within_5pct": sum(e <= 0.05 for e in err),
        "median_abs_err": statistics.median(err),
        "worst_abs_err": abs(worst["ratio"] - 1),
        "worst": {k: worst[k] for k in pick},
        "most_optimistic": {k: opt[k] for k in pick},
    }


def excess_per_launch(grid: Path) -> dict[str, dict[str, float]]:
    """Per compressed cell and point: (measured - predicted ms of the cell) - (the same of dense), in µs
    per GEMM launch the cell has beyond dense: the cost per extra launch the model misses."""
    from gac.hardware.latency import Point, compiled_of, gqa_decode_of, infer_of, predict, profile_of
    from gac.runtime.cells import cell_skeleton

    out: dict[str, dict[str, float]] = {}
    for mdir in sorted((grid / "cells").iterdir()):
        cells = {p.stem: json.loads(p.read_text()) for p in sorted(mdir.glob("*.json"))}
        base = cells.pop("base", None)
        if base is None:
            continue
        binf, bskel = infer_of(base), cell_skeleton(base)
        ref = {
            Point.from_record(r).key: r for r in binf["prefill"] + binf["decode"] if r.get("status") == "ok"
        }
        for c in cells.values():
            if c.get("status") != "ok":
                continue
            inf, prof, skel = infer_of(c), profile_of(c), cell_skeleton(c)
            row = out.setdefault(str(c["id"]), {})
            for r in inf["prefill"] + inf["decode"]:
                p = Point.from_record(r)
                b = ref.get(p.key)
                if r.get("status") != "ok" or b is None:
                    continue
                pb = predict(bskel, prof, p, gqa_decode_of(binf), compiled_of(binf, p.phase))
                pv = predict(skel, prof, p, gqa_decode_of(inf), compiled_of(inf, p.phase))
                extra = pv["gemm_launches"] - pb["gemm_launches"]
                miss = (r["median_ms"] - pv["ms"]) - (b["median_ms"] - pb["ms"])
                row[p.key] = round(miss * 1e3 / extra, 2) if extra else None
    return out


_LAUNCHES = None


def use_wave(tm: int, tn: int) -> None:
    """Re-price GEMM launches with a wave-quantization efficiency (the tried rows-aware term)."""
    import gac.hardware.latency as lat
    from gac.nn import FactorizedLinear

    global _LAUNCHES
    _LAUNCHES = _LAUNCHES or lat.launches
    orig = _LAUNCHES

    def q(m: int, n: int, sms: int) -> float:
        t = math.ceil(m / tm) * math.ceil(n / tn)
        return t / (math.ceil(t / sms) * sms)

    def launches(model, profile, point, gqa_decode=True, compiled=True):
        out = orig(model, profile, point, gqa_decode, compiled)
        firsts = {id(m.v) for m in model.modules() if isinstance(m, FactorizedLinear)}
        shape = {}
        for name, mod in model.named_modules():
            w = mod._parameters.get("weight")
            if w is not None and w.ndim == 2:
                low = id(mod) in firsts or "factorized" in (getattr(mod, "kinds", None) or ())
                shape[name] = (int(getattr(mod, "out_features", w.shape[0])), low)
        sms = int(profile.env.get("sm_count") or 132)
        for x in out:
            if x.kind == "gemm" and x.name in shape:
                n, low = shape[x.name]
                ctx = profile.ops["lowrank_r" if low else "gemm_n"].curve.get("context", {}).get("M", 8192)
                x.flop_ms *= q(ctx, n, sms) / q(point.tokens, n, sms)
        return out

    lat.launches = launches


def write_margin(grids: list[Path], profile: Path, s: dict) -> float:
    o = s["most_optimistic"]
    value = math.ceil(max(o["ratio"] - 1.0, 0.0) * 1000 - 1e-9) / 1000
    d = json.loads(profile.read_text())
    fit = d.setdefault("latency_fit", {})
    names = " + ".join(str(g.relative_to(ROOT)) for g in grids)
    fit["guard_margin"] = {
        "value": value,
        "source": f"{names}: {s['points']} points, the latency model's most optimistic "
        f"ratio {o['ratio']:.3f} ({o['cell']} at {o['point']}: predicted {o['predicted_speedup']:.3f}x, "
        f"measured {o['measured_speedup']:.3f}x)",
        "method": "max over the grids' compressed cells and points timed on the default path of predicted / "
        "measured speedup over dense, minus 1, rounded up to 0.001 (gac.hardware.latency.predict_pair, as gac "
        "report computes it)",
        "command": COMMAND,
    }
    if d.get("dtype") != "bfloat16":
        fit["guard_margin"]["note"] = "measured in bfloat16 on the same GPU"
    profile.write_text(json.dumps(d, indent=1) + "\n")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("grids", nargs="+", type=Path)
    ap.add_argument("--wave", help="TMxTN,...: also price GEMMs with a wave-quantization term of these tiles")
    ap.add_argument(
        "--write", action="append", default=[], help="GRID[+GRID...]=PROFILE.json: store their margin"
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    from gac.utils import atomic_write_text

    grids = [g.resolve() for g in args.grids]
    doc: dict = {"schema": "gac.guard_margin/1", "command": COMMAND, "grids": {}}
    for g in grids:
        s = stats(grid_rows(g))
        doc["grids"][str(g.relative_to(ROOT))] = {
            "model": s,
            "excess_us_per_extra_launch": excess_per_launch(g),
        }
        print(f"{g.relative_to(ROOT)}: worst {s['worst_abs_err']:.3f} ({s['worst']['cell']} {s['worst']['point']}), "
              f"{s['within_5pct']}/{s['points']} within 5%, median {s['median_abs_err']:.3f}, "
              f"most optimistic {s['most_optimistic']['ratio']:.3f}")  # fmt: skip
    for spec in args.write:
        lhs, rhs = spec.split("=", 1)
        gs, prof = [Path(x).resolve() for x in lhs.split("+")], Path(rhs).resolve()
        s = stats([r for g in gs for r in grid_rows(g)])
        print(f"{prof.relative_to(ROOT)}: guard_margin {write_margin(gs, prof, s)}")
    for tiles in args.wave.split(",") if args.wave else []:
        tm, tn = (int(x) for x in tiles.lower().split("x"))
        use_wave(tm, tn)
        for g in grids:
            s = stats(grid_rows(g))
            doc["grids"][str(g.relative_to(ROOT))][f"wave_{tm}x{tn}"] = s
            print(f"  with wave {tm}x{tn}: {g.relative_to(ROOT)}: worst {s['worst_abs_err']:.3f} "
                  f"({s['worst']['cell']} {s['worst']['point']}), {s['within_5pct']}/{s['points']} within 5%, "
                  f"median {s['median_abs_err']:.3f}")  # fmt: skip
    if args.out:
        atomic_write_text(args.out, json.dumps(doc, indent=1, default=float))


if __name__ == "__main__":
    main()
