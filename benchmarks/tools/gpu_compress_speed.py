"""GPU prefill speed of a Llama-3-8B-shaped model compressed by the real gac pipeline.

Setup (stated in the JSON):

* A Llama-3-8B-shaped ``LlamaForCausalLM`` (32 layers, hidden 4096, 32 heads / 8 KV heads,
  MLP 14336, vocab 128256), random weights in bf16. Every projection gets a decaying singular
  spectrum that varies by layer: ``W = Q1 diag(s) Q2ᵀ`` with ``s_i = exp(-i / τ_layer,role)``;
  ``Q1``/``Q2`` are column subsets (random per projection) of one orthonormal basis per size,
  from the QR of a Gaussian on the GPU.
* Allocation from the real pipeline: the ``svd`` compressor's sites and native allocation (one
  uniform ratio) at 15% parameter reduction, then ``gac.allocation`` for align none / round /
  gac / gac-latency under the profile (auto: the shipped profile of this GPU, else the built-in
  default). The loss curves are the ``svd`` compressor's own (``--curves svd``: singular values of
  every weight) or, when that would take too long (``--curves auto`` estimates it), the known
  spectra ``Σ_{i>=d} s_i²``, which is what the compressor computes up to bf16 rounding; the
  deviation on sample sites is measured and recorded either way.
* Timed models: the dense model, then for each variant every compressed site is swapped for a
  ``FactorizedLinear`` at the allocated rank (random factors: kernel time does not depend on the
  values), timed, and swapped back, so only one extra set of factors lives on the GPU at a time.
* Prefill (``use_cache=False``, ``logits_to_keep=1`` as in generation) at batch 1 x 1024 and
  batch 8 x 512, through ``gac.hardware.timing.bench`` (CUDA events, warm-up, median and IQR).
* FLOP-ideal speedup = dense forward FLOPs / compressed forward FLOPs (projections, causal
  attention and the last-token LM head). Targets: gac >= 2x none; gac/dense >= 0.9 x FLOP-ideal.

Run on the GPU machine from the repo root::

    PYTHONPATH=src python3 benchmarks/tools/gpu_compress_speed.py --out $OUT/gpu_compress_speed.json

and on CPU at a tiny config (smoke test)::

    PYTHONPATH=src python3 benchmarks/tools/gpu_compress_speed.py --tiny --out /tmp/speed_tiny.json

Regenerates ``benchmarks/results/h200/compress_speed/`` (README: aligned compression speed).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

from gac.allocation import STRATEGIES
from gac.api import CompressConfig, plan
from gac.commands.demo import pick_profile
from gac.hardware.timing import bench, environment
from gac.nn import FactorizedLinear, replace_module
from gac.utils import atomic_write_text


def llama_config(tiny: bool):
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(
            hidden_size=256,
            intermediate_size=896,
            num_attention_heads=4,
            num_key_value_heads=1,
            num_hidden_layers=4,
            vocab_size=1024,
            max_position_embeddings=2048,
            rope_theta=500000.0,
            tie_word_embeddings=False,
        )
    return LlamaConfig(
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_hidden_layers=32,
        vocab_size=128256,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
    )


def taus(n_layers: int, roles: list[str], seed: int = 0) -> dict[tuple[int, str], float]:
    """Spectral decay per (layer, role) as a fraction of the full rank: varies by layer and role."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n_layers):
        depth = 0.5 - 0.5 * math.cos(2 * math.pi * i / max(n_layers - 1, 1))  # 0 at the ends, 1 mid-depth
        for r in roles:
            out[(i, r)] = float(0.06 + 0.18 * depth + 0.06 * rng.random())
    return out


