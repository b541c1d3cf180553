"""Dense decode at long caches: which attention should ``gac_sdpa`` use past KV 4096? (H200/H100)

``gac.kernels.attention.decode_mode`` ("auto") attends a grouped single-token query with two batched GEMMs
up to KV 4096 (measured faster there) and with SDPA on the grouped query beyond, which was not measured.
This times whole compiled, captured decode steps of a dense model shape (random bf16 weights) on the
default path at longer caches with each mode forced: ``sdpa`` (grouped query), ``matmul`` and ``stock``
(transformers' own ``sdpa``, the cache expanded to the query heads), one process.

    PYTHONPATH=src python3 benchmarks/experiments/gpu_decode_attention.py CELL.json --out $OUT/decode_attention.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from gpu_branches_ab import build  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cell", help="a recorded cell (its model spec; its dims are ignored: dense)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,4,16")
    ap.add_argument("--kv", default="8192,32768")
    ap.add_argument("--modes", default="sdpa,matmul,stock")
    a = ap.parse_args()
    from gac.eval.infer import SweepConfig, sweep_model
    from gac.hardware.timing import environment
    from gac.kernels import attention

    ints = lambda s: tuple(int(v) for v in s.split(",") if v)  # noqa: E731
    cell = json.loads(Path(a.cell).read_text())
    model = build({"cell": {"model": cell["cell"]["model"]}, "results": {"dims": None}})
    res = {
        "command": " ".join(sys.argv),
        "env": environment(torch.device("cuda"), torch.bfloat16),
        "modes": {},
    }
    cfg = SweepConfig(
        prefill_batches=(), prefill_seqs=(), decode_batches=ints(a.batches), decode_kv=ints(a.kv),
        profile_kernels=False, decode_reps=30,
    )  # fmt: skip
    for mode in a.modes.split(","):
        attention.DECODE_MODE = mode
        t0 = time.time()
        r = sweep_model(model, cfg, None, label=mode)
        res["modes"][mode] = {
            "s": time.time() - t0,
            "points": {f"B{p['batch']}xKV{p['kv']}": {k: p.get(k) for k in ("median_ms", "q25_ms", "q75_ms", "status", "compiles", "peak_mem_gib", "held_before_gib", "kv_bytes", "error")} for p in r["decode"]},
        }  # fmt: skip
        print(
            mode,
            {k: round(v["median_ms"], 3) for k, v in res["modes"][mode]["points"].items() if v["median_ms"]},
            flush=True,
        )
    attention.DECODE_MODE = "auto"
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
