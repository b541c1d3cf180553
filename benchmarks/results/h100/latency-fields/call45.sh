#!/bin/bash
# call 45 (issue 32): the latency model's new profile fields on one H100
set -x
nvidia-smi --query-gpu=name,uuid,driver_version,power.limit,clocks.max.sm --format=csv > $OUT/gpu.txt
git rev-parse HEAD > $OUT/tree.txt; git status --short >> $OUT/tree.txt
export GAC_CACHE=/tmp/gc
( time PYTHONPATH=src python3 benchmarks/tools/gpu_launch_constants.py --fields gemv_kernel,prefill_attention,gemm_rows \
    --profile src/gac/profiles/h100-bfloat16.json --out $OUT/h100-bfloat16.json ) > $OUT/fields.log 2>&1
tail -5 $OUT/fields.log
PYTHONPATH=src python3 - > $OUT/causal_check.json 2> $OUT/causal_check.log <<'PY'
import json, torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from gac.hardware.timing import graph_timings
mod = torch.nn.Module(); mod.num_key_value_groups, mod.is_causal = 4, True
out = []
for b, s in ((1, 512), (1, 2048), (8, 512), (8, 2048)):
    q = torch.randn(b, 32, s, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, 8, s, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    m = torch.ones(s, s, dtype=torch.bool, device="cuda").tril().expand(b, 1, s, s).contiguous()
    r = {"batch": b, "seq": s}
    for name, mask in (("masked", m), ("is_causal", None)):
        ts = graph_timings(lambda i, mask=mask: sdpa_attention_forward(mod, q, k, v, mask, scaling=128**-0.5), 8, 7)
        r[name + "_us"] = ts[len(ts) // 2]
    out.append(r)
print(json.dumps({"torch": torch.__version__, "points": out}, indent=1))
PY
cat $OUT/causal_check.json
