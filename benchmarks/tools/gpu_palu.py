"""GPU decode speed of PaLU's latent KV cache: a Llama-3-8B-shaped model, dense vs. ``none`` / ``round`` / ``gac``.

Random bf16 weights (speed does not depend on their values). The ranks come from the real
pipeline: ``gac.api.plan`` with ``palu`` at KV ratio 0.5 (Fisher information of the
language-modelling loss on real English text as byte-level ids, whitened group-head SVD, group
size 4), then ``plan.allocation(align)`` under the profile gac loads for this GPU. Every variant is
timed with :func:`gac.eval.infer.sweep_model`, the default path users run (static cache,
``torch.compile``, CUDA graphs); the PaLU variants decode with the Triton latent-attention kernel
(:mod:`gac.kernels.latent_attention`). Peak memory and OOMs are recorded per point; the
bytes-ideal speedup is (weights + KV bytes per step) dense over compressed, per point.

Run: ``PYTHONPATH=src python3 benchmarks/tools/gpu_palu.py --out benchmarks/results/<gpu>/palu_llama3_8b``
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_pruner import speed_args, speed_run  # noqa: E402

from gac.api import CompressConfig, apply_  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = speed_args(__doc__, prefill_seqs="512,2048", decode_kv="4096,16384,32768")
    ap.add_argument("--ratio", type=float, default=0.5, help="KV-cache fraction kept")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--k-group-size", type=int, default=None, help="key group size (default: --group-size)")
    ap.add_argument(
        "--folded", default="gac", help="aligns also timed with values folded into o_proj (fold_values=True)"
    )
    args = ap.parse_args(argv)
    ccfg = CompressConfig(
        compressor="palu",
        param_ratio=args.ratio,
        align="none",
        options={"group_size": args.group_size, "k_group_size": args.k_group_size, "svd_dtype": "float32"},
    )
    method = (
        f"palu (fisher_uniform, whiten, group size {args.group_size}, key group size "
        f"{args.k_group_size or args.group_size}) at KV ratio {args.ratio}, "
        "then plan.allocation(align)"
    )

    def folded(align: str):
        def build(model, p, allocs):
            if align not in allocs:
                raise SystemExit(f"error: --folded {align} needs {align} in --aligns")
            p.compressor.fold_values = True
            try:
                return apply_(model, p, allocs[align])
            finally:
                p.compressor.fold_values = False

        return build

    extra = {f"{a}-folded": folded(a) for a in args.folded.split(",") if a}
    return speed_run(args, ccfg, method, dims_key="ranks", extra_variants=extra)


if __name__ == "__main__":
    raise SystemExit(main())
