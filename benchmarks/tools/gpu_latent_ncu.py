"""One latent decode launch, repeated, for Nsight Compute: where the kernel's time goes.

Builds the inputs of :func:`gac.kernels.latent_attention.latent_decode_attention` for one model
shape (as ``gpu_latent_kernel.py``: Llama-3-8B or Qwen2.5-7B, head_dim 128, random bf16 latents,
every slot valid), key group ``--group`` (values ``--v-group``, default the same), ranks at KV 0.5
unless given, one batch and cache length, and calls the op ``--calls`` times (the first compiles).
The launch is the table's, or ``GAC_LATENT_LAUNCH``'s. Prints the launch and the median ms of the
calls after the first (CUDA events; under ``ncu`` the times are the profiler's, not the kernel's).

Run under the profiler, one launch of the flash kernel after two warm calls::

    ncu --clock-control none --set full -k regex:_latent_flash_kernel --launch-skip 2 --launch-count 1 \\
        -o $OUT/llama_g4_b16 python3 benchmarks/tools/gpu_latent_ncu.py --model llama3-8b --group 4 --batch 16 --kv 32768
"""

from __future__ import annotations

import argparse
import json

import torch
from gpu_latent_kernel import MODELS  # the same shapes as the kernel sweep (this folder is on the path)

from gac.kernels import latent_attention as kl
from gac.testing import latent_decode_inputs


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b", choices=sorted(MODELS))
    ap.add_argument("--group", type=int, default=4)
    ap.add_argument("--v-group", type=int, default=0)
    ap.add_argument("--rank-k", type=int, default=0)
    ap.add_argument("--rank-v", type=int, default=0)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--kv", type=int, default=32768)
    ap.add_argument("--calls", type=int, default=5)
    args = ap.parse_args()
    h, kvh, hd, theta, bias = MODELS[args.model]
    gk = args.group
    gv = args.v_group or gk
    rk = args.rank_k or gk * hd // 2
    rv = args.rank_v or gv * hd // 2
    dev = torch.device("cuda")
    q, _, _, pack, inv = latent_decode_inputs(
        1, h, kvh, hd, 64, gk, gv, [rk] * (kvh // gk), [rv] * (kvh // gv), bias=bias,
        dtype=torch.bfloat16, device=dev, theta=theta,
    )  # fmt: skip
    b, t = args.batch, args.kv
    q = torch.randn(b, h, hd, device=dev, dtype=torch.bfloat16)
    zk = torch.randn(b, t, kvh // gk * rk, device=dev, dtype=torch.bfloat16)
    zv = torch.randn(b, t, kvh // gv * rv, device=dev, dtype=torch.bfloat16)
    n = torch.tensor([t], device=dev)
    times = []
    for i in range(args.calls):
        a, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        kl.latent_decode_attention(q, zk, zv, pack, n, inv, hd**-0.5)
        e.record()
        e.synchronize()
        if i:
            times.append(a.elapsed_time(e))
    times.sort()
    nbytes = (zk.numel() + zv.numel()) * 2
    print(
        json.dumps(
            {
                "model": args.model,
                "group": gk,
                "v_group": gv,
                "rank_k": rk,
                "rank_v": rv,
                "batch": b,
                "kv": t,
                "launch": dict(kl.LAST_LAUNCH),
                "median_ms": times[len(times) // 2] if times else None,
                "latent_bytes": nbytes,
                "rebuild_flops": b * t * kvh * 2 * rk * hd,
            }  # fmt: skip
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
