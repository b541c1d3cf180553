#!/bin/bash
# call 63: plans/palu-serve-long.toml on the Llama-3-8B shape: PaLU at KV 0.5 with the latency guard on at the
# long-context decode shapes (B 16 and 64 x KV 16384 and 32768), dense and PaLU on one machine.
# devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-serve-long.toml RUN=devrun/psl bash devrun/kg.sh call63 540 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc \|rror\|guard" /tmp/call63/lane*.log | head -20
cat /tmp/call63/report.txt | head -60
