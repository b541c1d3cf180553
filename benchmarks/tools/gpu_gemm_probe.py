"""Which GEMMs cuBLAS splits over K (a splitKreduce kernel after them), and which biased ones run as a copy
plus an accumulating GEMM instead of the bias epilogue (issue 32; one GPU, a few seconds).

Command (H100, `benchmarks/results/h100/latency-fields/splitk/`): `OUT=DIR python3 benchmarks/tools/gpu_gemm_probe.py`"""

# ruff: noqa: B023  (each lambda is called within its own loop iteration)
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

torch.manual_seed(0)
dev = "cuda"
out = {
    "env": {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda},
    "command": " ".join(sys.argv),
    "rows": [],
}


def kernels(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    names = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            d = names.setdefault(e.name[:90], [0, 0.0])
            d[0] += 1
            d[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return {k: [v[0] / reps, v[1] / v[0]] for k, v in names.items()}


def timed(fn, reps=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


for K, Ns in (
    (3584, (2416, 2432, 2448, 2464, 2496, 2560, 3584, 4608, 1392, 1400, 1408, 2304, 2320)),
    (4096, (3504, 3520, 3584, 6144, 1456)),
):
    for M in (128, 512, 2048):
        for N in Ns:
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5
            b = torch.randn(N, device=dev, dtype=torch.bfloat16)
            ks = kernels(lambda: F.linear(x, w, b))
            copy = any("copy" in k for k in ks)
            badd = any("badd" in k for k in ks)
            row = {
                "M": M,
                "K": K,
                "N": N,
                "copy": copy,
                "badd": badd,
                "kernels": ks,
                "biased_us": timed(lambda: F.linear(x, w, b)),
                "plain_us": timed(lambda: F.linear(x, w)),
            }
            out["rows"].append(row)
            print(
                M,
                K,
                N,
                "copy" if copy else "-",
                "badd" if badd else "-",
                round(row["biased_us"], 1),
                round(row["plain_us"], 1),
                flush=True,
            )

# cuBLAS's split-K choice: which plain GEMMs run a splitKreduce kernel
out["splitk"] = []
for K in (4096, 8192, 11008, 14336, 18944):
    for N in (1024, 1456, 2048, 2288, 2304, 3584, 4096):
        for M in (16, 64, 128, 256, 512, 1024, 2048):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5
            ks = kernels(lambda: F.linear(x, w), reps=2)
            red = [v for k, v in ks.items() if "splitKreduce" in k]
            out["splitk"].append(
                {
                    "M": M,
                    "K": K,
                    "N": N,
                    "split": any("splitK" in k for k in ks),
                    "reduce_us": red[0][1] if red else None,
                    "kernels": list(ks),
                }
            )
    print("splitk K", K, flush=True)

# the compiled step's form: a fused first stage under torch.compile
for N in (2416, 2432, 4608):
    M, K = 512, 3584
    x = torch.randn(1, M, K, device=dev, dtype=torch.bfloat16)
    w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) / K**0.5
    b = torch.randn(N, device=dev, dtype=torch.bfloat16)
    f = torch.compile(lambda x: F.linear(x, w, b))
    ks = kernels(lambda: f(x))
    out["rows"].append({"M": M, "K": K, "N": N, "compiled": True, "kernels": ks, "us": timed(lambda: f(x))})
    print("compiled", N, [k[:40] for k in ks])
os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
with open(os.path.join(os.environ.get("OUT", "."), "gemm_probe.json"), "w") as fh:
    json.dump(out, fh, indent=1)
