#!/bin/bash
# call 57: the GPU tests of the tree with the two-warpgroup launch the default (model decode on four families, two of
# them at key rank 128, where two sequences take that launch; float64 at every launch), then the default key group's
# decode grid on the Qwen2.5-7B shape (plans/palu-default-decode.toml), dense and PaLU on one machine.
# devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
R=/tmp/call57; mkdir -p $R
T0=$(date +%s)
PYTHONPATH=src timeout 150 python3 -m pytest -o addopts="" -m gpu tests/kernels/test_latent_gluon.py \
  -k "matches_float64 or model_decode or takes_triton" -q > $R/gpu_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gpu_tests.log
tail -n 3 $R/gpu_tests.log
cp devrun/call57.sh $R/; tar -czf $OUT/call57.tgz -C /tmp call57
PLAN=plans/palu-default-decode.toml RUN=devrun/pddq bash devrun/kg.sh call57q $(( 570 - ($(date +%s) - T0) )) \
  'shape-qwen2.5-7b-8/base*' 'shape-qwen2.5-7b-8/palu*'
grep -h "rc " /tmp/call57q/lane*.log
