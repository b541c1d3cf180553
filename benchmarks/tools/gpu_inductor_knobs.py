"""Same-machine A/B of Inductor options on the default path's compiled steps (issue 9).

Dense decode at B=1 spends ~15 small non-GEMM kernels a layer (norms, rotary, cache writes, attention,
the SiLU product; ``benchmarks/results/h200/decode-trace/README.md``).  Inductor can launch independent
kernels of one graph as one (``combo_kernels``: horizontal fusion) and tune its own kernels' launch
parameters (``coordinate_descent_tuning``).  This script times recorded cells' models (built as
``gpu_branches_ab.py`` builds them) with ``gac.eval.infer.sweep_model``, compiled and in CUDA graphs, with
an option on and off, alternating, and checks each compiled arm's prefill logits against eager.

    PYTHONPATH=src python3 benchmarks/tools/gpu_inductor_knobs.py CELL.json [CELL.json ...] --out knobs.json

Regenerates ``benchmarks/results/h200/inductor-knobs/`` (docs/eval.md: combo kernels on by default, coordinate descent tuning not kept).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from gpu_branches_ab import build  # noqa: E402

ARMS = {
    "off": {},
    "combo": {"combo_kernels": True},
    "cdt": {"coordinate_descent_tuning": True},
}


def logits_error(model: torch.nn.Module, options: dict) -> float:
    """Max |compiled - eager| of one 16-token prefill's logits under ``options``, over the eager max."""
    import torch._inductor.config as ic

    ids = torch.arange(16, device="cuda").unsqueeze(0) * 37 % model.config.vocab_size
    with torch.no_grad():
        ref = model(ids).logits.float()
        torch._dynamo.reset()
        with ic.patch(options):
            got = torch.compile(model.forward, dynamic=False)(ids).logits.float()
    torch._dynamo.reset()
    return float((got - ref).abs().max() / ref.abs().max())


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cells", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--arms", default="off,combo,off,combo,cdt")
    ap.add_argument("--budget-s", type=float, default=500.0, help="stop starting arms after this")
    a = ap.parse_args()
    import torch._inductor.config as ic

    from gac.eval.infer import SweepConfig, sweep_model
    from gac.hardware.timing import environment

    t_start = time.time()
    res = {
        "command": " ".join(sys.argv),
        "env": environment(torch.device("cuda"), torch.bfloat16),
        "arms": {k: ARMS[k] for k in dict.fromkeys(a.arms.split(","))},
        "cells": {},
    }
    cfg = SweepConfig(
        prefill_batches=(1,),
        prefill_seqs=(128,),
        decode_batches=(1, 16),
        decode_kv=(512, 4096),
        compile=True,
        graphs=True,
        profile_kernels=False,
        decode_reps=50,
        prefill_reps=20,
    )
    for path in a.cells:
        cell = json.loads(Path(path).read_text())
        model = build(cell)
        rows = []
        res["cells"][path] = rows
        for i, arm in enumerate(a.arms.split(",")):
            if time.time() - t_start > a.budget_s:
                print(f"budget reached, skipping {path} arm {i} {arm}", flush=True)
                continue
            t0 = time.time()
            with ic.patch(ARMS[arm]):
                r = sweep_model(model, cfg, None, label=f"{Path(path).stem} {arm}")
            first = arm not in [row["arm"] for row in rows]
            err = logits_error(model, ARMS[arm]) if first else None
            points = [
                {
                    k: p.get(k)
                    for k in ("phase", "batch", "seq", "kv", "median_ms", "q25_ms", "q75_ms", "status")
                }
                for p in r["prefill"] + r["decode"]
            ]
            rows.append({"arm": arm, "s": time.time() - t0, "logits_rel_err": err, "points": points})
            print(
                path,
                i,
                arm,
                [
                    (p["phase"][0], p["batch"], p.get("seq") or p.get("kv"), round(p["median_ms"] or 0, 4))
                    for p in points
                ],
                err,
                flush=True,
            )
            Path(a.out).write_text(json.dumps(res, indent=1))
        del model
        torch.cuda.empty_cache()
    res["wall_s"] = time.time() - t_start
    Path(a.out).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
