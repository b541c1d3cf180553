#!/bin/bash
# call 25: the Gluon latent kernel on an H200: its tests, then the kernel alone beside the Triton kernel and dense
export PYTHONPATH=src
R=$OUT/call25; mkdir -p $R
nvidia-smi > $R/gpu.txt 2>&1
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt 2>&1
timeout 150 python3 -m pytest tests/kernels/test_latent_gluon.py -m "gpu or slow or not gpu" -q -p no:cacheprovider > $R/gluon_tests.log 2>&1
echo "tests rc $?" >> $R/gluon_tests.log
for spec in "llama3-8b 128 232" "llama3-8b 64 208" "qwen2.5-7b 128 224"; do
  set -- $spec
  timeout 120 python3 benchmarks/tools/gpu_latent_kernel.py --table --gluon --auto-splits --models $1 --groups 4 \
    --batches 1,16,64 --lengths 4096,32768 --rank-k $2 --rank-v $3 --budget-s 100 --out $R/kernel_$1_k$2_v$3.json \
    > $R/kernel_$1_k$2_v$3.log 2>&1
  echo "rc $?" >> $R/kernel_$1_k$2_v$3.log
done
tail -3 $R/*.log
