"""Measure this GPU's launch constants into its shipped profile (the latency guard's fixed costs).

The latency model behind ``--align gac``'s guard prices every GEMM at ``launch_us + bytes / copy_gbps``
and the fused low-rank kernel at its own fit (``fused_lowrank``). ``gac profile`` measures both, but
a full profile takes many minutes; this re-measures only those fields (about half a minute, the
same function ``gac profile`` calls: :func:`gac.hardware.profiler.measure_latency_fields_`) and writes the shipped profile of this GPU with
them added, its ``env`` recording the run. It regenerates the launch fields of
``src/gac/profiles/h100-bfloat16.json``::

    PYTHONPATH=src python benchmarks/tools/gpu_launch_constants.py --out $OUT/profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime, timezone


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="where to write the updated profile JSON")
    ap.add_argument("--dtype", default="bfloat16")
    args = ap.parse_args()

    import torch

    from gac.guard import atomic_write_text
    from gac.hardware.profile import load_profile
    from gac.hardware.profiler import measure_latency_fields_
    from gac.utils import parse_dtype

    if not torch.cuda.is_available():
        sys.exit("error: needs a CUDA GPU")
    dev = torch.device("cuda")
    dt = parse_dtype(args.dtype, dev)
    prof = load_profile("auto", dtype=str(dt).removeprefix("torch."))
    if not prof.measured:
        sys.exit(f"error: no shipped profile for {torch.cuda.get_device_name()} ({args.dtype})")
    measure_latency_fields_(prof, dev, dt)
    prof.env["launch_constants"] = {
        "measured": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "PYTHONPATH=src python " + " ".join(sys.argv),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
    }
    d = prof.to_dict()
    atomic_write_text(args.out, json.dumps(d, indent=1) + "\n")
    print(
        json.dumps({k: d[k] for k in ("launch_us", "copy_gbps", "aux_us")}),
        "fused:",
        bool(prof.fused_lowrank),
    )


if __name__ == "__main__":
    main()
