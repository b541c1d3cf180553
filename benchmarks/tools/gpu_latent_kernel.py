"""Launch-parameter sweep of PaLU's latent decode attention against dense SDPA decode attention.

One Llama-3-8B attention layer (32 query heads, 8 KV heads of 128, group size 4: two groups),
one new token per sequence, bf16, a cache of ``T`` tokens. For each (batch, T) the script times
dense decode attention (``F.scaled_dot_product_attention`` with GQA over full K/V) and
:func:`gac.kernels.latent_attention.latent_decode_attention` (scores kernel + softmax + P·Z_v)
at ranks 256 (aligned) and 251 (misaligned) per group for every launch configuration, with
``triton.testing.do_bench`` (medians). ``chosen`` is the configuration with the lowest mean
time relative to dense over all points; print it as ``GAC_LATENT_LAUNCH``.

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_latent_kernel.py --out benchmarks/results/<gpu>/latent_kernel.json``
(``--configs chosen --no-align-hint``: the launch in use, with the kernel as before its alignment hints).
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
from gac.kernels.latent_attention import LAUNCH, latent_align, latent_decode_attention


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--points", default="1x32768,16x32768")
    ap.add_argument("--ranks", default="256,251")
    ap.add_argument("--configs", choices=("all", "chosen"), default="all", help="chosen: LAUNCH only")
    ap.add_argument(
        "--no-align-hint",
        action="store_true",
        help="the kernel as before its alignment hints (latent_align -> 1: scalar latent loads)",
    )
    args = ap.parse_args()
    if args.no_align_hint:
        import gac.kernels.latent_attention as kl

        kl.latent_align = lambda *values: 1
    dev = torch.device("cuda")
    dt = torch.bfloat16
    h, kvh, hd, groups = 32, 8, 128, 2
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev).float() / hd))
    configs = list(itertools.product((32, 64, 128), (32, 64), (4, 8), (2,)))
    if args.configs == "chosen":
        configs = [tuple(LAUNCH[k] for k in ("block_t", "block_r", "num_warps", "num_stages"))]
    res = {
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(dev, dt),
        "align_hint": not args.no_align_hint,
        "points": [],
    }
    votes: dict[tuple, float] = {}
    for pt in args.points.split(","):
        b, t = (int(x) for x in pt.split("x"))
        q = torch.randn(b, h, hd, device=dev, dtype=dt)
        k = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
        v = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
        dense_ms = do_bench(
            functools.partial(F.scaled_dot_product_attention, q[:, :, None], k, v, enable_gqa=True)
        )
        dense_bytes = 2 * k.numel() * k.element_size()
        row = {"batch": b, "kv": t, "dense_ms": dense_ms, "dense_bytes": dense_bytes, "latent": []}
        del k, v
        for r in (int(x) for x in args.ranks.split(",")):
            zk = torch.randn(b, t, groups * r, device=dev, dtype=dt)
            zv = torch.randn(b, t, groups * r, device=dev, dtype=dt)
            pack = {
                "uk": torch.randn(kvh, hd, -(-r // 32) * 32, device=dev, dtype=dt) * 0.05,
                "koff": torch.tensor([0] * 4 + [r] * 4, dtype=torch.int32, device=dev),
                "kr": torch.tensor([r] * 8, dtype=torch.int32, device=dev),
                "rk_max": -(-r // 32) * 32,
                "kv_heads": kvh,
                "align": latent_align(0, r, r),
                "v_offsets": [0, r],
                "v_ranks": [r, r],
            }
            n = torch.tensor([t], device=dev)
            lat_bytes = 2 * zk.numel() * zk.element_size()
            best = None
            for cfg in configs:
                LAUNCH.update(zip(("block_t", "block_r", "num_warps", "num_stages"), cfg, strict=True))
                try:
                    fn = functools.partial(latent_decode_attention, q, zk, zv, pack, n, inv, hd**-0.5)
                    ms = do_bench(fn, warmup=5, rep=20)
                except Exception as e:  # noqa: BLE001 - a config that does not compile is recorded
                    row["latent"].append({"rank": r, "config": list(cfg), "error": str(e)[:200]})
                    continue
                row["latent"].append({"rank": r, "config": list(cfg), "ms": ms, "gbps": lat_bytes / ms / 1e6})
                votes[cfg] = votes.get(cfg, 0.0) + ms / dense_ms
                if best is None or ms < best["ms"]:
                    best = {"config": list(cfg), "ms": ms, "vs_dense": dense_ms / ms}
            row[f"best_{r}"] = best
            row[f"latent_bytes_{r}"] = lat_bytes
            print(pt, "rank", r, "dense", round(dense_ms, 4), "best", best, flush=True)
            del zk, zv
        res["points"].append(row)
    res["chosen"] = list(min(votes, key=votes.get)) if votes else None
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    print("chosen", ",".join(map(str, res["chosen"] or [])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
