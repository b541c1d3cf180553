"""Fit the profile's ``latent_attention`` class offline from a committed latent-kernel sweep, and say how well it predicts.

Reads a JSON of ``benchmarks/tools/gpu_latent_kernel.py`` (one attention layer per point: key group size ``G``,
batch, KV, ranks, and the timed launch of the kernel), rebuilds each point's latent bytes and executed
key-rebuild FLOPs (the rank packed to 32, then to the launch's rank tile), and fits the class as ``gac profile``
does (:func:`gac.hardware.latency.fit_latent_attention`): once on every point (in-sample error), once on the
four ``(B, KV)`` shapes ``gac profile`` times (:data:`gac.hardware.profiler.LATENT_SHAPES`) and judged on the
others (held-out error). No GPU::

    PYTHONPATH=src python benchmarks/tools/latent_class_fit.py \\
        benchmarks/results/h100/palu-kernel/latent_kernel_table.json --model llama3-8b
"""

from __future__ import annotations

import argparse
import json
import sys

from gac.hardware.latency import fit_latent_attention, latent_rank
from gac.hardware.profiler import LATENT_SHAPES

#: query heads, KV heads and head_dim of gpu_latent_kernel.py's model shapes
SHAPES = {"llama3-8b": (32, 8, 128), "qwen2.5-7b": (28, 4, 128)}


def records(doc: dict, model: str) -> list[dict]:
    """One fit record per point of ``model`` that has a timed launch."""
    _, kvh, hd = SHAPES[model]
    out = []
    for p in doc["points"]:
        best = p.get("best") or {}
        if p["model"] != model or not best.get("ms"):
            continue
        br = int(best["launch"]["block_r"])
        rk = latent_rank({"rank_round": 32, "block_r": br}, int(p["rank_k"]))
        out.append({
            "key_group": p["group"], "batch": p["batch"], "kv": p["kv"], "us": best["ms"] * 1e3,
            "bytes": p["latent_bytes"], "flops": 2.0 * p["batch"] * p["kv"] * hd * kvh * rk, "block_r": br,
        })  # fmt: skip
    return out


def predict_us(row: dict, r: dict) -> float:
    tf = row.get("tflops")
    return row["launch_us"] + r["bytes"] / row["gbps"] / 1e3 + (r["flops"] / tf / 1e6 if tf else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", help="a gpu_latent_kernel.py JSON")
    ap.add_argument("--model", default="llama3-8b", choices=sorted(SHAPES))
    args = ap.parse_args()
    try:
        with open(args.sweep) as f:
            doc = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"error: cannot read {args.sweep}: {e}")
    recs = records(doc, args.model)
    if not recs:
        sys.exit(f"error: {args.sweep} has no timed point of {args.model}")
    every = fit_latent_attention(recs, args.sweep)
    train = {(b, kv) for _, _, b, kv in LATENT_SHAPES}
    part = fit_latent_attention([r for r in recs if (r["batch"], r["kv"]) in train], args.sweep)
    print(f"{args.sweep} ({args.model}, {len(recs)} points; gpu {doc.get('env', {}).get('gpu')})")
    print("G  fit on        launch_us  gbps     tflops   worst in-sample  worst held-out (B, KV)")
    for g in sorted(every["groups"], key=int):
        a = every["groups"][g]
        held = [(predict_us(part["groups"][g], r) / r["us"] - 1, r["batch"], r["kv"]) for r in recs
                if str(r["key_group"]) == g and (r["batch"], r["kv"]) not in train and g in part["groups"]]  # fmt: skip
        worst = max(held, key=lambda x: abs(x[0]), default=None)
        b = part["groups"].get(g, {})
        for name, row, err in (("every point", a, f"{a['max_abs_rel_err']:.1%}"), ("profile's 4", b, "")):
            if not row:
                continue
            tail = f"{worst[0]:+.1%} at ({worst[1]}, {worst[2]})" if worst and name != "every point" else ""
            print(f"{g:<2} {name:<13} {row['launch_us']:<10.2f} {row['gbps']:<8.1f} {str(row['tflops']):<8} "
                  f"{err:<16} {tail}")  # fmt: skip


if __name__ == "__main__":
    main()
