#!/bin/bash
# session 2026-11-28b call 2 (issue 34): GPU kernel tests on the fixed tree; capacity at 32k (Llama-3-8B shape);
# launch sweeps of the key-group-4 row on the Qwen2.5-7B and Llama-3-8B shapes (value ranks 256 and 432)
export PYTHONPATH=src PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4
R=/tmp/res42; mkdir -p $R
N=$(nvidia-smi -L | wc -l)
nvidia-smi -L > $R/gpu.txt; nvidia-smi --query-gpu=index,uuid,name,clocks.sm,temperature.gpu --format=csv >> $R/gpu.txt
for i in $(seq 0 $((N-1))); do mkdir -p /tmp/gc$i; cp -r .gaccache/. /tmp/gc$i/; rm -f /tmp/gc$i/*dispatch*.json; done
G="python3 -m gac"
lane() { local i=$1; local t=$2; shift; shift; ( export CUDA_VISIBLE_DEVICES=$i GAC_CACHE=/tmp/gc$i; timeout $t bash -c "$*" ) > $R/lane$i.log 2>&1; echo "lane $i rc $?" >> $R/lane$i.log; }
PC=plans/palu-capacity.toml
TESTS="python3 -m pytest tests/kernels/test_latent_decode.py tests/kernels/test_latent_launch.py -m gpu -p no:cacheprovider -q -rf > $R/gpu_tests.txt 2>&1; tail -3 $R/gpu_tests.txt"
KS="python3 benchmarks/tools/gpu_latent_kernel.py --groups 4 --batches 16,64 --lengths 4096,32768"
QC='128,64,8,2,2,1,0,2;128,64,8,2,2,1,0,1;128,64,8,2,2,2,0,4;128,64,8,3,2,1,0,2;128,128,8,2,2,1,0,2;128,64,8,2,1,1,0,2;128,64,8,2,4,1,0,2'
LC='128,64,8,2,2;128,64,8,3,2;128,128,8,2,2;128,64,8,2,1;128,64,8,2,4;128,64,8,2,2,1,0,2;128,32,8,2,2'
DIAG="CUDA_LAUNCH_BLOCKING=1 timeout 100 python3 devrun/diag_vt.py > $R/diag_vt.txt 2>&1; echo rc \$? >> $R/diag_vt.txt; CUDA_LAUNCH_BLOCKING=1 timeout 100 python3 devrun/diag_vt.py nodesc > $R/diag_vt_nodesc.txt 2>&1; echo rc \$? >> $R/diag_vt_nodesc.txt"
lane 0 560 "$TESTS; $DIAG" &
lane 1 560 "$G run $PC --out $R/capacity --only 'shape-llama3-8b-8/base*' && $G run $PC --out $R/capacity --only 'shape-llama3-8b-8/palu*' && $G report $R/capacity > $R/capacity_report.txt 2>&1" &
lane 2 560 "$KS --models qwen2.5-7b --configs '$QC' --budget-s 250 --out $R/sweep_qwen_rv256.json > $R/sweep_qwen_rv256.log 2>&1; $KS --models qwen2.5-7b --rank-v 432 --configs '$QC' --budget-s 250 --out $R/sweep_qwen_rv432.json > $R/sweep_qwen_rv432.log 2>&1" &
lane 3 560 "$KS --models llama3-8b --configs '$LC' --budget-s 250 --out $R/sweep_llama_rv256.json > $R/sweep_llama_rv256.log 2>&1; $KS --models llama3-8b --rank-v 432 --configs '$LC' --budget-s 250 --out $R/sweep_llama_rv432.json > $R/sweep_llama_rv432.log 2>&1" &
wait
tar -czf $OUT/results.tgz -C /tmp res42
for f in $R/lane*.log; do tail -n 3 $f | cut -c1-300; done
tail -4 $R/gpu_tests.txt | cut -c1-300
