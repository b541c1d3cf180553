"""GPU inference benchmark: a Llama-3-8B-shaped model, dense vs. low-rank ``none`` vs. ``gac``.

Random bf16 weights (speed does not depend on their values).  The low-rank ranks come from
an ASVD-style allocation at 15% parameter reduction of the 224 projection sites: ASVD keeps,
per site, the smallest rank whose (normalized) sensitivity is under one global threshold,
bisected until the budget is met.  No real model is compressed here (no 8B checkpoint on the
machine), so the sensitivity lists are **synthetic** spectra (exponential decay whose rate
varies per layer and role, seeded); the allocation then goes through the real pipeline,
``gac.allocation.allocate("none" | "gac", ...)`` under the profile gac loads for this GPU.

Variants (each built, timed and freed in turn, dense first, in one process):

* ``dense``: HF Llama modules, decode steps replayed as CUDA graphs;
* ``dense+fuse``: the same with q/k/v and gate/up fused into one GEMM each (exact);
* ``none``: low-rank at the ASVD ranks as allocated (irregular);
* ``gac``: low-rank at the ranks ``gac`` re-selects (aligned, same budget or less);
* ``gac+fuse``: ``gac`` with the ``v`` factors of q/k/v and of gate/up fused;
* ``gac+triton``: ``gac`` with each factorized layer's decode GEMV pair as one Triton launch.

Writes ``infer.json`` (env, command, copy bandwidth, allocation summary, per-variant grids),
``infer.csv`` and plots into ``--out``; the JSON is rewritten after every variant so partial
results survive a time limit.

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_infer.py --out benchmarks/results/<gpu>/infer_llama3_8b``

Regenerates ``benchmarks/results/h200/infer_llama3_8b*/`` and ``infer_decode_fused_compiled/`` (README and docs/eval.md: the inference sweep).
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import numpy as np
import torch

from gac.allocation import allocate
from gac.eval.infer import SweepConfig, add_speedups, copy_bandwidth, sweep_model, write_results
from gac.hardware.profile import load_profile
from gac.hardware.timing import environment, resolve_device
from gac.nn import FactorizedLinear, replace_module
from gac.sites import lowrank_site

ROLES = {  # role -> (module path inside a layer, out, in) for Llama-3-8B
    "q": ("self_attn.q_proj", 4096, 4096),
    "k": ("self_attn.k_proj", 1024, 4096),
    "v": ("self_attn.v_proj", 1024, 4096),
    "o": ("self_attn.o_proj", 4096, 4096),
    "gate": ("mlp.gate_proj", 14336, 4096),
    "up": ("mlp.up_proj", 14336, 4096),
    "down": ("mlp.down_proj", 4096, 14336),
}


def llama3_8b_config(layers: int = 32, scale: int = 1):
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=4096 // scale,
        intermediate_size=14336 // scale,
        num_hidden_layers=layers,
        num_attention_heads=32 // scale,
        num_key_value_heads=8 // scale,
        vocab_size=128256 // scale,
        max_position_embeddings=8192,
        rope_theta=500000.0,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )


def asvd_style_allocation(layers: int, scale: int, keep: float = 0.85, seed: int = 0):
    """Sites, synthetic sensitivity curves and the ASVD-style native ranks at ``keep`` of the parameters."""
    rng = np.random.default_rng(seed)
    sites, curves = [], {}
    for i in range(layers):
        for path, out_f, in_f in ROLES.values():
            out_f, in_f = out_f // scale, in_f // scale
            s = lowrank_site(f"model.layers.{i}.{path}", out_f, in_f)
            tau = rng.uniform(0.15, 0.6)
            full = min(out_f, in_f)
            sig2 = np.exp(-2 * np.arange(full) / (tau * full))
            tail = np.concatenate([np.cumsum(sig2[::-1])[::-1], [0.0]])
            curve = tail[: s.max_dim + 1] / tail[0]
            curve[s.max_dim] = 0.0
            sites.append(s)
            curves[s.name] = curve
    budget = keep * sum(s.dense_cost for s in sites)

    def ranks(th: float) -> dict[str, int]:
        # smallest d whose normalized loss is <= th (curves are non-increasing)
        return {s.name: int(np.argmax(curves[s.name] <= th)) for s in sites}

    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        cost = sum(s.cost(d) for s, d in zip(sites, ranks(mid).values(), strict=True))
        lo, hi = (mid, hi) if cost > budget else (lo, mid)
    native = ranks(hi)
    native = {k: max(v, 1) for k, v in native.items()}
    return sites, curves, native


def lowrank_builder(
    cfg, dims: dict[str, int], device: torch.device, fuse: bool = False, triton: bool = False
):
    def build():
        from transformers import AutoModelForCausalLM

        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        for name, r in dims.items():
            lin = model.get_submodule(name)
            if r >= lin.weight.shape[0] * lin.weight.shape[1] // sum(lin.weight.shape):
                continue  # kept dense
            fl = FactorizedLinear(lin.in_features, r, lin.out_features, device=device, dtype=torch.bfloat16)
            with torch.no_grad():
                fl.v.weight.normal_(0, lin.in_features**-0.5)
                fl.u.weight.normal_(0, r**-0.5)
            replace_module(model, name, fl)
            del lin
        _transform(model, fuse, triton)
        torch.cuda.empty_cache()
        return model.eval()

    return build


def dense_builder(cfg, device: torch.device, fuse: bool = False):
    def build():
        from transformers import AutoModelForCausalLM

        with torch.device(device):
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        _transform(model, fuse, False)
        return model.eval()

    return build


def gemv_bandwidth(dev: torch.device, copy_gbps: float | None, scale: int = 1) -> list[dict]:
    """Each Llama-3-8B projection shape (and the head) as one M=1 bf16 GEMV, 64 per CUDA-graph replay.

    The weights rotate over enough copies to exceed the L2, so every GEMV reads from HBM.
    """
    from gac.eval.infer import _time_calls

    shapes = [(o // scale, i // scale) for _, o, i in ROLES.values()] + [(128256 // scale, 4096 // scale)]
    shapes += [((4096 + 2 * 1024) // scale, 4096 // scale), (2 * 14336 // scale, 4096 // scale)]  # fused
    out = []
    for n, k in dict.fromkeys(shapes):
        nbytes = n * k * 2
        copies = max(1, -(-4 * 60 * 2**20 // nbytes))
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        reps = 64

        def many(ws=ws, x=x, copies=copies, reps=reps):
            for j in range(reps):
                torch.nn.functional.linear(x, ws[j % copies])

        if dev.type == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                many()
            torch.cuda.current_stream().wait_stream(s)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                many()
            st = _time_calls(g.replay, dev, warmup=3, reps=20)
        else:
            st = _time_calls(many, dev, 1, 3)
        per = st["median_ms"] / reps
        rec = {"shape": [n, k], "median_ms": per, "gbps": nbytes / (per * 1e-3) / 1e9}
        if copy_gbps:
            rec["bw_frac"] = rec["gbps"] / copy_gbps
        out.append(rec)
        del ws
    return out


def _transform(model, fuse: bool, triton: bool) -> None:
    if fuse:
        from gac.nn.fused import fuse_projections_

        fuse_projections_(model)
    if triton:
        from gac.runtime.lowrank_gemv import use_triton_lowrank_

        use_triton_lowrank_(model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="divide every width by this (smoke tests)")
    ap.add_argument(
        "--variants",
        default="dense+fuse,gac+fuse",
        help="of dense, dense+fuse, none, none+fuse, gac, gac+fuse, gac+triton (default: the fast path)",
    )
    ap.add_argument("--prefill-batches", default="1,8")
    ap.add_argument("--prefill-seqs", default="128,512,1024,2048")
    ap.add_argument("--decode-batches", default="1,16,64")
    ap.add_argument("--decode-kv", default="512,4096")
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--prefill-reps", type=int, default=10)
    ap.add_argument("--profile", default=None, help="hardware profile (default: auto for this GPU)")
    ap.add_argument("--device", default=None)
    g = ap.add_mutually_exclusive_group()
    g.add_argument(
        "--compile",
        dest="compile",
        action="store_true",
        default=None,
        help="torch.compile steps (GPU default)",
    )
    g.add_argument("--no-compile", dest="compile", action="store_false")
    ap.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile mode with --compile (default, max-autotune-no-cudagraphs)",
    )
    ap.add_argument("--gemv", action="store_true", help="also time each projection shape's M=1 GEMV alone")
    args = ap.parse_args(argv)

    ints = lambda s: tuple(int(x) for x in s.split(","))  # noqa: E731
    dev = resolve_device(args.device)
    cfg = SweepConfig(
        prefill_batches=ints(args.prefill_batches),
        prefill_seqs=ints(args.prefill_seqs),
        decode_batches=ints(args.decode_batches),
        decode_kv=ints(args.decode_kv),
        decode_reps=args.decode_reps,
        prefill_reps=args.prefill_reps,
        graphs=dev.type == "cuda",  # compile: None = on where CUDA is, as in llm_run
        compile=args.compile,
        compile_mode=args.compile_mode,
    )
    mcfg = llama3_8b_config(args.layers, args.scale)
    sites, curves, native = asvd_style_allocation(args.layers, args.scale)
    profile = load_profile(args.profile, dtype="bfloat16")
    alloc = {s: allocate(s, sites, native, profile, curves=curves) for s in ("none", "gac")}
    dims = {k: {r.name: r.dim for r in a.sites} for k, a in alloc.items()}

    res = {
        "schema": "gac.infer/1",
        "command": " ".join([sys.executable, *sys.argv]),
        "env": environment(dev, torch.bfloat16),
        "config": cfg.to_dict(),
        "model": {
            "shape": "Llama-3-8B",
            "layers": args.layers,
            "scale": args.scale,
            "weights": "random bf16",
        },
        "allocation": {
            "method": "ASVD-style global sensitivity threshold at 15% reduction on SYNTHETIC curves, "
            "then gac.allocation.allocate",
            "profile": profile.id,
            "profile_measured": profile.measured,
            **{
                k: {
                    "cost": a.cost,
                    "dense_cost": a.dense_cost,
                    "param_frac": a.cost / a.dense_cost,
                    "pct_aligned": a.pct_aligned,
                    "ranks_layer0": {r.name.split(".", 3)[-1]: r.dim for r in a.sites[: len(ROLES)]},
                }
                for k, a in alloc.items()
            },
        },
        "copy_bandwidth": copy_bandwidth(dev, cfg.copy_bytes),
        "variants": {},
        "errors": {},
    }
    copy_gbps = res["copy_bandwidth"].get("gbps")
    if args.gemv:
        res["gemv"] = gemv_bandwidth(dev, copy_gbps, args.scale)
        for g in res["gemv"]:
            print(
                f"gemv {g['shape']}: {g['median_ms'] * 1e3:.1f} us, {g.get('bw_frac', 0):.2f} of copy",
                flush=True,
            )
    print(f"copy bandwidth: {copy_gbps and round(copy_gbps)} GB/s", flush=True)
    builders = {
        "dense": dense_builder(mcfg, dev),
        "dense+fuse": dense_builder(mcfg, dev, fuse=True),
        "none": lowrank_builder(mcfg, dims["none"], dev),
        "none+fuse": lowrank_builder(mcfg, dims["none"], dev, fuse=True),
        "gac": lowrank_builder(mcfg, dims["gac"], dev),
        "gac+fuse": lowrank_builder(mcfg, dims["gac"], dev, fuse=True),
        "gac+triton": lowrank_builder(mcfg, dims["gac"], dev, triton=True),
    }
    out = Path(args.out)
    for name in args.variants.split(","):
        t0 = time.time()
        try:
            model = builders[name]()
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
        _summary(res, name)
    return 0


def _summary(res: dict, name: str) -> None:
    v = res["variants"].get(name)
    if v is None:
        print(f"{name}: ERROR {res['errors'].get(name)}", flush=True)
        return
    pf = " ".join(
        f"B{r['batch']}S{r['seq']}={r.get('median_ms', float('nan')):.2f}ms(x{r.get('speedup', float('nan')):.2f})"
        if r.get("status") == "ok"
        else f"B{r['batch']}S{r['seq']}={r['status']}"
        for r in v["prefill"]
    )
    dc = " ".join(
        f"B{r['batch']}KV{r['kv']}={r.get('ms_per_token', float('nan')):.3f}ms"
        f"(x{r.get('speedup', float('nan')):.2f}/ideal{r.get('bytes_ideal_speedup', float('nan')):.2f},"
        f"bw{r.get('weight_bw_frac', float('nan')):.2f})"
        if r.get("status") == "ok"
        else f"B{r['batch']}KV{r['kv']}={r['status']}"
        for r in v["decode"]
    )
    k = v.get("kernels", {})
    print(
        f"== {name}: params={v['params'] / 1e9:.3f}B build+time={v.get('build_and_time_s', 0):.0f}s",
        flush=True,
    )
    print(f"   prefill: {pf}", flush=True)
    print(f"   decode : {dc}", flush=True)
    print(
        f"   sdpa: {k.get('decode', {}).get('sdpa_backend')} / {k.get('prefill', {}).get('sdpa_backend')}",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
