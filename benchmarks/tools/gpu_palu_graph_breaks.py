"""Why a PaLU decode step compiles many Dynamo frames on CUDA where dense compiles one (GPU).

The palu-default grid's PaLU cells compiled 18-22 Dynamo frames per decode point against dense's one, on CUDA
only (the same kernel path on the CPU, through the Triton interpreter, traces as one graph). This builds a small
Llama-layout model (3 layers, 8 query and 4 KV heads of 64), compresses it with PaLU on the CPU (KV 0.5, key
groups of 2), moves it to CUDA in bf16, switches it to the default decode kernels, and runs the infer sweep's
decode step (:class:`gac.runtime.step.DecodeStep`, compiled as the sweep compiles, captured as a CUDA graph)
with Dynamo's graph-break and recompile logs on, for the dense model and then the PaLU one. It prints the
frames each compiled and every logged reason; nothing is timed.

    TORCH_LOGS=graph_breaks,recompiles PYTHONPATH=src python3 benchmarks/tools/gpu_palu_graph_breaks.py --out $OUT/breaks.json 2> $OUT/breaks.log
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--kv", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the plumbing (no graphs)")
    ap.add_argument("--models", default="dense,palu", help="which of dense, palu")
    args = ap.parse_args()
    from gac.api import CompressConfig, compress_
    from gac.eval.infer import SweepConfig, decode_point
    from gac.nn.fused import fuse_projections_
    from gac.nn.latent import latent_attention_paths
    from gac.runtime.step import compile_step, compiled_frames, use_decode_kernels_
    from gac.testing import tiny_model

    base = tiny_model("llama", hidden=256, layers=3, heads=8, kv_heads=4, head_dim=64)
    g = torch.Generator().manual_seed(0)
    calib = [torch.randint(3, 240, (2, 32), generator=g) for _ in range(4)]
    palu = copy.deepcopy(base)
    compress_(palu, CompressConfig(compressor="palu", param_ratio=0.5, align="none",
                                   options={"k_group_size": 2, "v_group_size": 2}), calib_batches=calib)  # fmt: skip
    out: dict = {"command": " ".join([sys.executable, *sys.argv]), "models": {}}
    cfg = SweepConfig()
    for name, model in (("dense", base), ("palu", palu)):
        if name not in args.models.split(","):
            continue
        model = model.to(args.device, torch.bfloat16 if args.device == "cuda" else torch.float32).eval()
        fuse_projections_(model)  # as the infer eval runs it
        kernels = use_decode_kernels_(model)
        torch._dynamo.reset()
        fwd = compile_step(model.forward)
        f0 = compiled_frames()
        print(f"=== GAC_MARK {name} decode B{args.batch} KV{args.kv}", file=sys.stderr, flush=True)
        rec = decode_point(model, args.batch, args.kv, cfg, args.device == "cuda", 0, None, forward=fwd)
        out["models"][name] = {
            "frames": compiled_frames() - f0, "compiles": rec["compiles"], "median_ms": rec["median_ms"],
            "latent_attention_path": latent_attention_paths(model) if name == "palu" else None,
            "kernels": {k: {kk: v.get(kk) for kk in ("modules", "of", "reason")} for k, v in kernels.items()},
            "counters": {k: dict(v) for k, v in torch._dynamo.utils.counters.items() if k in ("graph_break", "stats")},
        }  # fmt: skip
        print(json.dumps(out["models"][name], default=str)[:2000], file=sys.stderr, flush=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
