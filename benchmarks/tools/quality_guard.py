"""What the latency guard costs in quality: guarded ``--align gac`` against unguarded (``--allow-slower``,
today's gac) at the same budget, on SmolLM2-135M (CPU), ASVD and SVD-LLM at 10% and 15% reduction.

Per compressor one calibration (:func:`gac.api.plan`, CPU-sized as ``gac compress`` on CPU: 32
windows x 256 tokens of the Britannica training half; ASVD's probes on one window, SVDs in
float32); per reduction the compressor's native allocation at that budget (:meth:`gac.api.Plan.at`),
then for each set of serving shapes (``--serve``, ``;``-separated sets; ``default``: the default
grid) the guarded allocation, or its refusal line (the shapes that cannot be met and the largest
reduction that meets them all). Every allocation that is not refused is applied to a fresh copy
of the model and scored on the Britannica test half (perplexity, ``--eval-windows`` x
``--eval-len`` tokens). Latency predictions use ``--profile`` (default the shipped H200 one).
Rows are written atomically as they finish; a re-run skips finished rows.

Run (the numbers in docs/allocation.md)::

    OMP_NUM_THREADS=1 python benchmarks/tools/quality_guard.py --compressors svd-llm \\
        --out benchmarks/results/cpu/quality_guard_svdllm.json
    OMP_NUM_THREADS=1 python benchmarks/tools/quality_guard.py --compressors asvd \\
        --out benchmarks/results/cpu/quality_guard_asvd.json
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--compressors", default="svd-llm,asvd")
    ap.add_argument("--reductions", default="0.10,0.15")
    ap.add_argument("--serve", default="default;prefill:8x2048")
    ap.add_argument("--profile", default="h200-bfloat16")
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-len", type=int, default=256)
    ap.add_argument("--eval-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=8)
    ap.add_argument("--out", default=str(HERE / "results" / "cpu" / "quality_guard.json"))
    args = ap.parse_args()

    import torch

    from gac.api import CompressConfig, apply_, plan
    from gac.data import load_text
    from gac.errors import GacError
    from gac.eval.ppl import perplexity
    from gac.models import load_model
    from gac.utils import atomic_write_text

    torch.manual_seed(0)
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"schema": "gac.quality_guard/1", "rows": []}
    doc.update(
        command=" ".join([sys.executable.rsplit("/", 1)[-1], *sys.argv]),
        env={"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine()},
        settings=vars(args),
    )
    done = {(r["compressor"], r["reduction"], r["align"], r["serve"]) for r in doc["rows"]}

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(doc, indent=1, default=str))

    lm = load_model(args.model, dtype=torch.float32, device="cpu")
    text = load_text("britannica", "test")

    def ppl(m) -> float:
        with torch.no_grad():
            r = perplexity(m, lm.tokenizer, text, seq_len=args.eval_len, max_windows=args.eval_windows)
        return float(r["ppl"])

    if "dense_ppl" not in doc:
        doc["dense_ppl"] = ppl(lm.model)
        save()
    serves = [None if s.strip() == "default" else s.strip() for s in args.serve.split(";")]
    reds = [float(x) for x in args.reductions.split(",")]
    for comp in args.compressors.split(","):
        opts = {"sensitivity_samples": 1, "svd_dtype": "float32"} if comp == "asvd" else {}
        todo = [
            (r, a, s or "default")
            for r in reds
            for a, ss in (("gac --allow-slower", [None]), ("gac", serves))
            for s in ss
            if (comp, r, a, s or "default") not in done
        ]
        if not todo:
            continue
        t0 = time.perf_counter()
        cfg = CompressConfig(compressor=comp, param_ratio=1 - reds[0], profile=args.profile,
                             n_samples=args.calib_samples, seq_len=args.calib_len, options=opts)  # fmt: skip
        p = plan(lm.model, cfg, tokenizer=lm.tokenizer)
        p.curves()
        plan_s = time.perf_counter() - t0
        for red in reds:
            q = p.at(1 - red)
            for align, serve in [("gac --allow-slower", None)] + [("gac", s) for s in serves]:
                key = (comp, red, align, serve or "default")
                if key in done:
                    continue
                qs = q.at(serve=serve) if serve else q
                row = {"compressor": comp, "reduction": red, "align": align, "serve": serve or "default",
                       "shapes": [pt.key for pt in qs.serve], "plan_s": plan_s}  # fmt: skip
                t1 = time.perf_counter()
                try:
                    alloc = qs.allocation("gac", allow_slower=align != "gac")
                except GacError as e:
                    row.update(status="refused", error=str(e), **(qs.searched or {}))
                    # where the refusal names a feasible ratio: guarded against unguarded gac there
                    for what in ("smaller", "deeper"):
                        r = (qs.searched or {}).get(what)
                        if r is not None and r < 1.0:
                            qr = qs.at(r)
                            row[f"at_{what}"] = {
                                "ratio": r,
                                "gac": _scored(qr.allocation("gac"), lm.model, qr, apply_, ppl, copy),
                                "gac --allow-slower": _scored(
                                    qr.allocation("gac", allow_slower=True), lm.model, qr, apply_, ppl, copy
                                ),
                            }
                else:
                    row.update(status="ok", **_scored(alloc, lm.model, qs, apply_, ppl, copy))
                row["s"] = time.perf_counter() - t1
                doc["rows"].append(row)
                save()
                print(json.dumps({k: v for k, v in row.items() if k not in ("dims",)}), flush=True)


def _scored(alloc, model, plan, apply_, ppl, copy) -> dict:
    m = copy.deepcopy(model)
    rep = apply_(m, plan, alloc)
    return {
        "ppl": ppl(m),
        "cost": alloc.cost,
        "budget": alloc.budget,
        "targeted_ratio": rep.targeted_ratio,
        "dense_sites": sum(s.dense for s in alloc.sites),
        "predicted_serve": {r["point"]: r["speedup"] for r in alloc.serve},
        "worst_predicted": alloc.worst_serve_speedup,
        "notes": alloc.notes,
        "dims": alloc.dims,
    }


if __name__ == "__main__":
    main()
