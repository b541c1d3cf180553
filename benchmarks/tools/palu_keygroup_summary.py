"""PaLU by key group size on the default path: one table, one figure, from committed plan directories (CPU).

Reads the ``palu-default``-style plan directories of a GPU's ``benchmarks/results/<gpu>/palu-default/`` (``--gpu``:
which directories stand for which key and value groups is listed below, per GPU) and writes, per shape and
key/value group:

* decode speedup over the dense cell of the same directory (median ms per step), prefill speedup;
* the issue's memory bound per decode point: PaLU's peak ≤ dense's peak − 80% of the KV bytes saved (each point's
  recorded ``kv_bytes``, dense less PaLU), on the timed steps' peaks where both cells recorded them
  (``steady_peak_mem_gib``: their compile and graph capture apart), else on the whole points';
* the capacity directories' max batch and tokens/s against dense.

Run (writes ``keygroup_summary.json`` and ``keygroup_decode.png`` into the GPU's summary folder)::

    python benchmarks/tools/palu_keygroup_summary.py --gpu h100
    python benchmarks/tools/palu_keygroup_summary.py --gpu h200
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

from gac.eval.infer import add_speedups

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LLAMA, QWEN = "shape-llama3-8b-8", "shape-qwen2.5-7b-8"

#: per GPU: the summary folder under ``benchmarks/results/<gpu>/palu-default/``; the grid's (directory, shape cell
#: folder, key group, value group); the capacity runs' (directory, key group, value group), all on the Llama shape
RUNS = {
    "h100": {
        "out": "keygroup",
        "grid": [
            ("run12/llama", LLAMA, 4, 4),
            ("keygroup/g2-llama", LLAMA, 2, 4),
            ("keygroup/g1-llama", LLAMA, 1, 4),
            ("run12/qwen", QWEN, 4, 4),
            ("keygroup/g2-qwen", QWEN, 2, 4),
            ("keygroup/g1-qwen", QWEN, 1, 4),
        ],
        "capacity": [
            ("run12/capacity", 4, 4),
            ("keygroup/capacity-g2", 2, 4),
            ("keygroup/capacity-g1", 1, 4),
        ],
    },
    "h200": {
        "out": "by-key-group",
        "grid": [
            ("default-decode-llama-call56", LLAMA, 4, 4),
            ("keygroup2", LLAMA, 2, 4),
            ("keygroup2-values2-decode-call58-59", LLAMA, 2, 2),
            ("default-decode-qwen-call57", QWEN, 4, 4),
            ("g1-qwen", QWEN, 1, 4),
            ("keygroup2-values2-decode-call58-59", QWEN, 2, 2),
        ],
        "capacity": [("capacity-call60", 4, 4), ("capacity-keygroup2-values2-call55", 2, 2)],
    },
}


def _infers(d: Path, shape: str) -> tuple[dict, dict]:
    """The dense and PaLU cells' ``infer`` records of one plan directory, with their speedups over dense
    (:func:`gac.eval.infer.add_speedups`, as ``gac report`` computes them)."""
    cells = {k: json.loads((d / "cells" / shape / f"{f}.json").read_text())["results"]["evals"]["infer"]
             for k, f in (("base", "base"), ("palu", "palu-r0.5-gac"))}  # fmt: skip
    add_speedups({"variants": cells}, baseline="base")
    return cells["base"], cells["palu"]


def grid_row(root: Path, sub: str, shape: str, kg: int, vg: int) -> dict:
    bi, pi = _infers(root / sub, shape)
    ref = {(r["batch"], r["kv"]): r for r in bi["decode"]}
    decode, within = [], 0
    for r in (r for r in pi["decode"] if r.get("speedup")):
        b = ref[(r["batch"], r["kv"])]
        # the timed steps' peaks where both cells recorded them (apart from the point's compile), else the point's
        key = (
            "steady_peak_mem_gib"
            if r.get("steady_peak_mem_gib") and b.get("steady_peak_mem_gib")
            else "peak_mem_gib"
        )
        limit = b[key] - 0.8 * (b["kv_bytes"] - r["kv_bytes"]) / 2**30  # the KV bytes PaLU saves
        ok = r[key] <= limit
        within += ok
        decode.append({"batch": r["batch"], "kv": r["kv"], "speedup": r["speedup"], "peak": key,
                       "peak_gib": r[key], "limit_gib": limit, "within": ok})  # fmt: skip
    prefill = [
        {"batch": r["batch"], "seq": r["seq"], "speedup": r["speedup"]}
        for r in pi["prefill"]
        if r.get("speedup")
    ]
    return {"dir": sub, "shape": shape, "key_group": kg, "value_group": vg, "decode": decode, "prefill": prefill,
            "at_least_0.9": sum(x["speedup"] >= 0.9 for x in decode), "memory_within": within,
            "points": len(decode)}  # fmt: skip


def capacity_row(root: Path, sub: str, kg: int, vg: int) -> dict:
    bi, pi = _infers(root / sub, LLAMA)
    cb, cp = bi["capacity"], pi["capacity"]
    return {"dir": sub, "key_group": kg, "value_group": vg, "dense": {"batch": cb["max_batch"], "tokens_per_s": cb["tokens_per_s"]},
            "palu": {"batch": cp["max_batch"], "tokens_per_s": cp["tokens_per_s"]},
            "tokens_per_s_vs_dense": cp["tokens_per_s_vs_baseline"]}  # fmt: skip


def plot(rows: list[dict], out: Path) -> None:
    shapes = sorted({r["shape"] for r in rows})
    settings = sorted({(r["key_group"], r["value_group"]) for r in rows}, reverse=True)
    color = {kv: f"C{i}" for i, kv in enumerate(settings)}  # one colour per setting across the panels
    fig, axes = plt.subplots(1, len(shapes), figsize=(6 * len(shapes), 4), sharey=True)
    for ax, shape in zip(axes, shapes, strict=True):
        for r in (r for r in rows if r["shape"] == shape):
            pts = sorted(r["decode"], key=lambda x: (x["batch"], x["kv"]))
            ax.plot(
                range(len(pts)),
                [x["speedup"] for x in pts],
                marker="o",
                color=color[r["key_group"], r["value_group"]],
                label=f"keys {r['key_group']}, values {r['value_group']}",
            )
            ax.set_xticks(range(len(pts)), [f"B{x['batch']}\n{x['kv'] // 1024}k" for x in pts])
        ax.axhline(1.0, color="k", lw=0.8)
        ax.axhline(0.9, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{shape}: PaLU KV 0.5 decode (groups of KV heads)")
        ax.set_ylabel("speedup over dense (median per step)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", choices=sorted(RUNS), default="h100")
    args = ap.parse_args()
    root, runs = Path("benchmarks/results") / args.gpu / "palu-default", RUNS[args.gpu]
    rows = [grid_row(root, *g) for g in runs["grid"]]
    caps = [capacity_row(root, *c) for c in runs["capacity"]]
    doc = {"command": "python benchmarks/tools/palu_keygroup_summary.py --gpu " + args.gpu,
           "grid": rows, "capacity": caps}  # fmt: skip
    out = root / runs["out"]
    out.mkdir(exist_ok=True)
    tmp = out / ".keygroup_summary.json.tmp"
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(out / "keygroup_summary.json")
    plot(rows, out / "keygroup_decode.png")
    for r in rows:
        sp = " ".join(f"{x['speedup']:.3f}" for x in sorted(r["decode"], key=lambda x: (x["batch"], x["kv"])))
        print(f"{r['shape']} K{r['key_group']} V{r['value_group']}: {sp}  >=0.9: {r['at_least_0.9']}/{r['points']}  "
              f"memory: {r['memory_within']}/{r['points']}")  # fmt: skip
    for c in caps:
        print(
            f"capacity K{c['key_group']} V{c['value_group']}: {c['palu']['batch']} at {c['tokens_per_s_vs_dense']:.2f}x"
        )


if __name__ == "__main__":
    main()
