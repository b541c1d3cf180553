#!/bin/bash
# session 2026-11-27g call 2 (two H100s: the four-GPU host was not lent) (issue 34: a program per value group where keys are grouped narrower): kernel sweeps
# narrow vs wide programs (Llama G1/V4, G2/V4; Qwen G1/V4), GPU kernel tests, palu-keygroup1 Llama cells,
# palu-capacity-keygroup1
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res22; mkdir -p $R
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
git status --short > $R/tree.txt 2>/dev/null; git log -1 --format=%H >> $R/tree.txt 2>/dev/null
for i in 0 1; do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
K="python3 benchmarks/tools/gpu_latent_kernel.py"
CL="32,64,4,3,2,2,0,1;32,64,4,3,2,2,0,4;32,64,4,3,2,4,0,4;64,64,4,2,2,2,0,4;32,64,8,3,2,4,0,4;64,64,8,3,2,4,0,4;32,64,4,3,2,2,1,4;16,64,4,4,2,4,0,4"
C2="32,64,4,3,4,2,0,2;32,64,4,3,2,2,0,4;32,64,4,3,2,4,0,4;64,64,4,2,2,4,0,4;32,64,8,3,2,4,0,4"
CQ="32,64,4,3,2,2,0,1;32,64,4,3,2,2,0,2;64,64,4,2,2,2,0,2;32,64,8,3,2,2,0,2;32,64,4,3,2,4,0,4;16,64,4,4,2,2,0,2"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
P1=plans/palu-keygroup1.toml; PC=plans/palu-capacity-keygroup1.toml
lane 0 560 "$K --models llama3-8b --groups 1 --v-group 4 --batches 1,16,64 --lengths 4096,32768 --configs '$CL' --budget-s 200 --out $R/wide_llama_g1.json; python3 -m pytest tests/kernels/test_latent_decode.py -m gpu -p no:cacheprovider -q -x > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt" &
lane 1 560 "$G run $P1 --out $R/kg1 --only 'shape-llama3-8b-8/base*' && $G run $P1 --out $R/kg1 --only 'shape-llama3-8b-8/palu*'" &
wait
tar -czf $OUT/results.tgz -C /tmp res22
for f in $R/lane*.log; do tail -n 8 $f | cut -c1-300; done
