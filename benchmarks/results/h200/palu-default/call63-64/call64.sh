#!/bin/bash
# call 64: plans/palu-serve-long.toml on the Llama-3-8B shape: PaLU at KV 0.5 with the latency guard on at the
# long-context decode shapes (B 16 and 64 x KV 8000: Llama-3-8B's context is 8192), dense and PaLU on one machine.
# devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-serve-long.toml RUN=devrun/psl bash devrun/kg.sh call64 540 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc \|rror\|guard" /tmp/call64/lane*.log | head -20
cat /tmp/call64/report.txt | head -60
