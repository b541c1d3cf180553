"""One model spread over several GPUs with accelerate, against the same model on one GPU.

Issue 13, part 3. ``shape:llama3-8b`` (all 32 layers, random bf16 weights drawn from
seed 0: 16 GB) is evaluated twice with :func:`gac.eval.ppl.perplexity` on Britannica prose
(character tokenizer): once whole on ``cuda:0``, once placed by :func:`gac.eval.dispatch.dispatch_`
(the code behind ``gac eval ppl --max-memory``) over the GPUs with a per-GPU budget below the
model's size, so whole decoder layers land on each GPU. Recorded: both perplexities, the largest
logit difference on one window, the device map (layers per device), each GPU's allocated memory and
the wall time of each evaluation.

Run on a machine with 2+ GPUs::

    PYTHONPATH=src python3 benchmarks/tools/gpu_multi_gpu.py --out $OUT/multi_gpu.json

Regenerates ``benchmarks/results/h200/large-models/multi_gpu.json`` (docs/plans.md: one model over several GPUs).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from gac.data import load_text
from gac.eval.dispatch import dispatch_
from gac.eval.ppl import perplexity
from gac.hardware.timing import environment
from gac.models.shapes import shape_model
from gac.utils import atomic_write_text


def evaluate(
    model, tok, text: str, seq_len: int, windows: int, first: torch.device
) -> tuple[dict, torch.Tensor, float]:
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    t0 = time.perf_counter()
    with torch.no_grad():
        r = perplexity(model, tok, text, seq_len=seq_len, max_windows=windows)
        ids = tok(text[: 4 * seq_len], return_tensors="pt")["input_ids"][:, :seq_len].to(first)
        logits = model(input_ids=ids).logits.float().cpu()
    for i in range(torch.cuda.device_count()):
        torch.cuda.synchronize(i)
    return {k: r[k] for k in ("ppl", "nll", "n_predicted", "n_windows")}, logits, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="shape:llama3-8b")
    ap.add_argument("--per-gpu", default="10GiB", help="max memory per GPU for the spread model")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--windows", type=int, default=8)
    args = ap.parse_args(argv)
    n = torch.cuda.device_count()
    if n < 2:
        print(f"error: this machine has {n} GPU(s); the multi-GPU evaluation needs 2+", file=sys.stderr)
        return 2
    text = load_text("britannica", "test")
    model, tok = shape_model(args.spec, dtype=torch.bfloat16, device="cpu")
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.to("cuda:0")
    one, l1, t1 = evaluate(model, tok, text, args.seq_len, args.windows, torch.device("cuda:0"))
    one_mem = torch.cuda.max_memory_allocated(0)
    model.to("cpu")
    torch.cuda.empty_cache()
    for i in range(n):
        torch.cuda.reset_peak_memory_stats(i)
    spread = {i: args.per_gpu for i in range(n)} | {"cpu": "100GiB"}
    dmap = dispatch_(model, spread)
    first = torch.device(f"cuda:{min(v for v in dmap.values() if isinstance(v, int))}")
    many, l2, t2 = evaluate(model, tok, text, args.seq_len, args.windows, first)
    layers = Counter(str(v) for k, v in dmap.items() if ".layers." in k)
    res = {
        "schema": "gac.multi_gpu/1",
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(torch.device("cuda"), torch.bfloat16),
        "gpus": [torch.cuda.get_device_name(i) for i in range(n)],
        "model": {
            "spec": args.spec,
            "bytes": size,
            "weights": "random bfloat16, seed 0, drawn on the first GPU (gac.models.shapes)",
        },
        "max_memory": {str(k): v for k, v in spread.items()},
        "device_map_layers": dict(layers),
        "device_map": {k: str(v) for k, v in dmap.items()},
        "one_gpu": {**one, "wall_s": round(t1, 2), "peak_bytes": one_mem},
        "spread": {
            **many,
            "wall_s": round(t2, 2),
            "peak_bytes_per_gpu": [torch.cuda.max_memory_allocated(i) for i in range(n)],
        },  # fmt: skip
        "ppl_rel_diff": abs(many["ppl"] - one["ppl"]) / one["ppl"],
        "logits_max_abs_diff": float((l1 - l2).abs().max()),
        "logits_max_abs": float(l1.abs().max()),
    }
    atomic_write_text(Path(args.out), json.dumps(res, indent=1))
    print(
        f"one GPU ppl {one['ppl']:.4f} ({t1:.1f} s); spread {dict(layers)} ppl {many['ppl']:.4f} ({t2:.1f} s); "
        f"max |dlogit| {res['logits_max_abs_diff']:.3g}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
