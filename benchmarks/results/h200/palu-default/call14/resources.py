# Registers, stack and shared memory of call 14's launches, compiled for sm_90 on the CPU with Triton 3.6, at the
# tree that ran (3f759a6: its compiled_kernel takes stage_u):
#   git worktree add /tmp/t14 3f759a6 && pip install --no-deps --target /tmp/tri36 triton==3.6.0
#   cd /tmp/t14 && PYTHONPATH=/tmp/tri36:src python /path/to/call14/resources.py > /path/to/call14/resources.json
import json
import subprocess

import triton
import triton.language as tl

from gac.kernels import latent_attention as kl

rows = []
for label, g, nrep, bias, kw in [
    ("llama3-8b, the table's launch (128, 128, 8 warps, 2 stages)", 4, 4, False, dict(block_t=128, num_warps=8, num_stages=2)),
    ("llama3-8b, four heads unrolled and staged (1 stage)", 4, 4, False, dict(block_t=128, num_warps=8, num_stages=1, unroll=True, stage_u=True)),
    ("qwen2.5-7b, the table's launch (two KV heads a program, 3 stages)", 2, 7, True, dict(block_t=128, num_warps=8, num_stages=3)),
]:  # fmt: skip
    bt, nw, st = kw.pop("block_t"), kw.pop("num_warps"), kw.pop("num_stages")
    r = kl.compiled_resources(g, 128, 512, bt, 128, nw, st, n_rep=nrep, bias=bias, vdesc=True, **kw)
    rows.append({"case": label, **r})
kl.VALUE_T_TILE = 64  # as devrun/vt64.py ran it
kl._VT_TILE = tl.constexpr(64)
for label, g, nrep, bias in [("llama3-8b", 4, 4, False), ("qwen2.5-7b (two KV heads a program)", 2, 7, True)]:
    for st in (1, 2):
        r = kl.compiled_resources(g, 128, 512, 64, 128, 4, st, n_rep=nrep, bias=bias, vdesc=True)
        per_warp = -(-r["registers"] * 32 // 256) * 256
        rows.append({"case": f"{label}, 64-token tiles in 4 warps, values transposed, {st} stage(s)", **r,
                     "programs_per_multiprocessor": min(65536 // (per_warp * 4), 232448 // (r["shared_bytes"] + 1024))})  # fmt: skip
print(json.dumps({"triton": triton.__version__,
                  "tree": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
                  "note": "key rank 128 (one chunk), value tile 512, value latents through the descriptor",
                  "rows": rows}, indent=1))  # fmt: skip
