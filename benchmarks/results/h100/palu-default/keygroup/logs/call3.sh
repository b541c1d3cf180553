#!/bin/bash
# session 2026-11-27g call 3 (two H100s): palu-keygroup2 Qwen2.5-7B cells, palu-capacity-keygroup2 (Llama-3-8B);
# the committed kernel (the wide-program variant of call 2 reverted)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res23; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P2=plans/palu-keygroup2.toml; PC=plans/palu-capacity-keygroup2.toml
lane 0 560 "$G run $P2 --out $R/kg2q --only 'shape-qwen2.5-7b-8/base*' && $G run $P2 --out $R/kg2q --only 'shape-qwen2.5-7b-8/palu*'" &
lane 1 560 "$G run $PC --out $R/cap2 --only 'shape-llama3-8b-8/base*' && $G run $PC --out $R/cap2 --only 'shape-llama3-8b-8/palu*'" &
wait
tar -czf $OUT/results.tgz -C /tmp res23
for f in $R/lane*.log; do tail -n 6 $f | cut -c1-300; done
