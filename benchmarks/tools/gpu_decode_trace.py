"""Where a decode (or prefill) step's time goes, on the default path, as a CUDA graph replays it.

Both models of ``plans/speed.toml``'s Llama-3-8B cells (8 layers, bf16, random weights): dense, and
factorized at the ranks of the committed SVD-LLM cell (``--cell``).  Each is switched to the default
decode kernels (:func:`gac.runtime.step.use_decode_kernels_`: attention on the KV heads, Triton GEMV,
one-launch low-rank kernel and parallel second stages where measured faster), compiled per static
shape and captured per step, exactly as ``gac eval infer`` does.  For every point (``--points``:
``BxKV`` a decode step, ``pBxS`` a prompt forward of ``B`` sequences of ``S`` tokens):

* the step's median wall time over graph replays (CUDA events);
* a kernel trace of a few replays (``torch.profiler``): every kernel and memcpy with its duration,
  bytes for copies, the busy time (union of kernel intervals: parallel branches counted once) and
  the idle time between them (graph launch gaps);
* with ``--output-code``, Inductor's generated code for every graph compiled, in the log.

  TORCH_LOGS=output_code PYTHONPATH=src python3 benchmarks/tools/gpu_decode_trace.py --out $OUT/trace.json 2> $OUT/compile.log

Regenerates ``benchmarks/results/h200/decode-trace/`` (docs/eval.md: where a decode step's time goes).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "tools"))
CELL = ROOT / "benchmarks/results/h200/speed-branches/cells/shape-llama3-8b-8/svd-llm-r0.85-gac.json"


def trace_replays(step, reps: int = 5) -> dict:
    """Kernel and memcpy events of ``reps`` graph replays, summarised per replay."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t.json"
        prof.export_chrome_trace(str(p))
        ev = json.loads(p.read_text())["traceEvents"]
    ks = [e for e in ev if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    ks.sort(key=lambda e: e["ts"])
    if not ks:
        return {"error": "no device events"}
    span = ks[-1]["ts"] + ks[-1]["dur"] - ks[0]["ts"]
    busy, end = 0.0, -1e30
    for e in ks:  # union of intervals
        s, f = e["ts"], e["ts"] + e["dur"]
        if f > end:
            busy += f - max(s, end)
            end = f
    by: dict[str, dict] = {}
    for e in ks:
        d = by.setdefault(e["name"][:160], {"name": e["name"][:160], "cat": e["cat"], "count": 0, "us": 0.0})
        d["count"] += 1
        d["us"] += e["dur"]
        if "bytes" in e.get("args", {}):
            d["bytes"] = e["args"]["bytes"]
    one = len(ks) // reps
    seq = [{"name": e["name"][:120], "us": round(e["dur"], 2), "t_us": round(e["ts"] - ks[0]["ts"], 2),
            **({"bytes": e["args"]["bytes"]} if "bytes" in e.get("args", {}) else {})} for e in ks[:one]]  # fmt: skip
    for d in by.values():
        d["count"] /= reps
        d["us"] /= reps
    return {"events_per_step": len(ks) / reps, "span_us_per_step": span / reps, "busy_us_per_step": busy / reps,
            "by_name": sorted(by.values(), key=lambda d: -d["us"]), "first_step": seq}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument("--cell", default=str(CELL))
    ap.add_argument("--points", default="1x512,1x4096,16x512,64x512", help="BxKV (decode), pBxS (prefill)")
    ap.add_argument(
        "--models", default="dense,svd-llm", help="dense, svd-llm; NAME:nogemv without the Triton GEMV"
    )
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the plumbing (no graphs, no trace)")
    a = ap.parse_args()
    from gpu_decode_diagnostic import build

    from gac.eval.infer import SweepConfig, _time_calls, copy_bandwidth, weight_bytes_per_step
    from gac.guard import atomic_write_text
    from gac.hardware.timing import environment
    from gac.runtime.step import DecodeStep, capture_graph, compile_step, use_decode_kernels_

    t0 = time.time()
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dims = json.loads(Path(a.cell).read_text())["results"]["dims"]
    res: dict = {"schema": "gac.decode-trace/1", "command": " ".join([sys.executable, *sys.argv]),
                 "env": environment(dev), "cell": a.cell, "models": {}}  # fmt: skip
    res["copy_bandwidth"] = copy_bandwidth(dev)
    out = Path(a.out)

    def save() -> None:
        atomic_write_text(out, json.dumps(res, indent=1, default=str))

    cfg = SweepConfig()
    pts = [(p[0] == "p", *(int(v) for v in p.lstrip("p").split("x"))) for p in a.points.split(",")]
    for name in a.models.split(","):
        # "NAME:nogemv": the same model with the Triton GEMV off (cuBLAS for every projection)
        kind, _, opt = name.partition(":")
        model = build(a.spec, dims if kind != "dense" else None, a.device)
        kernels = use_decode_kernels_(model, gemv=opt != "nogemv")
        torch._dynamo.reset()
        for knob in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, knob):
                setattr(torch._dynamo.config, knob, max(256, getattr(torch._dynamo.config, knob)))
        fwd = compile_step(model.forward, None, cfg.combo_kernels, dynamic=False)  # as the sweep compiles
        rec = {"weight_bytes": weight_bytes_per_step(model), "kernels": kernels, "points": []}
        res["models"][name] = rec
        for prefill, b, n in pts:
            label = f"{name} {'prefill' if prefill else 'decode'} B{b} {'S' if prefill else 'KV'}{n}"
            print(f"[{time.time() - t0:6.1f}s] {label}", file=sys.stderr, flush=True)
            print(f"=== GAC_MARK {label}", file=sys.stderr, flush=True)
            with torch.no_grad():
                if prefill:
                    g = torch.Generator(device="cpu").manual_seed(b * 100003 + n)
                    ids = torch.randint(0, model.config.vocab_size, (b, n), generator=g).to(dev)
                    f = fwd if cuda else model

                    def call(f=f, ids=ids):  # noqa: ANN202
                        return f(input_ids=ids, use_cache=False, logits_to_keep=1).logits

                    step, close = capture_graph(call, dev) if cuda else (call, lambda: None)
                    st = _time_calls(step, dev, cfg.prefill_warmup, cfg.prefill_reps)
                else:
                    dstep = DecodeStep(model, b, n, cuda, forward=fwd if cuda else None)
                    dstep.set_position(n - cfg.decode_warmup - cfg.decode_reps - 6)  # ends on the cache tail
                    step, close = dstep, dstep.close
                    st = _time_calls(step, dev, cfg.decode_warmup, cfg.decode_reps)
                tr = trace_replays(step) if cuda else {}
                close()
            key = (
                {"phase": "prefill", "batch": b, "seq": n}
                if prefill
                else {"phase": "decode", "batch": b, "kv": n}
            )
            rec["points"].append({**key, **st, "trace": tr})
            print(
                f"  median {st['median_ms']:.3f} ms, busy {tr.get('busy_us_per_step', 0):.0f} us, span "
                f"{tr.get('span_us_per_step', 0):.0f} us, events {tr.get('events_per_step')}",
                file=sys.stderr,
                flush=True,
            )
            save()
        del model, fwd
        torch.cuda.empty_cache()
    res["wall_s"] = time.time() - t0
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
