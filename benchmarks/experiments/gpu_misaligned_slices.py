"""Why fused q/k/v slices off a 16-byte boundary are copied (:func:`gac.nn.fused.aligned_split`).

A tiny Llama (bf16, CUDA) with odd ranks (7, 37, 13, 29) and a dense ``v_proj``, fused: the ``v``
slice of the fused q/k/v product starts 44 elements (88 bytes) into its row.  One forward:

    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=src python3 benchmarks/experiments/gpu_misaligned_slices.py plain
    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=src python3 benchmarks/experiments/gpu_misaligned_slices.py aligned

``plain`` hands the slices out as views (what the code did before); ``aligned`` is the default.
On the H200 (torch 2.11) ``plain`` died with ``misaligned address`` in
``scaled_dot_product_attention`` and ``aligned`` ran
(``benchmarks/results/h200/speed-fused/misaligned_slices.txt``).
"""

from __future__ import annotations

import sys

import torch

import gac.nn.fused as F
from gac.testing import factorize_at_odd_ranks, tiny_model

mode = sys.argv[1] if len(sys.argv) > 1 else "aligned"
if mode == "plain":
    F.aligned_split = lambda y, sizes: list(y.split(sizes, dim=-1))
torch.manual_seed(0)
model = factorize_at_odd_ranks(tiny_model("llama", dtype=torch.bfloat16).cuda())  # v_proj stays dense
F.fuse_projections_(model)
splits = [m.splits for m in model.modules() if isinstance(m, F.FusedInputProjection)][:2]
print(mode, splits, model.config._attn_implementation, flush=True)
ids = torch.randint(0, 250, (1, 1), device="cuda")
with torch.no_grad():
    out = model(ids, use_cache=False).logits
torch.cuda.synchronize()
print(mode, "ok", out.float().norm().item(), flush=True)
