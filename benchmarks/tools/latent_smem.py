"""Shared memory of PaLU's latent decode kernel compiled for an H100 (sm_90) on the CPU, per Triton version.

Regenerates ``benchmarks/results/cpu/latent_smem.json`` (cited by ``gac.kernels.latent_attention.shrink``,
docs/compressors.md and ``benchmarks/results/h100/palu-default/README.md``): the launch table's key-group-4
row at the ranks the Fisher search picks on the Llama-3-8B shape (key rank up to 512, a 512-wide value
tile), with its stages and with one fewer, against the H100's 232,448 B per block. No GPU is needed:
:func:`gac.kernels.latent_attention.compiled_shared_bytes` compiles for the target. The GPU machine runs
Triton 3.6; to measure that version here, install it aside and put it first on the path::

    PYTHONPATH=src python benchmarks/tools/latent_smem.py --out benchmarks/results/cpu/latent_smem.json
    pip install --no-deps --target /tmp/tri36 triton==3.6.0
    PYTHONPATH=/tmp/tri36:src python benchmarks/tools/latent_smem.py --out benchmarks/results/cpu/latent_smem.json

Each run adds (or replaces) its Triton version's rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

H100_SMEM = 232_448
CASES = [(512, 512), (384, 512), (256, 256)]  # (padded key rank, value tile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import triton

    from gac.kernels import latent_attention as kl
    from gac.utils import atomic_write_text

    _, bt, br, nw, ns, _ = next(r for r in kl.LAUNCH_TABLE if r[0] >= 4)
    rows = []
    for rk, rvp in CASES:
        for stages in (ns, ns - 1):
            need = kl.compiled_shared_bytes(4, rk, rvp, bt, br, nw, stages)
            rows.append({"key_group": 4, "rk": rk, "rvp": rvp, "block_t": bt, "block_r": br, "num_warps": nw,
                         "num_stages": stages, "shared_bytes": need, "fits_h100": need <= H100_SMEM})  # fmt: skip
            print(f"triton {triton.__version__}: G=4 rk {rk} rvp {rvp} stages {stages}: {need:,} B")
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"schema": "gac.latent_smem/1", "runs": {}}
    doc["runs"][triton.__version__] = {
        "command": f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} python benchmarks/tools/latent_smem.py --out {args.out}",
        "env": {"python": platform.python_version(), "triton": triton.__version__, "target": "cuda sm_90"},
        "h100_shared_bytes": H100_SMEM,
        "rows": rows,
    }
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
