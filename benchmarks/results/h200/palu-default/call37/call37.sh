#!/bin/bash
# call 37: the H200 latent_attention class re-timed (the Gluon kernel refusing value latents under 64 columns, which
# failed to compile in call 36), then the dense cell of plans/palu-keygroup2.toml on the Llama-3-8B shape
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=$OUT/call37; mkdir -p $R
T0=$(date +%s)
timeout 200 python3 benchmarks/tools/gpu_launch_constants.py --fields latent_attention \
  --profile src/gac/profiles/h200-bfloat16.json --out $R/h200-bfloat16.json > $R/latent_class.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/latent_class.log
cd $OUT && tar czf call37.tgz call37 && rm -rf call37 && cd - > /dev/null
bash devrun/kg.sh call37kg $(( 560 - ($(date +%s) - T0) )) 'shape-llama3-8b-8/base*'
