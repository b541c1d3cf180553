#!/bin/bash
# session 2026-11-28d, call 2 (the sixth H200 call of issue 34): plans/palu-default.toml's Llama and Qwen pairs, one pair a GPU,
# with key ranks on the decode kernel's 64-wide rank tile (gac.hardware.latency.site_modulus). The capacity lanes run only where four GPUs are lent: two were.
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8
R=/tmp/h200d2; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=index,name,uuid,clocks.sm,temperature.gpu --format=csv > $R/gpu.txt; cat $R/gpu.txt
grep -q "H200" $R/gpu.txt || { echo "not an H200 host"; exit 3; }
python3 -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" >> $R/gpu.txt
N=$(nvidia-smi -L | wc -l)
for i in $(seq 0 $((N-1))); do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
pair() { echo "$G run $1 --out $R/$2 --only '$3/base*' && $G run $1 --out $R/$2 --only '$3/palu*' && $G report $R/$2 > $R/$2_report.txt 2>&1"; }
lane 0 570 "$(pair plans/palu-default.toml llama shape-llama3-8b-8)" &
lane 1 570 "$(pair plans/palu-default.toml qwen shape-qwen2.5-7b-8)" &
if [ "$N" -ge 4 ]; then
  lane 2 570 "$(pair plans/palu-capacity.toml capacity shape-llama3-8b-8)" &
  lane 3 570 "$(pair plans/palu-capacity-keygroup1.toml capacity-g1 shape-llama3-8b-8)" &
fi
wait
tar -czf $OUT/results.tgz -C /tmp h200d2
for f in $R/lane*.log; do echo "== $f"; tail -n 5 $f | cut -c1-300; done
for f in $R/*_report.txt; do echo "== $f"; tail -n 3 $f; done
