"""What the latency guard predicts on the speed grid's shapes (CPU, no weights: meta-device skeletons).

For ``shape:llama3-8b:8`` and ``shape:qwen2.5-7b:8``, SVD-LLM's sites and its native allocation (one
uniform parameter ratio, :func:`gac.compressors.lowrank.uniform_ratio_dims`) at each ``--ratios``, the
profile's per-shape prediction (:func:`gac.allocation.serve_prediction`, whole model: the dense
model's launches outside the sites added, :func:`gac.api.outside_sites_ms`) of unguarded ``gac`` and
the guarded one at each candidate window, or the shapes the guard cannot meet. Each site's loss is its
scalar importance (no calibration: random weights would give none worth having), so which sites stay
dense here says nothing about quality; feasibility and the predicted speedups do not depend on it.

Run (the numbers in docs/allocation.md)::

    OMP_NUM_THREADS=1 python benchmarks/tools/guard_grid_predict.py --out benchmarks/results/cpu/guard_grid_predict.json

``--margins M,...`` runs the guard with each margin (``gac compress --guard-margin``; the guard asks for a
predicted ``1 + M`` x dense at every shape; default: the profile's own) at window 1 only, and ``--scan``
adds, per model and margin, every ``param_ratio`` from 0.99 down to 0.40 in steps of 0.01 at which the
guard meets every shape: ``smaller`` (the largest reduction below ``--ratios``' first that does) and
``deeper`` (the largest ratio below it that does), as ``gac compress``'s refusal names them (to 0.01 here).
The speed-guarded plan's cells on the H100 profile (docs/allocation.md)::

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/tools/guard_grid_predict.py --profile h100-bfloat16 \\
        --ratios 0.85 --margins 0,0.039,0.076 --scan --refusal --out benchmarks/results/cpu/guard_margin_h100.json

``--refusal`` adds, per model and margin, the line ``gac compress`` prints when the guard refuses the
ratio: :meth:`gac.api.Plan.allocation` on a plan of SVD-LLM's sites and its native allocation (one uniform
ratio, which needs no calibration: the same code path, each site's loss its scalar importance).
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="shape:llama3-8b:8,shape:qwen2.5-7b:8")
    ap.add_argument("--ratios", default="0.85,0.7,0.6")
    ap.add_argument("--windows", default="1,0.25,0.5")
    ap.add_argument("--profile", default="h200-bfloat16")
    ap.add_argument("--margins", help="guard margins to try at window 1 (default: the profile's)")
    ap.add_argument("--scan", action="store_true", help="per margin, the ratios the guard meets")
    ap.add_argument("--refusal", action="store_true", help="per margin, gac compress's refusal line")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    from gac.allocation import GuardInfeasible, allocate
    from gac.compressors.lowrank import uniform_ratio_dims
    from gac.hardware.latency import parse_serve
    from gac.hardware.profile import load_profile
    from gac.utils import atomic_write_text

    prof = load_profile(args.profile)
    serve = parse_serve(None)
    if args.margins:
        return margins_main(args, prof, serve)
    rows = []
    for spec in args.models.split(","):
        model, sites, other, dense = grid_sites(spec, prof, serve)
        for ratio in (float(r) for r in args.ratios.split(",")):
            native = uniform_ratio_dims(sites, int(ratio * dense))
            un = allocate("gac", sites, native, prof, serve=serve, other_ms=other, allow_slower=True)
            row = {"model": spec, "ratio": ratio, "sites": len(sites),
                   "unguarded": {r["point"]: r["speedup"] for r in un.serve}, "guarded": {}}  # fmt: skip
            for w in (float(x) for x in args.windows.split(",")):
                t0 = time.perf_counter()
                try:
                    g = allocate("gac", sites, native, prof, serve=serve, other_ms=other, window=w)
                    row["guarded"][f"{w:g}"] = {
                        "status": "ok", "dense_sites": sum(s.dense for s in g.sites), "cost": g.cost,
                        "budget": g.budget, "speedup": {r["point"]: r["speedup"] for r in g.serve},
                    }  # fmt: skip
                except GuardInfeasible as e:
                    row["guarded"][f"{w:g}"] = {"status": "refused", "best": e.shapes}
                row["guarded"][f"{w:g}"]["s"] = time.perf_counter() - t0
                print(spec, ratio, w, row["guarded"][f"{w:g}"], flush=True)
            rows.append(row)
    doc = {"schema": "gac.guard_grid_predict/1", "profile": prof.id, "serve": [p.key for p in serve],
           "settings": vars(args), "rows": rows}  # fmt: skip
    atomic_write_text(args.out, json.dumps(doc, indent=1))


def grid_sites(spec: str, prof, serve):
    """``spec``'s meta-device skeleton, SVD-LLM's sites on it, the dense model's ms outside them per
    serving shape, and the sites' dense parameters."""
    from gac.api import outside_sites_ms
    from gac.compressors.base import get_compressor
    from gac.hardware.latency import skeleton

    model = skeleton(spec, fused=False)
    sites = get_compressor("svd-llm").sites(model)
    return model, sites, outside_sites_ms(model, sites, prof, serve), sum(s.dense_cost for s in sites)


