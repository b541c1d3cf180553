"""A latent layer's prompt work both ways: its up-projections one GEMM a group or one block-diagonal GEMM, and its
causal attention with the mask built (query heads folded onto their KV heads) or SDPA's grouped heads unmasked.

The two choices :mod:`gac.nn.latent` makes for a prompt (:func:`gac.nn.latent.one_gemm`, ``SDPA_GQA``), timed
apart at real shapes so that the bound :data:`gac.nn.latent.ONE_GEMM_MAX_MACS` is read off a GPU:

* **rebuild**: :meth:`gac.nn.latent.LatentProjection.reconstruct` of ``rows`` latent rows, compiled
  (``torch.compile``, static shapes, as the inference sweep's prefill), both ways, each in one CUDA graph of 32
  calls (:func:`gac.hardware.timing.graph_timings`, median and quartiles of 15 replays). Beside each: its
  launches, FLOPs (the block-diagonal GEMM's include the zeros') and bytes, and the time they take at the same
  GPU's measured bf16 peak and copy bandwidth.
* **attention**: ``LatentAttention._attend`` of a whole prompt with no mask, Llama-3-8B's heads (32 query, 8 KV,
  head_dim 128), compiled, both ways.

Every pair is checked for agreement (relative error of the one against the other). Run:

    PYTHONPATH=src python3 benchmarks/tools/gpu_latent_prefill.py --out $OUT/latent_prefill.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

import gac.nn.latent as nl
from gac.hardware.timing import environment, graph_timings

#: name -> (ranks, group width, bias): from the committed cells of ``benchmarks/results/h200/palu-default/``
#: (``keygroup2-values2/``: Llama-3-8B layers 0-1, Qwen2.5-7B; the default key group 4: ``llama/``)
SHAPES = {
    "llama3-8b kg2 keys": ([128] * 4, 256, False),
    "llama3-8b kg2 values": ([216, 216, 224, 216], 256, False),
    "llama3-8b kg2 raw keys": ([256] * 4, 256, False),
    "llama3-8b kg4 keys": ([256, 256], 512, False),
    "llama3-8b kg4 values": ([232, 232], 512, False),
    "qwen2.5-7b kg2 keys (bias)": ([128, 128], 256, True),
    "qwen2.5-7b kg2 values (bias)": ([224, 224], 256, True),
}
ROWS = (128, 512, 1024, 2048, 4096, 8192, 16384)
ATTENTION = ((1, 128), (1, 512), (1, 2048), (8, 128), (8, 512), (8, 2048))


def timed(fn, reps: int = 32) -> dict[str, float]:
    ts = graph_timings(lambda i: fn(), reps=reps, samples=15)
    return {"median_us": ts[len(ts) // 2], "q25_us": ts[len(ts) // 4], "q75_us": ts[3 * len(ts) // 4]}


def compiled(fn):
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def ceilings(dev: torch.device) -> dict[str, float]:
    """The GPU's bf16 matmul rate (8192³) and copy bandwidth (1 GiB, read + write), in CUDA graphs."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    mm = timed(lambda: a @ a, reps=4)["median_us"]
    x = torch.randn(1 << 29, device=dev, dtype=torch.bfloat16)
    y = torch.empty_like(x)
    cp = timed(lambda: y.copy_(x), reps=2)["median_us"]
    return {"bf16_tflops": 2 * 8192**3 / mm / 1e6, "copy_gbps": 2 * x.numel() * 2 / cp / 1e3}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def rebuild_rows(
    dev: torch.device,
    peak: dict[str, float],
    rows_list: tuple[int, ...],
    shapes: list[str],
    out: list[dict],
    save,
) -> None:
    for name in shapes:
        ranks, width, bias = SHAPES[name]
        proj = nl.LatentProjection(64, ranks, width, bias=bias, device=dev, dtype=torch.bfloat16)
        for u in proj.ups:
            torch.nn.init.normal_(u.weight, std=0.05)
        k, n, g = sum(ranks), width * len(ranks), len(ranks)
        for rows in rows_list:
            z = torch.randn(rows, k, device=dev, dtype=torch.bfloat16)
            rec = {"shape": name, "ranks": ranks, "group_width": width, "bias": bias, "rows": rows,
                   "one_gemm_now": proj.one_gemm(rows), "macs_per_group_width": rows * k * width}  # fmt: skip
            res = {}
            for way, bound in (("per_group", 0), ("one_gemm", 1 << 62)):
                old = nl.ONE_GEMM_MAX_MACS
                nl.ONE_GEMM_MAX_MACS = bound
                try:
                    f = compiled(proj.reconstruct)
                    with torch.no_grad():
                        res[way] = f(z)
                        rec[way] = timed(lambda f=f, z=z: f(z))
                finally:
                    nl.ONE_GEMM_MAX_MACS = old
                flops = 2.0 * rows * k * width * (g if way == "one_gemm" else 1)
                nbytes = 2.0 * (k * n + rows * (k + n)) + (2.0 * k * n if way == "one_gemm" else 0.0)
                rec[way].update(
                    launches=2 if way == "one_gemm" else g, flops=flops, bytes=nbytes,
                    floor_us=max(flops / (peak["bf16_tflops"] * 1e6), nbytes / (peak["copy_gbps"] * 1e3)),
                )  # fmt: skip
            rec["one_gemm_over_per_group"] = rec["one_gemm"]["median_us"] / rec["per_group"]["median_us"]
            rec["rel_err"] = rel(res["one_gemm"], res["per_group"])
            out.append(rec)
            save()
            print(f"{name:30s} rows {rows:6d}: per group {rec['per_group']['median_us']:7.2f} us, one GEMM "
                  f"{rec['one_gemm']['median_us']:7.2f} us ({rec['one_gemm_over_per_group']:.3f}), "
                  f"chosen now: {'one' if rec['one_gemm_now'] else 'per group'}", flush=True)  # fmt: skip


