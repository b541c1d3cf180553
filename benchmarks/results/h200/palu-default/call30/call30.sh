#!/bin/bash
# call 30: the Gluon kernel (call 29's code): the 64-column launch where call 29 did not time it, one sequence, and
# key ranks that pad to a 64-rank chunk
export PYTHONPATH=src
R=$OUT/call30; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
run() {  # launch model rank_k rank_v batches
  tag=$2_k$3_v$4_L${1//,/-}_B${5//,/-}
  GAC_GLUON_LAUNCH=$1 timeout 80 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits \
    --models $2 --groups 4 --batches $5 --lengths 4096,32768 --rank-k $3 --rank-v $4 --budget-s 60 \
    --out $R/kernel_$tag.json > $R/kernel_$tag.log 2>&1
  echo "rc $?" >> $R/kernel_$tag.log
}
run 128,8,64,1 llama3-8b 64 208 16,64
run 128,8,64,1 qwen2.5-7b 128 224 16,64
for L in 128,8,32,1 128,8,64,1; do
  run $L llama3-8b 128 232 1; run $L qwen2.5-7b 128 224 1
done
run 128,8,32,1 llama3-8b 96 120 16,64
cd $OUT && tar czf call30.tgz call30 && rm -rf call30
