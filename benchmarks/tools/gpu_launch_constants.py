"""Measure this GPU's latency fields into its shipped profile (the latency guard's fixed costs and classes).

The latency model behind ``--align gac``'s guard prices every GEMM at ``launch_us + bytes / copy_gbps``,
the fused low-rank kernel at its own fit (``fused_lowrank``) and PaLU's latent decode attention at its
own class (``latent_attention``: latent bandwidth and key-rebuild FLOP rate), the Triton decode GEMV at its
fit (``gemv_kernel``) and prefill attention as the compiled step runs it (``prefill_attention``). ``gac
profile`` measures
all of them, but a full profile takes many minutes; this re-measures only those fields (the same function
``gac profile`` calls: :func:`gac.hardware.profiler.measure_latency_fields_`), ``--fields`` naming which
(default: all), and writes the profile (``--profile``, default: the shipped profile of this GPU) with them
added, its ``env`` recording the run. It regenerates the latency fields of
``src/gac/profiles/h100-bfloat16.json``::

    PYTHONPATH=src python benchmarks/tools/gpu_launch_constants.py --out $OUT/profile.json
    PYTHONPATH=src python benchmarks/tools/gpu_launch_constants.py --fields latent_attention \\
        --profile src/gac/profiles/h100-bfloat16.json --out $OUT/h100-bfloat16.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone


def main() -> None:
    from gac.hardware.profiler import LATENCY_FIELDS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the updated profile JSON")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument(
        "--fields", default=",".join(LATENCY_FIELDS), help=f"comma-separated: {', '.join(LATENCY_FIELDS)}"
    )
    ap.add_argument(
        "--profile", default="auto", help="the profile to add them to (default: this GPU's shipped one)"
    )
    args = ap.parse_args()

    import torch

    from gac.guard import atomic_write_text
    from gac.hardware.profile import load_profile
    from gac.hardware.profiler import measure_latency_fields_
    from gac.utils import parse_dtype

    fields = [f.strip() for f in args.fields.split(",") if f.strip()]
    bad = [f for f in fields if f not in LATENCY_FIELDS] or ([] if fields else [args.fields])
    if bad:
        sys.exit(f"error: unknown --fields {', '.join(map(repr, bad))}: known {', '.join(LATENCY_FIELDS)}")
    if not torch.cuda.is_available():
        sys.exit("error: needs a CUDA GPU")
    dev = torch.device("cuda")
    dt = parse_dtype(args.dtype, dev)
    prof = load_profile(args.profile, dtype=str(dt).removeprefix("torch."))
    if not prof.measured:
        sys.exit(f"error: no shipped profile for {torch.cuda.get_device_name()} ({args.dtype})")
    measure_latency_fields_(prof, dev, dt, fields)
    run = {
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "PYTHONPATH=src python " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    if "launch" in fields or "fused_lowrank" in fields:
        prof.env["launch_constants"] = run
    for f in ("latent_attention", "gemv_kernel", "prefill_attention"):  # each recorded under its own name
        if f in fields:
            prof.env[f] = run
    d = prof.to_dict()
    atomic_write_text(args.out, json.dumps(d, indent=1) + "\n")
    la = prof.latent_attention
    print(
        json.dumps({k: d.get(k) for k in ("launch_us", "copy_gbps", "aux_us")}),
        "fused:",
        bool(prof.fused_lowrank),
        "latent_attention:",
        json.dumps(
            {k: la.get(k) for k in ("launch_us", "gbps", "tflops", "rank_block")}
            | {"max_abs_rel_err": (la.get("fit") or {}).get("max_abs_rel_err")}
        )
        if la
        else None,
    )


if __name__ == "__main__":
    main()