def attention_rows(dev: torch.device, points: tuple[tuple[int, int], ...], out: list[dict], save) -> None:
    heads, kvh, hd = 32, 8, 128
    stub = SimpleNamespace(scaling=hd**-0.5, attention_dropout=0.0, training=False)
    for b, s in points:
        q = torch.randn(b, heads, s, hd, device=dev, dtype=torch.bfloat16)
        k = torch.randn(b, kvh, s, hd, device=dev, dtype=torch.bfloat16)
        v = torch.randn(b, kvh, s, hd, device=dev, dtype=torch.bfloat16)
        rec: dict = {"batch": b, "seq": s, "heads": heads, "kv_heads": kvh, "head_dim": hd}
        res = {}
        for way, gqa in (("mask_built", False), ("causal_gqa", True)):
            old = nl.SDPA_GQA
            nl.SDPA_GQA = gqa
            try:
                f = compiled(lambda q, k, v: nl.LatentAttention._attend(stub, q, k, v, None))
                with torch.no_grad():
                    res[way] = f(q, k, v)
                    rec[way] = timed(lambda f=f, q=q, k=k, v=v: f(q, k, v))
            finally:
                nl.SDPA_GQA = old
        rec["causal_gqa_over_mask_built"] = rec["causal_gqa"]["median_us"] / rec["mask_built"]["median_us"]
        rec["rel_err"] = rel(res["causal_gqa"], res["mask_built"])
        out.append(rec)
        save()
        print(
            f"attention B={b} S={s}: mask built {rec['mask_built']['median_us']:7.2f} us, causal GQA "
            f"{rec['causal_gqa']['median_us']:7.2f} us ({rec['causal_gqa_over_mask_built']:.3f})",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="latent rows (B·S) of the rebuilds")
    ap.add_argument("--shapes", default=",".join(SHAPES), help="which of SHAPES (comma-separated)")
    ap.add_argument("--attention-first", action="store_true", help="time the attention before the rebuilds")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: gpu_latent_prefill.py times CUDA graphs; no CUDA device here", file=sys.stderr)
        return 2
    shapes = [x.strip() for x in args.shapes.split(",") if x.strip()]
    bad = [x for x in shapes if x not in SHAPES]
    if bad:
        print(f"error: unknown shape(s) {bad}; known: {list(SHAPES)}", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = tuple(int(x) for x in args.rows.split(","))
    peak = ceilings(dev)
    print(f"bf16 {peak['bf16_tflops']:.0f} TFLOP/s, copy {peak['copy_gbps']:.0f} GB/s", flush=True)
    rec = {
        "env": environment(dev, "bfloat16"),
        "command": " ".join(["python3", "benchmarks/tools/gpu_latent_prefill.py", *(argv or sys.argv[1:])]),
        "ceilings": peak,
        "one_gemm_max_macs": nl.ONE_GEMM_MAX_MACS,
        "rebuild": [],
        "attention": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:  # after every point: a run cut short keeps what it timed
        tmp = out.with_suffix(out.suffix + ".tmp")
        tmp.write_text(json.dumps(rec, indent=1))
        tmp.replace(out)

    steps = [lambda: rebuild_rows(dev, peak, rows, shapes, rec["rebuild"], save),
             lambda: attention_rows(dev, ATTENTION, rec["attention"], save)]  # fmt: skip
    for step in reversed(steps) if args.attention_first else steps:
        step()
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
