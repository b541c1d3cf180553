#!/bin/bash
# call 60: the default key group's capacity (plans/palu-capacity.toml: Llama-3-8B shape, 32k context, this GPU's free
# memory) with the occupancy and two-warpgroup launches (calls 9-11 ran before them), dense and PaLU on one machine.
# devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
PLAN=plans/palu-capacity.toml RUN=devrun/capg4 bash devrun/kg.sh call60 545 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call60/lane*.log
