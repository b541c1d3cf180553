#!/bin/bash
# session 2026-11-27f call 1: raw-key layers. GPU kernel tests (all of the latent files, CUDA); the raw-key kernel
# sweep (Llama-3-8B and Qwen2.5-7B first-layer shapes: keys raw, value rank 496) and the rank-496 latent path it
# replaces; the palu-default pairs (each model's dense and PaLU cells on one GPU)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res18; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in 0 1 2 3; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
K="python3 benchmarks/tools/gpu_latent_kernel.py"
CF="64,64,4,2,2;32,64,4,3,2;32,64,4,2,2;64,64,8,2,2;64,64,4,1,2;128,64,8,1,2;16,64,4,4,2;32,64,4,3,4;32,64,4,3,2,2,0,1;64,64,4,2,2,2,0,2"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
lane 0 540 "python3 -m pytest -q -m 'not slow' tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -p no:cacheprovider --junitxml=$R/gpu_tests.xml 2>&1 | tail -n 15; $K --raw --models qwen2.5-7b --groups 4 --rank-v 496 --batches 1,16,64 --lengths 4096,32768 --configs '$CF' --budget-s 150 --out $R/raw_qwen.json" &
lane 1 540 "$K --raw --models llama3-8b --groups 4 --rank-v 496 --batches 1,16,64 --lengths 4096,32768 --configs '$CF' --budget-s 300 --out $R/raw_llama.json; $K --table --models llama3-8b,qwen2.5-7b --groups 4 --rank-k 496 --rank-v 496 --batches 1,16,64 --lengths 4096,32768 --budget-s 200 --out $R/r496_table.json" &
lane 2 540 "$G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama" &
lane 3 540 "$G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen" &
wait
tar -czf $OUT/results.tgz -C /tmp res18
for f in $R/lane*.log; do tail -n 6 $f; done
