"""What would keeping k_proj/v_proj dense buy an SVD-LLM model on the default path? (issue 9 experiment)

SVD-LLM at 15% factorizes every site, so a decoder layer runs 11 GEMMs at decode against dense's 4; the
k and v sites save only 16% of their small weights (``1024 x 4096`` at rank 688) yet cost two GEMMs of
~1.3 MB each, which run at a tenth of copy bandwidth. This script times, in one process on the default
path (fused groups, ``torch.compile``, CUDA graphs, the dispatched Triton kernels), three structures of one
model shape with random bf16 weights: dense; a recorded ``svd-llm --align gac`` cell's ranks; and the same
cell with k/v kept dense and the parameters that costs taken back from the gate/up/down ranks, then q/o,
in steps of 8 (so every rank stays a multiple of 8) until the total is at or under the cell's. It measures
speed only: the quality of such an allocation is not measured here.

    PYTHONPATH=src python3 benchmarks/tools/gpu_kv_dense.py CELL.json --out $OUT/kv_dense.json

Regenerates ``benchmarks/results/h200/kv-dense/`` (docs/eval.md: keeping k/v dense, an experiment not kept).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_branches_ab import build  # noqa: E402


def site_cost(model, name: str, rank: int | None) -> int:  # noqa: ANN001
    """Parameters of site ``name`` at ``rank`` (None: dense)."""
    lin = model.get_submodule(name)
    n, k = lin.out_features, lin.in_features
    return n * k if rank is None or rank * (n + k) >= n * k else rank * (n + k)


def kv_dense(dims: dict[str, int], model) -> tuple[dict[str, int], dict[str, int]]:  # noqa: ANN001
    """``dims`` with every k/v site dense and the other ranks cut to pay for it, per layer."""
    out = dict(dims)
    layers = sorted({re.sub(r"\.(self_attn|mlp)\..*", "", s) for s in dims})
    moved = {"extra": 0, "taken": 0}
    for lay in layers:
        kv = [s for s in dims if s.startswith(lay + ".") and s.endswith(("k_proj", "v_proj"))]
        extra = sum(site_cost(model, s, None) - site_cost(model, s, dims[s]) for s in kv)
        for s in kv:
            out[s] = min(model.get_submodule(s).out_features, model.get_submodule(s).in_features)
        donors = [
            s for s in dims if s.startswith(lay + ".") and s.endswith(("gate_proj", "up_proj", "down_proj"))
        ]
        donors += [s for s in dims if s.startswith(lay + ".") and s.endswith(("q_proj", "o_proj"))]
        taken, i = 0, 0
        while taken < extra:
            s = donors[i % len(donors)]
            before = site_cost(model, s, out[s])
            out[s] -= 8
            taken += before - site_cost(model, s, out[s])
            i += 1
        moved["extra"] += extra
        moved["taken"] += taken
    return out, moved


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("cell")
    ap.add_argument("--out", required=True)
    ap.add_argument("--prefill-seqs", default="128,512")
    ap.add_argument("--decode-batches", default="16,64")
    ap.add_argument("--kv", default="512,4096")
    a = ap.parse_args()
    from gac.eval.infer import SweepConfig, param_count, sweep_model
    from gac.hardware.latency import skeleton
    from gac.hardware.timing import environment

    ints = lambda s: tuple(int(v) for v in s.split(",") if v)  # noqa: E731
    cell = json.loads(Path(a.cell).read_text())
    spec, dims = str(cell["cell"]["model"]), cell["results"]["dims"]
    plain = skeleton(spec, None, "bfloat16", fused=False)
    dims_kv, moved = kv_dense(dims, plain)
    del plain
    res = {
        "command": " ".join(sys.argv),
        "env": environment(torch.device("cuda"), torch.bfloat16),
        "cell": a.cell,
        "moved_params": moved,
        "dims_kv_dense": dims_kv,
        "variants": {},
    }
    cfg = SweepConfig(
        prefill_batches=(1,) if ints(a.prefill_seqs) else (),
        prefill_seqs=ints(a.prefill_seqs),
        decode_batches=ints(a.decode_batches),
        decode_kv=ints(a.kv),
        profile_kernels=False,
        decode_reps=50,
        prefill_reps=20,
    )
    for name, d in (("dense", None), ("gac", dims), ("gac_kv_dense", dims_kv)):
        t0 = time.time()
        model = build({"cell": {"model": spec}, "results": {"dims": d}})
        r = sweep_model(model, cfg, None, label=name)
        pts = {
            f"{p['phase'][0]}{p['batch']}x{p.get('seq') or p.get('kv')}": p.get("median_ms")
            for p in r["prefill"] + r["decode"]
        }
        res["variants"][name] = {
            "params": param_count(model),
            "points": pts,
            "s": time.time() - t0,
            "sweep": r,
        }
        print(name, param_count(model), {k: round(v, 4) for k, v in pts.items() if v}, flush=True)
        del model
        torch.cuda.empty_cache()
    v = res["variants"]
    for k in v["dense"]["points"]:
        d = v["dense"]["points"][k]
        print(
            k,
            "gac %.3f" % (d / v["gac"]["points"][k]),
            "gac_kv_dense %.3f" % (d / v["gac_kv_dense"]["points"][k]),
        )
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(res, indent=1, default=str))
    tmp.replace(a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