def margins_main(args, prof, serve) -> None:
    """The guard at window 1 with each of ``--margins`` (and, with ``--scan``, the ratios it meets)."""
    from gac.allocation import GuardInfeasible, allocate, resolve_margin
    from gac.compressors.lowrank import uniform_ratio_dims
    from gac.utils import atomic_write_text

    margins = [float(x) for x in args.margins.split(",")]
    rows = []
    for spec in args.models.split(","):
        model, sites, other, dense = grid_sites(spec, prof, serve)

        def guard(ratio: float, m: float, sites=sites, other=other, dense=dense) -> dict:
            native = uniform_ratio_dims(sites, int(ratio * dense))
            try:
                g = allocate("gac", sites, native, prof, serve=serve, other_ms=other, guard_margin=m,
                             max_states=5_000)  # fmt: skip
            except GuardInfeasible as e:
                return {"status": "refused", "best": e.shapes}
            return {"status": "ok", "dense_sites": sum(s.dense for s in g.sites),
                    "speedup": {r["point"]: r["speedup"] for r in g.serve}}  # fmt: skip

        for m in margins:
            r0 = float(args.ratios.split(",")[0])
            row = {"model": spec, "margin": m, "ratio": r0, "at_ratio": guard(r0, m)}
            if args.scan:
                ok = [r / 100 for r in range(99, 39, -1) if guard(r / 100, m)["status"] == "ok"]
                row["feasible_ratios"] = ok
                row["smaller"] = min((r for r in ok if r > r0), default=None)
                row["deeper"] = max((r for r in ok if r < r0), default=None)
            if args.refusal:
                row["refusal"] = refusal(model, sites, other, serve, prof, r0, m)
            print(spec, m, {k: v for k, v in row.items() if k != "feasible_ratios"}, flush=True)
            rows.append(row)
    doc = {"schema": "gac.guard_grid_predict/1", "profile": prof.id, "profile_margin": resolve_margin(prof),
           "serve": [p.key for p in serve], "settings": vars(args), "rows": rows}  # fmt: skip
    atomic_write_text(args.out, json.dumps(doc, indent=1))


def refusal(model, sites, other, serve, prof, ratio: float, margin: float) -> str | None:
    """``gac compress``'s line for SVD-LLM at ``ratio`` with ``margin`` (None: the guard meets it)."""
    from gac.api import CompressConfig, Plan
    from gac.compressors.base import get_compressor
    from gac.compressors.lowrank import uniform_ratio_dims
    from gac.errors import GacError

    cfg = CompressConfig(compressor="svd-llm", param_ratio=ratio, profile=prof.id, guard_margin=margin)
    budget = int(ratio * sum(s.dense_cost for s in sites))
    plan = Plan(config=cfg, compressor=get_compressor("svd-llm"), sites=sites, native=uniform_ratio_dims(sites, budget),
                budget=budget, profile=prof, model_params=0, calibration={}, timings={}, other_ms=other,
                model=model, serve=serve)  # fmt: skip
    plan.use_curves({s.name: None for s in sites})
    try:
        plan.allocation("gac")
    except GacError as e:
        return str(e)
    return None


if __name__ == "__main__":
    main()
