#!/bin/bash
# call 58: key and value groups of 2 (plans/palu-keygroup2-values2-decode.toml: the decode grid of
# palu-keygroup2-values2.toml) on the Llama-3-8B shape with the occupancy and two-warpgroup launches (calls 39-40 ran
# before them), dense and PaLU on one machine; then the H200 latent_attention class re-timed on the launches the
# default path takes now. devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
T0=$(date +%s)
PLAN=plans/palu-keygroup2-values2-decode.toml RUN=devrun/kg2d bash devrun/kg.sh call58 400 \
  'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call58/lane*.log
R=/tmp/call58c; mkdir -p $R
PYTHONPATH=src timeout $(( 575 - ($(date +%s) - T0) )) python3 benchmarks/tools/gpu_launch_constants.py \
  --fields latent_attention --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16.json > $R/latent_class.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_class.log
tail -n 2 $R/latent_class.log
cp devrun/call58.sh $R/; tar -czf $OUT/call58c.tgz -C /tmp call58c
