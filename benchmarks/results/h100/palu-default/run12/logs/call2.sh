#!/bin/bash
# session 2026-11-27f call 2 (raw-key launch adopted): GPU kernel tests + the raw-key module tests on CUDA, then
# the raw-key table launch against dense (both shapes); the palu-default pairs; the capacity pair on one GPU
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res19; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in 0 1 2 3; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
K="python3 benchmarks/tools/gpu_latent_kernel.py"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
lane 0 540 "python3 -m pytest -q -m gpu tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -p no:cacheprovider --junitxml=$R/gpu_tests.xml 2>&1 | tail -n 8; python3 -m pytest -q -m 'not slow' -k raw_key_layer tests/kernels/test_latent_decode.py -p no:cacheprovider --junitxml=$R/raw_tests.xml 2>&1 | tail -n 5; $K --raw --table --models llama3-8b,qwen2.5-7b --groups 4 --rank-v 496 --batches 1,16,64 --lengths 4096,32768 --budget-s 180 --out $R/raw_table.json" &
lane 1 540 "$G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/base*' && $G run plans/palu-default.toml --out $R/llama --only 'shape-llama3-8b-8/palu*' && $G report $R/llama" &
lane 2 540 "$G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen" &
lane 3 540 "$G run plans/palu-capacity.toml --out $R/capacity --only 'shape-llama3-8b-8/base*' && $G run plans/palu-capacity.toml --out $R/capacity --only 'shape-llama3-8b-8/palu*' && $G report $R/capacity" &
wait
tar -czf $OUT/results.tgz -C /tmp res19
for f in $R/lane*.log; do tail -n 8 $f | cut -c1-300; done
