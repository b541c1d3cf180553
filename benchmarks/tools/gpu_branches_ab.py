"""Same-machine A/B of one default-path kernel switch on a recorded cell's model.

``--switch branches`` (the default): the parallel second stages (gac.runtime.branches); ``--switch
gemv``: the Triton GEMV (gac.runtime.gemv); ``--switch swap``: the GEMV's SWAP configurations at 16 rows
(off: each shape takes its best plain configuration from the same dispatch record, or cuBLAS); ``--switch
autotune``: ``torch.compile`` in mode ``max-autotune-no-cudagraphs`` (Inductor times its Triton GEMM templates
against cuBLAS per shape) against the default mode; it implies ``--compile``.  The cell's structure (its spec and kept dims,
``gac.hardware.latency.skeleton``) is built on the GPU with random weights; the sweep of
``gac.eval.infer`` times a few points with the switch on and off, alternating (on, off, on, off), CUDA
graphs, and eager or compiled steps (``--compile``).

    PYTHONPATH=src python3 benchmarks/tools/gpu_branches_ab.py CELL.json [CELL.json ...] --out ab.json
    PYTHONPATH=src python3 benchmarks/tools/gpu_branches_ab.py CELL.json --switch gemv --compile \
        --prefill-seqs '' --decode-batches 1,16 --out ab.json

Regenerates the same-machine A/Bs under ``benchmarks/results/h200/{speed-branches,speed-rows,speed-gemv,speed-align,autotune-attempt}/`` and ``h100/grouped-ab/`` (docs/eval.md: parallel branches, the GEMV SWAP configurations, autotune).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def build(cell: dict) -> torch.nn.Module:
    from gac.hardware.latency import skeleton

    model = skeleton(str(cell["cell"]["model"]), cell["results"].get("dims"), "bfloat16", fused=True)
    model = model.to_empty(device="cuda")
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    rot = model.model.rotary_emb
    model.model.rotary_emb = type(rot)(config=model.config).to("cuda")
    return model.eval()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cells", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--switch", choices=("branches", "gemv", "swap", "autotune", "grouped"), default="branches"
    )
    ap.add_argument("--prefill-seqs", default="128,512", help="B1 prompt lengths ('' for none)")
    ap.add_argument("--decode-batches", default="16,64")
    ap.add_argument("--kv", default="512")
    a = ap.parse_args()
    from gac.eval.infer import SweepConfig, sweep_model
    from gac.kernels.gemv import swap_of
    from gac.runtime.branches import BRANCHES, undo_branches_
    from gac.runtime.gemv import GEMV, undo_triton_gemv_

    ints = lambda s: tuple(int(v) for v in s.split(",") if v)  # noqa: E731
    undo = {
        "branches": undo_branches_,
        "gemv": undo_triton_gemv_,
        "swap": undo_triton_gemv_,
        "autotune": undo_triton_gemv_,
        "grouped": undo_branches_,
    }[a.switch]
    decisions = GEMV.decisions

    def without_swap(shapes, dtype, device):  # noqa: ANN001, ANN202
        # the dispatch as it would be without CONFIGS' SWAP members: from each 16-row record, the best
        # plain configuration if it beat cuBLAS by the dispatch's margin (0.97), else cuBLAS
        recs, out = GEMV.measured(dtype, device), {}
        for key, row in decisions(shapes, dtype, device).items():
            row = dict(row)
            if row.get(16) is not None and swap_of(row[16]):
                rec = recs[f"{key}@16"]
                plain = [(t, c) for c, t in rec["tried"] if t is not None and not swap_of(c)]
                row[16] = min(plain)[1] if plain and min(plain)[0] < 0.97 * rec["cublas_us"] else None
            out[key] = row
        return out

    branch_decisions = BRANCHES.decisions

    def streams_only(shapes, dtype, device):  # noqa: ANN001, ANN202
        # the branch dispatch as it would be without the grouped launch: streams where they beat the
        # sequential path by the margin (0.97) in the same record, else sequential
        recs, out = BRANCHES.measured(dtype, device), {}
        for key, row in branch_decisions(shapes, dtype, device).items():
            row = dict(row)
            for r, v in row.items():
                if isinstance(v, list):
                    rec = recs[f"{key}@{r}"]
                    row[r] = True if rec["branched_us"] < 0.97 * rec["sequential_us"] else None
            out[key] = row
        return out

    from gac.hardware.timing import environment

    res = {
        "command": " ".join(sys.argv),
        "env": environment(torch.device("cuda"), torch.bfloat16),
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(),
        "switch": a.switch,
        "cells": {},
    }
    for path in a.cells:
        cell = json.loads(Path(path).read_text())
        model = build(cell)
        rows = []
        for rnd in range(a.rounds):
            for on in (True, False):
                undo(model)
                if a.switch == "swap":  # the GEMV stays on in both arms; its 16-row table changes
                    GEMV.decisions = decisions if on else without_swap  # this run's dispatch object
                if a.switch == "grouped":  # the branches stay on in both arms; their table changes
                    BRANCHES.decisions = branch_decisions if on else streams_only
                cfg = SweepConfig(
                    prefill_batches=(1,) if ints(a.prefill_seqs) else (),
                    prefill_seqs=ints(a.prefill_seqs),
                    decode_batches=ints(a.decode_batches),
                    decode_kv=ints(a.kv),
                    compile=a.compile or a.switch == "autotune",
                    graphs=True,
                    profile_kernels=False,
                    decode_reps=50,
                    prefill_reps=20,
                    **(
                        {"compile_mode": "max-autotune-no-cudagraphs" if on else None}
                        if a.switch == "autotune"
                        else {}
                        if a.switch in ("swap", "grouped")
                        else {a.switch: on}
                    ),
                )
                t0 = time.time()
                r = sweep_model(model, cfg, None, label=f"{a.switch}={on}")
                rows.append(
                    {
                        "round": rnd,
                        a.switch: on,
                        "info": r.get(
                            {"swap": "gemv", "autotune": "compile_mode", "grouped": "branches"}.get(
                                a.switch, a.switch
                            )
                        ),
                        "s": time.time() - t0,
                        "points": [
                            {
                                k: p.get(k)
                                for k in (
                                    "phase",
                                    "batch",
                                    "seq",
                                    "kv",
                                    "median_ms",
                                    "q25_ms",
                                    "q75_ms",
                                    "status",
                                    "setup_s",
                                )
                            }
                            for p in r["prefill"] + r["decode"]
                        ],
                    }
                )
                print(
                    path,
                    rnd,
                    on,
                    [
                        (p["phase"][0], p["batch"], p.get("seq") or p.get("kv"), round(p["median_ms"], 4))
                        for p in r["prefill"] + r["decode"]
                    ],
                    flush=True,
                )
        res["cells"][path] = rows
        del model
        torch.cuda.empty_cache()
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1))
    tmp.replace(a.out)  # whole or not at all
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
