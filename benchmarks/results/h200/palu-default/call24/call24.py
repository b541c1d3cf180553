"""Call 24: on the GPU's compiled, captured decode step, each point records the decode attention it took."""
import json, os, sys, torch
sys.path.insert(0, "benchmarks/tools")
from gpu_branches_ab import build
from gac.eval.infer import SweepConfig, sweep_model
model = build({"cell": {"model": "shape:llama3-8b:1"}, "results": {"dims": None}})
cfg = SweepConfig(prefill_batches=(), prefill_seqs=(), decode_batches=(1, 64, 128), decode_kv=(32768,),
                  profile_kernels=False, decode_reps=10)
r = sweep_model(model, cfg, None, label="dense")
out = [{k: p.get(k) for k in ("batch", "kv", "status", "median_ms", "graphs", "compiled", "decode_attention")} for p in r["decode"]]
print(json.dumps(out, indent=1))
open(os.path.join(os.environ["OUT"], "decode_attention_record.json"), "w").write(json.dumps({"command": "PYTHONPATH=src python3 devrun/call24.py", "points": out}, indent=1))
