"""Where the capacity search's "workspace per sequence" comes from (GPU).

``gac eval infer``'s capacity point prices a sequence as its KV bytes plus a workspace per sequence, measured as
the growth of a decode point's peak memory from batch 1 to batch 2 beyond the cache. On the palu-default grid
(H100, Llama-3-8B shape, 32k context) that workspace was 310 MB a sequence for dense and 182 MB for PaLU, a
quarter to a third of the KV bytes, and it lowers the largest batch the search reports. This replays the
construction of :class:`gac.runtime.step.DecodeStep` stage by stage (cache allocation and first eager call, the
random fill, the compiled warm-ups and capture, the replays) for the dense model and the PaLU model at a
palu-default cell's ranks, and records the allocated and peak bytes after each stage, beyond the memory held
when the point began and beyond the cache; at batch 2 it also keeps a CUDA memory snapshot (allocation stacks)
of the construction for the largest live blocks at the peak.

    PYTHONPATH=src python3 benchmarks/tools/gpu_capacity_workspace.py --out $OUT/workspace.json \
        --cell benchmarks/results/h100/palu-default/run7/cells/shape-llama3-8b-8/palu-r0.5-gac.json
"""

from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))


def _largest_at_peak(snapshot: dict, top: int = 12) -> list[dict]:
    """The largest blocks alive when the replayed allocation trace reached its peak, with their frames."""
    events = [e for t in snapshot.get("device_traces", []) for e in t]
    live: dict[int, dict] = {}
    cur = peak = 0
    at_peak: list[dict] = []
    for e in events:
        if e["action"] == "alloc":
            live[e["addr"]] = e
            cur += e["size"]
            if cur > peak:
                peak, at_peak = cur, list(live.values())
        elif e["action"] in ("free_completed",) and e["addr"] in live:
            cur -= live.pop(e["addr"])["size"]
    at_peak.sort(key=lambda e: -e["size"])
    out = []
    for e in at_peak[:top]:
        frames = [f"{f['filename'].rsplit('/', 2)[-1]}:{f['line']} {f['name']}" for f in e.get("frames", [])]
        keep = [f for f in frames if "gac" in f or "transformers" in f or "triton" in f or "inductor" in f]
        out.append({"bytes": e["size"], "frames": (keep or frames)[:10]})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--spec", default="shape:llama3-8b:8")
    ap.add_argument(
        "--cell", required=True, help="a palu-default cell JSON (its results.dims: the group ranks)"
    )
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batches", default="1,2,4")
    ap.add_argument("--models", default="dense,palu")
    a = ap.parse_args()
    from gpu_decode_diagnostic import build

    from gac.compat import with_cache
    from gac.eval.infer import SweepConfig, _free, _time_calls
    from gac.guard import atomic_write_text
    from gac.hardware.timing import environment
    from gac.runtime.step import capture_graph, compile_step, use_decode_kernels_

    dev = torch.device("cuda")
    t0 = time.time()
    dims = json.loads(Path(a.cell).read_text())["results"]["dims"]
    res: dict = {"schema": "gac.capacity-workspace/1", "command": " ".join([sys.executable, *sys.argv]),
                 "env": environment(dev), "cell": a.cell, "context": a.context, "models": {}}  # fmt: skip
    out = Path(a.out)

    def save() -> None:
        atomic_write_text(out, json.dumps(res, indent=1, default=str))

    cfg = SweepConfig()
    for name in a.models.split(","):
        from transformers import StaticCache

        model = build(a.spec, dims if name != "dense" else None, "cuda")
        use_decode_kernels_(model)
        torch._dynamo.reset()
        fwd = compile_step(model.forward, None, cfg.combo_kernels, dynamic=False)
        rec: dict = {"points": []}
        res["models"][name] = rec
        for b in (int(v) for v in a.batches.split(",")):
            _free(dev)
            snap = b == 2
            if snap:
                torch.cuda.memory._record_memory_history(max_entries=200000)
            torch.cuda.reset_peak_memory_stats(dev)
            a0 = torch.cuda.memory_allocated(dev)
            stages: list[dict] = []

            def mark(stage: str, kvb: int, a0: int = a0, stages: list = stages) -> None:
                stages.append({
                    "stage": stage,
                    "allocated_beyond_mb": (torch.cuda.memory_allocated(dev) - a0 - kvb) / 2**20,
                    "peak_beyond_mb": (torch.cuda.max_memory_allocated(dev) - a0 - kvb) / 2**20,
                })  # fmt: skip

            with torch.no_grad():
                cache = StaticCache(config=model.config, max_cache_len=a.context)
                ids = torch.randint(0, model.config.vocab_size, (b, 1)).to(dev)
                model(**with_cache(model, cache, input_ids=ids, use_cache=True))
                kvb = sum(
                    la.keys.numel() * la.keys.element_size() + la.values.numel() * la.values.element_size()
                    for la in cache.layers
                )
                mark("cache + first eager call", kvb)
                torch.cuda.reset_peak_memory_stats(dev)
                for la in cache.layers:
                    la.keys.normal_(0, 1)
                    la.values.normal_(0, 1)
                mark("random fill", kvb)

                def reset(cache=cache) -> None:
                    for la in cache.layers:
                        la.cumulative_length.fill_(0)

                def eager(cache=cache, ids=ids, fwd=fwd, model=model) -> torch.Tensor:
                    return fwd(**with_cache(model, cache, input_ids=ids, use_cache=True)).logits

                torch.cuda.reset_peak_memory_stats(dev)
                replay, release = capture_graph(eager, dev, reset)
                mark("compiled warm-ups + capture", kvb)
                torch.cuda.reset_peak_memory_stats(dev)
                st = _time_calls(replay, dev, cfg.decode_warmup, cfg.decode_reps)
                mark("replays", kvb)
                release()
            pt = {"batch": b, "kv_bytes": kvb, "median_ms": st["median_ms"], "stages": stages}
            if snap:
                s = torch.cuda.memory._snapshot()
                torch.cuda.memory._record_memory_history(enabled=None)
                pt["largest_at_peak"] = _largest_at_peak(s)
                with open(out.with_name(f"snapshot_{name}_b{b}.pickle"), "wb") as f:
                    pickle.dump(s, f)
            del cache
            rec["points"].append(pt)
            print(f"[{time.time() - t0:6.1f}s] {name} B{b}: " + ", ".join(
                f"{s['stage']} {s['peak_beyond_mb']:.0f}" for s in stages), file=sys.stderr, flush=True)  # fmt: skip
            save()
        del model, fwd
        _free(dev)
    res["wall_s"] = time.time() - t0
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
