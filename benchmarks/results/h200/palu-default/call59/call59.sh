#!/bin/bash
# call 59: key and value groups of 2 (plans/palu-keygroup2-values2-decode.toml) on the Qwen2.5-7B shape with the
# occupancy and two-warpgroup launches (call 40 ran before them), dense and PaLU on one machine.
# devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-keygroup2-values2-decode.toml RUN=devrun/kg2dq bash devrun/kg.sh call59 560 \
  'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "rc " /tmp/call59/lane*.log
