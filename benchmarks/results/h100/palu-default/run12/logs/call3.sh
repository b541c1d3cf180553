#!/bin/bash
# session 2026-11-27f call 3 (raw-key launch: KV heads a program by query rows): the raw-key table launch against
# dense (both shapes) and the Qwen2.5-7B KV-heads-a-program variants; the Qwen2.5-7B palu-default pair
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res20; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
K="python3 benchmarks/tools/gpu_latent_kernel.py"
CF="32,64,4,3,2,2,0,0;32,64,4,3,2,2,0,1;32,64,4,3,2,2,0,2;64,64,8,2,2,2,0,2;64,64,4,2,2,2,0,1"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
lane 0 420 "$K --raw --table --models qwen2.5-7b,llama3-8b --groups 4 --rank-v 496 --batches 1,16,64 --lengths 4096,32768 --budget-s 150 --out $R/raw_table.json; $K --raw --models qwen2.5-7b --groups 4 --rank-v 496 --batches 16,64 --lengths 4096,32768 --configs '$CF' --budget-s 150 --out $R/raw_qwen.json" &
lane 1 470 "$G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run plans/palu-default.toml --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen" &
wait
tar -czf $OUT/results.tgz -C /tmp res20
for f in $R/lane*.log; do tail -n 14 $f | cut -c1-260; done
