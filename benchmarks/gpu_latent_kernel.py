"""Launch-parameter sweep of the PaLU latent decode kernel against dense SDPA decode attention.

One Llama-3-8B attention layer (32 query heads, 8 KV heads of 128, group size 4: two groups),
one new token per sequence, bf16, a cache of ``T`` tokens. For each (batch, T) the script times
dense decode attention (``F.scaled_dot_product_attention`` with GQA over full K/V, the kernel a
dense model's decode step runs) and the latent kernel at ranks 256 (aligned) and 251
(misaligned) per group for every launch configuration, with ``triton.testing.do_bench``
(medians), and reports bytes moved and effective bandwidth.

Run: ``PYTHONPATH=src python3 benchmarks/gpu_latent_kernel.py --out benchmarks/results/<gpu>/latent_kernel.json``
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from gac.hardware.timing import environment
from gac.kernels.latent_attention import _launch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="1x32768,16x4096,16x32768")
    ap.add_argument("--ranks", default="256,251")
    args = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    h, kvh, hd, groups = 32, 8, 128, 2
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    configs = list(itertools.product((32, 64, 128), (32, 64), (4, 8), (2,), (4, 16)))
    res = {"command": " ".join([sys.executable, *sys.argv]), "env": environment(dev, dt), "points": []}
    for pt in args.points.split(","):
        b, t = (int(x) for x in pt.split("x"))
        q = torch.randn(b, h, hd, device=dev, dtype=dt)
        k = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
        v = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
        dense_ms = do_bench(
            functools.partial(F.scaled_dot_product_attention, q[:, :, None], k, v, enable_gqa=True)
        )
        dense_bytes = 2 * k.numel() * k.element_size()
        row = {
            "batch": b,
            "kv": t,
            "dense_ms": dense_ms,
            "dense_bytes": dense_bytes,
            "dense_gbps": dense_bytes / dense_ms / 1e6,
            "latent": [],
        }
        del k, v
        for r in (int(x) for x in args.ranks.split(",")):
            rk_max = -(-r // 32) * 32
            brv = max(16, 1 << (r - 1).bit_length())
            zk = torch.randn(b, t, groups * r, device=dev, dtype=dt)
            zv = torch.randn(b, t, groups * r, device=dev, dtype=dt)
            uk = torch.randn(kvh, hd, rk_max, device=dev, dtype=dt) * 0.05
            off = torch.tensor([0] * 4 + [r] * 4, dtype=torch.int32, device=dev)
            rr = torch.tensor([r] * 8, dtype=torch.int32, device=dev)
            n = torch.tensor([t], device=dev)
            lat_bytes = 2 * zk.numel() * zk.element_size()
            best = None
            for bt, br, nw, ns, wv in configs:
                try:
                    fn = functools.partial(
                        _launch, q, zk, zv, uk, off, rr, off, rr, inv, n, hd**-0.5, 1.0, rk_max, brv, kvh,
                        block_t=bt, block_r=br, num_warps=nw, num_stages=ns, waves=wv,
                    )  # fmt: skip
                    ms = do_bench(fn, warmup=5, rep=20)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is recorded
                    row["latent"].append({"rank": r, "config": [bt, br, nw, ns, wv], "error": str(e)[:200]})
                    continue
                rec = {"rank": r, "config": [bt, br, nw, ns, wv], "ms": ms, "gbps": lat_bytes / ms / 1e6}
                row["latent"].append(rec)
                if best is None or ms < best["ms"]:
                    best = rec
            row[f"best_{r}"] = best
            row[f"latent_bytes_{r}"] = lat_bytes
            print(pt, "rank", r, "dense", round(dense_ms, 4), "best", best, flush=True)
            del zk, zv
        res["points"].append(row)
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
