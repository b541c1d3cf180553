#!/bin/bash
# session 2026-11-28c call 2 (issue 34) on two H200s: the palu-default Qwen2.5-7B pair and the palu-capacity pair
# (Llama-3-8B, 32k context, this GPU's memory), each dense and PaLU on one GPU
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200c2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
git rev-parse HEAD > $R/tree.txt 2>/dev/null; git status --short >> $R/tree.txt 2>/dev/null
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P=plans/palu-default.toml
lane 0 560 "$G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/base*' && $G run $P --out $R/qwen --only 'shape-qwen2.5-7b-8/palu*' && $G report $R/qwen > $R/qwen_report.txt 2>&1" &
lane 1 560 "$G run plans/palu-capacity.toml --out $R/capacity --only 'shape-llama3-8b-8/base*' && $G run plans/palu-capacity.toml --out $R/capacity --only 'shape-llama3-8b-8/palu*' && $G report $R/capacity > $R/capacity_report.txt 2>&1" &
wait
tar -czf $OUT/results.tgz -C /tmp h200c2
for f in $R/lane*.log; do echo "== $f"; tail -n 8 $f | cut -c1-300; done
