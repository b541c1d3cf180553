#!/bin/bash
# call 42: the Triton latent kernels' GPU tests and the latent pricing GPU tests on the current tree; then the
# guard's worst predicted shape for key and value groups of 2 (prefill 1x128: 0.855 predicted) measured
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/call42t; mkdir -p $R
T0=$(date +%s)
timeout 200 python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -rA -q --durations=0 > $R/latent_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_tests.log
timeout 120 python3 -m pytest tests/hardware/test_latent_pricing.py -m gpu -p no:cacheprovider -rA -q --durations=0 > $R/pricing_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/pricing_tests.log
tail -4 $R/*.log
tar -czf $OUT/call42_tests.tgz -C /tmp call42t
# devrun/prefill128.toml is kept beside this script as prefill128.toml
PLAN=devrun/prefill128.toml \
 RUN=devrun/p128 bash devrun/kg.sh call42 $(( 570 - ($(date +%s) - T0) )) 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "done\|rc " /tmp/call42/lane*.log
