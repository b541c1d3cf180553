"""PaLU's ranks on a model shape (random weights) on the CPU: the rank search and ``--align gac``'s allocation.

What a speed cell of ``plans/palu-default*.toml`` would compress to, without a GPU: the native ranks
(``PaluCompressor.native_allocation``) and the ``gac`` allocation (latency guard lifted, as the plans lift it) for
``--options`` (PaLU's, as JSON), written as JSON with the command. Calibration is the plans' Britannica text, fewer
windows by default (the search's ranks move little with them on random weights).

    PYTHONPATH=src python benchmarks/tools/palu_shape_ranks.py --spec shape:llama3-8b:8 \\
        --options '{"key_rank_max": 128, "value_rank_max": 384}' --out benchmarks/results/cpu/palu_rank_caps_llama3_shape.json
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import torch

from gac.api import CompressConfig, plan
from gac.hardware.profile import load_profile
from gac.models import load_model
from gac.utils import atomic_write_text


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument("--options", default="{}", help="PaLU options as JSON")
    ap.add_argument("--ratio", type=float, default=0.5)
    ap.add_argument("--profile", default="h200-bfloat16")
    ap.add_argument("--n-samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.time()
    lm = load_model(a.spec, dtype=torch.float32, device="cpu")
    opts = json.loads(a.options)
    cfg = CompressConfig(compressor="palu", param_ratio=a.ratio, align="gac", allow_slower=True, options=opts,
                         calib="britannica", n_samples=a.n_samples, seq_len=a.seq_len)  # fmt: skip
    p = plan(lm.model, cfg, tokenizer=lm.tokenizer, profile=load_profile(a.profile))
    rec = p.allocation("gac", allow_slower=True)
    out = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "spec": a.spec, "options": opts, "ratio": a.ratio, "profile": a.profile,
        "compressor_options": p.compressor.options(),  # the caps as applied, and where they came from
        "budget": p.budget, "native": p.native, "gac": rec.dims, "gac_cost": rec.cost, "notes": rec.notes,
        "torch": torch.__version__, "seconds": round(time.time() - t0, 1),
    }  # fmt: skip
    atomic_write_text(Path(a.out), json.dumps(out, indent=1) + "\n")
    for n in p.native:
        print(n, p.native[n], rec.dims[n])
    print(f"budget {p.budget}, gac {rec.cost}, {out['seconds']} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
