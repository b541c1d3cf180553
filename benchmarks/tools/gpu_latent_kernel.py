"""PaLU's split-KV latent decode kernel against dense decode attention, with its roofline.

For each model shape (Llama-3-8B: 32 query heads, 8 KV heads; Qwen2.5-7B: 28 and 4, with a key
bias; head_dim 128), key group size ``G`` (KV heads per key group; values grouped alike), batch
``B`` and cache length ``T`` (all slots valid), one attention layer, one new token, bf16:

* **dense**: the project's default dense decode path, ``gac_sdpa``
  (:func:`gac.kernels.attention.gqa_sdpa_attention_forward`, with the static cache's bool mask);
* **latent**: :func:`gac.kernels.latent_attention.latent_decode_attention` at ranks from KV 0.5
  (``G·head_dim/2`` per key and per value group: half the dense cache), for every launch in
  ``--configs`` (``block_t,block_r,num_warps,num_stages,waves``; ``waves``: splits such that the
  programs fill the GPU that many times), and the previous kernel (``--old``: a path to the
  earlier module) at its own launch.

Every timing is one CUDA graph of calls that cycle through enough input sets to exceed the L2
(cold cache, no launch gaps), replayed 10 times after 3 warm-ups; medians per call. The roofline
uses the same GPU's measured bf16 matmul peak (8192³, random data) and device-to-device copy
bandwidth (read + write). ``rebuild_tflops`` is the key rebuild's FLOPs (``2·r_g·head_dim`` per
KV head and cached token) over the whole kernel's time. Each configuration is first checked
against float64 on a small input (``err``).

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_latent_kernel.py --out $OUT/latent_kernel.json``
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import math
import sys
import time

import torch

from gac.hardware.timing import environment
from gac.kernels import latent_attention as kl
from gac.kernels import latent_gluon
from gac.kernels.attention import gqa_sdpa_attention_forward
from gac.testing import latent_decode_inputs

MODELS = {"llama3-8b": (32, 8, 128, 500000.0, False), "qwen2.5-7b": (28, 4, 128, 1000000.0, True)}
DEFAULT_CONFIGS = (
    "64,64,4,2,2;64,128,4,2,2;64,64,8,2,2;128,64,8,2,2;128,128,8,2,2;32,64,4,2,2;"
    "64,64,4,3,2;64,64,4,2,1;64,64,4,2,4;128,64,4,2,2;32,128,4,3,2;64,128,8,3,2"
)


def graph_ms(fns: list, reps: int = 10) -> float:
    """Median ms per call of ``fns`` (called in turn) captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    for _ in range(3):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / len(fns))
    del g
    return sorted(times)[len(times) // 2]


def ceilings(dev: torch.device) -> dict[str, float]:
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm = graph_ms([lambda: torch.matmul(a, b)] * 4)
    x = torch.randn(1 << 29, device=dev, dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    cp = graph_ms([lambda: y.copy_(x)] * 2)
    return {"bf16_tflops": 2 * 8192**3 / mm / 1e9, "copy_gbps": 2 * x.numel() * 2 / cp / 1e6}


class Stub(torch.nn.Module):
    def __init__(self, n_rep: int):
        super().__init__()
        self.num_key_value_groups = n_rep


def sets_for(nbytes: int, l2: int) -> int:
    return max(1, min(8, math.ceil(3 * l2 / max(nbytes, 1))))


def launch_env(cfg: tuple[int, ...], splits: int) -> str:
    """``GAC_LATENT_LAUNCH`` for a ``--configs`` entry
    (``block_t,block_r,warps,stages,waves[,unroll[,kloop[,sub]]]``) at ``splits`` (0: from 2 waves)."""
    extra = [cfg[5] if len(cfg) > 5 else 2, cfg[6] if len(cfg) > 6 else 0, cfg[7] if len(cfg) > 7 else 0]
    return ",".join(map(str, [*cfg[:4], splits, *extra]))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama3-8b,qwen2.5-7b")
    ap.add_argument("--groups", default="1,2,4")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument(
        "--configs",
        default=DEFAULT_CONFIGS,
        help="';'-separated block_t,block_r,warps,stages,waves[,unroll[,kloop[,sub]]] (sub: KV heads per program)",
    )
    ap.add_argument("--table", action="store_true", help="time the launch table's choice only")
    ap.add_argument(
        "--gluon",
        action="store_true",
        help="also time the default path with the Gluon kernel (gac.kernels.latent_gluon; its launch: "
        "GAC_GLUON_LAUNCH) where it serves; the table's entry is then the Triton kernel's",
    )
    ap.add_argument(
        "--rank-k", type=int, default=0, help="key rank per group (default: G*head_dim/2, KV 0.5)"
    )
    ap.add_argument("--rank-v", type=int, default=0, help="value rank per group (default: as the keys)")
    ap.add_argument(
        "--gluon-launches",
        default="",
        help="';'-separated Gluon launches (latent_gluon.LAUNCHES entries: bt,nw,qc,xreg[,occ[,ws]]), each "
        "timed alone (no OCCUPANCY_LAUNCH) on the default path beside --gluon's (which keeps the module's launches)",
    )
    ap.add_argument(
        "--v-group",
        type=int,
        default=0,
        help="KV heads a value group (default: the key group's; its rank default gv*head_dim/2)",
    )
    ap.add_argument(
        "--raw",
        action="store_true",
        help="keys cached raw (every key group at full width, G*head_dim: no rebuild); --rank-k is ignored",
    )
    ap.add_argument("--old", default=None, help="path to the earlier latent_attention module, timed beside")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument(
        "--no-balance",
        action="store_true",
        help="the launch table's splits as they were before balanced_splits",
    )
    ap.add_argument(
        "--auto-splits",
        action="store_true",
        help="each --configs launch splits the cache as the launch table does (2 waves, then balanced_splits), "
        "not by its own waves field",
    )
    ap.add_argument(
        "--unpaired",
        action="store_true",
        help="rebuild each key's halves as two dots (latent_attention.PAIRED_KEYS off), as before the paired rebuild",
    )
    ap.add_argument(
        "--no-slower",
        action="store_true",
        help="the default path (--gluon) takes the Gluon kernel wherever it serves, also where its `slower` rule "
        "leaves the launch to the Triton kernel (gac.kernels.latent_gluon.slower), to time that rule",
    )
    args = ap.parse_args()
    kl.PAIRED_KEYS = not args.unpaired
    if args.no_slower:
        latent_gluon.slower = lambda *a: None
    if args.no_balance:
        kl.balanced_splits = lambda splits, *a, **k: splits
    t_start = time.time()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    old = None
    if args.old:
        spec = importlib.util.spec_from_file_location("old_latent", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
    res = {
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(dev, dt),
        "ceilings": ceilings(dev),
        "points": [],
        "checks": [],
    }
    peak, bw = res["ceilings"]["bf16_tflops"], res["ceilings"]["copy_gbps"]
    print("ceilings", res["ceilings"], flush=True)
    configs = [tuple(int(x) for x in c.split(",")) for c in args.configs.split(";")]
    if args.table:
        configs = [None]
    if args.gluon:
        configs.append("gluon")
    configs += [f"gluon:{x}" for x in args.gluon_launches.split(";") if x]
    default_launches, default_occupancy = latent_gluon.LAUNCHES, latent_gluon.OCCUPANCY_LAUNCH

    def gluon_cfg(cfg) -> bool:
        return isinstance(cfg, str) and cfg.startswith("gluon")

    def decode(cfg, q, zk, zv, pack, n, inv, scale):
        """The latent kernel's output per value group: with ``cfg`` "gluon" the default path (the Gluon kernel where it
        serves the launch: ``kl.LAST_LAUNCH["kernel"]`` says which ran), else the Triton kernel (at ``kl._ENV``)."""
        kl.LATENT_KERNEL = "auto" if gluon_cfg(cfg) else "triton"
        given = gluon_cfg(cfg) and ":" in cfg  # a launch of --gluon-launches, alone (no occupancy launch)
        latent_gluon.LAUNCHES = (
            (tuple(int(x) for x in cfg.split(":")[1].split(",")),) if given else default_launches
        )
        latent_gluon.OCCUPANCY_LAUNCH = () if given else default_occupancy
        return kl.latent_decode_attention(q, zk, zv, pack, n, inv, scale)

    def save():
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)

    for model in args.models.split(","):
        h, kvh, hd, theta, bias = MODELS[model]
        n_rep = h // kvh
        for gk in (int(x) for x in args.groups.split(",")):
            gv = args.v_group or gk
            r = gk * hd if args.raw else (args.rank_k or gk * hd // 2)
            rv = args.rank_v or (gv * hd // 2 if args.raw or args.v_group else r)
            ng, nv = kvh // gk, kvh // gv
            # correctness of each launch on a small input (valid length not a tile multiple)
            q, zk, zv, pack, inv = latent_decode_inputs(
                3,
                h,
                kvh,
                hd,
                1100,
                gk,
                gv,
                [r] * ng,
                [rv] * nv,
                bias=bias,
                dtype=dt,
                device=dev,
                theta=theta,
                raw=args.raw,
            )
            ref = kl.reference_latent_decode(q, zk, zv, pack, 1037, inv, hd**-0.5)
            n_small = torch.tensor([1037], device=dev)
            wrong = []
            for cfg in configs:
                kl._ENV = None if cfg is None or gluon_cfg(cfg) else launch_env(cfg, 0)
                try:
                    out = decode(cfg, q, zk, zv, pack, n_small, inv, hd**-0.5)
                except Exception as e:  # noqa: BLE001 - a launch that does not fit is recorded and skipped
                    res["checks"].append({"model": model, "group": gk, "config": cfg, "error": str(e)[:200]})
                    continue
                got = torch.cat([o.double() for o in out], 1)
                err = ((got - ref).norm() / ref.norm()).item()
                res["checks"].append({"model": model, "group": gk, "config": cfg, "err": err})
                if not err < 2e-2:  # recorded, and the launch is not timed
                    print("WRONG", model, gk, cfg, err, flush=True)
                    wrong.append(cfg)
                    res.setdefault("wrong", []).append(
                        {"model": model, "group": gk, "config": cfg, "err": err}
                    )
            for b in (int(x) for x in args.batches.split(",")):
                for t in (int(x) for x in args.lengths.split(",")):
                    if time.time() - t_start > args.budget_s:
                        res["stopped"] = "time budget"
                        save()
                        print("stopped: time budget", flush=True)
                        return 0
                    dense_bytes = b * t * kvh * hd * 2 * 2
                    lat_bytes = b * t * (ng * r + nv * rv) * 2
                    flops_rebuild = 0 if args.raw else b * t * kvh * 2 * r * hd
                    flops_attn = b * h * t * 2 * (hd + rv)
                    row = {
                        "model": model, "group": gk, "v_group": gv, "batch": b, "kv": t, "rank_k": r, "rank_v": rv, "raw": args.raw,
                        "dense_bytes": dense_bytes, "latent_bytes": lat_bytes,
                        "rebuild_flops": flops_rebuild, "attn_flops": flops_attn,
                        "floor_dense_ms": dense_bytes / bw / 1e6,
                        "floor_latent_ms": max(lat_bytes / bw / 1e6, (flops_rebuild + flops_attn) / peak / 1e9),
                        "latent": [],
                    }  # fmt: skip
                    row["floor_speedup"] = row["floor_dense_ms"] / row["floor_latent_ms"]
                    # dense: the default gac_sdpa decode path over a full static cache
                    nd = sets_for(dense_bytes, l2)
                    stub = Stub(n_rep)
                    dsets = []
                    for _ in range(nd):
                        k = torch.randn(b, kvh, t, hd, device=dev, dtype=dt)
                        dsets.append((torch.randn(b, h, 1, hd, device=dev, dtype=dt), k, torch.randn_like(k)))
                    mask = torch.ones(b, 1, 1, t, device=dev, dtype=torch.bool)
                    fns = [
                        functools.partial(
                            gqa_sdpa_attention_forward, stub, s[0], s[1], s[2], mask, scaling=hd**-0.5
                        )
                        for s in dsets
                    ]
                    row["dense_ms"] = graph_ms(fns)
                    del dsets, fns
                    torch.cuda.empty_cache()
                    nl = sets_for(lat_bytes, l2)
                    lsets = [
                        (
                            torch.randn(b, h, hd, device=dev, dtype=dt),
                            torch.randn(b, t, ng * r, device=dev, dtype=dt),
                            torch.randn(b, t, nv * rv, device=dev, dtype=dt),
                        )
                        for _ in range(nl)
                    ]
                    n = torch.tensor([t], device=dev)
                    best = None
                    for cfg in configs:
                        if cfg in wrong:
                            continue
                        if cfg is None or gluon_cfg(cfg):
                            kl._ENV = None
                            splits = kl.launch_config(b * ng, t, gk, dev, raw=args.raw, n_rep=n_rep)["splits"]
                        else:
                            bt = cfg[0]
                            progs = b * kvh // kl.program_heads(gk, cfg[7] if len(cfg) > 7 else None)
                            splits = max(1, min(math.ceil(cfg[4] * sms / progs), t // bt, 256))
                            kl._ENV = launch_env(cfg, 0 if args.auto_splits else splits)
                        fns = [
                            functools.partial(decode, cfg, s[0], s[1], s[2], pack, n, inv, hd**-0.5)
                            for s in lsets
                        ]
                        try:
                            fns[0]()
                            ms = graph_ms(fns)
                        except Exception as e:  # noqa: BLE001 - a launch that fails is recorded
                            row["latent"].append({"config": cfg, "error": str(e)[:300]})
                            continue
                        ent = {
                            "config": cfg, "launch": dict(kl.LAST_LAUNCH), "ms": ms,
                            "vs_dense": row["dense_ms"] / ms, "rebuild_tflops": flops_rebuild / ms / 1e9,
                            "gbps": lat_bytes / ms / 1e6,
                        }  # fmt: skip
                        row["latent"].append(ent)
                        if best is None or ms < best["ms"]:
                            best = ent
                    row["best"] = best
                    if best is None:
                        res["points"].append(row)
                        continue
                    if old is not None:
                        ofns = [
                            functools.partial(
                                old.latent_decode_attention, s[0], s[1], s[2], pack, n, inv, hd**-0.5
                            )
                            for s in lsets
                        ]
                        try:
                            row["old_ms"] = graph_ms(ofns)
                        except Exception as e:  # noqa: BLE001
                            row["old_error"] = str(e)[:300]
                    del lsets
                    torch.cuda.empty_cache()
                    res["points"].append(row)
                    save()
                    print(
                        f"{model} G{gk} B{b} T{t}: dense {row['dense_ms']:.4f} latent {best['ms']:.4f} "
                        f"({best['vs_dense']:.2f}x, floor {row['floor_speedup']:.2f}x) "
                        f"rebuild {best['rebuild_tflops']:.0f}/{peak:.0f} TFLOP/s cfg {best['launch']} "
                        f"old {row.get('old_ms', float('nan')):.4f}",
                        flush=True,
                    )
    save()
    return 1 if res.get("wrong") else 0


if __name__ == "__main__":
    raise SystemExit(main())
