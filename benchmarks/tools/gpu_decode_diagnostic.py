"""Issue 9 on the GPU: decode of an SVD-LLM model at 15% against dense, and what helps.

One process, both models on the default path (q/k/v + gate/up fused, compiled per static shape,
CUDA graphs, decode attention on the KV heads): the dense Llama-3-8B shape and the same shape
factorized at the ranks ``gac compress --compressor svd-llm --param-ratio 0.85 --align gac`` chose
(``benchmarks/results/h200/speed/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json``; random factors:
speed does not depend on the values).

* ``gemv``: every distinct GEMV shape of both models timed alone, cuBLAS against the Triton GEMV's
  configurations (:meth:`gac.runtime.dispatch.Dispatch.decisions` of `gac.runtime.gemv.GEMV`, the dispatch table the default path uses);
* ``decode``: the decode grid B x KV for dense with SDPA on the grouped query and with the two
  batched GEMMs (``gac.kernels.attention.DECODE_MODE``), then, with the faster attention per point,
  both models with and without the Triton GEMV dispatch;
* ``trace``: a kernel trace of one compiled (not captured) decode step of each model at B=1,
  KV=4096: every kernel in order with its GPU time, and the ATen GEMMs with their shapes.

  PYTHONPATH=src python3 benchmarks/tools/gpu_decode_diagnostic.py --out $OUT/issue9.json

Regenerates ``benchmarks/results/h200/decode-diag/diag.json`` (docs/eval.md: per-GEMV cuBLAS against Triton, the decode grid; the launch fit of the H200 profiles is taken from it by ``latency_model.py --fit-profiles``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[2]
DIMS = ROOT / "benchmarks/results/h200/speed/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json"


def build(spec: str, dims: dict[str, int] | None, device: str = "cuda"):
    from gac.models import load_model
    from gac.nn import FactorizedLinear, replace_module
    from gac.nn.fused import fuse_projections_

    m = load_model(spec, dtype=torch.bfloat16, device=device).model
    if dims and any(":g" in k for k in dims):  # PaLU's group ranks: latent attention at those ranks
        from gac.hardware.latency import latent_skeleton_

        latent_skeleton_(m, dims, device=device)  # the projections take the model's dtype
    elif dims:
        for fqn, r in dims.items():
            try:
                lin = m.get_submodule(fqn)
            except AttributeError:
                continue  # a smoke model with fewer layers
            r = min(r, lin.in_features, lin.out_features)  # a scaled-down smoke model
            i, o = lin.in_features, lin.out_features
            # at or past the break-even rank: kept dense, as gac's skeleton keeps it
            if r >= (i * o) // (i + o):
                continue
            fl = FactorizedLinear(lin.in_features, r, lin.out_features, bias=lin.bias is not None,
                                  device=device, dtype=torch.bfloat16)  # fmt: skip
            with torch.no_grad():
                fl.v.weight.normal_(0, lin.in_features**-0.5)
                fl.u.weight.normal_(0, r**-0.5)
            replace_module(m, fqn, fl)
    fuse_projections_(m)
    return m.eval()


def gemv_shapes(model) -> list[tuple[int, int]]:
    """(N, K) of every distinct linear layer (fused first stages included), lm_head last."""
    from gac.nn.fused import FusedInputProjection

    out: list[tuple[int, int]] = []
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            out.append((mod.out_features, mod.in_features))
        elif isinstance(mod, FusedInputProjection):
            out.append(tuple(mod.weight.shape))
    seen, uniq = set(), []
    for s in out:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def time_gemv(n: int, k: int, m: int, copy_gbps: float, l2_bytes: int = 64 * 2**20) -> dict:
    w_bytes = n * k * 2
    copies = max(2, -(-2 * l2_bytes // w_bytes))
    copies = min(copies, 64)
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    reps = 64
    for _ in range(3):
        for i in range(reps):
            F.linear(x, ws[i % copies])
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            F.linear(x, ws[i % copies])
    samples = []
    for _ in range(25):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        samples.append(a.elapsed_time(b) / reps)
    samples.sort()
    med = samples[len(samples) // 2]
    gbps = (w_bytes + (m * k + m * n) * 2) / (med * 1e-3) / 1e9
    del ws, g
    torch.cuda.empty_cache()
    return {"n": n, "k": k, "m": m, "median_us": med * 1e3, "q25_us": samples[6] * 1e3, "q75_us": samples[18] * 1e3,
            "gbps": gbps, "copy_frac": gbps / copy_gbps if copy_gbps else None}  # fmt: skip


def trace_decode(model, batch: int, kv: int, forward) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from gac.runtime.step import DecodeStep

    step = DecodeStep(model, batch, kv, graphs=False, forward=forward)
    step.set_position(kv // 2)
    for _ in range(3):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts, record_shapes=True) as prof:
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    kernels = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(e, "device_time", None) or getattr(e, "cuda_time", 0.0)
            kernels.append({"name": e.name[:200], "us": float(t), "start_us": float(e.time_range.start)})
    kernels.sort(key=lambda r: r["start_us"])
    gemms = []
    for a in prof.key_averages(group_by_input_shape=True):
        if a.key in ("aten::mm", "aten::addmm", "aten::linear", "aten::bmm", "aten::_scaled_dot_product_efficient_attention",
                     "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention"):  # fmt: skip
            gemms.append({"op": a.key, "shapes": str(a.input_shapes)[:200], "count": a.count,
                          "device_us": float(getattr(a, "device_time_total", 0.0) or getattr(a, "cuda_time_total", 0.0))})  # fmt: skip
    step.close()
    by_name: dict[str, dict] = {}
    for r in kernels:
        d = by_name.setdefault(r["name"], {"name": r["name"], "count": 0, "us": 0.0})
        d["count"] += 1
        d["us"] += r["us"]
    total = sum(r["us"] for r in kernels)
    gaps = [b["start_us"] - (a["start_us"] + a["us"]) for a, b in zip(kernels, kernels[1:], strict=False)]
    return {"batch": batch, "kv": kv, "kernels_total_us": total, "n_kernels": len(kernels),
            "by_name": sorted(by_name.values(), key=lambda d: -d["us"]), "sequence": kernels, "aten": gemms,
            "median_gap_us": sorted(gaps)[len(gaps) // 2] if gaps else None}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument("--steps", default="gemv,decode,trace")
    ap.add_argument("--decode-batches", default="1,16,64")
    ap.add_argument("--decode-kv", default="512,4096")
    ap.add_argument("--limit-s", type=float, default=540)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the plumbing (no graphs, no gemv)")
    a = ap.parse_args()
    t0 = time.time()
    import gac.kernels.attention as attn
    from gac.eval.infer import SweepConfig, copy_bandwidth, decode_point, weight_bytes_per_step
    from gac.hardware.timing import environment
    from gac.runtime import gemv as G

    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dims = json.loads(DIMS.read_text())["results"]["dims"]
    res: dict = {"schema": "gac.issue9-diag/2", "command": " ".join([sys.executable, *sys.argv]),
                 "env": environment(dev), "spec": args_spec(a), "dims_from": str(DIMS.relative_to(ROOT))}  # fmt: skip
    res["copy_bandwidth"] = copy_bandwidth(dev)
    cbw = res["copy_bandwidth"].get("gbps")
    steps = a.steps.split(",")
    points = [(int(b), int(k)) for b in a.decode_batches.split(",") for k in a.decode_kv.split(",")]
    out = Path(a.out)
    cfg = SweepConfig()

    def save() -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(res, indent=1, default=str))
        os.replace(tmp, out)

    def run(model, name: str, mode, gemv: bool, pts) -> list[dict]:
        """Decode points on the default path with attention ``mode`` (str or per-point dict)."""
        if gemv:
            info = G.use_triton_gemv_(model)
        else:
            G.undo_triton_gemv_(model)
            info = {"modules": 0}
        rows = []
        for b, kv in pts:
            if time.time() - t0 > a.limit_s:
                break
            m = mode[(b, kv)] if isinstance(mode, dict) else mode
            attn.DECODE_MODE = m
            torch._dynamo.reset()
            fwd = torch.compile(model, dynamic=False)
            try:
                r = decode_point(model, b, kv, cfg, cuda, weight_bytes_per_step(model), cbw, fwd)
            except Exception as e:  # noqa: BLE001
                r = {"batch": b, "kv": kv, "status": "error", "error": f"{type(e).__name__}: {str(e)[:300]}"}
            r.update(attn=m, gemv=gemv, gemv_modules=info.get("modules"))
            rows.append(r)
            print(
                name,
                m,
                "gemv" if gemv else "-",
                b,
                kv,
                r.get("median_ms"),
                r.get("weight_bw_frac"),
                flush=True,
            )
        return rows

    res["models"] = {}
    built = {}
    for name, d in (("dense", None), ("svd-llm-gac", dims)):
        built[name] = build(a.spec, d, a.device)
        attn.use_gqa_decode_(built[name])
        res["models"][name] = {"weight_bytes": weight_bytes_per_step(built[name]),
                               "params": sum(p.numel() for p in built[name].parameters()), "decode": []}  # fmt: skip
    if "gemv" in steps and cuda:
        t = time.time()
        for name, model in built.items():
            res["models"][name]["gemv_dispatch"] = G.use_triton_gemv_(model)
            G.undo_triton_gemv_(model)
        res["gemv_measure_s"] = time.time() - t
        res["gemv_table"] = G.measured(torch.bfloat16, dev)
        save()
    if "decode" in steps:
        dense, fact = built["dense"], built["svd-llm-gac"]
        rd = res["models"]["dense"]["decode"]
        rd += run(dense, "dense", "sdpa", False, points)
        rd += run(dense, "dense", "matmul", False, points)
        save()
        best = {}
        for b, kv in points:
            ms = {
                r["attn"]: r.get("median_ms") or 1e9 for r in rd if (r.get("batch"), r.get("kv")) == (b, kv)
            }
            best[(b, kv)] = min(ms, key=ms.get) if ms else "sdpa"
        res["best_attn"] = {f"{b}x{kv}": m for (b, kv), m in best.items()}
        rf = res["models"]["svd-llm-gac"]["decode"]
        rf += run(fact, "svd-llm-gac", best, True, points)
        save()
        rd += run(dense, "dense", best, True, points)
        save()
        rf += run(fact, "svd-llm-gac", best, False, points)
        save()
    if "trace" in steps and time.time() - t0 < a.limit_s:
        for name in ("dense", "svd-llm-gac"):
            model = built[name]
            G.use_triton_gemv_(model)
            attn.DECODE_MODE = res.get("best_attn", {}).get("1x4096", "auto")
            torch._dynamo.reset()
            fwd = torch.compile(model, dynamic=False)
            res["models"][name]["trace"] = [trace_decode(model, 1, 4096, fwd)]
            save()
    res["wall_s"] = time.time() - t0
    save()
    return 0


def args_spec(a) -> dict:
    return {k: getattr(a, k) for k in ("spec", "steps", "decode_batches", "decode_kv")}


if __name__ == "__main__":
    sys.exit(main())
