#!/bin/bash
# call 46: the short-prefill pair at gac's default PaLU (key group 4: two groups of 4 KV heads on 8) on the Llama-3-8B
# shape, dense in the same run, prompts of 128-2048 (the one-GEMM rebuild at few rows)
export PYTHONPATH=src PYTHONUNBUFFERED=1
PLAN=devrun/prefill_short_default.toml RUN=devrun/p46 bash devrun/kg.sh call46 400 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "done\|rc " /tmp/call46/lane*.log
cp devrun/call46.sh devrun/prefill_short_default.toml /tmp/call46/ && tar -czf $OUT/call46.tgz -C /tmp call46
