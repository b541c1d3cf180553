# What the latent decode kernel's token loop waits on, read off the flash kernel compiled for sm_90 on the CPU with
# Triton 3.6 (the GPU machine's), at the launch table's key-group-4 launches (key rank 128 as one chunk, value
# tile 512 for value rank 384, the value latents through a tensor descriptor):
#   pip install --no-deps --target /tmp/tri36 triton==3.6.0
#   PYTHONPATH=/tmp/tri36:src python benchmarks/results/cpu/latent_loop_waits.py > benchmarks/results/cpu/latent_loop_waits.json
# For each launch, in the Triton GPU IR of the token loop (the kernel's outer scf.for): the loads and waits in
# program order, the loops nested in it, and which loads the software pipeliner made asynchronous (multi-buffered,
# waited a stage later). A load is "synchronous" where its wait (a TMA barrier wait, or the shared-memory copy of a
# register load) follows it before any other work.
import json
import platform
import re
import subprocess

import triton

from gac.kernels import latent_attention as kl


def token_loop(ir: str) -> list[str]:
    lines = ir.splitlines()
    start = next(i for i, ln in enumerate(lines) if "scf.for" in ln and "step %c128_i32" in ln)
    indent = len(lines[start]) - len(lines[start].lstrip())
    body = []
    for ln in lines[start + 1 :]:
        if ln.strip().startswith("}") and len(ln) - len(ln.lstrip()) == indent:
            break
        body.append(ln)
    return body


def events(body: list[str]) -> list[str]:
    out = []
    depth = 0
    loaded = set()  # SSA values defined by a register load
    for ln in body:
        d = "  " * depth
        m = re.match(r"\s*(%[\w.]+)(?::\d+)? =", ln)
        ssa = m[1] if m else ""
        name = re.sub(r"_\d+$", "", ssa.lstrip("%"))
        if "scf.for" in ln:
            out.append(d + "inner loop {")
            depth += 1
        elif ln.strip().startswith("scf.yield") and depth:
            depth -= 1
            out.append("  " * depth + "}")
        elif "ttng.async_tma_copy_global_to_local" in ln:
            desc = re.search(r"local %(\w+)\[", ln)[1]
            out.append(d + f"TMA copy ({desc})")
        elif "ttng.wait_barrier" in ln:
            out.append(d + "TMA wait")
        elif "ttg.async_copy_global_to_local" in ln:
            out.append(d + f"async copy ({name}, pipelined)")
        elif "ttg.async_wait" in ln:
            out.append(d + "async wait")
        elif re.search(r"= tt\.load .*tensor<\d+x\d+x", ln):
            loaded.add(ssa)
            out.append(d + f"register load ({name})")
        elif "ttg.local_alloc %" in ln and re.search(r"local_alloc (%[\w.]+)", ln)[1] in loaded:
            out.append(d + f"to shared memory ({name}): waits for its load")
        elif "ttng.warp_group_dot " in ln:
            out.append(d + f"tensor-core dot ({name})")
    return out


rows = []
for label, g, nrep, bias, stages in [
    ("llama3-8b: 4 KV heads a program, key rank 128, value rank 384 (the table's launch)", 4, 4, False, 2),
    ("qwen2.5-7b: 2 KV heads a program, key rank 128, value rank 384 (the table's launch)", 2, 7, True, 3),
]:
    k = kl.compiled_kernel(g, 128, 512, 128, 128, 8, stages, n_rep=nrep, bias=bias, vdesc=True, unroll=False)
    ev = events(token_loop(k.asm["ttgir"]))
    res = kl.compiled_resources(g, 128, 512, 128, 128, 8, stages, n_rep=nrep, bias=bias, vdesc=True, unroll=False)
    outer = [e for e in ev if not e.startswith("  ")]
    rows.append({
        "case": label,
        "launch": {"block_t": 128, "block_r": 128, "num_warps": 8, "num_stages": stages, "sub": g},
        **res,
        "programs_per_multiprocessor_by_registers": 65536 // (res["registers"] * 32 * 8),
        "token_loop": ev,
        "token_loop_tma_copies": sum("TMA copy" in e for e in outer),
        "token_loop_tma_waits": sum("TMA wait" in e for e in outer),
        "token_loop_register_loads_waited_at_once": sum("to shared memory" in e for e in outer),
        "pipelined_loads": sorted({e.strip() for e in ev if "pipelined" in e}),
    })
# the Llama launch with the group's heads unrolled (the token loop then the innermost, pipelined by Triton)
unrolled = [
    {"case": f"llama3-8b launch, heads unrolled, {st} stage(s)", "num_stages": st,
     **kl.compiled_resources(4, 128, 512, 128, 128, 8, st, n_rep=4, bias=False, vdesc=True, unroll=True)}
    for st in (1, 2)
]  # fmt: skip
print(json.dumps({
    "command": "PYTHONPATH=/tmp/tri36:src python benchmarks/results/cpu/latent_loop_waits.py",
    "triton": triton.__version__,
    "tree": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
    "machine": platform.platform(),
    "rows": rows,
    "heads_unrolled": unrolled,
}, indent=1))