@torch.no_grad()
def build_model(cfg, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """The model with spectral projection weights, and the spectrum of every projection."""
    from accelerate import init_empty_weights
    from transformers import LlamaForCausalLM

    from gac.models.adapters import get_adapter

    with init_empty_weights(include_buffers=False):
        model = LlamaForCausalLM(cfg)
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    model.to(dtype)  # still on meta: free; allocating in float32 first would need 2x the memory
    model.to_empty(device=device)
    for n, b in buffers.items():  # to_empty wiped the rotary inv_freq: restore it
        mod, _, attr = n.rpartition(".")
        model.get_submodule(mod)._buffers[attr] = b.to(device)
    g = torch.Generator(device).manual_seed(seed)
    model.model.embed_tokens.weight.normal_(0, 0.02, generator=g)
    model.lm_head.weight.normal_(0, 0.02, generator=g)
    for n, p in model.named_parameters():
        if "norm" in n:
            p.fill_(1.0)
    ad = get_adapter(model)
    projs = list(ad.all_projections())
    roles = sorted({r for _, r, _ in projs})
    tau = taus(cfg.num_hidden_layers, roles, seed)
    bases: dict[int, torch.Tensor] = {}

    def basis(n: int, k: int) -> torch.Tensor:
        if n not in bases:
            a = torch.randn(n, min(n, cfg.hidden_size), device=device, generator=g)
            bases[n] = torch.linalg.qr(a)[0]  # n x min(n, hidden), orthonormal columns
        q = bases[n]
        idx = torch.randperm(q.shape[1], device=device, generator=g)[:k]
        return q[:, idx]

    spectra: dict[str, torch.Tensor] = {}
    for i, role, fqn in projs:
        lin = model.get_submodule(fqn)
        out_f, in_f = lin.weight.shape
        k = min(out_f, in_f)
        s = torch.exp(-torch.arange(k, device=device, dtype=torch.float32) / (tau[(i, role)] * k))
        w = (basis(out_f, k) * s) @ basis(in_f, k).T
        lin.weight.copy_(w.to(dtype))
        spectra[fqn] = s.cpu().double()
    bases.clear()
    return model.eval(), spectra


def tail_curve(s: torch.Tensor, max_dim: int) -> np.ndarray:
    sq = (s**2).numpy()
    tail = np.concatenate([np.cumsum(sq[::-1])[::-1], [0.0]])
    c = tail[: max_dim + 1].copy()
    c[max_dim] = 0.0
    return c


def forward_flops(cfg, sites, dims, batch: int, seq: int) -> float:
    """Matmul FLOPs of one prefill: projections at ``dims``, causal attention, last-token LM head."""
    tokens = batch * seq
    proj = sum(2.0 * tokens * s.cost(dims[s.name]) for s in sites)
    attn = cfg.num_hidden_layers * 2 * (2.0 * batch * seq * seq * cfg.hidden_size) / 2  # QK^T and PV, causal
    head = 2.0 * batch * cfg.hidden_size * cfg.vocab_size
    return proj + attn + head


@torch.no_grad()
def swap_in(model, sites, dims, device, dtype, seed: int = 0) -> dict:
    g = torch.Generator(device).manual_seed(seed)
    originals = {}
    for s in sites:
        d = dims[s.name]
        if d >= s.max_dim:
            continue
        out_f, in_f = s.shape
        fl = FactorizedLinear(in_f, d, out_f, bias=False, device=device, dtype=dtype)
        fl.v.weight.normal_(0, 0.02, generator=g)
        fl.u.weight.normal_(0, 0.02, generator=g)
        originals[s.name] = replace_module(model, s.name, fl)
    return originals


def swap_out(model, originals: dict) -> None:
    for name, lin in originals.items():
        replace_module(model, name, lin)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON output path")
    ap.add_argument("--tiny", action="store_true", help="tiny config (CPU smoke test)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--param-ratio", type=float, default=0.85)
    ap.add_argument(
        "--profile",
        default=None,
        help="profile spec (default: this GPU's shipped profile, else a shipped measured one)",
    )
    ap.add_argument("--curves", choices=("auto", "svd", "analytic"), default="auto")
    ap.add_argument(
        "--curve-budget-s", type=float, default=120.0, help="auto: use svd curves if estimated below this"
    )
    ap.add_argument("--shapes", default="1x1024,8x512", help="prefill shapes BxS, comma separated")
    ap.add_argument(
        "--candidates",
        choices=("modulus", "prefer"),
        default="modulus",
        help="gac candidate step: the profile's modulus, or its prefer (fastest) modulus",
    )
    ap.add_argument("--rep-ms", type=float, default=1500.0)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()
    dev = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.tiny:
        shapes = [(b, min(s, 128)) for b, s in shapes]
    log = lambda msg: print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    cfg = llama_config(args.tiny)
    prof = pick_profile(args.profile)  # given, else this GPU's shipped profile, else any shipped measured one
    log(f"profile {prof.id} (measured={prof.measured}); building model on {dev} ({dtype})")
    model, spectra = build_model(cfg, dev, dtype)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    t_build = time.perf_counter() - t_start
    log(f"model built: {sum(p.numel() for p in model.parameters()) / 1e9:.3f} B params")

    # --- the real pipeline: svd compressor sites + native allocation, gac allocation ---------
    t0 = time.perf_counter()
    ccfg = CompressConfig(
        compressor="svd",
        param_ratio=args.param_ratio,
        align="none",
        profile=prof.id,
        tokens=shapes[0][0] * shapes[0][1],
        candidates=args.candidates,
    )
    p = plan(model, ccfg, profile=prof)
    sites = p.sites
    analytic = {s.name: tail_curve(spectra[s.name], s.max_dim) for s in sites}
    # measure the compressor's own curve on sample sites (largest first) to check and to time it
    sample = (
        sorted(sites, key=lambda s: -s.dense_cost)[:1]
        + [s for s in sites if s.name.endswith(("q_proj", "k_proj"))][:2]
    )
    dev_rel, t_curve = [], []
    for s in sample:
        t1 = time.perf_counter()
        c = p.compressor.loss_curve(s)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t_curve.append((time.perf_counter() - t1) / max(s.dense_cost, 1))
        d0 = p.native[s.name]
        dev_rel.append(abs(c[d0] - analytic[s.name][d0]) / max(analytic[s.name][d0], 1e-30))
    est_s = max(t_curve) * sum(s.dense_cost for s in sites)
    mode = args.curves if args.curves != "auto" else ("svd" if est_s <= args.curve_budget_s else "analytic")
    log(
        f"svd loss curve: {len(sample)} sample sites, est. {est_s:.0f} s for all; rel. deviation from the known spectrum at the native rank: {max(dev_rel):.2e}; using {mode} curves"
    )
    if mode == "analytic":
        p.use_curves(analytic)
    else:
        p.curves()
    allocs = {a: p.allocation(a) for a in STRATEGIES}
    t_pipeline = time.perf_counter() - t0
    for a, al in allocs.items():
        log(
            f"{a:12s} aligned {al.pct_aligned:5.1f}%  budget use {al.budget_use:.5f}  compressed {sum(not r.dense for r in al.sites)}/{len(al.sites)}  predicted x{al.predicted_speedup:.3f}"
        )

    # --- timing ------------------------------------------------------------------------------
    results: dict[str, dict] = {}
    dims_by = {"dense": {s.name: s.max_dim for s in sites}, **{a: al.dims for a, al in allocs.items()}}
    for variant, dims in dims_by.items():
        originals = swap_in(model, sites, dims, dev, dtype) if variant != "dense" else {}
        results[variant] = {}
        for b, s in shapes:
            ids = torch.randint(0, cfg.vocab_size, (b, s), device=dev)

            @torch.no_grad()
            def run(_i: int, ids=ids):
                return model(input_ids=ids, use_cache=False, logits_to_keep=1)

            t = bench(run, dev, warmup_ms=300, rep_ms=args.rep_ms if not args.tiny else 100, min_reps=5)
            flops = forward_flops(cfg, sites, dims, b, s)
            results[variant][f"{b}x{s}"] = {
                **t.to_dict(),
                "flops": flops,
                "tflops": flops / (t.median_ms * 1e-3) / 1e12,
            }
            log(
                f"{variant:12s} {b}x{s}: {t.median_ms:8.3f} ms (IQR {t.iqr_ms:.3f}), {results[variant][f'{b}x{s}']['tflops']:.1f} TFLOP/s"
            )
        del ids
        swap_out(model, originals)

    summary = {}
    for b, s in shapes:
        key = f"{b}x{s}"
        dense = results["dense"][key]
        row = {}
        for v in STRATEGIES:
            r = results[v][key]
            row[v] = {
                "speedup_vs_dense": dense["median_ms"] / r["median_ms"],
                "flop_ideal": dense["flops"] / r["flops"],
                "fraction_of_ideal": (dense["median_ms"] / r["median_ms"]) / (dense["flops"] / r["flops"]),
            }
        gac_vs_none = results["none"][key]["median_ms"] / results["gac"][key]["median_ms"]
        row["targets"] = {
            "gac_over_none": gac_vs_none,
            "gac_over_none_ok": gac_vs_none >= 2.0,
            "gac_fraction_of_flop_ideal": row["gac"]["fraction_of_ideal"],
            "gac_fraction_of_flop_ideal_ok": row["gac"]["fraction_of_ideal"] >= 0.9,
        }
        summary[key] = row
        log(
            f"{key}: gac/none {gac_vs_none:.2f}x, gac/dense {row['gac']['speedup_vs_dense']:.3f}x vs FLOP-ideal {row['gac']['flop_ideal']:.3f}x ({row['gac']['fraction_of_ideal']:.2f})"
        )

    out = {
        "schema": "gac.bench.compress_speed/1",
        "command": "PYTHONPATH=src python3 "
        + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "env": environment(dev, dtype),
        "setup": {
            "model": "Llama-3-8B-shaped LlamaForCausalLM (random weights)"
            if not args.tiny
            else "tiny Llama (smoke test)",
            "config": {
                k: getattr(cfg, k)
                for k in (
                    "hidden_size",
                    "intermediate_size",
                    "num_attention_heads",
                    "num_key_value_heads",
                    "num_hidden_layers",
                    "vocab_size",
                )
            },
            "dtype": str(dtype).removeprefix("torch."),
            "weights": "W = Q1 diag(s) Q2^T, s_i = exp(-i/(tau*k)), tau per (layer, role) in [0.06, 0.30], varying with depth",
            "compressor": "svd (native: uniform parameter ratio)",
            "param_ratio": args.param_ratio,
            "candidates": args.candidates,
            "curves": mode,
            "curve_check": {
                "sites": [s.name for s in sample],
                "max_rel_deviation_at_native_rank": max(dev_rel),
                "estimated_svd_curve_s": est_s,
            },
            "timed_factors": "random values at the allocated ranks (kernel time does not depend on values)",
            "prefill": "model(input_ids, use_cache=False, logits_to_keep=1), eager, SDPA attention",
            "profile": {"id": prof.id, "measured": prof.measured, "label": prof.label},
        },
        "allocations": {
            a: {k: v for k, v in al.to_dict().items() if k != "sites"} | {"dims": al.dims}
            for a, al in allocs.items()
        },
        "results": results,
        "summary": summary,
        "timings": {"build_s": t_build, "pipeline_s": t_pipeline, "total_s": time.perf_counter() - t_start},
    }
    atomic_write_text(Path(args.out), json.dumps(out, indent=1, default=str))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
