"""Sweep the Triton GEMV's tile configurations (split-K included) against cuBLAS, per shape and row class.

Every ``(n, k)`` shape a recorded dispatch table holds (the linear layers and factors of the speed grid's
models), at 1, 16, 64 and 128 rows, timed as the dispatch times them (:func:`gac.kernels.gemv.measure_shape`:
64 calls in a CUDA graph over weights rotated past L2, median of 15 replays), over a wider set of
configurations than the dispatch tries; the output says, per row class, how often each configuration won
or came within 3% of the best, to choose :data:`gac.kernels.gemv.CONFIGS` from.

    PYTHONPATH=src python3 benchmarks/tools/gpu_gemv_sweep.py --out $OUT/gemv_sweep.json
    PYTHONPATH=src python3 benchmarks/tools/gpu_gemv_sweep.py --rows 1,16 --no-align-hint --out $OUT/before.json

Regenerates ``benchmarks/results/h200/{gemv-rows64,gemv-splitk,speed-align}/`` sweeps, from which :data:`gac.kernels.gemv.CONFIGS` was chosen.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "benchmarks/results/h200/speed-branches-t/gemv_dispatch.json"

WIDE = {
    1: [(4, 512, 4, 3), (8, 512, 4, 3), (8, 256, 4, 4), (16, 256, 4, 3), (16, 512, 8, 3), (32, 256, 8, 3),
        (4, 512, 4, 3, 2), (8, 512, 4, 3, 2), (8, 512, 4, 3, 4), (16, 256, 4, 3, 2), (16, 256, 4, 3, 4),
        (16, 512, 8, 3, 4), (32, 256, 8, 3, 4), (32, 256, 8, 3, 8), (8, 1024, 8, 3, 4)],
    16: [(16, 128, 4, 4), (16, 256, 4, 3), (32, 128, 4, 4), (32, 256, 8, 3), (64, 128, 4, 3),
         (16, 256, 4, 3, 2), (32, 128, 4, 4, 2), (32, 128, 4, 4, 4), (64, 128, 4, 3, 2), (64, 128, 4, 3, 4),
         (64, 256, 8, 3, 4), (64, 256, 8, 3, 8), (32, 256, 4, 3, 4), (128, 128, 8, 3, 4)],
    64: [(32, 64, 4, 4), (64, 64, 4, 4), (64, 128, 4, 3), (32, 64, 4, 4, 2), (32, 64, 4, 4, 4),
         (64, 64, 4, 4, 2), (64, 64, 4, 4, 4), (64, 128, 4, 3, 4), (64, 64, 4, 4, 8), (128, 64, 8, 3, 2),
         (128, 64, 8, 3, 4)],
    128: [(32, 64, 4, 4), (64, 64, 4, 3), (64, 64, 8, 3), (32, 64, 4, 4, 2), (32, 64, 4, 4, 4),
          (64, 64, 4, 3, 2), (64, 64, 4, 3, 4), (64, 64, 8, 3, 8), (128, 64, 8, 3, 2), (128, 64, 8, 3, 4),
          (64, 128, 8, 3, 4)],
}  # fmt: skip
#: ``--swap``: at 2..16 rows, the weight tile as tl.dot's left operand (``wgmma m64n16`` on sm_90 instead of
#: ``mma.sync m16n8``), ``(BLOCK_N, BLOCK_K, warps, stages, SPLIT, 1)``
SWAP16 = [(64, 64, 4, 4, 1, 1), (64, 64, 4, 4, 2, 1), (64, 64, 4, 4, 4, 1), (64, 128, 4, 3, 1, 1),
          (64, 128, 4, 3, 2, 1), (64, 128, 4, 3, 4, 1), (64, 128, 4, 4, 4, 1), (128, 64, 4, 4, 1, 1),
          (128, 64, 4, 4, 2, 1), (64, 256, 4, 2, 4, 1), (128, 128, 8, 3, 4, 1)]  # fmt: skip
#: ``--swap`` at 64 and 128 rows (``wgmma m64n64`` / ``m64n128``): the same layout, K tiles of 64-128
SWAP64 = [(64, 64, 4, 4, 1, 1), (64, 128, 4, 3, 1, 1), (64, 64, 4, 4, 2, 1), (64, 128, 4, 3, 2, 1),
          (64, 128, 4, 3, 4, 1), (128, 64, 4, 4, 1, 1), (128, 64, 8, 4, 2, 1), (128, 128, 8, 3, 1, 1),
          (64, 64, 4, 5, 4, 1)]  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rows", default="1,16,64,128")
    ap.add_argument("--limit", type=int, default=0, help="first N shapes only (a smoke run)")
    ap.add_argument("--every", type=int, default=2, help="every N-th shape of the table")
    ap.add_argument(
        "--budget-s", type=float, default=1e9, help="stop measuring after this long; keep what ran"
    )
    ap.add_argument(
        "--no-align-hint",
        action="store_true",
        help="the kernel before revision 2: K and the strides passed undivided (gemv._align -> 1)",
    )
    ap.add_argument(
        "--swap",
        action="store_true",
        help="also the SWAP configurations (SWAP16 at 16 rows, SWAP64 at 64 and 128)",
    )
    a = ap.parse_args()
    from gac.kernels import gemv as G

    swap = {16: SWAP16, 64: SWAP64, 128: SWAP64} if a.swap else {}
    wide = {r: WIDE[r] + swap.get(r, []) for r in WIDE}

    if a.no_align_hint:
        G._align = lambda *values: 1

    # equal sizes ordered by name, so that every run takes the same shapes
    keys = sorted({k.split("@")[0] for k in next(iter(json.loads(TABLE.read_text()).values()))},
                  key=lambda s: (int(s.split("x")[0]) * int(s.split("x")[1]), s))  # fmt: skip
    # every other shape, smallest first (a cut budget keeps the mid-sized ones, where cuBLAS is weakest), the two LM heads left out (cuBLAS streams them at 96-99%)
    shapes = [tuple(map(int, k.split("x"))) for k in keys if int(k.split("x")[0]) < 100_000][:: a.every]
    if a.limit:
        shapes = shapes[: a.limit]
    dev = torch.device("cuda")
    from gac.hardware.timing import environment

    out = {"command": " ".join(sys.argv), "env": environment(dev, torch.bfloat16), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name(), "triton": __import__("triton").__version__,
           "align_hint": not a.no_align_hint, "records": []}  # fmt: skip
    t0 = time.time()
    for n, k in shapes:
        if time.time() - t0 > a.budget_s:
            out["stopped"] = f"budget reached before shape {n}x{k}"
            break
        for rows in map(int, a.rows.split(",")):
            rec = G.measure_shape(n, k, rows, torch.bfloat16, dev, configs=wide[rows])
            out["records"].append(rec)
            print(rows, f"{n}x{k}", round(rec["cublas_us"], 2), rec.get("config"), round(rec.get("triton_us", -1), 2),
                  flush=True)  # fmt: skip
    summary = {}
    for rows in wide:
        recs = [r for r in out["records"] if r["rows"] == rows]
        if not recs:
            continue
        near = {}
        for r in recs:
            ok = [t for _, t in r["tried"] if t is not None]
            if not ok:
                continue
            best = min(ok)
            for c, t in r["tried"]:
                if t is not None and t <= 1.03 * best:
                    near[str(c)] = near.get(str(c), 0) + 1
        summary[rows] = {"shapes": len(recs), "triton_wins": sum(r["use"] for r in recs),
                         "within_3pct_of_best": dict(sorted(near.items(), key=lambda kv: -kv[1]))}  # fmt: skip
    out["summary"] = summary
    out["wall_s"] = time.time() - t0
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=1))
    tmp.replace(a.out)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
