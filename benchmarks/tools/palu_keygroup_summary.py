"""PaLU by key group size on the default path: one table, one figure, from committed plan directories (CPU).

Reads the ``palu-default``-style plan directories of ``benchmarks/results/h100/palu-default/keygroup/`` (and the
twelfth run's, key group 4) and writes, per shape and key group:

* decode speedup over the dense cell of the same directory (median ms per step), prefill speedup;
* the issue's memory bound per decode point: PaLU's peak ≤ dense's peak − 80% of the KV bytes saved (each point's
  recorded ``kv_bytes``, dense less PaLU);
* the capacity directories' max batch and tokens/s against dense.

Run (writes ``keygroup_summary.json`` and ``keygroup_decode.png`` beside the directories)::

    python benchmarks/tools/palu_keygroup_summary.py --root benchmarks/results/h100/palu-default
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

from gac.eval.infer import add_speedups

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

#: (directory under --root, shape cell folder, key group)
GRID = [
    ("run12/llama", "shape-llama3-8b-8", 4),
    ("keygroup/g2-llama", "shape-llama3-8b-8", 2),
    ("keygroup/g1-llama", "shape-llama3-8b-8", 1),
    ("run12/qwen", "shape-qwen2.5-7b-8", 4),
    ("keygroup/g2-qwen", "shape-qwen2.5-7b-8", 2),
    ("keygroup/g1-qwen", "shape-qwen2.5-7b-8", 1),
]
CAPACITY = [("run12/capacity", 4), ("keygroup/capacity-g2", 2), ("keygroup/capacity-g1", 1)]


def _infers(d: Path, shape: str) -> tuple[dict, dict]:
    """The dense and PaLU cells' ``infer`` records of one plan directory, with their speedups over dense
    (:func:`gac.eval.infer.add_speedups`, as ``gac report`` computes them)."""
    cells = {k: json.loads((d / "cells" / shape / f"{f}.json").read_text())["results"]["evals"]["infer"]
             for k, f in (("base", "base"), ("palu", "palu-r0.5-gac"))}  # fmt: skip
    add_speedups({"variants": cells}, baseline="base")
    return cells["base"], cells["palu"]


def grid_row(root: Path, sub: str, shape: str, kg: int) -> dict:
    bi, pi = _infers(root / sub, shape)
    ref = {(r["batch"], r["kv"]): r for r in bi["decode"]}
    decode, within = [], 0
    for r in (r for r in pi["decode"] if r.get("speedup")):
        b = ref[(r["batch"], r["kv"])]
        limit = b["peak_mem_gib"] - 0.8 * (b["kv_bytes"] - r["kv_bytes"]) / 2**30  # the KV bytes PaLU saves
        ok = r["peak_mem_gib"] <= limit
        within += ok
        decode.append({"batch": r["batch"], "kv": r["kv"], "speedup": r["speedup"],
                       "peak_gib": r["peak_mem_gib"], "limit_gib": limit, "within": ok})  # fmt: skip
    prefill = [
        {"batch": r["batch"], "seq": r["seq"], "speedup": r["speedup"]}
        for r in pi["prefill"]
        if r.get("speedup")
    ]
    return {"dir": sub, "shape": shape, "key_group": kg, "decode": decode, "prefill": prefill,
            "at_least_0.9": sum(x["speedup"] >= 0.9 for x in decode), "memory_within": within,
            "points": len(decode)}  # fmt: skip


def capacity_row(root: Path, sub: str, kg: int) -> dict:
    bi, pi = _infers(root / sub, "shape-llama3-8b-8")
    cb, cp = bi["capacity"], pi["capacity"]
    return {"dir": sub, "key_group": kg, "dense": {"batch": cb["max_batch"], "tokens_per_s": cb["tokens_per_s"]},
            "palu": {"batch": cp["max_batch"], "tokens_per_s": cp["tokens_per_s"]},
            "tokens_per_s_vs_dense": cp["tokens_per_s_vs_baseline"]}  # fmt: skip


def plot(rows: list[dict], out: Path) -> None:
    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), sharey=True)
    for ax, shape in zip(axes, shapes, strict=True):
        for r in (r for r in rows if r["shape"] == shape):
            pts = sorted(r["decode"], key=lambda x: (x["batch"], x["kv"]))
            ax.plot(
                range(len(pts)), [x["speedup"] for x in pts], marker="o", label=f"key group {r['key_group']}"
            )
            ax.set_xticks(range(len(pts)), [f"B{x['batch']}\n{x['kv'] // 1024}k" for x in pts])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{shape}: PaLU KV 0.5 decode, values in groups of 4")
        ax.set_ylabel("speedup over dense (median per step)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="benchmarks/results/h100/palu-default")
    args = ap.parse_args()
    root = Path(args.root)
    rows = [grid_row(root, *g) for g in GRID]
    caps = [capacity_row(root, sub, kg) for sub, kg in CAPACITY]
    doc = {"command": "python benchmarks/tools/palu_keygroup_summary.py --root " + args.root,
           "grid": rows, "capacity": caps}  # fmt: skip
    out = root / "keygroup"
    tmp = out / ".keygroup_summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out / "keygroup_summary.json")
    plot(rows, out / "keygroup_decode.png")
    for r in rows:
        sp = " ".join(f"{x['speedup']:.3f}" for x in sorted(r["decode"], key=lambda x: (x["batch"], x["kv"])))
        print(f"{r['shape']} G{r['key_group']}: {sp}  >=0.9: {r['at_least_0.9']}/{r['points']}  "
              f"memory: {r['memory_within']}/{r['points']}")  # fmt: skip
    for c in caps:
        print(f"capacity G{c['key_group']}: {c['palu']['batch']} at {c['tokens_per_s_vs_dense']:.2f}x")


if __name__ == "__main__":
    main()
