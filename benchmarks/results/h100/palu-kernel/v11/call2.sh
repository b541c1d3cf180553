#!/bin/bash
# issue 34: the latent kernel with the tile start's rotation moved onto the queries (no register spills at G4 Llama)
set -x
export PYTHONPATH=src
R=$OUT/v11; mkdir -p $R
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.max.sm --format=csv > $R/gpu_call2.txt 2>&1
git log -1 --format=%H > $R/tree_call2.txt; git status --short >> $R/tree_call2.txt
T=benchmarks/tools/gpu_latent_kernel.py
timeout 100 python3 -m pytest -q -m gpu tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py > $R/gpu_tests.log 2>&1
tail -3 $R/gpu_tests.log
python3 $T --table --old devrun/latent_attention_old.py --models llama3-8b,qwen2.5-7b --groups 4 --batches 1,16,64 --lengths 4096,32768 --budget-s 150 --out $R/table_g4.json > $R/table_g4.log 2>&1
tail -20 $R/table_g4.log
python3 $T --models qwen2.5-7b --groups 4 --batches 16,64 --lengths 4096,32768 --old devrun/latent_attention_old.py --budget-s 100 \
   --configs '128,64,8,2,2;128,64,8,2,2,1,0,2;64,64,4,2,2,1,0,2;32,64,4,3,2,2,0,1' --out $R/qwen_sub.json > $R/qwen_sub.log 2>&1
tail -6 $R/qwen_sub.log
python3 $T --table --old devrun/latent_attention_old.py --models llama3-8b,qwen2.5-7b --groups 1 --v-group 4 --batches 16,64 --lengths 4096,32768 --budget-s 80 --out $R/table_g1.json > $R/table_g1.log 2>&1
tail -10 $R/table_g1.log
cd $OUT && tar czf v11.tgz v11
