#!/bin/bash
# call 26: the Gluon kernel's launches (128-token tiles in 8 warps; 64 in 4; one KV head a program) beside the Triton kernel
export PYTHONPATH=src
R=$OUT/call26; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
timeout 120 python3 -m pytest tests/kernels/test_latent_gluon.py -m "gpu" -q -p no:cacheprovider > $R/gluon_tests.log 2>&1
echo "tests rc $?" >> $R/gluon_tests.log
for v in "128,8,32 0" "64,4,32 0" "128,8,32 1"; do
  set -- $v
  for spec in "llama3-8b 128 232" "llama3-8b 64 208" "qwen2.5-7b 128 224"; do
    set -- $v $spec
    tag=$3_k$4_v$5_L${1//,/-}_H$2
    GAC_GLUON_LAUNCH=$1 GAC_GLUON_HEADS=$2 timeout 100 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits \
      --models $3 --groups 4 --batches 16,64 --lengths 4096,32768 --rank-k $4 --rank-v $5 --budget-s 80 \
      --out $R/kernel_$tag.json > $R/kernel_$tag.log 2>&1
    echo "rc $?" >> $R/kernel_$tag.log
  done
done
