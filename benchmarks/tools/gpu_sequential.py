"""A model larger than a GPU budget, compressed layer by layer, against the all-in-memory path.

Issue 13, part 3. The model is ``shape:llama3-8b:LAYERS`` (Llama-3-8B's layer shapes, random bf16
weights drawn from seed 0 by gac.models.shapes, so both paths start from the same weights). It is compressed
twice with the same :class:`gac.api.CompressConfig` (``svd-llm`` at 15% reduction, ``--align gac``,
calibration on Britannica prose encoded by the character tokenizer):

* **all in memory**: the model on the GPU, calibration by whole-model forward passes;
* **layer by layer**: the model in CPU memory, ``max_gpu_memory`` below its size, so
  :func:`gac.compressors.calibration.collect_stats_sequential` moves one decoder layer at a time.

Recorded: each path's peak GPU memory (``torch.cuda.max_memory_allocated``, reset before each),
wall time, the dims (must be equal) and, per factorized site, the relative Frobenius difference of
the two factor products ``A @ B`` (float noise expected: bf16 activations, fp32 statistics).

Run on the GPU machine::

    PYTHONPATH=src python3 benchmarks/tools/gpu_sequential.py --out $OUT/sequential.json

CPU smoke run (tiny widths; "GPU" memory is then not measured)::

    PYTHONPATH=src python3 benchmarks/tools/gpu_sequential.py --spec shape:llama3-8b:2:8 --budget 0.01 --out /tmp/seq.json

Regenerates ``benchmarks/results/h200/large-models/`` (docs/plans.md: layer-by-layer compression under a GPU budget).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import torch

from gac.api import CompressConfig, compress_
from gac.hardware.timing import environment
from gac.models.shapes import shape_model
from gac.nn import FactorizedLinear
from gac.utils import atomic_write_text


def factors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {
        n: (m.u.weight.detach().float().cpu(), m.v.weight.detach().float().cpu())
        for n, m in model.named_modules()
        if isinstance(m, FactorizedLinear)
    }


def run_path(spec: str, dtype: torch.dtype, cfg: CompressConfig, sequential: bool) -> dict:
    cuda = torch.cuda.is_available()
    model, tok = shape_model(spec, dtype=dtype, device="cpu" if sequential or not cuda else "cuda")
    params_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    rep = compress_(model, cfg, tokenizer=tok)
    if cuda:
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    out = {
        "path": "layer by layer" if sequential else "all in memory",
        "model_bytes": params_bytes,
        "wall_s": round(wall, 2),
        "peak_gpu_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "gpu_bytes_before": base_alloc if cuda else None,
        "sequential": bool(rep.timings.get("sequential")),
        "pct_aligned": rep.allocation.get("pct_aligned"),
        "params_after": rep.model_params_after,
        "timings": rep.timings,
    }
    f = factors(model)
    out["dims"] = {n: int(a.shape[1]) for n, (a, _) in f.items()}
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out, f


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument("--compressor", default="svd-llm")
    ap.add_argument("--ratio", type=float, default=0.85)
    ap.add_argument(
        "--budget", type=float, default=2.0, help="--max-gpu-memory of the layer-by-layer path (GiB)"
    )
    ap.add_argument("--n-samples", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dtype = torch.bfloat16 if cuda else torch.float32
    common = dict(compressor=args.compressor, param_ratio=args.ratio, align="gac",
                  n_samples=args.n_samples, seq_len=args.seq_len)  # fmt: skip
    a, fa = run_path(args.spec, dtype, CompressConfig(**common), sequential=False)
    b, fb = run_path(args.spec, dtype, CompressConfig(**common, max_gpu_memory=args.budget), sequential=True)
    rel = {}
    dev = "cuda" if cuda else "cpu"
    for n in fa:
        if n not in fb or fa[n][0].shape != fb[n][0].shape:
            continue
        pa = fa[n][0].to(dev) @ fa[n][1].to(dev)
        pb = fb[n][0].to(dev) @ fb[n][1].to(dev)
        rel[n] = float(torch.linalg.norm(pa - pb) / torch.linalg.norm(pa))
    vals = sorted(rel.values())
    res = {
        "schema": "gac.sequential/1",
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(torch.device(dev), dtype),
        "model": {
            "spec": args.spec,
            "weights": f"random {dtype}, seed 0, drawn on the first GPU (gac.models.shapes)",
        },
        "config": {**common, "max_gpu_memory_gib": args.budget},
        "all_in_memory": {k: v for k, v in a.items() if k != "dims"},
        "layer_by_layer": {k: v for k, v in b.items() if k != "dims"},
        "dims_equal": a["dims"] == b["dims"],
        "n_sites": len(a["dims"]),
        "n_sites_differing": sum(
            a["dims"].get(k) != b["dims"].get(k) for k in set(a["dims"]) | set(b["dims"])
        ),
        "product_rel_diff": {
            "max": vals[-1] if vals else None,
            "median": vals[len(vals) // 2] if vals else None,
            "n": len(vals),
        },
        "peak_gpu_ratio": (b["peak_gpu_bytes"] / a["peak_gpu_bytes"])
        if cuda and a["peak_gpu_bytes"]
        else None,
        "dims_all_in_memory": a["dims"],
    }
    atomic_write_text(Path(args.out), json.dumps(res, indent=1))
    gib = lambda x: None if x is None else round(x / 2**30, 2)  # noqa: E731
    print(
        f"model {gib(a['model_bytes'])} GiB; peak GPU all-in-memory {gib(a['peak_gpu_bytes'])} GiB "
        f"({a['wall_s']} s), layer-by-layer {gib(b['peak_gpu_bytes'])} GiB ({b['wall_s']} s); dims equal "
        f"{res['dims_equal']}; A@B rel diff max {res['product_rel_diff']['max']}"
    )
    return 0 if res["dims_equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
