#!/bin/bash
# call 28: call 27 again after its launch fix (its Gluon launches failed unpacking a tuple of four): the Gluon kernel with its key latents as the register operand; Nsight Compute on one launch of each kernel
export PYTHONPATH=src
R=$OUT/call28; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
timeout 100 ncu --clock-control none --kernel-name regex:"flash" --launch-skip 2 --launch-count 2 \
  --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section Occupancy python3 devrun/prof.py > $R/ncu.txt 2>&1
echo "ncu rc $?" >> $R/ncu.txt
timeout 100 python3 -m pytest tests/kernels/test_latent_gluon.py -m "gpu" -q -p no:cacheprovider > $R/gluon_tests.log 2>&1
echo "tests rc $?" >> $R/gluon_tests.log
run() {  # launch model rank_k rank_v
  tag=$2_k$3_v$4_L${1//,/-}
  GAC_GLUON_LAUNCH=$1 timeout 90 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits \
    --models $2 --groups 4 --batches 16,64 --lengths 4096,32768 --rank-k $3 --rank-v $4 --budget-s 70 \
    --out $R/kernel_$tag.json > $R/kernel_$tag.log 2>&1
  echo "rc $?" >> $R/kernel_$tag.log
}
for L in 128,8,32,1 64,4,32,1; do
  run $L llama3-8b 128 232; run $L llama3-8b 64 208; run $L qwen2.5-7b 128 224
done
run 128,8,64,1 llama3-8b 128 232
cd $OUT && tar czf call28.tgz call28 && rm -rf call28
