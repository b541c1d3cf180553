"""GPU decode speed of PaLU's latent KV cache: a Llama-3-8B-shaped model, dense vs. ``none`` / ``round`` / ``gac``.

Random bf16 weights (speed does not depend on their values). The ranks come from the real
pipeline: ``gac.api.plan`` with ``palu`` at KV ratio 0.5 (Fisher information of the
language-modelling loss on real English text as byte-level ids, whitened group-head SVD, group
size 4), then ``plan.allocation(align)`` under the profile gac loads for this GPU. Every variant is
timed with :func:`gac.eval.infer.sweep_model`, the default path users run (static cache,
``torch.compile``, CUDA graphs); the PaLU variants decode with the Triton latent-attention kernel
(:mod:`gac.kernels.latent_attention`). Peak memory and OOMs are recorded per point; the
bytes-ideal speedup is (weights + KV bytes per step) dense over compressed, per point.

Run: ``PYTHONPATH=src python3 benchmarks/gpu_palu.py --out benchmarks/results/<gpu>/palu_llama3_8b``
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_infer import llama3_8b_config  # noqa: E402
from gpu_pruner import text_batches  # noqa: E402

from gac.api import CompressConfig, apply_, plan  # noqa: E402
from gac.eval.infer import SweepConfig, add_speedups, copy_bandwidth, sweep_model, write_results  # noqa: E402
from gac.hardware.profile import load_profile  # noqa: E402
from gac.hardware.timing import environment, resolve_device  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="divide every width by this (smoke tests)")
    ap.add_argument("--ratio", type=float, default=0.5, help="KV-cache fraction kept")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument(
        "--folded", default="gac", help="aligns also timed with values folded into o_proj (fold_values=True)"
    )
    ap.add_argument("--aligns", default="none,round,gac")
    ap.add_argument("--calib-samples", type=int, default=8)
    ap.add_argument("--calib-len", type=int, default=512)
    ap.add_argument("--prefill-batches", default="1,8")
    ap.add_argument("--prefill-seqs", default="512,2048")
    ap.add_argument("--decode-batches", default="1,16")
    ap.add_argument("--decode-kv", default="4096,16384,32768")
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--prefill-reps", type=int, default=10)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--device", default=None)
    args = ap.parse_args(argv)
    ints = lambda s: tuple(int(x) for x in s.split(",") if x)  # noqa: E731
    dev = resolve_device(args.device)
    dt = torch.bfloat16 if dev.type == "cuda" else torch.float32
    cfg = SweepConfig(
        prefill_batches=ints(args.prefill_batches),
        prefill_seqs=ints(args.prefill_seqs),
        decode_batches=ints(args.decode_batches),
        decode_kv=ints(args.decode_kv),
        decode_reps=args.decode_reps,
        prefill_reps=args.prefill_reps,
        graphs=dev.type == "cuda",
        profile_kernels=False,
    )
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    mcfg = llama3_8b_config(args.layers, args.scale)
    mcfg.max_position_embeddings = 65536
    with torch.device(dev):
        base = AutoModelForCausalLM.from_config(mcfg, dtype=dt).eval()
    profile = load_profile(args.profile, dtype="bfloat16")
    batches, src = text_batches(args.calib_samples, args.calib_len, 2)
    t0 = time.time()
    ccfg = CompressConfig(
        compressor="palu",
        param_ratio=args.ratio,
        align="none",
        options={"group_size": args.group_size, "svd_dtype": "float32"},
    )
    p = plan(base, ccfg, calib_batches=batches, profile=profile)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    importance_s = time.time() - t0
    t0 = time.time()
    allocs = {a: p.allocation(a) for a in args.aligns.split(",")}
    alloc_s = time.time() - t0
    res = {
        "schema": "gac.infer/1",
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(dev, dt),
        "config": cfg.to_dict(),
        "model": {
            "shape": "Llama-3-8B",
            "layers": args.layers,
            "scale": args.scale,
            "weights": f"random {dt}",
        },
        "allocation": {
            "method": f"palu (fisher_uniform, whiten, group size {args.group_size}) at KV ratio {args.ratio}, "
            "then plan.allocation(align)",
            "calibration": {"text": src, "n_samples": args.calib_samples, "seq_len": args.calib_len},
            "importance_s": round(importance_s, 2),
            "allocation_s": round(alloc_s, 3),
            "profile": profile.id,
            "profile_measured": profile.measured,
            **{
                a: {
                    "cost": al.cost,
                    "budget": al.budget,
                    "dense_cost": al.dense_cost,
                    "param_frac": al.cost / al.dense_cost,
                    "pct_aligned": al.pct_aligned,
                    "predicted_speedup": al.predicted_speedup,
                    "ranks": {r.name: r.dim for r in al.sites},
                }
                for a, al in allocs.items()
            },
        },
        "copy_bandwidth": copy_bandwidth(dev, cfg.copy_bytes) if dev.type == "cuda" else {},
        "variants": {},
        "errors": {},
    }
    copy_gbps = res["copy_bandwidth"].get("gbps")
    print(f"importance {importance_s:.1f}s, allocation {alloc_s:.2f}s", flush=True)
    out = Path(args.out)
    extra = [f"{a}-folded" for a in args.folded.split(",") if a]
    for name in ["dense", *allocs, *extra]:
        t0 = time.time()
        model = None
        try:
            if name == "dense":
                model = base
            else:
                align = name.removesuffix("-folded")
                model = copy.deepcopy(base)
                p.compressor.fold_values = name.endswith("-folded")
                try:
                    rep = apply_(model, p, allocs[align])
                finally:
                    p.compressor.fold_values = False
                res["allocation"].setdefault(name, {})["model_ratio"] = rep.model_ratio
                res["allocation"][name]["params"] = rep.model_params_after
            rec = sweep_model(model, cfg, copy_gbps, label=name)
            rec["build_and_time_s"] = time.time() - t0
            res["variants"][name] = rec
        except Exception as e:  # noqa: BLE001 - a failing variant is recorded; the others still run
            traceback.print_exc()
            res["errors"][name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        finally:
            model = None
            torch.cuda.empty_cache() if dev.type == "cuda" else None
        add_speedups(res)
        write_results(res, out, plots=True)
        print(f"{name}: done in {time.time() - t0:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
