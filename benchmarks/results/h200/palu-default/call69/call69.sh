#!/bin/bash
# call 69: the default key group's capacity (plans/palu-capacity.toml: Llama-3-8B shape, 32k context, this GPU's free
# memory), dense and PaLU on one machine, with --align gac's new default rank caps (cb99c47: keys 128, values 384 at key
# group 4 on h200-bfloat16). devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-capacity.toml RUN=devrun/cap69 bash devrun/kg.sh call69 560 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call69/lane*.log
