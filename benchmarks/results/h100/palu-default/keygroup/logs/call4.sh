#!/bin/bash
# session 2026-11-27g call 4 (one H100, the last of the device time): the key-group-1 launch with values at 4, by
# stages and token tile (the shared-memory lead), value rank 496 and 256, from 16 sequences at 32k
export PYTHONPATH=src PYTHONUNBUFFERED=1
R=/tmp/res24; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
K="python3 benchmarks/tools/gpu_latent_kernel.py"
C="32,64,4,3,2,2,0,1;32,64,4,2,2,2,0,1;16,64,4,3,2,2,0,1;64,64,4,2,2,2,0,1;32,64,8,2,2,2,0,1"
timeout 70 $K --models llama3-8b --groups 1 --v-group 4 --rank-v 496 --batches 16,64 --lengths 32768 --configs "$C" --budget-s 55 --out $R/g1_v496.json
timeout 60 $K --models llama3-8b --groups 1 --v-group 4 --rank-v 256 --batches 64 --lengths 32768 --configs "$C" --budget-s 45 --out $R/g1_v256.json
tar -czf $OUT/results.tgz -C /tmp res24
