#!/bin/bash
# call 32: the Gluon kernel past key rank 128 and 256 value columns (key boxes 128 + 64, value boxes 256 + the rest,
# 64-token tiles in one warpgroup where the 128-token program does not fit): its GPU tests, and the kernel alone
# against the Triton kernel at the 8B shapes' layers it now serves (KV 0.5 ranks of calls 22-23)
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=$OUT/call32; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt 2>&1
T0=$(date +%s)
timeout 190 python3 -m pytest tests/kernels/test_latent_gluon.py -m gpu -p no:cacheprovider -rA -q > $R/gluon_tests.log 2>&1
echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/gluon_tests.log
run() {  # launches model rank_k rank_v batches seconds
  tag=$2_k$3_v$4_L${1//[,;]/-}_B${5//,/-}
  GAC_GLUON_LAUNCH=$1 timeout $6 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits \
    --models $2 --groups 4 --batches $5 --lengths 4096,32768 --rank-k $3 --rank-v $4 --budget-s $(( $6 - 25 )) \
    --out $R/kernel_$tag.json > $R/kernel_$tag.log 2>&1
  echo "rc $? after $(( $(date +%s) - T0 )) s" >> $R/kernel_$tag.log
}
D="128,8,64,1;64,4,32,1"
run "$D" llama3-8b 256 440 16,64 90
run "$D" llama3-8b 192 328 16,64 85
run "$D" qwen2.5-7b 128 280 16,64 85
run "128,8,64,1;64,4,32,0" llama3-8b 256 440 16,64 80
cd $OUT && tar czf call32.tgz call32 && rm -rf call32
