# Registers, stack and shared memory of the key-group-4 launches at key rank 128, value tile 512 (value rank 384),
# compiled for sm_90 on the CPU with Triton 3.6 (the GPU machine's), before and after latent_attention.ONE_CHUNK_RANK:
#   pip install --no-deps --target /tmp/tri36 triton==3.6.0
#   PYTHONPATH=/tmp/tri36:src python benchmarks/results/cpu/latent_regs_onechunk.py > benchmarks/results/cpu/latent_regs_onechunk.json
import json, triton
from gac.kernels import latent_attention as kl
rows=[]
for label, g, rk, rvp, launch, nrep, bias in [
    ("qwen k128/v384 before (64-rank chunks, 2 stages)", 2, 128, 512, (128, 64, 8, 2), 7, True),
    ("qwen k128/v384 one chunk, 2 stages", 2, 128, 512, (128, 128, 8, 2), 7, True),
    ("qwen k128/v384 one chunk, 3 stages (the table's now)", 2, 128, 512, (128, 128, 8, 3), 7, True),
    ("llama k128/v384 before", 4, 128, 512, (128, 64, 8, 2), 4, False),
    ("llama k128/v384 one chunk (the table's now)", 4, 128, 512, (128, 128, 8, 2), 4, False),
]:
    r = kl.compiled_resources(g, rk, rvp, *launch, n_rep=nrep, bias=bias, vdesc=True, unroll=False)
    rows.append({"case": label, "key_group_program": g, "rk": rk, "rvp": rvp, "launch": launch, **r})

import platform, subprocess
print(json.dumps({"command": "PYTHONPATH=/tmp/tri36:src python benchmarks/results/cpu/latent_regs_onechunk.py", "triton": triton.__version__, "tree": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(), "machine": platform.platform(), "rows": rows}, indent=1))
