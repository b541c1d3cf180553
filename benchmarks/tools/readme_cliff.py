"""Render the README's shape-cliff plot from a committed `gac bench` result (no GPU needed).

    python benchmarks/tools/readme_cliff.py            # -> docs/img/gemm_cliff_h200.png

Source: ``benchmarks/results/h200/gemm_projection-bfloat16.csv`` (``gac bench --experiment
gemm_projection``, NVIDIA H200, bf16): one linear layer ``[8192 x 4096] @ [4096 x N]`` for every
N from 4072 to 4120, median of CUDA-event timings.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "benchmarks/results/h200/gemm_projection-bfloat16.csv"
GROUP = "N~4096 (M=8192, K=4096)"


def main(out: Path = ROOT / "docs/img/gemm_cliff_h200.png") -> Path:
    rows = [r for r in csv.DictReader(SRC.open()) if r["group"] == GROUP and r["status"] == "ok"]
    rows.sort(key=lambda r: int(r["dim"]))
    dims = [int(r["dim"]) for r in rows]
    tflops = [float(r["tflops"]) for r in rows]
    fig, ax = plt.subplots(figsize=(7.5, 3.0))
    ax.plot(dims, tflops, color="0.6", lw=1, zorder=1)
    for aligned, colour, label in (
        (True, "tab:green", "N a multiple of 8"),
        (False, "tab:red", "any other N"),
    ):
        pts = [(d, t) for d, t in zip(dims, tflops, strict=True) if (d % 8 == 0) == aligned]
        ax.scatter(*zip(*pts, strict=True), s=14, color=colour, label=label, zorder=2)
    ax.set_xlabel("output features N of one linear layer (M = 8192 tokens, K = 4096)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(
        "NVIDIA H200, bf16: N off a multiple of 8 runs 2.5x (even N) to 7.4x (odd N) slower", fontsize=9
    )
    ax.legend(fontsize=8, loc="center right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


if __name__ == "__main__":
    print(main(*(Path(a) for a in sys.argv[1:])))
