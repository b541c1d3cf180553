#!/bin/bash
# call 71: prefill with --align gac's kernel rank caps (cb99c47), Qwen2.5-7B shape (plans/palu-prefill.toml: B=1 and
# 8 x 2048, 30 repetitions), dense and PaLU on one machine, in what device time was left. devrun/kg.sh is
# ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-prefill.toml RUN=devrun/pf71 bash devrun/kg.sh call71 125 \
  'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "rc " /tmp/call71/lane*.log
