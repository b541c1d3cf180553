#!/bin/bash
# call 55: the tree with the two-warpgroup launch as the default where the occupancy launch holds fewer KV heads, from
# two sequences (latent_gluon.WARPGROUPS_LAUNCH / WARPGROUPS_FROM). The kernel alone at 2, 4 and 8 sequences (untimed in
# call 54) on the default key group's layers of both 8B shapes, each launch alone; then the capacity pair of key and
# value groups of 2 (plans/palu-capacity-keygroup2-values2.toml, Llama-3-8B shape, 32k context, this H200's free
# memory), dense and PaLU on one machine, as calls 49 and 52. devrun/kg.sh is ../call38/kg.sh, unchanged
export PYTHONUNBUFFERED=1
R=/tmp/call55k; mkdir -p $R
T0=$(date +%s)
for m in "llama3-8b 232" "qwen2.5-7b 224"; do
  set -- $m
  PYTHONPATH=src timeout 45 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --budget-s 35 \
    --models $1 --groups 4 --batches 2,4,8 --lengths 4096,32768 --rank-k 128 --rank-v $2 \
    --gluon-launches "64,4,64,1,1,2;128,8,64,1" --out $R/small_$1.json > $R/small_$1.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/small_$1.log
done
cp devrun/call55.sh $R/; tar -czf $OUT/call55k.tgz -C /tmp call55k
PLAN=plans/palu-capacity-keygroup2-values2.toml RUN=devrun/capkg2v2ws bash devrun/kg.sh call55 $(( 560 - ($(date +%s) - T0) )) 'shape-llama3-8b-8/base*' 'shape-llama3-8b-8/palu*'
grep -h "rc " /tmp/call55/lane*.log; tail -12 /tmp/call55/report.txt
