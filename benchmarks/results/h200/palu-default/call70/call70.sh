#!/bin/bash
# call 70: prefill with --align gac's kernel rank caps (cb99c47), Llama-3-8B shape (plans/palu-prefill.toml: B=1 and
# 8 x 2048, 30 repetitions), dense and PaLU on one machine, in what device time was left. devrun/kg.sh is
# ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-prefill.toml RUN=devrun/pf70 bash devrun/kg.sh call70 235 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call70/lane*.log
