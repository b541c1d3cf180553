"""The H200 latent_attention class shipped after call 37: call 37's calls, each on the kernel the default path now runs.

Call 37 timed the class (``gpu_launch_constants.py --fields latent_attention``) while the Gluon kernel took key group 1
and one-KV-head programs of Llama-3-8B's group of 4 from 16 sequences. Both were then left to the Triton kernel
(``gac.kernels.latent_gluon.slower``: there the Triton kernel was timed faster), so those calls are taken from the
class timed on the Triton kernel alone (call 11, the profile shipped before), at the same call shapes: the Triton calls
both runs timed reproduce within 2%. Then each part (main and wide rows) is refitted
(``gac.hardware.latency.fit_latent_attention``). Run from the repository root:

    PYTHONPATH=src python benchmarks/results/h200/palu-default/call37/compose_class.py \\
        benchmarks/results/h200/palu-default/call37/h200-bfloat16.json \\
        benchmarks/results/h200/palu-default/call11/class/h200-bfloat16-class.json src/gac/profiles/h200-bfloat16.json
"""

from __future__ import annotations

import json
import os
import sys

import torch

from gac.hardware.latency import fit_latent_attention
from gac.kernels import latent_attention as kl
from gac.kernels import latent_gluon as lg


def key(c: dict) -> tuple:
    return c["key_group"], c["rank"], c.get("rank_v", c["rank"]), c["batch"], c["kv"]


def left_to_triton(c: dict, kv_heads: int, n_rep: int) -> bool:
    """Whether the default path now takes the Triton kernel at a call the Gluon kernel ran (``latent_gluon.slower``,
    with the Triton kernel's launch table as ``_launch`` reads it)."""
    launch = c["launch"]
    if launch.get("kernel") != "gluon":
        return False
    g, b = c["key_group"], c["batch"]
    table = kl.launch_config(b * (kv_heads // g), c["kv"], g, torch.device("cpu"), n_rep=n_rep, rk=c["rank"])
    return (
        lg.slower(g, b, lg.plan(g, n_rep, c["rank"], c["rank_v"]), kl.program_heads(g, table.get("sub")))
        is not None
    )


def compose(new: dict, old: dict) -> tuple[dict, list]:
    geo = new["fit"]["geometry"]
    kv_heads, n_rep = geo["kv_heads"], geo["heads"] // geo["kv_heads"]
    olds = {key(c): c for c in old["fit"]["calls"]}
    calls, swapped = [], []
    for c in new["fit"]["calls"]:
        if left_to_triton(c, kv_heads, n_rep):
            o = olds[key(c)]
            assert o["launch"].get("kernel", "triton") == "triton", o
            calls.append(o)
            swapped.append({"call": list(key(c)), "gluon_us": c["us"], "triton_us": o["us"]})
        else:
            calls.append(c)
    fit = fit_latent_attention(calls, new["fit"]["source"])
    fit["fit"].update(
        {k: new["fit"][k] for k in ("geometry", "skipped_over_budget", "elapsed_s")}, calls=calls
    )
    return fit, swapped


def read(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def main() -> None:
    new_path, old_path, out_path = sys.argv[1:4]
    new = read(new_path)["latent_attention"]
    old_doc = read(old_path)
    old = old_doc.get("latent_attention", old_doc)
    cls, swapped = compose(new, old)  # Llama-3-8B's attention: 32 query heads, 8 KV heads
    wide, swapped_w = compose(new["wide"], old["wide"])  # Qwen2.5-7B's: 28 query heads, 4 KV heads
    cls["wide"] = {**wide, "rows_over": new["wide"]["rows_over"]}
    cls["fit"]["composed"] = {
        "note": "call 37's calls (H200, 2026-11-29), those the default path now leaves to the Triton kernel "
        "(gac.kernels.latent_gluon.slower) taken from the Triton-only class of call 11 (2026-11-28) at the same "
        "shapes; benchmarks/results/h200/palu-default/call37/compose_class.py",
        "swapped": swapped,
        "swapped_wide": swapped_w,
    }
    prof = read(out_path)
    prof["latent_attention"] = cls
    env = read(new_path)["env"]["latent_attention"]
    prof["env"]["latent_attention"] = {**env, "note": cls["fit"]["composed"]["note"]}
    with open(out_path + ".tmp", "w") as f:
        f.write(json.dumps(prof, indent=1) + "\n")
    os.replace(out_path + ".tmp", out_path)
    for part, c in (("main", cls), ("wide", cls["wide"])):
        for g, r in c["groups"].items():
            print(
                part, "G", g, {k: r[k] for k in ("launch_us", "gbps", "tflops", "points", "max_abs_rel_err")}
            )
    print("swapped", len(swapped), "calls;", len(swapped_w), "wide")


if __name__ == "__main__":
    main()
