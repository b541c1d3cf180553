"""What binds the latent decode kernel: its launch timed with each memory stream made cache-resident.

The kernel (:func:`gac.kernels.latent_attention.latent_decode_attention`, the launch table's own launch) reads three
streams per token tile: the key latents ``X`` (HBM), the key up-projections ``U`` (the same few hundred KB for every
tile: L2), and the value latents ``Z_v`` (HBM, through the tensor-memory accelerator where it can). Each variant
gives the kernel the same shapes and the same work, but with one or more streams' strides set to zero, so that
every tile reads the same rows and they stay in L1/L2:

* ``base``: as the product launches it; ``base_regs``: the value latents through registers (no descriptor);
* ``x_hot``: the key latents' token stride 0; ``u_hot``: the up-projections' ``head_dim`` stride 0;
* ``v_hot``: the value latents' token stride 0 (through registers: a descriptor cannot have a zero stride);
* ``xu_hot``: both key streams hot; ``all_hot``: all three (the time left is the tile's compute and issue).

Numbers are meaningless for the hot variants' outputs; only their times are read. Each point also times dense
decode attention (``gac_sdpa``) and states the roofline: the bytes at the measured copy bandwidth and the rebuild's
FLOPs at the measured bf16 peak. Timing as ``gpu_latent_kernel.py``: one CUDA graph over enough input sets to exceed
the L2, 3 warm-ups, median of 10 replays.

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_latent_ablate.py --out $OUT/ablate.json``
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time

import torch

from gac.hardware.timing import environment
from gac.kernels import latent_attention as kl
from gac.kernels.attention import gqa_sdpa_attention_forward
from gac.testing import latent_decode_inputs

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from gpu_latent_kernel import MODELS, Stub, ceilings, graph_ms, sets_for  # noqa: E402

VARIANTS = ("base", "base_regs", "x_hot", "u_hot", "v_hot", "xu_hot", "all_hot")


def hot(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with stride 0 along ``dim``: every index reads index 0's elements."""
    return x.narrow(dim, 0, 1).expand(*x.shape)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--cases",
        default="llama3-8b:4:256:256:4,llama3-8b:4:128:384:4,qwen2.5-7b:4:256:256:4,qwen2.5-7b:4:128:384:4,"
        "llama3-8b:1:64:256:4",
        help="model:key_group:rank_k:rank_v:value_group, ','-separated",
    )
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--budget-s", type=float, default=400.0)
    args = ap.parse_args()
    t0 = time.time()
    dev, dt = torch.device("cuda"), torch.bfloat16
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    res = {
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(dev, dt),
        "ceilings": ceilings(dev),
    }
    res["points"] = []
    peak, bw = res["ceilings"]["bf16_tflops"], res["ceilings"]["copy_gbps"]
    print("ceilings", res["ceilings"], flush=True)
    real_desc = kl.value_descriptor

    def save() -> None:
        with open(args.out + ".tmp", "w") as f:
            json.dump(res, f, indent=1)
        import os

        os.replace(args.out + ".tmp", args.out)

    for case in args.cases.split(","):
        model, gk, rk, rv, gv = case.split(":")
        gk, rk, rv, gv = int(gk), int(rk), int(rv), int(gv)
        h, kvh, hd, theta, bias = MODELS[model]
        ng, nv = kvh // gk, kvh // gv
        _, _, _, pack, inv = latent_decode_inputs(
            1, h, kvh, hd, 64, gk, gv, [rk] * ng, [rv] * nv, bias=bias, dtype=dt, device=dev, theta=theta
        )
        for b in (int(x) for x in args.batches.split(",")):
            for t in (int(x) for x in args.lengths.split(",")):
                if time.time() - t0 > args.budget_s:
                    res["stopped"] = "time budget"
                    save()
                    return 0
                dense_bytes = b * t * kvh * hd * 4
                lat_bytes = b * t * (ng * rk + nv * rv) * 2
                u_bytes_per_tile = kvh // gk * gk * hd * rk * 2  # every key group's U, once a 128-token tile
                flops = b * t * kvh * 2 * rk * hd
                row = {
                    "case": case, "model": model, "k_group": gk, "v_group": gv, "rank_k": rk, "rank_v": rv,
                    "batch": b, "kv": t, "dense_bytes": dense_bytes, "latent_bytes": lat_bytes,
                    "rebuild_flops": flops, "u_l2_bytes_128_tiles": u_bytes_per_tile * b * t // 128,
                    "floor_bytes_ms": lat_bytes / bw / 1e6, "floor_flops_ms": flops / peak / 1e9,
                    "floor_dense_ms": dense_bytes / bw / 1e6, "variants": {},
                }  # fmt: skip
                nd = sets_for(dense_bytes, l2)
                dsets = []
                for _ in range(nd):
                    k = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
                    dsets.append((torch.randn(b, h, 1, hd, device=dev, dtype=dt), k, torch.randn_like(k)))
                mask = torch.ones(b, 1, 1, t, device=dev, dtype=torch.bool)
                stub = Stub(h // kvh)
                row["dense_ms"] = graph_ms(
                    [
                        functools.partial(
                            gqa_sdpa_attention_forward, stub, s[0], s[1], s[2], mask, scaling=hd**-0.5
                        )
                        for s in dsets
                    ]
                )
                del dsets
                torch.cuda.empty_cache()
                nl = sets_for(lat_bytes, l2)
                lsets = [
                    (
                        torch.randn(b, h, hd, device=dev, dtype=dt),
                        torch.randn(b, t, ng * rk, device=dev, dtype=dt),
                        torch.randn(b, t, nv * rv, device=dev, dtype=dt),
                    )
                    for _ in range(nl)
                ]
                n = torch.tensor([t], device=dev)
                for var in VARIANTS:
                    regs = var in ("base_regs", "v_hot", "all_hot")
                    kl.value_descriptor = (lambda *a, **k: None) if regs else real_desc
                    p = dict(pack)
                    if var in ("u_hot", "xu_hot", "all_hot"):
                        p["uk"] = hot(pack["uk"], 1)
                    fns = []
                    for q, zk, zv in lsets:
                        if var in ("x_hot", "xu_hot", "all_hot"):
                            zk = hot(zk, 1)
                        if var in ("v_hot", "all_hot"):
                            zv = hot(zv, 1)
                        fns.append(
                            functools.partial(kl.latent_decode_attention, q, zk, zv, p, n, inv, hd**-0.5)
                        )
                    try:
                        fns[0]()
                        ms = graph_ms(fns)
                    except Exception as e:  # noqa: BLE001 - recorded, the others still run
                        row["variants"][var] = {"error": str(e)[:300]}
                        continue
                    row["variants"][var] = {
                        "ms": ms,
                        "launch": dict(kl.LAST_LAUNCH),
                        "x_dense": row["dense_ms"] / ms,
                    }
                kl.value_descriptor = real_desc
                del lsets
                torch.cuda.empty_cache()
                res["points"].append(row)
                save()
                v = row["variants"]
                print(
                    f"{case} B{b} T{t}: dense {row['dense_ms']:.3f} floors bytes {row['floor_bytes_ms']:.3f} "
                    f"flops {row['floor_flops_ms']:.3f} | "
                    + " ".join(f"{k} {v[k].get('ms', float('nan')):.3f}" for k in VARIANTS),
                    flush=True,
                )
    save()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
