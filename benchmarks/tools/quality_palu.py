"""PaLU on SmolLM2-135M-Instruct (CPU): perplexity and KV-cache bytes per token, dense / none / round / knapsack / gac.

* ``none``: PaLU's own rank search (``fisher_uniform``, whitened group-head SVD), raw ranks.
* ``round``: the reference's rounding of every group rank to a multiple of 32 (off budget).
* ``knapsack``: gac's allocator with alignment off (the unaligned control).
* ``gac``: the same allocator restricted to ranks the profile marks fast, within the none budget.

SmolLM2 has 3 KV heads, so the default group size 4 falls back to 3 (one group per projection,
the reference's "J-LRD"); ``--group-size 1`` runs per-head groups. ``--ratios`` are the KV-cache
fractions kept (the reference's ``--param_ratio_target``). ``--k-group-size``/``--v-group-size``
group keys and values apart (each defaults to ``--group-size``). One calibration per ratio serves all
four align strategies; rows are written atomically and a re-run (or another group setting into the
same file) skips finished rows (keyed by ratio, align, key and value group size, and ``--key-rank-max`` /
``--value-rank-max``: PaLU's ``key_rank_max`` / ``value_rank_max`` options, each group's rank at most that, and
``--search``). With ``--allow-slower`` the one plan runs under ``--align gac``, so on a profile whose latent class
sets PaLU's kernel rank caps (the H200's, for head_dim 128) every row of such a model carries them, ``none``'s too;
SmolLM2 (head_dim 64) takes none (``benchmarks/results/cpu/palu_default_smollm2_h200.json``), and the committed rows
use the default profile, which sets none.

Run (the committed result)::

    OMP_NUM_THREADS=1 python benchmarks/tools/quality_palu.py --out benchmarks/results/cpu/quality_palu.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--ratios", default="0.5,0.7")
    ap.add_argument("--aligns", default="none,round,knapsack,gac")
    ap.add_argument("--group-size", type=int, default=None)
    ap.add_argument("--k-group-size", type=int, default=None, help="key group size (default: --group-size)")
    ap.add_argument("--v-group-size", type=int, default=None, help="value group size (default: --group-size)")
    ap.add_argument(
        "--search", default=None, help="palu option search (default: the compressor's, fisher_uniform)"
    )
    ap.add_argument("--key-rank-max", type=int, default=None, help="palu option key_rank_max (default: none)")
    ap.add_argument(
        "--value-rank-max", type=int, default=None, help="palu option value_rank_max (default: none)"
    )
    ap.add_argument("--calib-samples", type=int, default=32)
    ap.add_argument("--calib-len", type=int, default=256)
    ap.add_argument("--eval-len", type=int, default=512)
    ap.add_argument("--eval-windows", type=int, default=4)
    ap.add_argument("--profile", default="default")
    ap.add_argument(
        "--allow-slower",
        action="store_true",
        help="lift the latency guard of --align gac (a GPU profile on which PaLU is predicted slower than dense)",
    )
    args = ap.parse_args()

    import torch

    from gac.api import CompressConfig, apply_, plan
    from gac.compressors.calibration import CalibrationConfig, calibration_batches
    from gac.data import load_text, tokenize
    from gac.eval.ppl import perplexity_of_ids
    from gac.models import load_model
    from gac.surgery.latent_attention import kv_bytes_per_token
    from gac.utils import atomic_write_text, console

    out = Path(args.out)
    result: dict = json.loads(out.read_text()) if out.is_file() else {}
    t_start = time.time() - float(result.get("elapsed_s", 0.0))
    torch.manual_seed(0)
    lm = load_model("smollm2")
    base, tok = lm.model, lm.tokenizer
    eval_ids = tokenize(tok, load_text("britannica", "test"))
    batches = calibration_batches(
        tok, CalibrationConfig("britannica", args.calib_samples, args.calib_len, batch_size=4)
    )
    command = "OMP_NUM_THREADS=1 python benchmarks/tools/quality_palu.py " + " ".join(
        f"--{k.replace('_', '-')}" + ("" if isinstance(v, bool) else f" {v}")
        for k, v in vars(args).items()
        if v is not None and v is not False
    )
    # a file filled by several invocations (other groupings or aligns) keeps each one's command
    commands = [*result.get("commands", [result["command"]] if "command" in result else []), command]
    result.update(
        schema="gac.bench.quality_palu/1",
        command=command,
        commands=list(dict.fromkeys(commands)),
        model={**lm.source, "name": "SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32"},
        env={
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        calibration={
            "source": "britannica train half",
            "n_samples": args.calib_samples,
            "seq_len": args.calib_len,
            "used_for": "Fisher information and whitening Gram (one pass)",
        },
        eval={"text": "britannica test half", "seq_len": args.eval_len, "windows": args.eval_windows},
        profile=args.profile,
        allow_slower=args.allow_slower,
    )
    result.setdefault("runs", [])

    def key(ratio: float, align: str, opts: dict) -> tuple:
        return (ratio, align, opts.get("k_group_size"), opts.get("v_group_size"), opts.get("key_rank_max"),
                opts.get("value_rank_max"), opts.get("search", "fisher_uniform"))  # fmt: skip

    def save() -> None:
        result["elapsed_s"] = round(time.time() - t_start, 1)
        atomic_write_text(out, json.dumps(result, indent=1) + "\n")

    def ppl(model) -> dict:
        return perplexity_of_ids(model, eval_ids, seq_len=args.eval_len, max_windows=args.eval_windows)

    if "dense" not in result:
        console.print("[bold]dense[/]")
        result["dense"] = {**ppl(base), "kv_bytes_per_token": kv_bytes_per_token(base)["dense"]}
        save()
    aligns = args.aligns.split(",")
    options = {"svd_dtype": "float32"}
    for k in ("group_size", "k_group_size", "v_group_size", "key_rank_max", "value_rank_max", "search"):
        if getattr(args, k) is not None:
            options[k] = getattr(args, k)
    done = {key(r["ratio"], r["align"], r["options"]) for r in result["runs"]}
    for ratio in (float(r) for r in args.ratios.split(",")):
        t0 = time.time()
        cfg = CompressConfig(
            compressor="palu",
            param_ratio=ratio,
            align="gac" if args.allow_slower else "none",  # the config's align only carries the lifted guard
            profile=args.profile,
            options=options,
            allow_slower=args.allow_slower,
        )
        from gac.compressors.base import get_compressor

        resolved = get_compressor("palu", **options)
        resolved.sites(base)  # the group sizes as resolved for this model (the rows' keys)
        todo = [a for a in aligns if key(ratio, a, resolved.options()) not in done]
        if not todo:
            continue
        p = plan(base, cfg, calib_batches=batches)
        plan_s = time.time() - t0
        for align in todo:
            t1 = time.time()
            alloc = p.allocation(align)
            model = copy.deepcopy(base)
            rep = apply_(model, p, alloc)
            kv = kv_bytes_per_token(model)
            row = {
                "ratio": ratio,
                "align": align,
                **ppl(model),
                "kv_bytes_per_token": kv["cache"],
                "kv_fraction": kv["cache"] / kv["dense"],
                "latent_dims": alloc.cost,
                "budget": p.budget,
                "budget_use": alloc.cost / p.budget,
                "pct_aligned": alloc.pct_aligned,
                "ranks": {k: int(v) for k, v in alloc.dims.items()},
                "native_ranks": {k: int(v) for k, v in p.native.items()},
                "options": rep.compressor_options,
                "params_after": rep.model_params_after,
                "command": result["command"],
                "plan_s": round(plan_s, 1),
                "seconds": round(time.time() - t1, 1),
            }
            console.print(
                f"ratio {ratio} {align:9s} ppl {row['ppl']:.2f}  KV {row['kv_fraction']:.3f}  "
                f"aligned {row['pct_aligned']:.0f}%  budget use {row['budget_use']:.4f}"
            )
            result["runs"].append(row)
            save()
            del model
    save()


if __name__ == "__main__":
    main()
