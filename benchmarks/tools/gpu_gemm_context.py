"""Why a GEMM timed alone can take longer than the same GEMM inside a compiled step (GPU).

Inside the Llama-3-8B shape's compiled prefill at 512 rows the fused gate/up projection (``[512, 4096] @
[4096, 28672]``) ran in 151.9 µs (``benchmarks/results/h100/svdllm-trace/``); ``gpu_gemm_rows.py`` timed the same
shape alone at 190.6 µs (``benchmarks/results/h100/gemm-rows/``), while small GEMMs took about as long alone as in
the step. This times a few of those shapes several ways, each as 64 calls captured in one CUDA graph, and reads
every GEMM kernel's duration and name off ``torch.profiler`` (device time per kernel, not the graph's wall time),
with the SM clock sampled through NVML while each mode replays:

* ``mm_out``: ``torch.mm(x, W.t(), out=y)`` over weight copies past L2 (``gpu_gemm_rows.py``'s call);
* ``linear``: ``F.linear(x, W)`` over the same copies (what an eager ``nn.Linear`` runs);
* ``linear_spaced``: the same with a ~20 µs elementwise kernel between GEMMs (a step's other work);
* ``compiled``: ``torch.compile``'s lowering of ``F.linear`` (Inductor's extern GEMM), over the same copies.

    PYTHONPATH=src python3 benchmarks/tools/gpu_gemm_context.py --out $OUT/gemm_context.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F

#: (rows, k, n, what): the Llama-3-8B shape's dense fused gate/up and down projections, and two factorized ones
SHAPES = [
    (512, 4096, 28672, "dense fused gate/up"),
    (512, 14336, 4096, "dense down"),
    (512, 2272, 14336, "SVD-LLM gate.u"),
    (512, 4096, 1456, "SVD-LLM o_proj.v"),
]


class Clocks:
    """SM clock (MHz) and power (W) sampled every 5 ms through NVML while in the ``with`` block."""

    def __init__(self, index: int) -> None:
        self.index, self.samples = index, []

    def __enter__(self) -> Clocks:
        try:
            import pynvml

            pynvml.nvmlInit()
            h = pynvml.nvmlDeviceGetHandleByIndex(self.index)
        except Exception:  # noqa: BLE001 - no NVML: no clock samples
            return self
        self._stop = False

        def run() -> None:
            while not self._stop:
                self.samples.append((pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                                     pynvml.nvmlDeviceGetPowerUsage(h) / 1000))  # fmt: skip
                time.sleep(0.005)

        self._t = threading.Thread(target=run, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if hasattr(self, "_t"):
            self._stop = True
            self._t.join()

    def summary(self) -> dict:
        if not self.samples:
            return {}
        return {"sm_mhz_median": statistics.median(s[0] for s in self.samples),
                "sm_mhz_min": min(s[0] for s in self.samples),
                "power_w_median": statistics.median(s[1] for s in self.samples)}  # fmt: skip


def kernels(graph: torch.cuda.CUDAGraph, replays: int) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    return [
        (e.name, e.device_time) for e in prof.events() if e.device_type.name == "CUDA" and e.device_time > 0
    ]


def time_shape(rows: int, k: int, n: int, what: str, calls: int, seconds: float, lin, big) -> dict:
    """Every mode of one ``[rows, k] @ [k, n]`` GEMM: per call, the GEMM kernels' device µs, their names, the clock."""
    from gac.hardware.timing import copies_past_l2

    dev, dt = big.device, big.dtype
    ws = [torch.randn(n, k, device=dev, dtype=dt) for _ in range(copies_past_l2(n * k * 2))]
    x = torch.randn(rows, k, device=dev, dtype=dt)
    y = torch.empty(rows, n, device=dev, dtype=dt)
    modes = {
        "mm_out": lambda i: torch.mm(x, ws[i % len(ws)].t(), out=y),
        "linear": lambda i: F.linear(x, ws[i % len(ws)]),
        "linear_spaced": lambda i: (F.linear(x, ws[i % len(ws)]), big.mul_(1.0)),
        "compiled": lambda i: lin(x, ws[i % len(ws)]),
    }
    rec: dict = {"rows": rows, "k": k, "n": n, "what": what, "weight_copies": len(ws), "modes": {}}
    for mode, fn in modes.items():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for i in range(3):
                fn(i)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for i in range(calls):
                fn(i)
        g.replay()
        torch.cuda.synchronize()
        t0 = time.time()
        with Clocks(dev.index or 0) as clk:
            n_rep = 0
            while time.time() - t0 < seconds:
                g.replay()
                n_rep += 1
                if n_rep % 20 == 0:
                    torch.cuda.synchronize()
            torch.cuda.synchronize()
            ks = kernels(g, 5)
        # the GEMM's kernels (a split-K reduction included), not the spacer nor memsets
        gemm = [(nm, us) for nm, us in ks if "elementwise" not in nm and "Memset" not in nm]
        per_call = sum(us for _, us in gemm) / (calls * 5) if gemm else None
        rec["modes"][mode] = {
            "gemm_us_per_call": per_call,
            "gemm_tflops": 2 * rows * k * n / (per_call * 1e-6) / 1e12 if per_call else None,
            "kernels": sorted({nm[:110] for nm, _ in gemm}), "clock": clk.summary(),
        }  # fmt: skip
        print(f"{what:22s} {mode:14s} {per_call or float('nan'):8.1f} us  {clk.summary()}  "
              f"{rec['modes'][mode]['kernels'][:2]}", file=sys.stderr, flush=True)  # fmt: skip
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--calls", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=3.0, help="replay this long per mode (clock under load)")
    a = ap.parse_args()
    from gac.guard import atomic_write_text
    from gac.hardware.timing import environment

    dev, dt = torch.device("cuda"), torch.bfloat16
    res: dict = {"schema": "gac.gemm_context/1", "command": " ".join(["python3", *sys.argv]),
                 "env": environment(dev), "shapes": []}  # fmt: skip
    lin = torch.compile(lambda x, w: F.linear(x, w), dynamic=False)
    big = torch.empty(24 * 2**20, device=dev, dtype=dt)  # an elementwise pass over 48 MB: about 20 µs
    for rows, k, n, what in SHAPES:
        res["shapes"].append(time_shape(rows, k, n, what, a.calls, a.seconds, lin, big))
        torch.cuda.empty_cache()
        atomic_write_text(a.out, json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
