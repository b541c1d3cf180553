#!/bin/bash
# the GPU tests of test_latent_decode.py after the paired rebuild's head_dim gate (PAIRED_MIN_HEAD_DIM) and its two
# new kernel cases
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=index,name,uuid --format=csv > $OUT/gpu.txt
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $OUT/gpu.txt
timeout 480 python3 -m pytest -o addopts='' -m gpu -p no:cacheprovider -q tests/kernels/test_latent_decode.py -p no:warnings > $OUT/gpu_tests.log 2>&1
echo "rc $?" >> $OUT/gpu_tests.log
tail -25 $OUT/gpu_tests.log
