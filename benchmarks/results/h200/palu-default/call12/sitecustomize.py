"""Memory diagnosis (not committed as a tool): with GAC_MEMDIAG=PATH, the first decode point of `gac eval infer`
writes what is allocated on the GPU when it begins, grouped by the Python frames that allocated it."""
import os

if os.environ.get("GAC_MEMDIAG"):
    import json

    import torch

    if torch.cuda.is_available():
        torch.cuda.memory._record_memory_history(max_entries=500000)
    import gac.eval.infer as inf

    _orig = inf.decode_point
    _done = []

    def _key(frames):
        keep = [f"{os.path.basename(f['filename'])}:{f['line']}:{f['name']}" for f in frames
                if any(s in f["filename"] for s in ("gac/", "transformers/", "_inductor", "torch/nn"))]
        return " < ".join(keep[:6]) or "(no python frame)"

    def decode_point(model, batch, kv, *a, **k):
        if not _done:
            _done.append(1)
            torch.cuda.synchronize()
            snap = torch.cuda.memory._snapshot()
            groups = {}
            total = 0
            for seg in snap["segments"]:
                for b in seg["blocks"]:
                    if b["state"] != "active_allocated":
                        continue
                    total += b["size"]
                    key = _key(b.get("frames", []))
                    g = groups.setdefault(key, [0, 0])
                    g[0] += b["size"]
                    g[1] += 1
            params = sum(p.numel() * p.element_size() for p in model.parameters())
            bufs = sum(b.numel() * b.element_size() for b in model.buffers())
            top = sorted(groups.items(), key=lambda kv_: -kv_[1][0])[:60]
            with open(os.environ["GAC_MEMDIAG"], "w") as f:
                json.dump({"allocated": torch.cuda.memory_allocated(), "active_total": total, "params": params,
                           "buffers": bufs, "groups": [{"bytes": v[0], "blocks": v[1], "where": k_} for k_, v in top]},
                          f, indent=1)
        return _orig(model, batch, kv, *a, **k)

    inf.decode_point = decode_point
