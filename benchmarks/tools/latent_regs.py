"""Registers and register spills of PaLU's latent decode kernel compiled for an H100 (sm_90) on the CPU.

Writes ``--out`` (``benchmarks/results/cpu/latent_regs_v12.json``; ``latent_regs.json`` holds the earlier runs against
``bf39189``): for the launch table's rows on the Llama-3-8B shape (4 query
heads a KV head) and the Qwen2.5-7B shape (7, with its key bias) at KV 0.5's ranks (key rank 256 a group of 4,
64 a head; values 256 a group of 4, and 432 as the 8B shapes' first layers: a 512-wide value tile), the registers a
thread, the stack a thread (what spills past the ABI's 32-byte frame) and the shared memory a block, from the cubin
(:func:`gac.kernels.latent_attention.compiled_resources`). The working tree's module is compiled as
:func:`gac.kernels.latent_attention.launch_config` launches it at 16 sequences x 32k (its KV heads a program, its
unrolling) with the value latents through a tensor descriptor where the launch takes one
(:func:`gac.kernels.latent_attention.transposed_values`, ranks aligned to 8 as ``--align gac``'s are). With
``--old`` the same for an earlier copy of the module (its path and a label naming its tree), compiled at the whole key
group a program. The GPU machine runs Triton 3.6; to measure that version here, install it aside and put it first on
the path::

    pip install --no-deps --target /tmp/tri36 triton==3.6.0
    git show cc6c504:src/gac/kernels/latent_attention.py > /tmp/latent_old.py
    PYTHONPATH=/tmp/tri36:src python benchmarks/tools/latent_regs.py --old /tmp/latent_old.py --old-label cc6c504 \\
        --out benchmarks/results/cpu/latent_regs_v12.json

Each run adds (or replaces) its Triton version's rows.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
from pathlib import Path

#: (label, key group, padded key rank, value tile, launch (block_t, block_r, warps, stages), query heads a KV head, bias,
#: KV heads)
CASES = [
    ("llama3-8b G4", 4, 256, 256, (128, 64, 8, 2), 4, False, 8),
    ("llama3-8b G4 values 432", 4, 256, 512, (128, 64, 8, 2), 4, False, 8),
    ("qwen2.5-7b G4", 4, 256, 256, (128, 64, 8, 2), 7, True, 4),
    ("qwen2.5-7b G4 values 432", 4, 256, 512, (128, 64, 8, 2), 7, True, 4),
    ("llama3-8b G1", 1, 64, 256, (32, 64, 4, 3), 4, False, 8),
    ("qwen2.5-7b G1", 1, 64, 256, (32, 64, 4, 3), 7, True, 4),
]


def resources(
    mod, group: int, rk: int, rvp: int, launch: tuple, n_rep: int, bias: bool, kvh: int, now: bool
) -> dict:
    """``compiled_resources`` of ``mod`` (``now``: as today's launch_config runs it); a module from before it existed
    is compiled through today's entry point."""
    bt, br, nw, ns = launch
    if now:
        cfg = mod.launch_config(16 * (kvh // group), 32768, group, None, n_rep=n_rep)
        heads = mod.program_heads(group, cfg.get("sub"))
        vdesc = mod.transposed_values(bt, bool(cfg.get("kloop")))
        r = mod.compiled_resources(
            heads,
            rk,
            rvp,
            bt,
            br,
            nw,
            ns,
            n_rep=n_rep,
            bias=bias,
            vdesc=vdesc,
            unroll=heads <= cfg.get("unroll", 2) and heads > 1,
        )  # fmt: skip (one head: as the
        # rows before, unrolled=False, staged up-projection off; the launch unrolls and stages it)
        return {**r, "program_heads": heads, "value_descriptor": vdesc}
    if hasattr(mod, "compiled_resources"):
        return mod.compiled_resources(group, rk, rvp, bt, br, nw, ns, n_rep=n_rep, bias=bias)
    from gac.kernels import latent_attention as cur

    saved = cur._latent_flash_kernel
    cur._latent_flash_kernel = mod._latent_flash_kernel  # compile the old kernel with today's helper
    try:
        return cur.compiled_resources(group, rk, rvp, bt, br, nw, ns, n_rep=n_rep, bias=bias)
    finally:
        cur._latent_flash_kernel = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--old", default=None, help="path to an earlier latent_attention module")
    ap.add_argument("--old-label", default="old", help="what --old is (the tree it came from)")
    args = ap.parse_args()

    import triton

    from gac.kernels import latent_attention as kl
    from gac.utils import atomic_write_text

    mods = {"now": kl}
    if args.old:
        spec = importlib.util.spec_from_file_location("latent_old", args.old)
        old = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(old)
        mods[args.old_label] = old
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    rows = []
    for label, g, rk, rvp, launch, n_rep, bias, kvh in CASES:
        for tree, mod in mods.items():
            r = resources(mod, g, rk, rvp, launch, n_rep, bias, kvh, tree == "now")
            rows.append({"case": label, "module": tree, "launch": list(launch), "rk": rk, "rvp": rvp, **r})
            print(f"triton {triton.__version__} {label} {tree}: {r}", flush=True)
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"schema": "gac.latent_regs/1", "runs": {}}
    doc["runs"][triton.__version__] = {
        "command": f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} python benchmarks/tools/latent_regs.py "
        + (f"--old {args.old} --old-label {args.old_label} " if args.old else "")
        + f"--out {args.out}",
        "tree": head + " (module 'now': the working tree)",
        "env": {"python": platform.python_version(), "triton": triton.__version__, "target": "cuda sm_90"},
        "rows": rows,
    }
    atomic_write_text(out, json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
