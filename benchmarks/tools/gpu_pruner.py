"""GPU speed of LLM-Pruner widths: a Llama-3-8B-shaped model, dense vs. ``none`` / ``round`` / ``gac``.

Random bf16 weights (speed does not depend on their values). The widths come from the real
pipeline: ``gac.api.plan`` with ``llm-pruner`` at 20% of the targeted parameters removed (its
block-wise native allocation in the reference's layer range [4, 30) of 32), first-order Taylor
importance from the language-modelling loss of real English text (Britannica prose, byte-level
ids: no Llama-3 tokenizer on the machine), then ``plan.allocation(align)`` for each strategy under
the profile gac loads for this GPU, and ``apply_`` on a copy of the dense model. Each variant is
timed with :func:`gac.eval.infer.sweep_model` (the same harness as ``gpu_infer.py``).

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_pruner.py --out benchmarks/results/<gpu>/pruner_llama3_8b``

Regenerates ``benchmarks/results/h100/pruner_llama3_8b/`` and ``pruner_default_small/`` (README: LLM-Pruner speed).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_infer import llama3_8b_config  # noqa: E402

from gac.api import CompressConfig, apply_, plan  # noqa: E402
from gac.eval.infer import SweepConfig, add_speedups, copy_bandwidth, sweep_model, write_results  # noqa: E402
from gac.hardware.profile import load_profile  # noqa: E402
from gac.hardware.timing import environment, resolve_device  # noqa: E402

FALLBACK = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, "
    "it was the season of Darkness, it was the spring of hope, it was the winter of despair. "
)


def text_batches(n: int, seq: int, batch: int) -> tuple[list[torch.Tensor], str]:
    try:
        from gac.data import load_text

        text, src = load_text("britannica", "train"), "britannica train half (byte ids)"
    except Exception:  # noqa: BLE001 - the GPU box may lack the text package
        text, src = FALLBACK * (n * seq // len(FALLBACK) + 1), "A Tale of Two Cities, opening (byte ids)"
    ids = torch.tensor(list(text.encode("utf-8", "ignore")[: n * seq]), dtype=torch.long)
    if ids.numel() < n * seq:
        raise SystemExit("error: calibration text too short")
    return list(ids.view(n, seq).split(batch)), src


def speed_args(doc: str, prefill_seqs: str, decode_kv: str) -> argparse.ArgumentParser:
    """The options every compressor speed script shares."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--scale", type=int, default=1, help="divide every width by this (smoke tests)")
    ap.add_argument("--aligns", default="none,round,gac")
    ap.add_argument("--calib-samples", type=int, default=8)
    ap.add_argument("--calib-len", type=int, default=512)
    ap.add_argument("--prefill-batches", default="1,8")
    ap.add_argument("--prefill-seqs", default=prefill_seqs)
    ap.add_argument("--decode-batches", default="1,16")
    ap.add_argument("--decode-kv", default=decode_kv)
    ap.add_argument("--decode-reps", type=int, default=30)
    ap.add_argument("--prefill-reps", type=int, default=10)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--device", default=None)
    return ap


def speed_run(
    args: argparse.Namespace,
    ccfg: CompressConfig,
    method: str,
    dims_key: str = "widths",
    extra_variants: dict[str, Callable[[torch.nn.Module, Any, Any], Any]] | None = None,
) -> int:
    """Llama-3-8B-shaped random model, ``ccfg``'s real plan, dense + every align (+ extras) timed.

    ``extra_variants`` maps a variant name to ``build(model, plan, allocations) -> report`` that
    compresses ``model`` (a copy of the dense model) in place.
    """
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
    mcfg.max_position_embeddings = max(mcfg.max_position_embeddings, 2 * max(cfg.decode_kv, default=0))
    with torch.device(dev):
        base = AutoModelForCausalLM.from_config(mcfg, dtype=dt).eval()
    profile = load_profile(args.profile, dtype="bfloat16")
    batches, src = text_batches(args.calib_samples, args.calib_len, 2)
    t0 = time.time()
    p = plan(base, ccfg, calib_batches=batches, profile=profile)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    importance_s = time.time() - t0
    t0 = time.time()
    allocs = {a: p.allocation(a) for a in args.aligns.split(",") if a}
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
            "method": method,
            "calibration": {"text": src, "n_samples": args.calib_samples, "seq_len": args.calib_len},
            "importance_s": round(importance_s, 2),
            "allocation_s": round(alloc_s, 3),
            "profile": profile.id,
            "profile_measured": profile.measured,
            "compressor_options": p.compressor.options(),
            **{
                a: {
                    "cost": al.cost,
                    "budget": al.budget,
                    "dense_cost": al.dense_cost,
                    "param_frac": al.cost / al.dense_cost,
                    "pct_aligned": al.pct_aligned,
                    "predicted_speedup": al.predicted_speedup,
                    dims_key: {r.name: r.dim for r in al.sites},
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
    builders = {a: (lambda m, p_, al, a=a: apply_(m, p_, al[a])) for a in allocs}
    builders.update(extra_variants or {})
    for name in ["dense", *builders]:
        t0 = time.time()
        model = None
        try:
            if name == "dense":
                model = base
            else:
                model = copy.deepcopy(base)
                rep = builders[name](model, p, allocs)
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


def main(argv: list[str] | None = None) -> int:
    ap = speed_args(__doc__, prefill_seqs="128,512,2048", decode_kv="512")
    ap.add_argument("--reduction", type=float, default=0.20)
    args = ap.parse_args(argv)
    ccfg = CompressConfig(compressor="llm-pruner", param_ratio=round(1 - args.reduction, 6), align="none")
    method = (
        f"llm-pruner (param_first, sum, block-wise) at {args.reduction:.0%} of targeted "
        "parameters, then plan.allocation(align)"
    )
    return speed_run(args, ccfg, method)


if __name__ == "__main__":
    raise SystemExit(main())
